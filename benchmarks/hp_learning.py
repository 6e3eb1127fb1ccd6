"""Learning curves of the hierarchical planner (paper settings) and simulated annealing, against random search.

    python benchmarks/hp_learning.py [--ops 256] [--budget 1200] [--seeds 3] [--cluster k80x2] [--hp-lr 0.01 ...]

Graph: a generated layered DAG (each op reads 1-2 of the 20 previous ops; CNN-layer-scale FLOPs and
bytes, roofline times), one unit per op, so the planner's grouper has real work (``--ops`` units into at
most 256 groups). Placements are drawn over all devices of the cluster. Each row is a strategy at a
number of samples: the best feasible step time so far and the median of the latest 40 samples (at 4:
the first 4, hp's first batch; inf = the median sample was infeasible), as a ratio to the simulator's
lower bound, median over seeds; the last column is the wall time per sample spent inside the strategy
(ask + tell), one thread.
"""

from __future__ import annotations

import argparse
import time
from dataclasses import replace

import numpy as np
import torch

from postplace.cluster import load_cluster
from postplace.graph import OpGraph
from postplace.search.anneal import AnnealStrategy
from postplace.search.hierarchical import HierarchicalConfig, HierarchicalPlanner
from postplace.search.strategy import SearchSpace
from postplace.sim import Simulator


def layered_dag(n: int, seed: int = 0) -> OpGraph:
    rng = np.random.default_rng(seed)
    edges = []
    out = rng.uniform(1e5, 1e7, n)
    for j in range(1, n):
        for i in sorted(set(rng.integers(max(0, j - 20), j, size=rng.integers(1, 3)).tolist())):
            edges.append((i, j, out[i]))
    return OpGraph.build(
        [f"op{i}" for i in range(n)],
        edges,
        flops=rng.uniform(1e7, 1e10, n),
        bytes_accessed=rng.uniform(1e5, 1e8, n),
        output_bytes=out,
        name=f"layered-{n}",
    )


class Uniform:
    """Random search, inline so this script needs nothing outside this branch."""

    def __init__(self, space, seed):
        self.allowed, self.rng = space.allowed, np.random.default_rng(seed)

    def ask(self, max_n):
        k = min(16, max_n)
        u = self.rng.random((k, *self.allowed.shape)) * self.allowed
        return u.argmax(axis=2)

    def tell(self, *a):
        pass


def run(make, sim, budget):
    s, t_strategy, times = make(), 0.0, []
    while len(times) < budget:
        t0 = time.perf_counter()
        p = s.ask(budget - len(times))
        t_strategy += time.perf_counter() - t0
        r = sim.evaluate(p)
        t0 = time.perf_counter()
        s.tell(p, r.step_time, r.feasible)
        t_strategy += time.perf_counter() - t0
        times.extend(np.where(r.feasible, r.step_time, np.inf).tolist())
    return np.array(times), t_strategy / len(times)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ops", type=int, default=256)
    ap.add_argument("--budget", type=int, default=1200)
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--cluster", default="k80x2")
    ap.add_argument("--hp-lr", type=float, nargs="*", default=[], help="extra hp rows at these learning rates")
    ap.add_argument("--only-hp", action="store_true", help="skip anneal and random")
    args = ap.parse_args()
    torch.set_num_threads(1)
    g = layered_dag(args.ops)
    cluster = load_cluster(args.cluster)
    sim = Simulator(g, cluster, group_of_op=np.arange(g.num_ops))
    space = SearchSpace(
        np.isfinite(sim.problem.op_time),
        sim.failure_step_time,
        unit_time=sim.problem.op_time,
        device_names=cluster.device_names,
        edges=(g.edge_src, g.edge_dst, g.edge_bytes),
    )
    lb = sim.lower_bound
    single = [float(sim.evaluate(np.full((1, g.num_ops), d)).step_time[0]) for d in range(space.num_devices)]
    print(
        f"{g.name} on {args.cluster}: {g.num_ops} units, lower bound {lb * 1e3:.2f} ms; single device / LB: "
        + ", ".join(f"{n} {t / lb:.2f}" for n, t in zip(cluster.device_names, single, strict=True))
    )
    strategies = {
        "hp (paper)": lambda seed: HierarchicalPlanner(space, seed=seed, config=HierarchicalConfig.paper()),
    }
    for lr in args.hp_lr:
        cfg = replace(HierarchicalConfig.paper(), lr=lr)
        strategies[f"hp lr={lr:g}"] = lambda seed, cfg=cfg: HierarchicalPlanner(space, seed=seed, config=cfg)
    if not args.only_hp:
        strategies["anneal"] = lambda seed: AnnealStrategy(space, seed=seed)
        strategies["random"] = lambda seed: Uniform(space, seed)
    marks = [m for m in (4, 40, 100, 200, 400, 800, 1200, 2400) if m <= args.budget]
    print(f"{'strategy':12} {'samples':>7} {'best/LB':>8} {'recent/LB':>9} {'ms/sample':>9}")
    for name, make in strategies.items():
        runs = [run(lambda seed=seed, make=make: make(seed), sim, args.budget) for seed in range(args.seeds)]
        per = np.median([r[1] for r in runs]) * 1e3
        for m in marks:
            best = np.median([np.min(t[:m]) for t, _ in runs]) / lb
            recent = np.median([np.median(t[max(0, m - 40) : m]) for t, _ in runs]) / lb
            print(f"{name:12} {m:7d} {best:8.2f} {recent:9.2f} {per:9.1f}")


if __name__ == "__main__":
    main()
