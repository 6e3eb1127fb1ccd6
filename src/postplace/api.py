"""The library's front door: :func:`place`, :func:`resume`, :func:`compare`, :func:`apply`, :class:`PlaceResult`.

Everything the ``postplace place`` and ``compare`` commands decide lives here (the CLI only parses,
calls and prints): loading the target, the search problem with its constraints, the evaluator, the
strategy and its configuration, warm starts, the run folder (``run.json`` written first, then the
runner's history and checkpoint; once the search ended, ``run.json`` also records the search's start,
:data:`START_KEYS`), the candidates, and which one is returned (DESIGN.md section 4c):

* the search's own best (reported on its own as ``search_best_step_time_s``);
* the warm start's own op-level placement, when there is one;
* the memory-aware one-shot placers (:data:`CANDIDATE_PLACERS`), each run under the same pins and
  exclusions, evaluated by the same evaluator.

The fastest feasible one is returned (ties: that order), and ``returned`` names it. When none is
feasible the call fails with one clear error and writes no placement.
"""

from __future__ import annotations

import dataclasses
import json
import time
import types
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from postplace.errors import PostplaceError
from postplace.search.state_io import fingerprint
from postplace.validate import make_folder

__all__ = ["CANDIDATE_PLACERS", "PlaceResult", "apply", "compare", "load_target", "place", "resume"]

CANDIDATE_PLACERS = ("single", "pipeline", "m-topo", "m-etf", "m-sct", "metis", "expert")
QUADRATIC_PLACERS = ("m-etf", "m-sct")
QUADRATIC_PLACER_MAX_OPS = 20_000
"""Above this many ops m-ETF and m-SCT (ops x ready ops, and m-SCT's LP) take minutes: 20 s each on
Inception-V3 at 16 micro-batches (17,693 ops) on 2 cores; they are left out with a note, as on the
large micro-batch counts of big models, where the other candidates still run."""
SETTINGS = "run.json"  # postplace.search.state_io.RUN_SETTINGS, which the report reads
EVALUATORS = ("simulator", "torch")
START_KEYS = ("search_start", "search_start_per_microbatches")
"""What ``run.json`` and ``summary.json`` record of the search's start (:func:`_search_start`): a result,
not a setting, so :func:`read_settings` checks and leaves them out (a folder from before has none)."""


# ------------------------------------------------------------------------------------------ targets
@dataclass
class Target:
    """A loaded target: its graph, the traced step when there is code to run, and how to load it again."""

    graph: object
    traced: object | None
    spec: dict


def load_target(target, *, size: str = "full", inputs=None, loss_fn=None, optimizer="sgd", lr: float | None = None,
                precision: str = "fp32", microbatches: int = 1, microbatch_colocation: str = "none",
                targets=None) -> Target:  # fmt: skip
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
            raise PostplaceError(f"--microbatches {microbatches}: a graph file is one traced step and cannot be "
                                 "traced again as micro-batches; give a zoo model name or an nn.Module, or drop "
                                 "--microbatches")  # fmt: skip
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
        graph = zoo.cached_graph(text, size, optimizer, lr=lr, precision=precision, microbatches=microbatches,
                                 colocation=microbatch_colocation)  # fmt: skip
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
            raise PostplaceError("placing an nn.Module needs example inputs= and a loss_fn= (outputs -> scalar loss)")
        if microbatches != 1 and targets is None:
            raise PostplaceError(f"--microbatches {microbatches}: splitting your module's batch needs its labels "
                                 "apart from the loss: pass targets=(y,) and a loss_fn(outputs, y)")  # fmt: skip
        from postplace.graph.trace_torch import trace

        kw = {} if targets is None else {"targets": targets}
        if microbatches != 1:
            kw.update(microbatches=microbatches, microbatch_colocation=microbatch_colocation)
        traced = trace(target, inputs, loss_fn, optimizer, lr=lr, precision=precision, **kw)
        spec = {"kind": "module", "model": type(target).__name__, **_step_spec(traced.graph)}
        if microbatches != 1:
            spec.update(microbatches=microbatches, microbatch_colocation=microbatch_colocation)
        return Target(traced.graph, traced, spec)
    raise PostplaceError(f"target must be an OpGraph, a graph file, a zoo model name or an nn.Module, "
                         f"not a {type(target).__name__}")  # fmt: skip


def _untraced_step_options(optimizer, lr, precision) -> None:
    if (isinstance(optimizer, str) and optimizer.lower() == "sgd") and lr is None and precision == "fp32":
        return
    raise PostplaceError("--optimizer, --lr and --precision choose how a model's step is traced; a graph file "
                         "is already traced: give a zoo model name or an nn.Module, or drop them")  # fmt: skip


def _step_spec(graph) -> dict:
    """The optimizer and precision a traced step was made with, as run.json records them."""
    return {"optimizer": graph.metadata.get("optimizer", "sgd"), "precision": graph.metadata.get("precision", "fp32")}


def _recorded_step(spec: dict) -> dict:
    """``load_target`` keyword arguments that trace the recorded step again (older folders: SGD, fp32)."""
    from postplace.graph.optimizers import recorded_step

    return recorded_step(spec)


def _batch_of(target, size: str, inputs) -> int | None:
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


def _load_cluster(cluster, graph):
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


# ------------------------------------------------------------------------------------------ result
@dataclass
class Candidate:
    """One placement ``place`` considered: its name, op-level devices, and what the evaluator said."""

    name: str
    placement: np.ndarray | None
    step_time_s: float | None
    feasible: bool
    note: str = ""


@dataclass
class PlaceResult:
    """What :func:`place` returns: the placement, where it came from, and every figure behind the choice.

    :func:`place` and :func:`resume` build it; its fields are read, not passed.

    Parameters
    ----------
    graph : postplace.graph.OpGraph
        The graph that was placed (for a zoo model or a module: its traced step).
    cluster : postplace.cluster.Cluster
        The cluster it was placed on.
    placement : numpy.ndarray
        int64 device id per op of ``graph`` (the returned placement).
    returned : str
        Where it came from: ``"search"``, ``"warm-start:NAME"``, or a placer (``"single:gpu0"``, ``"m-etf"``...).
    step_time_s : float
        Its step time by ``evaluator`` (``"simulator"``: simulated; ``"torch"``: measured).
    evaluator : str
        The name of the evaluator behind ``step_time_s``: ``"simulator"`` or ``"torch"``.
    search : postplace.search.SearchResult
        The search's own result (its best over its units, samples, curve).
    search_placement : numpy.ndarray or None
        The search's own best, expanded to one device per op (None when it sampled nothing feasible).
    candidates : list of Candidate
        Every candidate with its step time (None where it failed or ran out of memory) and a note.
    lower_bound_s : float
        The simulator's lower bound (always simulated).
    schedule : postplace.sim.trace.Schedule
        The simulated schedule of the returned placement (``schedule.save_chrome_trace(path)``).
    summary : dict
        Every figure as JSON-able data (what ``summary.json`` holds).
    traced : object or None
        The traced step (:func:`postplace.graph.trace_torch.trace`) when the target was an ``nn.Module``:
        what :func:`apply` runs. None otherwise.
    target_spec : dict
        How the target was loaded, as ``run.json`` records it (``{"kind": "zoo", "name": ...}``).
    report : pathlib.Path or None
        The run folder's ``report.html``, when one was written.

    Attributes
    ----------
    search_best_step_time_s : float or None
        The search's own best, whatever was returned (None when it sampled nothing feasible).
    """

    graph: object
    cluster: object
    placement: np.ndarray
    returned: str
    step_time_s: float
    evaluator: str
    search: object
    search_placement: np.ndarray | None
    candidates: list[Candidate]
    lower_bound_s: float
    schedule: object
    summary: dict
    traced: object | None = None
    target_spec: dict = field(default_factory=dict)
    report: Path | None = None

    @property
    def search_best_step_time_s(self) -> float | None:
        """The search's own best step time, whatever was returned (None when it sampled nothing feasible)."""
        return self.summary["search_best_step_time_s"]

    def mapping(self) -> dict[str, str]:
        """``{op name: device name}`` of the returned placement.

        Returns
        -------
        dict of str to str
            Each op's name and the name of the device it runs on.
        """
        from postplace.cluster.placement import to_mapping

        return to_mapping(self.graph, self.cluster, self.placement)

    def to_json(self) -> str:
        """The summary as indented JSON (what ``summary.json`` holds).

        Returns
        -------
        str
        """
        return json.dumps(self.summary, indent=1)

    def save(self, folder: str | Path) -> Path:
        """Write ``placement.json`` and ``summary.json`` into ``folder``; returns the folder.

        Parameters
        ----------
        folder : str or path
            Created when missing.

        Returns
        -------
        pathlib.Path
            The folder.

        Raises
        ------
        PostplaceError
            When ``folder`` cannot be created (a file stands there, no permission).
        """
        from postplace.cluster.placement import save_placement

        folder = make_folder(folder, "save folder")
        save_placement(folder / "placement.json", self.graph, self.cluster, self.placement)
        tmp = folder / "summary.json.tmp"
        tmp.write_text(self.to_json())
        tmp.replace(folder / "summary.json")
        return folder

    def __repr__(self) -> str:
        return (f"PlaceResult({self.summary['graph']!r} on {self.summary['cluster']!r}: {self.returned}, "
                f"{_ms(self.step_time_s)} {self.summary['figures']['best_step_time_s']})")  # fmt: skip

    def __str__(self) -> str:
        s = self.summary
        kind = s["figures"]["best_step_time_s"]
        lines = [f"{s['graph']} on {s['cluster']}: {s['strategy']}, {s['samples']} samples ({kind})",
                 f"  returned ({self.returned}): {_ms(self.step_time_s)}"]  # fmt: skip
        lines.append(f"  search best: {_ms(s['search_best_step_time_s'])}")
        start = s.get("search_start")
        if isinstance(start, dict) and start.get("name") is not None:
            lines.append(f"  search start: {start['name']}, {_ms(start.get('step_time_s'))}")
        for c in self.candidates:
            if c.name != "search":
                lines.append(f"  {c.name}: {_ms(c.step_time_s)}" + (f"  ({c.note})" if c.note else ""))
        lines.append(f"  lower bound: {_ms(self.lower_bound_s)} (simulated)")
        return "\n".join(lines)


def _ms(x) -> str:
    if x is None:
        return "-"
    return "inf" if not np.isfinite(x) else f"{x * 1e3:.3f} ms"


# ------------------------------------------------------------------------------------------ place
def place(
    target,
    cluster="k80x4",
    *,
    strategy: str = "post",
    budget: int | str = 2400,
    seed: int = 0,
    pins=(),
    exclude=(),
    warm_start: str | None = None,
    evaluator: str = "simulator",
    out: str | Path | None = None,
    config=None,
    groups: int | None = 256,
    size: str = "full",
    inputs=None,
    loss_fn=None,
    map_all_to: str | None = None,
    progress: bool = False,
    confirm: int = 0,
    ray: str | None = None,
    microbatches: int | str | None = None,
    microbatch_colocation: str = "none",
    targets=None,
    optimizer="sgd",
    lr: float | None = None,
    precision: str = "fp32",
    report: bool = True,
) -> PlaceResult:
    """Find a fast placement of one training step on a cluster.

    Runs the search ``strategy`` for ``budget`` samples, evaluates data parallelism, the GPipe-style
    pipeline, the memory-aware one-shot placers (:data:`CANDIDATE_PLACERS`) and the warm start with
    the same evaluator and under the same constraints, and returns the fastest feasible of them all
    (DESIGN.md section 4c). Where the step can be traced again (a zoo model, a module with
    ``targets``), this is done by default at every micro-batch count m = 1, 2, 4... dividing the batch
    (up to the number of GPUs or 8), the budget split by successive halving (:mod:`postplace.over_m`); the
    result names the m, the candidate and the plan (``summary["plan"]``, e.g. "data-parallel 4, 4
    micro-batches"). Every step time is for the same global batch.

    Parameters
    ----------
    target : OpGraph, str, path or torch.nn.Module
        A graph, a graph file, a zoo model name (see ``postplace models``), or a module with
        ``inputs`` (example batch) and ``loss_fn`` (outputs -> scalar loss); a module is traced.
    cluster : str, path or Cluster
        A preset name (``k80x2``, ``k80x4``, ``dgx8``, ``dgx8x2``, ``mixed``, ``h100``), a cluster TOML
        file, or a Cluster.
    strategy : str
        ``post`` (default), ``post-paper``, ``post-start``, ``ce``, ``ppo``, ``reinforce``, ``hp``,
        ``anneal``, ``random``, or a named start (``ce-paper``, ``ppo-paper``, ``reinforce-paper``,
        ``reinforce-probe``, ``hp-probe``; :data:`postplace.search.VARIANTS`).
    budget : int or str
        Samples (``2400``) or wall-clock time (``"60s"``, ``"5m"``).
    seed : int
        Seed of the grouping and the strategy (>= 0).
    pins : sequence of str
        ``"REGEX=DEVICE"``: ops whose name matches go on DEVICE (with their colocation sets).
    exclude : sequence of str
        Devices no op may use.
    warm_start : str, optional
        A placer name (``heft``, ``m-etf``...), ``single:DEVICE`` or a placement JSON file. Its own
        op-level placement is a candidate; its collapse to the search's groups is the first sample.
    evaluator : {"simulator", "torch"}
        Simulate, or measure real steps (zoo models and modules only).
    out : str or path, optional
        The run folder: ``run.json`` (settings, written first), ``history.jsonl``, ``timing.jsonl``, ``checkpoint.json``
        (+ npz), and at the end ``placement.json``, ``summary.json`` and ``report.html`` (as the CLI writes it);
        ``run.json`` and ``summary.json`` then record the search's start (``search_start``: its name and step time).
    config : dataclass, dict or str, optional
        The strategy's config (e.g. :class:`postplace.search.PostConfig`), or a dict of field
        overrides (``{"lr": 0.05}``), or ``"paper"`` for Post.
    groups : int or None
        Number of groups to place (None: op-level).
    size : str
        Zoo model size (``full`` or ``small``).
    inputs, loss_fn
        Needed when ``target`` is an ``nn.Module``.
    map_all_to : str, optional
        With ``evaluator="torch"``: run every logical device on this torch device (e.g. ``cpu``).
    progress : bool
        Show a progress bar.
    confirm : int
        Measure the K best candidates for real and return the fastest measured (needs code to run).
    ray : str, optional
        ``"local"`` or a Ray address: evaluate the search's samples on Ray actors (one m only).
    microbatches : int, "auto" or None
        None (default): ``"auto"`` where the step can be traced again, else 1. ``"auto"``: answer
        over every count m (above). An int pins m (it must divide the batch).
    microbatch_colocation : {"none", "module"}
        ``none``: a layer's micro-batches may go to different devices (data parallelism);
        ``module``: they stay together (pipelines only).
    targets : tensor or tuple of tensors, optional
        A module's labels: the loss is ``loss_fn(outputs, *targets)``, they are split with the inputs
        into micro-batches, and the placed step takes new ones each call (``step(inputs, targets)``).
        Without them a module is placed at m = 1 only, and a loss that closed over its labels is
        warned about (every step would train on those).
    optimizer : str, torch.optim class, (class, kwargs) or factory
        The update the step ends with (:mod:`postplace.graph.optimizers`): ``"sgd"`` (default: lr 0.1,
        momentum 0.9, the paper zoo's), ``"adam"``, ``"adamw"``, ``torch.optim.AdamW``,
        ``(torch.optim.AdamW, {"lr": 3e-4})``, or ``params -> Optimizer`` (param groups kept).
        Its state (Adam's two moments) is memory the placement must fit.
    lr : float, optional
        The learning rate of a named optimizer or class.
    precision : {"fp32", "bf16", "fp16"}
        ``bf16``/``fp16``: the forward pass runs under ``torch.autocast`` in that dtype with fp32
        master weights; each op is priced at its device's peak for the dtype it runs in.
    report : bool
        Write ``report.html`` into ``out`` (a report that cannot be drawn is a warning, never a failed run).

    Returns
    -------
    PlaceResult

    Raises
    ------
    PostplaceError
        Bad input (one clear line), or when no candidate is feasible.
    KeyboardInterrupt
        When interrupted; the run folder then resumes with :func:`resume`.

    Examples
    --------
    >>> import postplace
    >>> from postplace.graph import OpGraph
    >>> g = OpGraph.build(["a", "b", "c"], [(0, 1, 1e6), (1, 2, 1e6)], flops=[1e9, 4e9, 1e9], name="tiny")
    >>> r = postplace.place(g, "k80x2", budget=48, groups=None)
    >>> r
    PlaceResult('tiny' on 'k80x2': search, 2.173 ms simulated)
    >>> r.mapping()
    {'a': 'gpu0', 'b': 'gpu0', 'c': 'gpu0'}

    A chain gains nothing from a second GPU: the step time is one K80 die's 6 GFLOP at its peak, plus its
    launch overhead for each of the 3 ops:

    >>> gpu = r.cluster.devices[r.cluster.device_index("gpu0")]
    >>> (gpu.peak_flops, gpu.launch_overhead)
    (2800000000000.0, 1e-05)
    >>> abs(r.step_time_s - ((1e9 + 4e9 + 1e9) / 2.8e12 + 3 * 1e-5)) < 1e-15
    True
    """
    m_mode = _microbatch_mode(target, microbatches, microbatch_colocation, evaluator, confirm or ray, targets,
                              _batch_of(target, size, inputs))
    if m_mode == "auto":
        return _place_over_m(target, cluster, out=out, strategy=strategy, budget=budget, seed=seed, pins=pins,
                             exclude=exclude, warm_start=warm_start, config=config, groups=groups, size=size,
                             inputs=inputs, loss_fn=loss_fn, targets=targets, colocation=microbatch_colocation,
                             progress=progress, evaluator=evaluator, confirm=confirm, ray=ray,
                             map_all_to=map_all_to, step={"optimizer": optimizer, "lr": lr, "precision": precision},
                             report=report)  # fmt: skip
    tgt = load_target(target, size=size, inputs=inputs, loss_fn=loss_fn, microbatches=m_mode,
                      microbatch_colocation=microbatch_colocation, targets=targets, optimizer=optimizer, lr=lr,
                      precision=precision)  # fmt: skip
    c, cluster_spec = _load_cluster(cluster, tgt.graph)
    settings = _settings(tgt, c, cluster_spec, strategy=strategy, budget=budget, seed=seed, pins=pins,
                         exclude=exclude, warm_start=warm_start, evaluator=evaluator, config=config, groups=groups,
                         size=size, map_all_to=map_all_to, confirm=confirm)  # fmt: skip
    settings.update(microbatches=m_mode, microbatch_colocation=microbatch_colocation)
    if microbatches is None and m_mode == 1 and tgt.spec["kind"] in ("zoo", "module") and (
            evaluator != "simulator" or confirm or ray is not None):  # fmt: skip
        settings["microbatch_note"] = ("one micro-batch count only: --evaluator torch, --confirm and --ray run one "
                                       "search; m = 1 was placed (pin another with --microbatches M)")  # fmt: skip
    elif microbatches is None and tgt.spec["kind"] == "module" and targets is None:
        settings["microbatch_note"] = ("placed at m = 1 only: give targets= (and a loss_fn(outputs, *targets)) to "
                                       "weigh micro-batch counts, data parallelism and pipelines")  # fmt: skip
    result = _run(settings, tgt, c, out=None if out is None else Path(out), resume=False, progress=progress,
                  confirm_k=confirm, ray=ray)  # fmt: skip
    return _with_report(result, out, report)


def _with_report(result: PlaceResult, out, report: bool) -> PlaceResult:
    """The run folder's report, drawn as the CLI draws it; one that cannot be drawn is a warning."""
    if out is None or not report:
        return result
    import warnings

    from postplace.report import write_report

    try:
        result.report = Path(write_report(Path(out), graph=result.graph, cluster=result.cluster))
    except PostplaceError as exc:
        warnings.warn(f"no report for {out}: {exc}", stacklevel=3)
    return result


def _microbatch_mode(target, microbatches, colocation: str, evaluator: str, confirm, targets,
                     batch: int | None) -> int | str:
    """``"auto"`` (the default where the step can be traced again: a zoo model, a module with
    ``targets``) or the pinned count; refuses what cannot be done, in one line, before any search."""
    from postplace.graph import OpGraph

    if colocation not in ("none", "module"):
        raise PostplaceError(f"--microbatch-colocation '{colocation}': use none or module")
    traceable = not isinstance(target, OpGraph) and not (isinstance(target, str | Path) and Path(str(target)).exists())
    if isinstance(target, str | Path) and traceable:
        from postplace import zoo

        traceable = str(target) in zoo.MODELS
    elif traceable:
        traceable = targets is not None
    measured = evaluator != "simulator" or bool(confirm)
    if microbatches is None:
        return "auto" if traceable and not measured else 1
    if microbatches == "auto":
        if not traceable:
            raise PostplaceError("--microbatches auto traces the step again at each count: give a zoo model name, "
                                 "or an nn.Module with targets=; a graph file is one traced step")  # fmt: skip
        if measured:
            raise PostplaceError("--microbatches auto runs a search per count, in simulation: drop --evaluator "
                                 "torch / --confirm / --ray, or pin a count with --microbatches M")  # fmt: skip
        return "auto"
    if isinstance(microbatches, bool) or not isinstance(microbatches, int | np.integer) or microbatches < 1:
        raise PostplaceError(f"--microbatches {microbatches!r}: give a count (1, 2, 4...) or 'auto'")
    if batch is not None and batch % int(microbatches):
        raise PostplaceError(f"--microbatches {microbatches} does not divide the batch of {batch}; give a divisor "
                             "of it, or auto")  # fmt: skip
    return int(microbatches)


def _place_over_m(target, cluster, *, out, size, inputs, loss_fn, targets, colocation, progress, evaluator, confirm,
                  ray, map_all_to, step, report, **kw) -> PlaceResult:  # fmt: skip
    """Trace the step at every count of :func:`postplace.over_m.microbatch_counts` and answer over all."""
    from postplace.over_m import fitting_count, microbatch_counts, trace_counts

    if ray is not None:
        raise PostplaceError("--ray runs one search; over several micro-batch counts it is not wired: "
                             "pin a count with --microbatches M")  # fmt: skip
    batch = _batch_of(target, size, inputs)
    if batch is None:
        raise PostplaceError("--microbatches auto: the batch size is unknown (inputs have no dim 0); "
                             "pin a count with --microbatches M")  # fmt: skip
    first = load_target(target, size=size, inputs=inputs, loss_fn=loss_fn, targets=targets, **step)
    c, cluster_spec = _load_cluster(cluster, first.graph)
    gpus = sum(dv.kind == "gpu" for dv in c.devices)
    more, skipped = trace_counts(lambda m: load_target(target, size=size, inputs=inputs, loss_fn=loss_fn,
                                                       microbatches=m, microbatch_colocation=colocation,
                                                       targets=targets, **step),
                                 microbatch_counts(batch, gpus, fitting_count(first.graph, c))[1:])  # fmt: skip
    targets_by_m = {1: first, **more}
    settings = _settings(first, c, cluster_spec, evaluator=evaluator, map_all_to=map_all_to, confirm=confirm, size=size,
                         **kw)  # fmt: skip
    settings.update(microbatches="auto", microbatch_colocation=colocation, microbatch_counts=sorted(targets_by_m),
                    microbatch_skipped=skipped,
                    graph_shas={str(m): fingerprint(t.graph) for m, t in targets_by_m.items()})  # fmt: skip
    result = _run_over_m(settings, targets_by_m, c, out=None if out is None else Path(out), resume=False,
                         progress=progress)  # fmt: skip
    return _with_report(result, out, report)


def _run_over_m(settings, targets_by_m, c, *, out, resume, progress, confirm=0, ray=None) -> PlaceResult:
    from postplace.over_m import place_over_m
    from postplace.search.runner import CHECKPOINT

    if confirm or ray is not None:
        raise PostplaceError("--confirm and --ray run one micro-batch count; this run answers over several: "
                             "start a new run with --microbatches M")  # fmt: skip
    if out is not None and not resume and ((out / SETTINGS).exists()
                                           or any((out / f"m{m}" / CHECKPOINT).exists() for m in targets_by_m)):
        raise PostplaceError(f"{out} already holds a run; pass --resume {out} to continue it, or pick a new --out")

    def start() -> None:  # once every count's constraints and warm start passed: a bad flag writes nothing
        if out is None:
            return
        make_folder(out)
        for m, t in targets_by_m.items():
            if t.spec["kind"] in ("graph", "module") and not (out / f"m{m}" / "graph.json").exists():
                make_folder(out / f"m{m}")
                t.graph.save(out / f"m{m}" / "graph.json")
        _write_settings(out, settings)

    res = place_over_m(settings, targets_by_m, c, out=out, resume=resume, progress=progress, start=start)
    if out is not None:
        _record_start(out, settings, res.summary)
    return res


def resume(out: str | Path, *, budget: int | str | None = None, graph=None, cluster=None, progress: bool = False,
           confirm: int = 0, ray: str | None = None, report: bool = True, **given) -> PlaceResult:  # fmt: skip
    """Continue the run saved in ``out`` (from any working directory) with its recorded settings.

    A run killed before its first checkpoint starts over with the recorded settings.

    Parameters
    ----------
    out : str or path
        The run folder :func:`place` wrote (its ``run.json``).
    budget : int or str, optional
        Extend a finished run to that many samples (or seconds); never fewer samples than it holds.
        A run over several micro-batch counts splits its budget when it starts and cannot be extended.
    graph, cluster : optional
        Needed only for a run started from an in-memory object (a graph it did not save, a Cluster).
    progress : bool
        Show a progress bar.
    confirm : int
        Measure the K best candidates for real, as :func:`place` does.
    ray : str, optional
        ``"local"`` or a Ray address, as :func:`place` takes it.
    report : bool
        Draw ``report.html`` at the end, as :func:`place` does.
    **given
        Any other setting of :func:`place` (``strategy=``, ``seed=``...): it must equal the recorded one.

    Returns
    -------
    PlaceResult
        As :func:`place` returns it, over every sample of the run.

    Raises
    ------
    PostplaceError
        When ``out`` is not a run folder (or its ``run.json`` or checkpoint is damaged, edited or from
        another run), a given setting differs from the recorded one, ``budget`` is below the samples
        already taken, or the graph or cluster is not the one the run was started with.

    Examples
    --------
    >>> import postplace, tempfile
    >>> from postplace.graph import OpGraph
    >>> g = OpGraph.build(["a", "b", "c"], [(0, 1, 1e6), (1, 2, 1e6)], flops=[1e9, 4e9, 1e9], name="tiny")
    >>> out = tempfile.mkdtemp()
    >>> r = postplace.place(g, "k80x2", budget=48, groups=None, out=out, report=False)
    >>> r.summary["samples"]
    48
    >>> r = postplace.resume(out, budget=96, report=False)
    >>> r.summary["samples"], r.returned
    (96, 'search')
    """
    return _with_report(_resume(Path(out), budget, graph, cluster, progress, confirm, ray, given), out, report)


def _resume(out: Path, budget, graph, cluster, progress: bool, confirm, ray, given: dict) -> PlaceResult:
    from postplace.search import Budget
    from postplace.search.runner import CHECKPOINT

    settings = read_settings(out)
    _check_given(out, settings, given)
    if settings.get("microbatches") != "auto" and (out / CHECKPOINT).exists():
        _check_checkpoint_settings(out, settings)
    if budget is not None:
        new = Budget.parse(budget)
        old = Budget.parse(settings["budget"])
        if new.samples is not None and (out / CHECKPOINT).exists():
            from postplace.search.runner import checkpoint_samples

            done = checkpoint_samples(out)
            if new.samples < done:
                raise PostplaceError(f"--budget {budget}: the run in {out} already has {done} samples")
        if new != old:  # the old budget is kept: a checkpoint from before the extension still belongs here
            settings["budgets_before"] = [*settings.get("budgets_before", []), settings["budget"]]
            settings["budget"] = _budget_text(new)
    spec = settings["target"]
    if settings.get("microbatches") == "auto":
        if settings["budget"] != read_settings(out)["budget"]:
            raise PostplaceError(f"--budget {budget}: a run over several micro-batch counts splits its budget when it "
                                 "starts and cannot be extended; start a new run with the larger budget")  # fmt: skip
        return _resume_over_m(out, settings, cluster, progress, confirm, ray)
    if spec["kind"] == "file":
        tgt = load_target(spec["path"])
    elif spec["kind"] == "zoo":
        tgt = load_target(spec["name"], size=spec["size"], microbatches=spec.get("microbatches", 1),
                          microbatch_colocation=spec.get("microbatch_colocation", "none"),
                          **_recorded_step(spec))  # fmt: skip
    elif graph is not None:
        tgt = Target(graph, None, spec)
    elif (out / "graph.json").exists():
        tgt = load_target(out / "graph.json")
        tgt.spec = spec
    else:
        raise PostplaceError(f"{out}: the run was started from an in-memory graph; pass graph= to resume it")
    if fingerprint(tgt.graph) != settings["graph_sha"]:
        raise PostplaceError(f"{out}: the graph is not the one this run was started with (its file changed?)")
    c = _recorded_cluster(out, settings, cluster, tgt.graph)
    return _run(settings, tgt, c, out=out, resume=True, progress=progress, confirm_k=confirm, ray=ray)


def _check_checkpoint_settings(out: Path, settings: dict) -> None:
    """The checkpoint was written under these settings (its ``settings_checksum``), or under the same
    ones before a budget extension (``budgets_before``): a checkpoint of another seed, grouping or
    strategy would be continued as if it were this run's."""
    from postplace.search.runner import CHECKPOINT, read_meta

    meta = read_meta(out)
    want = meta.get("settings_checksum") if isinstance(meta, dict) else meta
    if want is None:  # a folder from before checkpoints recorded it
        return
    before = settings.get("budgets_before", [])
    accepted = {_checksum(settings)}
    for k, b in enumerate(before):
        older = {**settings, "budget": b, "budgets_before": before[:k]}
        if not k:
            older.pop("budgets_before")
        accepted.add(_checksum(older))
    if want not in accepted:
        raise PostplaceError(f"{out}/{CHECKPOINT} was written under other settings than {out}/{SETTINGS} (one of "
                             "them edited, or copied from another run); start a new run")  # fmt: skip


def _recorded_cluster(out: Path, settings: dict, cluster, graph):
    """The cluster a run was started with (``cluster`` where it was in memory), checked against its fingerprint."""
    if cluster is None:
        if settings["cluster_spec"] is None:
            raise PostplaceError(f"{out}: the run was started with an in-memory cluster; pass cluster= to resume it")
        cluster = settings["cluster_spec"]
    c, _ = _load_cluster(cluster, graph)
    if fingerprint(c) != settings["cluster_sha"]:
        raise PostplaceError(f"{out}: the cluster is not the one this run was started with (its file changed?)")
    return c


def _resume_over_m(out: Path, settings: dict, cluster, progress: bool, confirm, ray) -> PlaceResult:
    spec, shas = settings["target"], settings.get("graph_shas")
    counts = settings.get("microbatch_counts")
    if (not isinstance(counts, list) or not counts or any(type(m) is not int or m < 1 for m in counts)
            or not isinstance(shas, dict) or sorted(shas) != sorted(str(m) for m in counts)):  # fmt: skip
        raise PostplaceError(f"{out}/{SETTINGS}: its micro-batch counts are damaged; start a new run")
    targets_by_m = {}
    for m in counts:
        if spec["kind"] == "zoo":
            tgt = load_target(spec["name"], size=spec["size"], microbatches=m,
                              microbatch_colocation=settings["microbatch_colocation"],
                              **_recorded_step(spec))  # fmt: skip
        elif (out / f"m{m}" / "graph.json").exists():
            own = spec if m == 1 else {**spec, "microbatches": m,
                                       "microbatch_colocation": settings["microbatch_colocation"]}  # fmt: skip
            tgt = Target(load_target(out / f"m{m}" / "graph.json").graph, None, own)
        else:
            raise PostplaceError(f"{out}: m{m}/graph.json is missing; the run cannot be resumed, start a new one")
        if fingerprint(tgt.graph) != shas[str(m)]:
            raise PostplaceError(f"{out}: the graph at {m} micro-batches is not the one this run was started with")
        targets_by_m[m] = tgt
    c = _recorded_cluster(out, settings, cluster, targets_by_m[counts[0]].graph)
    return _run_over_m(settings, targets_by_m, c, out=out, resume=True, progress=progress, confirm=confirm, ray=ray)


def _resolved(value) -> str:
    p = Path(str(value))
    return str(p.resolve()) if p.exists() else str(value)


def _check_given(out: Path, settings: dict, given: dict) -> None:
    """Settings given again with --resume must equal the recorded ones (``budget`` aside)."""
    if {"optimizer", "lr"} & set(given):
        _check_same_optimizer(settings["target"].get("optimizer", "sgd"), given.pop("optimizer", None),
                              given.pop("lr", None), f"--resume {out}: the run")  # fmt: skip
    for key, value in given.items():
        if key == "precision":
            recorded = settings["target"].get("precision", "fp32")
            if value != recorded:
                raise PostplaceError(f"--resume {out}: the run was started with precision {recorded}, not {value}; "
                                     "drop the flag or start a new run")  # fmt: skip
            continue
        if key == "config":
            cfg = _jsonable(dataclasses.asdict(_config(settings["strategy"], value)))
            for field_ in value:
                if _norm(cfg[field_]) != _norm(settings["config"].get(field_)):
                    raise PostplaceError(f"--resume {out}: the run was started with {field_}="
                                         f"{settings['config'].get(field_)!r}, not {cfg[field_]!r}; drop the "
                                         "setting or start a new run")  # fmt: skip
            continue
        if key == "target":
            spec = settings["target"]
            recorded, value = spec.get("path") or spec.get("name"), _resolved(value)
        elif key == "cluster":
            recorded, value = settings["cluster_spec"], _resolved(value)
        elif key == "warm_start":
            recorded, value = settings["warm_start"], None if value is None else _resolved(value)
        elif key in ("microbatches", "microbatch_colocation"):
            recorded = settings.get(key, settings["target"].get(key, 1 if key == "microbatches" else "none"))
            if value is None:  # not given: the default
                continue
        elif key in settings:
            recorded = settings[key]
        else:
            raise PostplaceError(f"resume: unknown setting '{key}'")
        if _norm(value) != _norm(recorded):
            raise PostplaceError(f"--resume {out}: the run was started with {key} {recorded!r}, not {value!r}; "
                                 "drop the flag or start a new run")


def _norm(v):
    if isinstance(v, tuple | list):
        return [_norm(x) for x in v]
    return str(v) if isinstance(v, Path) else v


def read_settings(out: str | Path) -> dict:
    """The settings a run folder was started with (``run.json``)."""
    path = Path(out) / SETTINGS
    if not path.exists():
        raise PostplaceError(f"{out}: not a postplace run folder (no {SETTINGS}); start a run with --out {out}")
    try:
        s = json.loads(path.read_bytes().decode("utf-8"))
    except (OSError, UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise PostplaceError(f"{path}: damaged run settings ({type(exc).__name__}); start a new run") from None
    needed = ("format", "target", "graph_sha", "cluster_sha", "cluster_spec", "strategy", "budget", "seed",
              "groups", "pins", "exclude", "warm_start", "evaluator", "map_all_to", "config", "checksum")  # fmt: skip
    if not isinstance(s, dict) or s.get("format") != "postplace-run" or any(k not in s for k in needed):
        raise PostplaceError(f"{path}: not a postplace run settings file; start a new run")
    body = {k: v for k, v in s.items() if k != "checksum"}
    if _checksum(body) != s["checksum"]:
        raise PostplaceError(f"{path}: its checksum does not match its content (edited or damaged); start a new run")
    _check_start_record(path, body)
    body = {k: v for k, v in body.items() if k not in START_KEYS}  # what the search found, not a setting
    _check_settings(path, body)
    return body


def _search_start(strategy) -> dict:
    """The search's start as run.json and summary.json record it: ``{"name", "step_time_s"}``, from the
    strategy's ``start_name`` and ``start_step_time`` (None where it has none, or did not probe)."""
    name, step = getattr(strategy, "start_name", None), getattr(strategy, "start_step_time", None)
    return {"name": None if name is None else str(name), "step_time_s": None if step is None else float(step)}


def _record_start(out: Path, settings: dict, summary: dict) -> None:
    """Rewrite run.json with the search's start (:data:`START_KEYS` of ``summary``) beside the settings,
    under one checksum; the settings' own checksum (the checkpoints') stays that of the settings alone."""
    _write_settings(out, {**settings, **{k: summary[k] for k in START_KEYS if k in summary}})


def _check_start_record(path: Path, s: dict) -> None:
    """The start run.json recorded: ``{"name": text or null, "step_time_s": a number >= 0 or null}``, per
    micro-batch count (``{"1": ...}``) in ``search_start_per_microbatches``."""
    import math

    def ok(v) -> bool:
        step = v.get("step_time_s") if isinstance(v, dict) else None
        return (isinstance(v, dict) and (v.get("name") is None or isinstance(v["name"], str))
                and (step is None or (isinstance(step, int | float) and not isinstance(step, bool)
                                      and math.isfinite(step) and step >= 0)))  # fmt: skip

    if "search_start" in s and not ok(s["search_start"]):
        raise PostplaceError(f"{path}: field 'search_start' is not a start's name and step time (edited or "
                             "damaged); start a new run")  # fmt: skip
    per = s.get("search_start_per_microbatches", {})
    if not isinstance(per, dict) or not all(isinstance(m, str) and m.isdigit() and ok(v) for m, v in per.items()):
        raise PostplaceError(f"{path}: field 'search_start_per_microbatches' is not a start per micro-batch "
                             "count (edited or damaged); start a new run")  # fmt: skip


def _check_settings(path: Path, s: dict) -> None:
    """Every field of a run's settings as if it came from the command line: type, range, and agreement
    between fields. A checksum proves only that the file is whole, not that an edit made sense."""
    from postplace import validate
    from postplace.graph.opgraph import PRECISIONS

    def bad(key: str, why: str):
        shown = json.dumps(_get_path(s, key), default=str)
        shown = shown if len(shown) <= 60 else shown[:57] + "..."
        return PostplaceError(f"{path}: field '{key}' is {shown}; {why} (edited or damaged); start a new run")

    def text(key: str, *, optional: bool = False, choices=None) -> None:
        v = _get_path(s, key)
        if v is None and optional:
            return
        if not isinstance(v, str) or not v:
            raise bad(key, "it must be a non-empty string" + (" or null" if optional else ""))
        if choices is not None and v not in choices:
            raise bad(key, f"it must be one of {', '.join(map(str, choices))}")

    def integer(key: str, minimum: int) -> None:
        v = _get_path(s, key)
        if isinstance(v, bool) or not isinstance(v, int) or not minimum <= v <= validate.INT64_MAX:
            raise bad(key, f"it must be an integer >= {minimum}")

    if s.get("version", 1) != 1 or type(s.get("version", 1)) is not int:  # absent: a folder from before it
        raise bad("version", "this postplace reads version 1")
    target = s["target"]
    if not isinstance(target, dict):
        raise bad("target", "it must be an object saying what was placed")
    text("target.kind", choices=("file", "zoo", "graph", "module"))
    kind = target["kind"]
    if kind == "file":
        text("target.path")
    if kind == "zoo":
        text("target.name")
        text("target.size")
    if "optimizer" in target:
        _check_optimizer_record(target["optimizer"], bad)
    if "precision" in target:
        text("target.precision", choices=PRECISIONS)
    for key in ("graph", "cluster", "size"):
        if key in s and not isinstance(s[key], str):
            raise bad(key, "it must be a string")
    for key in ("graph_sha", "cluster_sha"):
        v = s[key]
        if not isinstance(v, str) or len(v) != 16 or any(c not in "0123456789abcdef" for c in v):
            raise bad(key, "it must be 16 hexadecimal digits")
    text("cluster_spec", optional=True)
    text("strategy")
    if not isinstance(s["budget"], str):
        raise bad("budget", "it must be a budget as text (2400, 60s)")
    try:
        from postplace.search import Budget

        budget = Budget.parse(s["budget"])
    except PostplaceError:
        raise bad("budget", "it must be a number of samples (2400) or a time (60s)") from None
    if budget.samples is not None and budget.samples > validate.INT64_MAX:
        raise bad("budget", "it must fit 64 bits")
    integer("seed", 0)
    if s["groups"] is not None:
        integer("groups", 1)
    for key in ("pins", "exclude"):
        if not isinstance(s[key], list) or not all(isinstance(x, str) and x for x in s[key]):
            raise bad(key, "it must be a list of strings")
    text("warm_start", optional=True)
    text("evaluator", choices=EVALUATORS)
    text("map_all_to", optional=True)
    if not isinstance(s["config"], dict):
        raise bad("config", "it must be an object of the strategy's config fields")
    if s.get("microbatch_note") is not None and not isinstance(s["microbatch_note"], str):
        raise bad("microbatch_note", "it must be text or null")
    if "microbatch_colocation" in s:
        text("microbatch_colocation", choices=("none", "module"))
    if "microbatch_colocation" in target:
        text("target.microbatch_colocation", choices=("none", "module"))
    spec_m = target.get("microbatches", 1)
    if isinstance(spec_m, bool) or not isinstance(spec_m, int) or spec_m < 1:
        raise bad("target.microbatches", "it must be an integer >= 1")
    m = s.get("microbatches", spec_m)
    if m == "auto":
        if kind in ("file", "graph") or "microbatches" in target:
            raise bad("microbatches", f"a run over micro-batch counts needs a target traced again, not a '{kind}' one")
        counts, shas, skipped = s.get("microbatch_counts"), s.get("graph_shas"), s.get("microbatch_skipped", {})
        if (not isinstance(counts, list) or not counts or any(type(k) is not int or k < 1 for k in counts)
                or counts != sorted(set(counts)) or counts[0] != 1
                or any(k & (k - 1) or k > 1 << 20 for k in counts)):  # fmt: skip
            raise bad("microbatch_counts", "it must be the counts 1, 2, 4... the run traced, in order")
        if (not isinstance(shas, dict) or sorted(shas) != sorted(str(k) for k in counts)
                or not all(isinstance(v, str) for v in shas.values())):  # fmt: skip
            raise bad("graph_shas", "it must hold one graph fingerprint per micro-batch count")
        if not isinstance(skipped, dict) or not all(isinstance(v, str) for v in skipped.values()):
            raise bad("microbatch_skipped", "it must map counts to the reason each was left out")
    elif isinstance(m, bool) or not isinstance(m, int) or m != spec_m:
        raise bad("microbatches", f"it must be 'auto' or the count the target was traced at ({spec_m})")
    elif "microbatch_counts" in s or "graph_shas" in s:
        raise bad("microbatches", "a run with micro-batch counts records 'auto'")
    before = s.get("budgets_before", [])
    if not isinstance(before, list) or not all(isinstance(b, str) for b in before):
        raise bad("budgets_before", "it must be a list of budgets as text")


def _check_optimizer_record(record, bad) -> None:
    """The optimizer a zoo or module run recorded: a name, or ``{"name", "groups": [{hyperparameters}]}``
    whose numbers are finite."""
    import math

    names = ("sgd", "adam", "adamw")
    if isinstance(record, str):
        if record.lower() not in names:
            raise bad("target.optimizer", f"it must be one of {', '.join(names)}")
        return
    ok = isinstance(record, dict) and record.get("name") in names and isinstance(record.get("groups"), list) \
        and len(record["groups"]) == 1 and isinstance(record["groups"][0], dict)  # fmt: skip

    def finite(v) -> bool:
        if isinstance(v, list):
            return all(finite(x) for x in v)
        return isinstance(v, bool) or (isinstance(v, int | float) and math.isfinite(v) and v >= 0)

    if not ok or not all(isinstance(k, str) and finite(v) for k, v in record["groups"][0].items()):
        raise bad("target.optimizer", "it must be the optimizer postplace recorded (a name, or its finite, "
                                      "non-negative hyperparameters)")  # fmt: skip


def _get_path(d, key: str):
    for part in key.split("."):
        d = d.get(part) if isinstance(d, dict) else None
    return d


def _checksum(body: dict) -> str:
    from postplace.search.state_io import settings_checksum

    return settings_checksum(body)


def _settings(tgt, c, cluster_spec, *, strategy, budget, seed, pins, exclude, warm_start, evaluator, config, groups,
              size, map_all_to, confirm=0) -> dict:  # fmt: skip
    from postplace.search import Budget

    if isinstance(seed, bool) or not isinstance(seed, int | np.integer) or seed < 0:
        raise PostplaceError(f"seed {seed!r}: give an integer >= 0")
    if groups is not None and (isinstance(groups, bool) or not isinstance(groups, int | np.integer) or groups < 1):
        raise PostplaceError(f"groups {groups!r}: give a positive integer, or None for op-level placement")
    if evaluator not in EVALUATORS:
        raise PostplaceError(f"evaluator '{evaluator}': use simulator or torch")
    if evaluator != "torch" and map_all_to is not None and not confirm:
        raise PostplaceError("--map-all-to only applies to measured runs (--evaluator torch or --confirm K)")
    if evaluator == "torch" and tgt.spec["kind"] not in ("zoo", "module"):
        raise PostplaceError("--evaluator torch needs a zoo model name or an nn.Module as TARGET "
                             "(a graph file has no code to run)")  # fmt: skip
    for name, seq in (("pins", pins), ("exclude", exclude)):
        if isinstance(seq, str) or not all(isinstance(x, str) for x in seq):
            raise PostplaceError(f"{name} must be a list of strings")
    budget_text = _budget_text(budget if hasattr(budget, "samples") else Budget.parse(budget))
    cfg = _config(strategy, config)
    if warm_start is not None and Path(str(warm_start)).exists():
        warm_start = str(Path(str(warm_start)).resolve())  # a run folder resumes from any directory
    return {
        "format": "postplace-run", "version": 1, "target": tgt.spec, "graph": tgt.graph.name,
        "graph_sha": fingerprint(tgt.graph), "cluster": c.name, "cluster_spec": cluster_spec,
        "cluster_sha": fingerprint(c), "strategy": strategy, "budget": budget_text, "seed": int(seed),
        "groups": None if groups is None else int(groups), "size": size, "pins": list(pins),
        "exclude": list(exclude), "warm_start": None if warm_start is None else str(warm_start),
        "evaluator": evaluator, "map_all_to": map_all_to, "config": _jsonable(dataclasses.asdict(cfg)),
    }  # fmt: skip


def _budget_text(b) -> str:
    return f"{b.samples}" if b.samples is not None else f"{b.seconds:g}s"


def _jsonable(d: dict) -> dict:
    return {k: list(v) if isinstance(v, tuple) else v for k, v in d.items()}


def _config(strategy: str, config):
    """The strategy's full config dataclass from ``config`` (None, "paper", a dict of overrides, or an instance)."""
    from postplace.search import STRATEGIES, make_strategy
    from postplace.search.config import build_config, config_class

    if strategy not in STRATEGIES:
        make_strategy(strategy, None)  # raises the one-line "unknown strategy" error
    if config is None:
        return build_config(strategy)
    if config == "paper":
        if strategy not in ("post", "post-paper"):
            raise PostplaceError("config 'paper' is Post's; use strategy post or post-paper")
        return config_class("post-paper")[1]
    if isinstance(config, dict):
        return build_config(strategy, config, source="config")
    cls, _ = config_class(strategy)
    if not isinstance(config, cls):
        raise PostplaceError(f"config for '{strategy}' must be a {cls.__name__}, not a {type(config).__name__}")
    return config


def _strategy(settings: dict, space):
    from postplace.search import make_strategy
    from postplace.search.config import build_config

    cfg = build_config(settings["strategy"], settings["config"], source="config")
    init = getattr(cfg, "init", None)
    units = space.allowed.shape[0]
    if isinstance(init, list | tuple) and len(init) != units:
        raise PostplaceError(f"config init: a start placement needs one device id per unit ({units} here), not "
                             f"{len(init)}; use init=random or give {units} ids")  # fmt: skip
    try:
        return make_strategy(settings["strategy"], space, seed=settings["seed"], config=cfg)
    except (ValueError, ZeroDivisionError) as exc:
        raise PostplaceError(f"config of '{settings['strategy']}': {exc}") from None


def _torch_evaluator(settings: dict, tgt: Target, c, problem):
    from dataclasses import replace

    judge = _measurer(settings, tgt, c, group_of_op=problem.grouping.group_of_op)
    # measured seconds can exceed the simulator's bound: failures must still score worst
    space = replace(problem.space, failure_step_time=max(problem.space.failure_step_time, judge.failure_step_time))
    return judge, space


def _measurer(settings: dict, tgt: Target, c, *, group_of_op=None):
    """The in-process TorchEvaluator of the target's own code (a traced module or a zoo model), over
    ``group_of_op``'s units or, without it, at op level."""
    from postplace.runtime.evaluator import TorchEvaluator

    if tgt.traced is not None:
        return TorchEvaluator(tgt.traced, c, group_of_op=group_of_op, device_map=settings["map_all_to"])
    spec = tgt.spec
    return TorchEvaluator.for_zoo(spec["name"], spec["size"], c, group_of_op=group_of_op,
                                  device_map=settings["map_all_to"], graph=tgt.graph,
                                  microbatches=spec.get("microbatches", 1),
                                  colocation=spec.get("microbatch_colocation", "none"))  # fmt: skip


def warm_start_ops(spec: str, problem) -> np.ndarray:
    """The op-level placement of a warm start: a placer (run under the problem's constraints),
    ``single:DEVICE``, or a placement JSON file (which must respect the constraints)."""
    from postplace.placers import PLACERS
    from postplace.placers import place as run_placer
    from postplace.placers.single import on_device

    graph, c, allowed = problem.graph, problem.cluster, problem.op_allowed
    if spec.startswith("single:"):
        ops = on_device(graph, c, spec.split(":", 1)[1])
    elif spec in PLACERS:
        ops = run_placer(spec, graph, c, cost_model=problem.simulator.problem.cost_model, allowed=allowed)
    elif Path(spec).exists():
        from postplace.cluster.placement import from_mapping
        from postplace.graph.microbatch_names import placement_microbatches
        from postplace.validate import read_json

        d = read_json(spec)
        if not isinstance(d, dict):
            raise PostplaceError(f"{spec}: a placement file is one JSON object {{op name: device name}}")
        if placement_microbatches(d) == placement_microbatches(graph.names):
            ops = from_mapping(graph, c, d, source=str(spec))
        else:  # made at another micro-batch count
            ops = _mapped_placement(spec, d, graph, c)
    else:
        raise PostplaceError(f"--warm-start '{spec}': give a placer ({', '.join(PLACERS)}), single:DEVICE, "
                             "or a placement JSON file")  # fmt: skip
    bad = np.flatnonzero(~allowed[np.arange(graph.num_ops), ops])
    if bad.size:
        i = int(bad[0])
        raise PostplaceError(f"--warm-start {spec} puts op '{graph.names[i]}' on {c.device_names[ops[i]]}, which "
                             "--pin/--exclude (or its kinds) forbid; drop the warm start or the constraint")
    return ops


def _mapped_placement(spec: str, d: dict, graph, c) -> np.ndarray:
    """A placement file ``spec`` (read: ``d``) made for the same step at another micro-batch count (its
    op names say which), mapped to ``graph``: an op takes the device of the op of its own name, else of
    the op it copies (``mb3_conv`` -> ``conv``), else of that op's copy in the file's micro-batch
    ``k mod m_file``; colocation sets follow their
    first placed member, and an op still unplaced follows its first placed input, else its first
    placed consumer, else the first device its kinds allow. Refused in one line where even that
    leaves the placement invalid."""
    from postplace.cluster.placement import effective_kinds, invalid_reason
    from postplace.graph.microbatch_names import placement_microbatches
    from postplace.search.problem import pin_names

    m_file = placement_microbatches(d)
    dev = np.full(graph.num_ops, -1, dtype=np.int64)
    for i, (name, tmpl) in enumerate(zip(graph.names, pin_names(graph), strict=True)):
        k = int(graph.microbatch[i])
        got = d.get(name, d.get(tmpl, d.get(f"mb{k % m_file}_{tmpl}") if k >= 0 else None))
        if isinstance(got, str) and got in c.device_names:
            dev[i] = c.device_index(got)
    for members in graph.colocation_sets:
        placed = dev[members][dev[members] >= 0]
        if placed.size:
            dev[members] = placed[0]
    kinds = effective_kinds(graph)
    sets = {int(i): members for members in graph.colocation_sets for i in members}

    def follow(i: int, neighbours) -> None:
        placed = [int(dev[j]) for j in neighbours if dev[j] >= 0 and kinds[i] & c.kind_bits[dev[j]]]
        if placed:
            dev[sets.get(i, [i])] = placed[0]

    for i in range(graph.num_ops):  # stored in program order: inputs come first
        if dev[i] < 0:
            follow(i, graph.edge_src[graph.in_edges[graph.in_ptr[i]:graph.in_ptr[i + 1]]])
    for i in range(graph.num_ops - 1, -1, -1):  # sources no input placed (a micro-batch's labels): consumers
        if dev[i] < 0:
            follow(i, graph.edge_dst[graph.edge_src == i])
    for i in np.flatnonzero(dev < 0):
        ok = [e for e in range(c.num_devices) if kinds[i] & c.kind_bits[e]]
        dev[sets.get(int(i), [i])] = ok[0] if ok else 0
    reason = invalid_reason(graph, c, dev)
    if reason:
        raise PostplaceError(f"--warm-start {spec}: made for {m_file} micro-batch(es), it cannot be mapped to "
                             f"'{graph.name}' ({reason}); pin that count with --microbatches {m_file}")  # fmt: skip
    return dev


def _run(settings: dict, tgt: Target, c, *, out: Path | None, resume: bool, progress: bool, confirm_k: int = 0,
         ray: str | None = None) -> PlaceResult:  # fmt: skip
    from postplace.search import Budget, make_problem, run
    from postplace.search.runner import CHECKPOINT
    from postplace.sim import Simulator

    graph = tgt.graph
    problem = make_problem(graph, c, groups=settings["groups"], pins=settings["pins"], exclude=settings["exclude"],
                           seed=settings["seed"])  # fmt: skip
    space = problem.space
    judge = problem.simulator
    if settings["evaluator"] == "torch":
        judge, space = _torch_evaluator(settings, tgt, c, problem)
    if space is not problem.space:
        problem = dataclasses.replace(problem, space=space)
    _check_confirm(confirm_k, settings, tgt, out, ray)
    strat = _strategy(settings, space)
    search_judge = judge if ray is None else _ray_evaluator(ray, settings, tgt, c, problem)
    warm_ops = None if settings["warm_start"] is None else warm_start_ops(settings["warm_start"], problem)
    budget = Budget.parse(settings["budget"])
    restart = False
    if out is not None:
        if not resume and ((out / SETTINGS).exists() or (out / CHECKPOINT).exists()):
            raise PostplaceError(f"{out} already holds a run; pass --resume {out} to continue it, or pick a new --out")
        make_folder(out)
        if tgt.spec["kind"] in ("graph", "module") and not (out / "graph.json").exists():
            graph.save(out / "graph.json")
        _write_settings(out, settings)
        restart = resume and not (out / CHECKPOINT).exists()  # killed before its first checkpoint: start over
    t0 = time.perf_counter()
    try:
        result = run(strat, search_judge, budget, out_dir=out, resume=resume and not restart, progress=progress,
                     warm_start=None if warm_ops is None else problem.grouping.collapse(warm_ops),
                     meta={"settings_checksum": _checksum(settings)}, space=space)  # fmt: skip
    finally:
        if search_judge is not judge:
            search_judge.shutdown()
    if result.interrupted:
        raise KeyboardInterrupt
    cands = _candidates(settings, problem, judge, result, warm_ops)
    feasible = [k for k in cands if k.feasible]
    if not feasible:
        raise PostplaceError(
            f"no feasible placement found: the search sampled {result.samples} placements, all OOM or failed, "
            f"and no one-shot placer ({', '.join(CANDIDATE_PLACERS)}) found one that fits; try a larger --budget "
            "or a cluster with more memory"
        )
    best = min(feasible, key=lambda k: k.step_time_s)  # min keeps the first of equals: the search first
    confirmed = None
    if confirm_k:
        confirmed = _confirm(confirm_k, settings, tgt, c, problem, out, ray, cands)
        best = Candidate(f"confirmed:{confirmed.best.label}", confirmed.placement, confirmed.best.measured_s, True,
                         "measured by --confirm")  # fmt: skip
        judge = types.SimpleNamespace(name=confirmed.evaluator)  # the returned figure is measured: say so
    op_sim = Simulator(graph, c, cost_model=problem.simulator.problem.cost_model)
    sched = op_sim.schedule(best.placement)
    summary = _summary(settings, problem, judge, result, cands, best, sched, out, time.perf_counter() - t0,
                       start=_search_start(strat))  # fmt: skip
    summary["plan"] = _plan(graph, c, best.placement, problem.simulator.problem.cost_model, best.name)
    if confirmed is not None:
        summary["confirm"] = confirmed.to_dict()
        summary["figures"].update(search_best_step_time_s="simulated", single_device_step_time_s="simulated",
                                  candidates="simulated", search_start="simulated")  # fmt: skip
        summary["ratio_to_single_device"] = None  # a measured time over a simulated one means nothing
        judge = problem.simulator
    res = PlaceResult(graph, c, best.placement, best.name, best.step_time_s,
                      "torch" if confirmed is not None else judge.name, result,
                      None if result.best_placement is None else problem.grouping.expand(result.best_placement),
                      cands, problem.simulator.lower_bound, sched, summary, tgt.traced, tgt.spec)  # fmt: skip
    if out is not None:
        res.save(out)
        _record_start(out, settings, summary)
    return res


def _plan(graph, c, placement, cost_model, returned: str = "") -> str:
    from postplace.over_m import describe_plan

    times = np.asarray(cost_model.op_times(graph, c).table, dtype=np.float64)
    plan = describe_plan(graph, c, placement, np.where(np.isfinite(times), times, 0.0)[np.arange(graph.num_ops),
                                                                                       placement])
    if returned.startswith("sharded data-parallel"):  # replicated state would not fit: not plain DDP
        plan = plan.replace("data-parallel", "sharded data-parallel (each GPU holds its share of the state)")
    return plan


def _check_confirm(k: int, settings: dict, tgt: Target, out: Path | None, ray: str | None) -> None:
    """``--confirm K`` measures the K best of a simulated search: it needs code to run and a run folder."""
    if isinstance(k, bool) or not isinstance(k, int | np.integer) or k < 0:
        raise PostplaceError(f"--confirm {k!r}: give how many of the search's best placements to measure (0 = none)")
    if not k:
        return
    if settings["evaluator"] != "simulator":
        raise PostplaceError("--confirm measures a simulated search's best; with --evaluator torch every sample "
                             "is measured already: drop --confirm")  # fmt: skip
    if tgt.traced is None and tgt.spec.get("kind") != "zoo":
        raise PostplaceError("--confirm runs placements for real: give a zoo model name or an nn.Module target "
                             "(a graph file has no code to run)")  # fmt: skip
    if out is None:
        raise PostplaceError("--confirm reads the search's best placements from its run folder: pass out=DIR")
    if ray is not None and tgt.spec.get("kind") != "zoo":
        raise PostplaceError("--confirm with --ray needs a zoo model name (actors trace it themselves)")


def _ray_evaluator(address: str, settings: dict, tgt: Target, c, problem):
    """The search's evaluator on Ray actors (``--ray local`` or an address): the same answers, in parallel."""
    from postplace.distributed import RayEvaluator, SimulatorFactory, TorchZooFactory

    gop = problem.grouping.group_of_op
    if settings["evaluator"] == "torch":
        if tgt.spec.get("kind") != "zoo":
            raise PostplaceError("--ray with --evaluator torch needs a zoo model name (actors trace it themselves)")
        factory = TorchZooFactory(tgt.spec["name"], tgt.spec["size"], c, group_of_op=gop,
                                  device_map=settings["map_all_to"], microbatches=tgt.spec.get("microbatches", 1),
                                  colocation=tgt.spec.get("microbatch_colocation", "none"),
                                  **_recorded_step(tgt.spec))  # fmt: skip
    else:
        factory = SimulatorFactory(problem.graph, c, group_of_op=gop, cost_model=problem.simulator.problem.cost_model)
    return RayEvaluator(factory, address=address)


def _confirm(k: int, settings: dict, tgt: Target, c, problem, out: Path, ray: str | None, answer=()):
    """Measure the ``k`` best distinct candidates of the answer (the search's best placements from its
    cache and the one-shot candidates ``answer``: placers, data parallelism, pipeline, warm start, by
    simulated step time) and the best single device; the fastest measured wins."""
    from postplace.confirm import candidates_from_run
    from postplace.confirm import confirm as measure

    searched = candidates_from_run(out, problem.simulator, k)
    pool = []  # (simulated step time, order, label, op placement)
    if len(searched):
        times = problem.simulator.evaluate_ops(searched).step_time
        pool += [(float(t), i, f"search #{i + 1}", ops) for i, (t, ops) in enumerate(zip(times, searched, strict=True))]
    pool += [(k_.step_time_s, len(pool) + j, k_.name, k_.placement) for j, k_ in enumerate(answer)
             if k_.feasible and k_.name != "search" and not k_.name.startswith("single:")]  # fmt: skip
    pool.sort(key=lambda x: (x[0], x[1]))
    chosen, seen = [], set()
    for _t, _i, label, ops in pool:
        key = np.asarray(ops, dtype=np.int64).tobytes()
        if key not in seen:
            seen.add(key)
            chosen.append((label, ops))
        if len(chosen) == k:
            break
    cands = np.stack([ops for _, ops in chosen]) if chosen else np.zeros((0, tgt.graph.num_ops), dtype=np.int64)
    labels = [label for label, _ in chosen]
    if ray is not None:  # a zoo model: _check_confirm refused a module before the search
        from postplace.distributed import RayEvaluator, TorchZooFactory

        measurer = RayEvaluator(TorchZooFactory(tgt.spec["name"], tgt.spec["size"], c,
                                                device_map=settings["map_all_to"],
                                                microbatches=tgt.spec.get("microbatches", 1),
                                                colocation=tgt.spec.get("microbatch_colocation", "none")),
                                address=ray)  # fmt: skip
    else:
        measurer = _measurer(settings, tgt, c)
    try:
        return measure(problem.simulator, measurer, cands, allowed=problem.op_allowed, labels=labels or None)
    finally:
        if hasattr(measurer, "shutdown"):
            measurer.shutdown()


def _write_settings(out: Path, settings: dict) -> None:
    data = {**settings, "checksum": _checksum(settings)}
    tmp = out / (SETTINGS + ".tmp")
    tmp.write_text(json.dumps(data, indent=1))
    tmp.replace(out / SETTINGS)


def _candidates(settings, problem, judge, result, warm_ops) -> list[Candidate]:
    """The search's own best first, then every one-shot candidate (:func:`oneshot_candidates`)."""
    return [search_candidate(problem, result), *oneshot_candidates(settings, problem, judge, warm_ops)]


def search_candidate(problem, result) -> Candidate:
    if result.best_placement is not None:
        return Candidate("search", problem.grouping.expand(result.best_placement), result.best_step_time, True)
    return Candidate("search", None, None, False, "no feasible sample")


def oneshot_candidates(settings, problem, judge, warm_ops) -> list[Candidate]:
    """The warm start's own placement, data parallelism (a micro-batched graph: micro-batch k on GPU k,
    judged OOM where the replicated state does not fit), the GPipe-style pipeline (the fastest of 2,
    4... stages) and the memory-aware placers, each under the problem's pins and exclusions, judged by
    ``judge``; failed and OOM ones carry a note and no step time."""
    from postplace.placers import PlacementError
    from postplace.placers import place as run_placer

    cm = problem.simulator.problem.cost_model
    c, graph, allowed = problem.cluster, problem.graph, problem.op_allowed
    named: list[tuple[str, np.ndarray | None, str]] = []
    if warm_ops is not None:
        named.append((f"warm-start:{settings['warm_start']}", warm_ops, ""))
    if len(set(np.asarray(graph.microbatch).tolist()) - {-1}) >= 2:  # data parallelism needs micro-batches
        from postplace.placers.data_parallel import simulate_data_parallel

        try:
            dp = simulate_data_parallel(graph, c, cost_model=cm, allowed=allowed)
        except PlacementError as exc:
            named.append(("data-parallel", None, str(exc)))
        else:
            if len(set(dp.placement[np.asarray(graph.microbatch) >= 0].tolist())) < 2:
                named.append(("data-parallel", None, "fewer than 2 GPUs left for replicas"))
            elif dp.oom:  # its simulated peak is the sharded one: say what replication needs instead
                worst = int(np.argmax(dp.peak_mem - dp.capacity))
                named.append(("data-parallel", None, f"OOM: replicated parameters, gradients and optimizer state "
                                                     f"need {dp.peak_mem[worst] / 1e9:.2f} GB on {dp.gpus[worst]} "
                                                     f"of {dp.capacity[worst] / 1e9:.2f} GB"))  # fmt: skip
                named.append(("sharded data-parallel", dp.placement, ""))
            else:
                named.append(("data-parallel", dp.placement, ""))
    for name in CANDIDATE_PLACERS:
        if name in QUADRATIC_PLACERS and graph.num_ops > QUADRATIC_PLACER_MAX_OPS:
            named.append((name, None, f"skipped: {graph.num_ops} ops (its time grows with the square of the ops; "
                                      f"it runs up to {QUADRATIC_PLACER_MAX_OPS})"))
            continue
        try:
            ops = run_placer(name, graph, c, cost_model=cm, allowed=allowed)
        except PlacementError as exc:
            named.append((name, None, str(exc)))
            continue
        if name == "single":
            name = "single:" + c.device_names[int(np.bincount(ops, minlength=c.num_devices).argmax())]
        named.append((name, ops, ""))
    todo = [k for k, (_, ops, _) in enumerate(named) if ops is not None]
    cands: list[Candidate] = []
    if todo:
        res = judge.evaluate_ops(np.stack([named[k][1] for k in todo]))
    for j, k in enumerate(todo):
        name, ops, _ = named[k]
        ok = bool(res.feasible[j])
        note = "" if ok else ("OOM: does not fit" if res.oom[j] else f"failed: {res.reasons[j]}")
        if name == "sharded data-parallel" and ok:
            note = "ZeRO-style: each GPU holds its share of the state and fetches the parameters"
        named[k] = (name, ops, note)
        cands.append(Candidate(name, ops, float(res.step_time[j]) if ok else None, ok, note))
    for name, ops, note in named:
        if ops is None:
            cands.append(Candidate(name, None, None, False, note))
    return cands


def _summary(settings, problem, judge, result, cands, best, sched, out, wall, *, start: dict | None = None) -> dict:
    """Every figure of a run (what summary.json holds); ``start``: the search's start (:func:`_search_start`)."""
    c = problem.cluster
    measured = judge.name != "simulator"
    kind = "measured" if measured else "simulated"
    lb = problem.simulator.lower_bound
    single = next((k for k in cands if k.name.startswith("single:")), None)
    single_time = single.step_time_s if single is not None else None
    peak = sched.peak_memory
    return {
        "graph": problem.graph.name, "cluster": c.name, "strategy": settings["strategy"], "seed": settings["seed"],
        "microbatches": settings["target"].get("microbatches", 1),
        "microbatch_colocation": settings["target"].get("microbatch_colocation"),
        "evaluator": judge.name, "budget": settings["budget"], "samples": result.samples,
        "feasible_samples": result.feasible_samples, "evaluations": result.evaluations,
        "groups": problem.grouping.num_groups, "config": settings["config"],
        "returned": best.name, "best_step_time_s": best.step_time_s,
        "search_best_step_time_s": result.best_step_time if result.best_placement is not None else None,
        "search_best_sample": result.best_sample if result.best_placement is not None else None,
        "search_start": start if start is not None else {"name": None, "step_time_s": None},
        "single_device": single.name.split(":", 1)[1] if single is not None and single.feasible else None,
        "single_device_step_time_s": single_time,
        "candidates": {k.name: k.step_time_s for k in cands},
        "candidate_notes": {k.name: k.note for k in cands if k.note},
        "lower_bound_s": lb, "lower_bound_source": "simulator cost model",
        "ratio_to_lower_bound": None if measured or lb <= 0 else best.step_time_s / lb,
        "ratio_to_single_device": best.step_time_s / single_time if single_time else None,
        "simulated_step_time_s": sched.step_time,
        "peak_memory_bytes": dict(zip(c.device_names, peak.tolist(), strict=True)),
        "capacity_bytes": dict(zip(c.device_names, c.capacity.tolist(), strict=True)),
        "oom_devices": [c.device_names[d] for d in range(c.num_devices) if peak[d] > c.capacity[d]],
        "busy_s": dict(zip(c.device_names, sched.busy.tolist(), strict=True)),
        "bytes_moved": float(sum(x[4] for x in sched.transfers)), "transfers": len(sched.transfers),
        "figures": {"best_step_time_s": kind, "search_best_step_time_s": kind, "search_start": kind,
                    "single_device_step_time_s": kind,
                    "candidates": kind, "lower_bound_s": "simulated", "simulated_step_time_s": "simulated",
                    "peak_memory_bytes": "simulated", "busy_s": "simulated", "bytes_moved": "simulated"},
        "pins": settings["pins"], "exclude": settings["exclude"], "warm_start": settings["warm_start"],
        "map_all_to": settings["map_all_to"], "wall_time_s": result.wall_time_s, "place_wall_time_s": wall,
        "target_spec": settings["target"], "microbatch_note": settings.get("microbatch_note"),
        "optimizer": settings["target"].get("optimizer"), "precision": settings["target"].get("precision", "fp32"),
        "out": None if out is None else str(out),
    }  # fmt: skip


# ------------------------------------------------------------------------------------------ compare, apply
def compare(target, cluster="k80x4", *, strategies="all", budget: int = 2400, seeds: int = 3, out=None,
            expert_split: str | None = None, size: str = "full", progress=None,
            microbatches: int = 1, optimizer="sgd", lr: float | None = None,
            precision: str = "fp32") -> dict:  # fmt: skip
    """Every baseline and search strategy on one graph, each search row its strategy's own best.

    Search runs go to ``out/runs/<strategy>/seed<k>`` and a finished one is reused only when graph,
    cluster, strategy, budget, seed and configuration all match. Writes ``out/compare.json`` and
    ``.csv``; returns the report. Every row is simulated.

    Parameters
    ----------
    target : OpGraph, str or path
        A graph, a graph file or a zoo model name, as :func:`place` takes them.
    cluster : str, path or Cluster
        A preset name, a cluster TOML file, or a Cluster.
    strategies : str or list of str
        A list of names, a comma-separated string, or ``"all"`` (every placer and search strategy).
    budget : int
        Samples of each search run (>= 1).
    seeds : int
        Search runs per strategy, seeds 0 .. seeds - 1 (>= 1); a search row reports their median.
    out : str or path, optional
        The folder (default ``runs/compare-<target>-<cluster>``).
    expert_split : str, optional
        A dnn-partitioning expert split file for the ``expert`` row (see
        :func:`postplace.placers.place_expert`); without it, the layer-wise split.
    size : str
        Zoo model size (``full`` or ``small``).
    progress : callable, optional
        Called with each strategy's name before it runs.
    microbatches : int
        Compare on the step traced as that many micro-batches (a zoo model; it must divide the batch).
        For a zoo model the ``data-parallel`` and ``pipeline`` rows are simulated at every micro-batch
        count ``place`` weighs (their fastest that fits); for a graph file data parallelism is an
        analytic estimate, labelled as one.
    optimizer, lr, precision
        The step traced, as :func:`place` takes them.

    Returns
    -------
    dict
        The report ``compare.json`` holds (``rows``: one dict per strategy with its ``kind``,
        ``best_step_time_s``, ratios and ``note``; the lower bound, the single-device time...), and
        ``out``, the folder.

    Raises
    ------
    PostplaceError
        An unknown strategy, a budget, seed count or micro-batch count that is not a positive integer
        (or does not divide the batch), or a target or cluster that cannot be loaded.

    Examples
    --------
    >>> import postplace, tempfile
    >>> rep = postplace.compare("gpt2", "k80x2", strategies="post,data-parallel", budget=48, seeds=1,
    ...                         size="small", out=tempfile.mkdtemp())
    >>> rows = {r["strategy"]: r for r in rep["rows"]}
    >>> rows["data-parallel"]["kind"], "m=2" in rows["data-parallel"]["note"]
    ('data-parallel (simulated)', True)
    """
    from postplace.comparison import compare as run_compare
    from postplace.comparison import parse_strategies

    names = parse_strategies(strategies) if isinstance(strategies, str) else parse_strategies(",".join(strategies))
    for label, v in (("budget", budget), ("seeds", seeds)):
        if isinstance(v, bool) or not isinstance(v, int | np.integer) or v < 1:
            raise PostplaceError(f"--{label} {v!r}: give a positive integer")
    if isinstance(microbatches, bool) or not isinstance(microbatches, int | np.integer) or microbatches < 1:
        raise PostplaceError(f"--microbatches {microbatches!r}: give a count (1, 2, 4...)")
    batch = _batch_of(target, size, None)
    if microbatches > 1 and batch is not None and batch % microbatches:
        raise PostplaceError(f"--microbatches {microbatches} does not divide the batch of {batch}; "
                             "give a divisor of it")  # fmt: skip
    step = {"optimizer": optimizer, "lr": lr, "precision": precision}
    tgt = load_target(target, size=size, microbatches=int(microbatches), **step)
    c, cluster_spec = _load_cluster(cluster, tgt.graph)
    retraced = None
    if tgt.spec["kind"] == "zoo" and batch is not None and ({"data-parallel", "pipeline"} & set(names)):
        from postplace.over_m import microbatch_counts, trace_counts

        gpus = sum(dv.kind == "gpu" for dv in c.devices)
        retraced, _ = trace_counts(lambda m: load_target(target, size=size, microbatches=m, **step).graph,
                                   microbatch_counts(batch, gpus))  # fmt: skip
    out = Path(out) if out is not None else default_compare_out(target, c.name)
    report = run_compare(tgt.graph, c, names, budget=int(budget), seeds=int(seeds), out=out, progress=progress,
                         expert_split=expert_split, retraced=retraced, target_spec=tgt.spec,
                         cluster_spec=cluster_spec)  # fmt: skip
    if tgt.spec["kind"] in ("graph", "module"):  # kept beside the report, which draws the folder from it
        tgt.graph.save(out / "graph.json")
    return {**report, "out": str(out)}


def _stem(target) -> str:
    return Path(str(target)).stem if isinstance(target, str | Path) else getattr(target, "name", type(target).__name__)


def default_out(target, cluster, strategy: str, seed) -> Path:
    """The run folder ``place`` uses when none is given: ``runs/<target>-<cluster>-<strategy>-s<seed>``."""
    return Path("runs") / f"{_stem(target)}-{_stem(cluster)}-{strategy}-s{seed}"


def default_compare_out(target, cluster) -> Path:
    """The folder ``compare`` uses when none is given: ``runs/compare-<target>-<cluster>``."""
    return Path("runs") / f"compare-{_stem(target)}-{_stem(cluster)}"


def apply(result: PlaceResult, model=None, *, device_map=None, optimizer=None, lr: float | None = None):
    """A placed training step (:class:`postplace.runtime.placed.PlacedStep`) for the returned placement.

    Call the step to run one training step, ``step(inputs, targets)`` for a module placed with
    ``targets=`` (``step()`` reruns the traced batch); it returns the loss. The step updates with the
    optimizer and precision the placement was made for.

    Parameters
    ----------
    result : PlaceResult
        What :func:`place` (or :func:`resume`) returned for a module or a zoo model.
    model : torch.nn.Module, optional
        The module the result was traced from, whose current weights the step starts from (default:
        the one given to :func:`place`, or the zoo model for a zoo target).
    device_map : str or dict, optional
        Logical device -> torch device (default ``cpu -> cpu``, ``gpuK -> cuda:K``); ``"cpu"`` runs
        every device on the CPU, with the transfers still in place as copies.
    optimizer, lr : optional
        When given, they must name the optimizer the placement was made for (another one would hold
        other state: place again with it).

    Returns
    -------
    postplace.runtime.PlacedStep
        One training step with its own parameters, buffers and optimizer state.

    Raises
    ------
    PostplaceError
        For a result with no code to run (a graph or a graph file), another optimizer, a device map
        this machine cannot run (CUDA devices it lacks), or a model with other parameters.

    Examples
    --------
    >>> import postplace, torch
    >>> _ = torch.manual_seed(0)
    >>> model = torch.nn.Linear(4, 2)
    >>> x, y = torch.randn(8, 4), torch.randn(8, 2)
    >>> result = postplace.place(model, "k80x2", inputs=(x,), targets=(y,), loss_fn=torch.nn.functional.mse_loss,
    ...                          budget=48, microbatches=1)
    >>> step = postplace.apply(result, device_map="cpu")
    >>> loss = step(x, y)
    >>> loss.shape, loss.dtype
    (torch.Size([]), torch.float32)
    >>> bool(step(x, y) < loss)  # the step trained the placed copy of the weights
    True
    """
    from postplace.runtime.placed import apply as run_apply

    traced = result.traced
    ts = result.target_spec
    _check_same_optimizer(ts.get("optimizer", "sgd"), optimizer, lr)
    if traced is None and ts.get("kind") == "zoo":
        from postplace.runtime import apply_zoo

        return apply_zoo(ts["name"], ts["size"], result.placement, result.cluster,
                         microbatches=ts.get("microbatches", 1), colocation=ts.get("microbatch_colocation", "none"),
                         model=model, device_map=device_map, **_recorded_step(ts))  # fmt: skip
    if traced is None:
        raise PostplaceError("apply needs the code of the step: place an nn.Module (target=model, inputs=..., "
                             "loss_fn=...) or a zoo model; a graph file has no code to run")  # fmt: skip
    return run_apply(model if model is not None else traced.model, traced, result.placement, result.cluster,
                     device_map=device_map)  # fmt: skip


def _check_same_optimizer(recorded, optimizer, lr, what: str = "apply: the placement") -> None:
    from postplace.graph.optimizers import optimizer_mismatch

    differ = optimizer_mismatch(recorded, optimizer, lr)
    if differ is not None:
        recorded, given = differ
        raise PostplaceError(f"{what} was made for {_optimizer_text(recorded)}, not {_optimizer_text(given)}; "
                             "its memory and update differ: start again with that optimizer")  # fmt: skip


def _optimizer_text(record) -> str:
    if not isinstance(record, dict):
        return str(record)
    hp = record["groups"][0] if record.get("groups") else {}
    return f"{record['name']} (lr {hp.get('lr')})"
