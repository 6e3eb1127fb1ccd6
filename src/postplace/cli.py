"""The ``postplace`` command. Each command is a thin shell over library functions.

A user-caused error (:class:`PostplaceError`) prints one line on stderr and exits with status 2; no
traceback is ever shown for it.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Annotated

import numpy as np
import typer
from rich.console import Console
from rich.table import Table

from postplace.cluster import Cluster, load_cluster, preset_names
from postplace.cluster.placement import load_placement, single_device
from postplace.errors import PostplaceError
from postplace.graph import PHASES, OpGraph, load_graph

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    help="Fast device placements for deep-learning training.",
)
console = Console(width=None if sys.stdout.isatty() else 140)

ClusterOpt = Annotated[str, typer.Option("--cluster", "-c", help="Preset name or cluster .toml file.")]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print one JSON object on stdout.")]
SizeOpt = Annotated[str, typer.Option("--size", help="Zoo model size: full or small.")]


def load_target(target: str, size: str = "full") -> OpGraph:
    """A graph from a file path (first) or a zoo model name."""
    path = Path(target)
    if path.exists():
        return load_graph(path)
    if path.suffix or "/" in target:
        raise PostplaceError(f"{target}: no such file")
    try:
        from postplace import zoo
    except ImportError:
        raise PostplaceError(f"'{target}' is not a file, and this build has no model zoo") from None
    return zoo.cached_graph(target, size)


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
        rows.append({
            "name": name,
            "devices": [{"name": d.name, "kind": d.kind, "model": d.model, "memory_bytes": d.memory}
                        for d in c.devices],
            "description": c.description,
        })
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
    c = load_cluster(cluster)
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


def parse_placement(spec: str, graph: OpGraph, cluster: Cluster) -> np.ndarray:
    """``single:DEVICE`` or a placement JSON file."""
    if spec.startswith("single:"):
        return single_device(graph, cluster, spec.split(":", 1)[1])
    return load_placement(spec, graph, cluster)


@app.command()
def simulate(
    target: Annotated[str, typer.Argument(help="Graph file or zoo model name.")],
    cluster: ClusterOpt,
    placement: Annotated[str, typer.Option("--placement", "-p", help="single:DEVICE or a placement JSON file.")],
    trace: Annotated[Path | None, typer.Option("--trace", help="Write a Chrome trace-event JSON here.")] = None,
    size: SizeOpt = "full",
    as_json: JsonOpt = False,
) -> None:
    """Simulate one training step of a placement: step time, memory, transfers."""
    from postplace.sim import Simulator

    graph = load_target(target, size)
    c = load_cluster(cluster)
    dev = parse_placement(placement, graph, c)
    sim = Simulator(graph, c)
    sched = sim.schedule(dev)
    oom_devices = [c.device_names[d] for d in range(c.num_devices) if sched.peak_memory[d] > c.capacity[d]]
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
        "bytes_moved": float(sum(x[4] for x in sched.transfers)),
        "transfers": len(sched.transfers),
        "cost_sources": list(sim.sources),
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
    if trace is not None:
        console.print(f"trace written to {trace} (open in https://ui.perfetto.dev)", highlight=False)


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
    optimizer: Annotated[str, typer.Option("--optimizer", help="sgd (momentum) or adam.")] = "sgd",
    microbatches: Annotated[int, typer.Option("--microbatches", "-m", help="Trace the step as m micro-batches (gradient accumulation).")] = 1,
    microbatch_colocation: Annotated[str, typer.Option("--microbatch-colocation", help="none (a layer's micro-batches may go apart) or module (kept together).")] = "none",
) -> None:
    """Trace a zoo model's training step into a graph file (cached after the first time)."""
    from postplace.zoo.cli import cmd_graph

    console.print(cmd_graph(name, size, out, optimizer, microbatches=microbatches,
                            colocation=microbatch_colocation), highlight=False)


@app.command()
def profile(
    target: Annotated[str, typer.Argument(help="Zoo model name or a traced zoo graph file.")],
    size: Annotated[str, typer.Option("--size", help="Zoo model size: small or full.")] = "small",
    runs: Annotated[int, typer.Option("--runs", help="Timed runs per op (the median is kept).")] = 5,
    out: Annotated[Path | None, typer.Option("--out", "-o", help="Write the measured graph here.")] = None,
) -> None:
    """Run the traced step on this CPU, store per-op medians, compare them with the roofline."""
    from postplace.zoo.cli import cmd_profile

    console.print(cmd_profile(target, size=size, runs=runs, out=out), highlight=False)


@app.command()
def compare(
    target: Annotated[str, typer.Argument(help="Graph file or zoo model name.")],
    cluster: ClusterOpt = "k80x4",
    strategies: Annotated[str, typer.Option("--strategies", help="Comma-separated names, or 'all'.")] = "all",
    budget: Annotated[int, typer.Option("--budget", "-b", help="Samples per search run.")] = 2400,
    seeds: Annotated[int, typer.Option("--seeds", help="Seeds per search strategy.")] = 3,
    out: Annotated[Path | None, typer.Option("--out", "-o", help="Folder for compare.json/csv and every run.")] = None,
    expert_split: Annotated[str | None, typer.Option("--expert-split", help="A dnn-partitioning split file for 'expert'.")] = None,
    size: SizeOpt = "full",
    as_json: JsonOpt = False,
) -> None:
    """Every baseline and strategy on one graph, through the same simulator; resumable."""
    from postplace.compare import compare as run_compare
    from postplace.compare import parse_strategies

    names = parse_strategies(strategies)
    if budget < 1 or seeds < 1:
        raise PostplaceError("--budget and --seeds must be positive")
    graph = load_target(target, size)
    c = load_cluster(cluster)
    out = out or Path("runs") / f"compare-{Path(target).stem}-{c.name}"

    def progress(name: str) -> None:
        if not as_json:
            console.print(f"  running {name}...", highlight=False)

    try:
        report = run_compare(graph, c, names, budget=budget, seeds=seeds, out=out, progress=progress,
                             expert_split=expert_split)
    except KeyboardInterrupt:
        print(f"interrupted: rerun the same command to resume from {out}", file=sys.stderr)
        sys.exit(130)
    if as_json:
        print(json.dumps({k: v for k, v in report.items()}))
        return
    t = Table(title=f"{graph.name} on {c.name}: {budget} samples x {seeds} seeds per search (simulated)")
    for col in ("strategy", "best ms", "range ms", "/single", "/LB", "peak GB", "OOM", "wall s", "note"):
        t.add_column(col, no_wrap=col != "note")
    for r in report["rows"]:
        best = r["best_step_time_s"]
        rng_ = "" if r["kind"] != "search" or best is None else \
            f"{r['min_step_time_s'] * 1e3:.2f}-{r['max_step_time_s'] * 1e3:.2f}"
        name = r["strategy"] + (" *" if r["kind"].startswith("data-parallel") else "")
        t.add_row(name, "-" if best is None else f"{best * 1e3:.2f}", rng_,
                  "-" if r["ratio_to_single"] is None else f"{r['ratio_to_single']:.3f}",
                  "-" if r["ratio_to_lower_bound"] is None else f"{r['ratio_to_lower_bound']:.3f}",
                  "-" if r["peak_memory_bytes"] is None else f"{r['peak_memory_bytes'] / 1e9:.2f}",
                  str(r["oom_count"]), f"{r['wall_time_s']:.1f}", r["note"])
    console.print(t)
    single = report["single_device_step_time_s"]
    console.print(f"best single device {_ms(single) if single else 'none fits'}, lower bound {_ms(report['lower_bound_s'])}; "
                  "* data parallelism splits the batch over the GPUs: a different kind of parallelism, not a placement",
                  highlight=False)
    console.print(f"wrote {out}/compare.json and compare.csv", highlight=False)


@app.command()
def train(
    model: Annotated[str, typer.Argument(help="Zoo model name.")],
    placement: Annotated[str, typer.Option("--placement", "-p", help="Placement JSON file (or single:DEVICE).")],
    steps: Annotated[int, typer.Option("--steps", "-n", help="Training steps to run and time.")] = 10,
    size: Annotated[str, typer.Option("--size", help="Zoo model size: small or full.")] = "small",
    cluster: Annotated[str | None, typer.Option("--cluster", "-c", help="Cluster whose device names the placement uses.")] = None,
    map_all_to: Annotated[str | None, typer.Option("--map-all-to", help="Run every device on this torch device (e.g. cpu).")] = None,
    device: Annotated[list[str] | None, typer.Option("--device", help="NAME=TORCH_DEVICE, e.g. gpu0=cuda:1 (repeatable).")] = None,
    optimizer: Annotated[str, typer.Option("--optimizer", help="sgd (momentum) or adam.")] = "sgd",
    threads: Annotated[int | None, typer.Option("--threads", help="torch CPU threads.")] = None,
    microbatches: Annotated[int, typer.Option("--microbatches", "-m", help="Run the step as m micro-batches (the placement is of that graph).")] = 1,
    microbatch_colocation: Annotated[str, typer.Option("--microbatch-colocation", help="none or module (as for `graph`).")] = "none",
) -> None:
    """Train a zoo model (random data) under a placement and print each step's measured time."""
    from postplace.runtime.cli import cmd_train

    console.print(cmd_train(model, placement, steps, size=size, cluster=cluster, map_all_to=map_all_to,
                            device_map=device or (), optimizer=optimizer, threads=threads,
                            microbatches=microbatches, colocation=microbatch_colocation), highlight=False)


@app.command()
def calibrate(
    model: Annotated[str, typer.Argument(help="Zoo model name.")],
    size: Annotated[str, typer.Option("--size", help="Zoo model size: small or full.")] = "small",
    cluster_out: Annotated[Path, typer.Option("--cluster-out", help="Write the measured cluster TOML here.")] = Path("measured.toml"),
    graph_out: Annotated[Path | None, typer.Option("--graph-out", help="Write the measured graph here.")] = None,
    batches: Annotated[str | None, typer.Option("--batches", help="Batch sizes to calibrate on, e.g. 2,8.")] = None,
    score_on: Annotated[list[str] | None, typer.Option("--score-on", help="Zoo models to score on (repeatable).")] = None,
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
    console.print(cmd_calibrate(model, size, out_cluster=cluster_out, out_graph=graph_out, batches=batch_list,
                                score_on=score_on or (), runs=runs, threads=threads), highlight=False)


def _single_device_best(sim, graph: OpGraph, c: Cluster) -> tuple[str | None, float | None, np.ndarray | None]:
    """The fastest single-device placement that fits in memory, or (None, None, None)."""
    from postplace.placers import NoSingleDeviceFits, place_single

    try:
        ops = place_single(graph, c, cost_model=sim.problem.cost_model)
    except NoSingleDeviceFits:
        return None, None, None
    device = c.device_names[int(np.bincount(ops, minlength=c.num_devices).argmax())]
    return device, float(sim.evaluate_ops(ops[None]).step_time[0]), ops


@app.command()
def place(
    target: Annotated[str | None, typer.Argument(help="Graph file or zoo model name (omit with --resume).")] = None,
    cluster: ClusterOpt = "k80x4",
    strategy: Annotated[str, typer.Option("--strategy", "-s", help="post, post-paper, ce, ppo, reinforce, random...")] = "post",
    budget: Annotated[str, typer.Option("--budget", "-b", help="Samples (2400) or time (60s).")] = "2400",
    seed: Annotated[int, typer.Option("--seed")] = 0,
    out: Annotated[Path | None, typer.Option("--out", "-o", help="Run folder (placement, history, summary, checkpoint).")] = None,
    resume: Annotated[Path | None, typer.Option("--resume", help="Continue the run saved in this folder.")] = None,
    groups: Annotated[str, typer.Option("--groups", help="Number of groups, or 'none' for op-level placement.")] = "256",
    pin: Annotated[list[str] | None, typer.Option("--pin", help="REGEX=DEVICE: pin matching ops (repeatable).")] = None,
    exclude: Annotated[list[str] | None, typer.Option("--exclude", help="A device the search may not use.")] = None,
    warm_start: Annotated[str | None, typer.Option("--warm-start", help="Seed the search with a placer's placement.")] = None,
    evaluator: Annotated[str, typer.Option("--evaluator", help="simulator, or torch (real execution; zoo models only).")] = "simulator",
    map_all_to: Annotated[str | None, typer.Option("--map-all-to", help="With --evaluator torch: run every device on this torch device.")] = None,
    size: SizeOpt = "full",
    as_json: JsonOpt = False,
) -> None:
    """Search a placement; returns the better of the search's best and the best single device."""
    from postplace.cluster.placement import save_placement
    from postplace.search import Budget, make_problem, make_strategy, run

    if resume is not None:
        out = resume
        meta = _read_meta(resume)
        target, cluster, strategy, seed, groups, size = (meta[k] for k in ("target", "cluster", "strategy", "seed",
                                                                           "groups", "size"))  # fmt: skip
        budget, pin, exclude, warm_start = meta["budget"], meta["pin"], meta["exclude"], meta["warm_start"]
        evaluator, map_all_to = meta.get("evaluator", "simulator"), meta.get("map_all_to")
    if target is None:
        raise PostplaceError("place needs a TARGET (a graph file or a zoo model name), or --resume DIR")
    if out is None:
        out = Path("runs") / f"{Path(target).stem}-{cluster}-{strategy}-s{seed}"
    graph = load_target(target, size)
    c = load_cluster(cluster)
    n_groups = None if groups == "none" else _positive_int(groups, "--groups")
    problem = make_problem(graph, c, groups=n_groups, pins=pin or [], exclude=exclude or [], seed=seed)
    budget_ = Budget.parse(budget)
    space, judge = problem.space, problem.simulator
    if evaluator == "torch":
        from dataclasses import replace

        from postplace.runtime.evaluator import TorchEvaluator

        if Path(target).exists():
            raise PostplaceError("--evaluator torch needs a zoo model name as TARGET (a graph file has no code to run)")
        judge = TorchEvaluator.for_zoo(target, size, c, group_of_op=problem.grouping.group_of_op,
                                       device_map=map_all_to, graph=graph)
        # measured seconds can exceed the simulator's bound: failures must still score worst
        space = replace(space, failure_step_time=max(space.failure_step_time, judge.failure_step_time))
    elif evaluator != "simulator":
        raise PostplaceError(f"--evaluator '{evaluator}': use simulator or torch")
    strat = make_strategy(strategy, space, seed=seed)
    warm = None
    if warm_start is not None:
        warm = _warm_start_units(warm_start, problem)
    meta = {"target": target, "cluster": cluster, "strategy": strategy, "seed": seed, "groups": groups,
            "size": size, "budget": budget, "pin": pin or [], "exclude": exclude or [], "warm_start": warm_start,
            "evaluator": evaluator, "map_all_to": map_all_to}  # fmt: skip
    if not as_json:
        console.print(f"{graph.name}: {graph.num_ops} ops in {problem.grouping.num_groups} groups on {c.name}; "
                      f"{strategy}, budget {budget_.describe()}, seed {seed}", highlight=False)  # fmt: skip
    result = run(strat, judge, budget_, out_dir=out, resume=resume is not None,
                 progress=not as_json and sys.stderr.isatty(), warm_start=warm, meta=meta)  # fmt: skip
    sim = problem.simulator
    single_name, single_time, single_ops = _single_device_best(sim, graph, c)
    if judge is not sim and single_ops is not None:  # compare like with like: measure it too
        measured = judge.evaluate(problem.grouping.collapse(single_ops)[None])
        single_time = float(measured.step_time[0]) if measured.feasible[0] else None
    search_ops = None if result.best_placement is None else problem.grouping.expand(result.best_placement)
    if search_ops is not None and (single_time is None or result.best_step_time <= single_time):
        chosen, best_ops, best_time = "search", search_ops, result.best_step_time
    elif single_ops is not None:
        chosen, best_ops, best_time = f"single:{single_name}", single_ops, single_time
    else:
        raise PostplaceError(
            f"no feasible placement found: the search sampled {result.samples} placements, all OOM or failed, "
            "and no single device fits; try a larger --budget or a cluster with more memory"
        )
    sched = sim.schedule(best_ops)
    save_placement(out / "placement.json", graph, c, best_ops)
    lb = sim.lower_bound
    summary = {
        "graph": graph.name, "cluster": c.name, "strategy": strategy, "seed": seed, "evaluator": result.evaluator,
        "budget": budget_.describe(), "samples": result.samples, "feasible_samples": result.feasible_samples,
        "evaluations": result.evaluations, "groups": problem.grouping.num_groups,
        "best_step_time_s": best_time, "returned": chosen,
        "search_best_step_time_s": result.best_step_time if search_ops is not None else None,
        "search_best_sample": result.best_sample,
        "single_device": single_name, "single_device_step_time_s": single_time,
        "lower_bound_s": lb, "lower_bound_source": "simulator cost model",
        "ratio_to_lower_bound": best_time / lb if lb > 0 else None,
        "ratio_to_single_device": best_time / single_time if single_time else None,
        "peak_memory_bytes": dict(zip(c.device_names, sched.peak_memory.tolist(), strict=True)),
        "capacity_bytes": dict(zip(c.device_names, c.capacity.tolist(), strict=True)),
        "warm_start": warm_start, "wall_time_s": result.wall_time_s, "interrupted": result.interrupted,
        "out": str(out),
    }  # fmt: skip
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    if as_json:
        print(json.dumps(summary))
        return
    _print_place_table(summary, c)


def _print_place_table(s: dict, c: Cluster) -> None:
    t = Table(title=f"{s['graph']} on {s['cluster']}: {s['strategy']}, {s['samples']} samples (simulated)")
    t.add_column("")
    t.add_column("step time", justify="right")
    t.add_column("vs returned", justify="right")
    best = s["best_step_time_s"]
    rows = [("returned placement (" + s["returned"] + ")", best)]
    if s["search_best_step_time_s"] is not None:
        rows.append((f"search best (sample {s['search_best_sample']})", s["search_best_step_time_s"]))
    else:
        rows.append(("search best", None))
    rows.append((f"best single device ({s['single_device'] or 'none fits'})", s["single_device_step_time_s"]))
    rows.append(("lower bound", s["lower_bound_s"]))
    for name, v in rows:
        t.add_row(name, "-" if v is None else _ms(v), "-" if v is None else f"{v / best:.3f}x")
    console.print(t)
    m = Table(title="peak memory of the returned placement")
    for col in ("device", "peak", "capacity", ""):
        m.add_column(col)
    for d in c.device_names:
        peak, cap = s["peak_memory_bytes"][d], s["capacity_bytes"][d]
        m.add_row(d, _gb(peak), _gb(cap), "OOM" if peak > cap else "")
    console.print(m)
    if s["warm_start"]:
        console.print(f"the search was warm-started from the {s['warm_start']} placer", highlight=False)
    if s["interrupted"]:
        console.print(f"interrupted: resume with  postplace place --resume {s['out']}", highlight=False)
    console.print(f"wrote {s['out']}/placement.json, summary.json, history.jsonl, checkpoint.pkl", highlight=False)


def _read_meta(folder: Path) -> dict:
    import pickle

    path = folder / "checkpoint.pkl"
    if not path.exists():
        raise PostplaceError(f"{folder}: no checkpoint.pkl to resume from")
    with open(path, "rb") as f:
        return pickle.load(f)["meta"]


def _positive_int(text: str, flag: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise PostplaceError(f"{flag} '{text}': give a positive integer or 'none'")
    return int(text)


def _warm_start_units(placer: str, problem) -> np.ndarray:
    """A placer's op-level placement (or ``single:DEVICE``), mapped to the search's groups."""
    from postplace.placers import place as run_placer

    c, graph = problem.cluster, problem.graph
    if placer.startswith("single:"):
        ops = single_device(graph, c, placer.split(":", 1)[1])
    else:
        ops = run_placer(placer, graph, c)
    return problem.grouping.collapse(ops)


def main() -> None:
    try:
        app(standalone_mode=True)
    except PostplaceError as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(2)
    except Exception as exc:  # a bug of ours, not the user's input: still no wall of text by default
        if os.environ.get("POSTPLACE_DEBUG"):
            raise
        print(f"internal error: {type(exc).__name__}: {exc} (rerun with POSTPLACE_DEBUG=1 for the traceback, "
              "and please report it)", file=sys.stderr)  # fmt: skip
        sys.exit(3)


if __name__ == "__main__":
    main()
