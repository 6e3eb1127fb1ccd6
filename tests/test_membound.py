"""Placement where one device is not enough (issue 14): overflow-ordered scores, memory-aware starts."""

import itertools
from dataclasses import replace

import numpy as np
import pytest

from postplace.cluster import Cluster
from postplace.graph import OpGraph
from postplace.search import Budget, PostConfig, PostStrategy, SearchSpace, make_problem, make_strategy, run
from postplace.search.post import speed_prior
from postplace.search.starts import candidate_homes, home_devices
from postplace.search.strategy import overflow_bytes, scores
from postplace.testing import TableCostModel, star_cluster

BUDGET = 2400


def small_gpu_cluster(gpu_memory: float, kinds=("cpu", "gpu", "gpu"), bandwidth: float = 2.0) -> Cluster:
    base = star_cluster(kinds, bandwidth=bandwidth)
    devices = tuple(replace(d, memory=gpu_memory if d.kind == "gpu" else 1e12) for d in base.devices)
    return Cluster("small-gpus", devices, base.switches, base.links)


# ------------------------------------------------------------------------------------------ scores
def test_scores_rank_infeasible_by_overflow_and_below_every_feasible():
    step = np.array([5.0, 1.0, 1.0, 1.0, 1.0])
    feasible = np.array([True, False, False, False, False])
    overflow = np.array([0.0, 1e9, 3e9, 0.5e9, np.inf])  # the last one failed
    s = scores(step, feasible, 100.0, overflow, overflow_scale=1e9)
    assert s[0] == 5.0
    np.testing.assert_allclose(s[1:4], [100 * 1.5, 100 * 1.75, 100 * (1 + 0.5 / 1.5)])
    assert s[4] == 200.0  # failed: the worst score there is
    assert (s[1:] > s[0]).all()
    np.testing.assert_array_equal(scores(step, feasible, 100.0), [5.0, 100, 100, 100, 100])  # no overflow told


def test_overflow_bytes_sums_the_excess_over_devices():
    peak = np.array([[5.0, 12.0, 3.0], [1.0, 1.0, 1.0]])
    np.testing.assert_array_equal(overflow_bytes(peak, np.array([4.0, 10.0, 10.0])), [3.0, 0.0])
    assert overflow_bytes(peak, np.array([4.0, 10.0, 10.0]), np.array([False, True]))[1] == np.inf


def test_the_runner_tells_each_sample_its_overflow():
    g = OpGraph.build(["a", "b"], [(0, 1, 1.0)], persistent_bytes=[3.0, 4.0], memory_mode="static")
    p = make_problem(g, small_gpu_cluster(5.0), groups=None, cost_model=TableCostModel(np.ones((2, 3))))
    told = []

    class Fixed:
        name = "fixed"

        def ask(self, n):
            return np.array([[1, 1], [1, 2], [0, 0]])

        def tell(self, placements, step_time, feasible, overflow=None):
            told.append((feasible.copy(), overflow.copy()))

        def state_dict(self):
            return {}

        def load_state_dict(self, s):
            pass

    run(Fixed(), p.simulator, Budget(samples=3))
    feasible, overflow = told[0]
    np.testing.assert_array_equal(feasible, [False, True, True])
    np.testing.assert_array_equal(overflow, [3.0 + 4.0 - 5.0, 0.0, 0.0])


# ------------------------------------------------------------------------------------------ learning from OOM
def two_unit_space():
    """Two units, two devices; a unit on device 0 overflows by 2 GB, on device 1 by 1 GB (say): the
    least-overflowing placement is [1, 1]."""
    allowed = np.ones((2, 2), dtype=bool)
    return SearchSpace(allowed, failure_step_time=10.0, unit_time=np.ones((2, 2)), capacity=np.array([1e9, 1e9]))


def overflow_of(p):
    return np.where(p == 0, 2e9, 1e9).sum(axis=1)


def test_an_oom_only_batch_moves_ppo_towards_less_overflow():
    space = two_unit_space()
    s = PostStrategy(space, seed=0, config=PostConfig(init="uniform", batch_size=8, ce_every=480))
    for _ in range(3):
        p = s.ask(8)
        s.tell(p, np.ones(len(p)), np.zeros(len(p), dtype=bool), overflow_of(p))
    probs = s.policy.probs()
    assert (probs[:, 1] > 0.6).all(), probs  # from 0.5: mass moved to the device that overflows less


def test_an_oom_only_cross_entropy_window_fits_the_least_overflowing_samples():
    space = two_unit_space()
    s = PostStrategy(space, seed=0, config=PostConfig(init="uniform", batch_size=4, ce_every=4, eps=0.0, use_ppo=False))
    s.ask(4)
    p = np.array([[0, 0], [0, 1], [1, 0], [1, 1]])
    s.tell(p, np.ones(4), np.zeros(4, dtype=bool), overflow_of(p))
    # elite = the best 10% of 4 samples = 1 sample: [1, 1], overflowing 2 GB against 3 and 4
    np.testing.assert_allclose(s.policy.probs(), [[0, 1], [0, 1]], atol=1e-12)


def test_overflow_never_lets_an_oom_sample_into_a_feasible_elite():
    space = two_unit_space()
    s = PostStrategy(space, seed=0, config=PostConfig(init="uniform", batch_size=4, ce_every=4, eps=0.0, use_ppo=False))
    s.ask(4)
    p = np.array([[0, 0], [0, 1], [1, 0], [1, 1]])
    # [1, 1] is fastest but OOM by a single byte; the only feasible sample is the slowest, [0, 0]
    s.tell(p, np.array([9.0, 2.0, 2.0, 0.1]), np.array([True, False, False, False]), np.array([0, 1e9, 1e9, 1.0]))
    np.testing.assert_allclose(s.policy.probs(), [[1, 0], [1, 0]], atol=1e-12)


def test_oom_samples_are_never_best_even_when_fastest():
    # every op on one GPU is the fastest placement and does not fit: 7 bytes on 5-byte GPUs
    g = OpGraph.build(
        ["a", "b", "c"], [(0, 1, 5.0), (1, 2, 5.0)], persistent_bytes=[2.0, 2.0, 3.0], memory_mode="static"
    )
    table = np.array([[8.0, 1.0, 1.0]] * 3)
    p = make_problem(g, small_gpu_cluster(5.0), groups=None, cost_model=TableCostModel(table))
    for name in ("post", "reinforce", "anneal", "random"):
        r = run(make_strategy(name, p.space, seed=0), p.simulator, Budget(samples=300))
        assert r.best_placement is not None and p.simulator.evaluate(r.best_placement[None]).feasible[0], name


# ------------------------------------------------------------------------------------------ starts
def chain(n, persistent, pins=(), kinds=None):
    g = OpGraph.build(
        [f"op{i}" for i in range(n)],
        [(i, i + 1, 1.0) for i in range(n - 1)],
        persistent_bytes=persistent,
        memory_mode="static",
        allowed_kinds=kinds,
    )
    return g


def test_the_speed_prior_homes_each_unit_on_the_fastest_device_it_may_use():
    """Issue 10 item 2: one CPU-only unit must not make the CPU every unit's home."""
    g = chain(4, [0.0] * 4)
    table = np.array([[8.0, 1.0, 1.0]] * 4)
    p = make_problem(g, small_gpu_cluster(1e12), groups=None, pins=["^op0$=cpu"], cost_model=TableCostModel(table))
    np.testing.assert_array_equal(home_devices(p.space), [0, 1, 1, 1])
    probs = np.exp(speed_prior(p.space, 0.7))
    np.testing.assert_allclose(probs[0], [1, 0, 0])
    assert (probs[1:, 1] > 0.69).all()


def test_the_fill_spreads_a_step_that_fits_no_gpu_over_two_in_program_order():
    g = chain(4, [1.0, 1.0, 1.0, 1.0])
    table = np.array([[8.0, 1.0, 1.0]] * 4)
    p = make_problem(g, small_gpu_cluster(3.0), groups=None, cost_model=TableCostModel(table))
    np.testing.assert_array_equal(home_devices(p.space, 0.8), [1, 1, 2, 2])
    np.testing.assert_array_equal(home_devices(p.space), [1, 1, 1, 1])  # without a fill: one GPU (4 > 3: OOM)
    names = [n for n, _ in candidate_homes(p.space, 0.8)]
    assert names[:2] == ["fastest", "fill"]


def test_post_samples_a_feasible_placement_in_its_first_batch_when_a_fill_finds_one():
    rng = np.random.default_rng(5)
    n = 40
    g = chain(n, rng.uniform(1.0, 2.0, n))
    table = np.stack([rng.uniform(4, 8, n), np.ones(n), np.ones(n), np.ones(n)], axis=1)
    cluster = small_gpu_cluster(0.45 * g.persistent_bytes.sum(), kinds=("cpu", "gpu", "gpu", "gpu"))
    p = make_problem(g, cluster, groups=None, cost_model=TableCostModel(table))
    r = run(make_strategy("post", p.space, seed=0), p.simulator, Budget(samples=48))
    assert np.isfinite(r.curve[min(47, len(r.curve) - 1)])
    first = next(i for i, v in enumerate(r.curve) if np.isfinite(v))
    assert first < 10  # among the probed starts
    paper = run(make_strategy("post-paper", p.space, seed=0), p.simulator, Budget(samples=48))
    assert r.best_step_time < paper.best_step_time


# ------------------------------------------------------------------------------------------ optimum
def memory_instance(seed: int, n: int = 9):
    """n ops with branches and joins whose footprints fill 1.67 GPUs: two of the two GPUs are needed
    (or the 4-8x slower CPU). Seeds 100-102 were never used to choose any default."""
    rng = np.random.default_rng(seed)
    out_bytes = rng.integers(1, 4, n).astype(float)
    edges = [(i, j, out_bytes[i]) for j in range(1, n) for i in range(j) if rng.random() < 0.3]
    gpu = rng.uniform(1.0, 3.0, n)
    table = np.stack([gpu * rng.uniform(4, 8, n), gpu, gpu], axis=1)
    mem = rng.uniform(1.0, 2.0, n)
    g = OpGraph.build(
        [f"op{i}" for i in range(n)], edges, persistent_bytes=mem, memory_mode="static", name=f"mem{seed}"
    )
    return make_problem(g, small_gpu_cluster(0.6 * mem.sum()), groups=None, cost_model=TableCostModel(table))


@pytest.mark.parametrize("seed", [100, 101, 102])
def test_post_reaches_the_optimum_of_a_step_that_needs_two_gpus(seed):
    problem = memory_instance(seed)
    every = np.array(list(itertools.product(range(3), repeat=problem.space.num_units)))
    res = problem.simulator.evaluate(every)
    best = float(res.step_time[res.feasible].min())
    one_gpu = (every == 1).all(axis=1) | (every == 2).all(axis=1)
    assert not res.feasible[one_gpu].any()  # no single GPU holds the step
    post = sum(
        run(make_strategy("post", problem.space, seed=s), problem.simulator, Budget(samples=BUDGET)).best_step_time
        <= best * 1.01
        for s in range(10)
    )
    rand = sum(
        run(make_strategy("random", problem.space, seed=s), problem.simulator, Budget(samples=BUDGET)).best_step_time
        <= best * 1.01
        for s in range(10)
    )
    assert post >= 8, f"post reached the optimum {best} in {post}/10 seeds"
    assert rand <= 3, f"random reached it in {rand}/10 seeds"
