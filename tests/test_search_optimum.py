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
    """8 ops with branches and joins, CPU 4-8x slower than the GPUs, transfers worth avoiding."""
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


@pytest.mark.parametrize("instance", [0, 1, 2])
def test_post_reaches_the_optimum_in_8_of_10_seeds(instance):
    problem = random_dag_instance(instance)
    best, _ = optimum(problem)
    hits = sum(
        run(make_strategy("post", problem.space, seed=s), problem.simulator, Budget(samples=BUDGET)).best_step_time
        <= best * 1.01
        for s in range(10)
    )
    assert hits >= 8, f"post reached the optimum {best} in {hits}/10 seeds"


def test_random_search_does_measurably_worse_where_the_optimum_is_a_needle():
    problem = needle_instance()
    best, count = optimum(problem)
    assert best == 1 + 1 + 1 and count == 1  # 3 ops per GPU... see the fast list: loads 2, 3, 3 -> 3
    post = [run(make_strategy("post", problem.space, seed=s), problem.simulator, Budget(samples=BUDGET))
            for s in range(10)]  # fmt: skip
    rand = [run(make_strategy("random", problem.space, seed=s), problem.simulator, Budget(samples=BUDGET))
            for s in range(10)]  # fmt: skip
    post_hits = sum(r.best_step_time <= best * 1.01 for r in post)
    rand_hits = sum(r.best_step_time <= best * 1.01 for r in rand)
    assert post_hits >= 8
    assert rand_hits <= 3
    assert np.median([r.best_step_time for r in rand]) > 1.5 * best
