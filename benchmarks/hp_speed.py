"""The hierarchical planner's cost per sample (ask + tell, one thread), denormals flushed or not.

    python benchmarks/hp_speed.py [--pairs inception_v3:k80x2 nmt2:k80x4] [--updates 12] [--repeats 3]

Each row is one zoo model (full size, Post's 256-unit grouping) on one cluster: the planner at its
paper settings makes ``--updates`` REINFORCE updates of 4 samples each on made-up step times after 3
warm-up updates; the table gives the median over ``--repeats`` of the seconds per sample spent in
``ask`` and in ``tell``, with hp's CPU modes as shipped (denormals flushed) and with denormals kept
(the planner before the fix), measured side by side in one process.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import time
import warnings

import numpy as np
import torch

import postplace.search.hierarchical as hierarchical
from postplace.cluster import load_cluster
from postplace.search.problem import make_problem
from postplace.zoo import cached_graph


@contextlib.contextmanager
def _denormals_kept():
    """hp's CPU modes before the fix: without oneDNN, denormals kept."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # torch's note about Intel GPUs when toggling oneDNN
        with torch.backends.mkldnn.flags(enabled=False):
            yield


def per_sample(space, updates: int, seed: int) -> tuple[float, float]:
    hp = hierarchical.HierarchicalPlanner(space, seed=seed)
    rng = np.random.default_rng(seed)
    ask = tell = 0.0
    for u in range(3 + updates):
        t0 = time.perf_counter()
        x = hp.ask(4)
        t1 = time.perf_counter()
        hp.tell(x, rng.uniform(1.0, 2.0, len(x)), np.ones(len(x), dtype=bool))
        t2 = time.perf_counter()
        if u >= 3:
            ask, tell = ask + t1 - t0, tell + t2 - t1
    n = 4 * updates
    return ask / n, tell / n


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--pairs", nargs="+", default=["inception_v3:k80x2", "nmt2:k80x4"])
    ap.add_argument("--updates", type=int, default=12)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    torch.set_num_threads(1)
    shipped = hierarchical._cpu_modes
    print(f"{'model':<13} {'cluster':<7} {'modes':<15} {'ask s/sample':>12} {'tell s/sample':>13} {'total':>7}")
    for pair in args.pairs:
        model, cluster = pair.split(":")
        space = make_problem(cached_graph(model, "full"), load_cluster(cluster)).space
        rows = {}
        for r in range(args.repeats):
            for label, modes in (("flushed", shipped), ("denormals kept", _denormals_kept)):
                hierarchical._cpu_modes = modes
                try:
                    rows.setdefault(label, []).append(per_sample(space, args.updates, seed=r))
                finally:
                    hierarchical._cpu_modes = shipped
        for label, runs in rows.items():
            ask = statistics.median(a for a, _ in runs)
            tell = statistics.median(t for _, t in runs)
            print(f"{model:<13} {cluster:<7} {label:<15} {ask:>12.4f} {tell:>13.4f} {ask + tell:>7.3f}")


if __name__ == "__main__":
    main()
