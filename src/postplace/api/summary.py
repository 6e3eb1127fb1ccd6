"""What a run says of its answer: ``summary.json`` (every figure, simulated or measured, and which)
and the plan in words ("data-parallel 4, 4 micro-batches", "pipeline of 2 stages ...").
"""

from __future__ import annotations

import numpy as np


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
        "bytes_moved": float(sched.bytes_moved), "transfers": len(sched.transfers),
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


def _plan(graph, c, placement, cost_model, returned: str = "") -> str:
    times = np.asarray(cost_model.op_times(graph, c).table, dtype=np.float64)
    plan = describe_plan(graph, c, placement, np.where(np.isfinite(times), times, 0.0)[np.arange(graph.num_ops),
                                                                                       placement])
    if returned.startswith("param-server (sharded state)"):  # replicated state would not fit: not plain DDP
        plan = plan.replace("data-parallel", "sharded data-parallel (each GPU holds its share of the state)")
    return plan


def describe_plan(graph, cluster, placement: np.ndarray, times: np.ndarray | None = None) -> str:
    """The plan in the words users use: "one device (gpu0)", "model parallel over 3 devices",
    "data-parallel 4, 4 micro-batches", "pipeline of 2 stages, 8 micro-batches", "2 stages x
    data-parallel 2, 8 micro-batches", "data-parallel 4 over 5 devices (replicas: cpu+gpu0, gpu1,
    gpu2, gpu3), 4 micro-batches" (replicas of unequal depth). A device counts for a micro-batch
    when it runs at least 5% of that micro-batch's op time (``times``: seconds per op; default: every
    op weighs the same)."""
    names = cluster.device_names
    w = np.ones(graph.num_ops) if times is None else np.asarray(times, dtype=np.float64)
    mb = np.asarray(graph.microbatch) if graph.microbatch is not None else np.full(graph.num_ops, -1)
    m = int(mb.max()) + 1 if mb.size else 0

    def used(mask) -> tuple[int, ...]:
        load = np.bincount(placement[mask], weights=w[mask], minlength=cluster.num_devices)
        total = load.sum()
        if total <= 0:
            return tuple(sorted(set(placement[mask].tolist())))
        return tuple(int(d) for d in np.flatnonzero(load >= 0.05 * total))

    if m <= 1:
        devs = used(np.ones(graph.num_ops, dtype=bool))
        if len(devs) == 1:
            return f"one device ({names[devs[0]]})"
        return f"model parallel over {len(devs)} devices ({', '.join(names[d] for d in devs)})"
    sets = [used(mb == k) for k in range(m)]
    distinct = sorted(set(sets))
    stages = max(len(s) for s in sets)
    replicas = len(distinct)
    disjoint = sum(len(s) for s in distinct) == len(set().union(*distinct))
    tail = f"{m} micro-batches"
    if replicas == 1:
        if stages == 1:
            return f"one device ({names[distinct[0][0]]}), {tail}"
        return f"pipeline of {stages} stages ({', '.join(names[d] for d in distinct[0])}), {tail}"
    if not disjoint:
        devs = sorted(set().union(*distinct))
        return f"hybrid over {len(devs)} devices (up to {stages} per micro-batch), {tail}"
    if stages == 1:
        return f"data-parallel {replicas}, {tail}"
    if len({len(s) for s in distinct}) == 1:
        return f"{stages} stages x data-parallel {replicas}, {tail}"
    # replicas of unequal depth (one GPU's micro-batches also run on the CPU): "2 stages x" would count
    # devices the machine may not have
    devs = sorted(set().union(*distinct))
    shown = ", ".join("+".join(names[d] for d in s) for s in distinct) if replicas <= 8 else \
        f"{min(map(len, distinct))}-{stages} devices each"
    return f"data-parallel {replicas} over {len(devs)} devices (replicas: {shown}), {tail}"
