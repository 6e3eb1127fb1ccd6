"""``place --layered`` at scale: the practitioner's grid (``best-3d``) against each strategy's own best over its
per-block choices (how each block recomputes: not at all, whole, or by torchtitan's selective op rule; where a
1F1B pipeline's stages are cut), the same bases and the same number of plans for every strategy
(:func:`postplace.compare_layered`).

Per row (LLaMA in bf16 with AdamW, fp16 on ``mixed`` whose V100s have no bf16, micro-batches of one and two sequences, every plan priced by the layered
estimate): ``best-3d`` in the words to launch it with, each strategy's own best over ``best-3d`` (``post``;
``post-start``, its anchored start sampled with every learning step off; ``local``, local moves alone;
``random``), Post's new bests by origin (``policy``: its own samples; ``local``: its moves), the MFU of Post's
answer (PaLM's count, over the peaks of all the row's GPUs) and the wall time of ``place --layered`` with Post
(the grid, then Post's searches). On GPUs of several models (``mixed8x8``, ``mixed``) a last column, ``speed cut``, is
the reference a practitioner could write by hand: the grid's fastest 1F1B pipeline with each stage's blocks in
proportion to its GPUs' speed (one block's forward and backward on each model), recomputing as the grid does
(selective, full, then the fewest blocks that fit), over best-3d; and the searches there also decide each GPU
model's micro-batch size (``mbs=``) around the grid's fastest plan without a pipeline at each tensor degree.
Every time is simulated and estimated.

Run: ``OMP_NUM_THREADS=1 python benchmarks/layered_search.py`` (about 7 minutes on 2 cores); ``--quick``: the
first two rows at 480 plans; ``--rows 13b@256/mixed8x8,...``: those rows only.
"""

from __future__ import annotations

import argparse
import json

ROWS = [
    ("llama", "1b@64", "dgx8"),
    ("llama", "7b@64", "dgx8"),
    ("llama", "13b@64", "dgx8x2"),
    ("llama", "7b@512", "dgx8x8"),
    ("llama", "13b@256", "dgx8x8"),
    ("llama", "70b@256", "dgx8x8"),
    ("llama", "70b@256", "dgx8x2"),
    ("llama", "7b@512", "mixed8x8"),
    ("llama", "13b@256", "mixed8x8"),
    ("llama", "70b@256", "mixed8x8"),
    ("llama", "1b@64", "mixed", "fp16"),  # V100s have no bf16: the one-node mixed preset runs fp16
    ("llama", "7b@64", "mixed", "fp16"),
]
STRATEGIES = ("post", "post-start", "local", "random")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=2400, help="plans each strategy prices per row")
    parser.add_argument("--quick", action="store_true", help="the first two rows at 480 plans")
    parser.add_argument("--json", help="write the rows here")
    parser.add_argument("--rows", help="SIZE/CLUSTER,... of the rows to run (default all)")
    args = parser.parse_args()
    import torch
    from layered import _model_flops  # the sibling benchmark's PaLM count

    from postplace import compare_layered, zoo
    from postplace.cluster import load_cluster

    torch.set_num_threads(1)
    rows = ROWS[:2] if args.quick else ROWS
    if args.rows:
        rows = [r for r in ROWS if f"{r[1]}/{r[2]}" in args.rows.split(",")]
    samples = 480 if args.quick else args.samples
    out = []
    head = f"{'model':8s} {'cluster':7s} {'best-3d':58s} {'s':>8s}"
    head += "".join(f" {name:>10s}" for name in STRATEGIES) + f" {'MFU':>6s} {'new bests (post)':24s} {'wall s':>6s}"
    print(head)
    for model, size, cluster_name, *dtype in rows:
        precision = dtype[0] if dtype else "bf16"
        c = compare_layered(
            model,
            cluster_name,
            size=size,
            optimizer="adamw",
            precision=precision,
            strategies=STRATEGIES,
            samples=samples,
        )
        by = {r["strategy"]: r for r in c.rows}
        post = by["post"]
        answer = min(post["median_s"] or float("inf"), c.best_3d.step_time_s or float("inf"))
        cfg = zoo.spec(model).config(size)
        cluster = load_cluster(cluster_name)
        peaks = sum(d.peak_for(precision) for d in cluster.devices if d.kind == "gpu")
        mfu = _model_flops(cfg, cfg["batch"]) / (answer * peaks) if answer < float("inf") else None
        several = len({d.model for d in cluster.devices if d.kind == "gpu"}) > 1
        speed = speed_cut(model, size, cluster, c.bases, precision) if several else None
        grid_s = sum(v for k, v in c.timing.items() if k in ("trace_s", "measure_s", "grid_s"))
        wall = grid_s + post["wall_s"]
        out.append(
            dict(
                model=f"{model} {size}",
                precision=precision,
                cluster_name=cluster_name,
                **c.summary,
                mfu=mfu,
                place_wall_s=wall,
                speed_cut=speed,
            )
        )
        cells = "".join(f" {by[s]['over_best_3d'] or float('nan'):10.4f}" for s in STRATEGIES)
        bests = ", ".join(f"{k} {v}" for k, v in post["new_bests"].items()) or "none"
        print(
            f"{size:8s} {cluster_name + ('' if precision == 'bf16' else ' ' + precision):7s} {c.best_3d.words[:58]:58s} {c.best_3d.step_time_s or float('nan'):8.3f}"
            f"{cells} {(mfu or 0) * 100:5.1f}% {bests:24s} {wall:6.1f}"
            + (f" speed cut {_ratio(speed['step_time_s'], c.best_3d.step_time_s)} ({speed['plan']})" if speed else "")
        )
    print("(strategy columns: its own best over best-3d's step time; below 1 is faster)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1, default=str)


def _ratio(time_s, best_3d_s) -> str:
    return "none fits" if time_s is None else f"{time_s / best_3d_s:.4f}"


def speed_cut(model, size, cluster, bases, precision: str = "bf16") -> dict | None:
    """The grid's fastest 1F1B pipeline searched (a base of the searches) with its blocks cut in proportion to
    its stages' GPU speed, recomputing as the grid does: ``{"plan", "step_time_s"}`` of the fastest that fits
    (``step_time_s`` None and the cut's plan when none does)."""
    from dataclasses import replace

    import numpy as np

    from postplace.api.layered import traced_pair, zoo_blocks
    from postplace.placers.layered import estimate_plan, measured_rule
    from postplace.placers.layered_grid import fewest_recomputed
    from postplace.placers.layered_search import apportion
    from postplace.plans import parse_plan

    pipes = [(spec, b["microbatches"]) for b in bases if (spec := parse_plan(b["plan"])).one_chunk_pipeline]
    if not pipes:
        return None
    spec, m = pipes[0]
    spec = replace(spec, recompute=False, selective=False, recompute_units=None, selective_units=None)
    _, layers, batch = zoo_blocks(model, size)
    graph = traced_pair(model, size, batch, m, "adamw", None, precision, 3)
    gpus = [d for d, dev in enumerate(cluster.devices) if dev.kind == "gpu"]
    devices = gpus[: len(gpus) // spec.model_parallel * spec.model_parallel]
    tp, pp = spec.tensor or 1, spec.pipeline
    rule = {
        r: measured_rule(graph, cluster, gpus, r, tensor=tp, sequence=spec.sequence, layers=layers)
        for r in ("", "selective", "full")
    }
    per_stage = len(devices) // pp
    speeds = []
    for s in range(pp):
        block = rule[""].on(cluster.devices[devices[s * per_stage]].model)
        speeds.append(1.0 / float(block.forward_s[1] + block.backward_s[1]))
    spec = replace(spec, stage_blocks=tuple(int(x) for x in apportion(np.array(speeds), layers)))
    best = {"plan": str(spec), "step_time_s": None}
    for name, attempt in (
        ("", spec),
        ("selective", replace(spec, recompute=True, selective=True)),
        ("full", replace(spec, recompute=True)),
    ):
        r = estimate_plan(rule[name], cluster, attempt, devices)
        found = [r]
        if name == "full" and not r.oom:
            fewest, _ = fewest_recomputed(rule[""], rule["full"], cluster, attempt, devices, r.stage_units)
            found += [fewest] if fewest else []
        for x in found:
            if not x.oom and (best["step_time_s"] is None or x.step_time_s < best["step_time_s"]):
                best = {"plan": x.plan, "step_time_s": x.step_time_s}
    return best


if __name__ == "__main__":
    main()
