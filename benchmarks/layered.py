"""The layered estimate (:mod:`postplace.placers.layered`): held against the op-level simulation, then used where
the op level cannot go (LLaMA-7B, 13B and 70B on 64 H100 at a 1M-token batch).

``--validate``: LLaMA-1B (bf16, AdamW) on ``dgx8`` at a batch of 16 sequences in 16 micro-batches: per plan the
op-level simulation (the step traced at m = 16, rewritten and simulated op by op) beside the layered estimate
(the step traced as two micro-batches of 3 blocks, measured, its middle block repeated 16 times): step time, peak
memory per GPU, their ratios, the seconds each took. Pipelines are priced on the op level's own cut.
``--validate --mixed``: the same on ``mixed`` (4 A100 and 4 V100, the groups joined over PCIe; fp16, as V100s
have no bf16), the units measured on each GPU model, six plans.

``--validate --sizes``: micro-batches of a size per GPU model (``mbs=``) on ``mixed``, fp16, at a batch of 32
sequences in 8 micro-batches (one per replica): the op level traces the whole step at each size and joins them
(:func:`postplace.plans.sized_step`), the layered estimate measures each GPU model's units at its own size.

``--scale``: per row the practitioner's grid (every dp x tp x pp with tp in a node, zero1/fsdp, 1F1B or
interleaved, recomputation where a plan does not fit) and the plain plans (ddp, zero1, zero2, fsdp), all by the
layered estimate; the fastest that fits in the words to launch it with, MFU (PaLM's count: 6 N + 12 L H Q T per
token), peak memory, the plans priced, the seconds spent measuring units and pricing plans, plans per second
(the grid run a second time, warm: numba's first-call loading left out).

Run: ``OMP_NUM_THREADS=1 python benchmarks/layered.py --validate [--mixed | --sizes]`` (about 2 minutes on 2 cores);
``--scale`` (a few minutes). Every time is simulated.
"""

from __future__ import annotations

import argparse
import json
import time

VALIDATE = [
    "ddp:m=16",
    "zero1:m=16",
    "zero2:m=16",
    "fsdp:m=16",
    "fsdp+recompute:m=16",
    "ddp:tp=2,m=16",
    "fsdp:tp=2,m=16",
    "ddp:pp=2,m=16,schedule=gpipe",
    "zero1:pp=2,m=16",
    "zero1:pp=2,m=16,schedule=interleaved-2",
    "zero1+recompute:pp=4,m=16",
    "zero1:tp=2,pp=2,m=16",
    "ddp:tp=2,sp,m=16",
    "fsdp:tp=2,sp,m=16",
    "zero1:tp=2,sp,pp=2,m=16",
    "fsdp:m=16,recompute=" + "/".join(f"blocks.{k}" for k in range(8)),  # Megatron-LM's recompute-num-layers 8
    "zero1:pp=2,m=16,recompute=" + "/".join(f"blocks.{k}" for k in (0, 1, 2, 3, 10, 11, 12)),
    "fsdp+selective:m=16",
    "fsdp:m=16,recompute=blocks.0-5,selective=blocks.6-11",
    "ddp:m=16,shard=root",  # per-unit hybrids: FSDP for the units named, DDP for the rest
    "fsdp:m=16,shard=root/blocks.0-7",
    "fsdp+recompute:m=16,shard=blocks.8-15",
]
VALIDATE_MIXED = [
    "ddp:m=16",
    "fsdp:m=16",
    "zero1:pp=2,m=16",
    "ddp:pp=2,m=16,schedule=gpipe",
    "zero1:pp=2,m=16,stages=6/10",
    "ddp:tp=2,pp=2,m=16",
    "ddp:tp=2,sp,pp=2,m=16",
]
A100, V100 = "A100-40GB", "V100-16GB"
VALIDATE_SIZES = [
    "ddp:m=8",
    f"ddp:m=8,mbs={A100}:5/{V100}:3",
    f"ddp:m=8,mbs={A100}:6/{V100}:2",
    f"fsdp:m=8,mbs={A100}:5/{V100}:3",
    f"fsdp:m=8,mbs={A100}:6/{V100}:2",
    f"fsdp+recompute:m=8,mbs={A100}:7/{V100}:1",
    f"zero1:m=8,mbs={A100}:6/{V100}:2",
]
SCALE = [  # (size, global batch in sequences, cluster): 1M tokens (7B: 512 x 2048; 13B and 70B: 256 x 4096)
    ("7b", 512, "dgx8x8"),
    ("13b", 256, "dgx8x8"),
    ("70b", 256, "dgx8x8"),
    ("70b", 256, "dgx8x2"),
]
TRACED_BLOCKS = 3


def validate(preset: str = "dgx8", precision: str = "bf16", plans=VALIDATE) -> list[dict]:
    from postplace import zoo
    from postplace.cluster import load_cluster
    from postplace.placers.layered import estimate_plan, measured_rule, op_level_cut, plan_costs
    from postplace.placers.practitioner import plan_devices, plan_step
    from postplace.plans import parse_plan

    cluster = load_cluster(preset)
    t0 = time.perf_counter()
    whole = zoo.trace_model("llama", "1b@16", "adamw", precision=precision, microbatches=16, init=False).graph
    trace_op = time.perf_counter() - t0
    t0 = time.perf_counter()
    few = zoo.trace_model(
        "llama", "1b@2", "adamw", precision=precision, microbatches=2, init=False, layers=TRACED_BLOCKS
    ).graph
    trace_layered = time.perf_counter() - t0
    print(
        f"{preset}, {precision}: traced m=16, 16 blocks, {whole.num_ops} ops in {trace_op:.1f} s; m=2, 3 blocks, "
        f"{few.num_ops} ops in {trace_layered:.1f} s"
    )
    print(
        f"{'plan':44s} {'op ms':>8s} {'op GiB':>7s} {'lay ms':>8s} {'lay GiB':>8s} {'t ratio':>8s} {'mem ratio':>9s} {'op s':>6s} {'lay s':>6s}"
    )
    costs, rows = {}, []
    gpus = [d for d, dev in enumerate(cluster.devices) if dev.kind == "gpu"]
    for text in plans:
        spec = parse_plan(text)
        devices = plan_devices(cluster, spec)
        t0 = time.perf_counter()

        def measured(recompute, selective=False, tp=spec.tensor or 1, sp=spec.sequence):
            rule = "selective" if selective else "full" if recompute else ""
            if (tp, sp, rule) not in costs:  # on each GPU model of the cluster
                costs[tp, sp, rule] = measured_rule(few, cluster, gpus, rule, tensor=tp, sequence=sp, layers=16)
            return costs[tp, sp, rule]

        unit_costs = plan_costs(spec, measured)
        cut = op_level_cut(whole, cluster, spec, devices, unit_costs.names) if spec.pipeline else None
        est = estimate_plan(unit_costs, cluster, spec, devices, cut=cut)
        lay_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        ref = plan_step(whole, cluster, spec, devices)
        op_s = time.perf_counter() - t0
        peak = float(ref.peak_memory_bytes.max())
        row = dict(
            plan=text if len(text) < 60 else text[:44] + "...",
            op_ms=ref.step_time_s * 1e3,
            op_gib=peak / 2**30,
            layered_ms=est.step_time_s * 1e3,
            layered_gib=max(est.stage_peaks) / 2**30,  # the largest stage's, as the op level's largest GPU
            time_ratio=est.step_time_s / ref.step_time_s,
            memory_ratio=max(est.stage_peaks) / peak,
            op_s=op_s,
            layered_s=lay_s,
        )
        rows.append(row)
        print(
            f"{row['plan']:44s} {row['op_ms']:8.2f} {row['op_gib']:7.2f} {row['layered_ms']:8.2f} {row['layered_gib']:8.2f} "
            f"{row['time_ratio']:8.3f} {row['memory_ratio']:9.3f} {op_s:6.1f} {lay_s:6.2f}"
        )
    return rows


def validate_sizes(plans=VALIDATE_SIZES) -> list[dict]:
    """``--validate --sizes``: op level against layered, each GPU model at its own micro-batch size."""
    from postplace import zoo
    from postplace.cluster import load_cluster
    from postplace.placers.layered import estimate_plan, measured_sizes, plan_costs
    from postplace.placers.practitioner import plan_devices, plan_step, sized_graph
    from postplace.plans import parse_plan

    cluster = load_cluster("mixed")
    gpus = [d for d, dev in enumerate(cluster.devices) if dev.kind == "gpu"]
    whole, few = {}, {}

    def whole_at(n):  # the op level: the whole step as 8 micro-batches of n
        if n not in whole:
            whole[n] = zoo.trace_model("llama", f"1b@{8 * n}", "adamw", precision="fp16", microbatches=8, init=False)
        return whole[n].graph

    def few_at(n):  # the layered estimate: two micro-batches of n, 3 blocks
        if n not in few:
            few[n] = zoo.trace_model(
                "llama", f"1b@{2 * n}", "adamw", precision="fp16", microbatches=2, init=False, layers=TRACED_BLOCKS
            ).graph
        return few[n]

    print(f"{'plan':44s} {'op ms':>8s} {'op GiB':>7s} {'lay ms':>8s} {'lay GiB':>8s} {'t ratio':>8s} {'mem ratio':>9s}")
    rows = []
    for text in plans:
        spec = parse_plan(text)
        devices = plan_devices(cluster, spec)
        sizes = spec.micro_sizes or ((A100, 4), (V100, 4))
        unit_costs = plan_costs(
            spec,
            lambda recompute, selective=False, sizes=sizes: measured_sizes(
                few_at, cluster, gpus, "selective" if selective else "full" if recompute else "", sizes, layers=16
            ),
        )
        priced = spec if spec.micro_sizes else parse_plan(text + f",mbs={A100}:4/{V100}:4")
        est = estimate_plan(unit_costs, cluster, priced, devices)
        graph = sized_graph(whole_at, cluster, spec, devices) if spec.micro_sizes else whole_at(4)
        ref = plan_step(graph, cluster, spec, devices)
        peak = float(ref.peak_memory_bytes.max())
        row = dict(
            plan=text,
            op_ms=ref.step_time_s * 1e3,
            op_gib=peak / 2**30,
            op_oom=ref.oom,
            layered_ms=est.step_time_s * 1e3,
            layered_gib=max(est.gpu_peaks) / 2**30,
            layered_oom=est.oom,
            time_ratio=est.step_time_s / ref.step_time_s,
            memory_ratio=max(est.gpu_peaks) / peak,
        )
        rows.append(row)
        print(
            f"{text:44s} {row['op_ms']:8.2f} {row['op_gib']:7.2f} {row['layered_ms']:8.2f} {row['layered_gib']:8.2f} "
            f"{row['time_ratio']:8.3f} {row['memory_ratio']:9.3f}" + ("  OOM" * ref.oom) + (" (layered OOM)" * est.oom)
        )
    return rows


def _model_flops(cfg: dict, batch: int) -> float:
    """PaLM's count for a LLaMA step: 6 N + 12 L H Q T per token, N without the input embedding."""
    d, layers, ffn, heads, kv = cfg["d"], cfg["layers"], cfg["ffn"], cfg["heads"], cfg.get("kv_heads", cfg["heads"])
    per_block = d * d * (2 + 2 * kv / heads) + 3 * d * ffn + 2 * d
    n = layers * per_block + cfg["vocab"] * d + d
    tokens = batch * cfg["seq"]
    return tokens * (6 * n + 12 * layers * d * cfg["seq"])


def scale() -> list[dict]:
    from postplace import zoo
    from postplace.cluster import load_cluster
    from postplace.placers.layered_grid import layered_grid
    from postplace.placers.practitioner import plan_words

    rows = []
    print(
        f"{'model':10s} {'cluster':8s} {'m':>4s} {'best plan (layered)':70s} {'step s':>7s} {'MFU':>6s} {'GiB':>5s} {'plans':>5s} {'measure s':>9s} {'price s':>7s} {'plans/s':>7s} {'wall s':>6s}"
    )
    for size, batch, cluster_name in SCALE:
        t_start = time.perf_counter()
        cluster = load_cluster(cluster_name)
        gpus = [d for d, dev in enumerate(cluster.devices) if dev.kind == "gpu"]
        cfg = zoo.spec("llama").config(size)
        graph = zoo.trace_model(
            "llama", f"{size}@2", "adamw", precision="bf16", microbatches=2, init=False, layers=TRACED_BLOCKS
        ).graph
        grid = layered_grid(graph, cluster, gpus, batch, layers=cfg["layers"])
        wall = time.perf_counter() - t_start
        again = layered_grid(graph, cluster, gpus, batch, layers=cfg["layers"])  # warm: no first-call compiling
        best = grid.best
        peak = cluster.devices[gpus[0]].peak_for("bf16")
        mfu = _model_flops(cfg, batch) / (best.step_time_s * len(gpus) * peak) if best else None
        words = plan_words(best.plan, [cluster.device_names[g] for g in gpus], batch) if best else "none fits"
        row = dict(
            model=f"llama {size}@{batch}",
            cluster=cluster_name,
            microbatches=batch,
            best=best.plan if best else None,
            words=words,
            step_s=best.step_time_s if best else None,
            mfu=mfu,
            peak_gib=best.peak_bytes / 2**30 if best else None,
            plans=len(grid.tried),
            priced=grid.priced,
            fit=sum(not r.oom for r in grid.tried),
            measure_s=grid.measure_s,
            price_s=grid.price_s,
            plans_per_s=again.priced / max(again.price_s, 1e-9),
            wall_s=wall,
            tried=[(r.plan, r.step_time_s, r.peak_bytes, r.oom) for r in grid.tried],
            notes=grid.notes,
        )
        rows.append(row)
        print(
            f"{size:10s} {cluster_name:8s} {batch:4d} {words[:70]:70s} "
            f"{(best.step_time_s if best else float('nan')):7.2f} {(mfu or 0) * 100:5.1f}% "
            f"{(row['peak_gib'] or 0):5.1f} {row['plans']:5d} {grid.measure_s:9.1f} {grid.price_s:7.1f} "
            f"{row['plans_per_s']:7.1f} {wall:6.1f}"
        )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--validate", action="store_true", help="LLaMA-1B on dgx8: op level against layered")
    parser.add_argument("--scale", action="store_true", help="LLaMA-7B/13B/70B at 1M tokens on 64 and 16 H100")
    parser.add_argument("--mixed", action="store_true", help="with --validate: on mixed (A100 and V100), fp16")
    parser.add_argument("--sizes", action="store_true", help="with --validate: a micro-batch size per GPU model")
    parser.add_argument("--json", help="write the rows here")
    args = parser.parse_args()
    import torch

    torch.set_num_threads(1)
    out = {}
    if args.sizes:
        out["validate_sizes"] = validate_sizes()
    elif args.validate or not args.scale:
        out["validate"] = validate("mixed", "fp16", VALIDATE_MIXED) if args.mixed else validate()
    if args.scale:
        out["scale"] = scale()
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1, default=str)


if __name__ == "__main__":
    main()
