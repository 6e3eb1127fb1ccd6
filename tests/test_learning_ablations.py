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


def _moves(settings, probs, n=400, seed=0, turn=0):
    moves = LocalMoves(SPACE)
    incumbent = np.zeros(G, dtype=np.int64)
    moves.tell(incumbent[None], np.array([1.0]))
    out = moves.moves(n, probs, np.random.default_rng(seed), turn, settings)
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
    """Each decision's favourite differs from its neighbours' (1, 2, 1, ...): a policy segment sets a run to
    each one's own favourite, which neither a segment move (one value for the run) nor a redraw gives."""
    probs = np.full((G, D), 1e-6)
    probs[np.arange(G), 1 + np.arange(G) % 2] = 1.0
    probs /= probs.sum(axis=1, keepdims=True)
    cfg = dataclasses.replace(PostConfig(), policy_segments=True)
    runs = 0
    for seed in range(30):
        incumbent, out = _moves(cfg, probs, n=1, seed=seed, turn=2)  # kinds 0, 1, 2 = the policy segment
        changed = np.flatnonzero(out[0] != incumbent)
        assert changed.size and np.array_equal(changed, np.arange(changed[0], changed[-1] + 1))
        assert np.array_equal(out[0][changed], 1 + changed % 2)
        runs += changed.size > 1
    assert runs > 10  # runs of several decisions, each on its own favourite
    _, plain = _moves(PostConfig(), probs, n=1, seed=0, turn=1)  # without it, kind 1 is a segment move
    changed = np.flatnonzero(plain[0] != 0)
    assert np.unique(plain[0][changed]).size == 1


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


def test_a_rival_placing_units_draws_as_many_units_from_a_stripe_start_as_stripe_units_layers_hold():
    """The hierarchical planner places units, not layers: its stripe start spreads over the units of
    ``stripe_units`` layers, the weight Post puts on a stripe per layer."""
    from postplace.search.start_prior import start_prior

    class Probe:
        name = "stripe:gpu0..gpu1"
        home = np.zeros(8, dtype=np.int64)

    class Layers:
        num_layers = 4  # 8 units in 4 layers: 2 stripe_units layers are 4 units

    space = SearchSpace(np.ones((8, 2), dtype=bool), failure_step_time=1.0, unit_time=np.ones((8, 2)), layers=Layers())
    home = np.exp(start_prior(space, Probe()))[:, 0]
    assert home == pytest.approx(np.full(8, 1 - min(0.5, 2 * 2 / 8)), rel=1e-4)


def test_on_layers_a_unit_move_stays_out_of_the_elite_and_a_stripe_move_joins_it():
    """A unit move (one micro-batch's part of a layer moved) is no stripe per layer: its step time is not
    that of the stripes it rounds to, so with elite_local only the moves that are stripes join the window."""
    from postplace import zoo
    from postplace.cluster import load_cluster
    from postplace.search import make_problem
    from postplace.search.config import build_config

    p = make_problem(zoo.cached_graph("gpt2", "small", "sgd", microbatches=2), load_cluster("k80x2"))
    lay = p.space.layers
    s = make_strategy("post", p.space, seed=0, config=build_config("post", {"elite_local": True, "ce_every": 480}))
    joined = skipped = 0
    for _ in range(8):
        x = s.ask(48)
        origins = list(s.last_origins)
        before = sum(len(r) for r in s.recent_placements)
        res = p.simulator.evaluate(x)
        s.tell(x, res.step_time, res.feasible)
        if any(o.startswith("probe") for o in origins):
            continue
        local = x[np.array(origins) == "local"]
        exact = (lay.expand(lay.collapse(local)) == local).all(axis=1)
        assert sum(len(r) for r in s.recent_placements) - before == origins.count("policy") + exact.sum()
        joined, skipped = joined + exact.sum(), skipped + (~exact).sum()
    assert joined > 0 and skipped > 0


@pytest.mark.parametrize("name", ["post", "reinforce"])
def test_local_after_holds_the_moves_back_until_that_many_samples_were_told(name):
    """Post makes its moves in its own batch, REINFORCE through the add-on: neither draws one before
    ``local_after`` samples, both do after."""
    from postplace.search.config import build_config

    cfg = build_config(name, {"use_local": "true", "local_after": "32"})
    if name == "post":
        cfg = dataclasses.replace(cfg, init="uniform", batch_size=8, ce_every=16)
    s = make_strategy(name, SPACE, seed=0, config=cfg)
    origins, told = [], 0
    while told < 64:
        p = s.ask(8)
        origins.append((told, list(s.last_origins)))
        s.tell(p, 1.0 + np.arange(len(p), dtype=float), np.ones(len(p), dtype=bool))
        told += len(p)
    assert all("local" not in o for t, o in origins if t < 32)
    assert all("local" in o for t, o in origins if t >= 32)


def test_ppo_learns_from_local_moves_only_when_asked_each_move_against_the_others():
    """A batch after the first: its local moves each redraw one decision of the incumbent, the one moving
    decision 4 is the best, and the policy's own samples all tie. With ppo_local the PPO step raises the
    probability of that move's value (judged against the other moves alone); without it the policy learns
    nothing from a batch whose own samples tie."""
    got = {}
    for ppo_local in (False, True):
        cfg = PostConfig(init="uniform", batch_size=8, ce_every=800, use_ce=False, ppo_local=ppo_local)
        s = make_strategy("post", SPACE, seed=5, config=cfg)
        p = s.ask(8)
        s.tell(p, np.arange(1.0, 9.0), np.ones(len(p), dtype=bool))  # the incumbent: the first placement
        incumbent = s.local.best_placement
        value = (incumbent[4] + 1) % D
        before = s.policy.probs()[4, value]
        p = s.ask(8)
        local = np.flatnonzero(np.array(s.last_origins) == "local")
        assert local.size >= 2
        for j, row in enumerate(local):  # move j redraws decision 4 + j (mod G) to the next device
            p[row] = incumbent
            p[row, (4 + j) % G] = (incumbent[(4 + j) % G] + 1) % D
        t = np.full(len(p), 3.0)
        t[local] = 5.0
        t[local[0]] = 0.5
        s.tell(p, t, np.ones(len(p), dtype=bool))
        got[ppo_local] = s.policy.probs()[4, value] - before
    assert got[False] == pytest.approx(0.0, abs=1e-12)
    assert got[True] > 0.01, got
