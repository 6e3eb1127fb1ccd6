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
* ``post``: Post's own best, the search candidate alone (no data-parallel or pipeline candidate
  given to it, no seed; its start is its own probe), best over the counts; ``start`` the start its
  probe chose at the count of its best, with that start's step time;
* ``paper``: the same from the paper's uniform start (``place(..., strategy="post-paper")``, its
  search candidate alone): what Post's learning finds by itself;
* ``m=1`` (with ``--m1``): ``place(..., microbatches=1)``, the answer before parallel plans were
  candidates;
* ``single``: the fastest single device that fits; ``LB``: the m = 1 graph's lower bound.

Medians over seeds (the one-shot rows do not depend on the seed). ``ok`` says whether the answer is at
or below min(DP, pipe, placers) on every seed. The last lines check issue 20's goals: ``post`` at or
below min(DP, pipe) on two thirds of the rows, 5% below it on a quarter, and ``paper`` within 10% of
DP on half of the ``k80x4`` and ``dgx8`` rows. ``gpt2-b64`` is GPT-2 at batch 64 (a module target,
traced again by ``place``), where data parallelism does not fit 12 GB K80 dies.

    OMP_NUM_THREADS=1 python benchmarks/parallel_plans.py [--models resnet50,gpt2] [--clusters k80x4,dgx8]
        [--budget 2400] [--seeds 3] [--m1] [--json out.json]
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
        return net, {"step": postplace.Step(inputs=inputs, loss_fn=loss.fn, targets=loss.targets)}
    return model, {}


def search_start(summary: dict) -> tuple[str, float | None]:
    """The start of the search at the count where the search did best: (name, step time)."""
    cands = summary["candidates"]
    best = min((k for k in cands if k.startswith("search") and cands[k] is not None), key=cands.get, default=None)
    m = best.split(" @m")[1] if best and " @m" in best else str(summary.get("microbatches", 1))
    start = summary.get("search_start_per_microbatches", {}).get(m) or summary.get("search_start") or {}
    return str(start.get("name", "?")), start.get("step_time_s")


def row(model: str, cluster: str, budget: int, seeds: int, m1: bool) -> dict:
    tgt, kw = target(model)
    runs, one, paper, starts = [], [], [], []
    t0 = time.perf_counter()
    for seed in range(seeds):
        r = postplace.place(tgt, cluster, budget=budget, seed=seed, **kw)
        runs.append(r.summary)
        starts.append(search_start(r.summary))
        u = postplace.place(tgt, cluster, budget=budget, seed=seed, strategy="post-paper", **kw)
        paper.append(best_of(u.summary["candidates"], ("search",)))
        if m1:
            try:
                one.append(postplace.place(tgt, cluster, budget=budget, seed=seed, microbatches=1, **kw).step_time_s)
            except PostplaceError:
                one.append(math.inf)
    wall = (time.perf_counter() - t0) / seeds
    s0 = runs[0]
    cands = s0["candidates"]
    dp, pipe, placers = best_of(cands, ("param-server",)), best_of(cands, ("pipeline",)), best_of(cands, ONE_SHOT)
    answers = [s["best_step_time_s"] for s in runs]
    posts = [best_of(s["candidates"], ("search",)) for s in runs]
    mid_post = sorted(range(len(runs)), key=lambda i: posts[i])[len(runs) // 2]
    med = statistics.median(answers)
    mid = sorted(runs, key=lambda s: s["best_step_time_s"])[len(runs) // 2]
    yard = min(dp, pipe, placers)
    return {
        "model": model,
        "cluster": cluster,
        "answer_s": med,
        "answers_s": answers,
        "m": mid["microbatches"],
        "returned": mid["returned"],
        "plan": mid["plan"],
        "dp_s": dp,
        "pipeline_s": pipe,
        "placers_s": placers,
        "post_s": statistics.median(posts),
        "posts_s": posts,
        "start": starts[mid_post][0],
        "start_s": starts[mid_post][1],
        "paper_s": statistics.median(paper),
        "papers_s": paper,
        "m1_s": statistics.median(one) if one else None,
        "single_s": s0["single_device_step_time_s"],
        "lower_bound_s": s0["lower_bound_s"],
        "ok": all(a <= yard * (1 + 1e-9) for a in answers),
        "place_wall_s": wall,
        "samples_per_m": mid["samples_per_microbatches"],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="inception_v3,resnet50,rnnlm,nmt2,nmt4,gpt2,gpt2-b64")
    ap.add_argument("--clusters", default="k80x2,k80x4,dgx8,dgx8x2,mixed")
    ap.add_argument("--budget", type=int, default=2400)
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--m1", action="store_true", help="also run place(..., microbatches=1), the pre-issue-19 answer")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    rows = []
    print(
        f"{'model':12} {'cluster':7} {'answer':>8} {'m':>2} {'DP':>8} {'pipe':>8} {'placers':>8} {'post':>8} "
        f"{'paper':>8} {'m=1':>8} {'single':>8} {'LB':>7} {'ok':>3} {'wall s':>6}  start (ms) | returned / plan "
        "(ms, simulated, median of seeds)",
        flush=True,
    )
    for model in args.models.split(","):
        for cluster in args.clusters.split(","):
            if model == "gpt2-b64" and cluster != "k80x4":
                continue
            try:
                r = row(model, cluster, args.budget, args.seeds, args.m1)
            except PostplaceError as exc:
                print(f"{model:12} {cluster:7} error: {exc}", flush=True)
                continue
            rows.append(r)
            dp = "OOM" if not math.isfinite(r["dp_s"]) else ms(r["dp_s"])
            print(
                f"{model:12} {cluster:7} {ms(r['answer_s']):>8} {r['m']:>2} {dp:>8} {ms(r['pipeline_s']):>8} "
                f"{ms(r['placers_s']):>8} {ms(r['post_s']):>8} {ms(r['paper_s']):>8} {ms(r['m1_s']):>8} "
                f"{ms(r['single_s']):>8} {ms(r['lower_bound_s']):>7} {'yes' if r['ok'] else 'NO':>3} "
                f"{r['place_wall_s']:6.0f}  {r['start']} {ms(r['start_s'])} | {r['returned']} / {r['plan']}",
                flush=True,
            )
            if args.json:
                with open(args.json, "w") as f:
                    json.dump(rows, f, indent=1)
    ok = sum(r["ok"] for r in rows)
    print(f"answer at or below min(DP, pipeline, placers) on {ok} of {len(rows)} rows")
    yard = [min(r["dp_s"], r["pipeline_s"]) for r in rows]
    at = sum(r["post_s"] <= y * (1 + 1e-9) for r, y in zip(rows, yard, strict=True))
    below = sum(r["post_s"] <= 0.95 * y for r, y in zip(rows, yard, strict=True))
    print(
        f"post at or below min(DP, pipeline) on {at} of {len(rows)} rows (goal: two thirds); "
        f"5% or more below it on {below} (goal: a quarter)"
    )
    pick = [r for r in rows if r["cluster"] in ("k80x4", "dgx8") and math.isfinite(r["dp_s"])]
    near = sum(r["paper_s"] <= 1.1 * r["dp_s"] for r in pick)
    print(f"paper (uniform start) within 10% of DP on {near} of {len(pick)} k80x4/dgx8 rows (goal: half)")


if __name__ == "__main__":
    main()
