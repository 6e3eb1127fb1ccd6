"""Seconds to load a cluster (route finding included) on full meshes of switches and on leaf-spines.

    python benchmarks/cluster_load.py [--timeout 60]

Full mesh of S switches: one GPU per switch, every pair of switches linked (25 GB/s), so every pair
of GPUs has many equally wide routes. Leaf-spine L x P: P GPUs per leaf switch (25 GB/s), every leaf
linked to each of L spines (50 GB/s). Each case runs in its own process with a timeout, so the
script also times a loader that does not finish (run it with PYTHONPATH at an older commit to
compare). One thread; best of 3 loads.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import time


def mesh_toml(switches: int) -> str:
    out = ['name = "mesh"']
    for s in range(switches):
        out += [
            "[[device]]",
            f'name = "gpu{s}"',
            'kind = "gpu"',
            "peak_flops = 1e13",
            "memory_bandwidth = 1e12",
            "memory = 1.6e10",
            "[[switch]]",
            f'name = "sw{s}"',
            "[[link]]",
            f'a = "gpu{s}"',
            f'b = "sw{s}"',
            "bandwidth = 2.5e10",
        ]
    for a in range(switches):
        for b in range(a + 1, switches):
            out += ["[[link]]", f'a = "sw{a}"', f'b = "sw{b}"', "bandwidth = 2.5e10", "latency = 1e-6"]
    return "\n".join(out)


def leaf_spine_toml(spines: int, leaves: int, per_leaf: int) -> str:
    out = ['name = "leafspine"']
    for g in range(leaves * per_leaf):
        out += [
            "[[device]]",
            f'name = "gpu{g}"',
            'kind = "gpu"',
            "peak_flops = 1e13",
            "memory_bandwidth = 1e12",
            "memory = 1.6e10",
        ]
    out += [f'[[switch]]\nname = "spine{s}"' for s in range(spines)]
    out += [f'[[switch]]\nname = "leaf{f}"' for f in range(leaves)]
    for g in range(leaves * per_leaf):
        out += ["[[link]]", f'a = "gpu{g}"', f'b = "leaf{g // per_leaf}"', "bandwidth = 2.5e10", "latency = 1e-6"]
    for f in range(leaves):
        for s in range(spines):
            out += ["[[link]]", f'a = "leaf{f}"', f'b = "spine{s}"', "bandwidth = 5e10", "latency = 1e-6"]
    return "\n".join(out)


def _load(text: str, q) -> None:
    from postplace.cluster import Cluster

    best = float("inf")
    for _ in range(3):
        t = time.perf_counter()
        Cluster.from_toml_text(text)
        best = min(best, time.perf_counter() - t)
    q.put(best)


def timed(text: str, timeout: float) -> float | None:
    q = mp.get_context("fork").Queue()
    p = mp.get_context("fork").Process(target=_load, args=(text, q))
    p.start()
    p.join(timeout)
    if p.is_alive():
        p.kill()
        p.join()
        return None
    return q.get()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--timeout", type=float, default=60.0, help="seconds per case before giving up")
    args = ap.parse_args()
    cases = [(f"full mesh {s} switches", s, mesh_toml(s)) for s in (4, 6, 8, 10, 16, 32)]
    cases += [
        (f"leaf-spine {sp} x {lf}, {lf * per} GPUs", lf * per, leaf_spine_toml(sp, lf, per))
        for sp, lf, per in ((2, 4, 2), (4, 8, 2), (6, 8, 2), (4, 8, 8), (8, 16, 4))
    ]
    print(f"{'topology':34s} {'devices':>7s} {'load s':>9s}")
    for name, devices, text in cases:
        t = timed(text, args.timeout)
        cell = f"> {args.timeout:.0f}" if t is None else f"{t:.3f}"
        print(f"{name:34s} {devices:7d} {cell:>9s}", flush=True)


if __name__ == "__main__":
    main()
