"""The contract every strategy must keep, as reusable checks (Optuna's sampler test suites, in small).

``check_strategy_contract(factory, space)`` runs them all; ``factory(space, seed)`` builds a fresh
strategy. Evaluation uses ``score_fn(placements) -> step times`` so the checks need no simulator.
"""

from __future__ import annotations

import numpy as np

from postplace.search.strategy import SearchSpace


def toy_score(space: SearchSpace):
    """A deterministic score: a per-(unit, device) cost summed over units; device 0 is never feasible
    for unit 0 (so infeasible samples appear), and an infeasible sample overflows by 1 GB per unit on
    device 0. Returns ``(step, feasible, overflow)``."""
    rng = np.random.default_rng(1234)
    cost = rng.uniform(1.0, 2.0, space.allowed.shape)

    def score(placements: np.ndarray):
        step = cost[np.arange(space.num_units)[None, :], placements].sum(axis=1)
        feasible = placements[:, 0] != 0
        overflow = np.where(feasible, 0.0, 1e9 * (placements == 0).sum(axis=1))
        return step, feasible, overflow

    return score


def drive(strategy, space: SearchSpace, samples: int, score=None) -> list[np.ndarray]:
    """Ask and tell until ``samples`` are spent; ``score(placements)`` returns ``(step, feasible)`` or
    ``(step, feasible, overflow)``, told in the runner's order (overflow as the fourth argument)."""
    score = score or toy_score(space)
    asked, done = [], 0
    while done < samples:
        p = np.atleast_2d(strategy.ask(samples - done))
        assert 1 <= len(p) <= samples - done, "ask must return between 1 and max_n placements"
        result = score(p)
        step, feasible = result[0], result[1]
        overflow = result[2] if len(result) > 2 else None
        strategy.tell(p, step, feasible, overflow)
        asked.append(p)
        done += len(p)
    return asked


def check_overflow_is_optional(factory, space: SearchSpace, samples: int = 96) -> None:
    """``tell`` takes the overflow as its fourth argument or not at all (None), and the samples stay
    reproducible either way."""
    base = toy_score(space)

    def without(p):
        return base(p)[:2]

    a = np.concatenate(drive(factory(space, 5), space, samples, without))
    b = np.concatenate(drive(factory(space, 5), space, samples, without))
    np.testing.assert_array_equal(a, b)
    s = factory(space, 5)
    p = np.atleast_2d(s.ask(4))
    step, feasible, _ = base(p)
    s.tell(p, step, feasible)  # three arguments: the protocol's default for overflow


def check_shapes_and_allowed(factory, space: SearchSpace, samples: int = 120) -> None:
    for p in drive(factory(space, 0), space, samples):
        assert p.ndim == 2 and p.shape[1] == space.num_units and np.issubdtype(p.dtype, np.integer)
        assert ((p >= 0) & (p < space.num_devices)).all()
        assert space.allowed[np.arange(space.num_units)[None, :], p].all(), "sampled a disallowed device"


def check_same_seed_same_samples(factory, space: SearchSpace, samples: int = 120) -> None:
    a = np.concatenate(drive(factory(space, 7), space, samples))
    b = np.concatenate(drive(factory(space, 7), space, samples))
    c = np.concatenate(drive(factory(space, 8), space, samples))
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, c), "different seeds gave identical samples"


def check_state_dict_round_trip(factory, space: SearchSpace, first: int = 96, then: int = 96) -> None:
    """The state survives the run folder's own format (JSON + npz, :mod:`postplace.search.state_io`)."""
    import copy
    import json

    from postplace.search.state_io import decode, encode

    original = factory(space, 3)
    drive(original, space, first)
    arrays: dict = {}
    tree = json.loads(json.dumps(encode(copy.deepcopy(original.state_dict()), arrays)))
    state = decode(tree, {k: v.copy() for k, v in arrays.items()})
    restored = factory(space, 99)  # a different seed: everything must come from the state
    restored.load_state_dict(state)
    a = np.concatenate(drive(original, space, then))
    b = np.concatenate(drive(restored, space, then))
    np.testing.assert_array_equal(a, b)


def check_cross_entropy_step(factory, space: SearchSpace, n: int) -> None:
    """For a strategy with a cross-entropy step every ``n`` samples (Post, ce): after exactly ``n``
    samples its policy is the elite's device frequencies (the best 10% of the feasible samples of the
    policy's own, at least one) mixed with uniform over each unit's allowed devices by the strategy's
    ``eps``. A strategy that adds other placements to an ask (Post's local moves, last in the batch)
    says how many of the last ask's are the policy's own in ``own_in_last_ask``."""
    s = factory(space, 5)
    score = toy_score(space)
    asked, done = [], 0
    while done < n:
        p = np.atleast_2d(s.ask(n - done))
        own = getattr(s, "own_in_last_ask", len(p))
        s.tell(p, *score(p))
        asked.append(p[:own])
        done += len(p)
    asked = np.concatenate(asked)
    step, feasible = score(asked)[:2]
    ok = np.flatnonzero(feasible)
    assert ok.size, "the toy score gave no feasible sample"
    elite = asked[ok[np.argsort(step[ok], kind="stable")[: max(1, int(0.1 * ok.size))]]]
    G, D = space.allowed.shape
    freq = np.zeros((G, D))
    for row in elite:
        freq[np.arange(G), row] += 1.0 / len(elite)
    n_allowed = space.allowed.sum(axis=1, keepdims=True)
    expected = np.where(space.allowed, (1 - s.eps) * freq + s.eps / n_allowed, 0.0)
    np.testing.assert_allclose(s.policy.probs(), expected, atol=1e-9, err_msg="no cross-entropy step at n samples")


def check_strategy_contract(factory, space: SearchSpace) -> None:
    check_shapes_and_allowed(factory, space)
    check_same_seed_same_samples(factory, space)
    check_state_dict_round_trip(factory, space)
    check_overflow_is_optional(factory, space)
