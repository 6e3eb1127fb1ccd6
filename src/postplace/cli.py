"""The ``postplace`` command. Each command is a thin shell over library functions.

A user-caused error (:class:`PostplaceError`) prints one line on stderr and exits with status 2; no
traceback is ever shown for it.
"""

from __future__ import annotations

import errno
import json
import os
import sys
import warnings
from pathlib import Path
from typing import Annotated

import numpy as np
import typer
from rich.console import Console
from rich.table import Table

from postplace.cluster import Cluster, load_cluster, preset_names
from postplace.cluster.from_workload import describe_machine, resolve_cluster, workload_machine
from postplace.cluster.placement import load_placement, single_device
from postplace.errors import PostplaceError
from postplace.graph import PHASES, OpGraph
from postplace.graph.dnn_partitioning import describe_backward

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    # plain help: typer's rich help, under the click releases this project allows (8.3 and later), shows
    # every flag as taking a value ("--help <bool>"), which it does not
    rich_markup_mode=None,
    help="Fast device placements for deep-learning training.",
)
console = Console(width=None if sys.stdout.isatty() else 140)

ClusterOpt = Annotated[
    str,
    typer.Option(
        "--cluster", "-c", help="Preset name, cluster .toml file, or workload:PRESET (the file's own machine)."
    ),
]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print one JSON object on stdout.")]
SizeOpt = Annotated[
    str,
    typer.Option(
        "--size", help="Zoo model size: full, small (llama: 1b, 7b, 3.1-8b, 13b, 70b); SIZE@N at a global batch of N."
    ),
]
BatchOpt = Annotated[
    int | None,
    typer.Option(
        "--batch", help="A zoo model's global batch (sequences or samples; default the size's own): --size SIZE@N."
    ),
]
OptimizerOpt = Annotated[
    str,
    typer.Option("--optimizer", help="The step's update: sgd (lr 0.1, momentum 0.9), adam or adamw (torch.optim's)."),
]
LrOpt = Annotated[
    float | None, typer.Option("--lr", help="The optimizer's learning rate (default: sgd 0.1, adam/adamw 1e-3).")
]
PrecisionOpt = Annotated[str, typer.Option("--precision", help="fp32, or bf16 / fp16 (autocast, fp32 master weights).")]


def _with_batch(size: str, batch: int | None) -> str:
    """``--size`` with ``--batch`` folded in: ``7b`` and 512 make ``7b@512``."""
    if batch is None:
        return size
    if "@" in size:
        raise PostplaceError(
            f"--batch {batch} with --size {size}: give the batch once (--size {size.partition('@')[0]} --batch {batch})"
        )
    from postplace.zoo import MAX_BATCH

    if not 1 <= batch <= MAX_BATCH:
        raise PostplaceError(f"--batch {batch}: give a global batch from 1 to {MAX_BATCH} (sequences or samples)")
    return f"{size}@{batch}"


def load_target(target: str, size: str = "full") -> OpGraph:
    """A graph from a file path (first) or a zoo model name."""
    from postplace.api import load_target as load

    return load(target, size=size).graph


def report_dir(out, target, cluster) -> str:
    from postplace.api.target import default_compare_out

    return str(out or default_compare_out(target, cluster))


def _gb(x: float) -> str:
    return f"{x / 1e9:.3f} GB"


def _ms(x: float) -> str:
    return "inf" if not np.isfinite(x) else f"{x * 1e3:.3f} ms"


@app.command()
def clusters(as_json: JsonOpt = False) -> None:
    """List the cluster presets."""
    rows = []
    for name in preset_names():
        c = load_cluster(name)
        rows.append(
            {
                "name": name,
                "devices": [
                    {"name": d.name, "kind": d.kind, "model": d.model, "memory_bytes": d.memory} for d in c.devices
                ],
                "description": c.description,
            }
        )
    if as_json:
        print(json.dumps(rows))
        return
    table = Table(title="cluster presets")
    for col in ("preset", "devices", "description"):
        table.add_column(col)
    for r in rows:
        devs = ", ".join(f"{d['name']} ({d['model']})" for d in r["devices"])
        table.add_row(r["name"], devs, r["description"])
    console.print(table)


@app.command()
def info(
    target: Annotated[str, typer.Argument(help="Graph file or zoo model name.")],
    cluster: ClusterOpt = "k80x4",
    size: SizeOpt = "full",
    as_json: JsonOpt = False,
) -> None:
    """Summarise a graph: size, work, memory, and its lower bound on a cluster."""
    from postplace.sim import Simulator

    graph = load_target(target, size)
    c = resolve_cluster(cluster, graph)
    sim = Simulator(graph, c)
    table = sim.problem.op_times.table
    per_kind = {}
    for kind in ("cpu", "gpu"):
        devs = [d for d, dev in enumerate(c.devices) if dev.kind == kind]
        if devs:
            col = table[:, devs[0]]
            per_kind[kind] = float(col[np.isfinite(col)].sum())
    phases = {p: int(np.sum(graph.phase == k)) for k, p in enumerate(PHASES)}
    out = {
        "graph": graph.name,
        "ops": graph.num_ops,
        "edges": graph.num_edges,
        "total_flops": float(graph.flops.sum()),
        "persistent_bytes": float(graph.persistent_bytes.sum()),
        "memory_mode": graph.memory_mode,
        "colocation_sets": len(graph.colocation_sets),
        "phases": phases,
        "cluster": c.name,
        "total_time_s": per_kind,
        "lower_bound_s": sim.lower_bound,
        "cost_sources": list(sim.sources),
        "backward_edges": graph.metadata.get("backward_edges"),
        "workload_machine": workload_machine(graph),
    }
    if as_json:
        print(json.dumps(out))
        return
    t = Table(title=f"{graph.name} on {c.name}", show_header=False)
    t.add_row("ops / edges", f"{graph.num_ops} / {graph.num_edges}")
    t.add_row("total FLOPs", f"{out['total_flops']:.4g}")
    t.add_row("persistent bytes", _gb(out["persistent_bytes"]) + f" (memory mode {graph.memory_mode})")
    t.add_row("colocation sets", str(out["colocation_sets"]))
    t.add_row("phases", ", ".join(f"{k} {v}" for k, v in phases.items() if v))
    for kind, v in per_kind.items():
        t.add_row(f"all ops on one {kind}", _ms(v))
    t.add_row("lower bound", _ms(sim.lower_bound))
    console.print(t)
    for line in sim.sources:
        console.print(f"  times: {line}", highlight=False)
    for line in filter(None, [describe_backward(graph.metadata), *describe_machine(graph, c)]):
        console.print(f"  {line}", highlight=False)


def parse_placement(spec: str, graph: OpGraph, cluster: Cluster) -> np.ndarray:
    """``single:DEVICE`` or a placement JSON file."""
    if spec.startswith("single:"):
        return single_device(graph, cluster, spec.split(":", 1)[1])
    return load_placement(spec, graph, cluster)


@app.command()
def simulate(
    target: Annotated[str, typer.Argument(help="Graph file or zoo model name.")],
    cluster: ClusterOpt,
    placement: Annotated[
        str | None, typer.Option("--placement", "-p", help="single:DEVICE or a placement JSON file.")
    ] = None,
    plan: Annotated[
        str | None,
        typer.Option(
            "--plan",
            help="A practitioner plan instead of a placement: ddp, zero1, zero2 or fsdp, optionally +recompute and :m=M,dp=K,tp=T,sp,pp=P (e.g. fsdp+recompute:m=8, ddp:tp=2,m=8; sp: sequence parallelism).",
        ),
    ] = None,
    trace: Annotated[Path | None, typer.Option("--trace", help="Write a Chrome trace-event JSON here.")] = None,
    size: SizeOpt = "full",
    batch: BatchOpt = None,
    as_json: JsonOpt = False,
    microbatches: Annotated[
        int | None,
        typer.Option(
            "--microbatches",
            help="A zoo model's step as M micro-batches (default: the m a placement file's op names imply, else 1).",
        ),
    ] = None,
    microbatch_colocation: Annotated[str, typer.Option("--microbatch-colocation", help="none or module.")] = "none",
    optimizer: OptimizerOpt = "sgd",
    precision: PrecisionOpt = "fp32",
    pin: Annotated[
        list[str] | None,
        typer.Option("--pin", help="REGEX=DEVICE: with --plan, a pin the plan must keep (repeatable)."),
    ] = None,
    exclude: Annotated[
        list[str] | None, typer.Option("--exclude", help="With --plan, a GPU the plan may not use (repeatable).")
    ] = None,
    kernels: Annotated[
        str,
        typer.Option(
            "--kernels",
            help="Rates a GPU estimate uses: achieved (what kernels reach, where the GPU model has published rates) or datasheet (the plain roofline).",
        ),
    ] = "achieved",
    update: Annotated[
        str,
        typer.Option(
            "--update",
            help="The optimizer form a GPU runs the update in: foreach (torch.optim's CUDA default), fused or traced.",
        ),
    ] = "foreach",
    layered: Annotated[
        bool,
        typer.Option(
            "--layered",
            help="With --plan on a zoo transformer: price it by the layered estimate (3 blocks measured op by op, "
            "repeated to the model's depth; one replica's pipeline), for steps too big for the op level (70B on 64 GPUs).",
        ),
    ] = False,
) -> None:
    """Simulate one training step of a placement, or of a named plan: step time, memory, transfers, MFU."""
    from postplace.api import load_target as load
    from postplace.cost import RooflineCostModel
    from postplace.cost.utilisation import utilisation
    from postplace.sim import Simulator

    cost_model = RooflineCostModel(kernels=kernels, update=update)
    size = _with_batch(size, batch)
    if (placement is None) == (plan is None):
        raise PostplaceError(
            "simulate needs exactly one of --placement (single:DEVICE or a file) and --plan (ddp, zero2, fsdp, ...)"
        )
    if layered and (plan is None or pin or trace is not None):
        raise PostplaceError(
            "--layered prices a --plan (no --placement, --pin or --trace: it runs no op-level schedule); "
            "drop --layered for those"
        )
    if plan is not None:
        if microbatches is not None:
            raise PostplaceError(
                f"--microbatches with --plan: write the count into the plan ('{plan}:m={microbatches}')"
            )
        if layered:
            _simulate_layered(target, cluster, plan, size, optimizer, precision, exclude or [], as_json, cost_model)
            return
        _simulate_plan(
            target,
            cluster,
            plan,
            size,
            optimizer,
            precision,
            pin or [],
            exclude or [],
            microbatch_colocation,
            trace,
            as_json,
            cost_model,
        )
        return
    if microbatches is not None and microbatches < 1:
        raise PostplaceError(f"--microbatches {microbatches}: give a count (1, 2, 4...) that divides the batch")
    m = microbatches
    if m is None and Path(placement).is_file() and not Path(target).exists():
        from postplace.graph.microbatch_names import placement_microbatches
        from postplace.validate import read_json

        names = read_json(placement)
        m = placement_microbatches(names) if isinstance(names, dict) else 1
    graph = load(
        target,
        size=size,
        microbatches=m or 1,
        microbatch_colocation=microbatch_colocation,
        optimizer=optimizer,
        precision=precision,
    ).graph
    if not graph.num_ops:  # a step of no op has no time: the ratio to its lower bound of 0 is undefined
        raise PostplaceError(
            f"{target}: graph '{graph.name}' has no op, so there is nothing to simulate; give a graph "
            "with at least one op"
        )
    c = resolve_cluster(cluster, graph)
    dev = parse_placement(placement, graph, c)
    from postplace.cost import priced_on

    cost_model = priced_on(cost_model, c, np.asarray(dev).tolist())  # a precision unused GPUs lack is no error
    sim = Simulator(graph, c, cost_model=cost_model)
    sched = sim.schedule(dev)
    oom_devices = [c.device_names[d] for d in range(c.num_devices) if sched.peak_memory[d] > c.capacity[d]]
    use = utilisation(graph, c, dev, sched.step_time)
    out = {
        "graph": graph.name,
        "cluster": c.name,
        "placement": placement,
        "evaluator": sim.name,
        "step_time_s": sched.step_time,
        "lower_bound_s": sim.lower_bound,
        "ratio_to_lower_bound": sched.step_time / sim.lower_bound if sim.lower_bound > 0 else None,
        "oom": bool(oom_devices),
        "oom_devices": oom_devices,
        "peak_memory_bytes": dict(zip(c.device_names, sched.peak_memory.tolist(), strict=True)),
        "capacity_bytes": dict(zip(c.device_names, c.capacity.tolist(), strict=True)),
        "busy_s": dict(zip(c.device_names, sched.busy.tolist(), strict=True)),
        "bytes_moved": float(sched.bytes_moved),
        "transfers": len(sched.transfers),
        "cost_model": cost_model.describe(c),
        "cost_sources": list(sim.sources),
        **(use.to_dict() if use else {}),
    }
    if trace is not None:
        sched.save_chrome_trace(trace)
        out["trace"] = str(trace)
    if as_json:
        print(json.dumps(out))
        return
    t = Table(title=f"{graph.name} on {c.name}, placement {placement} (simulated)")
    for col in ("device", "ops", "busy", "peak memory", "capacity", ""):
        t.add_column(col)
    counts = np.bincount(dev, minlength=c.num_devices)
    for d, name in enumerate(c.device_names):
        flag = "OOM" if name in oom_devices else ""
        t.add_row(name, str(counts[d]), _ms(sched.busy[d]), _gb(sched.peak_memory[d]), _gb(c.capacity[d]), flag)
    console.print(t)
    console.print(
        f"simulated step time {_ms(sched.step_time)}  lower bound {_ms(sim.lower_bound)}  "
        f"ratio {out['ratio_to_lower_bound']:.3f}  moved {_gb(out['bytes_moved'])} in {len(sched.transfers)} transfers"
        + ("  [OOM: this placement does not fit]" if oom_devices else ""),
        highlight=False,
    )
    console.print(_utilisation_line(use, cost_model, c), highlight=False)
    if trace is not None:
        console.print(f"trace written to {trace} (open in https://ui.perfetto.dev)", highlight=False)


def _utilisation_line(use, cost_model, cluster) -> str:
    """``MFU 33.7%, 5,762 tokens/s per device (priced by ...)``."""
    words = f"MFU {use.mfu:.1%}" if use else "MFU -"
    if use and use.tokens_per_s_per_device:
        words += f", {use.tokens_per_s_per_device:,.0f} tokens/s per device"
    return f"{words}  (priced by the {cost_model.describe(cluster)})"


def _simulate_plan(
    target, cluster, plan, size, optimizer, precision, pins, exclude, colocation, trace, as_json, cost_model
):
    from postplace.api.plans import simulate_plan
    from postplace.cost.utilisation import utilisation

    r = simulate_plan(
        target,
        cluster,
        plan,
        size=size,
        optimizer=optimizer,
        precision=precision,
        pins=pins,
        exclude=exclude,
        microbatch_colocation=colocation,
        cost_model=cost_model,
    )
    c = r.cluster
    use = utilisation(r.graph, c, r.placement, r.step_time_s)
    out = {
        "graph": r.graph.name,
        "cluster": c.name,
        "plan": r.plan,
        "plan_words": r.describe(),
        "microbatches": r.microbatches,
        "evaluator": r.evaluator,
        "step_time_s": r.step_time_s,
        "oom": r.oom,
        "oom_devices": r.oom_devices,
        "peak_memory_bytes": dict(zip(c.device_names, r.peak_memory_bytes.tolist(), strict=True)),
        "capacity_bytes": dict(zip(c.device_names, c.capacity.tolist(), strict=True)),
        "bytes_moved": r.bytes_moved,
        "collective_bytes": r.collective_bytes,
        "cost_model": cost_model.describe(c),
        **(use.to_dict() if use else {}),
    }
    if trace is not None:
        from postplace.sim import Simulator

        Simulator(r.graph, c, cost_model=cost_model).schedule(r.placement).save_chrome_trace(trace)
        out["trace"] = str(trace)
    if as_json:
        print(json.dumps(out))
        return
    t = Table(title=f"{r.graph.name} on {c.name}, plan {r.plan} (simulated)")
    for col in ("device", "peak memory", "capacity", ""):
        t.add_column(col)
    for d, name in enumerate(c.device_names):
        if r.peak_memory_bytes[d] > 0:
            flag = "OOM" if name in r.oom_devices else ""
            t.add_row(name, _gb(r.peak_memory_bytes[d]), _gb(c.capacity[d]), flag)
    console.print(t)
    wire = ", ".join(f"{k.replace('_', '-')} {_gb(v)}" for k, v in r.collective_bytes.items())
    console.print(f"plan: {r.describe()}", highlight=False)
    console.print(
        f"simulated step time {_ms(r.step_time_s)}  moved {_gb(r.bytes_moved)}"
        + (f" (collectives: {wire})" if wire else "")
        + ("  [OOM: this plan does not fit]" if r.oom else ""),
        highlight=False,
    )
    console.print(_utilisation_line(use, cost_model, c), highlight=False)
    if trace is not None:
        console.print(f"trace written to {trace} (open in https://ui.perfetto.dev)", highlight=False)


def _simulate_layered(target, cluster, plan, size, optimizer, precision, exclude, as_json, cost_model):
    from postplace.api.plans import estimate_plan_layered, plan_words
    from postplace.plans import parse_plan

    r, c, devices = estimate_plan_layered(
        target,
        cluster,
        plan,
        size=size,
        optimizer=optimizer,
        precision=precision,
        exclude=exclude,
        cost_model=cost_model,
    )
    names = [c.device_names[d] for d in devices]
    spec = parse_plan(r.plan)
    peaks = dict(zip(names, r.gpu_peaks, strict=True))
    out = {
        "model": f"{target} {size}",
        "cluster": c.name,
        "plan": r.plan,
        "plan_words": plan_words(r.plan, names, spec.microbatches),
        "microbatches": spec.microbatches,
        "evaluator": "layered estimate (units measured on a few blocks, repeated; one replica's pipeline)",
        "step_time_s": r.step_time_s,
        "oom": r.oom,
        "peak_memory_bytes": peaks,
        "capacity_bytes": {n: float(c.capacity[d]) for n, d in zip(names, devices, strict=True)},
        "stages": [list(u) for u in r.stage_units],
        "cost_model": cost_model.describe(c),
    }
    if as_json:
        print(json.dumps(out))
        return
    console.print(f"plan: {out['plan_words']}", highlight=False)
    console.print(
        f"estimated step time {_ms(r.step_time_s)} (layered estimate, simulated prices), "
        f"peak {_gb(r.peak_bytes)} per GPU (stage {r.peak_stage})"
        + ("  [OOM: this plan does not fit]" if r.oom else ""),
        highlight=False,
    )


@app.command()
def models() -> None:
    """List the zoo models with their configs and the sources of their figures."""
    from postplace.zoo.cli import cmd_models

    console.print(cmd_models(), highlight=False)


@app.command()
def graph(
    name: Annotated[str, typer.Argument(help="Zoo model name (see `postplace models`).")],
    out: Annotated[Path | None, typer.Option("--out", "-o", help="Write the graph file here.")] = None,
    size: SizeOpt = "full",
    optimizer: OptimizerOpt = "sgd",
    microbatches: Annotated[
        int, typer.Option("--microbatches", "-m", help="Trace the step as m micro-batches (gradient accumulation).")
    ] = 1,
    microbatch_colocation: Annotated[
        str,
        typer.Option(
            "--microbatch-colocation", help="none (a layer's micro-batches may go apart) or module (kept together)."
        ),
    ] = "none",
    lr: LrOpt = None,
    precision: PrecisionOpt = "fp32",
) -> None:
    """Trace a zoo model's training step into a graph file (cached after the first time)."""
    from postplace.zoo.cli import cmd_graph

    console.print(
        cmd_graph(
            name,
            size,
            out,
            optimizer,
            microbatches=microbatches,
            colocation=microbatch_colocation,
            lr=lr,
            precision=precision,
        ),
        highlight=False,
    )


@app.command()
def profile(
    target: Annotated[str, typer.Argument(help="Zoo model name or a traced zoo graph file.")],
    size: SizeOpt = "full",
    runs: Annotated[int, typer.Option("--runs", help="Timed runs per op (the median is kept).")] = 5,
    out: Annotated[Path | None, typer.Option("--out", "-o", help="Write the measured graph here.")] = None,
) -> None:
    """Run the traced step on this CPU, store per-op medians, compare them with the roofline."""
    from postplace.zoo.cli import cmd_profile

    console.print(cmd_profile(target, size=size, runs=runs, out=out), highlight=False)


@app.command()
def compare(
    ctx: typer.Context,
    target: Annotated[str, typer.Argument(help="Graph file or zoo model name.")],
    cluster: ClusterOpt = "k80x4",
    strategies: Annotated[
        str,
        typer.Option(
            "--strategies",
            help="Comma-separated names, or 'all' (every placer; random, anneal, hp, reinforce, ce, ppo, post-start, local, post). Named starts: post-paper, ce-paper, ppo-paper, reinforce-paper (the paper's uniform start); post-probe, ce-probe, ppo-probe, reinforce-probe, hp-probe (Post's probe start, no local moves); reinforce-local, hp-local (that start with local moves).",
        ),
    ] = "all",
    budget: Annotated[int, typer.Option("--budget", "-b", help="Samples per search run.")] = 2400,
    seeds: Annotated[int, typer.Option("--seeds", help="Seeds per search strategy.")] = 3,
    out: Annotated[Path | None, typer.Option("--out", "-o", help="Folder for compare.json/csv and every run.")] = None,
    expert_split: Annotated[
        str | None, typer.Option("--expert-split", help="A dnn-partitioning split file for 'expert'.")
    ] = None,
    size: SizeOpt = "full",
    batch: BatchOpt = None,
    as_json: JsonOpt = False,
    no_report: Annotated[bool, typer.Option("--no-report", help="Do not write the HTML report.")] = False,
    microbatches: Annotated[
        str,
        typer.Option(
            "--microbatches",
            help="Compare on a zoo model's step traced as M micro-batches (default 1, the paper's setting; with --layered: 1 and 2 sequences per micro-batch).",
        ),
    ] = "1",
    optimizer: OptimizerOpt = "sgd",
    lr: LrOpt = None,
    precision: PrecisionOpt = "fp32",
    layered: Annotated[
        bool,
        typer.Option(
            "--layered",
            help="A zoo transformer at scale: each strategy's own best over the per-block choices of place --layered, priced by the layered estimate (default strategies post, post-start, local, random).",
        ),
    ] = False,
) -> None:
    """Every baseline and strategy on one graph, through the same simulator; resumable."""
    import postplace.api as api

    if layered:
        _compare_layered(ctx, target, cluster, strategies, budget, seeds, out, size, batch, as_json)
        return

    def progress(name: str) -> None:
        if not as_json:
            console.print(f"  running {name}...", highlight=False)

    try:
        size = _with_batch(size, batch)
        m = _microbatches(microbatches)
        if m == "auto":
            raise PostplaceError("compare --microbatches auto: compare runs one m; give a count (place weighs every m)")
        report = api.compare(
            target,
            cluster,
            strategies=strategies,
            budget=budget,
            seeds=seeds,
            out=out,
            expert_split=expert_split,
            size=size,
            progress=progress,
            microbatches=m,
            step=api.Step(optimizer=optimizer, lr=lr, precision=precision),
        )
    except KeyboardInterrupt:
        print(f"interrupted: rerun the same command to resume from {report_dir(out, target, cluster)}", file=sys.stderr)
        sys.exit(130)
    out = Path(report["out"])
    graph_name, c_name = report["graph"], report["cluster"]
    _report_line(report["out"], target, cluster, size=size, skip=no_report)
    if as_json:
        print(json.dumps({k: v for k, v in report.items()}))
        return
    t = Table(title=f"{graph_name} on {c_name}: {budget} samples x {seeds} seeds per search ({report['evaluator']})")
    for col in (
        "strategy",
        "best ms",
        "range ms",
        "/single",
        "/LB",
        "MFU",
        "peak GB",
        "OOM",
        "wall s",
        "start ms",
        "note",
    ):
        t.add_column(col, no_wrap=col != "note")
    for r in report["rows"]:
        start = (
            ""
            if r.get("start_name") is None
            else r["start_name"]
            + ("" if r.get("start_step_time_s") is None else f" {r['start_step_time_s'] * 1e3:.2f}")
        )
        best = r["best_step_time_s"]
        rng_ = (
            ""
            if r["kind"] != "search" or best is None
            else f"{r['min_step_time_s'] * 1e3:.2f}-{r['max_step_time_s'] * 1e3:.2f}"
        )
        name = r["strategy"] + (" *" if r["kind"].startswith("data-parallel") else "")
        t.add_row(
            name,
            "-" if best is None else f"{best * 1e3:.2f}",
            rng_,
            "-" if r["ratio_to_single"] is None else f"{r['ratio_to_single']:.3f}",
            "-" if r["ratio_to_lower_bound"] is None else f"{r['ratio_to_lower_bound']:.3f}",
            _percent(r.get("mfu")),
            "-" if r["peak_memory_bytes"] is None else f"{r['peak_memory_bytes'] / 1e9:.2f}",
            str(r["oom_count"]),
            _seconds(r["wall_time_s"]),
            start,
            r["note"],
        )
    console.print(t)
    single = report["single_device_step_time_s"]
    if report.get("cost_model"):
        console.print(
            f"priced by the {report['cost_model']}; MFU: model FLOPs over the peaks of the devices each row uses",
            highlight=False,
        )
    err = report.get("cost_model_error")
    timed = [r for r in report["rows"] if r["best_step_time_s"] is not None]
    if timed and err:
        top = min(timed, key=lambda r: r["best_step_time_s"])
        close = [
            r["strategy"]
            for r in timed
            if r is not top and r["best_step_time_s"] <= top["best_step_time_s"] * (1 + err)
        ]
        if close:
            console.print(
                f"within the cost model's error of the fastest row, {top['strategy']} "
                f"({err:.0%}: how far it was off a published run): {', '.join(close)}; the "
                "model cannot rank these apart from it",
                highlight=False,
            )
    console.print(
        f"best single device {_ms(single) if single else 'none fits'}, lower bound {_ms(report['lower_bound_s'])}; "
        "* data parallelism: micro-batch k on GPU k (simulated where the model can be traced again, else an analytic estimate)",
        highlight=False,
    )
    drawn = not no_report and (out / "report.html").is_file()
    console.print(f"wrote {out}/compare.json, compare.csv" + (f", {_REPORT_FILES}" if drawn else ""), highlight=False)


@app.command()
def train(
    model: Annotated[
        str, typer.Argument(help="Zoo model name, or a run folder of `place` (its model and placement.json).")
    ],
    placement: Annotated[
        str | None,
        typer.Option("--placement", "-p", help="Placement JSON file (or single:DEVICE); none for a run folder."),
    ] = None,
    steps: Annotated[int, typer.Option("--steps", "-n", help="Training steps to run and time.")] = 10,
    size: Annotated[
        str | None,
        typer.Option(
            "--size",
            help="Zoo model size: full, small (llama: 1b, 7b, 3.1-8b, 13b, 70b) (default: the size the placement's run was made for, else full, as every command).",
        ),
    ] = None,
    cluster: Annotated[
        str | None, typer.Option("--cluster", "-c", help="Cluster whose device names the placement uses.")
    ] = None,
    map_all_to: Annotated[
        str | None, typer.Option("--map-all-to", help="Run every device on this torch device (e.g. cpu).")
    ] = None,
    device: Annotated[
        list[str] | None, typer.Option("--device", help="NAME=TORCH_DEVICE, e.g. gpu0=cuda:1 (repeatable).")
    ] = None,
    optimizer: Annotated[
        str | None,
        typer.Option("--optimizer", help="sgd, adam or adamw (default: as the placement's run recorded, else sgd)."),
    ] = None,
    lr: LrOpt = None,
    precision: Annotated[
        str | None,
        typer.Option("--precision", help="fp32, bf16 or fp16 (default: as the placement's run recorded, else fp32)."),
    ] = None,
    threads: Annotated[int | None, typer.Option("--threads", help="torch CPU threads.")] = None,
    microbatches: Annotated[
        int | None,
        typer.Option(
            "--microbatches",
            "-m",
            help="Run the step as m micro-batches (default: the m the placement file was made for).",
        ),
    ] = None,
    microbatch_colocation: Annotated[
        str, typer.Option("--microbatch-colocation", help="none or module (as for `graph`).")
    ] = "none",
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object: the losses and step times.")] = False,
) -> None:
    """Train a zoo model (random data) under a placement and print each step's measured time."""
    from postplace.runtime.cli import cmd_train

    text = cmd_train(
        model,
        placement,
        steps,
        size=size,
        cluster=cluster,
        map_all_to=map_all_to,
        device_map=device or (),
        optimizer=optimizer,
        threads=threads,
        lr=lr,
        precision=precision,
        microbatches=microbatches,
        colocation=microbatch_colocation,
        as_json=as_json,
    )
    print(text) if as_json else console.print(text, highlight=False)


@app.command()
def launch(
    run_folder: Annotated[str, typer.Argument(help="A run folder of `place` (placement.json of a zoo model).")],
    steps: Annotated[int, typer.Option("--steps", "-n", help="Training steps.")] = 3,
    as_json: JsonOpt = False,
    timeout: Annotated[
        float, typer.Option("--timeout", help="Seconds a rank waits for a peer before it fails.")
    ] = 60.0,
    seed: Annotated[int, typer.Option("--seed", help="Seeds the batches and torch's generator on every rank.")] = 0,
    backend: Annotated[
        str, typer.Option("--backend", help="gloo (every rank a CPU process) or nccl (ranks on their GPUs).")
    ] = "gloo",
    threads: Annotated[int, typer.Option("--threads", help="torch CPU threads per rank.")] = 1,
    checkpoint: Annotated[
        Path | None,
        typer.Option("--checkpoint", help="Folder where every rank writes its state after each step."),
    ] = None,
    resume: Annotated[
        bool, typer.Option("--resume", help="Start from the last step every rank recorded in --checkpoint.")
    ] = False,
) -> None:
    """Run a run folder's placement as one process per device (torch.distributed, torchrun's launcher)."""
    from postplace.runtime.cli import cmd_launch

    if resume and checkpoint is None:
        raise PostplaceError(
            "--resume continues from the ranks' checkpoints: give --checkpoint DIR (the folder the first launch wrote)"
        )
    text = cmd_launch(
        run_folder,
        steps,
        as_json=as_json,
        seed=seed,
        timeout=timeout,
        backend=backend,
        threads=threads,
        checkpoint=checkpoint,
        resume=resume,
    )
    print(text) if as_json else console.print(text, highlight=False)


@app.command()
def calibrate(
    model: Annotated[str, typer.Argument(help="Zoo model name.")],
    size: SizeOpt = "full",
    out: Annotated[
        Path | None,
        typer.Option(
            "--out", "-o", help="Folder for measured.toml and graph.json (default runs/calibrate-MODEL-SIZE)."
        ),
    ] = None,
    cluster_out: Annotated[
        Path | None,
        typer.Option("--cluster-out", help="Write the measured cluster TOML here instead (default OUT/measured.toml)."),
    ] = None,
    graph_out: Annotated[
        Path | None, typer.Option("--graph-out", help="Write the measured graph here instead (default OUT/graph.json).")
    ] = None,
    batches: Annotated[str | None, typer.Option("--batches", help="Batch sizes to calibrate on, e.g. 2,8.")] = None,
    score_on: Annotated[
        list[str] | None, typer.Option("--score-on", help="Zoo models to score on (repeatable).")
    ] = None,
    runs: Annotated[int, typer.Option("--runs", help="Timed runs per measurement.")] = 3,
    threads: Annotated[int | None, typer.Option("--threads", help="torch CPU threads.")] = 1,
) -> None:
    """Measure op and transfer times on the devices here, write them out, report simulator fidelity."""
    from postplace.runtime.cli import cmd_calibrate

    batch_list = None
    if batches:
        try:
            batch_list = [int(b) for b in batches.split(",")]
        except ValueError:
            raise PostplaceError(f"--batches '{batches}': give comma-separated integers, e.g. 2,8") from None
    console.print(
        cmd_calibrate(
            model,
            size,
            out=out,
            out_cluster=cluster_out,
            out_graph=graph_out,
            batches=batch_list,
            score_on=score_on or (),
            runs=runs,
            threads=threads,
        ),
        highlight=False,
    )


PLACE_FLAGS = {  # CLI parameter -> run.json setting, for --resume's check that nothing else changed
    "target": "target",
    "cluster": "cluster",
    "strategy": "strategy",
    "seed": "seed",
    "groups": "groups",
    "pin": "pins",
    "exclude": "exclude",
    "warm_start": "warm_start",
    "evaluator": "evaluator",
    "map_all_to": "map_all_to",
    "size": "size",
}


@app.command()
def report(
    run_dir: Annotated[Path, typer.Argument(help="A place, compare or paper folder.")],
    out: Annotated[
        Path | None,
        typer.Option(
            "--out",
            "-o",
            help="The HTML file (default RUN_DIR/report.html, its files beside it); NAME.html elsewhere keeps its figures, report.json and trace.json in NAME_files/.",
        ),
    ] = None,
    graph_target: Annotated[
        str | None, typer.Option("--graph", help="The run's graph file or zoo model, if not recorded.")
    ] = None,
    cluster: Annotated[
        str | None,
        typer.Option("--cluster", "-c", help="The run's cluster (default: the preset or file the run recorded)."),
    ] = None,
    size: Annotated[
        str | None,
        typer.Option("--size", help="Zoo model size: full, small (llama: 1b, 7b, 3.1-8b, 13b, 70b), if not recorded."),
    ] = None,
) -> None:
    """Draw a run folder: learning curves, step times, schedule, memory, placement map (HTML + PNG)."""
    from postplace.report import files_folder, write_report

    path = write_report(run_dir, out, graph=graph_target, cluster=cluster, size=size)
    files = files_folder(run_dir, path)
    where = "beside it" if files == path.parent else f"in {files}"
    console.print(f"wrote {path} (figures, report.json and trace.json {where})", highlight=False)


@app.command()
def paper(
    quick: Annotated[bool, typer.Option("--quick", help="Small models, 240 samples, one seed: minutes.")] = False,
    out: Annotated[
        Path | None, typer.Option("--out", "-o", help="Folder (default runs/paper or runs/paper-quick).")
    ] = None,
    seeds: Annotated[
        int | None, typer.Option("--seeds", help="Seeds per search strategy (default 3, quick 1).")
    ] = None,
    hp_seeds: Annotated[
        int | None, typer.Option("--hp-seeds", help="Seeds of the planner hp (default: --seeds).")
    ] = None,
    no_report: Annotated[bool, typer.Option("--no-report", help="Skip the HTML report.")] = False,
    collect: Annotated[bool, typer.Option("--collect", help="Search nothing: table the finished runs.")] = False,
    strategies: Annotated[
        str | None,
        typer.Option(
            "--strategies",
            help="Comma-separated names, as compare takes them (default: the placers, random, anneal and the three tables' strategies: post-paper, ce-paper, ppo-paper, reinforce-paper, hp from the paper's uniform start; post-probe, post-start, ce-probe, ppo-probe, reinforce-probe, hp-probe from Post's probe start without local moves; post, local, ce, ppo, reinforce-local, hp-local from it with local moves).",
        ),
    ] = None,
) -> None:
    """The Post paper's comparison on the zoo (5 models x k80x2/k80x4, every rival from the paper's start and from Post's); resumable."""
    from dataclasses import replace

    from postplace.comparison import parse_strategies
    from postplace.paper import PaperConfig, format_table, run_paper

    config = PaperConfig.quick() if quick else PaperConfig()
    if strategies is not None:
        config = replace(config, strategies=tuple(parse_strategies(strategies)))
    if seeds is not None:
        if seeds < 1:
            raise PostplaceError("--seeds must be positive")
        config = replace(config, seeds=seeds)
    if hp_seeds is not None:
        if hp_seeds < 1:
            raise PostplaceError("--hp-seeds must be positive")
        config = replace(config, hp_seeds=hp_seeds)
    out = out or Path("runs") / ("paper-quick" if quick else "paper")
    with _experiment_progress() as progress:
        try:
            data = run_paper(out, config, progress=progress, collect=collect)
        except KeyboardInterrupt:
            print(f"interrupted: rerun the same command to resume from {out}", file=sys.stderr)
            sys.exit(130)
    console.print(format_table(data), highlight=False)
    console.print(f"wrote {out}/paper.json and paper.md", highlight=False)
    if not no_report:
        from postplace.report import write_report

        console.print(f"wrote {write_report(out)}", highlight=False)


def _report_line(out, graph, cluster, *, size: str | None = None, skip: bool) -> None:
    """Write the run's report and say where on stderr (stdout may be JSON); a report that cannot be
    drawn is one warning line, never a failed run."""
    if skip:
        return
    from postplace.report import write_report

    try:
        print(f"report: {write_report(out, graph=graph, cluster=cluster, size=size)}", file=sys.stderr)
    except PostplaceError as exc:
        print(f"warning: no report ({exc})", file=sys.stderr)


class _experiment_progress:  # noqa: N801  (a context manager used like a function)
    """One bar for a whole experiment on a terminal; one line per step otherwise (logs, CI)."""

    def __enter__(self):
        self.bar = None
        if sys.stderr.isatty():
            from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

            self.bar = Progress(
                TextColumn("paper"),
                BarColumn(),
                TextColumn("{task.percentage:>3.0f}%"),
                TimeElapsedColumn(),
                TimeRemainingColumn(),
                TextColumn("{task.description}"),
                console=Console(stderr=True),
            )
            self.bar.start()
            self.task = self.bar.add_task("", total=1.0)
        from time import perf_counter

        self.clock = perf_counter
        self.t0 = perf_counter()
        return self

    def __call__(self, what: str, done: float, total: float) -> None:
        if self.bar is not None:
            self.bar.update(self.task, description=what, completed=done, total=total)
        else:
            el = self.clock() - self.t0
            print(f"[{done / total * 100:5.1f}% {el:7.0f} s] {what}", file=sys.stderr, flush=True)

    def __exit__(self, *exc):
        if self.bar is not None:
            self.bar.stop()


@app.command()
def place(
    ctx: typer.Context,
    target: Annotated[str | None, typer.Argument(help="Graph file or zoo model name (omit with --resume).")] = None,
    cluster: ClusterOpt = "k80x4",
    strategy: Annotated[
        str,
        typer.Option(
            "--strategy",
            "-s",
            help="post (default), post-paper, post-start, ce, ppo, reinforce, hp, anneal, random, local (local moves alone); named starts: ce-paper, ppo-paper, reinforce-paper, post-probe, ce-probe, ppo-probe, reinforce-probe, hp-probe, reinforce-local, hp-local.",
        ),
    ] = "post",
    budget: Annotated[str, typer.Option("--budget", "-b", help="Samples (2400) or time (60s).")] = "2400",
    seed: Annotated[int, typer.Option("--seed")] = 0,
    out: Annotated[
        Path | None, typer.Option("--out", "-o", help="Run folder (settings, history, checkpoint, placement, summary).")
    ] = None,
    resume: Annotated[
        Path | None, typer.Option("--resume", help="Continue the run saved in this folder (--budget N extends it).")
    ] = None,
    groups: Annotated[
        str, typer.Option("--groups", help="Number of groups, or 'none' for op-level placement.")
    ] = "256",
    pin: Annotated[list[str] | None, typer.Option("--pin", help="REGEX=DEVICE: pin matching ops (repeatable).")] = None,
    exclude: Annotated[list[str] | None, typer.Option("--exclude", help="A device the search may not use.")] = None,
    warm_start: Annotated[
        str | None, typer.Option("--warm-start", help="A placer, single:DEVICE or a placement file to start from.")
    ] = None,
    evaluator: Annotated[
        str, typer.Option("--evaluator", help="simulator, or torch (real execution; zoo models only).")
    ] = "simulator",
    map_all_to: Annotated[
        str | None, typer.Option("--map-all-to", help="With --evaluator torch: run every device on this torch device.")
    ] = None,
    set_: Annotated[
        list[str] | None, typer.Option("--set", help="KEY=VALUE: a field of the strategy's config (repeatable).")
    ] = None,
    config: Annotated[
        Path | None, typer.Option("--config", help="A TOML file of the strategy's config fields.")
    ] = None,
    size: SizeOpt = "full",
    batch: BatchOpt = None,
    as_json: JsonOpt = False,
    no_report: Annotated[bool, typer.Option("--no-report", help="Do not write the HTML report.")] = False,
    confirm: Annotated[
        int,
        typer.Option(
            "--confirm",
            help="Measure the search's K best placements (and the single device) for real; return the fastest measured.",
        ),
    ] = 0,
    confirm_with: Annotated[
        str,
        typer.Option(
            "--confirm-with",
            help="How --confirm measures: process (each placement in this one process) or launch (one process per device over torch.distributed; gloo: CPU processes standing in for the devices).",
        ),
    ] = "process",
    ray: Annotated[
        str | None,
        typer.Option("--ray", help="Evaluate on Ray actors: 'local' (a local cluster) or a cluster ADDRESS."),
    ] = None,
    microbatches: Annotated[
        str | None,
        typer.Option(
            "--microbatches",
            help="auto (the default for a zoo model): trace the step as m = 1, 2, 4... micro-batches (dividing the batch, up to the GPUs or 8) and answer over all; M pins the count.",
        ),
    ] = None,
    microbatch_colocation: Annotated[
        str,
        typer.Option(
            "--microbatch-colocation",
            help="none (a layer's micro-batches may split: data parallelism) or module (pipelines).",
        ),
    ] = "none",
    optimizer: OptimizerOpt = "sgd",
    lr: LrOpt = None,
    precision: PrecisionOpt = "fp32",
    layered: Annotated[
        bool,
        typer.Option(
            "--layered",
            help="A zoo transformer at scale (LLaMA-70B on 64 GPUs): the practitioner's grid and the strategy over its per-block choices, every plan priced by the layered estimate.",
        ),
    ] = False,
) -> None:
    """Search a placement; returns the best of the search, data parallelism, the pipeline, the single device and the one-shot placers, over micro-batch counts."""
    import postplace.api as api
    from postplace.api.target import default_out
    from postplace.search.config import build_config, parse_set, read_config_file

    overrides = {}
    if config is not None:
        overrides.update(read_config_file(config, strategy))
        if resume is None:  # each value checked against its range, the error naming where it came from
            build_config(strategy, read_config_file(config, strategy), source=f"--config {config}")
    overrides.update(parse_set(set_))
    if set_ and resume is None:
        build_config(strategy, parse_set(set_), source="--set")
    n_groups = None if groups == "none" else _positive_int(groups, "--groups")
    if ray is not None and ray not in ("local", "auto"):
        from postplace.distributed.ray_evaluator import parse_address

        parse_address(ray)  # a malformed address is one line before anything is traced
    from postplace.api.options import check_confirm_with

    check_confirm_with(confirm_with, confirm, ray, map_all_to)  # before anything is traced or printed
    if layered:
        _place_layered(ctx, target, cluster, strategy, budget, seed, size, batch, exclude, microbatches, out, as_json)
        return
    try:
        if resume is not None:
            if batch is not None:
                raise PostplaceError(
                    f"--batch {batch} with --resume {resume}: a resumed run keeps the size and batch "
                    "it was started with (run.json); drop --batch"
                )
            if out is not None and out.resolve() != resume.resolve():
                raise PostplaceError(
                    f"--out {out} with --resume {resume}: a resumed run stays in its own folder; drop --out"
                )
            given = {}
            for param, key in PLACE_FLAGS.items():
                if _given(ctx, param):
                    value = ctx.params[param]
                    given[key] = n_groups if param == "groups" else value
            if overrides:
                given["config"] = overrides
            if microbatches is not None:
                given["microbatches"] = _microbatches(microbatches)
            if _given(ctx, "microbatch_colocation"):
                given["microbatch_colocation"] = microbatch_colocation
            for flag in ("optimizer", "lr", "precision"):
                if _given(ctx, flag):
                    given[flag] = ctx.params[flag]
            explicit_budget = _given(ctx, "budget")
            result = api.resume(
                resume,
                budget=budget if explicit_budget else None,
                progress=_progress(as_json),
                measure=api.Measure(confirm=confirm, ray=ray, confirm_with=confirm_with),
                report=not no_report,
                **given,
            )
        else:
            if target is None:
                raise PostplaceError("place needs a TARGET (a graph file or a zoo model name), or --resume DIR")
            size = _with_batch(size, batch)
            out = out or default_out(target, cluster, strategy, seed)
            from postplace.search import Budget

            Budget.parse(budget)  # a bad budget is one line before the header that echoes it
            if not as_json:
                console.print(
                    f"placing {target} on {cluster}: {strategy}, budget {budget}, seed {seed} -> {out}", highlight=False
                )
                _suggest_layered(target, cluster, size)
            result = api.place(
                target,
                cluster,
                strategy=strategy,
                budget=budget,
                seed=seed,
                pins=pin or (),
                exclude=exclude or (),
                warm_start=warm_start,
                out=out,
                config=overrides or None,
                groups=n_groups,
                size=size,
                progress=_progress(as_json),
                microbatches=None if microbatches is None else _microbatches(microbatches),
                microbatch_colocation=microbatch_colocation,
                step=api.Step(optimizer=optimizer, lr=lr, precision=precision),
                measure=api.Measure(
                    evaluator=evaluator, map_all_to=map_all_to, confirm=confirm, ray=ray, confirm_with=confirm_with
                ),
                report=not no_report,
            )
    except KeyboardInterrupt:
        print(
            f"interrupted: the run is incomplete; resume it with  postplace place --resume {resume or out}",
            file=sys.stderr,
        )
        sys.exit(130)
    if result.report is not None:  # stderr: stdout may be JSON
        print(f"report: {result.report}", file=sys.stderr)
    if as_json:
        print(json.dumps(result.summary))
        return
    _print_place_table(result.summary, result.cluster, drawn=result.report is not None)
    if "confirm" in result.summary:
        console.print(_confirm_table(result.summary["confirm"]), highlight=False)


def _compare_layered(ctx, target, cluster, strategies, budget, seeds, out, size, batch, as_json):
    """``compare --layered``: :func:`postplace.compare_layered`, a row per strategy (or one JSON object)."""
    import postplace.api as api

    if _given(ctx, "expert_split"):
        raise PostplaceError(
            "--layered with --expert-split: the layered comparison runs no placers; drop --expert-split"
        )
    if budget < 1:
        raise PostplaceError(f"--budget {budget} with --layered: give a positive number of plans per strategy and seed")
    names = ("post", "post-start", "local", "random") if strategies == "all" else tuple(strategies.split(","))
    count = _microbatches(ctx.params["microbatches"]) if _given(ctx, "microbatches") else None
    if count == "auto":
        raise PostplaceError("compare --layered --microbatches auto: give a count, or none for 1 and 2 sequences")
    result = api.compare_layered(
        target,
        cluster,
        strategies=names,
        size=_with_batch(size, batch),
        optimizer=ctx.params["optimizer"],
        lr=ctx.params["lr"],
        precision=ctx.params["precision"],
        samples=budget,
        seeds=seeds,
        microbatches=count,
        out=out,
        progress=None if as_json else (lambda line: console.print(f"  {line}", highlight=False)),
    )
    if as_json:
        print(json.dumps(result.summary))
        return
    if out is not None:
        console.print(f"wrote {Path(out) / 'compare_layered.json'}", highlight=False)
    base = result.best_3d
    t = Table(
        title=f"{result.target} on {result.cluster} ({result.gpus} GPUs): {result.samples} plans x {result.seeds} "
        "seeds per strategy, from best-3d (layered estimate, simulated prices)"
    )
    for col in ("strategy", "own best (median)", "/best-3d", "new bests", "plan (best seed)", "wall s"):
        t.add_column(col)
    t.add_row("best-3d", "-" if base.step_time_s is None else _ms(base.step_time_s), "1.0000", "", base.plan or "-", "")
    for r in result.rows:
        t.add_row(
            r["strategy"],
            "-" if r["median_s"] is None else _ms(r["median_s"]),
            "-" if r["over_best_3d"] is None else f"{r['over_best_3d']:.4f}",
            ", ".join(f"{k} {v}" for k, v in r["new_bests"].items()) or "none",
            r["plan"] or "-",
            f"{r['wall_s']:.1f}",
        )
    console.print(t)


def _suggest_layered(target, cluster, size) -> None:
    """A line pointing at ``--layered`` when the op-level step of a zoo transformer will be large (many blocks
    or many GPUs): the op level traces, rewrites and simulates every op of every micro-batch, for minutes."""
    from postplace import zoo
    from postplace.api.target import load_cluster as load_any_cluster

    if target not in zoo.MODELS:
        return
    try:
        layers = zoo.spec(target).config(size).get("layers")
        layers = layers if isinstance(layers, int) else 0
        gpus = sum(d.kind == "gpu" for d in load_any_cluster(cluster, None)[0].devices)
    except PostplaceError:
        return  # the place call says what is wrong with them
    if layers >= 48 or gpus >= 32:
        console.print(
            f"note: {target} {size} on {gpus} GPUs is a large op-level step (minutes per micro-batch count); "
            "place --layered answers at this size in seconds (the grid and Post's per-block search, estimated)",
            highlight=False,
        )


_NOT_LAYERED = {
    "resume": "--resume",
    "pin": "--pin",
    "warm_start": "--warm-start",
    "evaluator": "--evaluator",
    "map_all_to": "--map-all-to",
    "set_": "--set",
    "config": "--config",
    "groups": "--groups",
    "confirm": "--confirm",
    "ray": "--ray",
    "microbatch_colocation": "--microbatch-colocation",
}


def _place_layered(ctx, target, cluster, strategy, budget, seed, size, batch, exclude, microbatches, out, as_json):
    """``place --layered``: :func:`postplace.place_layered`, its candidates as a table (or one JSON object)."""
    import postplace.api as api

    given = [flag for param, flag in _NOT_LAYERED.items() if _given(ctx, param)]
    if given:
        raise PostplaceError(
            f"--layered with {given[0]}: the layered answer prices plans of a zoo transformer by the layered "
            f"estimate, with no run folder to resume, no op-level placement and no real execution; drop {given[0]}"
        )
    if target is None:
        raise PostplaceError("place --layered needs a TARGET (a zoo transformer: llama, gpt2)")
    if not budget.isdigit() or int(budget) < 1:
        raise PostplaceError(f"--budget '{budget}' with --layered: give a number of plans to price (e.g. 2400)")
    count = None if microbatches in (None, "auto") else _microbatches(microbatches)
    result = api.place_layered(
        target,
        cluster,
        size=_with_batch(size, batch),
        optimizer=ctx.params["optimizer"],
        lr=ctx.params["lr"],
        precision=ctx.params["precision"],
        strategy=strategy,
        samples=int(budget),
        seed=seed,
        microbatches=count,
        exclude=exclude or (),
        out=out,
        progress=None if as_json else (lambda line: console.print(line, highlight=False)),
    )
    if as_json:
        print(json.dumps(result.summary))
        return
    t = Table(title=f"{result.target} on {result.cluster} ({result.gpus} GPUs), layered estimate (simulated prices)")
    for col in ("candidate", "plan", "step", "peak per GPU"):
        t.add_column(col)
    for k in result.candidates:
        t.add_row(
            k.name + ("  <- returned" if k.name == result.returned else ""),
            k.words,
            "-" if k.step_time_s is None else _ms(k.step_time_s),
            "-" if k.peak_bytes is None else _gb(k.peak_bytes),
        )
    console.print(t)
    for s in result.searches:
        gain = 1 - s["best_step_time_s"] / s["base_step_time_s"] if s["best_step_time_s"] else 0.0
        bests = ", ".join(f"{k} {v}" for k, v in s["new_bests"].items()) or "none"
        console.print(
            f"{s['strategy']} around {s['base']}{' again, from its best' if s['round'] == 2 else ''}: "
            f"{s['samples']} plans, {gain:.1%} below it (new bests: {bests})",
            highlight=False,
        )
    console.print(f"plan: {result.words}", highlight=False)
    if result.plan:
        console.print(f"  as --plan: {result.plan}", highlight=False)
        console.print(
            f"estimated step time {_ms(result.step_time_s)} (layered estimate, simulated prices)"
            + (f", {result.tokens_per_s_per_gpu:,.0f} tokens/s per GPU" if result.tokens_per_s_per_gpu else "")
            + f" (wall {result.timing['wall_s']:.1f} s)",
            highlight=False,
        )


def _microbatches(text: str):
    if text == "auto":
        return text
    if not text.isdigit() or int(text) < 1:
        raise PostplaceError(f"--microbatches '{text}': give a count (1, 2, 4...) or 'auto'")
    return int(text)


def _confirm_table(c: dict) -> Table:
    t = Table(title=f"--confirm: simulated ({c['simulator']}) and measured ({c['evaluator']}) side by side")
    for col in ("placement", "simulated", "measured", "status"):
        t.add_column(col)
    for r in c["candidates"]:
        mark = "  <- returned" if r["label"] == c["returned"] else ""
        t.add_row(
            r["label"],
            _ms(r["simulated_s"]),
            "-" if r["measured_s"] is None else _ms(r["measured_s"]),
            r["status"] + (f" ({r['reason']})" if r["reason"] else "") + mark,
        )
    rho = c["spearman"]
    t.caption = f"Spearman rank correlation: {'n/a (fewer than 3 ran)' if rho is None else f'{rho:.3f}'}"
    if c.get("measured_on"):
        t.caption += f"; measured on {c['measured_on']}"
    return t


def _given(ctx: typer.Context, param: str) -> bool:
    """The flag was typed on the command line (not left at its default)."""
    source = ctx.get_parameter_source(param)
    return source is not None and source.name == "COMMANDLINE"


def _progress(as_json: bool) -> bool:
    """Progress on stderr unless the output is JSON: a bar on a terminal, a plain line every few seconds
    elsewhere (a log, CI), so a first run that traces for minutes is never silent."""
    return not as_json


_REPORT_FILES = "report.html (with report.json, trace.json and the PNG figures beside it)"
NOTE_CHARS = 240
"""A note in the place table: wrapped in its column, cut at a word past this (summary.json holds it whole)."""


def _print_place_table(s: dict, c: Cluster, *, drawn: bool = False) -> None:
    from postplace.report.text import clip

    fig = s["figures"]
    kinds = {fig["best_step_time_s"], fig["search_best_step_time_s"], fig["candidates"]}
    kind = kinds.pop() if len(kinds) == 1 else None  # None: measured and simulated rows side by side
    title = f"({kind} step times)" if kind else "(each row says whether it was measured or simulated)"
    opt = s.get("optimizer")
    step = (
        f", step: {opt['name']} lr {opt['groups'][0].get('lr'):g}"
        if isinstance(opt, dict) and opt.get("groups")
        else ""
    ) + (f", {s['precision']}" if s.get("precision", "fp32") != "fp32" else "")
    t = Table(title=f"{s['graph']} on {s['cluster']}{step}: {s['strategy']}, {s['samples']} samples {title}")
    t.add_column("")
    t.add_column(f"step time ({kind})" if kind else "step time", justify="right")
    t.add_column("vs returned" if kind else "", justify="right")
    t.add_column("MFU", justify="right")
    t.add_column("note")
    best = s["best_step_time_s"]
    mfu = {**(s.get("candidate_mfu") or {}), s["returned"]: s.get("mfu")}
    # each row: (name, time, note, how it was judged, its key in summary["candidates"])
    rows = [(f"returned placement ({s['returned']})", best, "", fig["best_step_time_s"], s["returned"])]
    at = f"m={s['search_microbatches']}, " if s.get("search_microbatches") else ""
    sample = f" ({at}sample {s['search_best_sample']})" if s["search_best_step_time_s"] is not None else ""
    search = f"search @m{s['search_microbatches']}" if s.get("microbatch_counts") else "search"
    rows.append(
        (
            f"search best{sample}",
            s["search_best_step_time_s"],
            s["candidate_notes"].get("search", ""),
            fig["search_best_step_time_s"],
            search,
        )
    )
    rows += [(name, v, note, fig["candidates"], key) for name, v, note, key in _candidate_rows(s)]
    for name, v, note, how, key in rows:
        time_ = "-" if v is None else _ms(v) + ("" if kind else f" {how}")
        # never a measured time over a simulated one, nor a ratio to a zero-time step
        ratio = "-" if v is None or not kind or not best else f"{v / best:.3f}x"
        t.add_row(name, time_, ratio, _percent(mfu.get(key)), clip(note, NOTE_CHARS))
    console.print(t)
    if s.get("cost_model"):
        tokens = s.get("tokens_per_s_per_device")
        console.print(
            f"priced by the {s['cost_model']}" + (f"; {tokens:,.0f} tokens/s per device" if tokens else ""),
            highlight=False,
        )
    err, within = s.get("cost_model_error"), set(s.get("within_error") or ())
    close = [name for name, *_, key in rows[1:] if key in within] if kind == "simulated" else []
    if close:
        console.print(
            f"within the cost model's error of the returned one ({err:.0%}: how far it was off a published "
            f"run): {', '.join(close)}; the model cannot rank these apart from it",
            highlight=False,
        )
    for m, why in (s.get("microbatch_skipped") or {}).items():
        console.print(f"note: m = {m} left out: {why}", highlight=False)
    if s.get("microbatch_note"):
        console.print(f"note: {s['microbatch_note']}", highlight=False)
    if s.get("plan"):
        tried = ", ".join(f"m={m} {_ms(v)}" for m, v in (s.get("best_per_microbatches") or {}).items())
        console.print(
            f"plan: {s['plan']} ({s['returned']})" + (f"; best per micro-batch count: {tried}" if tried else ""),
            highlight=False,
        )
    start = s.get("search_start")
    if isinstance(start, dict) and start.get("name") is not None:
        when = (
            "not probed"
            if start.get("step_time_s") is None
            else f"{_ms(start['step_time_s'])} ({fig.get('search_start', fig['search_best_step_time_s'])})"
        )
        console.print(f"search start: {start['name']}, {when}", highlight=False)
    plans = s.get("plan_search")
    if plans and plans.get("best_step_time_s") is not None:
        bests = ", ".join(f"{k} {n}" for k, n in (plans.get("new_bests") or {}).items()) or "none"
        console.print(
            f"plan search: Post over per-unit plans from {plans['start']} {_ms(plans['start_step_time_s'])} to "
            f"{_ms(plans['best_step_time_s'])} in {plans['samples']} plans (simulated; new bests: {bests})",
            highlight=False,
        )
    lb = f"lower bound {_ms(s['lower_bound_s'])} (simulated)"
    if s["ratio_to_lower_bound"] is not None:
        lb += f", returned / lower bound {s['ratio_to_lower_bound']:.3f}"
    console.print(lb, highlight=False)
    m = Table(title="peak memory of the returned placement (simulated)")
    for col in ("device", "peak", "capacity", ""):
        m.add_column(col)
    for d in c.device_names:
        peak, cap = s["peak_memory_bytes"][d], s["capacity_bytes"][d]
        m.add_row(d, _gb(peak), _gb(cap), "OOM" if peak > cap else "")
    console.print(m)
    if s["warm_start"]:
        console.print(f"the search was warm-started from {s['warm_start']}", highlight=False)
    if s["map_all_to"]:
        console.print(f"measured with every device mapped to torch device {s['map_all_to']}", highlight=False)
    if s["out"]:
        runs = (
            "plans.json, m*/ (each count's history.jsonl, timing.jsonl, checkpoint.json)"
            if s.get("plan") and s.get("microbatch_counts")
            else "history.jsonl, timing.jsonl, checkpoint.json"
        )
        report = f", {_REPORT_FILES}" if drawn else ""
        console.print(f"wrote {s['out']}/placement.json, summary.json, run.json, {runs}{report}", highlight=False)


def _seconds(x: float) -> str:
    """A wall time that a placer's milliseconds do not round to 0.0."""
    return f"{x:.1f}" if x >= 10 else f"{x:.3g}"


def _percent(x: float | None) -> str:
    """An MFU cell: ``72.5%``, two decimals below 1% (a tiny model), ``-`` when there is none."""
    return "-" if x is None else f"{x:.1%}" if x >= 0.01 else f"{x:.2%}"


def _candidate_rows(s: dict) -> list[tuple[str, float | None, str, str]]:
    """The candidates of a summary as table rows ``(name, time, note, key in summary["candidates"])``; over
    several micro-batch counts, one row per kind of candidate at its fastest m (every m's figure stays in
    summary.json)."""
    notes = s["candidate_notes"]
    if not s.get("microbatch_counts"):
        return [(k, v, notes.get(k, ""), k) for k, v in s["candidates"].items() if k != "search"]
    best: dict[str, tuple[str, float | None, str, str]] = {}
    for key, v in s["candidates"].items():
        name, _, m = key.rpartition(" @m")
        if name == "search" or not name:
            continue
        kind = name.split(":")[0] if name.startswith("single:") else name
        old = best.get(kind)
        if old is None or (v is not None and (old[1] is None or v < old[1])):
            note = notes.get(key, "") if v is None else f"m={m}"
            best[kind] = (name, v, note, key)
    return list(best.values())


def _positive_int(text: str, flag: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise PostplaceError(f"{flag} '{text}': give a positive integer or 'none'")
    return int(text)


def _warning_line(message, category, filename, lineno, file=None, line=None) -> None:
    """A library warning (no report drawn, a loss that captured its labels) as one line on stderr."""
    print(f"warning: {message}", file=sys.stderr)


def main() -> None:
    try:  # typer >= 0.24 carries its own copy of click's parser and exceptions
        from typer._click import exceptions as click_errors
    except ImportError:  # pragma: no cover - older typer on plain click
        from click import exceptions as click_errors

    warnings.showwarning = _warning_line
    try:
        _no_empty_arguments(sys.argv[1:])
        code = app(standalone_mode=False)
        if isinstance(code, int) and code:
            sys.exit(code)
    except click_errors.NoArgsIsHelpError as exc:  # `postplace` alone: its help, as before
        exc.show()
        sys.exit(exc.exit_code)
    except click_errors.UsageError as exc:  # a flag typer could not parse: one line, like every other bad input
        ctx = exc.ctx
        where = "postplace" if ctx is None or ctx.parent is None else f"postplace {ctx.info_name}"
        print(f"error: {exc.format_message()} (see `{where} --help`)", file=sys.stderr)
        sys.exit(2)
    except typer.Abort:
        print("interrupted", file=sys.stderr)
        sys.exit(130)
    except PostplaceError as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(2)
    except OSError as exc:
        if exc.filename is None or exc.errno not in _PATH_ERRORS:
            _internal_error(exc)
        print(
            f"error: {_short_path(exc.filename)}: {exc.strerror}; give a path this machine can read and write",
            file=sys.stderr,
        )
        sys.exit(2)
    except Exception as exc:  # a bug of ours, not the user's input: still no wall of text by default
        _internal_error(exc)


def _no_empty_arguments(argv: list[str]) -> None:
    """No flag or argument of postplace means anything empty; a path given as '' was read as '.' (the
    current folder: compare wrote its run there, graph failed inside)."""
    for i, arg in enumerate(argv):
        flag, eq, value = arg.partition("=")
        if arg.startswith("--") and eq and not value.strip():
            raise PostplaceError(f"{flag} '{value}': empty; give a value (see `postplace --help`)")
        if not arg.strip():
            if i and argv[i - 1].startswith("-"):
                raise PostplaceError(f"{argv[i - 1]} '{arg}': empty; give a value (see `postplace --help`)")
            after = f"after '{argv[i - 1]}'" if i else "first"
            raise PostplaceError(f"the argument {after} is empty; give a value (see `postplace --help`)")


# A path the user named that the system refuses (too long, not allowed, a folder where a file was
# expected, a full or read-only disk): the user's input or machine, not a bug of ours.
_PATH_ERRORS = {
    errno.ENAMETOOLONG,
    errno.EACCES,
    errno.EPERM,
    errno.EISDIR,
    errno.ENOTDIR,
    errno.ENOSPC,
    errno.EROFS,
    errno.ENOENT,
    errno.EEXIST,
    errno.ELOOP,
    errno.EDQUOT,
}


def _short_path(name) -> str:
    text = os.fsdecode(name) if isinstance(name, bytes | str) else str(name)
    return text if len(text) <= 120 else f"{text[:60]}...{text[-40:]} ({len(text)} characters)"


def _internal_error(exc: BaseException):
    if os.environ.get("POSTPLACE_DEBUG"):
        raise exc
    text = str(exc)
    text = text if len(text) <= 400 else text[:300] + f"... ({len(text)} characters)"
    print(
        f"internal error: {type(exc).__name__}: {text} (rerun with POSTPLACE_DEBUG=1 for the traceback, "
        "and please report it)",
        file=sys.stderr,
    )
    sys.exit(3)


if __name__ == "__main__":
    main()
