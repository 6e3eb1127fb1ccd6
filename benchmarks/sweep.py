"""The bounded sweep that chose Post's defaults (K, N, eps, learning rate, prior), on zoo models only.

    python benchmarks/sweep.py [--models inception_v3,resnet50,rnnlm,gpt2] [--seeds 2] [--budget 2400]

Each configuration runs ``--seeds`` seeds on each zoo model (full size, SGD, ``k80x4``, 256 groups,
the simulator) and is scored by the geometric mean over models of (median best step time / best
single-device step time). The shared dnn-partitioning workloads are never used here: they are test
inputs. Prints one line per configuration and the best one last.
"""

from __future__ import annotations

import argparse
import itertools
import time

import numpy as np

from postplace.cluster import load_cluster
from postplace.cluster.placement import single_device
from postplace.search import Budget, PostConfig, PostStrategy, make_problem, run
from postplace.zoo import cached_graph

GRID = {
    "batch_size": [24, 48],
    "ce_every": [240, 480],
    "eps_units": [1.0, 2.0],
    "lr": [0.05, 0.1],
    "anchor_weight": [0.5, 0.7, 0.9],
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="inception_v3,resnet50,rnnlm,gpt2")
    ap.add_argument("--cluster", default="k80x4")
    ap.add_argument("--seeds", type=int, default=2)
    ap.add_argument("--budget", type=int, default=2400)
    args = ap.parse_args()
    cluster = load_cluster(args.cluster)
    problems = []
    for name in args.models.split(","):
        graph = cached_graph(name, "full")
        problem = make_problem(graph, cluster)
        singles = problem.simulator.evaluate_ops(
            np.stack([single_device(graph, cluster, d) for d in cluster.device_names])
        )
        single = float(singles.step_time[singles.feasible].min())
        problems.append((name, problem, single))
        print(
            f"# {name}: {graph.num_ops} ops, {problem.grouping.num_groups} groups, best single {single * 1e3:.2f} ms",
            flush=True,
        )
    results = []
    for values in itertools.product(*GRID.values()):
        params = dict(zip(GRID, values, strict=True))
        cfg = PostConfig(**params)
        t = time.perf_counter()
        ratios = []
        for _, problem, single in problems:
            best = [
                run(
                    PostStrategy(problem.space, seed=s, config=cfg), problem.simulator, Budget(samples=args.budget)
                ).best_step_time
                for s in range(args.seeds)
            ]
            ratios.append(float(np.median(best)) / single)
        score = float(np.exp(np.mean(np.log(ratios))))
        results.append((score, params))
        cells = " ".join(f"{n}={r:.3f}" for (n, _, _), r in zip(problems, ratios, strict=True))
        print(f"{score:.4f}  {params}  {cells}  ({time.perf_counter() - t:.0f} s)", flush=True)
    score, params = min(results, key=lambda x: x[0])
    print(f"best: {score:.4f} {params}")


if __name__ == "__main__":
    main()
