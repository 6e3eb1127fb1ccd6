"""Issue 32 item 5: the changes to the search tried so that Post's learning counts, each one a switch.

A stripe start's spread (``stripe_units``, the default), the policy choosing which decisions a local move
redraws (``local_pick="policy"``), a local move set to a policy sample over a run (``policy_segments``), and
local moves in the cross-entropy window (``elite_local``): each does what it says on a case where the
other setting does not.
"""

import dataclasses

import numpy as np
import pytest

from postplace.search import PostConfig, SearchSpace, make_strategy
from postplace.search.local import LocalMoves
from postplace.search.post import start_weight
from postplace.search.start_prior import POST_DEFAULTS

G, D = 12, 3
SPACE = SearchSpace(np.ones((G, D), dtype=bool), failure_step_time=1e3)


def test_a_stripe_start_draws_about_stripe_units_layers_away_and_a_partition_partition_units():
    assert start_weight("stripe:gpu0..gpu3", 40, 0.7, 32.0, 2.0) == pytest.approx(1 - 2 / 40)
    assert start_weight("part4-work", 40, 0.7, 32.0, 2.0) == pytest.approx(0.5)  # 32 of 40, capped at half
    assert start_weight("fastest", 40, 0.7, 32.0, 2.0) == 0.7
    assert POST_DEFAULTS.stripe_units == 2.0  # the rivals' start (start_prior) is Post's


def _moves(settings, probs, n=400, seed=0):
    moves = LocalMoves(SPACE)
    incumbent = np.zeros(G, dtype=np.int64)
    moves.tell(incumbent[None], np.array([1.0]))
    out = moves.moves(n, probs, np.random.default_rng(seed), 0, settings)
    return incumbent, out


def test_policy_picked_moves_go_where_the_policy_disagrees_with_the_incumbent():
    probs = np.full((G, D), 1e-3)
    probs[:, 0] = 1.0  # the policy agrees with the incumbent (all on device 0) everywhere...
    probs[5] = [0.05, 0.9, 0.05]  # ...but on decision 5
    probs /= probs.sum(axis=1, keepdims=True)
    single = dataclasses.replace(PostConfig(), local_units=1.0)
    for pick, expected in (("policy", True), ("uniform", False)):
        cfg = dataclasses.replace(single, local_pick=pick)
        firsts = [_moves(cfg, probs, n=1, seed=seed) for seed in range(40)]  # a first move: one decision redrawn
        share = np.mean([(row != incumbent)[5] for incumbent, out in firsts for row in out])
        assert (share > 0.5) == expected, (pick, share)  # uniform: about 1 in 12


def test_a_policy_segment_sets_a_run_of_decisions_to_the_policys_values():
    probs = np.full((G, D), 1e-6)
    probs[:, 2] = 1.0  # the policy: everything on device 2
    probs /= probs.sum(axis=1, keepdims=True)
    cfg = dataclasses.replace(PostConfig(), policy_segments=True)
    incumbent, out = _moves(cfg, probs, n=60)
    runs = [np.flatnonzero(row != incumbent) for row in out[2::3]]  # every third move: kinds 0, 1, 2 in turn
    assert runs and all(r.size and np.array_equal(r, np.arange(r[0], r[-1] + 1)) for r in runs)
    assert all((row[row != incumbent] == 2).all() for row in out[2::3])
    _, without = _moves(PostConfig(), probs, n=60)
    assert len(without) == len(out)  # the same number of moves, two kinds taking turns instead of three


def test_local_moves_join_the_cross_entropy_elite_only_when_asked():
    """The best sample of the window is a local move: with elite_local the CE step refits to it."""
    target = np.arange(G) % D

    def score(p):
        return 1.0 + (p != target).sum(axis=1).astype(float)

    modes = {}
    for elite_local in (False, True):
        cfg = PostConfig(
            init="uniform", batch_size=8, ce_every=16, use_ppo=False, elite_fraction=0.1, elite_local=elite_local
        )
        s = make_strategy("post", SPACE, seed=3, config=cfg)
        told = 0
        while told < 16:
            p = s.ask(8)
            origins = s.last_origins
            t = score(p)
            if told:  # second batch: make its local moves the best of the window, the policy's the worst
                t = np.where(np.array(origins) == "local", 0.5, 50.0)
                best_local = p[np.array(origins) == "local"][0]
            s.tell(p, t, np.ones(len(p), dtype=bool))
            told += len(p)
        modes[elite_local] = (s.policy.probs().argmax(axis=1) == best_local).mean()
    assert modes[True] == 1.0 and modes[False] < 1.0, modes  # the local move differs from the policy's best
