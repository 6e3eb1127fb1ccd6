"""The one answer path (DESIGN.md section 4c): the search at every micro-batch count the run weighs,
its budget shared by successive halving (:mod:`postplace.api.over_m`), the same candidates at every
count, and the fastest feasible of all of them returned, writing the run folder as it goes. One pinned
count is the special case of one count and one round.

Every feature works at every count: the torch evaluator and Ray evaluate each count's samples,
``--confirm`` measures the K best candidates of the whole run (each on a measurer traced at its own
count), and a finished run extends to a larger budget. A run pinned to one count keeps its search in
the run folder itself; a run over several keeps each count's in ``m{m}/`` beside ``plans.json``.
"""

from __future__ import annotations

import dataclasses
import math
import shutil
import sys
import tempfile
import time
import types
from pathlib import Path

import numpy as np

from postplace.api.candidates import (
    CANDIDATE_PLACERS,
    grid_candidate,
    hybrid_candidate,
    oneshot_candidates,
    plan_candidates,
    search_candidate,
    warm_start_ops,
)
from postplace.api.measure import check_confirm, check_ray, confirm_best, ray_evaluator, torch_evaluator
from postplace.api.over_m import halving_rounds, read_plans, write_plans
from postplace.api.result import Candidate, PlaceResult
from postplace.api.settings import SETTINGS, RunSettings, build_strategy, record_start, search_start, write_settings
from postplace.api.summary import plan_line, run_summary
from postplace.api.target import Target
from postplace.errors import PostplaceError
from postplace.validate import make_folder


def with_report(result: PlaceResult, out, report: bool) -> PlaceResult:
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


@dataclasses.dataclass
class _Arm:
    """One micro-batch count: its step, its problem (whose simulator prices plans and bounds), the
    evaluator that judges its samples and one-shot candidates, and what its search found."""

    m: int
    target: Target
    problem: object
    judge: object
    warm_ops: np.ndarray | None
    folder: Path | None
    oneshot: list = dataclasses.field(default_factory=list)
    result: object = None
    strategy: object = None  # the last round's, after its search: its start is recorded
    plan_search: dict | None = None  # Post over the per-unit plan space at this count (hybrid_candidate)

    def value(self) -> float:
        best = [c.step_time_s for c in self.oneshot if c.feasible]
        if self.result is not None and self.result.best_placement is not None:
            best.append(self.result.best_step_time)
        return min(best, default=math.inf)


def place_run(
    settings: RunSettings,
    targets: dict[int, Target],
    c,
    *,
    out: Path | None,
    resume: bool,
    progress: bool,
    confirm_k: int = 0,
    ray: str | None = None,
    confirm_with: str = "process",
) -> PlaceResult:
    """Search every count of ``targets`` (``{m: Target}``) and return the fastest feasible candidate of
    all as a :class:`postplace.PlaceResult` (module docstring); ``confirm_with``: how ``--confirm``
    measures (:class:`postplace.Measure`)."""
    from postplace.search import Budget
    from postplace.search.checkpoint import CHECKPOINT

    t0 = time.perf_counter()
    over_m = settings.over_m
    counts = sorted(targets)
    budget = Budget.parse(settings.budget)
    sizes = halving_rounds(len(counts))
    need = len(sizes) * len(counts)  # round 0 gives every count budget / (rounds x counts) samples
    if budget.samples is not None and budget.samples < need:
        raise PostplaceError(
            f"--budget {budget.samples}: halving over the micro-batch counts {counts} needs at "
            f"least {need} samples; give a larger --budget, or pin a count with --microbatches M"
        )
    folders = {m: None if out is None else out / f"m{m}" if over_m else out for m in counts}
    if (
        out is not None
        and not resume
        and ((out / SETTINGS).exists() or any((f / CHECKPOINT).exists() for f in folders.values()))
    ):
        raise PostplaceError(f"{out} already holds a run; pass --resume {out} to continue it, or pick a new --out")
    arms = {m: _arm(settings, m, targets[m], c, folders[m], resume=resume, over_m=over_m) for m in counts}
    check_confirm(confirm_k, settings, targets[counts[0]], out, ray, confirm_with)
    started = False  # Ray is started or joined before anything is written: a bad --ray leaves no folder
    if ray is not None:
        from postplace.distributed.ray_evaluator import init_ray

        check_ray(settings, targets.values())
        started = init_ray(ray)
    try:
        return _search_and_answer(
            settings,
            arms,
            c,
            budget,
            sizes,
            out=out,
            resume=resume,
            progress=progress,
            confirm_k=confirm_k,
            ray=ray,
            over_m=over_m,
            t0=t0,
            confirm_with=confirm_with,
        )
    finally:
        if started:  # as a RayEvaluator that started it would: nothing left running
            import ray as ray_module

            ray_module.shutdown()


def _search_and_answer(
    settings: RunSettings,
    arms: dict,
    c,
    budget,
    sizes: list[int],
    *,
    out,
    resume,
    progress,
    confirm_k,
    ray,
    over_m,
    t0,
    confirm_with="process",
) -> PlaceResult:
    """Write the run folder, weigh the one-shot candidates, run the halving's rounds (``sizes``: how many
    counts each keeps) over ``budget``, answer."""

    counts = sorted(arms)
    if out is not None:  # every count's constraints and warm start passed: a bad flag writes nothing
        make_folder(out)
        for arm in arms.values():
            if arm.target.spec["kind"] in ("graph", "module") and not (arm.folder / "graph.json").exists():
                make_folder(arm.folder)
                arm.target.graph.save(arm.folder / "graph.json")
        write_settings(out, settings)
    # plans are simulated: never beside measured times, unless --confirm launches the ones it measures
    simulated = settings.evaluator == "simulator" and (not confirm_k or confirm_with == "launch")
    for arm in arms.values():
        arm.oneshot = oneshot_candidates(arm.problem, arm.judge, arm.warm_ops, settings.warm_start)
        if simulated:
            arm.oneshot += plan_candidates(
                arm.problem, pins=settings.pins, exclude=settings.exclude, largest=arm.m == counts[-1]
            )
    plans = [(k.step_time_s, m) for m, a in arms.items() for k in a.oneshot if k.plan and k.feasible]
    if simulated:  # the hybrid and the 3D grid at the count where the plans do best (else at the most m)
        arm = arms[min(plans)[1]] if plans else arms[counts[-1]]
        if plans:
            hybrid, arm.plan_search = hybrid_candidate(
                arm.problem,
                [k for k in arm.oneshot if k.plan],
                pins=settings.pins,
                exclude=settings.exclude,
                seed=settings.seed,
            )
            arm.oneshot += hybrid
            if arm.plan_search is not None:
                arm.plan_search["microbatches"] = arm.m
        arm.oneshot += grid_candidate(
            arm.problem, [k for k in arm.oneshot if k.plan], pins=settings.pins, exclude=settings.exclude
        )
    recorded = read_plans(out, counts, sizes) if out is not None and resume and over_m else []
    # without a run folder each count's search still continues from its checkpoint at every round, in a
    # scratch folder: a search started again would spend the earlier rounds' samples twice, and its batches
    # would be cut where they are not in a run with a folder, so the same seed would answer differently
    scratch = Path(tempfile.mkdtemp(prefix="postplace-search-")) if out is None else None
    try:
        rounds = _rounds(settings, arms, c, budget, sizes, recorded, scratch, out=out, progress=progress, ray=ray)
    finally:
        if scratch is not None:
            shutil.rmtree(scratch, ignore_errors=True)
    res = _answer(
        settings, arms, rounds, c, out, t0, over_m=over_m, confirm_k=confirm_k, ray=ray, confirm_with=confirm_with
    )
    if out is not None:
        res.save(out)
        record_start(out, settings, res.summary)
    return res


def _rounds(settings: RunSettings, arms: dict, c, budget, sizes, recorded, scratch, *, out, progress, ray) -> list:
    """The halving's rounds: each count still in searches on to its share of the budget, resumed from its
    folder's checkpoint (``scratch``'s when the run has none); the counts each round kept."""
    from postplace.search import Budget, run
    from postplace.search.checkpoint import CHECKPOINT

    counts, over_m = sorted(arms), settings.over_m
    meta = {"settings_checksum": settings.checksum()}
    spent = dict.fromkeys(counts, 0.0)
    alive = list(counts)
    rounds: list[list[int]] = []
    for r, size in enumerate(sizes):
        if r < len(recorded):
            alive = recorded[r]
        else:
            alive = sorted(sorted(alive, key=lambda m: (arms[m].value(), m))[:size])
            if out is not None and over_m:
                write_plans(out, counts, [*rounds, alive])
        rounds.append(alive)
        for m in alive:
            arm = arms[m]
            if budget.samples is not None:
                spent[m] += budget.samples // (len(sizes) * len(alive))
                share = Budget(samples=int(spent[m]))
            else:
                spent[m] += budget.seconds / (len(sizes) * len(alive))
                share = Budget(seconds=spent[m])
            if progress and over_m:
                print(f"m = {m}: round {r + 1} of {len(sizes)}, up to {share.describe()}", file=sys.stderr, flush=True)
            strat = build_strategy(settings, arm.problem.space)
            folder = arm.folder if scratch is None else scratch / f"m{m}"
            again = (folder / CHECKPOINT).exists()  # else: killed before its first checkpoint
            warm = None if arm.warm_ops is None else arm.problem.grouping.collapse(arm.warm_ops)
            # one count's actors at a time: a second evaluator's would wait for CPUs the first holds
            judge = arm.judge if ray is None else ray_evaluator(ray, settings, arm.target, c, arm.problem)
            try:
                arm.result = run(
                    strat,
                    judge,
                    share,
                    out_dir=folder,
                    resume=again,
                    progress=progress,
                    warm_start=warm,
                    meta=meta,
                    space=arm.problem.space,
                )
            finally:
                if judge is not arm.judge:
                    judge.shutdown()
            arm.strategy = strat
            if arm.result.interrupted:
                raise KeyboardInterrupt
    return rounds


def _arm(settings: RunSettings, m: int, tgt: Target, c, folder: Path | None, *, resume: bool, over_m: bool) -> _Arm:
    """One count's problem, evaluator and warm start, every constraint checked before any search runs;
    on resume, its checkpoint must be this run's."""
    from postplace.search import make_problem
    from postplace.search.checkpoint import CHECKPOINT, read_meta

    try:
        problem = make_problem(
            tgt.graph, c, groups=settings.groups, pins=settings.pins, exclude=settings.exclude, seed=settings.seed
        )
        judge = problem.simulator
        if settings.evaluator == "torch":
            judge, space = torch_evaluator(settings, tgt, c, problem)
            problem = dataclasses.replace(problem, space=space)
        warm = None if settings.warm_start is None else warm_start_ops(settings.warm_start, problem)
        build_strategy(settings, problem.space)
    except PostplaceError as exc:
        if not over_m:
            raise
        raise PostplaceError(f"at {m} micro-batch{'es' if m > 1 else ''}: {exc}") from None
    if resume and over_m and folder is not None and (folder / CHECKPOINT).exists():
        meta = read_meta(folder)
        if not isinstance(meta, dict) or meta.get("settings_checksum") not in settings.accepted_checksums():
            raise PostplaceError(
                f"{folder}: written by another run (its settings differ from {folder.parent}/"
                f"{SETTINGS}); start a new run"
            )
    return _Arm(m, tgt, problem, judge, warm, folder)


def _answer(
    settings: RunSettings,
    arms: dict,
    rounds,
    cluster,
    out,
    t0,
    *,
    over_m: bool,
    confirm_k: int,
    ray,
    confirm_with: str = "process",
) -> PlaceResult:
    from postplace.sim import Simulator

    pool = []  # (candidate, arm), named "NAME @mM" over several counts
    for m, arm in arms.items():
        for k in ([search_candidate(arm.problem, arm.result)] if arm.result is not None else []) + arm.oneshot:
            if over_m and m > 1 and k.name.startswith("single:"):
                continue  # the same device as at m = 1, with the accumulation on top
            named = dataclasses.replace(k, name=f"{k.name} @m{m}") if over_m else k
            pool.append((named, arm))
    feasible = [(k, a) for k, a in pool if k.feasible]
    if not feasible and over_m:
        raise PostplaceError(
            f"no feasible placement found at any micro-batch count ({', '.join(map(str, arms))}): "
            "every search sample, data parallelism, the pipeline and every placer is OOM or "
            "failed; try a larger --budget or a cluster with more memory"
        )
    if not feasible:
        samples = sum(a.result.samples for a in arms.values() if a.result is not None)
        raise PostplaceError(
            f"no feasible placement found: the search sampled {samples} placements, all OOM or failed, "
            f"and no one-shot placer ({', '.join(CANDIDATE_PLACERS)}) found one that fits; try a larger --budget "
            "or a cluster with more memory"
        )
    best, arm = min(feasible, key=lambda ka: (ka[0].step_time_s, ka[1].m))  # ties: the search first, then fewer m
    judge = arm.judge
    confirmed = None
    if confirm_k:
        answer = [(k, a.m) for k, a in pool]
        confirmed, m = confirm_best(
            confirm_k, settings, cluster, arms, ray, answer, over_m=over_m, confirm_with=confirm_with
        )
        arm = arms[m]
        best = Candidate(
            f"confirmed:{confirmed.best.label}",
            confirmed.placement,
            confirmed.best.measured_s,
            True,
            "measured by --confirm",
            confirmed.best.graph,  # a launched plan: the step its placement places, and the plan
            confirmed.best.plan,
        )
        judge = types.SimpleNamespace(name=confirmed.evaluator)  # the returned figure is measured: say so
    searched = [a for a in arms.values() if a.result is not None and a.result.best_placement is not None]
    top = min(searched, key=lambda a: (a.result.best_step_time, a.m)) if searched else arm
    graph, problem = arm.target.graph if best.graph is None else best.graph, arm.problem
    cm = problem.simulator.problem.cost_model
    sched = Simulator(graph, cluster, cost_model=cm).schedule(best.placement)
    cands = [k for k, _ in pool]
    summary = run_summary(
        settings,
        problem,
        judge,
        top.result,
        cands,
        best,
        sched,
        out,
        time.perf_counter() - t0,
        start=search_start(top.strategy),
    )
    summary["plan"] = plan_line(best, graph, cluster, cm, sched.peak_memory)
    summary["returned_plan"] = best.plan
    summary["plan_search"] = next((a.plan_search for a in arms.values() if a.plan_search is not None), None)
    if over_m:
        summary.update(_over_m_figures(settings, arms, rounds, arm, top, best))
        measured = summary["evaluator"] != "simulator"
        lb = summary["lower_bound_s"]
        summary["ratio_to_lower_bound"] = best.step_time_s / lb if lb > 0 and not measured else None
    norms = graph.metadata.get("microbatch_norms")
    if norms and arm.m > 1:  # the answer's batch norms see micro-batches, not the batch: say so beside the table
        from postplace.graph.trace_torch import norm_note

        note = norm_note(str(graph.metadata.get("model", graph.name)), list(norms))
        summary["microbatch_note"] = "; ".join(x for x in (summary.get("microbatch_note"), note) if x)
    if confirmed is not None:
        summary["confirm"] = confirmed.to_dict()
        summary["figures"].update(
            search_best_step_time_s="simulated",
            single_device_step_time_s="simulated",
            candidates="simulated",
            search_start="simulated",
        )
        summary["ratio_to_single_device"] = None  # a measured time over a simulated one means nothing
    search_ops = None
    if top is arm and top.result is not None and top.result.best_placement is not None:
        search_ops = top.problem.grouping.expand(top.result.best_placement)
    return PlaceResult(
        graph,
        cluster,
        best.placement,
        best.name,
        best.step_time_s,
        confirmed.evaluator if confirmed is not None else judge.name,
        top.result,
        search_ops,
        cands,
        summary["lower_bound_s"],
        sched,
        summary,
        arm.target.traced,
        arm.target.spec,
    )


def _over_m_figures(settings: RunSettings, arms: dict, rounds, arm: _Arm, top: _Arm, best: Candidate) -> dict:
    """What ``summary.json`` adds over several counts: each count's groups, samples, best and bound, the
    halving's rounds, and the whole run's totals."""
    one = arms.get(1)
    single = next((k for k in (one.oneshot if one else []) if k.name.startswith("single:") and k.feasible), None)
    ran = [a.result for a in arms.values() if a.result is not None]
    return {
        "graph": arm.target.graph.name if best.graph is None else best.graph.name,
        "microbatches": arm.m,
        "target_spec": arm.target.spec,
        "microbatch_colocation": settings.colocation,
        "microbatch_counts": sorted(arms),
        "halving_rounds": rounds,
        "microbatch_skipped": settings.microbatch_skipped or {},
        "search_microbatches": top.m if top.result is not None and top.result.best_placement is not None else None,
        "samples": sum(r.samples for r in ran),
        "feasible_samples": sum(r.feasible_samples for r in ran),
        "evaluations": sum(r.evaluations for r in ran),
        "wall_time_s": sum(r.wall_time_s for r in ran),
        "groups": arm.problem.grouping.num_groups,
        "groups_per_microbatches": {str(m): a.problem.grouping.num_groups for m, a in arms.items()},
        "samples_per_microbatches": {str(m): (a.result.samples if a.result else 0) for m, a in arms.items()},
        "best_per_microbatches": {
            str(m): (None if not math.isfinite(a.value()) else a.value()) for m, a in arms.items()
        },
        # each count's search starts from its own probe (its own graph): recorded where it searched
        "search_start_per_microbatches": {
            str(m): search_start(a.strategy) for m, a in arms.items() if a.strategy is not None
        },
        # each count's bound holds for its own graph; the answer may come from any of them
        "lower_bound_s": min(a.problem.simulator.lower_bound for a in arms.values()),
        "lower_bound_per_microbatches": {str(m): a.problem.simulator.lower_bound for m, a in arms.items()},
        "single_device": single.name.split(":", 1)[1] if single else None,
        "single_device_step_time_s": single.step_time_s if single else None,
        "ratio_to_single_device": best.step_time_s / single.step_time_s if single else None,
    }
