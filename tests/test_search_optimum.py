"""Small instances whose optimum is known by enumerating every placement with the simulator."""

import itertools

import numpy as np
import pytest

from postplace.graph import OpGraph
from postplace.search import Budget, make_problem, make_strategy, run
from postplace.testing import TableCostModel, star_cluster

KINDS = ("cpu", "gpu", "gpu")
BUDGET = 2400  # the paper's budget, and the default


def optimum(problem):
    every = np.array(list(itertools.product(range(3), repeat=problem.space.num_units)))
    r = problem.simulator.evaluate(every)
    return float(r.step_time[r.feasible].min()), int(np.sum(r.step_time <= r.step_time[r.feasible].min() * 1.01))


def random_dag_instance(seed: int):
    """8 ops with branches and joins, CPU 4-8x slower than the GPUs, transfers worth avoiding.

    Seeds 0..9 are the instances Post's defaults were tuned on (benchmarks/RESULTS.md, "Post's
    defaults"), so no test here measures Post on them: that would be in-sample. The held-out instances
    below are the test; this generator stays for the record of what was tuned on."""
    rng = np.random.default_rng(seed)
    out_bytes = rng.integers(1, 4, 8).astype(float)
    edges = [(i, j, out_bytes[i]) for j in range(1, 8) for i in range(j) if rng.random() < 0.3]
    gpu = rng.uniform(1.0, 3.0, 8)
    table = np.stack([gpu * rng.uniform(4, 8, 8), gpu, gpu], axis=1)
    g = OpGraph.build([f"op{i}" for i in range(8)], edges, name=f"dag{seed}")
    return make_problem(g, star_cluster(KINDS, bandwidth=2.0), groups=None, cost_model=TableCostModel(table))


def needle_instance():
    """8 independent ops, each fast (1 s) on one device and slow (10 s) on the others: the optimum puts
    every op on its own fast device, a 1-in-6561 placement that random sampling rarely hits, while
    per-op learning finds it at once."""
    fast = [0, 1, 2, 1, 2, 0, 1, 2]
    table = np.full((8, 3), 10.0)
    table[np.arange(8), fast] = 1.0
    g = OpGraph.build([f"op{i}" for i in range(8)], name="needle")
    return make_problem(g, star_cluster(KINDS), groups=None, cost_model=TableCostModel(table))


def test_random_search_does_measurably_worse_where_the_optimum_is_a_needle():
    problem = needle_instance()
    best, count = optimum(problem)
    assert best == 1 + 1 + 1 and count == 1  # 3 ops per GPU... see the fast list: loads 2, 3, 3 -> 3
    post = [
        run(make_strategy("post", problem.space, seed=s), problem.simulator, Budget(samples=BUDGET)) for s in range(10)
    ]
    rand = [
        run(make_strategy("random", problem.space, seed=s), problem.simulator, Budget(samples=BUDGET))
        for s in range(10)
    ]
    post_hits = sum(r.best_step_time <= best * 1.01 for r in post)
    rand_hits = sum(r.best_step_time <= best * 1.01 for r in rand)
    assert post_hits >= 8
    assert rand_hits <= 3
    assert np.median([r.best_step_time for r in rand]) > 1.5 * best


# ---------------------------------------------------------------------------------------------- held out
# The defaults were chosen on random_dag_instance(0..9) (benchmarks/RESULTS.md, "Post's defaults"). These
# instances were never used for that: another generator (10 ops, CPU 3-6x slower, the two GPUs differing
# by up to 25% per op), seeds 101..110, all ten reported, none left out. 3^10 = 59,049 placements, so
# random search with 2,400 samples covers 4% of them and rarely hits the optimum.
HELD_OUT = range(101, 111)


def held_out_instance(seed: int):
    rng = np.random.default_rng(seed)
    n = 10
    out_bytes = rng.integers(1, 4, n).astype(float)
    edges = [(i, j, out_bytes[i]) for j in range(1, n) for i in range(j) if rng.random() < 0.25]
    gpu = rng.uniform(1.0, 3.0, n)
    table = np.stack(
        [gpu * rng.uniform(3, 6, n), gpu * rng.uniform(0.8, 1.25, n), gpu * rng.uniform(0.8, 1.25, n)], axis=1
    )
    g = OpGraph.build([f"op{i}" for i in range(n)], edges, name=f"held{seed}")
    return make_problem(g, star_cluster(KINDS, bandwidth=2.0), groups=None, cost_model=TableCostModel(table))


@pytest.fixture(scope="module")
def held_out_hits():
    """Per held-out instance: (seeds of 10 where post reaches the optimum, the same for random)."""
    hits = {}
    for seed in HELD_OUT:
        problem = held_out_instance(seed)
        best, _ = optimum(problem)
        counts = []
        for name in ("post", "random"):
            found = [
                run(
                    make_strategy(name, problem.space, seed=s), problem.simulator, Budget(samples=BUDGET)
                ).best_step_time
                for s in range(10)
            ]
            counts.append(sum(t <= best * 1.01 for t in found))
        hits[seed] = tuple(counts)
    return hits


def test_post_beats_random_search_on_held_out_instances(held_out_hits):
    # measured at the time of writing: post 67/100, random 15/100 (at most 2 of 10 on any instance)
    assert all(r <= 3 for _, r in held_out_hits.values()), held_out_hits
    post = sum(p for p, _ in held_out_hits.values())
    rand = sum(r for _, r in held_out_hits.values())
    assert post >= 60 and post >= 3 * rand, held_out_hits


@pytest.mark.xfail(
    strict=True,
    reason="the 8-of-10 claim holds on 5 of the 10 held-out instances only (102: 1/10, "
    "103: 0/10, 110: 4/10; Post stops 1-2% above the optimum); see RESULTS",
)
def test_post_reaches_the_optimum_in_8_of_10_seeds_on_held_out_instances(held_out_hits):
    assert all(p >= 8 for p, _ in held_out_hits.values()), held_out_hits
