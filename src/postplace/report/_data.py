"""A run folder's report data, computed once: the "info" objects every renderer draws from.

:func:`build_report_data` reads only what ``place`` and ``compare`` write for people and other tools
(``summary.json``, ``history.jsonl``, ``placement.json``, ``compare.json`` and each search run's
``result.json``), never a checkpoint, and tolerates missing optional keys (the value is then the
string ``"not recorded"``). The returned placement is simulated again with
:meth:`postplace.sim.Simulator.schedule` for its Gantt chart and its memory, so the schedule is the
simulator's, whatever evaluator judged the search. Everything is plain JSON (lists, dicts, floats;
None for a missing number) and goes to ``report.json``.
"""

from __future__ import annotations

import json
import platform
import time
from dataclasses import asdict, is_dataclass
from importlib import metadata
from pathlib import Path

import numpy as np

from postplace.errors import PostplaceError

NOT_RECORDED = "not recorded"
MAX_POINTS = 600
"""Points kept per curve and per memory line in report.json (the plots need no more)."""
REPORT_VERSION = 1


# ------------------------------------------------------------------------------ the folder
def run_kind(run_dir: Path) -> str:
    """``place``, ``compare`` or ``paper``, from the files in the folder.

    Parameters
    ----------
    run_dir : path
        The run folder.

    Returns
    -------
    str
        ``"paper"`` if it holds ``paper.json``, else ``"compare"`` for ``compare.json``, else
        ``"place"`` for ``summary.json``.

    Raises
    ------
    PostplaceError
        When it holds none of them.

    Examples
    --------
    >>> import tempfile
    >>> from pathlib import Path
    >>> from postplace.report import run_kind
    >>> run = Path(tempfile.mkdtemp())
    >>> _ = (run / "summary.json").write_text("{}")
    >>> run_kind(run)
    'place'
    """
    if (run_dir / "paper.json").exists():
        return "paper"
    if (run_dir / "compare.json").exists():
        return "compare"
    if (run_dir / "summary.json").exists():
        return "place"
    raise PostplaceError(
        f"{run_dir}: no summary.json, compare.json or paper.json; give a folder written by place, compare or paper"
    )


def _read_json(path: Path) -> dict:
    """A run folder's JSON file, read with the limits every input file gets (size, encoding, integers of
    hundreds of digits, nesting: :func:`postplace.validate.read_json`); its checker then checks each field."""
    from postplace.validate import read_json

    return read_json(path, "run folder file", finite=False)


# ------------------------------------------------------------------------------ checks at the edge
MAX_STEP_S = 1e300
"""The longest step time (seconds) a report reads: past it, the figures' milliseconds and axis margins
overflow a float (1e308 s is 1e311 ms). No hardware step is near it: such a figure comes from an edited
or damaged file, or from a graph or cluster with figures no hardware has."""
STEP_TIMES = ("best_step_time_s", "search_best_step_time_s", "single_device_step_time_s", "lower_bound_s")
"""The summary's step times the report draws as bars and reference lines."""


def _shown(v) -> str:
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
        return f"is {_shown(v)}, not a number"
    try:
        t = float(v)
    except OverflowError:
        return f"is {_shown(v)}, too large for a float"
    if not np.isfinite(t):
        return f"is {_shown(v)}, not a finite number"
    if t < 0:
        return f"is {t:g}, negative"
    if t > MAX_STEP_S:
        return f"is {t:.3g} s, past the {MAX_STEP_S:g} s a report can draw"
    return None


TOO_LARGE = ("the run folder was edited or damaged, or the run's graph or cluster has figures no hardware has; "
             "check them and run again")
"""What a step time past MAX_STEP_S means: a genuine run of an absurd graph or cluster writes one too."""


def _damaged(path: Path, what: str, fix: str) -> PostplaceError:
    """The one error line of a run folder's file that breaks a check: ``what`` is wrong, ``fix`` says how to
    write the file again; a step time past what a report can draw says the figures may be genuine but absurd
    (rewriting would write it again)."""
    if "a report can draw" in what:
        return PostplaceError(f"{path}: {what}: {TOO_LARGE}")
    return PostplaceError(f"{path}: {what}: {fix}")


def _edited(path: Path, run_dir: Path, what: str) -> PostplaceError:
    return _damaged(path, what, f"the run folder was edited or damaged; `postplace place --resume {run_dir}` "
                                f"writes {path.name} again")  # fmt: skip


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
        raise _edited(path, run_dir, f"{kind}, not a JSON object of the run's figures")
    for key in ("returned", "best_step_time_s", "cluster"):  # every place run records them
        if s.get(key) is None:
            raise _edited(path, run_dir, f"field '{key}' is missing (every place run records it)")
    if not isinstance(s["returned"], str) or not isinstance(s["cluster"], str):
        key = "returned" if not isinstance(s["returned"], str) else "cluster"
        raise _edited(path, run_dir, f"field '{key}' is {_shown(s[key])}, not a name")
    if "strategy" in s and not (isinstance(s["strategy"], str) and s["strategy"]):
        raise _edited(path, run_dir, f"field 'strategy' is {_shown(s['strategy'])}, not a strategy name")
    for key in (*STEP_TIMES, "wall_time_s"):
        why = step_time_problem(s.get(key))
        if why:
            raise _edited(path, run_dir, f"field '{key}' {why}")
    cands = s.get("candidates")
    if cands is not None and not isinstance(cands, dict):
        raise _edited(path, run_dir, f"field 'candidates' is {_shown(cands)}, not an object {{name: step time}}")
    for name, v in (cands or {}).items():
        why = step_time_problem(v)
        if why:
            raise _edited(path, run_dir, f"candidate '{name[:40]}' {why}")
    starts = [("search_start", s.get("search_start"))]
    per = s.get("search_start_per_microbatches")
    if isinstance(per, dict):
        starts += [(f"search_start_per_microbatches.{m}"[:60], v) for m, v in per.items()]
    for key, start in starts:
        why = step_time_problem(start.get("step_time_s")) if isinstance(start, dict) else None
        if why:
            raise _edited(path, run_dir, f"field '{key}.step_time_s' {why}")
    return s


MAX_SEEDS = 10_000
"""The most seeds a comparison's ``seeds`` may say (the report lists them)."""


def _count_problem(v, lo: int, hi: int) -> str | None:
    if isinstance(v, bool) or not isinstance(v, int):
        return f"is {_shown(v)}, not an integer"
    return None if lo <= v <= hi else f"is {_shown(v)}, not from {lo} to {hi}"


def _name_problem(v) -> str | None:
    """Why ``v`` is not a model, cluster or pair name (text that names a folder beside the file)."""
    if isinstance(v, str) and v and v not in (".", "..") and "/" not in v and "\\" not in v:
        return None
    return f"is {_shown(v)}, not a name"


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
        return _damaged(path, what, "the run folder was edited or damaged; run the `postplace compare` command "
                                    "that wrote it again to rewrite it")  # fmt: skip

    if not isinstance(rep, dict):
        raise bad("not a JSON object of the comparison's rows")
    for key in ("lower_bound_s", "single_device_step_time_s"):
        if why := step_time_problem(rep.get(key)):
            raise bad(f"field '{key}' {why}")
    if rep.get("seeds") is not None and (why := _count_problem(rep["seeds"], 1, MAX_SEEDS)):
        raise bad(f"field 'seeds' {why}")
    rows = rep.get("rows", [])
    if not isinstance(rows, list):
        raise bad(f"field 'rows' is {_shown(rows)}, not a list of rows")
    for i, r in enumerate(rows):
        if not isinstance(r, dict):
            raise bad(f"rows[{i}] is {_shown(r)}, not an object")
        name = r.get("strategy")
        if _name_problem(name):  # it names the row's folder under runs/
            raise bad(f"rows[{i}] field 'strategy' is {_shown(name)}, not a strategy name")
        where = f"row '{name[:40]}'"
        if r.get("kind") is not None and not isinstance(r["kind"], str):
            raise bad(f"{where} field 'kind' is {_shown(r['kind'])}, not text")
        for key in ("best_step_time_s", "min_step_time_s", "max_step_time_s", "start_step_time_s", "wall_time_s"):
            if why := step_time_problem(r.get(key)):
                raise bad(f"{where} field '{key}' {why}")
        lo, mid, hi = r.get("min_step_time_s"), r.get("best_step_time_s"), r.get("max_step_time_s")
        if None not in (lo, mid, hi) and not lo <= mid <= hi:
            raise bad(f"{where}: best_step_time_s {mid:.6g} is not between min_step_time_s {lo:.6g} and "
                      f"max_step_time_s {hi:.6g}")  # fmt: skip
        if r.get("seeds") is not None and (why := _count_problem(r["seeds"], 1, MAX_SEEDS)):
            raise bad(f"{where} field 'seeds' {why}")
        per = r.get("per_seed", [])
        if not isinstance(per, list):
            raise bad(f"{where} field 'per_seed' is {_shown(per)}, not a list")
        for k, ps in enumerate(per):
            if not isinstance(ps, dict):
                raise bad(f"{where} per_seed[{k}] is {_shown(ps)}, not an object")
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
        return f"is {_shown(v)}, not a number"
    return None if np.isfinite(float(v)) else f"is {_shown(v)}, not a finite number"


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
        return _damaged(path, what, "the folder was edited or damaged; run the `postplace paper` command that "
                                    "wrote it again (with --collect to search nothing) to rewrite it")  # fmt: skip

    def obj(v, where: str) -> dict:
        if not isinstance(v, dict):
            raise bad(f"field '{where}' is {_shown(v)}, not an object")
        return v

    def listed(v, where: str) -> list:
        if not isinstance(v, list):
            raise bad(f"field '{where}' is {_shown(v)}, not a list")
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
    check(None if isinstance(cfg.get("size"), str) and cfg["size"] else f"is {_shown(cfg.get('size'))}, not a size",
          "config.size")  # fmt: skip
    for key, lo in (("seeds", 1), ("budget", 1), ("planner_budget", 0)):
        check(_count_problem(cfg.get(key), lo, 2**63 - 1), f"config.{key}")
    if cfg.get("planner_seeds") is not None:
        check(_count_problem(cfg["planner_seeds"], 0, 2**63 - 1), "config.planner_seeds")
    claim = obj(data.get("paper_claim"), "paper_claim")
    check(_real_problem(claim.get("max_reduction_vs_rl"), none=False), "paper_claim.max_reduction_vs_rl")
    if not isinstance(claim.get("source"), str):
        raise bad(f"field 'paper_claim.source' is {_shown(claim.get('source'))}, not text")
    if data.get("evaluator") is not None and not isinstance(data["evaluator"], str):
        raise bad(f"field 'evaluator' is {_shown(data['evaluator'])}, not text")
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
                raise bad(f"field '{at}.{field_}' is {_shown(t.get(field_))}, not text")
        if not all(isinstance(r, str) for r in listed(t.get("rivals"), f"{at}.rivals")):
            raise bad(f"field '{at}.rivals' is {_shown(t['rivals'])}, not a list of strategy names")
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
            raise bad(f"field 'missing.{pair[:40]}' is {_shown(names)}, not a list of strategy names")
    return data


def checked_units(path: Path, num_units: int, num_devices: int):
    """A search run's ``result.json`` best placement: one device id (0 .. D-1) per unit, as an array;
    None where the run recorded none (it found no feasible placement)."""
    res = _read_json(path)
    if not isinstance(res, dict):
        raise PostplaceError(f"{path}: not a JSON object of a search run's result: the run folder was edited or "
                             "damaged; run the `postplace compare` command that wrote it again")  # fmt: skip
    units = res.get("best_placement")
    if units is None:
        return None
    ok = (isinstance(units, list) and len(units) == num_units
          and all(type(u) is int and 0 <= u < num_devices for u in units))  # fmt: skip
    if not ok:
        raise PostplaceError(f"{path}: field 'best_placement' is not {num_units} device ids from 0 to "
                             f"{num_devices - 1}: the run folder was edited or damaged, or the run was of another "
                             "graph, grouping or cluster; run the `postplace compare` command that wrote it "
                             "again")  # fmt: skip
    return np.asarray(units, dtype=np.int64)


def checked_history(path: Path) -> list[dict]:
    """The samples of a ``history.jsonl`` (:func:`~postplace.search.runner.read_history` leaves out the
    lines that are not samples), each step time at most :data:`MAX_STEP_S`: a larger one (1e308) broke the
    learning curves' axes; it is one error line, naming the sample."""
    from postplace.search.history import read_history

    rows = read_history(path)
    for k, row in enumerate(rows):
        t = float(row["step_time_s"])
        if t > MAX_STEP_S:
            raise PostplaceError(f"{path}: sample {_shown(row.get('sample', k))} has step_time_s {t:.3g}, past "
                                 f"the {MAX_STEP_S:g} s a report can draw: {TOO_LARGE}")  # fmt: skip
    return rows


# ------------------------------------------------------------------------------ graph and cluster
def resolve_graph(record: dict, graph=None, size: str | None = None, run_dir: Path | None = None):
    """The run's graph: the one given (an OpGraph, a file or a zoo name), the target the summary
    records (``target_spec``: a zoo model at its micro-batch count, a file, or the ``graph.json`` a
    module's run keeps), the ``target`` recorded, or a zoo graph whose name (``model-size``) the run
    recorded."""
    from postplace.graph import OpGraph, load_graph

    if isinstance(graph, OpGraph):
        return graph
    settings = run_settings(run_dir)  # checksummed: an edited summary's target_spec does not override it
    spec = settings["target"] if settings is not None and isinstance(settings.get("target"), dict) else None
    spec = spec or record.get("target_spec")
    if graph is None and isinstance(spec, dict):
        m = record.get("microbatches", 1)
        m = m if type(m) is int and m >= 1 else 1
        kind = spec.get("kind")
        if kind == "zoo" and isinstance(spec.get("name"), str) and isinstance(spec.get("size"), str):
            from postplace.zoo import cached_graph, known_size

            if known_size(spec["name"], spec["size"]):
                from postplace.graph.optimizers import recorded_step

                coloc = (record.get("microbatch_colocation") or spec.get("microbatch_colocation")) if m > 1 else "none"
                return cached_graph(spec["name"], spec["size"], **recorded_step(spec), microbatches=m,
                                    colocation=coloc if coloc in ("none", "module") else "none")  # fmt: skip
        if kind == "file" and isinstance(spec.get("path"), str) and Path(spec["path"]).is_file():
            return load_graph(Path(spec["path"]))
        if run_dir is not None:
            for path in (run_dir / f"m{m}" / "graph.json", run_dir / "graph.json"):
                if path.is_file():
                    return load_graph(path)
    target = graph or record.get("target")
    size = size or record.get("size")
    if target is None:
        name = str(record.get("graph", ""))
        model, _, sz = name.rpartition("-")
        from postplace.zoo import known_size

        if known_size(model, sz):
            target, size = model, size or sz
        else:
            raise PostplaceError(f"the run does not record where its graph '{name}' came from; pass --graph TARGET")
    path = Path(str(target))
    if path.exists():
        return load_graph(path)
    from postplace.zoo import cached_graph

    return cached_graph(str(target), size or "full")


def resolve_cluster_for(record: dict, graph, cluster=None, run_dir: Path | None = None):
    """The run's cluster: the one given (a Cluster, a preset or a file), else the one the run folder
    records (:func:`recorded_cluster`: ``run.json``, or a ``compare.json``'s own record), else the
    cluster name the summary records (a preset's)."""
    from postplace.cluster import Cluster
    from postplace.cluster.from_workload import resolve_cluster

    if isinstance(cluster, Cluster):
        return cluster
    if cluster is None and run_dir is not None:
        recorded = recorded_cluster(run_dir, graph, record)
        if recorded is not None:
            return recorded
    name = cluster or record.get("cluster")
    if not name:
        raise PostplaceError("the run does not record its cluster; pass --cluster")
    try:
        return resolve_cluster(str(name), graph)
    except PostplaceError as exc:
        raise PostplaceError(f"cluster '{name}' of the run: {exc}; pass --cluster PRESET_OR_FILE") from None


def run_settings(run_dir: Path | None) -> dict | None:
    """``run_dir/run.json`` when it is there and its checksum holds (None otherwise: an edited record is
    not followed, and the summary's own fields are the ones left to try)."""

    from postplace.search.state_io import RUN_SETTINGS, settings_checksum

    if run_dir is None or not (run_dir / RUN_SETTINGS).is_file():
        return None
    from postplace.validate import read_json

    try:
        settings = read_json(run_dir / RUN_SETTINGS, "run settings file", finite=False)
    except PostplaceError:
        return None
    if not isinstance(settings, dict):
        return None
    body = {k: v for k, v in settings.items() if k != "checksum"}
    return settings if settings.get("checksum") == settings_checksum(body) else None


def recorded_cluster(run_dir: Path, graph, record: dict | None = None):
    """The cluster ``run_dir/run.json`` records, else the one ``record`` (a ``compare.json``) records:
    its ``cluster_spec`` (the preset, ``workload:PRESET`` or the absolute path of the TOML file the run
    was started with), checked against its fingerprint ``cluster_sha``. None where neither records a
    spec (a run given a Cluster object: the cluster's name is then the one to try).

    Raises
    ------
    PostplaceError
        When the recorded cluster file no longer exists, cannot be loaded, or is no longer the cluster
        the run used (its fingerprint differs): one line naming it, with ``--cluster`` as the fix.
    """
    from postplace.cluster.from_workload import resolve_cluster
    from postplace.search.state_io import RUN_SETTINGS, fingerprint

    settings, where = run_settings(run_dir), run_dir / RUN_SETTINGS
    if settings is None and record is not None:
        settings, where = record, run_dir / "compare.json"
    spec, sha = (settings or {}).get("cluster_spec"), (settings or {}).get("cluster_sha")
    if not isinstance(spec, str) or not spec or not isinstance(sha, str):
        return None
    fix = "pass --cluster with the cluster file or preset the run used"
    if Path(spec).is_absolute() and not Path(spec).is_file():  # a file's spec is its absolute path
        raise PostplaceError(f"{where}: the run's cluster file {spec} no longer exists; {fix}")
    try:
        c = resolve_cluster(spec, graph)
    except PostplaceError as exc:
        raise PostplaceError(f"{where}: the run's cluster {spec}: {exc}; {fix}") from None
    if fingerprint(c) != sha:
        raise PostplaceError(f"{where}: the cluster {spec} is no longer the one the run used (it changed since the "
                             f"run, or the record was edited: its fingerprint differs); {fix}")  # fmt: skip
    return c


# ------------------------------------------------------------------------------ curves
def _grid(n: int) -> np.ndarray:
    """Sample counts (1-based) to keep: every one up to MAX_POINTS, else a geometric-ish spread."""
    if n <= MAX_POINTS:
        return np.arange(1, n + 1)
    return np.unique(np.round(np.linspace(1, n, MAX_POINTS)).astype(int))


NO_FEASIBLE = "no feasible sample: every placement the search tried was OOM or failed"


def _finite(x) -> float | None:
    return float(x) if x is not None and np.isfinite(x) else None


def curve_info(strategy: str, runs: list[dict]) -> dict:
    """One strategy's learning curves. ``runs``: ``{seed, history, wall_time_s, timing}`` per seed.

    Against samples: median, min and max over the seeds that reached each sample count. Against wall
    time: each seed's curve; a sample's time is its batch's line in the run's ``timing.jsonl`` when
    those lines cover every sample, else the run's wall time spread evenly over its samples (a folder
    written before timing was recorded; ``wall_source`` says which).
    """
    from postplace.search.history import best_so_far, sample_times

    per_seed = []
    curves = []
    recorded = True
    for r in runs:
        h = r["history"]
        best = best_so_far(h)
        curves.append(best)
        n = len(best)
        wall = sample_times(r.get("timing") or [], n)
        if wall is None:
            recorded = False
            w = r.get("wall_time_s")
            wall = (np.arange(1, n + 1) * (w / n)) if (n and isinstance(w, int | float)) else np.full(n, np.nan)
        g = _grid(n) if n else np.array([], dtype=int)
        per_seed.append({
            "seed": r["seed"], "samples": n, "final_best_s": _finite(best[-1]) if n else None,
            "x_samples": g.tolist(), "best_s": [_finite(best[k - 1]) for k in g],
            "wall_s": [_finite(wall[k - 1]) for k in g],
        })  # fmt: skip
    n_max = max((len(c) for c in curves), default=0)
    g = _grid(n_max) if n_max else np.array([], dtype=int)
    med, lo, hi, count = [], [], [], []
    for k in g:
        vals = np.array([c[k - 1] for c in curves if len(c) >= k])
        vals = vals[np.isfinite(vals)]
        count.append(int(vals.size))
        med.append(float(np.median(vals)) if vals.size else None)
        lo.append(float(vals.min()) if vals.size else None)
        hi.append(float(vals.max()) if vals.size else None)
    return {
        "strategy": strategy, "seeds": [r["seed"] for r in runs], "x_samples": g.tolist(),
        "median_s": med, "min_s": lo, "max_s": hi, "seeds_with_feasible": count, "per_seed": per_seed,
        "wall_source": "recorded per sample" if recorded and runs else "estimated: run wall time x sample / samples",
        "note": "" if any(v is not None for v in med) else NO_FEASIBLE,  # a curve the figures cannot draw
    }  # fmt: skip


# ------------------------------------------------------------------------------ schedule, memory, map
def _resource_names(cluster) -> list[str]:
    D = cluster.num_devices
    names = [f"{d} egress" for d in cluster.device_names] + [f"{d} ingress" for d in cluster.device_names]
    for link in cluster.links:
        names += [f"link {link.a}->{link.b}", f"link {link.b}->{link.a}"]
    assert len(names) == cluster.num_resources == 2 * D + 2 * len(cluster.links)
    return names


def _downsample_steps(times: np.ndarray, values: np.ndarray) -> tuple[list, list]:
    """A step function with at most ~MAX_POINTS points, keeping each bin's maximum (so peaks survive)."""
    if len(times) <= MAX_POINTS:
        return times.tolist(), values.tolist()
    edges = np.linspace(times[0], times[-1], MAX_POINTS // 2 + 1)
    idx = np.clip(np.searchsorted(edges, times, side="right") - 1, 0, len(edges) - 2)
    t_out, v_out = [], []
    for b in range(len(edges) - 1):
        sel = np.flatnonzero(idx == b)
        if sel.size:
            t_out += [float(times[sel[0]]), float(times[sel[-1]])]
            v_out += [float(values[sel].max()), float(values[sel[-1]])]
    return t_out, v_out


def schedule_info(graph, cluster, ops: np.ndarray, source: str) -> tuple[dict, dict, object]:
    """(schedule info, memory info, the Schedule) of one op-level placement, simulated again."""
    from postplace.graph import PHASES
    from postplace.sim import Simulator
    from postplace.sim.trace import memory_over_time

    sim = Simulator(graph, cluster)
    sched = sim.schedule(ops)
    if not (np.isfinite(sched.step_time) and sched.step_time <= MAX_STEP_S):  # its Gantt chart's axis overflows
        raise PostplaceError(f"{source}: its simulated step takes {float(sched.step_time):.3g} s, past the "
                             f"{MAX_STEP_S:g} s a report can draw: graph '{graph.name}' or cluster "
                             f"'{cluster.name}' has figures no hardware has; check their flops, bytes, bandwidths "
                             "and latencies")  # fmt: skip
    res = _resource_names(cluster)
    lanes: dict[int, list] = {}
    for src, _slot, a, b, _nbytes, start, end in sched.transfers:
        for r in cluster.route_resources[cluster.route_ptr[a * cluster.num_devices + b]:
                                         cluster.route_ptr[a * cluster.num_devices + b + 1]]:  # fmt: skip
            lanes.setdefault(int(r), []).append([float(start), float(end), PHASES[graph.phase[src]]])
    schedule = {
        "source": source,
        "step_time_s": float(sched.step_time),
        "lower_bound_s": float(sim.lower_bound),
        "devices": list(cluster.device_names),
        "ops": {
            "device": sched.device.tolist(),
            "start_s": sched.op_start.tolist(),
            "end_s": sched.op_end.tolist(),
            "phase": [PHASES[k] for k in graph.phase],
        },  # fmt: skip
        "busy_s": sched.busy.tolist(),
        "link_lanes": [{"name": res[r], "intervals": lanes[r]} for r in sorted(lanes)],
        "transfers": len(sched.transfers),
        "bytes_moved": float(sched.bytes_moved),
    }
    timeline = memory_over_time(sim.problem, sched.device)
    memory = {
        "devices": list(cluster.device_names),
        "peak_bytes": sched.peak_memory.tolist(),
        "capacity_bytes": cluster.capacity.tolist(),
        "oom_devices": [
            cluster.device_names[d] for d in range(cluster.num_devices) if sched.peak_memory[d] > cluster.capacity[d]
        ],  # fmt: skip
        "memory_mode": graph.memory_mode,
        "over_time": [],
    }
    for d, (t, v) in enumerate(timeline):
        tt, vv = _downsample_steps(t, v)
        memory["over_time"].append({"device": cluster.device_names[d], "time_s": tt, "bytes": vv})
    return schedule, memory, sched


MAP_MAX_ROWS = 40
"""The placement map's default size: the deepest module-path level that gives at most this many rows."""


def _infer_modules(graph, mods: list[str | None]) -> list[str]:
    """Fill the ops with no module: an op colocated with a labelled op takes its module; the others take
    the module of their first labelled input, in program order, else of their first labelled consumer."""
    n = graph.num_ops
    for members in graph.colocation_sets:
        known = [mods[i] for i in members if mods[i] is not None]
        if known:
            for i in members:
                mods[i] = mods[i] or known[0]
    in_ptr, in_edges, src = graph.in_ptr, graph.in_edges, graph.edge_src
    for i in range(n):  # program order is topological: inputs first
        if mods[i] is None:
            for k in range(in_ptr[i], in_ptr[i + 1]):
                m = mods[int(src[in_edges[k]])]
                if m is not None:
                    mods[i] = m
                    break
    out_ptr, dst = graph.out_ptr, graph.edge_dst
    for i in range(n - 1, -1, -1):
        if mods[i] is None:
            for e in range(out_ptr[i], out_ptr[i + 1]):
                m = mods[int(dst[e])]
                if m is not None:
                    mods[i] = m
                    break
    return [m or "(other)" for m in mods]


def op_modules(graph) -> tuple[list[str], str]:
    """A full module path per op, from the graph alone, and where the paths came from.

    A graph that records ``OpGraph.module`` (traced graphs, and graph files saved from them) gives each
    op its own path; an op it leaves unlabelled (``""``) is filled as below. A graph without module paths
    but with parameters: a parameter's module is its name's path (``param:layers.0.conv.weight`` ->
    ``layers.0.conv``), ops colocated with it take that module, the other ops the module of their first
    labelled input, in program order, else of their first labelled consumer. Graphs with neither
    (imported layer graphs): the op's own name, less a ``grad`` suffix, so a layer and its gradient share
    a row (those names are not dotted paths: :func:`module_at_depth` leaves them whole).
    """
    recorded = [m if m else None for m in graph.module]
    if any(m is not None for m in recorded):
        filled = sum(m is None for m in recorded)
        how = "the module paths the graph records (OpGraph.module)"
        if filled:
            how += f"; {filled} unlabelled ops from colocation and data edges"
        return _infer_modules(graph, recorded), how
    params = [i for i, name in enumerate(graph.names) if name.startswith(("param:", "buffer:"))]
    if not params:
        return [name.removesuffix("grad").removesuffix("_grad") for name in graph.names], "op names (layer graph)"
    mods: list[str | None] = [None] * graph.num_ops
    for i in params:
        mods[i] = graph.names[i].split(":", 1)[1].rpartition(".")[0] or "(root)"
    return _infer_modules(graph, mods), "parameter names, colocation and data edges"


def module_at_depth(path: str, depth: int | None) -> str:
    """``path`` cut to its first ``depth`` dotted components (None: whole); a pseudo-module such as
    ``(loss)`` stays whole."""
    if depth is None or path.startswith("("):
        return path
    return ".".join(path.split(".")[:depth])


def map_depth(paths, max_rows: int = MAP_MAX_ROWS) -> int:
    """The placement map's module depth for these op paths: the level that gives the most rows, at most
    ``max_rows`` of them (the shallowest such level, where a deeper one adds no row), and at least 1."""
    paths = set(paths)
    deepest = max((p.count(".") + 1 for p in paths if not p.startswith("(")), default=1)
    best, best_rows = 1, len({module_at_depth(p, 1) for p in paths})
    for d in range(2, deepest + 1):
        rows = len({module_at_depth(p, d) for p in paths})
        if rows > max_rows:
            break
        if rows > best_rows:
            best, best_rows = d, rows
    return best


def placement_map_info(graph, cluster, ops: np.ndarray, depth: int | None = None,
                       max_rows: int = MAP_MAX_ROWS) -> dict:  # fmt: skip
    """Op counts per (module, phase, device), modules in program order of their first forward op (the
    parameters come first in a traced graph), a module without one after them, in order of its first op.

    Modules are the ops' paths (:func:`op_modules`) cut to ``depth`` dotted levels; the default is
    :func:`map_depth`: the deepest level that keeps the map at most ``max_rows`` rows. A layer graph's
    op names are never cut.
    """
    from postplace.graph import PHASES

    full, how = op_modules(graph)
    dotted = not how.startswith("op names")
    if dotted and depth is None:
        depth = map_depth(full, max_rows)
    mods = [module_at_depth(m, depth) for m in full] if dotted else full
    order: dict[str, tuple[int, int]] = {}  # (0, first forward op) before (1, first op) for the others
    counts: dict[str, dict[str, dict[str, int]]] = {}
    for i in range(graph.num_ops):
        m, ph, dev = mods[i], PHASES[graph.phase[i]], cluster.device_names[int(ops[i])]
        order[m] = min(order.get(m, (2, 0)), (0 if ph == "forward" else 1, i))
        cell = counts.setdefault(m, {}).setdefault(ph, {})
        cell[dev] = cell.get(dev, 0) + 1
    phases = [p for p in PHASES if any(p in c for c in counts.values())]
    return {
        "devices": list(cluster.device_names), "phases": phases, "module_source": how,
        "depth": depth if dotted else None,
        "max_depth": max((m.count(".") + 1 for m in full if not m.startswith("(")), default=1) if dotted else None,
        "modules": [{"module": m, "counts": counts[m]} for m in sorted(order, key=order.get)],
        "ops_per_device": np.bincount(ops, minlength=cluster.num_devices).tolist(),
    }  # fmt: skip


# ------------------------------------------------------------------------------ provenance
def _version(dist: str) -> str:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return NOT_RECORDED


def versions(graph=None) -> dict:
    from postplace._version import __version__

    v = {"postplace": __version__, "python": platform.python_version(), "numpy": np.__version__,
         "numba": _version("numba"), "matplotlib": _version("matplotlib"), "torch": _version("torch")}  # fmt: skip
    if graph is not None and graph.metadata.get("torch_version"):
        v["torch (traced with)"] = graph.metadata["torch_version"]
    return v


def strategy_configs(names: list[str], space) -> dict:
    """Each search strategy's configuration in this code version (run folders do not record it)."""
    from postplace.search import make_strategy

    out = {}
    for name in names:
        try:
            s = make_strategy(name, space, seed=0)
        except Exception as exc:  # noqa: BLE001  (a report must not fail on a strategy it only describes)
            out[name] = f"unavailable ({type(exc).__name__})"
            continue
        cfg = getattr(s, "config", None)
        out[name] = {k: _jsonable(v) for k, v in asdict(cfg).items()} if is_dataclass(cfg) else NOT_RECORDED
    return out


def _jsonable(v):
    if isinstance(v, float | int | str | bool) or v is None:
        return v
    if isinstance(v, list | tuple):
        return [_jsonable(x) for x in v]
    return str(v)


def _get(d: dict, key: str):
    v = d.get(key)
    return NOT_RECORDED if v is None else v


def _graph_info(graph) -> dict:
    return {"name": graph.name, "ops": graph.num_ops, "edges": graph.num_edges, "memory_mode": graph.memory_mode,
            "total_flops": float(graph.flops.sum()), "zoo": graph.metadata.get("zoo", NOT_RECORDED)}  # fmt: skip


def _cluster_info(cluster) -> dict:
    return {"name": cluster.name, "description": cluster.description,
            "devices": [{"name": d.name, "kind": d.kind, "model": d.model, "memory_bytes": d.memory}
                        for d in cluster.devices]}  # fmt: skip


# ------------------------------------------------------------------------------ the two kinds
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
        out.append({"key": key, "name": name, "m": int(m) if m is not None else None, "kind": candidate_kind(name),
                    "best_s": float(v) if isinstance(v, int | float) else None,
                    "note": str(notes.get(key) or "")})  # fmt: skip
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
        better = row["label"] is None or (c["best_s"] is not None and (row["best_s"] is None
                                                                      or c["best_s"] < row["best_s"]))  # fmt: skip
        if better:
            row.update(label=c["key"], best_s=c["best_s"], note=c["note"])
    return list(rows.values())


def _number(v) -> float | None:
    return float(v) if isinstance(v, int | float) and not isinstance(v, bool) and np.isfinite(v) else None


def _start(v) -> dict | None:
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
        per_m = [{"m": int(m), **st} for m, v in per.items()
                 if isinstance(m, str) and m.isdigit() and (st := _start(v)) is not None]  # fmt: skip
    top = _start(s.get("search_start"))
    if top is None and not per_m:
        return None
    figures = s.get("figures") if isinstance(s.get("figures"), dict) else {}
    kind = figures.get("search_start", figures.get("search_best_step_time_s"))
    return {**(top or {"name": None, "step_time_s": None}), "kind": kind if isinstance(kind, str) else NOT_RECORDED,
            "per_m": sorted(per_m, key=lambda x: x["m"])}  # fmt: skip


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
        which = ("the least over m = " + ", ".join(map(str, counts))
                 + " of the simulator's bound on each micro-batch count's traced step")  # fmt: skip
    else:
        which = "the simulator's bound on the run's traced step"
    return {"lower_bound_s": lb, "which": which, "drawn_s": own, "drawn": drawn}


def _check_same_machine(s: dict, c, given, run_dir: Path) -> None:
    """The cluster a place report draws on is the run's machine: the one its run folder records must carry
    the summary's cluster name, and a ``--cluster`` given instead must have the devices the run had
    (``capacity_bytes``; a changed link or speed is the user's choice, another machine is not)."""
    path = run_dir / "summary.json"
    if given is None and s["cluster"] != c.name:
        raise _edited(path, run_dir, f"field 'cluster' says '{s['cluster'][:40]}', and the run folder records "
                                     f"cluster '{c.name}'")  # fmt: skip
    devices = s.get("capacity_bytes")
    if given is not None and isinstance(devices, dict) and list(devices) != list(c.device_names):
        raise PostplaceError(f"--cluster {given if isinstance(given, str) else c.name}: its devices "
                             f"({', '.join(c.device_names)}) are not those of the machine the run in {run_dir} "
                             f"placed on ({', '.join(map(str, devices))}); give that machine's cluster, or "
                             "none")  # fmt: skip


def place_data(run_dir: Path, graph=None, cluster=None, size=None) -> tuple[dict, object]:
    from postplace.cluster.placement import load_placement

    s = check_summary(_read_json(run_dir / "summary.json"), run_dir)
    g = resolve_graph(s, graph, size, run_dir)
    plan = s.get("returned_plan")
    if graph is None and plan is not None:  # a practitioner plan won: placement.json places its own step
        from postplace.plans import apply_plan, parse_plan

        if not isinstance(plan, str):
            raise PostplaceError(f"{run_dir / 'summary.json'}: field 'returned_plan' is not a plan's name; "
                                 "run place again")  # fmt: skip
        spec = parse_plan(plan)
        g = apply_plan(g, spec, spec.replicas or 1).graph
    c = resolve_cluster_for(s, g, cluster, run_dir)
    _check_same_machine(s, c, cluster, run_dir)
    if not (run_dir / "placement.json").exists():
        raise PostplaceError(f"{run_dir}: no placement.json (the run found no feasible placement)")
    from postplace.search.history import TIMING, read_timing

    ops = load_placement(run_dir / "placement.json", g, c)
    schedule, memory, sched = schedule_info(g, c, ops, f"placement.json ({_get(s, 'returned')})")
    strategy = s.get("strategy", NOT_RECORDED)
    counts = s.get("microbatch_counts")
    if isinstance(counts, list) and all(type(m) is int for m in counts):  # one search per micro-batch count
        curves = [curve_info(f"{strategy} m={m}", [{"seed": s.get("seed", 0),
                                                     "history": checked_history(run_dir / f"m{m}" / "history.jsonl"),
                                                     "wall_time_s": None,
                                                     "timing": read_timing(run_dir / f"m{m}" / TIMING)}])
                  for m in counts if (run_dir / f"m{m}" / "history.jsonl").exists()]  # fmt: skip
    else:
        curves = [curve_info(str(strategy), [{"seed": s.get("seed", 0),
                                              "history": checked_history(run_dir / "history.jsonl"),
                                              "wall_time_s": s.get("wall_time_s"),
                                              "timing": read_timing(run_dir / TIMING)}])]  # fmt: skip
    cands = s.get("candidates") if isinstance(s.get("candidates"), dict) else {}
    notes = s.get("candidate_notes") if isinstance(s.get("candidate_notes"), dict) else {}
    candidates = candidate_info(cands, notes)
    search_note = notes.get("search") or notes.get(f"search @m{s.get('search_microbatches')}") or ""
    search_at = f" @m{s['search_microbatches']}" if s.get("microbatch_counts") and s.get("search_microbatches") else ""
    search_best = s.get("search_best_step_time_s")
    bars = [{"label": f"returned ({_get(s, 'returned')})", "kind": "returned", "best_s": s.get("best_step_time_s"),
             "note": ""},
            {"label": f"{strategy} search best{search_at}", "kind": "search", "best_s": search_best,
             "note": search_note or ("" if search_best is not None else NO_FEASIBLE)}]  # fmt: skip
    bars += [{"label": c["label"], "kind": c["kind"], "best_s": c["best_s"], "note": c["note"], "keys": c["keys"]}
             for c in best_per_candidate(candidates)]  # fmt: skip
    if not any(b["kind"] == "single" for b in bars) and s.get("single_device_step_time_s") is not None:
        bars.append({"label": f"single:{_get(s, 'single_device')}", "kind": "single",
                     "best_s": s.get("single_device_step_time_s"), "note": ""})  # fmt: skip
    from postplace.search import make_problem

    groups = s.get("groups")
    space = make_problem(g, c, groups=groups if isinstance(groups, int) else 256).space
    if isinstance(s.get("config"), dict):  # the run's own config (with any --set / --config applied)
        recorded_configs, config_source = {strategy: s["config"]}, "recorded in the run's summary"
    else:
        recorded_configs = strategy_configs([strategy], space) if strategy != NOT_RECORDED else {}
        config_source = "this code version's defaults"
    prov = {
        "kind": "place", "graph": _graph_info(g), "cluster": _cluster_info(c),
        "strategies": [strategy], "strategy_configs": recorded_configs, "config_source": config_source,
        "budget": _budget_text(_get(s, "budget")), "samples": _get(s, "samples"),
        "seed": s.get("seed", NOT_RECORDED),
        "groups": _get(s, "groups"), "evaluator": _get(s, "evaluator"), "warm_start": _get(s, "warm_start"),
        "wall_time_s": _get(s, "wall_time_s"), "interrupted": _get(s, "interrupted"),
        "versions": versions(g), "cost_model": _get(s, "cost_model"),
        "cost_model_error": _get(s, "cost_model_error"), "within_error": s.get("within_error") or [],
    }  # fmt: skip
    drawn = (f"the returned plan's step ({plan})" if isinstance(plan, str)
             else f"the returned count's step (m = {s['microbatches']})" if type(s.get("microbatches")) is int
             and isinstance(counts, list) else "the run's traced step")  # fmt: skip
    bound = bound_info(s.get("lower_bound_s"), s.get("lower_bound_per_microbatches"), schedule, drawn)
    numbers = {k: s.get(k) for k in ("best_step_time_s", "search_best_step_time_s", "single_device_step_time_s",
                                     "lower_bound_s", "ratio_to_lower_bound", "ratio_to_single_device", "samples",
                                     "feasible_samples", "mfu", "tokens_per_s_per_device")}  # fmt: skip
    data = {
        "kind": "place", "title": f"{g.name} on {c.name}: {strategy}, {_get(s, 'samples')} samples"
                                  + (f"; plan: {s['plan']}" if isinstance(s.get("plan"), str) else ""),
        "provenance": prov, "numbers": numbers, "curves": curves, "bars": bars, "candidates": candidates,
        "seeds": 1, "microbatch_counts": counts if isinstance(counts, list) else None,
        "search_start": start_info(s),
        "lines": {"single_device_s": s.get("single_device_step_time_s"), "lower_bound_s": bound["lower_bound_s"]},
        "lower_bound": bound,
        "schedule": schedule, "memory": memory, "placement_map": placement_map_info(g, c, ops),
    }  # fmt: skip
    return data, sched


def compare_data(run_dir: Path, graph=None, cluster=None, size=None) -> tuple[dict, object]:
    from postplace.search import make_problem
    from postplace.search.history import TIMING, read_timing

    rep = check_compare(_read_json(run_dir / "compare.json"), run_dir)
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
            runs.append({"seed": ps["seed"], "history": checked_history(folder / "history.jsonl"),
                         "wall_time_s": ps.get("wall_time_s"), "timing": read_timing(folder / TIMING)})  # fmt: skip
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
    placers = [r for r in rows if r.get("kind") == "placer" and r.get("best_step_time_s") is not None
               and not r.get("oom_count")]  # fmt: skip
    if placers:
        p = min(placers, key=lambda r: r["best_step_time_s"])
        if ops is None or p["best_step_time_s"] < best[0]:
            from postplace.placers import place

            ops = place(p["strategy"], g, c)
            source = f"{p['strategy']} (the comparison's best one-shot placer, faster than every search)"
    if ops is None:
        raise PostplaceError(f"{run_dir}: no strategy found a feasible placement; nothing to draw")
    schedule, memory, sched = schedule_info(g, c, ops, source)
    bars = [{"label": r["strategy"], "kind": "data-parallel" if str(r.get("kind", "")).startswith("data-parallel")
             else "single" if r["strategy"] == "single" else r.get("kind"),
             "best_s": r.get("best_step_time_s"), "min_s": r.get("min_step_time_s"),
             "max_s": r.get("max_step_time_s"), "oom": r.get("oom_count", 0), "seeds": r.get("seeds"),
             "start": _start({"name": r.get("start_name"), "step_time_s": r.get("start_step_time_s")}),
             "note": r.get("note") or (NO_FEASIBLE if r.get("kind") == "search" and r.get("best_step_time_s") is None
                                       else "")}
            for r in rows]  # fmt: skip
    search_names = [r["strategy"] for r in rows if r.get("kind") == "search"]
    bound = bound_info(rep.get("lower_bound_s"), None, schedule, "the compared step")
    prov = {
        "kind": "compare", "graph": _graph_info(g), "cluster": _cluster_info(c),
        "strategies": [r["strategy"] for r in rows], "strategy_configs": strategy_configs(search_names, problem.space),
        "config_source": "this code version's defaults", "budget": _budget_text(_get(rep, "budget_samples")),
        "seeds": list(range(rep["seeds"])) if isinstance(rep.get("seeds"), int) else NOT_RECORDED,
        "groups": _get(rep, "groups"), "evaluator": _get(rep, "evaluator"),
        "wall_time_s": sum(float(r.get("wall_time_s") or 0) * (r.get("seeds") or 1) for r in rows),
        "wall_time_note": ("sum over rows of each row's wall time" if rep.get("seeds") == 1
                           else "sum over rows of the median run's wall time x seeds"),
        "versions": versions(g),
    }  # fmt: skip
    data = {
        "kind": "compare",
        "title": f"{g.name} on {c.name}: {len(rows)} strategies, {_get(rep, 'budget_samples')} samples x "
                 f"{_get(rep, 'seeds')} seed{'' if rep.get('seeds') == 1 else 's'}",
        "seeds": rep["seeds"] if isinstance(rep.get("seeds"), int) else None,
        "provenance": prov,
        "numbers": {"lower_bound_s": rep.get("lower_bound_s"), "single_device_step_time_s":
                    rep.get("single_device_step_time_s"),
                    "rows": {r["strategy"]: r.get("best_step_time_s") for r in rows}},
        "curves": curves, "bars": bars,
        "lines": {"single_device_s": rep.get("single_device_step_time_s"), "lower_bound_s": bound["lower_bound_s"]},
        "lower_bound": bound,
        "schedule": schedule, "memory": memory, "placement_map": placement_map_info(g, c, ops),
    }  # fmt: skip
    return data, sched


def seeds_of(data: dict) -> int:
    """The most seeds any strategy of a report's data ran (1 for a place run)."""
    counts = [b.get("seeds") for b in data.get("bars", []) if isinstance(b.get("seeds"), int)]
    counts += [len(c.get("seeds", [])) for c in data.get("curves", [])]
    return max(counts + [int(data.get("seeds") or 1)])


def stamp(data: dict) -> dict:
    data["report_version"] = REPORT_VERSION
    data["created_utc"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    return data


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


def _budget_text(budget):
    """A recorded budget as a person reads it ("2400" or "2400 samples" -> "2400 samples", "60s" -> "60 s")."""
    from postplace.search import Budget

    try:
        return Budget.parse(budget).describe()
    except PostplaceError:
        return budget
