"""Reading a run folder: which kind it is, its JSON files read with input limits, its search runs'
histories and best placements, and the graph and cluster it ran on.

Only the files ``place`` and ``compare`` write for people and other tools are read (``summary.json``,
``compare.json``, ``run.json``, ``history.jsonl``, ``timing.jsonl`` and each search run's
``result.json``), never a checkpoint. The graph and cluster come from what the folder records (its
checksummed ``run.json`` first) unless the caller gives them, and a cluster given must be the machine
the run placed on.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from postplace.errors import PostplaceError
from postplace.report._checks import MAX_STEP_S, TOO_LARGE, edited_error, shown


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


def read_run_json(path: Path) -> dict:
    """A run folder's JSON file, read with the limits every input file gets (size, encoding, integers of
    hundreds of digits, nesting: :func:`postplace.validate.read_json`); its checker then checks each field."""
    from postplace.validate import read_json

    return read_json(path, "run folder file", finite=False)


def checked_units(path: Path, num_units: int, num_devices: int):
    """A search run's ``result.json`` best placement: one device id (0 .. D-1) per unit, as an array;
    None where the run recorded none (it found no feasible placement)."""
    res = read_run_json(path)
    if not isinstance(res, dict):
        raise PostplaceError(
            f"{path}: not a JSON object of a search run's result: the run folder was edited or "
            "damaged; run the `postplace compare` command that wrote it again"
        )
    units = res.get("best_placement")
    if units is None:
        return None
    ok = (
        isinstance(units, list)
        and len(units) == num_units
        and all(type(u) is int and 0 <= u < num_devices for u in units)
    )
    if not ok:
        raise PostplaceError(
            f"{path}: field 'best_placement' is not {num_units} device ids from 0 to "
            f"{num_devices - 1}: the run folder was edited or damaged, or the run was of another "
            "graph, grouping or cluster; run the `postplace compare` command that wrote it "
            "again"
        )
    return np.asarray(units, dtype=np.int64)


def checked_history(path: Path) -> list[dict]:
    """The samples of a ``history.jsonl`` (:func:`~postplace.search.history.read_history` leaves out the
    lines that are not samples), each step time at most :data:`MAX_STEP_S`: a larger one (1e308) broke the
    learning curves' axes; it is one error line, naming the sample."""
    from postplace.search.history import read_history

    rows = read_history(path)
    for k, row in enumerate(rows):
        t = float(row["step_time_s"])
        if t > MAX_STEP_S:
            raise PostplaceError(
                f"{path}: sample {shown(row.get('sample', k))} has step_time_s {t:.3g}, past "
                f"the {MAX_STEP_S:g} s a report can draw: {TOO_LARGE}"
            )
    return rows


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
                return cached_graph(
                    spec["name"],
                    spec["size"],
                    **recorded_step(spec),
                    microbatches=m,
                    colocation=coloc if coloc in ("none", "module") else "none",
                )
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
        raise PostplaceError(
            f"{where}: the cluster {spec} is no longer the one the run used (it changed since the "
            f"run, or the record was edited: its fingerprint differs); {fix}"
        )
    return c


def check_same_machine(s: dict, c, given, run_dir: Path) -> None:
    """The cluster a place report draws on is the run's machine: the one its run folder records must carry
    the summary's cluster name, and a ``--cluster`` given instead must have the devices the run had
    (``capacity_bytes``; a changed link or speed is the user's choice, another machine is not)."""
    path = run_dir / "summary.json"
    if given is None and s["cluster"] != c.name:
        raise edited_error(
            path, run_dir, f"field 'cluster' says '{s['cluster'][:40]}', and the run folder records cluster '{c.name}'"
        )
    devices = s.get("capacity_bytes")
    if given is not None and isinstance(devices, dict) and list(devices) != list(c.device_names):
        raise PostplaceError(
            f"--cluster {given if isinstance(given, str) else c.name}: its devices "
            f"({', '.join(c.device_names)}) are not those of the machine the run in {run_dir} "
            f"placed on ({', '.join(map(str, devices))}); give that machine's cluster, or "
            "none"
        )
