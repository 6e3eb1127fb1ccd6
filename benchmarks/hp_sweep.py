"""The hierarchical planner's learning-rate sweep on zoo models (its tuning budget; Post's is sweep.py).

    OMP_NUM_THREADS=1 python benchmarks/hp_sweep.py [--models resnet50,inception_v3] [--lrs 0.1,0.01,0.001]

Each learning rate runs one seed of 2,400 samples per model (``k80x4``, 256 groups, simulator); the
score is, as in sweep.py, the geometric mean over models of best / best single device.
"""

from __future__ import annotations

import argparse
import time
from dataclasses import replace

import numpy as np

from postplace.cluster import load_cluster
from postplace.comparison import _single_time
from postplace.search import Budget, make_problem, run
from postplace.search.hierarchical import HierarchicalConfig, HierarchicalPlanner
from postplace.zoo import cached_graph


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="resnet50,inception_v3")
    ap.add_argument("--lrs", default="0.1,0.01,0.001")
    ap.add_argument("--budget", type=int, default=2400)
    args = ap.parse_args()
    cluster = load_cluster("k80x4")
    problems = []
    for name in args.models.split(","):
        graph = cached_graph(name, "full")
        problem = make_problem(graph, cluster)
        problems.append((name, problem, _single_time(graph, cluster, problem.simulator)))
    for lr in (float(x) for x in args.lrs.split(",")):
        cfg = replace(HierarchicalConfig.paper(), lr=lr)
        ratios, t = [], time.perf_counter()
        for _, problem, single in problems:
            r = run(
                HierarchicalPlanner(problem.space, seed=0, config=cfg), problem.simulator, Budget(samples=args.budget)
            )
            ratios.append(r.best_step_time / single)
        score = float(np.exp(np.mean(np.log(ratios))))
        cells = " ".join(f"{n}={x:.3f}" for (n, _, _), x in zip(problems, ratios, strict=True))
        print(f"lr {lr:<6g} score {score:.4f}  {cells}  ({time.perf_counter() - t:.0f} s)", flush=True)


if __name__ == "__main__":
    main()
