"""Placements evaluated per second per core: the compiled simulator against the pure-Python reference.

    python benchmarks/simulator_speed.py [--shared ../shared/data/dnn-partitioning] [--repeats 5]

Graphs: the three shared dnn-partitioning workloads (static memory, measured times) and generated
layered DAGs of 10k and 100k ops (live memory, roofline times), all on ``k80x4``. Placements are
uniformly random over the five devices (colocation respected), the hardest case for the simulator:
most edges become transfers. Each cell is the median over repeats of one batch; one thread, so the
figure is per core.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import numpy as np

from postplace.cluster import load_cluster
from postplace.cluster.placement import colocation_representative
from postplace.graph import OpGraph, load_graph
from postplace.sim import Simulator, reference


def layered_dag(n: int, seed: int = 0) -> OpGraph:
    """A training-step-like DAG: each op reads 1-2 recent ops; FLOPs and bytes of CNN-layer scale."""
    rng = np.random.default_rng(seed)
    src, dst = [], []
    for j in range(1, n):
        for i in set(rng.integers(max(0, j - 20), j, size=rng.integers(1, 3)).tolist()):
            src.append(i)
            dst.append(j)
    out = rng.uniform(1e5, 1e7, n)
    edges = [(i, j, out[i]) for i, j in zip(src, dst, strict=True)]
    return OpGraph.build(
        [f"op{i}" for i in range(n)],
        edges,
        flops=rng.uniform(1e6, 1e10, n),
        bytes_accessed=rng.uniform(1e5, 1e8, n),
        output_bytes=out,
        name=f"layered-{n // 1000}k",
    )


def random_placements(graph: OpGraph, D: int, m: int, seed: int) -> np.ndarray:
    rep = colocation_representative(graph)
    return np.ascontiguousarray(np.random.default_rng(seed).integers(0, D, (m, graph.num_ops))[:, rep])


def rate(fn, count: int, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return count / statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shared", default=str(Path(__file__).resolve().parents[2] / "shared/data/dnn-partitioning"))
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    cluster = load_cluster("k80x4")
    graphs = []
    for name in ("resnet50_training", "bert_l-3_training", "gnmt_training"):
        path = Path(args.shared) / f"{name}.json"
        if path.exists():
            graphs.append(load_graph(path))
        else:
            print(f"(skipping {name}: {path} not found)")
    graphs += [layered_dag(10_000), layered_dag(100_000)]

    print(
        f"{'graph':<20} {'ops':>7} {'edges':>7} {'numba /s':>10} {'ns/(op+edge)':>13} {'reference /s':>13} {'speed-up':>9}"
    )
    for g in graphs:
        sim = Simulator(g, cluster)
        batch = max(4, int(2_000_000 / (g.num_ops + g.num_edges)))
        placements = random_placements(g, cluster.num_devices, batch, seed=1)
        sim.evaluate(placements[:2])  # compile / load the cached kernel outside the timing
        fast = rate(lambda: sim.evaluate(placements), batch, args.repeats)  # noqa: B023
        ref_n = 3 if g.num_ops < 50_000 else 1
        slow = rate(
            lambda: [reference.simulate(sim.problem, p) for p in placements[:ref_n]],  # noqa: B023
            ref_n,
            1 if g.num_ops >= 50_000 else 3,
        )
        ns = 1e9 / fast / (g.num_ops + g.num_edges)
        print(
            f"{g.name:<20} {g.num_ops:>7} {g.num_edges:>7} {fast:>10.0f} {ns:>13.1f} {slow:>13.2f} {fast / slow:>8.0f}x"
        )


if __name__ == "__main__":
    main()
