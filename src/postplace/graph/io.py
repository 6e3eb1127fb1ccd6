"""Load any graph file postplace reads, detecting its format from the content."""

from __future__ import annotations

from pathlib import Path

from postplace.errors import PostplaceError
from postplace.graph import dnn_partitioning
from postplace.graph.opgraph import FORMAT, OpGraph, read_json


def load_graph(path: str | Path) -> OpGraph:
    """Read a postplace graph file or a dnn-partitioning workload, whichever the file holds.

    Parameters
    ----------
    path : str or path
        A graph file written by :meth:`OpGraph.save`, or a dnn-partitioning workload JSON (``"nodes"``
        with ``"fpgaLatency"``, and ``"edges"``).

    Returns
    -------
    OpGraph

    Raises
    ------
    PostplaceError
        When the file is missing, is not JSON, is neither format, or breaks a graph invariant.

    Examples
    --------
    >>> import os, tempfile
    >>> from postplace.graph import OpGraph, load_graph
    >>> path = os.path.join(tempfile.mkdtemp(), "g.json")
    >>> OpGraph.build(["a", "b"], [(0, 1, 8.0)], name="two").save(path)
    >>> load_graph(path)
    OpGraph('two': 2 ops, 1 edges, 0 FLOPs, 0 GB persistent, memory mode live)
    """
    d = read_json(path)
    if isinstance(d, dict) and d.get("format") == FORMAT:
        return OpGraph.from_dict(d, source=str(path))
    if dnn_partitioning.looks_like(d):
        return dnn_partitioning.import_workload(d, source=str(path))
    raise PostplaceError(
        f'{path}: not a graph postplace can read; expected a postplace graph ("format": "{FORMAT}") '
        'or a dnn-partitioning workload ("nodes" with "fpgaLatency", and "edges")'
    )
