"""Parallel plans by default: the product's answer against data parallelism and a pipeline, per model x machine.

For each zoo model x cluster and seed, the product path itself (``postplace.place`` with default
flags: over micro-batch counts, successive halving of the budget) and, beside it, what a user would
run instead, each simulated on the same kind of graph:

* ``answer``: the returned step time, its micro-batch count, the candidate that won and the plan in words;
* ``DP``: data parallelism (the step traced as m micro-batches, micro-batch k on GPU k mod #GPUs,
  replicated state checked for memory), the best over the counts ``place`` tried; ``OOM`` where no
  count fits;
* ``pipe``: the GPipe-style pipeline (best of 2, 4... stages), the best over the counts;
* ``placers``: the best one-shot placer (m-topo, m-etf, m-sct, metis, expert) over the counts;
* ``m=1``: ``place(..., microbatches=1)``, the answer before parallel plans were candidates;
* ``single``: the fastest single device that fits; ``LB``: the m = 1 graph's lower bound.

Medians over seeds (the one-shot rows do not depend on the seed). ``ok`` says whether the answer is at
or below min(DP, pipe, placers) on every seed. ``gpt2-b64`` is GPT-2 at batch 64 (a module target,
traced again by ``place``), where data parallelism does not fit 12 GB K80 dies.

    OMP_NUM_THREADS=1 python benchmarks/parallel_plans.py [--models resnet50,gpt2] [--clusters k80x4,dgx8]
        [--budget 2400] [--seeds 3] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import time

import postplace
from postplace.errors import PostplaceError

ONE_SHOT = ("m-topo", "m-etf", "m-sct", "metis", "expert")


def ms(x) -> str:
    return "-" if x is None or not math.isfinite(x) else f"{x * 1e3:.1f}"


def best_of(cands: dict, prefix: tuple[str, ...]) -> float:
    vals = [v for k, v in cands.items() if v is not None and k.split(" @m")[0].startswith(prefix)]
    return min(vals, default=math.inf)


def target(model: str):
    """(target, keyword arguments of place) for a model name of this benchmark."""
    if model == "gpt2-b64":
        from postplace import zoo

        net, inputs, loss = zoo.build("gpt2", "full", batch=64, init=False)
        return net, {"inputs": inputs, "loss_fn": loss.fn, "targets": loss.targets}
    return model, {}


def row(model: str, cluster: str, budget: int, seeds: int) -> dict:
    tgt, kw = target(model)
    runs, one = [], []
    t0 = time.perf_counter()
    for seed in range(seeds):
        r = postplace.place(tgt, cluster, budget=budget, seed=seed, **kw)
        runs.append(r.summary)
        try:
            one.append(postplace.place(tgt, cluster, budget=budget, seed=seed, microbatches=1, **kw).step_time_s)
        except PostplaceError:
            one.append(math.inf)
    wall = (time.perf_counter() - t0) / seeds
    s0 = runs[0]
    cands = s0["candidates"]
    dp, pipe, placers = best_of(cands, ("data-parallel",)), best_of(cands, ("pipeline",)), best_of(cands, ONE_SHOT)
    answers = [s["best_step_time_s"] for s in runs]
    med = statistics.median(answers)
    mid = sorted(runs, key=lambda s: s["best_step_time_s"])[len(runs) // 2]
    yard = min(dp, pipe, placers)
    return {
        "model": model, "cluster": cluster, "answer_s": med, "answers_s": answers, "m": mid["microbatches"],
        "returned": mid["returned"], "plan": mid["plan"], "dp_s": dp, "pipeline_s": pipe, "placers_s": placers,
        "m1_s": statistics.median(one), "single_s": s0["single_device_step_time_s"], "lower_bound_s": s0["lower_bound_s"],
        "ok": all(a <= yard * (1 + 1e-9) for a in answers), "place_wall_s": wall,
        "samples_per_m": mid["samples_per_microbatches"],
    }  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="inception_v3,resnet50,rnnlm,nmt2,nmt4,gpt2,gpt2-b64")
    ap.add_argument("--clusters", default="k80x2,k80x4,dgx8,dgx8x2,mixed")
    ap.add_argument("--budget", type=int, default=2400)
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    rows = []
    print(f"{'model':12} {'cluster':7} {'answer':>8} {'m':>2} {'DP':>8} {'pipe':>8} {'placers':>8} {'m=1':>8} "
          f"{'single':>8} {'LB':>7} {'ok':>3} {'wall s':>6}  returned / plan (ms, simulated, median of seeds)",
          flush=True)  # fmt: skip
    for model in args.models.split(","):
        for cluster in args.clusters.split(","):
            if model == "gpt2-b64" and cluster != "k80x4":
                continue
            try:
                r = row(model, cluster, args.budget, args.seeds)
            except PostplaceError as exc:
                print(f"{model:12} {cluster:7} error: {exc}", flush=True)
                continue
            rows.append(r)
            dp = "OOM" if not math.isfinite(r["dp_s"]) else ms(r["dp_s"])
            print(f"{model:12} {cluster:7} {ms(r['answer_s']):>8} {r['m']:>2} {dp:>8} {ms(r['pipeline_s']):>8} "
                  f"{ms(r['placers_s']):>8} {ms(r['m1_s']):>8} {ms(r['single_s']):>8} {ms(r['lower_bound_s']):>7} "
                  f"{'yes' if r['ok'] else 'NO':>3} {r['place_wall_s']:6.0f}  {r['returned']} / {r['plan']}",
                  flush=True)  # fmt: skip
            if args.json:
                with open(args.json, "w") as f:
                    json.dump(rows, f, indent=1)
    ok = sum(r["ok"] for r in rows)
    print(f"answer at or below min(DP, pipeline, placers) on {ok} of {len(rows)} rows")


if __name__ == "__main__":
    main()
