"""What the zoo commands show, as plain functions returning text, so ``cli.py`` wires each in one line:
``postplace models`` -> :func:`cmd_models`, ``postplace graph NAME`` -> :func:`cmd_graph`,
``postplace profile TARGET`` -> :func:`cmd_profile`. Errors are :class:`PostplaceError` lines.

:func:`traced_step` is the zoo's side of profiling: it turns a zoo model name, or a graph file traced
from a zoo model, into the traced step that :func:`postplace.cost.profile.profile_cpu` times (the cost
models know nothing of the zoo; the zoo passes them what they need, DESIGN.md section 1).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from postplace.errors import PostplaceError
from postplace.graph import load_graph
from postplace.graph.opgraph import PHASES, OpGraph
from postplace.zoo import MODELS, cached_graph, trace_model

__all__ = ["cmd_graph", "cmd_models", "cmd_profile", "graph_summary", "traced_step"]


def graph_summary(graph: OpGraph) -> dict:
    """The numbers ``postplace graph`` and ``benchmarks/zoo.py`` print for one traced graph."""
    meta = graph.metadata
    fwd = graph.flops[graph.phase == PHASES.index("forward")].sum()
    return {
        "ops_before": meta.get("ops_before_folding"),
        "ops": graph.num_ops,
        "edges": graph.num_edges,
        "gflops": float(graph.flops.sum()) / 1e9,
        "fwd_bwd_over_fwd": float(graph.flops[graph.phase <= 1].sum() / fwd) if fwd else float("nan"),
        "param_bytes": float(meta.get("param_bytes", 0.0)),
        "persistent_bytes": float(graph.persistent_bytes.sum()),
        "coverage": (meta.get("colocation") or {}).get("coverage"),
        "coloc_sets": len(graph.colocation_sets),
        "largest_set": max((len(s) for s in graph.colocation_sets), default=0),
        "trace_s": meta.get("trace_seconds"),
    }


def cmd_models() -> str:
    """``postplace models``: one line per zoo model with its full-size config, then the sources."""
    lines = [f"{'name':13} {'description':66} full config"]
    for spec in MODELS.values():
        cfg = ", ".join(f"{k}={v}" for k, v in spec.full.items())
        lines.append(f"{spec.name:13} {spec.description:66} {cfg}")
    lines.append("")
    lines += [f"{spec.name}: {spec.source}" for spec in MODELS.values()]
    return "\n".join(lines)


def cmd_graph(
    name: str,
    size: str = "full",
    out: str | Path | None = None,
    optimizer: str = "sgd",
    *,
    microbatches: int = 1,
    colocation: str = "none",
    lr: float | None = None,
    precision: str = "fp32",
) -> str:
    """``postplace graph NAME``: trace (or read from the cache) a zoo model; write it to ``out``."""
    from postplace.graph.trace_torch import COLOCATION_MODES

    if microbatches < 1:
        raise PostplaceError(f"--microbatches must be >= 1, got {microbatches}")
    if colocation not in COLOCATION_MODES:
        raise PostplaceError(f"--microbatch-colocation '{colocation}' is not one of {', '.join(COLOCATION_MODES)}")
    graph = cached_graph(
        name, size, optimizer, lr=lr, precision=precision, microbatches=microbatches, colocation=colocation
    )
    if out is not None:
        try:
            graph.save(out)
        except OSError as exc:
            raise PostplaceError(f"{out}: cannot write the graph ({exc.strerror}); pick a writable path") from None
    s = graph_summary(graph)
    text = (
        f"{graph.name} ({optimizer}): {s['ops']} ops ({s['ops_before']} aten calls before folding), "
        f"{s['edges']} edges, {s['gflops']:.1f} GFLOP per step, "
        f"parameters {s['param_bytes'] / 2**20:.1f} MiB, "
        f"persistent {s['persistent_bytes'] / 2**20:.1f} MiB, colocation coverage {s['coverage']:.1%}"
    )
    if microbatches > 1:
        text += f"\n{microbatches} micro-batches, colocation across micro-batches: {colocation}"
    return text + (f"\nwritten to {out}" if out is not None else "")


def cmd_profile(
    target: str, size: str = "full", runs: int = 5, out: str | Path | None = None, optimizer: str = "sgd"
) -> str:
    """``postplace profile TARGET``: time a zoo model (name) or a traced zoo graph file on this CPU."""
    from postplace.cost.profile import check_runs, profile_cpu

    check_runs(runs)  # before tracing, which takes seconds
    what = target if target in MODELS else load_graph(target)
    graph, report = profile_cpu(traced_step(what, size, optimizer), runs=runs)
    if out is not None:
        graph.save(out)
    return report.format() + (f"\nmeasured graph written to {out}" if out is not None else "")


def traced_step(target, size: str = "small", optimizer="sgd"):
    """The traced step (:class:`~postplace.graph.trace_torch.Traced`) that profiling ``target`` times.

    A zoo model name is traced at ``size`` with ``optimizer``; an OpGraph traced from a zoo model is
    traced again from the model, size, optimizer and precision it records, keeping the measurements it
    carries (:class:`PostplaceError` where the model or the tracer changed since). Anything else (a
    :class:`Traced`, an imported graph) is returned as it is: :func:`postplace.cost.profile.profile_cpu`
    runs the one and says why it cannot run the other.
    """
    if isinstance(target, str):
        if target not in MODELS:
            raise PostplaceError(
                f"cannot profile '{target}': not a zoo model ({', '.join(MODELS)}); "
                "for your own model, trace it with postplace.graph.trace_torch.trace and pass the result"
            )
        return trace_model(target, size, optimizer)
    zoo = target.metadata.get("zoo") if isinstance(target, OpGraph) else None
    if not zoo:
        return target
    from postplace.graph.optimizers import recorded_step

    traced = trace_model(zoo["name"], zoo["size"], **recorded_step({"optimizer": optimizer, **target.metadata}))
    if traced.graph.names != target.names:
        raise PostplaceError(
            f"graph '{target.name}' no longer matches zoo model '{zoo['name']}' as traced now "
            "(the model or tracer changed); re-create the graph with `postplace graph`"
        )
    return dataclasses.replace(traced, graph=dataclasses.replace(traced.graph, measured=target.measured))
