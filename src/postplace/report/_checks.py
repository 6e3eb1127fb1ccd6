"""The checks at a report's edge: ``summary.json``, ``compare.json`` and ``paper.json`` as the report
reads them, field by field.

A run folder's files can be edited or damaged, and a run of a graph or cluster with absurd figures writes
absurd step times: each check turns what the report cannot draw (a value of the wrong type, a NaN, a
negative time, one past :data:`MAX_STEP_S`) into one error line naming the file and the field and saying
how to write the file again, where it would otherwise be an internal error or a broken figure.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from postplace.errors import PostplaceError

MAX_STEP_S = 1e300
"""The longest step time (seconds) a report reads: past it, the figures' milliseconds and axis margins
overflow a float (1e308 s is 1e311 ms). No hardware step is near it: such a figure comes from an edited
or damaged file, or from a graph or cluster with figures no hardware has."""


STEP_TIMES = ("best_step_time_s", "search_best_step_time_s", "single_device_step_time_s", "lower_bound_s")
"""The summary's step times the report draws as bars and reference lines."""


def shown(v) -> str:
    """A JSON value as an error message quotes it: short, one line."""
    try:
        text = json.dumps(v)
    except (TypeError, ValueError):
        text = repr(v)
    return text if len(text) <= 40 else text[:37] + "..."


def step_time_problem(v) -> str | None:
    """Why ``v`` is not a recorded step time (None: null, or a number of seconds from 0 to MAX_STEP_S)."""
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int | float):
        return f"is {shown(v)}, not a number"
    try:
        t = float(v)
    except OverflowError:
        return f"is {shown(v)}, too large for a float"
    if not np.isfinite(t):
        return f"is {shown(v)}, not a finite number"
    if t < 0:
        return f"is {t:g}, negative"
    if t > MAX_STEP_S:
        return f"is {t:.3g} s, past the {MAX_STEP_S:g} s a report can draw"
    return None


TOO_LARGE = (
    "the run folder was edited or damaged, or the run's graph or cluster has figures no hardware has; "
    "check them and run again"
)
"""What a step time past MAX_STEP_S means: a genuine run of an absurd graph or cluster writes one too."""


def _damaged(path: Path, what: str, fix: str) -> PostplaceError:
    """The one error line of a run folder's file that breaks a check: ``what`` is wrong, ``fix`` says how to
    write the file again; a step time past what a report can draw says the figures may be genuine but absurd
    (rewriting would write it again)."""
    if "a report can draw" in what:
        return PostplaceError(f"{path}: {what}: {TOO_LARGE}")
    return PostplaceError(f"{path}: {what}: {fix}")


def edited_error(path: Path, run_dir: Path, what: str) -> PostplaceError:
    return _damaged(
        path,
        what,
        f"the run folder was edited or damaged; `postplace place --resume {run_dir}` writes {path.name} again",
    )


def check_summary(s, run_dir: Path) -> dict:
    """``summary.json`` of a ``place`` folder as the report reads it: a JSON object whose strategy is text,
    whose step times (bars, reference lines, the search's start, the candidates) are null or a number of
    seconds from 0 to :data:`MAX_STEP_S`, and whose wall time is one. Anything else is one error line
    naming the field (a value of the wrong type was an internal error; a NaN or a 1e308 one broke the
    figures; a negative one was drawn as if it were a time). It must name what was returned, its step time
    and the cluster (every place run records them); other keys it leaves out stay "not recorded".

    Raises
    ------
    PostplaceError
        Naming the file and the field, saying the folder was edited or damaged and how to write it again.
    """
    path = run_dir / "summary.json"
    if not isinstance(s, dict):
        kind = "null" if s is None else {list: "a list", str: "a string", bool: "a boolean"}.get(type(s), "a number")
        raise edited_error(path, run_dir, f"{kind}, not a JSON object of the run's figures")
    for key in ("returned", "best_step_time_s", "cluster"):  # every place run records them
        if s.get(key) is None:
            raise edited_error(path, run_dir, f"field '{key}' is missing (every place run records it)")
    if not isinstance(s["returned"], str) or not isinstance(s["cluster"], str):
        key = "returned" if not isinstance(s["returned"], str) else "cluster"
        raise edited_error(path, run_dir, f"field '{key}' is {shown(s[key])}, not a name")
    if "strategy" in s and not (isinstance(s["strategy"], str) and s["strategy"]):
        raise edited_error(path, run_dir, f"field 'strategy' is {shown(s['strategy'])}, not a strategy name")
    for key in (*STEP_TIMES, "wall_time_s"):
        why = step_time_problem(s.get(key))
        if why:
            raise edited_error(path, run_dir, f"field '{key}' {why}")
    cands = s.get("candidates")
    if cands is not None and not isinstance(cands, dict):
        raise edited_error(path, run_dir, f"field 'candidates' is {shown(cands)}, not an object {{name: step time}}")
    for name, v in (cands or {}).items():
        why = step_time_problem(v)
        if why:
            raise edited_error(path, run_dir, f"candidate '{name[:40]}' {why}")
    starts = [("search_start", s.get("search_start"))]
    per = s.get("search_start_per_microbatches")
    if isinstance(per, dict):
        starts += [(f"search_start_per_microbatches.{m}"[:60], v) for m, v in per.items()]
    for key, start in starts:
        why = step_time_problem(start.get("step_time_s")) if isinstance(start, dict) else None
        if why:
            raise edited_error(path, run_dir, f"field '{key}.step_time_s' {why}")
    return s


MAX_SEEDS = 10_000
"""The most seeds a comparison's ``seeds`` may say (the report lists them)."""


def _count_problem(v, lo: int, hi: int) -> str | None:
    if isinstance(v, bool) or not isinstance(v, int):
        return f"is {shown(v)}, not an integer"
    return None if lo <= v <= hi else f"is {shown(v)}, not from {lo} to {hi}"


def _name_problem(v) -> str | None:
    """Why ``v`` is not a model, cluster or pair name (text that names a folder beside the file)."""
    if isinstance(v, str) and v and v not in (".", "..") and "/" not in v and "\\" not in v:
        return None
    return f"is {shown(v)}, not a name"


def check_compare(rep, run_dir: Path) -> dict:
    """``compare.json`` as the report reads it: a JSON object whose ``rows`` are objects with a strategy
    name (a search row's names its folder under ``runs/``), step times that are null or a number of
    seconds from 0 to :data:`MAX_STEP_S` (a search row's median between its min and max), seed counts,
    and per-seed records with an integer seed. Anything else is one error line naming the row and field.

    Raises
    ------
    PostplaceError
        Naming the file, the row and the field, saying the folder was edited or damaged.
    """
    path = run_dir / "compare.json"

    def bad(what: str) -> PostplaceError:
        return _damaged(
            path,
            what,
            "the run folder was edited or damaged; run the `postplace compare` command "
            "that wrote it again to rewrite it",
        )

    if not isinstance(rep, dict):
        raise bad("not a JSON object of the comparison's rows")
    for key in ("lower_bound_s", "single_device_step_time_s"):
        if why := step_time_problem(rep.get(key)):
            raise bad(f"field '{key}' {why}")
    if rep.get("seeds") is not None and (why := _count_problem(rep["seeds"], 1, MAX_SEEDS)):
        raise bad(f"field 'seeds' {why}")
    rows = rep.get("rows", [])
    if not isinstance(rows, list):
        raise bad(f"field 'rows' is {shown(rows)}, not a list of rows")
    for i, r in enumerate(rows):
        if not isinstance(r, dict):
            raise bad(f"rows[{i}] is {shown(r)}, not an object")
        name = r.get("strategy")
        if _name_problem(name):  # it names the row's folder under runs/
            raise bad(f"rows[{i}] field 'strategy' is {shown(name)}, not a strategy name")
        where = f"row '{name[:40]}'"
        if r.get("kind") is not None and not isinstance(r["kind"], str):
            raise bad(f"{where} field 'kind' is {shown(r['kind'])}, not text")
        for key in ("best_step_time_s", "min_step_time_s", "max_step_time_s", "start_step_time_s", "wall_time_s"):
            if why := step_time_problem(r.get(key)):
                raise bad(f"{where} field '{key}' {why}")
        lo, mid, hi = r.get("min_step_time_s"), r.get("best_step_time_s"), r.get("max_step_time_s")
        if None not in (lo, mid, hi) and not lo <= mid <= hi:
            raise bad(
                f"{where}: best_step_time_s {mid:.6g} is not between min_step_time_s {lo:.6g} and "
                f"max_step_time_s {hi:.6g}"
            )
        if r.get("seeds") is not None and (why := _count_problem(r["seeds"], 1, MAX_SEEDS)):
            raise bad(f"{where} field 'seeds' {why}")
        per = r.get("per_seed", [])
        if not isinstance(per, list):
            raise bad(f"{where} field 'per_seed' is {shown(per)}, not a list")
        for k, ps in enumerate(per):
            if not isinstance(ps, dict):
                raise bad(f"{where} per_seed[{k}] is {shown(ps)}, not an object")
            if why := _count_problem(ps.get("seed"), 0, 2**63 - 1):
                raise bad(f"{where} per_seed[{k}] field 'seed' {why}")
            for key in ("best_step_time_s", "wall_time_s"):
                if why := step_time_problem(ps.get(key)):
                    raise bad(f"{where} per_seed[{k}] field '{key}' {why}")
    return rep


def _real_problem(v, *, none: bool = True) -> str | None:
    """Why ``v`` is not a finite number (or null, where ``none``)."""
    if v is None and none:
        return None
    if isinstance(v, bool) or not isinstance(v, int | float):
        return f"is {shown(v)}, not a number"
    return None if np.isfinite(float(v)) else f"is {shown(v)}, not a finite number"


def check_paper(data, run_dir: Path) -> dict:
    """``paper.json`` as the report reads it: a JSON object whose ``config`` holds the size, seed counts and
    budgets, whose ``paper_claim`` has a number and a source, whose ``pairs`` are names, and whose headlines
    (``headline`` and each of ``tables``), summaries, ``starts`` and ``missing`` have the types the table,
    the figure and the page read. Anything else is one error line naming the field.

    Raises
    ------
    PostplaceError
        Naming the file and the field, saying the folder was edited or damaged and how to write it again.
    """
    path = run_dir / "paper.json"

    def bad(what: str) -> PostplaceError:
        return _damaged(
            path,
            what,
            "the folder was edited or damaged; run the `postplace paper` command that "
            "wrote it again (with --collect to search nothing) to rewrite it",
        )

    def obj(v, where: str) -> dict:
        if not isinstance(v, dict):
            raise bad(f"field '{where}' is {shown(v)}, not an object")
        return v

    def listed(v, where: str) -> list:
        if not isinstance(v, list):
            raise bad(f"field '{where}' is {shown(v)}, not a list")
        return v

    def check(why: str | None, where: str) -> None:
        if why:
            raise bad(f"field '{where}' {why}")

    def headlines(v, where: str) -> None:
        for i, h in enumerate(listed(v, where)):
            at = f"{where}[{i}]"
            obj(h, at)
            for key in ("model", "cluster"):
                check(_name_problem(h.get(key)), f"{at}.{key}")
            check(step_time_problem(h.get("post_s")), f"{at}.post_s")
            if h.get("hp_seeds") is not None:
                check(_count_problem(h["hp_seeds"], 0, MAX_SEEDS), f"{at}.hp_seeds")
            for rival, r in obj(h.get("reduction", {}), f"{at}.reduction").items():
                check(_real_problem(r), f"{at}.reduction.{rival[:40]}")

    def summaries(v, where: str) -> None:
        for rival, x in obj(v, where).items():
            at = f"{where}.{rival[:40]}"
            obj(x, at)
            for key in ("pairs", "post_faster"):
                check(_count_problem(x.get(key), 0, 2**63 - 1), f"{at}.{key}")
            for key in ("median", "max"):
                check(_real_problem(x.get(key), none=False), f"{at}.{key}")

    if not isinstance(data, dict):
        raise bad("not a JSON object of the experiment's tables")
    cfg = obj(data.get("config"), "config")
    check(
        None if isinstance(cfg.get("size"), str) and cfg["size"] else f"is {shown(cfg.get('size'))}, not a size",
        "config.size",
    )
    for key, lo in (("seeds", 1), ("budget", 1), ("planner_budget", 0)):
        check(_count_problem(cfg.get(key), lo, 2**63 - 1), f"config.{key}")
    if cfg.get("planner_seeds") is not None:
        check(_count_problem(cfg["planner_seeds"], 0, 2**63 - 1), "config.planner_seeds")
    claim = obj(data.get("paper_claim"), "paper_claim")
    check(_real_problem(claim.get("max_reduction_vs_rl"), none=False), "paper_claim.max_reduction_vs_rl")
    if not isinstance(claim.get("source"), str):
        raise bad(f"field 'paper_claim.source' is {shown(claim.get('source'))}, not text")
    if data.get("evaluator") is not None and not isinstance(data["evaluator"], str):
        raise bad(f"field 'evaluator' is {shown(data['evaluator'])}, not text")
    for i, pair in enumerate(listed(data.get("pairs"), "pairs")):
        check(_name_problem(pair), f"pairs[{i}]")
    headlines(data.get("headline"), "headline")
    tables = data.get("tables")
    if tables is None:  # a paper.json from before the two tables: its one summary is the table's
        summaries(data.get("summary", {}), "summary")
    for key, t in obj(tables if tables is not None else {}, "tables").items():
        at = f"tables.{key[:40]}"
        obj(t, at)
        for field_ in ("start", "post"):
            if not isinstance(t.get(field_), str):
                raise bad(f"field '{at}.{field_}' is {shown(t.get(field_))}, not text")
        if not all(isinstance(r, str) for r in listed(t.get("rivals"), f"{at}.rivals")):
            raise bad(f"field '{at}.rivals' is {shown(t['rivals'])}, not a list of strategy names")
        headlines(t.get("headline"), f"{at}.headline")
        summaries(t.get("summary", {}), f"{at}.summary")
    for pair, d in obj(data.get("starts") or {}, "starts").items():
        at = f"starts.{pair[:40]}"
        for name, r in obj(obj(d, at).get("strategies") or {}, f"{at}.strategies").items():
            where = f"{at}.strategies.{name[:40]}"
            obj(r, where)
            for key in ("start_step_time_s", "final_step_time_s"):
                check(step_time_problem(r.get(key)), f"{where}.{key}")
            check(_real_problem(r.get("gap_closed")), f"{where}.gap_closed")
    for pair, names in obj(data.get("missing") or {}, "missing").items():
        if not all(isinstance(n, str) for n in listed(names, f"missing.{pair[:40]}")):
            raise bad(f"field 'missing.{pair[:40]}' is {shown(names)}, not a list of strategy names")
    return data
