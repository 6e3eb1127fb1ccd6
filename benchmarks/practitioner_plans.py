"""The plans practitioners launch against ``place``'s answer (issue 29), every figure simulated.

For each model x cluster, one ``postplace.place`` run (default flags: over micro-batch counts, the
practitioner plans among its candidates), and from its summary:

* each practitioner plan (``ddp``, ``zero2``, ``fsdp``, each ``+recompute``) at its best micro-batch
  count (``OOM`` where it fits at none, ``-`` where no count is a multiple of the GPUs);
* ``hybrid``: per group of units DDP or FSDP, recomputed or not, found by Post's paper form over those
  choices (``-`` where it found nothing below the uniform DDP and FSDP plans, or the step is too large);
* ``pipe``: the GPipe-style pipeline; ``start`` and ``placed``: Post's placement search (devices per op
  group) from its probe start, and its own best;
* ``plan start`` and ``plans``: Post over the per-unit plan space (the hybrid's search), from the fastest
  uniform DDP or FSDP plan at its micro-batch count, and its own best (``-`` where the plan budget allows
  no search: LLaMA-7B);
* ``own``: the better of Post's two searches; ``answer`` (what ``place`` returns) and ``own / best
  plan``: Post's own best over the best practitioner plan (below 1: the search beats every plan users
  would launch);
* ``MFU`` for the LLaMA rows: model FLOPs (6 x parameters x tokens, the forward and backward of
  a dense decoder; attention's score FLOPs left out, as in the PaLM paper's simple form) over
  (answer x GPUs x the GPU's bf16 peak).

    OMP_NUM_THREADS=1 python benchmarks/practitioner_plans.py [--rows resnet50/k80x4,gpt2/dgx8,...]
        [--budget 2400] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import math
import time

import postplace
from postplace.api.candidates import PRACTITIONER_PLANS

DEFAULT_ROWS = (  # issue 29's models x clusters where the step runs (K80s and V100s have no bf16 for LLaMA)
    "resnet50/k80x4,inception_v3/k80x4,gpt2/dgx8,gpt2/dgx8x2,gpt2/mixed,resnet50/mixed,"
    "llama-1b/dgx8,llama-1b/dgx8x2,llama-7b/dgx8,"
    "resnet50/dgx8,resnet50/dgx8x2,inception_v3/dgx8,inception_v3/dgx8x2,inception_v3/mixed,gpt2/k80x4,llama-7b/dgx8x2"
)


def ms(x) -> str:
    return "-" if x is None else ("OOM" if not math.isfinite(x) else f"{x * 1e3:.1f}")


def best_of(cands: dict, name: str) -> float | None:
    """The fastest time of candidate ``name`` over the counts; inf when it ran and never fitted; None when absent."""
    times = [v for k, v in cands.items() if k.split(" @m")[0] == name]
    if not times:
        return None
    ok = [v for v in times if v is not None]
    return min(ok) if ok else math.inf


def row(spec: str, budget: int) -> dict:
    model, cluster = spec.split("/")
    kw = {}
    if model.startswith("llama"):
        kw = {"size": model.split("-")[1], "step": postplace.Step(optimizer="adamw", precision="bf16")}
        model = "llama"
    t0 = time.perf_counter()
    r = postplace.place(model, cluster, budget=budget, **kw)
    wall = time.perf_counter() - t0
    s = r.summary
    cands = s["candidates"]
    plans = {p: best_of(cands, p) for p in PRACTITIONER_PLANS}
    fitted = [v for v in plans.values() if v is not None and math.isfinite(v)]
    best_plan = min(fitted) if fitted else None
    placed = s.get("search_best_step_time_s")
    plan_search = s.get("plan_search") or {}
    plans_own = plan_search.get("best_step_time_s")
    own = min((x for x in (placed, plans_own) if x is not None), default=None)
    out = {
        "row": spec,
        "plans": plans,
        "hybrid": best_of(cands, "hybrid"),
        "pipeline": best_of(cands, "pipeline"),
        "own": own,
        "placed": placed,
        "start": (s.get("search_start") or {}).get("step_time_s"),
        "plan_start": plan_search.get("start_step_time_s"),
        "plans_own": plans_own,
        "plan_search": plan_search or None,
        "answer": r.step_time_s,
        "returned": r.returned,
        "plan": s.get("plan"),
        "best_plan": best_plan,
        "own_over_best_plan": own / best_plan if own and best_plan else None,
        "wall_s": wall,
    }
    if model == "llama":
        out["mfu"] = mfu(r, kw["size"])
    return out


def mfu(r, size: str) -> float:
    from postplace import zoo

    cfg = zoo.spec("llama").config(size)
    params = float(r.graph.metadata.get("param_bytes", 0.0)) / 4.0  # fp32 master weights
    tokens = cfg["batch"] * cfg["seq"]
    gpus = [d for d in r.cluster.devices if d.kind == "gpu"]
    peak = gpus[0].peak_for("bf16")
    return 6 * params * tokens / (r.step_time_s * len(gpus) * peak)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", default=DEFAULT_ROWS)
    ap.add_argument("--budget", type=int, default=2400)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    rows = []
    short = {
        "ddp": "ddp",
        "zero2": "zero2",
        "fsdp": "fsdp",
        "ddp+recompute": "ddp+rc",
        "zero2+recompute": "zero2+rc",
        "fsdp+recompute": "fsdp+rc",
    }
    head = [
        "row",
        *short.values(),
        "hybrid",
        "pipe",
        "start",
        "placed",
        "plan start",
        "plans",
        "own",
        "answer",
        "own/best plan",
        "MFU",
        "wall s",
        "returned",
    ]
    print(" | ".join(head))
    for spec in args.rows.split(","):
        x = row(spec, args.budget)
        rows.append(x)
        ratio = "-" if x["own_over_best_plan"] is None else f"{x['own_over_best_plan']:.3f}"
        mfu_s = f"{x['mfu'] * 100:.1f}%" if "mfu" in x else "-"
        cells = [
            spec,
            *(ms(x["plans"][p]) for p in short),
            ms(x["hybrid"]),
            ms(x["pipeline"]),
            ms(x["start"]),
            ms(x["placed"]),
            ms(x["plan_start"]),
            ms(x["plans_own"]),
            ms(x["own"]),
            ms(x["answer"]),
            ratio,
            mfu_s,
            f"{x['wall_s']:.0f}",
            x["returned"],
        ]
        print(" | ".join(cells), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
