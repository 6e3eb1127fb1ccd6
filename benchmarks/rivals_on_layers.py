"""Post's rivals on Post's action space (issue 32 item 2): REINFORCE, random search and annealing at
m > 1 placing units one by one (as before) against placing one stripe per layer (as Post does), beside
Post, at equal samples.

Per zoo pair (the step traced as m micro-batches, simulated) and strategy: the median over seeds of the
best step time after ``--budget`` samples, for the unit space and the layer space, and Post's. The
X
local moves off for all three so only the action space differs).

Run: ``OMP_NUM_THREADS=1 python benchmarks/rivals_on_layers.py`` (about 5 minutes on 2 cores).
"""

from __future__ import annotations

import argparse
import statistics
import time
from dataclasses import replace

PAIRS = [("resnet50", "full", "k80x4", 4), ("gpt2", "full", "k80x4", 4), ("gpt2", "full", "dgx8", 8)]
RIVALS = ("reinforce", "random", "anneal")


def best(strategy, problem, budget: int) -> float:
    from postplace.search import Budget, run

    return float(run(strategy, problem.simulator, Budget(samples=budget)).best_step_time)


def main() -> None:
    from postplace import zoo
    from postplace.cluster import load_cluster
    from postplace.search import STRATEGIES, config_class, make_strategy
    from postplace.search.on_layers import on_layers
    from postplace.search.problem import make_problem

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--budget", type=int, default=480)
    ap.add_argument("--seeds", type=int, default=3)
    args = ap.parse_args()
    print(f"budget {args.budget} samples, median of {args.seeds} seeds; best step time in ms (simulated)")
    print("pair | strategy | on units | on layers | layers / units | post (default)")
    for model, size, cluster, m in PAIRS:
        t0 = time.perf_counter()
        problem = make_problem(zoo.cached_graph(model, size, "sgd", microbatches=m), load_cluster(cluster))
        post = statistics.median(
            best(make_strategy("post", problem.space, seed=s), problem, args.budget) for s in range(args.seeds)
        )
        for name in RIVALS:
            cfg = config_class(name)[1]
            cfg = replace(cfg, use_local=False) if hasattr(cfg, "use_local") else cfg
            units = statistics.median(
                best(STRATEGIES[name](problem.space, seed=s, config=cfg), problem, args.budget)
                for s in range(args.seeds)
            )
            layers = statistics.median(
                best(on_layers(STRATEGIES[name], problem.space, seed=s, config=cfg), problem, args.budget)
                for s in range(args.seeds)
            )
            print(
                f"{model} {size} / {cluster} m={m} | {name} | {units * 1e3:.3f} | {layers * 1e3:.3f} | "
                f"{layers / units:.3f} | {post * 1e3:.3f}"
            )
        print(f"    ({time.perf_counter() - t0:.0f} s)")


if __name__ == "__main__":
    main()
