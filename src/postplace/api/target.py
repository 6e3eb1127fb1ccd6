"""What is placed, and where: the target (a zoo model, a graph file, an OpGraph or an ``nn.Module``
traced with its optimizer and precision, at a micro-batch count) and the cluster (a preset, a TOML
file, ``workload:PRESET`` or a Cluster), with the spec each is recorded by so that a run folder can
load them again; and the default run folders.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from postplace.errors import PostplaceError


@dataclass
class Target:
    """A loaded target: its graph, the traced step when there is code to run, and how to load it again."""

    graph: object
    traced: object | None
    spec: dict


def load_target(
    target,
    *,
    size: str = "full",
    inputs=None,
    loss_fn=None,
    optimizer="sgd",
    lr: float | None = None,
    precision: str = "fp32",
    microbatches: int = 1,
    microbatch_colocation: str = "none",
    targets=None,
) -> Target:
    """Load what :func:`place` places: an :class:`OpGraph`, a graph file, a zoo model name or an ``nn.Module``.

    Parameters
    ----------
    target : OpGraph, str, path or torch.nn.Module
        A graph, a graph file, a zoo model name, or a module (with ``inputs`` and ``loss_fn``), which is traced.
    size : str
        Zoo model size (``full`` or ``small``).
    inputs, loss_fn
        A module's example batch and its loss (outputs -> scalar loss); needed for a module only.
    optimizer, lr, precision
        The step traced (see :func:`postplace.graph.from_torch`); a graph file or an OpGraph is already
        traced and takes only the defaults (``"sgd"``, None, ``"fp32"``).
    microbatches, microbatch_colocation
        The step traced as that many micro-batches (a zoo model, or a module given ``targets``); a graph
        file or an OpGraph takes only 1.
    targets : tensor or tuple of tensors, optional
        A module's labels: its loss is then ``loss_fn(outputs, *targets)``.

    Returns
    -------
    Target
        ``graph`` (the OpGraph), ``traced`` (the traced step of a module, else None) and ``spec`` (how to
        load it again, as ``run.json`` records it).

    Raises
    ------
    PostplaceError
        A path that is no file, a name the zoo lacks, a module without ``inputs`` / ``loss_fn`` (or
        split into micro-batches without ``targets``), step options or micro-batches given with a graph,
        a step that cannot be traced, or a target of another type.

    Examples
    --------
    >>> from postplace import load_target
    >>> from postplace.graph import OpGraph
    >>> t = load_target(OpGraph.build(["a", "b"], [(0, 1, 1e6)], flops=[1e9, 1e9]))
    >>> t.spec, t.traced, t.graph.num_ops
    ({'kind': 'graph'}, None, 2)
    """
    from postplace.graph import OpGraph, load_graph

    if isinstance(target, OpGraph) or (isinstance(target, str | Path) and Path(str(target)).exists()):
        _untraced_step_options(optimizer, lr, precision)
        if microbatches != 1:
            raise PostplaceError(
                f"--microbatches {microbatches}: a graph file is one traced step and cannot be "
                "traced again as micro-batches; give a zoo model name or an nn.Module, or drop "
                "--microbatches"
            )
        if isinstance(target, OpGraph):
            return Target(target, None, {"kind": "graph"})
        path = Path(str(target))
        return Target(load_graph(path), None, {"kind": "file", "path": str(path.resolve())})
    if isinstance(target, str | Path):
        text = str(target)
        path = Path(text)
        if path.suffix or "/" in text or "\\" in text:
            raise PostplaceError(f"{text}: no such file")
        try:
            from postplace import zoo
        except ImportError:
            raise PostplaceError(f"'{text}' is not a file, and this build has no model zoo") from None
        if text not in zoo.MODELS:
            raise PostplaceError(f"'{text}' is neither a file nor a zoo model; the zoo has {', '.join(zoo.MODELS)}")
        graph = zoo.cached_graph(
            text,
            size,
            optimizer,
            lr=lr,
            precision=precision,
            microbatches=microbatches,
            colocation=microbatch_colocation,
        )
        spec = {"kind": "zoo", "name": text, "size": size, **_step_spec(graph)}
        if microbatches != 1:
            spec.update(microbatches=microbatches, microbatch_colocation=microbatch_colocation)
        return Target(graph, None, spec)
    try:
        import torch
    except ImportError:  # pragma: no cover
        torch = None
    if torch is not None and isinstance(target, torch.nn.Module):
        if inputs is None or loss_fn is None:
            raise PostplaceError(
                "placing an nn.Module needs example inputs and a loss_fn (outputs -> scalar loss): "
                "step=postplace.Step(inputs=(x,), loss_fn=...)"
            )
        if microbatches != 1 and targets is None:
            raise PostplaceError(
                f"--microbatches {microbatches}: splitting your module's batch needs its labels "
                "apart from the loss: pass Step(targets=(y,)) and a loss_fn(outputs, y)"
            )
        from postplace.graph.trace_torch import trace

        kw = {} if targets is None else {"targets": targets}
        if microbatches != 1:
            kw.update(microbatches=microbatches, microbatch_colocation=microbatch_colocation)
        traced = trace(target, inputs, loss_fn, optimizer, lr=lr, precision=precision, **kw)
        spec = {"kind": "module", "model": type(target).__name__, **_step_spec(traced.graph)}
        if microbatches != 1:
            spec.update(microbatches=microbatches, microbatch_colocation=microbatch_colocation)
        return Target(traced.graph, traced, spec)
    raise PostplaceError(
        f"target must be an OpGraph, a graph file, a zoo model name or an nn.Module, not a {type(target).__name__}"
    )


def _untraced_step_options(optimizer, lr, precision) -> None:
    if (isinstance(optimizer, str) and optimizer.lower() == "sgd") and lr is None and precision == "fp32":
        return
    raise PostplaceError(
        "--optimizer, --lr and --precision choose how a model's step is traced; a graph file "
        "is already traced: give a zoo model name or an nn.Module, or drop them"
    )


def _step_spec(graph) -> dict:
    """The optimizer and precision a traced step was made with, as run.json records them."""
    return {"optimizer": graph.metadata.get("optimizer", "sgd"), "precision": graph.metadata.get("precision", "fp32")}


def recorded_step(spec: dict) -> dict:
    """``load_target`` keyword arguments that trace the recorded step again (older folders: SGD, fp32)."""
    from postplace.graph.optimizers import recorded_step

    return recorded_step(spec)


def batch_of(target, size: str, inputs) -> int | None:
    """The global batch of a target that can be traced again (a zoo model; a module's first input's
    dim 0), else None."""
    if isinstance(target, str) and not Path(target).exists():
        from postplace import zoo

        if target in zoo.MODELS:
            return int(zoo.spec(target).config(size)["batch"])
        return None
    first = inputs[0] if isinstance(inputs, tuple | list) and inputs else inputs
    shape = getattr(first, "shape", None)
    return int(shape[0]) if shape is not None and len(shape) else None


def load_cluster(cluster, graph):
    """A Cluster, a preset name, a .toml file, or ``workload:PRESET`` (the graph file's own machine)."""
    from postplace.cluster import Cluster
    from postplace.cluster.from_workload import resolve_cluster

    if isinstance(cluster, Cluster):
        return cluster, None
    if not isinstance(cluster, str | Path):
        raise PostplaceError(f"cluster must be a preset name, a .toml file or a Cluster, not {type(cluster).__name__}")
    text = str(cluster)
    path = Path(text)
    c = resolve_cluster(text, graph)
    return c, (str(path.resolve()) if path.exists() else text)


def _stem(target) -> str:
    return Path(str(target)).stem if isinstance(target, str | Path) else getattr(target, "name", type(target).__name__)


def default_out(target, cluster, strategy: str, seed) -> Path:
    """The run folder ``place`` uses when none is given: ``runs/<target>-<cluster>-<strategy>-s<seed>``."""
    return Path("runs") / f"{_stem(target)}-{_stem(cluster)}-{strategy}-s{seed}"


def default_compare_out(target, cluster) -> Path:
    """The folder ``compare`` uses when none is given: ``runs/compare-<target>-<cluster>``."""
    return Path("runs") / f"compare-{_stem(target)}-{_stem(cluster)}"
