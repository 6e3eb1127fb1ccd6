"""Where a report's figures came from: the graph, the cluster, the search strategies' configurations
and the versions of the code that drew them, and the stamp every ``report.json`` carries.

A run folder leaves out keys a run did not record; :func:`recorded` gives such a value as the string
:data:`NOT_RECORDED`, the one word every renderer prints for it.
"""

from __future__ import annotations

import platform
import time
from dataclasses import asdict, is_dataclass
from importlib import metadata

import numpy as np

from postplace.errors import PostplaceError

NOT_RECORDED = "not recorded"
"""What a report shows for a value its run did not record."""
REPORT_VERSION = 1
"""The version of ``report.json``'s layout."""


def _version(dist: str) -> str:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return NOT_RECORDED


def versions(graph=None) -> dict:
    """The versions of the code that drew the report (and of torch that traced ``graph``, where it says)."""
    from postplace._version import __version__

    v = {
        "postplace": __version__,
        "python": platform.python_version(),
        "numpy": np.__version__,
        "numba": _version("numba"),
        "matplotlib": _version("matplotlib"),
        "torch": _version("torch"),
    }
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


def recorded(d: dict, key: str):
    """``d[key]``, or :data:`NOT_RECORDED` where the run did not record it (missing or null)."""
    v = d.get(key)
    return NOT_RECORDED if v is None else v


def graph_info(graph) -> dict:
    """The graph as the provenance table lists it."""
    return {
        "name": graph.name,
        "ops": graph.num_ops,
        "edges": graph.num_edges,
        "memory_mode": graph.memory_mode,
        "total_flops": float(graph.flops.sum()),
        "zoo": graph.metadata.get("zoo", NOT_RECORDED),
    }


def cluster_info(cluster) -> dict:
    """The cluster and its devices as the provenance table lists them."""
    return {
        "name": cluster.name,
        "description": cluster.description,
        "devices": [
            {"name": d.name, "kind": d.kind, "model": d.model, "memory_bytes": d.memory} for d in cluster.devices
        ],
    }


def budget_text(budget):
    """A recorded budget as a person reads it ("2400" or "2400 samples" -> "2400 samples", "60s" -> "60 s")."""
    from postplace.search import Budget

    try:
        return Budget.parse(budget).describe()
    except PostplaceError:
        return budget


def stamp(data: dict) -> dict:
    """``data`` with the report's layout version and the time (UTC) it was made."""
    data["report_version"] = REPORT_VERSION
    data["created_utc"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    return data
