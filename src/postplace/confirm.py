"""Search in simulation, confirm for real: measure the simulator's best few placements and keep the
fastest measured one.

A simulated search ranks thousands of placements by the simulator's step time; the simulator is a
model, so its first choice may not be the machine's. :func:`confirm` takes the K best distinct
placements of a finished search (:func:`candidates_from_cache` / :func:`candidates_from_run` read them
from the runner's cache of every placement it evaluated), adds the simulator's best single device, runs
them all through a measuring evaluator (:class:`~postplace.runtime.evaluator.TorchEvaluator`, on Ray
actors through :class:`~postplace.distributed.RayEvaluator` when asked, or launched as one process per
device by :class:`~postplace.runtime.launch_measure.LaunchEvaluator`, ``--confirm-with launch``, whose
rows keep each rank's figures and whose result says what it measured on), and returns the fastest
measured one that ran (not out of memory, not failed), with each placement's simulated and measured
step time side by side and the Spearman rank correlation between the two (over the placements that
ran; NaN with fewer than 3).

All placements :func:`confirm` measures are op-level (a device id per op of the graph): the measuring
evaluator must be built without a grouping (``group_of_op=None``), on the same graph: for a step traced
as m micro-batches, a measurer traced with the same m (``TorchEvaluator.for_zoo(..., microbatches=m,
colocation=mode)``, ``TorchZooFactory(..., microbatches=m, colocation=mode)``), which measures the whole
accumulated step. A practitioner plan (``ddp``, ``fsdp+recompute``...: its placement places its own
rewritten step, not the graph's ops) is measured apart, by :func:`confirm_plans`, only by a measurer
that launches it (:meth:`LaunchEvaluator.evaluate_plans
<postplace.runtime.launch_measure.LaunchEvaluator.evaluate_plans>`); its row keeps the plan and its
step (:attr:`ConfirmRow.plan`, :attr:`ConfirmRow.graph`), and :func:`merge_results` puts the plans'
rows and the placements' together.

Wiring ``place --confirm K --ray local|ADDRESS`` after the search (the CLI's part)::

    cands = candidates_from_run(out, simulator, k)          # or candidates_from_cache(state cache, ...)
    factory = TorchZooFactory(model, size, cluster, device_map=map_all_to, microbatches=m, colocation=mode)
    measurer = RayEvaluator(factory, address=ray) if ray else factory()
    result = confirm(simulator, measurer, cands)            # result.format() / result.to_dict()
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from postplace.errors import PostplaceError

__all__ = [
    "ConfirmResult",
    "ConfirmRow",
    "candidates_from_cache",
    "candidates_from_run",
    "confirm",
    "confirm_plans",
    "merge_results",
]


@dataclass
class ConfirmRow:
    """One measured placement: ``label`` (``search #1`` = the search's best, ``single:gpu0``...),
    op-level ``placement``, ``simulated_s``, ``measured_s`` (inf where it did not run), ``status``
    (``ok``, ``oom`` or ``failed``) and the evaluator's ``reason`` where it did not run; ``launch``: what
    a launched measurement ran (:class:`~postplace.runtime.launch_measure.LaunchEvaluator`), else None;
    ``plan``: the practitioner plan measured (``ddp:m=2,dp=2``), whose rewritten step ``graph`` the
    ``placement`` places (not the searched graph's ops), else None for both."""

    label: str
    placement: np.ndarray
    simulated_s: float
    measured_s: float
    status: str
    reason: str | None = None
    launch: dict | None = None
    plan: str | None = None
    graph: object | None = None

    def to_dict(self) -> dict:
        """``{"label", "simulated_s", "measured_s", "status", "reason"}``, ``"plan"`` where the row is a
        practitioner plan, and ``"launch"`` where the row was measured by launching it (its ranks, each
        rank's median step seconds, the steps run and timed)."""
        out = {
            "label": self.label,
            "simulated_s": self.simulated_s,
            "measured_s": self.measured_s if np.isfinite(self.measured_s) else None,
            "status": self.status,
            "reason": self.reason,
        }
        if self.plan is not None:
            out["plan"] = self.plan
        if self.launch is not None:
            out["launch"] = self.launch
        return out


@dataclass
class ConfirmResult:
    """The measured candidates (in the simulator's order), the one returned, and the rank correlation;
    ``measured_on``: what the measured figures were measured on, in words, where the measurer says
    (a launch's: ``"CPU processes (gloo) standing in for the devices"``), else None."""

    rows: list[ConfirmRow]
    best: ConfirmRow
    spearman: float
    simulator: str
    evaluator: str
    notes: list[str] = field(default_factory=list)
    measured_on: str | None = None

    @property
    def placement(self) -> np.ndarray:
        return self.best.placement

    def to_dict(self) -> dict:
        return {
            "returned": self.best.label,
            "measured_s": self.best.measured_s,
            "simulated_s": self.best.simulated_s,
            "spearman": None if np.isnan(self.spearman) else self.spearman,
            "simulator": self.simulator,
            "evaluator": self.evaluator,
            "candidates": [r.to_dict() for r in self.rows],
            "notes": list(self.notes),
            **({"measured_on": self.measured_on} if self.measured_on else {}),
        }

    def format(self) -> str:
        out = [f"{'placement':28} {'simulated ms':>13} {'measured ms':>12} {'sim/meas':>9}  status"]
        for r in self.rows:
            meas = f"{r.measured_s * 1e3:12.3f}" if np.isfinite(r.measured_s) else f"{'-':>12}"
            ratio = f"{r.simulated_s / r.measured_s:9.2f}" if np.isfinite(r.measured_s) else f"{'-':>9}"
            mark = "  <- returned" if r is self.best else ""
            why = f" ({r.reason})" if r.reason else ""
            out.append(f"{r.label:28} {r.simulated_s * 1e3:13.3f} {meas} {ratio}  {r.status}{why}{mark}")
        rho = "n/a (fewer than 3 placements ran)" if np.isnan(self.spearman) else f"{self.spearman:.3f}"
        out.append(f"Spearman rank correlation, simulated ({self.simulator}) vs measured ({self.evaluator}): {rho}")
        if self.measured_on:
            out.append(f"measured on: {self.measured_on}")
        out.extend(self.notes)
        return "\n".join(out)


def candidates_from_cache(cache: dict, simulator, k: int) -> np.ndarray:
    """The ``k`` best distinct feasible placements in a runner cache (placement bytes -> (step time, oom,
    failed, reason)), best first, expanded to op level by ``simulator`` (which knows the grouping)."""
    if k < 1:
        raise PostplaceError(f"--confirm {k}: give the number of placements to measure (1 or more)")
    ok = [(t, key) for key, (t, oom, failed, *_rest) in cache.items() if not oom and not failed and np.isfinite(t)]
    ok.sort(key=lambda x: x[0])  # stable: ties keep the order they were first evaluated in
    units = [np.frombuffer(key, dtype=np.int64) for _t, key in ok[:k]]
    if not units:
        return np.zeros((0, simulator.graph.num_ops), dtype=np.int64)
    return simulator.expand(np.stack(units))


def candidates_from_run(out_dir: str | Path, simulator, k: int) -> np.ndarray:
    """:func:`candidates_from_cache` over the cache saved in a run folder's checkpoint (``checkpoint.json``
    + npz, read by :mod:`postplace.search.state_io`, which checks its checksum)."""
    from postplace.search.state_io import load_state

    out = Path(out_dir)
    if not (out / "checkpoint.json").exists():
        raise PostplaceError(f"{out_dir}: no checkpoint.json; confirm needs a finished run folder (place --out DIR)")
    snap = load_state(out / "checkpoint.json")
    try:
        cache = {
            key.tobytes(): (float(t), bool(o), bool(f), r)
            for key, t, o, f, r in zip(
                snap["cache_keys"],
                snap["cache_step"],
                snap["cache_oom"],
                snap["cache_failed"],
                snap["cache_reasons"],
                strict=True,
            )
        }
    except (KeyError, TypeError, ValueError) as exc:
        raise PostplaceError(f"{out}/checkpoint.json: not a search checkpoint ({exc})") from None
    return candidates_from_cache(cache, simulator, k)


def confirm(
    simulator,
    measurer,
    candidates,
    *,
    single: bool = True,
    labels: list[str] | None = None,
    allowed: np.ndarray | None = None,
) -> ConfirmResult:
    """Measure ``candidates`` (op-level placements ``[k, num_ops]``, best simulated first) and, with
    ``single``, the simulator's best single device (among the devices ``allowed[op, d]`` permits: pins and
    exclusions); return the fastest measured one (module docstring).

    Raises :class:`~postplace.errors.PostplaceError` when nothing could be measured.
    """
    from postplace.placers import NoSingleDeviceFits, place_single

    cands = np.atleast_2d(np.asarray(candidates, dtype=np.int64)) if len(candidates) else None
    num_ops = simulator.graph.num_ops
    rows_ops: list[np.ndarray] = []
    names: list[str] = []
    seen: dict[bytes, int] = {}
    if cands is not None:
        if cands.shape[1] != num_ops:
            raise PostplaceError(f"confirm: candidates have {cands.shape[1]} columns, the graph has {num_ops} ops")
        for i, p in enumerate(cands):
            key = p.tobytes()
            if key in seen:
                continue
            seen[key] = len(rows_ops)
            rows_ops.append(p)
            names.append(labels[i] if labels else f"search #{i + 1}")
    mg = getattr(measurer, "graph", None)
    if mg is not None and tuple(mg.names) != tuple(simulator.graph.names):
        from postplace.graph.microbatch_names import placement_microbatches

        ms, mm = placement_microbatches(simulator.graph.names), placement_microbatches(mg.names)
        raise PostplaceError(
            f"confirm: the measuring evaluator runs graph '{mg.name}' ({mg.num_ops} ops, {mm} micro-batch(es)), "
            f"the candidates are of '{simulator.graph.name}' ({num_ops} ops, {ms} micro-batch(es)); "
            "build the measurer for the searched graph (same model, size and micro-batch count)"
        )
    notes = []
    if single:
        try:
            ops = place_single(
                simulator.graph, simulator.cluster, cost_model=simulator.problem.cost_model, allowed=allowed
            )
        except NoSingleDeviceFits:
            notes.append("no single device fits in memory (simulated): none measured")
        else:
            cl = simulator.cluster
            dev = cl.device_names[int(np.bincount(ops, minlength=cl.num_devices).argmax())]
            key = ops.tobytes()
            if key in seen:
                names[seen[key]] += f" = single:{dev}"
            else:
                seen[key] = len(rows_ops)
                rows_ops.append(ops)
                names.append(f"single:{dev}")
    if not rows_ops:
        raise PostplaceError("confirm: nothing to measure (the search found no feasible placement)")
    batch = np.stack(rows_ops)
    sim = simulator.evaluate_ops(batch)
    meas = measurer.evaluate(batch)
    rows = []
    launched = (meas.extra or {}).get("launch") or [None] * len(names)
    for j, label in enumerate(names):
        status, t = _outcome(meas, j)
        rows.append(ConfirmRow(label, batch[j], float(sim.step_time[j]), t, status, meas.reasons[j], launched[j]))
    ran, best = _fastest(rows, f"placements ran on {measurer.name}")
    on = getattr(measurer, "measured_on", None)
    return ConfirmResult(rows, best, _spearman(ran), simulator.name, measurer.name, notes, on)


def confirm_plans(measurer, plans) -> list[ConfirmRow]:
    """Measure practitioner plans: ``plans`` are ``(label, candidate)`` pairs, each candidate a plan of
    the measurer's step (``plan``: its name, ``placement`` over its own step ``graph``, ``step_time_s``:
    simulated), launched by ``measurer.evaluate_plans`` (a
    :class:`~postplace.runtime.launch_measure.LaunchEvaluator`). Returns their rows in the given order; a
    plan that cannot be launched is a ``failed`` row with its reason (never raised), as is one placed on
    other GPUs than the launcher would run it on (``--exclude``: a GPU the placement left out), unlaunched.

    Raises :class:`~postplace.errors.PostplaceError` when ``measurer`` does not launch plans (one
    process cannot run a plan's replicas).
    """
    if not plans:
        return []
    if not hasattr(measurer, "evaluate_plans"):
        raise PostplaceError(
            f"confirm: {getattr(measurer, 'name', type(measurer).__name__)} measures op-level placements only; "
            "practitioner plans run as one process per GPU: --confirm-with launch"
        )
    elsewhere = {j: why for j, (_, k) in enumerate(plans) if (why := _launched_elsewhere(measurer, k)) is not None}
    todo = [j for j in range(len(plans)) if j not in elsewhere]
    meas = measurer.evaluate_plans([plans[j][1].plan for j in todo]) if todo else None
    launched = ((meas.extra or {}).get("launch") if meas is not None else None) or [None] * len(todo)
    at = {j: i for i, j in enumerate(todo)}
    rows = []
    for j, (label, k) in enumerate(plans):
        placement = np.asarray(k.placement, dtype=np.int64)
        if j in elsewhere:
            rows.append(
                ConfirmRow(
                    label, placement, float(k.step_time_s), float("inf"), "failed", elsewhere[j], None, k.plan, k.graph
                )
            )
            continue
        i = at[j]
        status, t = _outcome(meas, i)
        rows.append(
            ConfirmRow(label, placement, float(k.step_time_s), t, status, meas.reasons[i], launched[i], k.plan, k.graph)
        )
    return rows


def _launched_elsewhere(measurer, k) -> str | None:
    """Why plan candidate ``k`` cannot be measured as placed: the launcher runs a plan on the cluster's first
    GPUs less the measurer's ``exclude``, and ``k`` was placed on other ones (a measurer not told what
    ``--exclude`` left out); None when they agree or the launcher would refuse the plan anyway (its own
    reason)."""
    cluster = getattr(measurer, "cluster", None)
    if cluster is None or not isinstance(k.plan, str) or k.placement is None:
        return None
    from postplace.placers.practitioner import plan_devices
    from postplace.plans import parse_plan

    try:
        gpus = plan_devices(cluster, parse_plan(k.plan), getattr(measurer, "exclude", ()))
    except PostplaceError:
        return None
    placed = {int(d) for d in np.unique(np.asarray(k.placement, dtype=np.int64))}
    missing = [cluster.device_names[d] for d in gpus if d not in placed]
    if not missing:
        return None
    names = ", ".join(cluster.device_names[d] for d in sorted(placed) if 0 <= d < len(cluster.device_names))
    return (
        f"plan '{k.plan}' is placed on {names}, but launch runs it on "
        f"{', '.join(cluster.device_names[d] for d in gpus)} ({', '.join(missing)} left out of the placement, "
        "as --exclude does); not launched"
    )


def _outcome(meas, i: int) -> tuple[str, float]:
    """Row ``i`` of a measurer's answer: its status (``ok``, ``oom``, ``failed``) and measured seconds (inf
    unless it ran)."""
    status = "failed" if meas.failed[i] else "oom" if meas.oom[i] else "ok"
    return status, float(meas.step_time[i]) if status == "ok" else float("inf")


def _fastest(rows: list[ConfirmRow], what: str) -> tuple[list[ConfirmRow], ConfirmRow]:
    """The rows that ran and the fastest measured of them (ties: the better simulated, earlier row); one
    error line naming the first failures when none ran (``what``: "placements ran on torch"...)."""
    ran = [r for r in rows if r.status == "ok"]
    if not ran:
        raise PostplaceError(
            f"confirm: none of the {len(rows)} {what} (" + "; ".join(f"{r.label}: {r.reason}" for r in rows[:3]) + ")"
        )
    return ran, min(ran, key=lambda r: r.measured_s)


def _spearman(rows: list[ConfirmRow]) -> float:
    if len(rows) < 3:
        return float("nan")
    from scipy.stats import spearmanr

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # constant input: NaN, said as "n/a"
        rho = spearmanr([r.simulated_s for r in rows], [r.measured_s for r in rows]).statistic
    return float(rho)


def merge_results(
    results: list[ConfirmResult],
    plans: list[ConfirmRow] = (),
    *,
    simulator: str | None = None,
    evaluator: str | None = None,
    measured_on: str | None = None,
) -> ConfirmResult:
    """One :class:`ConfirmResult` of several (placements measured at several micro-batch counts, each on
    its own measurer) and of the practitioner plans' rows ``plans`` (:func:`confirm_plans`): every row, in
    the simulator's order, the fastest measured one returned, and the rank correlation over all that ran.
    ``simulator``, ``evaluator`` and ``measured_on`` name what simulated and measured them (default: as
    the first result says).

    Raises :class:`~postplace.errors.PostplaceError` when none of the rows ran.
    """
    if len(results) == 1 and not plans:
        return results[0]
    rows = sorted([*(r for res in results for r in res.rows), *plans], key=lambda r: r.simulated_s)
    ran, best = _fastest(rows, "placements and plans ran")
    notes = [n for res in results for n in res.notes]
    first = results[0] if results else None
    return ConfirmResult(
        rows,
        best,
        _spearman(ran),
        simulator or (first.simulator if first else "simulator"),
        evaluator or (first.evaluator if first else "unknown"),
        notes,
        measured_on or (first.measured_on if first else None),
    )
