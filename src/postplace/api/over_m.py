"""The product's answer over micro-batch counts (DESIGN.md section 4c): one run folder, one answer.

When the target can be traced again (a zoo model, a module with ``targets=``), ``place`` traces the
step as m micro-batches for every m of :func:`microbatch_counts` (1, 2, 4... dividing the batch, up to
the number of GPUs or 8, whichever is larger, or further to the count where one micro-batch fits)
and, at every m, weighs the same candidates: the search's own best, data parallelism, the
GPipe-style pipeline and the one-shot placers (``oneshot_candidates``).
The answer is the fastest feasible of all of them, over every m, so it is never slower than any.

The search budget goes where it pays, by successive halving over m (Jamieson and Talwalkar, 2016):
round r gives an equal share ``B / R`` to the counts still in, split evenly; after each round the
better half of them (by the best step time known at that m, search or candidate; ties to the smaller
m) stays in, until one is left. With 4 counts and 2400 samples: 200 each, then 400 for two, then
800 for one. Every count's search is an ordinary runner folder ``m{m}/`` (history, checkpoints), and
``plans.json`` records which counts each round kept, as it decides, so a run stopped at any moment
resumes to the same answer.

A finished run extends to a larger budget (``resume(out, budget=...)``): the rounds run again as
recorded, each count's share now that of the larger budget under the same rule (never less than it
holds), its search resumed from its checkpoint; a count that holds its share already runs nothing in
that round. Every earlier sample is kept, and rounds not yet decided are decided as above.
"""

from __future__ import annotations

import json
import math
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from postplace.api.candidates import (
    grid_candidate,
    hybrid_candidate,
    oneshot_candidates,
    plan_candidates,
    search_candidate,
    warm_start_ops,
)
from postplace.api.result import Candidate, PlaceResult
from postplace.api.settings import _checksum, _search_start, _strategy, accepted_checksums
from postplace.api.summary import _summary, plan_line
from postplace.errors import PostplaceError

__all__ = ["PLANS", "fitting_count", "halving_rounds", "microbatch_counts", "place_over_m",
           "trace_counts"]

PLANS = "plans.json"


def microbatch_counts(batch: int, gpus: int, fits_at: int = 1) -> list[int]:
    """Powers of two dividing ``batch``, up to ``max(8, gpus, fits_at)``: data parallelism over every
    GPU, pipelines of up to 8 micro-batches on small machines, and enough micro-batches for one
    micro-batch's activations to fit a GPU beside the whole replicated state (``fits_at``, from
    :func:`fitting_count`). (Twice the GPUs would halve a deep pipeline's bubble, but doubles the
    largest graph: 32 x Inception-V3 is 70,000 ops.)"""
    cap = min(batch, max(8, gpus, fits_at))
    out, m = [], 1
    while m <= cap:
        if batch % m == 0:
            out.append(m)
        m *= 2
    return out


def trace_counts(trace, counts) -> tuple[dict, dict[str, str]]:
    """``({m: trace(m)}, {m: why})`` over ``counts``: a count whose step cannot be traced (a
    :class:`PostplaceError`, e.g. batch norm over one sample per micro-batch) is left out, with its reason."""
    traced, skipped = {}, {}
    for m in counts:
        try:
            traced[m] = trace(m)
        except PostplaceError as exc:
            skipped[str(m)] = str(exc)
    return traced, skipped


def fitting_count(graph, cluster) -> int:
    """The smallest power of two m for which one micro-batch's activations (the one-batch step's
    peak on its first GPU, less the persistent bytes, over m) fit the smallest GPU beside the
    persistent state and a gradient per parameter: where a step needs gradient accumulation to fit
    at all (GPT-2 at batch 64 on 12 GB dies: 16), the counts must reach it. 1 without a GPU."""
    from postplace.cluster.placement import single_device
    from postplace.sim import Simulator

    gpus = [d for d in range(cluster.num_devices) if cluster.devices[d].kind == "gpu"]
    if not gpus:
        return 1
    ops = single_device(graph, cluster, cluster.device_names[gpus[0]])
    peak = float(Simulator(graph, cluster).evaluate_ops(ops[None]).peak_mem[0, gpus[0]])
    state = float(graph.persistent_bytes.sum()) + float(graph.metadata.get("param_bytes") or 0.0)
    room = float(min(cluster.capacity[gpus])) - state
    need = max(peak - float(graph.persistent_bytes.sum()), 0.0)
    if room <= 0:
        return 1 << 20  # the state alone does not fit: as many micro-batches as the batch allows
    m = 1
    while need / m > room:
        m *= 2
    return m


def halving_rounds(n: int) -> list[int]:
    """How many counts each round of successive halving runs: ``[n, ceil(n/2), ..., 1]``."""
    sizes = [n]
    while sizes[-1] > 1:
        sizes.append(math.ceil(sizes[-1] / 2))
    return sizes


@dataclass
class _Arm:
    m: int
    target: object
    problem: object
    warm_ops: np.ndarray | None
    oneshot: list
    folder: Path | None
    result: object = None
    strategy: object = None  # the last round's, after its search: its start is recorded

    def value(self) -> float:
        best = [c.step_time_s for c in self.oneshot if c.feasible]
        if self.result is not None and self.result.best_placement is not None:
            best.append(self.result.best_step_time)
        return min(best, default=math.inf)


def place_over_m(settings: dict, targets: dict, cluster, *, out: Path | None, resume: bool, progress: bool,
                 start=None) -> object:  # fmt: skip
    """Run the search over every count of ``targets`` (``{m: Target}``) by successive halving and
    return the fastest feasible candidate of all as a :class:`postplace.PlaceResult`.
    ``start()`` is called once every count's problem, constraints, warm start and strategy config
    passed, before anything is searched (the caller writes the run folder's settings there)."""
    from postplace.search import Budget, make_problem, run
    from postplace.search.runner import CHECKPOINT, read_meta

    t0 = time.perf_counter()
    counts = sorted(targets)
    budget = Budget.parse(settings["budget"])
    sizes = halving_rounds(len(counts))
    need = len(sizes) * len(counts)  # round 0 gives every count budget / (rounds x counts) samples
    if budget.samples is not None and budget.samples < need:
        raise PostplaceError(f"--budget {budget.samples}: halving over the micro-batch counts {counts} needs at "
                             f"least {need} samples; give a larger --budget, or pin a count with --microbatches M")
    checksum, accepted = _checksum(settings), accepted_checksums(settings)
    arms: dict[int, _Arm] = {}
    for m in counts:  # every constraint and warm start is checked at every m before any search runs
        tgt = targets[m]
        try:
            problem = make_problem(tgt.graph, cluster, groups=settings["groups"], pins=settings["pins"],
                                   exclude=settings["exclude"], seed=settings["seed"])  # fmt: skip
            warm = None if settings["warm_start"] is None else warm_start_ops(settings["warm_start"], problem)
            _strategy(settings, problem.space)
        except PostplaceError as exc:
            raise PostplaceError(f"at {m} micro-batch{'es' if m > 1 else ''}: {exc}") from None
        folder = None if out is None else out / f"m{m}"
        if resume and folder is not None and (folder / CHECKPOINT).exists():
            meta = read_meta(folder)
            if not isinstance(meta, dict) or meta.get("settings_checksum") not in accepted:
                raise PostplaceError(f"{folder}: written by another run (its settings differ from {out}/run.json); "
                                     "start a new run")  # fmt: skip
        arms[m] = _Arm(m, tgt, problem, warm, [], folder)
    if start is not None:
        start()
    for arm in arms.values():
        arm.oneshot = oneshot_candidates(settings, arm.problem, arm.problem.simulator, arm.warm_ops)
        arm.oneshot += plan_candidates(settings, arm.problem, largest=arm.m == max(arms))
    plans = [(c.step_time_s, m) for m, a in arms.items() for c in a.oneshot if c.plan and c.feasible]
    if plans:  # the hybrid, at the count where the plans do best
        arm = arms[min(plans)[1]]
        arm.oneshot += hybrid_candidate(settings, arm.problem, [c for c in arm.oneshot if c.plan])
    if arms:  # the 3D grid there too (at the most micro-batches when no plain plan fits)
        arm = arms[min(plans)[1]] if plans else arms[max(arms)]
        arm.oneshot += grid_candidate(settings, arm.problem, [c for c in arm.oneshot if c.plan])
    recorded = _read_plans(out, counts, sizes) if out is not None and resume else []
    meta = {"settings_checksum": checksum}
    spent = dict.fromkeys(counts, 0.0)
    alive = list(counts)
    rounds: list[list[int]] = []
    for r, size in enumerate(sizes):
        if r < len(recorded):
            alive = recorded[r]
        else:
            alive = sorted(sorted(alive, key=lambda m: (arms[m].value(), m))[:size])
            if out is not None:
                _write_plans(out, counts, [*rounds, alive])
        rounds.append(alive)
        for m in alive:
            arm = arms[m]
            if budget.samples is not None:
                spent[m] += budget.samples // (len(sizes) * len(alive))
                share = Budget(samples=int(spent[m]))
            else:
                spent[m] += budget.seconds / (len(sizes) * len(alive))
                share = Budget(seconds=spent[m])
            strat = _strategy(settings, arm.problem.space)
            again = arm.folder is not None and (arm.folder / CHECKPOINT).exists()
            if progress:
                print(f"m = {m}: round {r + 1} of {len(sizes)}, up to {share.describe()}", file=sys.stderr, flush=True)
            warm = None if arm.warm_ops is None else arm.problem.grouping.collapse(arm.warm_ops)
            arm.result = run(strat, arm.problem.simulator, share, out_dir=arm.folder, resume=again, progress=progress,
                             warm_start=warm, meta=meta, space=arm.problem.space)  # fmt: skip
            arm.strategy = strat
            if arm.result.interrupted:
                raise KeyboardInterrupt
    return _answer(settings, arms, rounds, cluster, out, t0)


def _answer(settings, arms: dict, rounds, cluster, out, t0):
    from postplace.sim import Simulator

    pool = []  # (candidate, arm)
    for m, arm in arms.items():
        cands = ([search_candidate(arm.problem, arm.result)] if arm.result is not None else []) + arm.oneshot
        for c in cands:
            if m > 1 and c.name.startswith("single:"):
                continue  # the same device as at m = 1, with the accumulation on top
            pool.append((Candidate(f"{c.name} @m{m}", c.placement, c.step_time_s, c.feasible, c.note, c.graph, c.plan),
                         arm))  # fmt: skip
    feasible = [(c, a) for c, a in pool if c.feasible]
    if not feasible:
        raise PostplaceError(f"no feasible placement found at any micro-batch count ({', '.join(map(str, arms))}): "
                             "every search sample, data parallelism, the pipeline and every placer is OOM or "
                             "failed; try a larger --budget or a cluster with more memory")  # fmt: skip
    best, arm = min(feasible, key=lambda ca: (ca[0].step_time_s, ca[1].m))  # ties: search first, then fewer m
    searched = [a for a in arms.values() if a.result is not None and a.result.best_placement is not None]
    top = min(searched, key=lambda a: (a.result.best_step_time, a.m)) if searched else arm
    graph, problem = arm.target.graph if best.graph is None else best.graph, arm.problem
    cm = problem.simulator.problem.cost_model
    sched = Simulator(graph, cluster, cost_model=cm).schedule(best.placement)
    result = top.result if top.result is not None else arm.result
    summary = _summary(settings, top.problem if top.result is not None else problem, problem.simulator, result,
                           [c for c, _ in pool], best, sched, out, time.perf_counter() - t0,
                           start=_search_start(top.strategy if top.result is not None else None))  # fmt: skip
    one = arms.get(1)
    single = next((c for c in (one.oneshot if one else []) if c.name.startswith("single:") and c.feasible), None)
    summary.update({
        "graph": graph.name, "microbatches": arm.m, "target_spec": arm.target.spec,
        "microbatch_colocation": settings["microbatch_colocation"],
        "microbatch_counts": sorted(arms), "halving_rounds": rounds,
        "microbatch_skipped": settings.get("microbatch_skipped", {}),
        "search_microbatches": top.m if top.result is not None and top.result.best_placement is not None else None,
        "samples": sum(a.result.samples for a in arms.values() if a.result is not None),
        "feasible_samples": sum(a.result.feasible_samples for a in arms.values() if a.result is not None),
        "evaluations": sum(a.result.evaluations for a in arms.values() if a.result is not None),
        "wall_time_s": sum(a.result.wall_time_s for a in arms.values() if a.result is not None),
        "groups": arm.problem.grouping.num_groups,
        "groups_per_microbatches": {str(m): a.problem.grouping.num_groups for m, a in arms.items()},
        "samples_per_microbatches": {str(m): (a.result.samples if a.result else 0) for m, a in arms.items()},
        "best_per_microbatches": {str(m): (None if not math.isfinite(a.value()) else a.value())
                                  for m, a in arms.items()},
        # each count's search starts from its own probe (its own graph): recorded where it searched
        "search_start_per_microbatches": {str(m): _search_start(a.strategy) for m, a in arms.items()
                                          if a.strategy is not None},
        "plan": plan_line(best, graph, cluster, cm, sched.peak_memory),
        "returned_plan": best.plan,
        # each count's bound holds for its own graph; the answer may come from any of them
        "lower_bound_s": min(a.problem.simulator.lower_bound for a in arms.values()),
        "lower_bound_per_microbatches": {str(m): a.problem.simulator.lower_bound for m, a in arms.items()},
        "single_device": single.name.split(":", 1)[1] if single else None,
        "single_device_step_time_s": single.step_time_s if single else None,
        "ratio_to_single_device": best.step_time_s / single.step_time_s if single else None,
    })  # fmt: skip
    norms = graph.metadata.get("microbatch_norms")
    if norms and arm.m > 1:  # the answer's batch norms see micro-batches, not the batch: say so beside the table
        from postplace.graph.trace_torch import norm_note

        note = norm_note(str(graph.metadata.get("model", graph.name)), list(norms))
        summary["microbatch_note"] = "; ".join(x for x in (summary.get("microbatch_note"), note) if x)
    lb = summary["lower_bound_s"]
    summary["ratio_to_lower_bound"] = best.step_time_s / lb if lb > 0 else None
    search_ops = None
    if top.result is not None and top.result.best_placement is not None:
        search_ops = top.problem.grouping.expand(top.result.best_placement)
    res = PlaceResult(graph, cluster, best.placement, best.name, best.step_time_s, problem.simulator.name, result,
                          search_ops if top is arm else None, [c for c, _ in pool], summary["lower_bound_s"], sched,
                          summary, arm.target.traced, arm.target.spec)  # fmt: skip
    if out is not None:
        res.save(out)
    return res


def _write_plans(out: Path, counts: list[int], rounds: list[list[int]]) -> None:
    tmp = out / (PLANS + ".tmp")
    tmp.write_text(json.dumps({"format": "postplace-plans", "counts": counts, "rounds": rounds}))
    tmp.replace(out / PLANS)


def _read_plans(out: Path, counts: list[int], sizes: list[int]) -> list[list[int]]:
    """The rounds a resumed run already decided, checked against the counts and the halving schedule."""
    path = out / PLANS
    if not path.exists():
        # round 1's decision is written before any search starts: a search without it lost its rounds
        searched = [f"m{m}" for m in counts if (out / f"m{m}" / "history.jsonl").exists()]
        if searched:
            raise PostplaceError(f"{path}: missing, while {', '.join(searched)} hold searches of this run (the "
                                 "halving's decisions are lost: deleted?); start a new run")  # fmt: skip
        return []
    try:
        d = json.loads(path.read_bytes().decode("utf-8"))
    except (OSError, UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise PostplaceError(f"{path}: damaged ({type(exc).__name__}); start a new run") from None
    rounds = d.get("rounds") if isinstance(d, dict) else None
    recorded = d.get("counts") if isinstance(d, dict) else None
    ok = isinstance(d, dict) and d.get("format") == "postplace-plans" and isinstance(recorded, list)
    ok = ok and [type(m) for m in recorded] == [int] * len(counts) and recorded == counts  # 2.0, true: not counts
    ok = ok and isinstance(rounds, list) and len(rounds) <= len(sizes)
    alive = counts
    for r, kept in enumerate(rounds if ok else []):
        if (not isinstance(kept, list) or len(kept) != sizes[r] or any(type(m) is not int for m in kept)
                or not set(kept) <= set(alive) or kept != sorted(set(kept))):  # fmt: skip
            ok = False
            break
        alive = kept
    if not ok:
        raise PostplaceError(f"{path}: not the rounds of this run (edited or damaged); start a new run")
    return rounds
