"""Evaluators beyond the simulator: measuring samples with the torch runtime (``--evaluator
torch``), on Ray actors (``--ray``), and ``--confirm K``, which measures the K best candidates for
real and returns the fastest measured: in this one process (``--confirm-with process``), on Ray
actors, or launched as one process per device (``--confirm-with launch``).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from postplace.api.options import check_confirm_with
from postplace.api.settings import RunSettings
from postplace.api.target import Target, recorded_step
from postplace.errors import PostplaceError


def torch_evaluator(settings: RunSettings, tgt: Target, c, problem):
    from dataclasses import replace

    judge = _measurer(settings, tgt, c, group_of_op=problem.grouping.group_of_op)
    # measured seconds can exceed the simulator's bound: failures must still score worst
    space = replace(problem.space, failure_step_time=max(problem.space.failure_step_time, judge.failure_step_time))
    return judge, space


def _measurer(settings: RunSettings, tgt: Target, c, *, group_of_op=None):
    """The in-process TorchEvaluator of the target's own code (a traced module or a zoo model), over
    ``group_of_op``'s units or, without it, at op level."""
    from postplace.runtime.evaluator import TorchEvaluator

    if tgt.traced is not None:
        return TorchEvaluator(tgt.traced, c, group_of_op=group_of_op, device_map=settings.map_all_to)
    spec = tgt.spec
    if spec.get("kind") != "zoo":
        raise PostplaceError(
            "measuring needs the step's code: a module's run folder keeps its graph, not the module; "
            "--evaluator torch and --confirm cannot continue it: start a new run from the module"
        )
    return TorchEvaluator.for_zoo(
        spec["name"],
        spec["size"],
        c,
        group_of_op=group_of_op,
        device_map=settings.map_all_to,
        graph=tgt.graph,
        microbatches=spec.get("microbatches", 1),
        colocation=spec.get("microbatch_colocation", "none"),
    )


def check_confirm(
    k: int, settings: RunSettings, tgt: Target, out: Path | None, ray: str | None, confirm_with: str = "process"
) -> None:
    """``--confirm K`` measures the K best of a simulated search: it needs code to run and a run folder;
    ``--confirm-with launch`` goes with it, without Ray, on the CPU (the run's recorded ``--map-all-to`` too)."""
    if isinstance(k, bool) or not isinstance(k, int | np.integer) or k < 0:
        raise PostplaceError(f"--confirm {k!r}: give how many of the search's best placements to measure (0 = none)")
    check_confirm_with(confirm_with, k, ray, settings.map_all_to)
    if not k:
        return
    if settings.evaluator != "simulator":
        raise PostplaceError(
            "--confirm measures a simulated search's best; with --evaluator torch every sample "
            "is measured already: drop --confirm"
        )
    if tgt.traced is None and tgt.spec.get("kind") != "zoo":
        raise PostplaceError(
            "--confirm runs placements for real: give a zoo model name or an nn.Module target "
            "(a graph file has no code to run)"
        )
    if out is None:
        raise PostplaceError("--confirm reads the search's best placements from its run folder: pass out=DIR")
    if ray is not None and tgt.spec.get("kind") != "zoo":
        raise PostplaceError("--confirm with --ray needs a zoo model name (actors trace it themselves)")


def check_ray(settings: RunSettings, targets) -> None:
    """``--ray`` with ``--evaluator torch`` needs a zoo model at every count: the actors trace it themselves."""
    if settings.evaluator == "torch" and any(t.spec.get("kind") != "zoo" for t in targets):
        raise PostplaceError("--ray with --evaluator torch needs a zoo model name (actors trace it themselves)")


def _zoo_factory(settings: RunSettings, tgt: Target, c, *, group_of_op=None):
    """A Ray actor's TorchEvaluator of the zoo target ``tgt`` (its size, count, colocation and step)."""
    from postplace.distributed import TorchZooFactory

    spec = tgt.spec
    return TorchZooFactory(
        spec["name"],
        spec["size"],
        c,
        group_of_op=group_of_op,
        device_map=settings.map_all_to,
        microbatches=spec.get("microbatches", 1),
        colocation=spec.get("microbatch_colocation", "none"),
        **recorded_step(spec),
    )


def ray_evaluator(address: str, settings: RunSettings, tgt: Target, c, problem):
    """The search's evaluator on Ray actors (``--ray local`` or an address): the same answers, in parallel
    (:func:`check_ray` first)."""
    from postplace.distributed import RayEvaluator, SimulatorFactory

    gop = problem.grouping.group_of_op
    if settings.evaluator == "torch":
        factory = _zoo_factory(settings, tgt, c, group_of_op=gop)
    else:
        factory = SimulatorFactory(problem.graph, c, group_of_op=gop, cost_model=problem.simulator.problem.cost_model)
    return RayEvaluator(factory, address=address)


def confirm_best(
    k: int,
    settings: RunSettings,
    c,
    arms: dict,
    ray: str | None,
    answer=(),
    *,
    over_m: bool = False,
    confirm_with: str = "process",
):
    """Measure the ``k`` best distinct candidates of the whole run by simulated step time (each count's
    search best from its cache, and the one-shot candidates ``answer``: placers, data parallelism,
    pipeline, warm start: ``(candidate, its count)`` pairs), each on a measurer traced at its own
    micro-batch count (``confirm_with``: in process, or launched as one process per device), and the
    best single device at the smallest count; the fastest measured wins. Returns the
    :class:`postplace.confirm.ConfirmResult` and the count of its best row.

    With ``confirm_with="launch"`` the practitioner plans among ``answer`` (a candidate with a ``plan``:
    ``ddp``, ``fsdp+recompute``, ``hybrid``, ``best-3d``...) take their place in the top ``k`` by
    simulated time too, one row per distinct plan (a plan two candidates name is one row, both names in
    its label), each launched as :func:`postplace.runtime.launcher.launch_plan` runs it on the step traced
    at its count (:func:`postplace.confirm.confirm_plans`); a plan's placement is over its own rewritten
    step, so it never joins the op-level placements. In process (or on Ray) plans are left out: one
    process cannot run their replicas."""
    from postplace.confirm import candidates_from_run, confirm_plans, merge_results
    from postplace.confirm import confirm as measure

    pool = []  # (simulated step time, order, label, op placement, m, the plan's candidate or None)
    at = (lambda m: f" @m{m}") if over_m else (lambda m: "")
    for m, arm in arms.items():
        searched = candidates_from_run(arm.folder, arm.problem.simulator, k)
        if len(searched):
            times = arm.problem.simulator.evaluate_ops(searched).step_time
            pool += [
                (float(t), len(pool) + i, f"search #{i + 1}{at(m)}", ops, m, None)
                for i, (t, ops) in enumerate(zip(times, searched, strict=True))
            ]
    for j, (k_, m) in enumerate(answer):  # (candidate, its count)
        base = k_.name.removesuffix(at(m))
        if not k_.feasible or base == "search" or base.startswith("single:"):
            continue
        plan = k_.plan is not None or k_.graph is not None  # placed over its own step
        if plan and confirm_with != "launch":
            continue  # one process cannot run a plan's replicas
        pool.append((k_.step_time_s, len(pool) + j, k_.name, k_.placement, m, k_ if plan else None))
    pool.sort(key=lambda x: (x[0], x[1]))
    chosen: dict[int, list] = {}  # m -> [label, op placement, plan candidate or None]
    seen: dict[tuple, list] = {}
    for _t, _i, label, ops, m, cand in pool:
        key = (m, "plan", cand.plan) if cand is not None else (m, np.asarray(ops, dtype=np.int64).tobytes())
        if key in seen:
            if cand is not None and label not in seen[key][0].split(" = "):
                seen[key][0] += f" = {label}"  # best-3d or the hybrid that is a plain plan: one row
        elif len(seen) < k:
            seen[key] = [label, ops, cand]
            chosen.setdefault(m, []).append(seen[key])
    results, plan_rows, errors, notes = [], [], [], []
    owner: dict[int, int] = {}  # id(row) -> its count
    names: dict = {}
    for m, arm in arms.items():
        rows = [(label, ops) for label, ops, cand in chosen.get(m, []) if cand is None]
        plans = [(label, cand) for label, _ops, cand in chosen.get(m, []) if cand is not None]
        single = m == min(arms)
        if not rows and not plans and not single:
            continue
        graph = arm.target.graph
        cands = np.stack([ops for _, ops in rows]) if rows else np.zeros((0, graph.num_ops), dtype=np.int64)
        measurer = _confirm_measurer(settings, arm.target, c, ray, confirm_with)
        names = names or {
            "simulator": arm.problem.simulator.name,
            "evaluator": measurer.name,
            "measured_on": getattr(measurer, "measured_on", None),
        }
        try:
            if rows or single:
                try:
                    res = measure(
                        arm.problem.simulator,
                        measurer,
                        cands,
                        single=single,
                        allowed=arm.problem.op_allowed,
                        labels=[label for label, _ in rows] or None,
                    )
                except PostplaceError as exc:
                    errors.append(exc)
                    notes.append(
                        f"at {m} micro-batch{'es' if m > 1 else ''} nothing was measured ({exc}): "
                        f"{', '.join(label for label, _ in rows) or 'the single device'} left out"
                    )
                else:
                    for row in res.rows:
                        if over_m and " @m" not in row.label:  # the single device: at its count too
                            row.label += at(m)
                        owner[id(row)] = m
                    results.append(res)
            for row in confirm_plans(measurer, plans):
                owner[id(row)] = m
                plan_rows.append(row)
        finally:
            if hasattr(measurer, "shutdown"):
                measurer.shutdown()
    if not results and not any(r.status == "ok" for r in plan_rows):
        if errors:
            raise errors[0]
    merged = merge_results(results, plan_rows, **names)
    merged.notes.extend(notes)
    return merged, owner[id(merged.best)]


def _confirm_measurer(settings: RunSettings, tgt: Target, c, ray: str | None, confirm_with: str = "process"):
    """What measures ``--confirm``'s placements of ``tgt`` at op level: in process, launched (one process
    per device), or on Ray actors."""
    if confirm_with == "launch":
        return launch_measurer(tgt, c, exclude=settings.exclude)
    if ray is None:
        return _measurer(settings, tgt, c)
    from postplace.distributed import RayEvaluator

    return RayEvaluator(_zoo_factory(settings, tgt, c), address=ray)  # a zoo model: check_confirm refused a module


def launch_measurer(tgt: Target, c, *, exclude=()):
    """The :class:`~postplace.runtime.launch_measure.LaunchEvaluator` of the target's own code (a traced
    module, or a zoo model traced again as its spec records it: size, count, colocation, optimizer,
    precision), on gloo: every rank a CPU process standing in for its device; a plan on the GPUs ``exclude``
    (``--exclude``) leaves, as the simulated plan ran."""
    from postplace.runtime.launch_measure import LaunchEvaluator

    if tgt.traced is not None:
        return LaunchEvaluator(tgt.traced, c, exclude=exclude)
    spec = tgt.spec
    if spec.get("kind") != "zoo":
        raise PostplaceError(
            "--confirm-with launch needs the step's code: a module's run folder keeps its graph, not the "
            "module: start a new run from the module"
        )
    return LaunchEvaluator.for_zoo(
        spec["name"],
        spec["size"],
        c,
        graph=tgt.graph,
        microbatches=spec.get("microbatches", 1),
        colocation=spec.get("microbatch_colocation", "none"),
        exclude=exclude,
    )
