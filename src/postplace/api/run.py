"""One run: the search at one micro-batch count (problem, constraints, evaluator, strategy, warm
start, runner) followed by the candidates and the choice, writing the run folder as it goes; and the
run over every count (:mod:`postplace.api.over_m`) behind the same folder layout.
"""

from __future__ import annotations

import dataclasses
import time
import types
from pathlib import Path

from postplace.api.candidates import (
    CANDIDATE_PLACERS,
    _candidates,
    grid_candidate,
    hybrid_candidate,
    plan_candidates,
    warm_start_ops,
)
from postplace.api.measure import _check_confirm, _confirm, _ray_evaluator, _torch_evaluator
from postplace.api.over_m import place_over_m
from postplace.api.result import Candidate, PlaceResult
from postplace.api.settings import SETTINGS, _checksum, _record_start, _search_start, _strategy, _write_settings
from postplace.api.summary import _summary, plan_line
from postplace.api.target import Target
from postplace.errors import PostplaceError
from postplace.validate import make_folder


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


def _run_over_m(settings, targets_by_m, c, *, out, resume, progress, confirm=0, ray=None) -> PlaceResult:
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
    if judge.name == "simulator" and not confirm_k:  # the plans are simulated: never beside measured times
        plans = plan_candidates(settings, problem)
        cands += plans + hybrid_candidate(settings, problem, plans) + grid_candidate(settings, problem, plans)
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
    graph = graph if best.graph is None else best.graph  # a practitioner plan's own rewritten step
    op_sim = Simulator(graph, c, cost_model=problem.simulator.problem.cost_model)
    sched = op_sim.schedule(best.placement)
    summary = _summary(settings, problem, judge, result, cands, best, sched, out, time.perf_counter() - t0,
                       start=_search_start(strat))  # fmt: skip
    summary["plan"] = plan_line(best, graph, c, problem.simulator.problem.cost_model, sched.peak_memory)
    summary["returned_plan"] = best.plan
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
