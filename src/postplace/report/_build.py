"""A run folder's report data, computed once: the "info" objects every renderer draws from.

:func:`build_report_data_for` reads only what ``place`` and ``compare`` write for people and other
tools (``summary.json``, ``history.jsonl``, ``placement.json``, ``compare.json`` and each search run's
``result.json``; :mod:`postplace.report._folder`), never a checkpoint, and tolerates missing optional
keys (the value is then the string ``"not recorded"``). The returned placement is simulated again with
:meth:`postplace.sim.Simulator.schedule` for its Gantt chart and its memory
(:mod:`postplace.report._schedule`), so the schedule is the simulator's, whatever evaluator judged the
search. Everything is plain JSON (lists, dicts, floats; None for a missing number) and goes to
``report.json``.

This module assembles the two kinds of data (a ``place`` run's and a comparison's) from the pieces
beside it: the checks of the folder's files (``_checks``), the curves (``_curves``), the schedule
(``_schedule``), the placement map (``_map``), the table's rows and bound (``_table``) and the
provenance (``_provenance``).
"""

from __future__ import annotations

from pathlib import Path

from postplace.errors import PostplaceError
from postplace.report._checks import check_compare, check_summary
from postplace.report._curves import NO_FEASIBLE, curve_info
from postplace.report._folder import (
    check_same_machine,
    checked_history,
    checked_units,
    read_run_json,
    resolve_cluster_for,
    resolve_graph,
    run_kind,
)
from postplace.report._map import placement_map_info
from postplace.report._provenance import (
    NOT_RECORDED,
    budget_text,
    cluster_info,
    graph_info,
    recorded,
    stamp,
    strategy_configs,
    versions,
)
from postplace.report._schedule import schedule_info
from postplace.report._table import best_per_candidate, bound_info, candidate_info, start_info, start_record


def place_data(run_dir: Path, graph=None, cluster=None, size=None) -> tuple[dict, object]:
    from postplace.cluster.placement import load_placement

    s = check_summary(read_run_json(run_dir / "summary.json"), run_dir)
    g = resolve_graph(s, graph, size, run_dir)
    plan = s.get("returned_plan")
    if graph is None and plan is not None:  # a practitioner plan won: placement.json places its own step
        from postplace.plans import apply_plan, parse_plan

        if not isinstance(plan, str):
            raise PostplaceError(
                f"{run_dir / 'summary.json'}: field 'returned_plan' is not a plan's name; run place again"
            )
        spec = parse_plan(plan)
        g = apply_plan(g, spec, spec.replicas or 1).graph
    c = resolve_cluster_for(s, g, cluster, run_dir)
    check_same_machine(s, c, cluster, run_dir)
    if not (run_dir / "placement.json").exists():
        raise PostplaceError(f"{run_dir}: no placement.json (the run found no feasible placement)")
    from postplace.search.history import TIMING, read_timing

    ops = load_placement(run_dir / "placement.json", g, c)
    schedule, memory, sched = schedule_info(g, c, ops, f"placement.json ({recorded(s, 'returned')})")
    strategy = s.get("strategy", NOT_RECORDED)
    counts = s.get("microbatch_counts")
    if isinstance(counts, list) and all(type(m) is int for m in counts):  # one search per micro-batch count
        curves = [
            curve_info(
                f"{strategy} m={m}",
                [
                    {
                        "seed": s.get("seed", 0),
                        "history": checked_history(run_dir / f"m{m}" / "history.jsonl"),
                        "wall_time_s": None,
                        "timing": read_timing(run_dir / f"m{m}" / TIMING),
                    }
                ],
            )
            for m in counts
            if (run_dir / f"m{m}" / "history.jsonl").exists()
        ]
    else:
        curves = [
            curve_info(
                str(strategy),
                [
                    {
                        "seed": s.get("seed", 0),
                        "history": checked_history(run_dir / "history.jsonl"),
                        "wall_time_s": s.get("wall_time_s"),
                        "timing": read_timing(run_dir / TIMING),
                    }
                ],
            )
        ]
    cands = s.get("candidates") if isinstance(s.get("candidates"), dict) else {}
    notes = s.get("candidate_notes") if isinstance(s.get("candidate_notes"), dict) else {}
    candidates = candidate_info(cands, notes)
    search_note = notes.get("search") or notes.get(f"search @m{s.get('search_microbatches')}") or ""
    search_at = f" @m{s['search_microbatches']}" if s.get("microbatch_counts") and s.get("search_microbatches") else ""
    search_best = s.get("search_best_step_time_s")
    bars = [
        {
            "label": f"returned ({recorded(s, 'returned')})",
            "kind": "returned",
            "best_s": s.get("best_step_time_s"),
            "note": "",
        },
        {
            "label": f"{strategy} search best{search_at}",
            "kind": "search",
            "best_s": search_best,
            "note": search_note or ("" if search_best is not None else NO_FEASIBLE),
        },
    ]
    bars += [
        {"label": c["label"], "kind": c["kind"], "best_s": c["best_s"], "note": c["note"], "keys": c["keys"]}
        for c in best_per_candidate(candidates)
    ]
    if not any(b["kind"] == "single" for b in bars) and s.get("single_device_step_time_s") is not None:
        bars.append(
            {
                "label": f"single:{recorded(s, 'single_device')}",
                "kind": "single",
                "best_s": s.get("single_device_step_time_s"),
                "note": "",
            }
        )
    from postplace.search import make_problem

    groups = s.get("groups")
    settings = read_run_json(run_dir / "run.json") if (run_dir / "run.json").is_file() else {}
    excluded = settings.get("exclude") if isinstance(settings, dict) else None  # the run's --exclude, as it searched
    exclude = [d for d in excluded or () if isinstance(d, str) and d in c.device_names]
    space = make_problem(g, c, groups=groups if isinstance(groups, int) else 256, exclude=exclude).space
    if isinstance(s.get("config"), dict):  # the run's own config (with any --set / --config applied)
        recorded_configs, config_source = {strategy: s["config"]}, "recorded in the run's summary"
    else:
        recorded_configs = strategy_configs([strategy], space) if strategy != NOT_RECORDED else {}
        config_source = "this code version's defaults"
    prov = {
        "kind": "place",
        "graph": graph_info(g),
        "cluster": cluster_info(c),
        "strategies": [strategy],
        "strategy_configs": recorded_configs,
        "config_source": config_source,
        "budget": budget_text(recorded(s, "budget")),
        "samples": recorded(s, "samples"),
        "seed": s.get("seed", NOT_RECORDED),
        "groups": recorded(s, "groups"),
        "evaluator": recorded(s, "evaluator"),
        "warm_start": recorded(s, "warm_start"),
        "wall_time_s": recorded(s, "wall_time_s"),
        "interrupted": recorded(s, "interrupted"),
        "versions": versions(g),
        "cost_model": recorded(s, "cost_model"),
        "cost_model_error": recorded(s, "cost_model_error"),
        "within_error": s.get("within_error") or [],
    }
    drawn = (
        f"the returned plan's step ({plan})"
        if isinstance(plan, str)
        else f"the returned count's step (m = {s['microbatches']})"
        if type(s.get("microbatches")) is int and isinstance(counts, list)
        else "the run's traced step"
    )
    bound = bound_info(s.get("lower_bound_s"), s.get("lower_bound_per_microbatches"), schedule, drawn)
    numbers = {
        k: s.get(k)
        for k in (
            "best_step_time_s",
            "search_best_step_time_s",
            "single_device_step_time_s",
            "lower_bound_s",
            "ratio_to_lower_bound",
            "ratio_to_single_device",
            "samples",
            "feasible_samples",
            "mfu",
            "tokens_per_s_per_device",
        )
    }
    data = {
        "kind": "place",
        "title": f"{g.name} on {c.name}: {strategy}, {recorded(s, 'samples')} samples"
        + (f"; plan: {s['plan']}" if isinstance(s.get("plan"), str) else ""),
        "provenance": prov,
        "numbers": numbers,
        "curves": curves,
        "bars": bars,
        "candidates": candidates,
        "seeds": 1,
        "microbatch_counts": counts if isinstance(counts, list) else None,
        "search_start": start_info(s),
        "lines": {"single_device_s": s.get("single_device_step_time_s"), "lower_bound_s": bound["lower_bound_s"]},
        "lower_bound": bound,
        "schedule": schedule,
        "memory": memory,
        "placement_map": placement_map_info(g, c, ops),
    }
    return data, sched


def compare_data(run_dir: Path, graph=None, cluster=None, size=None) -> tuple[dict, object]:
    from postplace.search import make_problem
    from postplace.search.history import TIMING, read_timing

    rep = check_compare(read_run_json(run_dir / "compare.json"), run_dir)
    g = resolve_graph(rep, graph, size, run_dir)
    c = resolve_cluster_for(rep, g, cluster, run_dir)
    rows = rep.get("rows", [])
    problem = make_problem(g, c)
    curves, best = [], None  # best: (step time, label, op placement getter)
    for r in rows:
        if r.get("kind") != "search":
            continue
        runs = []
        for ps in r.get("per_seed", []):
            folder = run_dir / "runs" / r["strategy"] / f"seed{ps['seed']}"
            runs.append(
                {
                    "seed": ps["seed"],
                    "history": checked_history(folder / "history.jsonl"),
                    "wall_time_s": ps.get("wall_time_s"),
                    "timing": read_timing(folder / TIMING),
                }
            )
            res = folder / "result.json"
            t = ps.get("best_step_time_s")
            if t is not None and res.exists() and (best is None or t < best[0]):
                best = (t, f"{r['strategy']} seed {ps['seed']} (the comparison's best search run)", res)
        curves.append(curve_info(r["strategy"], runs))
    ops = None
    if best is not None:
        units = checked_units(best[2], problem.grouping.num_groups, c.num_devices)
        if units is not None:
            ops = problem.grouping.expand(units)
    source = best[1] if ops is not None else None
    placers = [
        r
        for r in rows
        if r.get("kind") == "placer" and r.get("best_step_time_s") is not None and not r.get("oom_count")
    ]
    if placers:
        p = min(placers, key=lambda r: r["best_step_time_s"])
        if ops is None or p["best_step_time_s"] < best[0]:
            from postplace.placers import place

            ops = place(p["strategy"], g, c)
            source = f"{p['strategy']} (the comparison's best one-shot placer, faster than every search)"
    if ops is None:
        raise PostplaceError(f"{run_dir}: no strategy found a feasible placement; nothing to draw")
    schedule, memory, sched = schedule_info(g, c, ops, source)
    bars = [
        {
            "label": r["strategy"],
            "kind": "data-parallel"
            if str(r.get("kind", "")).startswith("data-parallel")
            else "single"
            if r["strategy"] == "single"
            else r.get("kind"),
            "best_s": r.get("best_step_time_s"),
            "min_s": r.get("min_step_time_s"),
            "max_s": r.get("max_step_time_s"),
            "oom": r.get("oom_count", 0),
            "seeds": r.get("seeds"),
            "start": start_record({"name": r.get("start_name"), "step_time_s": r.get("start_step_time_s")}),
            "note": r.get("note")
            or (NO_FEASIBLE if r.get("kind") == "search" and r.get("best_step_time_s") is None else ""),
        }
        for r in rows
    ]
    search_names = [r["strategy"] for r in rows if r.get("kind") == "search"]
    bound = bound_info(rep.get("lower_bound_s"), None, schedule, "the compared step")
    prov = {
        "kind": "compare",
        "graph": graph_info(g),
        "cluster": cluster_info(c),
        "strategies": [r["strategy"] for r in rows],
        "strategy_configs": strategy_configs(search_names, problem.space),
        "config_source": "this code version's defaults",
        "budget": budget_text(recorded(rep, "budget_samples")),
        "seeds": list(range(rep["seeds"])) if isinstance(rep.get("seeds"), int) else NOT_RECORDED,
        "groups": recorded(rep, "groups"),
        "evaluator": recorded(rep, "evaluator"),
        "wall_time_s": sum(float(r.get("wall_time_s") or 0) * (r.get("seeds") or 1) for r in rows),
        "wall_time_note": (
            "sum over rows of each row's wall time"
            if rep.get("seeds") == 1
            else "sum over rows of the median run's wall time x seeds"
        ),
        "versions": versions(g),
    }
    data = {
        "kind": "compare",
        "title": f"{g.name} on {c.name}: {len(rows)} strategies, {recorded(rep, 'budget_samples')} samples x "
        f"{recorded(rep, 'seeds')} seed{'' if rep.get('seeds') == 1 else 's'}",
        "seeds": rep["seeds"] if isinstance(rep.get("seeds"), int) else None,
        "provenance": prov,
        "numbers": {
            "lower_bound_s": rep.get("lower_bound_s"),
            "single_device_step_time_s": rep.get("single_device_step_time_s"),
            "rows": {r["strategy"]: r.get("best_step_time_s") for r in rows},
        },
        "curves": curves,
        "bars": bars,
        "lines": {"single_device_s": rep.get("single_device_step_time_s"), "lower_bound_s": bound["lower_bound_s"]},
        "lower_bound": bound,
        "schedule": schedule,
        "memory": memory,
        "placement_map": placement_map_info(g, c, ops),
    }
    return data, sched


def seeds_of(data: dict) -> int:
    """The most seeds any strategy of a report's data ran (1 for a place run)."""
    counts = [b.get("seeds") for b in data.get("bars", []) if isinstance(b.get("seeds"), int)]
    counts += [len(c.get("seeds", [])) for c in data.get("curves", [])]
    return max(counts + [int(data.get("seeds") or 1)])


def build_report_data_for(run_dir, *, graph=None, cluster=None, size: str | None = None) -> tuple[dict, object]:
    """(report data, the re-simulated Schedule) of a ``place`` or ``compare`` folder.

    Parameters
    ----------
    run_dir : str or path
        A folder written by ``postplace place`` or ``compare``.
    graph, cluster, size : optional
        As :func:`postplace.report.write_report` takes them.

    Returns
    -------
    tuple
        ``(data, schedule)``: the JSON-able data the report draws, and the
        :class:`~postplace.sim.Schedule`, simulated again, of the placement it draws (a ``place``
        run's returned one; a comparison's fastest search run or one-shot placer).

    Raises
    ------
    PostplaceError
        For a paper folder or a folder of no run, a damaged file, a graph or cluster that cannot be
        found, or a comparison with no feasible placement to draw.
    """
    run_dir = Path(run_dir)
    kind = run_kind(run_dir)
    if kind == "paper":
        raise PostplaceError(f"{run_dir}: a paper folder has one report per model and machine; use write_report")
    build = place_data if kind == "place" else compare_data
    data, sched = build(run_dir, graph, cluster, size)
    data["run_dir"] = str(run_dir)
    return stamp(data), sched
