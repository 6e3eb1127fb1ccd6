"""Post and random search on small instances never used to choose Post's defaults (issue 10, item 8).

    PYTHONPATH=src:. python benchmarks/held_out_optimum.py [--seeds 10] [--budget 2400]

The instances are ``tests/test_search_optimum.py``'s ``held_out_instance(101..110)`` (10 ops, 3 devices,
59,049 placements, each enumerated with the simulator for its optimum). Per instance: how many of the
seeds reach the optimum (within 1%), and the median and worst best/optimum ratio, for each strategy.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from postplace.search import Budget, make_strategy, run
from tests.test_search_optimum import HELD_OUT, held_out_instance, optimum


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", type=int, default=10)
    ap.add_argument("--budget", type=int, default=2400)
    ap.add_argument("--strategies", default="post,random")
    args = ap.parse_args()
    names = args.strategies.split(",")
    print(f"{'instance':>8} {'optimum':>8} " + " ".join(f"{n + ' hits':>12} {'median':>7} {'worst':>7}" for n in names))
    totals = dict.fromkeys(names, 0)
    t0 = time.perf_counter()
    for inst in HELD_OUT:
        problem = held_out_instance(inst)
        best, _ = optimum(problem)
        cells = []
        for name in names:
            ratio = np.array(
                [
                    run(
                        make_strategy(name, problem.space, seed=s), problem.simulator, Budget(samples=args.budget)
                    ).best_step_time
                    / best
                    for s in range(args.seeds)
                ]
            )
            hits = int(np.sum(ratio <= 1.01))
            totals[name] += hits
            cells.append(f"{hits:>9}/{args.seeds:<2} {np.median(ratio):7.3f} {ratio.max():7.3f}")
        print(f"{inst:>8} {best:8.3f} " + " ".join(cells), flush=True)
    print(
        "total   " + "  ".join(f"{n} {totals[n]}/{len(HELD_OUT) * args.seeds}" for n in names),
        f"({time.perf_counter() - t0:.0f} s)",
    )


if __name__ == "__main__":
    main()
