"""``postplace compare``: every baseline and search strategy on one graph and cluster, side by side.

One-shot placers run once; search strategies run once per seed with the same sample budget, each
into its own run folder (``DIR/runs/<strategy>/seed<k>``) with history and checkpoint, so an
interrupted comparison resumes where it stopped: finished runs are read back, unfinished ones resume
from their checkpoint, but only when graph, cluster, strategy, budget, seed and configuration all
match (a run folder made with other settings is stale: it is removed and run again). Every number
comes from the same evaluator (the simulator), and a search row reports the strategy's own best (no
fallback to the single-device placement here). A placer whose placement is OOM shows no best time.
A search row also records where its search started (``start_name``, ``start_step_time_s``: the probe's
fastest candidate and its step time where the strategy probed, else None; median over seeds; with
``anchor_name`` beside them where the policy was anchored on another start,
:func:`postplace.search.starts.start_record`), so a row's gain over its start can be told from the start
itself; whether it made local moves (``local_moves``); and where its bests came from: per seed
``origins`` (:func:`postplace.search.origins.origin_stats`: the start's and the final time, the new
bests per origin after the probe and the share of the gap to the lower bound each closed), and the
new bests summed over seeds (``new_bests``).
"""

from __future__ import annotations

import csv
import json
import shutil
import statistics
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from postplace.cluster import Cluster
from postplace.cost.utilisation import model_flops, peak_of_devices_used
from postplace.errors import PostplaceError
from postplace.graph import OpGraph
from postplace.placers import REGISTRY
from postplace.search import Budget, make_problem, make_strategy, run
from postplace.search.checkpoint import CHECKPOINT, read_meta
from postplace.search.history import HISTORY, TIMING, best_so_far, read_history, read_timing, sample_times
from postplace.search.origins import history_origin_stats
from postplace.search.starts import start_record
from postplace.search.state_io import fingerprint
from postplace.validate import make_folder, read_json

PLACER_NAMES = (*REGISTRY, "data-parallel")
"""The one-shot rows: every placer (:data:`postplace.placers.REGISTRY`), then data parallelism."""
PLAN_NAMES = ("ddp", "zero2", "fsdp", "ddp+recompute", "zero2+recompute", "fsdp+recompute", "best-3d")
"""The practitioner plans' rows: each at its fastest micro-batch count, where the target can be traced again;
``best-3d`` the fastest of the tp x pp x dp grid (:mod:`postplace.placers.grid`) at any count, or of the
plain plans' rows above it."""
SEARCH_NAMES = ("random", "anneal", "hp", "reinforce", "ce", "ppo", "post-start", "local", "post")
"""The search rows of ``all``; ``post-start`` (Post's start, no learning) says what learning adds to it,
``local`` (local moves alone from that start) what the policy adds to the moves."""
ALL = PLACER_NAMES + PLAN_NAMES + SEARCH_NAMES


@dataclass
class Row:
    strategy: str
    kind: str  # "placer", "search", "data-parallel (simulated)" or "data-parallel (estimate)"
    best_step_time_s: float | None  # median over seeds for a search
    min_step_time_s: float | None = None
    max_step_time_s: float | None = None
    ratio_to_single: float | None = None
    ratio_to_lower_bound: float | None = None
    peak_memory_bytes: float | None = None  # the largest device peak of the (median-seed) placement
    oom_count: int = 0
    wall_time_s: float = 0.0
    seeds: int = 1
    note: str = ""
    start_name: str | None = None  # where the search started (the seeds' common start)
    start_step_time_s: float | None = None  # that start's step time, median over seeds (None: not probed)
    anchor_name: str | None = None  # the start the policy was anchored on, where it is not start_name
    local_moves: bool | None = None  # the search made local moves (its config's use_local)
    new_bests: dict | None = None  # new bests per origin after the probe, summed over seeds
    devices_used: list | None = None  # the devices its (fastest seed's) placement uses
    mfu: float | None = None  # model FLOPs utilisation of those devices at best_step_time_s
    per_seed: list = field(default_factory=list)


def parse_strategies(text: str) -> list[str]:
    """Names from ``--strategies`` (comma-separated, or ``all``: :data:`ALL`); a search strategy's named
    starts (``post-paper``, ``reinforce-probe``... :data:`postplace.search.VARIANTS`) are accepted too."""
    from postplace.search import STRATEGIES

    names = list(ALL) if text == "all" else [s.strip() for s in text.split(",") if s.strip()]
    known = [*ALL, *(n for n in STRATEGIES if n not in ALL)]
    for n in names:
        if n not in known:
            raise PostplaceError(f"--strategies: unknown '{n}'; choose from {', '.join(known)}, or all")
    return names


def compare(
    graph: OpGraph,
    cluster: Cluster,
    strategies: list[str],
    *,
    budget: int,
    seeds: int,
    out: Path,
    progress=None,
    expert_split: str | None = None,
    retraced: dict | None = None,
    target_spec: dict | None = None,
    cluster_spec: str | None = None,
) -> dict:
    """Run everything, write ``compare.json`` and ``compare.csv`` under ``out``, return the report.

    ``retraced``: ``{m: OpGraph}``, the same step traced as m micro-batches, where the target can be
    traced again. Then the ``data-parallel`` and ``pipeline`` rows are what a user would run: data
    parallelism simulated as a placement of those graphs (micro-batch k on GPU k, OOM where the
    replicated state does not fit) and the GPipe-style pipeline, each at its fastest m. Without them
    (a graph file), ``data-parallel`` is the analytic estimate, labelled as one, and ``pipeline`` the
    layer split of ``graph`` itself. ``target_spec``: where the graph came from (recorded, so that
    ``postplace report`` draws the folder without flags); ``cluster_spec``: the preset, ``workload:PRESET``
    or absolute TOML path the cluster was loaded from (recorded with the cluster's fingerprint, for the
    same reason)."""
    if expert_split is not None:
        _check_expert_split(graph, cluster, strategies, expert_split)
    out = make_folder(out)
    problem = make_problem(graph, cluster)
    sim = problem.simulator
    lb = sim.lower_bound
    single_time = _single_time(graph, cluster, sim)
    rows = []
    for name in strategies:
        if progress:
            progress(name)
        t = time.perf_counter()
        if name == "data-parallel" and retraced:
            rows.append(_yardstick_row("data-parallel", retraced, cluster))
        elif name == "pipeline" and retraced:
            rows.append(_yardstick_row("pipeline", retraced, cluster))
        elif name == "data-parallel":
            rows.append(_data_parallel_row(graph, cluster))
        elif name == "best-3d":
            rows.append(_grid_row(retraced, cluster, [r for r in rows if r.strategy in PLAN_NAMES]))
        elif name in PLAN_NAMES:
            rows.append(_plan_row(name, retraced, cluster))
        elif name in PLACER_NAMES:
            rows.append(_placer_row(name, graph, cluster, sim, expert_split))
        else:
            rows.append(_search_row(name, problem, budget, seeds, out, graph, cluster))
        rows[-1].wall_time_s = rows[-1].wall_time_s or time.perf_counter() - t
    flops = model_flops(graph)[0]
    precision = str(graph.metadata.get("precision", "fp32"))
    for r in rows:
        if r.best_step_time_s is not None:
            r.ratio_to_single = r.best_step_time_s / single_time if single_time else None
            r.ratio_to_lower_bound = r.best_step_time_s / lb if lb > 0 else None
            if r.devices_used and r.best_step_time_s > 0:
                used = [cluster.device_names.index(d) for d in r.devices_used]
                r.mfu = flops / (r.best_step_time_s * peak_of_devices_used(cluster, used, precision)[0])
    report = {
        "graph": graph.name,
        "cluster": cluster.name,
        "budget_samples": budget,
        "seeds": seeds,
        "evaluator": sim.name,
        "lower_bound_s": lb,
        "single_device_step_time_s": single_time,
        "cost_model": sim.problem.cost_model.describe(cluster) if hasattr(sim.problem.cost_model, "describe") else None,
        "cost_model_error": sim.problem.cost_model.step_error(cluster)
        if hasattr(sim.problem.cost_model, "step_error")
        else None,
        "groups": problem.grouping.num_groups,
        "target_spec": target_spec,
        "cluster_spec": cluster_spec,
        "cluster_sha": fingerprint(cluster),
        "microbatches": (target_spec or {}).get("microbatches", 1),
        "rows": [{k: v for k, v in asdict(r).items()} for r in rows],
    }
    (out / "compare.json").write_text(json.dumps(report, indent=1))
    with open(out / "compare.csv", "w", newline="") as f:
        w = csv.writer(f)
        cols = [c for c in asdict(rows[0]) if c not in ("per_seed", "new_bests")] if rows else []  # scalars
        w.writerow(cols)
        for r in rows:
            d = asdict(r)
            w.writerow([d[c] for c in cols])
    return report


def _names(cluster, ops) -> list[str]:
    """The names of the devices an op-level placement uses, in the cluster's order."""
    return [cluster.device_names[d] for d in sorted(set(np.asarray(ops, dtype=np.int64).tolist()))]


def _single_time(graph, cluster, sim) -> float | None:
    from postplace.placers import NoSingleDeviceFits, place_single

    try:
        ops = place_single(graph, cluster, cost_model=sim.problem.cost_model)
    except NoSingleDeviceFits:
        return None
    return float(sim.evaluate_ops(ops[None]).step_time[0])


def _check_expert_split(graph, cluster, strategies: list[str], expert_split) -> None:
    """A split file that is unused, unreadable or names devices the cluster lacks is one error line before any
    row runs (not after the searches before the ``expert`` row, nor as that row's note)."""
    from postplace.placers import place_expert

    if "expert" not in strategies:
        raise PostplaceError(
            f"--expert-split {str(expert_split)[:80]}: only the 'expert' row reads it, and "
            "--strategies leaves that out; add expert to --strategies or drop --expert-split"
        )
    place_expert(graph, cluster, split=expert_split)


def _placer_row(name, graph, cluster, sim, expert_split) -> Row:
    from postplace.placers import PlacementError, place

    kwargs = {"split": expert_split} if name == "expert" and expert_split else {}
    t = time.perf_counter()
    try:
        ops = place(name, graph, cluster, **kwargs)
    except PlacementError as exc:
        return Row(name, "placer", None, note=str(exc), wall_time_s=time.perf_counter() - t)
    wall = time.perf_counter() - t
    res = sim.evaluate_ops(ops[None])
    if res.failed[0]:
        return Row(name, "placer", None, note=f"invalid placement: {res.reasons[0]}", wall_time_s=wall)
    step = float(res.step_time[0])
    if res.oom[0]:  # an OOM placement has no step time to report as a result
        return Row(
            name,
            "placer",
            None,
            peak_memory_bytes=float(res.peak_mem[0].max()),
            oom_count=1,
            wall_time_s=wall,
            note=f"OOM: this placement does not fit (it would take {step * 1e3:.2f} ms)",
        )
    return Row(
        name,
        "placer",
        step,
        step,
        step,
        peak_memory_bytes=float(res.peak_mem[0].max()),
        wall_time_s=wall,
        devices_used=_names(cluster, ops),
    )


def _yardstick_row(name: str, retraced: dict, cluster) -> Row:
    """Data parallelism or the pipeline at every m of ``retraced``, simulated; the fastest that fits."""
    from postplace.placers import PlacementError, place_pipeline, simulate_data_parallel
    from postplace.sim import Simulator

    t = time.perf_counter()
    best, notes = None, []
    for m, g in sorted(retraced.items()):
        sim = Simulator(g, cluster)
        try:
            if name == "data-parallel":
                if m == 1:
                    continue
                dp = simulate_data_parallel(g, cluster)
                ops, oom, peak = dp.placement, dp.oom, float(np.max(dp.peak_mem))
            else:
                ops = place_pipeline(g, cluster)
                oom, peak = None, None
        except PlacementError as exc:
            notes.append(f"m={m}: {exc}")
            continue
        res = sim.evaluate_ops(ops[None])
        oom = bool(res.oom[0]) if oom is None else oom
        peak = float(res.peak_mem[0].max()) if peak is None else peak
        if res.failed[0] or oom:
            notes.append(f"m={m}: OOM" if oom else f"m={m}: {res.reasons[0]}")
            continue
        step = float(res.step_time[0])
        if best is None or step < best[0]:
            best = (step, m, peak, _names(cluster, ops))
    kind = "data-parallel (simulated)" if name == "data-parallel" else "placer"
    wall = time.perf_counter() - t
    if name == "data-parallel" and max(retraced) < 2:
        return Row(
            name,
            kind,
            None,
            wall_time_s=wall,
            note="no step of 2 or more micro-batches could be traced (e.g. batch norm over one sample)",
        )
    if best is None:
        return Row(
            name,
            kind,
            None,
            oom_count=1,
            wall_time_s=wall,
            note="does not fit at any micro-batch count: " + "; ".join(notes),
        )
    step, m, peak, used = best
    what = "micro-batch k on GPU k, replicated state" if name == "data-parallel" else "GPipe-style stages"
    return Row(
        name,
        kind,
        step,
        step,
        step,
        peak_memory_bytes=peak,
        wall_time_s=wall,
        devices_used=used,
        note=f"fastest at m={m} of {sorted(retraced)} ({what}), simulated",
    )


def _plan_row(name: str, retraced: dict | None, cluster) -> Row:
    """A practitioner plan (:mod:`postplace.placers.practitioner`) at every m of ``retraced`` that is a
    multiple of the GPUs (at the largest, the largest divisor of m they allow), simulated; the fastest
    that fits."""
    from postplace.placers.practitioner import plan_devices, plan_replicas, plan_step
    from postplace.plans import parse_plan

    t = time.perf_counter()
    kind = "practitioner plan (simulated)"
    if not retraced:
        return Row(name, kind, None, note="needs a step that can be traced again as micro-batches (a zoo model)")
    spec = parse_plan(name)
    every = plan_devices(cluster, spec)
    best, notes = None, []
    for m, g in sorted(retraced.items()):
        k = plan_replicas(m, len(every), largest=m == max(retraced))
        if k < 2:
            continue
        r = plan_step(g, cluster, spec, every[:k])
        if r.oom:
            notes.append(f"m={m}: OOM")
        elif best is None or r.step_time_s < best[0]:
            best = (r.step_time_s, m, k, float(r.peak_memory_bytes.max()), list(r.devices))
    wall = time.perf_counter() - t
    if best is None:
        why = "; ".join(notes) if notes else f"no micro-batch count of {sorted(retraced)} splits over 2 or more GPUs"
        return Row(name, kind, None, oom_count=int(bool(notes)), wall_time_s=wall, note=f"does not run: {why}")
    step, m, k, peak, used = best
    return Row(
        name,
        kind,
        step,
        step,
        step,
        peak_memory_bytes=peak,
        wall_time_s=wall,
        devices_used=used,
        note=f"fastest at m={m} of {sorted(retraced)}, dp={k}, simulated",
    )


def _grid_row(retraced: dict | None, cluster, plain: list[Row]) -> Row:
    """``best-3d``: the practitioner's grid (:func:`postplace.placers.grid.best_3d`) at every m of
    ``retraced``, the fastest plan that fits, or the fastest of the ``plain`` plan rows where it is faster."""
    from postplace.placers.grid import best_3d
    from postplace.placers.practitioner import plan_devices
    from postplace.plans import parse_plan

    t = time.perf_counter()
    kind = "practitioner plan (simulated)"
    if not retraced:
        return Row("best-3d", kind, None, note="needs a step that can be traced again as micro-batches (a zoo model)")
    gpus = plan_devices(cluster, parse_plan("ddp"))
    best, tried = None, 0
    for g in retraced.values():
        grid = best_3d(g, cluster, gpus)
        tried += len(grid.tried)
        b = grid.best
        if b is not None and (best is None or b.step_time_s < best[0]):
            best = (b.step_time_s, b.describe(), float(b.peak_memory_bytes.max()), list(b.devices))
    for r in plain:
        if r.best_step_time_s is not None and (best is None or r.best_step_time_s < best[0]):
            best = (r.best_step_time_s, f"{r.strategy} ({r.note})", r.peak_memory_bytes, r.devices_used)
    wall = time.perf_counter() - t
    if best is None:
        return Row("best-3d", kind, None, wall_time_s=wall, note=f"no plan of {tried} fits")
    step, words, peak, used = best
    return Row(
        "best-3d",
        kind,
        step,
        step,
        step,
        peak_memory_bytes=peak,
        wall_time_s=wall,
        devices_used=used,
        note=f"{words}; best of {tried} grid plans over m={sorted(retraced)} and the plain rows, simulated",
    )


def _data_parallel_row(graph, cluster) -> Row:
    from postplace.placers import PlacementError, data_parallel_step_time

    try:
        r = data_parallel_step_time(graph, cluster)
    except PlacementError as exc:
        return Row("data-parallel", "data-parallel (estimate)", None, note=str(exc))
    return Row(
        "data-parallel",
        "data-parallel (estimate)",
        r.step_time,
        r.step_time,
        r.step_time,
        peak_memory_bytes=float(np.max(r.peak_mem)),
        oom_count=int(r.oom),
        note=f"analytic estimate (the graph cannot be traced again): all-reduce {r.allreduce_time * 1e3:.2f} "
        f"ms of {r.gradient_bytes / 1e6:.1f} MB ({r.gradient_source})",
    )


def run_key(graph, cluster, strategy, budget: int, seed: int) -> dict:
    """What a finished search run may be reused for: every input that changes its result."""
    cfg = getattr(strategy, "config", None)
    cfg = asdict(cfg) if cfg is not None else None
    key = {
        "graph": fingerprint(graph),
        "cluster": fingerprint(cluster),
        "strategy": strategy.name,
        "budget": budget,
        "seed": seed,
        "config": cfg,
    }
    return json.loads(json.dumps(key))  # as it reads back from result.json (tuples become lists)


def _recorded_key(folder: Path):
    done = folder / "result.json"
    try:
        if done.exists():
            return read_json(done, "result file", finite=False).get("key"), True
        if (folder / CHECKPOINT).exists():
            return read_meta(folder).get("key"), False
    except (PostplaceError, ValueError, OSError, AttributeError):
        pass  # damaged: treated as stale
    return None, False


REACH = 0.05
"""How close to its final best a search run must come for DESIGN.md section 6's "samples and wall time
to reach": within 5%."""


def samples_to_within(curve, frac: float = REACH) -> int | None:
    """The first sample (1-based) whose best-so-far is within ``frac`` of the curve's final value; None
    for an empty curve or one that never found a feasible placement."""
    if not len(curve) or not np.isfinite(curve[-1]):
        return None
    final = curve[-1]
    return next(i + 1 for i, v in enumerate(curve) if v <= final * (1 + frac))


def reach(folder: Path, frac: float = REACH) -> dict:
    """A run folder's samples and seconds until its best came within ``frac`` of its final best: from
    ``history.jsonl``, and ``timing.jsonl`` where that covers the run (else the seconds are None)."""
    try:
        curve = best_so_far(read_history(folder / HISTORY))
    except PostplaceError:  # a damaged history: the row still stands, without these two figures
        curve = []
    k = samples_to_within(curve, frac)
    times = sample_times(read_timing(folder / TIMING), len(curve))
    pct = f"{frac * 100:g}pct"
    return {
        f"samples_to_within_{pct}": k,
        f"seconds_to_within_{pct}": None if k is None or times is None else float(times[k - 1]),
    }


def _search_row(name, problem, budget: int, seeds: int, out: Path, graph, cluster) -> Row:
    bests, walls, peaks, ooms = [], [], [], 0
    per_seed, placed = [], []
    for seed in range(seeds):
        folder = out / "runs" / name / f"seed{seed}"
        done = folder / "result.json"
        strategy = make_strategy(name, problem.space, seed=seed)
        key = run_key(graph, cluster, strategy, budget, seed)
        recorded, finished = _recorded_key(folder)
        if folder.exists() and not same_key(recorded, key):
            shutil.rmtree(folder)  # made with other settings (or damaged): stale, never reused
            recorded, finished = None, False
        if finished:
            rec = read_json(done, "result file", finite=False)
        else:
            resume = (folder / CHECKPOINT).exists()
            t = time.perf_counter()
            r = run(
                strategy,
                problem.simulator,
                Budget(samples=budget),
                out_dir=folder,
                resume=resume,
                meta={"strategy": name, "seed": seed, "key": key},
            )
            if r.interrupted:
                raise KeyboardInterrupt
            peak = None
            if r.best_placement is not None:
                peak = float(problem.simulator.evaluate(r.best_placement[None]).peak_mem[0].max())
            rec = {
                "best_step_time_s": r.best_step_time if r.best_placement is not None else None,
                "wall_time_s": time.perf_counter() - t,
                "samples": r.samples,
                "feasible_samples": r.feasible_samples,
                "peak_memory_bytes": peak,
                "best_placement": None if r.best_placement is None else r.best_placement.tolist(),
                **{f"start_{k}" if k != "anchor_name" else k: v for k, v in start_record(strategy).items()},
                "key": key,
            }
            done.write_text(json.dumps(rec))
        per_seed.append(
            {
                "seed": seed,
                "start_name": None,
                "start_step_time_s": None,  # a run from before
                **{k: v for k, v in rec.items() if k not in ("best_placement", "key")},
                **reach(folder),
                "origins": origins(folder, problem.simulator.lower_bound),
            }
        )
        walls.append(rec["wall_time_s"])
        if rec["best_step_time_s"] is None:
            ooms += 1
        else:
            bests.append(rec["best_step_time_s"])
            peaks.append(rec["peak_memory_bytes"])
            placed.append(rec.get("best_placement"))
    start = _start_of(per_seed)
    start["local_moves"] = bool(getattr(getattr(strategy, "config", None), "use_local", False))
    start["new_bests"] = _summed([s["origins"]["new_bests"] for s in per_seed if s["origins"] is not None])
    if not bests:
        return Row(
            name,
            "search",
            None,
            oom_count=ooms,
            wall_time_s=statistics.median(walls),
            seeds=seeds,
            note="no feasible placement sampled",
            per_seed=per_seed,
            **start,
        )
    med = statistics.median(bests)
    cfg = getattr(strategy, "config", None)
    note = ""
    if getattr(cfg, "use_ce", False) and getattr(cfg, "use_ppo", False) and budget <= cfg.ce_every:
        note = (
            f"no cross-entropy step ran: the budget ({budget}) is not above ce_every ({cfg.ce_every}), so this "
            "run is PPO alone from its start"
        )
    fastest = placed[bests.index(min(bests))]
    used = None if fastest is None else _names(cluster, fastest)  # per group: every group's device is used
    return Row(
        name,
        "search",
        med,
        min(bests),
        max(bests),
        peak_memory_bytes=max(peaks),
        oom_count=ooms,
        wall_time_s=statistics.median(walls),
        seeds=seeds,
        note=note,
        per_seed=per_seed,
        devices_used=used,
        **start,
    )


def _start_of(per_seed: list[dict]) -> dict:
    """A search row's start from its seeds': the name they share (names joined with '/' where they
    differ; None where none recorded one) and the median of their start step times."""

    def joined(key: str) -> str | None:
        names = list(dict.fromkeys(s[key] for s in per_seed if s.get(key) is not None))
        return "/".join(names) if names else None

    times = [s["start_step_time_s"] for s in per_seed if s.get("start_step_time_s") is not None]
    return {
        "start_name": joined("start_name"),
        "anchor_name": joined("anchor_name"),
        "start_step_time_s": statistics.median(times) if times else None,
    }


def _summed(counts: list[dict]) -> dict | None:
    """Per-origin counts added over seeds (None: no seed recorded any)."""
    if not counts:
        return None
    out: dict = {}
    for c in counts:
        for k, v in c.items():
            out[k] = out.get(k, 0) + v
    return out


def origins(folder: Path, lower_bound: float) -> dict | None:
    """A run folder's :func:`postplace.search.origins.origin_stats`, from its ``history.jsonl`` (None
    when the history cannot be read)."""
    try:
        return history_origin_stats(read_history(folder / HISTORY), lower_bound)
    except PostplaceError:  # a damaged history: the row still stands, without these figures
        return None


def same_key(recorded, key: dict) -> bool:
    """A finished run's recorded key is this run's: equal, except that a config recorded before a field
    existed lacks it (the field's default keeps the old behaviour, and a named start is its own row)."""
    if not isinstance(recorded, dict) or not isinstance(recorded.get("config"), dict) or key["config"] is None:
        return recorded == key
    return {**recorded, "config": {**key["config"], **recorded["config"]}} == key
