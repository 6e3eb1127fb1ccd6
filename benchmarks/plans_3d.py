"""The practitioner's 3D grid on transformers: ``best-3d`` beside the plain data-parallel plans.

Per model x cluster x micro-batch count (bf16, AdamW, foreach update, achieved kernel rates): the fastest
plain plan (``ddp``, ``zero2``, ``fsdp``, each with and without recomputation, over every GPU), the grid's
best (:func:`postplace.placers.grid.best_3d`: every tp x pp x dp a practitioner would try, recomputation
where a plan does not fit without it) in the words to launch it with, best-3d / plain, MFU, peak memory,
the plans tried and the wall time of the grid on this machine. Everything is simulated.

No row here is Post's: its search over a 3D plan's per-block choices runs on the layered estimate
(``benchmarks/layered_search.py``), not on the op level this script prices.

Run: ``OMP_NUM_THREADS=1 python benchmarks/plans_3d.py`` (GPT-2 and LLaMA-1B on ``dgx8``, a few minutes);
``--big`` adds LLaMA-7B on ``dgx8`` and ``dgx8x2`` (about 20 more minutes on 2 cores).
"""

from __future__ import annotations

import argparse
import json
import time

PLAIN = ("ddp", "zero2", "fsdp", "ddp+recompute", "zero2+recompute", "fsdp+recompute")
CASES = [
    ("gpt2", "full", "dgx8", 8),
    ("gpt2", "full@16", "dgx8", 16),
    ("llama", "1b", "dgx8", 8),
    ("llama", "1b@16", "dgx8", 16),
]  # SIZE@N: the model at a global batch of N sequences
BIG = [("llama", "7b", "dgx8", 8), ("llama", "7b@16", "dgx8x2", 16)]


def case(model: str, size: str, cluster_name: str, m: int) -> dict:
    from postplace import zoo
    from postplace.cluster import load_cluster
    from postplace.cost import RooflineCostModel
    from postplace.cost.utilisation import utilisation
    from postplace.placers.grid import best_3d
    from postplace.placers.practitioner import plan_devices, plan_step
    from postplace.plans import parse_plan

    cluster = load_cluster(cluster_name)
    cm = RooflineCostModel(kernels="achieved", update="foreach")
    graph = zoo.cached_graph(model, size, "adamw", precision="bf16", microbatches=m)
    gpus = plan_devices(cluster, parse_plan("ddp"))
    t0 = time.perf_counter()
    plain = []
    for name in PLAIN:
        plain.append(plan_step(graph, cluster, parse_plan(f"{name}:m={m}"), gpus, cost_model=cm))
    t1 = time.perf_counter()
    grid = best_3d(graph, cluster, gpus, cost_model=cm)
    t2 = time.perf_counter()
    fits = [p for p in plain if not p.oom]
    base = min(fits, key=lambda p: p.step_time_s) if fits else None
    best = grid.best  # the grid's own (no plain plan passed in): a model-parallel plan, or None

    def figures(r):
        if r is None:
            return None
        use = utilisation(r.graph, r.cluster, r.placement, r.step_time_s)
        return {
            "plan": r.plan,
            "words": r.describe(),
            "step_time_s": r.step_time_s,
            "mfu": use.mfu if use else None,
            "peak_gib": float(max(r.peak_memory_bytes)) / 2**30,
        }

    return {
        "model": f"{model} {size}",
        "cluster": cluster_name,
        "m": m,
        "plain": figures(base),
        "best_3d": figures(best),
        "grid_only": best is not None,
        "ratio": best.step_time_s / base.step_time_s if best and base else None,
        "tried": len(grid.tried),
        "notes": [n for n in grid.notes if ": schedule" not in n],
        "plain_wall_s": t1 - t0,
        "grid_wall_s": t2 - t1,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--big", action="store_true", help="add LLaMA-7B on dgx8 and dgx8x2")
    ap.add_argument("--json", default=None, help="write the rows here")
    args = ap.parse_args()
    rows = []
    print("model | cluster | m | best plain | ms | best-3d | ms | best-3d / plain | MFU | peak GiB | plans | grid s")
    for spec in CASES + (BIG if args.big else []):
        x = case(*spec)
        rows.append(x)
        p, b = x["plain"], x["best_3d"]
        print(
            f"{x['model']} | {x['cluster']} | {x['m']} | {p['plan'] if p else 'none fits'} | "
            f"{p['step_time_s'] * 1e3:.2f} | "
            if p
            else f"{x['model']} | {x['cluster']} | {x['m']} | none fits | - | ",
            end="",
        )
        if b:
            print(
                f"{b['words']} | {b['step_time_s'] * 1e3:.2f} | {x['ratio']:.3f} | {b['mfu']:.1%} | "
                f"{b['peak_gib']:.1f} | {x['tried']} | {x['grid_wall_s']:.0f}"
            )
        else:
            print(f"none fits | - | - | - | - | {x['tried']} | {x['grid_wall_s']:.0f}")
        for n in x["notes"]:
            print(f"    note: {n}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
