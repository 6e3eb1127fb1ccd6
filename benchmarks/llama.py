"""LLaMA 1B and 7B, AdamW, fp32 against bf16: what the default ``place`` answers on today's machines.

For each size x cluster x precision, the product path itself (``postplace.place("llama", cluster,
size=..., optimizer="adamw", precision=...)``, default flags: over micro-batch counts, the budget split
by successive halving) and what it costs:

* ``trace CPU s``: CPU seconds to trace the step at m = 1 (cold: the graph cache is empty);
* ``place wall s``: wall seconds of ``place``, tracing every count included (cold cache);
* ``ops``: ops of the m = 1 graph; ``state GB``: its persistent bytes (parameters + AdamW's moments);
* ``single``: the fastest single device that fits, and which (the memory model decides whether a GPU
  holds the step, not a guess); ``1 GPU``: whether one GPU holds it;
* ``answer``: the returned step time (simulated), its micro-batch count, the winning candidate and the plan;
* ``DP``: data parallelism, the best over the counts (``OOM`` where replicated state does not fit).

    OMP_NUM_THREADS=1 python benchmarks/llama.py [--sizes 1b,7b] [--clusters dgx8,dgx8x2]
        [--precisions fp32,bf16] [--budget 2400] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import tempfile
import time

import postplace


def ms(x) -> str:
    return "OOM" if x is None or not math.isfinite(x) else f"{x * 1e3:.1f}"


def trace_cost(size: str, precision: str) -> tuple[float, int, float]:
    from postplace.zoo import trace_model

    t0 = time.process_time()
    g = trace_model("llama", size, "adamw", precision=precision, init=False).graph
    return time.process_time() - t0, g.num_ops, float(g.persistent_bytes.sum())


def row(size: str, cluster: str, precision: str, budget: int) -> dict:
    with tempfile.TemporaryDirectory() as cache:
        os.environ["POSTPLACE_CACHE"] = cache  # cold: every count traced inside the timed call
        trace_s, ops, state = trace_cost(size, precision)
        t0 = time.perf_counter()
        r = postplace.place(
            "llama", cluster, size=size, budget=budget, step=postplace.Step(optimizer="adamw", precision=precision)
        )
        wall = time.perf_counter() - t0
    s = r.summary
    dp = min(
        (
            v
            for k, v in s["candidates"].items()
            if v is not None and k.startswith(("param-server", "param-server (sharded state)"))
        ),
        default=math.inf,
    )
    return {
        "size": size,
        "cluster": cluster,
        "precision": precision,
        "trace_cpu_s": trace_s,
        "place_wall_s": wall,
        "ops": ops,
        "state_gb": state / 1e9,
        "single_s": s.get("single_device_step_time_s"),
        "single": s.get("single_device"),
        "gpu_fits": _gpu_fits(r),
        "answer_s": r.step_time_s,
        "m": s.get("microbatches"),
        "returned": r.returned,
        "plan": s.get("plan"),
        "dp_s": dp if math.isfinite(dp) else None,
        "counts": s.get("microbatch_counts"),
    }


def _gpu_fits(r) -> bool:
    """Whether any single GPU candidate (``single:gpuK`` at any m) fits."""
    return any(v is not None for k, v in r.summary["candidates"].items() if k.startswith("single:gpu"))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="1b,7b")
    ap.add_argument("--clusters", default="dgx8,dgx8x2")
    ap.add_argument("--precisions", default="fp32,bf16")
    ap.add_argument("--budget", type=int, default=2400)
    ap.add_argument("--json")
    a = ap.parse_args()
    rows = []
    head = (
        "| size | cluster | precision | trace CPU s | place wall s | ops | state GB | 1 GPU | single ms | DP ms | answer ms "
        "| m | returned | plan |"
    )
    print(head)
    print("|" + "---|" * (head.count("|") - 1))
    for size in a.sizes.split(","):
        for cluster in a.clusters.split(","):
            for precision in a.precisions.split(","):
                r = row(size, cluster, precision, a.budget)
                rows.append(r)
                print(
                    f"| {size} | {cluster} | {precision} | {r['trace_cpu_s']:.1f} | {r['place_wall_s']:.0f} | "
                    f"{r['ops']} | {r['state_gb']:.1f} | {'fits' if r['gpu_fits'] else 'OOM'} | "
                    f"{ms(r['single_s'])} ({r['single']}) | {ms(r['dp_s'])} | "
                    f"{ms(r['answer_s'])} | {r['m']} | {r['returned']} | {r['plan']} |",
                    flush=True,
                )
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
