"""The ``postplace`` command. Each command is a thin shell over library functions.

A user-caused error (:class:`PostplaceError`) prints one line on stderr and exits with status 2; no
traceback is ever shown for it.
"""

from __future__ import annotations

import json
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
console = Console()

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


def main() -> None:
    try:
        app(standalone_mode=True)
    except PostplaceError as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
