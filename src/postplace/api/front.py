"""The four calls of the front door: :func:`place`, :func:`resume`, :func:`compare`, :func:`apply`.
Each checks its arguments and hands over to the module that makes the decision.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from postplace.api.folder import resume_folder
from postplace.api.options import Measure, Step, check_moved, grouped
from postplace.api.result import CompareResult, PlaceResult
from postplace.api.run import place_run, with_report
from postplace.api.settings import check_same_optimizer, make_settings
from postplace.api.target import batch_of, default_compare_out, load_cluster, load_target, recorded_step
from postplace.errors import PostplaceError
from postplace.search.state_io import fingerprint

MAX_SEEDS = 1_000
"""The most seeds ``compare`` runs per strategy: each is a whole search with its own run folder."""


def place(
    target,
    cluster="k80x4",
    *,
    strategy: str = "post",
    budget: int | str = 2400,
    seed: int = 0,
    config=None,
    groups: int | None = 256,
    pins=(),
    exclude=(),
    warm_start: str | None = None,
    microbatches: int | str | None = None,
    microbatch_colocation: str = "none",
    size: str = "full",
    step: Step | None = None,
    measure: Measure | None = None,
    out: str | Path | None = None,
    progress: bool = False,
    report: bool = True,
    **moved,
) -> PlaceResult:
    """Find a fast placement of one training step on a cluster.

    Runs the search ``strategy`` for ``budget`` samples, evaluates data parallelism, the GPipe-style
    pipeline, the memory-aware one-shot placers (:data:`CANDIDATE_PLACERS`) and the warm start with
    the same evaluator and under the same constraints, and returns the fastest feasible of them all
    (DESIGN.md section 4c). Where the step can be traced again (a zoo model, a module with
    ``targets``), this is done by default at every micro-batch count m = 1, 2, 4... dividing the batch
    (up to the number of GPUs or 8), the budget split by successive halving (:mod:`postplace.api.over_m`); the
    result names the m, the candidate and the plan, every device it uses named (``summary["plan"]``,
    e.g. "data-parallel 4 (gpu0..gpu3), 4 micro-batches"). Every step time is for the same global batch.

    Parameters
    ----------
    target : OpGraph, str, path or torch.nn.Module
        A graph, a graph file, a zoo model name (see ``postplace models``), or a module with
        ``step=Step(inputs=..., loss_fn=...)``; a module is traced.
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
    config : dataclass, dict or str, optional
        The strategy's config (e.g. :class:`postplace.search.PostConfig`), or a dict of field
        overrides (``{"lr": 0.05}``), or ``"paper"`` for Post.
    groups : int or None
        Number of groups to place (None: op-level).
    pins : sequence of str
        ``"REGEX=DEVICE"``: ops whose name matches go on DEVICE (with their colocation sets).
    exclude : sequence of str
        Devices no op may use.
    warm_start : str, optional
        A placer name (``heft``, ``m-etf``...), ``single:DEVICE`` or a placement JSON file. Its own
        op-level placement is a candidate; its collapse to the search's groups is the first sample.
    microbatches : int, "auto" or None
        None (default): ``"auto"`` where the step can be traced again and the search is simulated, else 1
        (measured runs weigh every count when asked: each count's search is then measured for real).
        ``"auto"``: answer over every count m (above). An int pins m (it must divide the batch).
    microbatch_colocation : {"none", "module"}
        ``none``: a layer's micro-batches may go to different devices (data parallelism);
        ``module``: they stay together (pipelines only).
    size : str
        Zoo model size (``full`` or ``small``).
    step : Step, optional
        The training step (:class:`postplace.Step`): a module's ``inputs``, ``loss_fn`` and ``targets``
        (its labels: without them a module is placed at m = 1 only, and a loss that closed over its
        labels is warned about), the ``optimizer`` and ``lr`` it ends with, its ``precision``.
        Default: SGD (lr 0.1, momentum 0.9) in fp32.
    measure : Measure, optional
        How placements are judged beyond the simulator (:class:`postplace.Measure`): ``evaluator="torch"``
        measures every sample, ``confirm=K`` the K best candidates (``confirm_with="launch"``: each
        launched as one process per device), ``ray=`` evaluates on Ray actors,
        ``map_all_to=`` runs every device on one torch device. Default: simulated.
    out : str or path, optional
        The run folder: ``run.json`` (settings, written first), ``history.jsonl``, ``timing.jsonl``,
        ``checkpoint.json`` (+ npz), and at the end ``placement.json``, ``summary.json`` and ``report.html``
        (as the CLI writes it); ``run.json`` and ``summary.json`` then record the search's start
        (``search_start``: its name and step time). None: nothing is kept (each micro-batch count's search
        still checkpoints between the halving's rounds, in a temporary folder removed at the end, so the answer
        is the one a run with a folder gives).
    progress : bool
        Show a progress bar.
    report : bool
        Write ``report.html`` into ``out`` (a report that cannot be drawn is a warning, never a failed run).
    **moved
        Nothing: a field of ``step`` or ``measure`` passed loose (``precision="bf16"``) is one error line
        naming the group it belongs to.

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
    check_moved("place", moved)
    step, measure = grouped(step, Step, "step"), grouped(measure, Measure, "measure")
    m_mode = _microbatch_mode(
        target, microbatches, microbatch_colocation, measure, step.targets, batch_of(target, size, step.inputs)
    )
    if m_mode == "auto":
        return _place_over_m(
            target,
            cluster,
            out=out,
            strategy=strategy,
            budget=budget,
            seed=seed,
            pins=pins,
            exclude=exclude,
            warm_start=warm_start,
            config=config,
            groups=groups,
            size=size,
            colocation=microbatch_colocation,
            step=step,
            measure=measure,
            progress=progress,
            report=report,
        )
    tgt = load_target(
        target,
        size=size,
        inputs=step.inputs,
        loss_fn=step.loss_fn,
        microbatches=m_mode,
        microbatch_colocation=microbatch_colocation,
        targets=step.targets,
        **step.traced_step(),
    )
    c, cluster_spec = load_cluster(cluster, tgt.graph)
    note = None
    if microbatches is None and m_mode == 1 and tgt.spec["kind"] in ("zoo", "module") and measure.measured:
        note = (
            "measured runs place m = 1 unless asked (every count's search is measured for real): pass "
            "--microbatches auto to weigh every count, or M to pin one"
        )
    elif microbatches is None and tgt.spec["kind"] == "module" and step.targets is None:
        note = (
            "placed at m = 1 only: give Step(targets=...) (and a loss_fn(outputs, *targets)) to weigh "
            "micro-batch counts, data parallelism and pipelines"
        )
    settings = make_settings(
        tgt,
        c,
        cluster_spec,
        strategy=strategy,
        budget=budget,
        seed=seed,
        pins=pins,
        exclude=exclude,
        warm_start=warm_start,
        evaluator=measure.evaluator,
        config=config,
        groups=groups,
        size=size,
        map_all_to=measure.map_all_to,
        confirm=measure.confirm,
        microbatches=m_mode,
        microbatch_colocation=microbatch_colocation,
        microbatch_note=note,
    )
    result = place_run(
        settings,
        {m_mode: tgt},
        c,
        out=None if out is None else Path(out),
        resume=False,
        progress=progress,
        confirm_k=measure.confirm,
        ray=measure.ray,
        confirm_with=measure.confirm_with,
    )
    return with_report(result, out, report)


def _microbatch_mode(target, microbatches, colocation: str, measure: Measure, targets, batch: int | None) -> int | str:
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
    measured = measure.measured
    if microbatches is None:  # a measured search at every count costs real steps: asked for, not the default
        return "auto" if traceable and not measured else 1
    if microbatches == "auto":
        if not traceable:
            raise PostplaceError(
                "--microbatches auto traces the step again at each count: give a zoo model name, "
                "or an nn.Module with Step(targets=...); a graph file is one traced step"
            )
        return "auto"
    if isinstance(microbatches, bool) or not isinstance(microbatches, int | np.integer) or microbatches < 1:
        raise PostplaceError(f"--microbatches {microbatches!r}: give a count (1, 2, 4...) or 'auto'")
    if batch is not None and batch % int(microbatches):
        raise PostplaceError(
            f"--microbatches {microbatches} does not divide the batch of {batch}; give a divisor of it, or auto"
        )
    return int(microbatches)


def _place_over_m(
    target, cluster, *, out, size, colocation, step: Step, measure: Measure, progress, report, **kw
) -> PlaceResult:
    """Trace the step at every count of :func:`postplace.api.over_m.microbatch_counts` and answer over all."""
    from postplace.api.over_m import fitting_count, microbatch_counts, trace_counts

    batch = batch_of(target, size, step.inputs)
    if batch is None:
        raise PostplaceError(
            "--microbatches auto: the batch size is unknown (inputs have no dim 0); pin a count with --microbatches M"
        )
    module = {"inputs": step.inputs, "loss_fn": step.loss_fn, "targets": step.targets, **step.traced_step()}
    first = load_target(target, size=size, **module)
    c, cluster_spec = load_cluster(cluster, first.graph)
    gpus = sum(dv.kind == "gpu" for dv in c.devices)
    import warnings

    from postplace.graph.trace_torch import MicrobatchNormWarning

    with warnings.catch_warnings():  # said once below, and only if the answer splits the batch
        warnings.simplefilter("ignore", MicrobatchNormWarning)
        more, skipped = trace_counts(
            lambda m: load_target(target, size=size, microbatches=m, microbatch_colocation=colocation, **module),
            microbatch_counts(batch, gpus, fitting_count(first.graph, c, kw.get("exclude") or ()))[1:],
        )
    targets_by_m = {1: first, **more}
    settings = make_settings(
        first,
        c,
        cluster_spec,
        evaluator=measure.evaluator,
        map_all_to=measure.map_all_to,
        confirm=measure.confirm,
        size=size,
        microbatches="auto",
        microbatch_colocation=colocation,
        microbatch_counts=tuple(sorted(targets_by_m)),
        microbatch_skipped=skipped,
        graph_shas={str(m): fingerprint(t.graph) for m, t in targets_by_m.items()},
        **kw,
    )
    result = place_run(
        settings,
        targets_by_m,
        c,
        out=None if out is None else Path(out),
        resume=False,
        progress=progress,
        confirm_k=measure.confirm,
        ray=measure.ray,
        confirm_with=measure.confirm_with,
    )
    if result.graph.metadata.get("microbatch_norms") and (result.summary.get("microbatches") or 1) > 1:
        warnings.warn(MicrobatchNormWarning(result.summary["microbatch_note"]), stacklevel=2)
    return with_report(result, out, report)


def resume(
    out: str | Path,
    *,
    budget: int | str | None = None,
    graph=None,
    cluster=None,
    measure: Measure | None = None,
    progress: bool = False,
    report: bool = True,
    **given,
) -> PlaceResult:
    """Continue the run saved in ``out`` (from any working directory) with its recorded settings.

    A run killed before its first checkpoint starts over with the recorded settings.

    Parameters
    ----------
    out : str or path
        The run folder :func:`place` wrote (its ``run.json``).
    budget : int or str, optional
        Extend a finished run to that many samples (or seconds); never fewer samples than it holds.
        A run over several micro-batch counts extends to at least its own budget, in the same unit: the
        new budget is shared out over the counts as its halving shares it (the rounds it decided kept),
        each count's search resumed from its checkpoint.
    graph, cluster : optional
        Needed only for a run started from an in-memory object (a graph it did not save, a Cluster).
    measure : Measure, optional
        ``confirm=K`` measures the K best candidates for real (``confirm_with="launch"``: as one process
        per device) and ``ray=`` evaluates on Ray actors, as :func:`place` takes them (how a run is
        confirmed is not a recorded setting: a run folder of any age resumes with either); its
        ``evaluator`` and ``map_all_to``, where set away from their defaults, must equal the recorded
        ones (a field left at its default is not checked).
    progress : bool
        Show a progress bar.
    report : bool
        Draw ``report.html`` at the end, as :func:`place` does.
    **given
        Any setting the run recorded (``strategy=``, ``seed=``, ``precision=``...), or ``step=Step(...)``
        (its optimizer, lr and precision, where set away from their defaults): each must equal the
        recorded one.

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
    measure = grouped(measure, Measure, "measure")
    step = grouped(given.pop("step", None), Step, "step")
    if step.inputs is not None or step.loss_fn is not None or step.targets is not None:
        raise PostplaceError(
            "resume: a module's inputs, loss_fn and targets are the run's; pass step= with its "
            "optimizer, lr or precision only"
        )
    for group, keys in ((measure, ("evaluator", "map_all_to")), (step, ("optimizer", "lr", "precision"))):
        for key in keys:  # the recorded ones hold: a field set away from its default must agree with them
            if getattr(group, key) != getattr(type(group)(), key):
                given[key] = getattr(group, key)
    check_moved("resume", {k: v for k, v in given.items() if k in ("confirm", "ray", "confirm_with")})
    folder = resume_folder(
        Path(out),
        budget,
        graph,
        cluster,
        progress,
        measure.confirm,
        measure.ray,
        given,
        confirm_with=measure.confirm_with,
    )
    return with_report(folder, out, report)


def compare(
    target,
    cluster="k80x4",
    *,
    strategies="all",
    budget: int = 2400,
    seeds: int = 3,
    out=None,
    expert_split: str | None = None,
    size: str = "full",
    progress=None,
    microbatches: int = 1,
    step: Step | None = None,
    **moved,
) -> CompareResult:
    """Every baseline and search strategy on one graph, each search row its strategy's own best.

    Search runs go to ``out/runs/<strategy>/seed<k>`` and a finished one is reused only when graph,
    cluster, strategy, budget, seed and configuration all match. Writes ``out/compare.json`` and
    ``.csv``; returns the report as a :class:`CompareResult`. Every row is simulated.

    Parameters
    ----------
    target : OpGraph, str or path
        A graph, a graph file or a zoo model name, as :func:`place` takes them.
    cluster : str, path or Cluster
        A preset name, a cluster TOML file, or a Cluster.
    strategies : str or list of str
        A list of names, a comma-separated string, or ``"all"`` (every placer and search strategy).
    budget : int
        Samples of each search run (1 to 10^12, the cap of place's budget).
    seeds : int
        Search runs per strategy, seeds 0 .. seeds - 1 (1 to :data:`MAX_SEEDS`, 1,000); a search row
        reports their median.
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
    step : Step, optional
        The update and precision of the step traced (:class:`postplace.Step`'s ``optimizer``, ``lr``,
        ``precision``), as :func:`place` takes them; a module's fields do not apply.

    Returns
    -------
    CompareResult
        The report ``compare.json`` holds, as attributes (``rows``: one dict per strategy with its
        ``kind``, ``best_step_time_s``, ratios and ``note``; ``lower_bound_s``,
        ``single_device_step_time_s``...) and ``out``, the folder; ``to_json()`` gives it as JSON. It
        reads as the dict compare returned before too (``result["rows"]``, ``result.get(...)``).

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
    >>> dp = rep.row("data-parallel")
    >>> dp["kind"], "m=2" in dp["note"], rep["rows"] == rep.rows
    ('data-parallel (simulated)', True, True)
    """
    from postplace.comparison import PLAN_NAMES, parse_strategies
    from postplace.comparison import compare as run_compare

    check_moved("compare", moved, groups=("step",))
    step = grouped(step, Step, "step")
    if step.inputs is not None or step.loss_fn is not None or step.targets is not None:
        raise PostplaceError(
            "compare takes a graph, a graph file or a zoo model: Step's inputs, loss_fn and "
            "targets (a module's) do not apply; place the module instead"
        )
    names = parse_strategies(strategies) if isinstance(strategies, str) else parse_strategies(",".join(strategies))
    from postplace.search.runner import MAX_BUDGET_SAMPLES

    for label, v, most in (("budget", budget, MAX_BUDGET_SAMPLES), ("seeds", seeds, MAX_SEEDS)):
        if isinstance(v, bool) or not isinstance(v, int | np.integer) or not 1 <= v <= most:
            raise PostplaceError(f"--{label} {v!r}: give a positive integer, at most {most:,}")
    if isinstance(microbatches, bool) or not isinstance(microbatches, int | np.integer) or microbatches < 1:
        raise PostplaceError(f"--microbatches {microbatches!r}: give a count (1, 2, 4...)")
    batch = batch_of(target, size, None)
    if microbatches > 1 and batch is not None and batch % microbatches:
        raise PostplaceError(
            f"--microbatches {microbatches} does not divide the batch of {batch}; give a divisor of it"
        )
    traced_step = step.traced_step()
    tgt = load_target(target, size=size, microbatches=int(microbatches), **traced_step)
    c, cluster_spec = load_cluster(cluster, tgt.graph)
    retraced = None
    if tgt.spec["kind"] == "zoo" and batch is not None and ({"data-parallel", "pipeline", *PLAN_NAMES} & set(names)):
        from postplace.api.over_m import microbatch_counts, trace_counts

        gpus = sum(dv.kind == "gpu" for dv in c.devices)
        retraced, _ = trace_counts(
            lambda m: load_target(target, size=size, microbatches=m, **traced_step).graph,
            microbatch_counts(batch, gpus),
        )
    out = Path(out) if out is not None else default_compare_out(target, c.name)
    report = run_compare(
        tgt.graph,
        c,
        names,
        budget=int(budget),
        seeds=int(seeds),
        out=out,
        progress=progress,
        expert_split=expert_split,
        retraced=retraced,
        target_spec=tgt.spec,
        cluster_spec=cluster_spec,
    )
    if tgt.spec["kind"] in ("graph", "module"):  # kept beside the report, which draws the folder from it
        tgt.graph.save(out / "graph.json")
    return CompareResult.from_report(report, out)


def apply(result: PlaceResult, model=None, *, device_map=None, optimizer=None, lr: float | None = None):
    """A placed training step (:class:`postplace.runtime.placed.PlacedStep`) for the returned placement.

    Call the step to run one training step, ``step(inputs, targets)`` for a module placed with
    ``Step(targets=...)`` (``step()`` reruns the traced batch); it returns the loss. The step updates with the
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
    >>> training = postplace.Step(inputs=(x,), targets=(y,), loss_fn=torch.nn.functional.mse_loss)
    >>> result = postplace.place(model, "k80x2", step=training, budget=48, microbatches=1)
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
    plan = (result.summary or {}).get("returned_plan")
    if plan:
        raise PostplaceError(
            f"the returned plan is '{plan}', whose replicas meet in collectives: it runs as one "
            "process per GPU under torchrun (DDP/FSDP as its library sets it up), not as one "
            "placed process; apply runs the search's placements only (postplace launch RUN_FOLDER "
            "runs plain ddp, zero1, zero2 and fsdp plans so)"
        )
    check_same_optimizer(ts.get("optimizer", "sgd"), optimizer, lr)
    if traced is None and ts.get("kind") == "zoo":
        from postplace.runtime import apply_zoo

        return apply_zoo(
            ts["name"],
            ts["size"],
            result.placement,
            result.cluster,
            microbatches=ts.get("microbatches", 1),
            colocation=ts.get("microbatch_colocation", "none"),
            model=model,
            device_map=device_map,
            **recorded_step(ts),
        )
    if traced is None:
        raise PostplaceError(
            "apply needs the code of the step: place an nn.Module (with step=Step(inputs=..., "
            "loss_fn=...)) or a zoo model; a graph file has no code to run"
        )
    return run_apply(
        model if model is not None else traced.model, traced, result.placement, result.cluster, device_map=device_map
    )
