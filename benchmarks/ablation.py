"""Post against its ablations and the floor: best step time, speed of convergence, wall time.

    python benchmarks/ablation.py [--graphs inception_v3,nmt4,SHARED] [--strategies ...] [--seeds 3]

Every strategy gets the same budget (2,400 samples, the paper's) on ``k80x4`` with 256 groups and the
simulator. Per graph and strategy: median best step time over seeds with its range, the ratio of the
median to the best single device, the median number of samples to come within 5% of the run's final
best, and the median wall time of one run. ``SHARED`` expands to the three dnn-partitioning workloads.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import numpy as np

from postplace.cluster import load_cluster
from postplace.cluster.placement import single_device
from postplace.comparison import samples_to_within
from postplace.graph import load_graph
from postplace.search import Budget, make_problem, make_strategy, run

SHARED = Path(__file__).resolve().parents[2] / "shared/data/dnn-partitioning"
SHARED_NAMES = ("resnet50_training", "bert_l-3_training", "gnmt_training")


def load(name: str):
    if name in SHARED_NAMES:
        return load_graph(SHARED / f"{name}.json")
    from postplace.zoo import cached_graph

    return cached_graph(name, "full")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--graphs", default="inception_v3,nmt4,SHARED")
    ap.add_argument("--strategies", default="post,post-paper,ce,ppo,reinforce,random")
    ap.add_argument("--cluster", default="k80x4")
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--budget", type=int, default=2400)
    args = ap.parse_args()
    names = [x for g in args.graphs.split(",") for x in (SHARED_NAMES if g == "SHARED" else [g])]
    cluster = load_cluster(args.cluster)
    header = (
        f"{'graph':<18} {'strategy':<11} {'best ms (median)':>16} {'range ms':>19} {'/single':>8} "
        f"{'samples to 5%':>13} {'wall s':>7}"
    )
    print(f"budget {args.budget} samples, {args.seeds} seeds, cluster {args.cluster}, evaluator simulator")
    print(header)
    for name in names:
        graph = load(name)
        problem = make_problem(graph, cluster)
        singles = problem.simulator.evaluate_ops(
            np.stack([single_device(graph, cluster, d) for d in cluster.device_names])
        )
        single = float(singles.step_time[singles.feasible].min())
        for strategy in args.strategies.split(","):
            bests, reach, walls = [], [], []
            for seed in range(args.seeds):
                t = time.perf_counter()
                r = run(
                    make_strategy(strategy, problem.space, seed=seed), problem.simulator, Budget(samples=args.budget)
                )
                walls.append(time.perf_counter() - t)
                bests.append(r.best_step_time)
                if (k := samples_to_within(r.curve)) is not None:  # None: nothing feasible found
                    reach.append(k)
            med = statistics.median(bests)
            print(
                f"{name:<18} {strategy:<11} {med * 1e3:>16.2f} {min(bests) * 1e3:>9.2f}-{max(bests) * 1e3:<9.2f} "
                f"{med / single:>8.3f} {statistics.median(reach) if reach else float('nan'):>13.0f} {statistics.median(walls):>7.1f}",
                flush=True,
            )
        print(
            f"{name:<18} {'(single)':<11} {single * 1e3:>16.2f}   lower bound {problem.simulator.lower_bound * 1e3:.2f} ms",
            flush=True,
        )


if __name__ == "__main__":
    main()
