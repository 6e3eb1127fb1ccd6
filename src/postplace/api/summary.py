"""What a run says of its answer: ``summary.json`` (every figure, simulated or measured, and which)
and the plan in words, naming every device it uses ("data-parallel 4 (gpu0..gpu3), 4 micro-batches",
"pipeline of 2 stages (gpu0, gpu1), 8 micro-batches; also 3 ops on cpu (under 1% of the work)").
"""

from __future__ import annotations

import numpy as np

from postplace.api.settings import RunSettings
from postplace.search.origins import origin_stats, with_candidate


def run_summary(
    settings: RunSettings, problem, judge, result, cands, best, sched, out, wall, *, start: dict | None = None
) -> dict:
    """Every figure of a run (what summary.json holds); ``start``: the search's start (:func:`search_start`)."""
    c = problem.cluster
    measured = judge.name != "simulator"
    kind = "measured" if measured else "simulated"
    lb = problem.simulator.lower_bound
    single = next((k for k in cands if k.name.startswith("single:")), None)
    single_time = single.step_time_s if single is not None else None
    peak = sched.peak_memory
    return {
        **_utilisation(problem, best, cands),
        "graph": problem.graph.name if getattr(best, "graph", None) is None else best.graph.name,
        "cluster": c.name,
        "strategy": settings.strategy,
        "seed": settings.seed,
        "microbatches": settings.target.get("microbatches", 1),
        "microbatch_colocation": settings.target.get("microbatch_colocation"),
        "evaluator": judge.name,
        "budget": settings.budget,
        "samples": result.samples,
        "feasible_samples": result.feasible_samples,
        "evaluations": result.evaluations,
        "groups": problem.grouping.num_groups,
        "config": settings.config,
        "returned": best.name,
        "best_step_time_s": best.step_time_s,
        "search_best_step_time_s": result.best_step_time if result.best_placement is not None else None,
        "search_best_sample": result.best_sample if result.best_placement is not None else None,
        "search_start": start if start is not None else {"name": None, "step_time_s": None},
        "search_origins": with_candidate(
            origin_stats(result.origins, result.step_times, lb), best.name, None if measured else best.step_time_s
        ),
        "local_moves": bool(settings.config.get("use_local", False)),
        "single_device": single.name.split(":", 1)[1] if single is not None and single.feasible else None,
        "single_device_step_time_s": single_time,
        "candidates": {k.name: k.step_time_s for k in cands},
        "candidate_notes": {k.name: k.note for k in cands if k.note},
        "lower_bound_s": lb,
        "lower_bound_source": "simulator cost model",
        "ratio_to_lower_bound": None if measured or lb <= 0 else best.step_time_s / lb,
        "ratio_to_single_device": best.step_time_s / single_time if single_time else None,
        "simulated_step_time_s": sched.step_time,
        "peak_memory_bytes": dict(zip(c.device_names, peak.tolist(), strict=True)),
        "capacity_bytes": dict(zip(c.device_names, c.capacity.tolist(), strict=True)),
        "oom_devices": [c.device_names[d] for d in range(c.num_devices) if peak[d] > c.capacity[d]],
        "busy_s": dict(zip(c.device_names, sched.busy.tolist(), strict=True)),
        "bytes_moved": float(sched.bytes_moved),
        "transfers": len(sched.transfers),
        "figures": {
            "best_step_time_s": kind,
            "search_best_step_time_s": kind,
            "search_start": kind,
            "plan_search": "simulated",
            "mfu": kind,
            "candidate_mfu": kind,
            "tokens_per_s_per_device": kind,
            "single_device_step_time_s": kind,
            "candidates": kind,
            "lower_bound_s": "simulated",
            "simulated_step_time_s": "simulated",
            "peak_memory_bytes": "simulated",
            "busy_s": "simulated",
            "bytes_moved": "simulated",
        },
        "pins": list(settings.pins),
        "exclude": list(settings.exclude),
        "warm_start": settings.warm_start,
        "map_all_to": settings.map_all_to,
        "wall_time_s": result.wall_time_s,
        "place_wall_time_s": wall,
        "target_spec": settings.target,
        "microbatch_note": settings.microbatch_note,
        "optimizer": settings.target.get("optimizer"),
        "precision": settings.target.get("precision", "fp32"),
        "out": None if out is None else str(out),
    }


def _utilisation(problem, best, cands) -> dict:
    """MFU and tokens/s of the answer, MFU of every candidate, and which cost model priced the step."""
    from postplace.cost.utilisation import peak_of_devices_used, utilisation

    c, graph = problem.cluster, problem.graph
    cm = problem.simulator.problem.cost_model
    use = utilisation(best.graph if best.graph is not None else graph, c, best.placement, best.step_time_s)
    precision = str(graph.metadata.get("precision", "fp32"))
    per = {}
    for k in cands:
        if k.placement is None or not k.step_time_s or not np.isfinite(k.step_time_s):
            per[k.name] = None
            continue
        peak, _ = peak_of_devices_used(c, k.placement, precision)
        per[k.name] = use.model_flops / (k.step_time_s * peak) if use else None
    err = cm.step_error(c) if hasattr(cm, "step_error") else None
    close = (
        []
        if err is None
        else sorted(
            k.name
            for k in cands
            if k.name != best.name
            and k.step_time_s
            and np.isfinite(k.step_time_s)
            and best.step_time_s
            and k.step_time_s <= best.step_time_s * (1 + err)
        )
    )
    return {
        "cost_model": cm.describe(c) if hasattr(cm, "describe") else type(cm).__name__,
        "cost_model_error": err,
        "within_error": close,
        "mfu": use.mfu if use else None,
        "tokens_per_s_per_device": use.tokens_per_s_per_device if use else None,
        "model_flops_per_step": use.model_flops if use else None,
        "model_flops_counted": use.counted if use else None,
        "candidate_mfu": per,
    }


def plan_line(best, graph, cluster, cost_model, peak: np.ndarray) -> str:
    """``summary["plan"]``: a practitioner plan candidate in its own words, any other placement in
    :func:`describe_plan`'s, its op times from ``cost_model``; ``peak`` (the returned placement's
    simulated peak per device) says whether its replicas could each hold the whole state
    (:func:`postplace.placers.data_parallel.replicated_peak`), else the plan is sharded data parallelism."""
    if best.plan is not None:
        return plan_candidate_words(best, cluster)
    from postplace.placers.data_parallel import replicated_peak

    placement = np.asarray(best.placement)
    times = np.asarray(cost_model.op_times(graph, cluster).table, dtype=np.float64)
    times = np.where(np.isfinite(times), times, 0.0)[np.arange(graph.num_ops), placement]
    mb = np.asarray(graph.microbatch) if graph.microbatch is not None else np.full(graph.num_ops, -1)
    replicas = sorted(set(placement[mb >= 0].tolist()))
    sharded = False
    if replicas:  # a micro-batched step
        need = replicated_peak(graph, placement, np.asarray(peak, dtype=np.float64), replicas)
        sharded = bool(np.any(need > np.asarray(cluster.capacity, dtype=np.float64)[replicas]))
    return describe_plan(graph, cluster, placement, times, sharded=sharded)


def plan_candidate_words(best, cluster) -> str:
    """A practitioner plan candidate in words (:func:`postplace.placers.practitioner.plan_words`)."""
    from postplace.placers.practitioner import plan_words
    from postplace.plans import parse_plan

    spec = parse_plan(best.plan)
    gpus = plan_gpus(best)
    return plan_words(spec, [cluster.device_names[g] for g in gpus], spec.microbatches) + also_on(
        cluster.device_names, np.asarray(best.placement), gpus
    )  # ops only a CPU runs, say


def plan_gpus(cand) -> list[int]:
    """The GPUs a plan candidate's replicas run on (its ops that may run on a GPU)."""
    return sorted({int(d) for d in cand.placement[(cand.graph.allowed_kinds & 2) != 0].tolist()})


def also_on(names, placement: np.ndarray, named, weights: np.ndarray | None = None) -> str:
    """The devices of ``placement`` that the words so far do not name (``named``), with their ops:
    ``"; also 24 ops on cpu, 24 on gpu3 (under 1% of the work)"`` (the share from ``weights``, seconds
    per op, where given), or ``""`` where every device is named."""
    rest = sorted(set(np.asarray(placement).tolist()) - set(named))
    if not rest:
        return ""
    counts = np.bincount(placement, minlength=len(names))
    first = f"{counts[rest[0]]} op{'s' if counts[rest[0]] > 1 else ''} on {names[rest[0]]}"
    words = "; also " + ", ".join([first, *(f"{counts[d]} on {names[d]}" for d in rest[1:])])
    if weights is not None and float(np.sum(weights)) > 0:
        pct = 100 * float(np.sum(weights[np.isin(placement, rest)])) / float(np.sum(weights))
        words += f" ({'under 1%' if pct < 1 else f'{pct:.0f}%'} of the work)"
    return words


def describe_plan(
    graph, cluster, placement: np.ndarray, times: np.ndarray | None = None, *, sharded: bool = False
) -> str:
    """The plan in the words users use, naming every device it uses: "one device (gpu0)", "model
    parallel over 3 devices (gpu0, gpu1, gpu2)", "data-parallel 4 (gpu0..gpu3), 4 micro-batches",
    "pipeline of 2 stages (gpu0, gpu1), 8 micro-batches", "2 stages x data-parallel 2 (replicas:
    gpu0+gpu1, gpu2+gpu3), 8 micro-batches", "data-parallel 4 over 5 devices (replicas: cpu+gpu0, gpu1,
    gpu2, gpu3), 4 micro-batches" (replicas of unequal depth), "hybrid over 6 devices (gpu0..gpu5; up to
    3 per micro-batch), 8 micro-batches". A device counts for a micro-batch (or, at one micro-batch,
    for the plan) when it runs at least 5% of that micro-batch's op time (``times``: seconds per op;
    default: every op weighs the same); every other device the placement uses is named after the words
    with its ops and their share of the work ("...; also 24 ops on cpu, 24 on gpu3 (under 1% of the
    work)"). ``sharded``: the replicas cannot each hold the whole state (parameters, optimizer state),
    so each holds its share: data parallelism is then called "sharded data-parallel"."""
    from postplace.placers.practitioner import device_span

    names = cluster.device_names
    placement = np.asarray(placement)
    w = np.ones(graph.num_ops) if times is None else np.asarray(times, dtype=np.float64)
    mb = np.asarray(graph.microbatch) if graph.microbatch is not None else np.full(graph.num_ops, -1)
    m = int(mb.max()) + 1 if mb.size else 0

    def used(mask) -> tuple[int, ...]:
        load = np.bincount(placement[mask], weights=w[mask], minlength=cluster.num_devices)
        total = load.sum()
        if total <= 0:
            return tuple(sorted(set(placement[mask].tolist())))
        return tuple(int(d) for d in np.flatnonzero(load >= 0.05 * total))

    def span(devs) -> str:
        return device_span([names[d] for d in devs])

    if m <= 1:
        devs = used(np.ones(graph.num_ops, dtype=bool))
        words = (
            f"one device ({names[devs[0]]})"
            if len(devs) == 1
            else f"model parallel over {len(devs)} devices ({', '.join(names[d] for d in devs)})"
        )
        return words + also_on(names, placement, devs, w)
    sets = [used(mb == k) for k in range(m)]
    distinct = sorted(set(sets))
    devs = sorted(set().union(*distinct))
    stages = max(len(s) for s in sets)
    replicas = len(distinct)
    disjoint = sum(len(s) for s in distinct) == len(devs)
    tail = f"{m} micro-batches"
    dp = f"{'sharded ' if sharded else ''}data-parallel {replicas}"
    state = ": each replica holds its share of the parameters and optimizer state" if sharded else ""
    shown = (
        ", ".join("+".join(names[d] for d in s) for s in distinct)
        if replicas <= 8
        else f"{span(devs)}: {min(map(len, distinct))}-{stages} each"
    )
    if replicas == 1:
        words = (
            f"one device ({names[distinct[0][0]]}), {tail}"
            if stages == 1
            else f"pipeline of {stages} stages ({', '.join(names[d] for d in distinct[0])}), {tail}"
        )
    elif not disjoint:
        words = f"hybrid over {len(devs)} devices ({span(devs)}; up to {stages} per micro-batch), {tail}"
    elif stages == 1:
        words = f"{dp} ({span(devs)}), {tail}{state}"
    elif len({len(s) for s in distinct}) == 1:
        words = f"{stages} stages x {dp} (replicas: {shown}), {tail}{state}"
    else:  # replicas of unequal depth (one GPU's micro-batches also run on the CPU): "2 stages x" would count
        # devices the machine may not have
        words = f"{dp} over {len(devs)} devices (replicas: {shown}), {tail}{state}"
    return words + also_on(names, placement, devs, w)
