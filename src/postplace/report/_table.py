"""The step-time table's rows and references: a ``place`` run's candidates (one row per one-shot
candidate, at its fastest micro-batch count), the search's start, and the one lower bound a report
quotes in its header and its table alike.
"""

from __future__ import annotations

import numpy as np

from postplace.report._provenance import NOT_RECORDED


def candidate_kind(name: str) -> str:
    """The kind of a ``place`` candidate, from its name (``summary.json``'s ``candidates`` keys, less
    any `` @mK``)."""
    if name == "search":
        return "search"
    if name.startswith("single"):
        return "single"
    if name.endswith("data-parallel") or name.startswith("param-server"):
        return "data-parallel"
    if name.startswith("warm-start"):
        return "warm start"
    return "placer"


def candidate_info(cands: dict, notes: dict) -> list[dict]:
    """Every candidate of a ``place`` summary, in its order: its key, name, micro-batch count (None
    where the run searched one count), kind, step time and note."""
    out = []
    for key, v in cands.items():
        name, sep, m = key.rpartition(" @m")
        if not (sep and name and m.isdigit()):
            name, m = key, None
        out.append(
            {
                "key": key,
                "name": name,
                "m": int(m) if m is not None else None,
                "kind": candidate_kind(name),
                "best_s": float(v) if isinstance(v, int | float) else None,
                "note": str(notes.get(key) or ""),
            }
        )
    return out


def best_per_candidate(candidates: list[dict]) -> list[dict]:
    """One row per one-shot candidate (the search's own rows apart), at its fastest micro-batch count
    where the run tried several (as the ``place`` table prints them): ``label`` (with `` @mK`` where it
    applies), ``keys`` (every summary key of that candidate), kind, step time and note."""
    rows: dict[str, dict] = {}
    for c in candidates:
        if c["kind"] == "search":
            continue
        group = "single" if c["kind"] == "single" else c["name"]
        row = rows.setdefault(group, {"label": None, "keys": [], "kind": c["kind"], "best_s": None, "note": ""})
        row["keys"].append(c["key"])
        better = row["label"] is None or (
            c["best_s"] is not None and (row["best_s"] is None or c["best_s"] < row["best_s"])
        )
        if better:
            row.update(label=c["key"], best_s=c["best_s"], note=c["note"])
    return list(rows.values())


def _number(v) -> float | None:
    return float(v) if isinstance(v, int | float) and not isinstance(v, bool) and np.isfinite(v) else None


def start_record(v) -> dict | None:
    """A recorded start ``{"name", "step_time_s"}`` as the report shows it; None when none was recorded
    (a folder from before, a strategy without a start) or the record is not one."""
    if not isinstance(v, dict) or not isinstance(v.get("name"), str):
        return None
    return {"name": v["name"], "step_time_s": _number(v.get("step_time_s"))}


def start_info(s: dict) -> dict | None:
    """The search's start of a ``place`` summary: its name, step time (None: not probed) and whether
    that time is simulated or measured; over several micro-batch counts, each count's (``per_m``)."""
    per = s.get("search_start_per_microbatches")
    per_m = []
    if isinstance(per, dict):
        per_m = [
            {"m": int(m), **st}
            for m, v in per.items()
            if isinstance(m, str) and m.isdigit() and (st := start_record(v)) is not None
        ]
    top = start_record(s.get("search_start"))
    if top is None and not per_m:
        return None
    figures = s.get("figures") if isinstance(s.get("figures"), dict) else {}
    kind = figures.get("search_start", figures.get("search_best_step_time_s"))
    return {
        **(top or {"name": None, "step_time_s": None}),
        "kind": kind if isinstance(kind, str) else NOT_RECORDED,
        "per_m": sorted(per_m, key=lambda x: x["m"]),
    }


def bound_info(recorded, per_m, schedule: dict, drawn: str) -> dict:
    """The one lower bound a report quotes, in its header and its table alike, and which bound it is.

    ``recorded``: the run's own (``summary.json`` or ``compare.json``), the bound every row of its table
    is divided by; ``per_m``: a run over several micro-batch counts records each count's, and its own is
    the least of them (each count's bound holds for that count's traced step only). The step the
    schedule draws (the returned count's, or a plan's rewritten step) has its own bound: ``drawn_s``,
    quoted beside it where it differs (the header quoted it alone before, so its "lower bound" and the
    table's disagreed). A run that recorded none quotes the drawn step's.
    """
    own = schedule["lower_bound_s"]
    lb = _number(recorded)
    counts = sorted(int(m) for m in per_m if isinstance(m, str) and m.isdigit()) if isinstance(per_m, dict) else []
    if lb is None:
        return {"lower_bound_s": own, "which": f"the simulator's bound on {drawn}", "drawn_s": own, "drawn": drawn}
    if len(counts) > 1:
        which = (
            "the least over m = "
            + ", ".join(map(str, counts))
            + " of the simulator's bound on each micro-batch count's traced step"
        )
    else:
        which = "the simulator's bound on the run's traced step"
    return {"lower_bound_s": lb, "which": which, "drawn_s": own, "drawn": drawn}
