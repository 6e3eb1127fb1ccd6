"""Importer for the profiled workloads of msr-fiddle/dnn-partitioning (Tarnawski et al., NeurIPS 2020).

The format and its traps are described in ``shared/data/dnn-partitioning/SOURCE.md``. What this
importer decides:

- ``fpgaLatency`` becomes a measured time for device kind ``gpu`` (any GPU: the file does not name
  its accelerator), ``cpuLatency`` one for kind ``cpu``; both are read as milliseconds and stored in
  seconds. The provenance says where they came from, and that the CPU times are synthetic when they
  are an exact multiple of the accelerator times.
- ``colorClass`` becomes a colocation id; ``supportedOnFpga`` false restricts the op to CPUs.
- ``size`` is the op's static memory footprint: the graph's memory mode is ``static`` and the size is
  stored as ``persistent_bytes`` (live activations are not added on top: that would count them twice).
- Edges carry their ``size`` in bytes; ``cost`` is ignored (its unit differs across files). A node's
  distinct out-edge sizes are its distinct outputs (``slot``), so a tensor consumed by several ops on
  one device is sent there once.
- Layer graphs carry no edge from a forward node to its backward partner. When the file has no
  forward-to-backward edge at all, a zero-byte edge is added from every forward node to every backward
  node of the same colorClass (the backward node reads that activation); they are colocated, so the
  edge costs no transfer. The number added is kept in ``metadata["added_dependencies"]``.
- Ids may start at 0 or 1; unknown extra keys are ignored; booleans may be 0/1. Ops are stored in a
  topological order that keeps the file's id order wherever the edges allow it.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from postplace.errors import PostplaceError
from postplace.graph.opgraph import KIND_BITS, Measurement, OpGraph, find_cycle, topological_order

MS = 1e-3  # the files' latencies are milliseconds (the totals only make sense so)


def looks_like(d) -> bool:
    """True when a parsed JSON document is a dnn-partitioning workload."""
    return (
        isinstance(d, dict)
        and isinstance(d.get("nodes"), list)
        and isinstance(d.get("edges"), list)
        and any(isinstance(x, dict) and "fpgaLatency" in x for x in d["nodes"][:5])
    )


def import_workload(d: dict, *, source: str = "workload") -> OpGraph:
    """Convert a parsed dnn-partitioning document into an OpGraph (see the module docstring)."""
    nodes, edges = d["nodes"], d["edges"]
    if not nodes:
        raise PostplaceError(f"{source}: 'nodes' is empty; a workload needs at least one node")
    index_of_id: dict[int, int] = {}
    rows = []
    for k, node in enumerate(nodes):
        where = f"{source}: nodes[{k}]"
        if not isinstance(node, dict):
            raise PostplaceError(f"{where} is not an object")
        nid = _number(node, "id", where, integer=True)
        if nid in index_of_id:
            raise PostplaceError(f"{where} repeats id {nid}; ids must be unique")
        index_of_id[nid] = k
        rows.append(
            (
                nid,
                str(node.get("name", f"node{nid}")),
                _number(node, "fpgaLatency", where),
                _number(node, "cpuLatency", where),
                _number(node, "size", where),
                bool(node.get("supportedOnFpga", True)),
                bool(node.get("isBackwardNode", False)),
                node.get("colorClass"),
            )
        )
    src, dst, ebytes = [], [], []
    for k, e in enumerate(edges):
        where = f"{source}: edges[{k}]"
        if not isinstance(e, dict):
            raise PostplaceError(f"{where} is not an object")
        for key in ("sourceId", "destId"):
            ident = _number(e, key, where, integer=True)
            if ident not in index_of_id:
                raise PostplaceError(f"{where} field '{key}' is {ident}, which no node has")
        src.append(index_of_id[int(e["sourceId"])])
        dst.append(index_of_id[int(e["destId"])])
        ebytes.append(_number(e, "size", where))

    n = len(rows)
    backward = np.array([r[6] for r in rows], dtype=bool)
    color = [r[7] for r in rows]
    added = 0
    if not any(not backward[s] and backward[t] for s, t in zip(src, dst, strict=True)):
        members: dict[object, list[int]] = {}
        for i, c in enumerate(color):
            if c is not None:
                members.setdefault(c, []).append(i)
        for group in members.values():
            for f in (i for i in group if not backward[i]):
                for b in (i for i in group if backward[i]):
                    src.append(f)
                    dst.append(b)
                    ebytes.append(0.0)
                    added += 1

    order = topological_order(n, src, dst)
    if order is None:
        cycle = find_cycle(n, src, dst)
        names = " -> ".join(rows[i][1] for i in [*cycle, cycle[0]])
        raise PostplaceError(f"{source}: the graph has a cycle: {names}; a training step must be a DAG")
    position = np.empty(n, dtype=np.int64)
    position[order] = np.arange(n)

    slots = _slots(n, src, ebytes)
    out_bytes = np.zeros(n)
    for (s, _), b in {(s, sl): b for s, sl, b in zip(src, slots, ebytes, strict=True)}.items():
        out_bytes[s] += b

    names = _unique_names([rows[i][1] for i in order], [rows[i][0] for i in order])
    color_ids = {c: k for k, c in enumerate(dict.fromkeys(c for c in color if c is not None))}
    gpu = np.array([rows[i][2] for i in order]) * MS
    cpu = np.array([rows[i][3] for i in order]) * MS
    ratio = _exact_ratio(cpu, gpu)
    cpu_note = f"synthetic: exactly {ratio:g}x the accelerator time" if ratio else "as given in the file"
    file_name = Path(source).name
    return OpGraph(
        names=names,
        op_types=["backward" if backward[i] else "forward" for i in order],
        flops=np.zeros(n),
        bytes_accessed=np.zeros(n),
        output_bytes=out_bytes[order],
        persistent_bytes=np.array([rows[i][4] for i in order]),
        colocation=[color_ids[color[i]] if color[i] is not None else -1 for i in order],
        phase=[1 if backward[i] else 0 for i in order],
        allowed_kinds=[KIND_BITS["cpu"] | (KIND_BITS["gpu"] if rows[i][5] else 0) for i in order],
        inplace=np.zeros(n, dtype=bool),
        edge_src=position[np.asarray(src, dtype=np.int64)],
        edge_dst=position[np.asarray(dst, dtype=np.int64)],
        edge_slot=slots,
        edge_bytes=ebytes,
        memory_mode="static",
        measured=(
            Measurement("gpu", "gpu", gpu, f"{file_name}: fpgaLatency (profiled accelerator, ms)"),
            Measurement("cpu", "cpu", cpu, f"{file_name}: cpuLatency ({cpu_note})"),
        ),
        name=Path(source).stem,
        metadata={
            "source": file_name,
            "format": "dnn-partitioning",
            "original_ids": [rows[i][0] for i in order],
            "added_dependencies": added,
            "max_size_per_accelerator": d.get("maxSizePerFPGA"),
        },
    )


def _number(obj: dict, key: str, where: str, *, integer: bool = False):
    if key not in obj:
        raise PostplaceError(f"{where} has no field '{key}'; add it (see the dnn-partitioning format)")
    v = obj[key]
    if isinstance(v, bool) or not isinstance(v, int | float):
        raise PostplaceError(f"{where} field '{key}' is {v!r}; it must be a number")
    if integer:
        if v != int(v):
            raise PostplaceError(f"{where} field '{key}' is {v!r}; it must be an integer")
        return int(v)
    if not np.isfinite(v) or v < 0:
        raise PostplaceError(f"{where} field '{key}' is {v!r}; it must be a finite non-negative number")
    return float(v)


def _slots(n: int, src: list[int], ebytes: list[float]) -> list[int]:
    """Output slot of each edge: a node's distinct out-edge sizes, in order of first appearance."""
    seen: list[dict[float, int]] = [dict() for _ in range(n)]
    return [seen[s].setdefault(b, len(seen[s])) for s, b in zip(src, ebytes, strict=True)]


def _unique_names(names: list[str], ids: list[int]) -> list[str]:
    counts: dict[str, int] = {}
    for nm in names:
        counts[nm] = counts.get(nm, 0) + 1
    return [nm if counts[nm] == 1 else f"{nm}#{i}" for nm, i in zip(names, ids, strict=True)]


def _exact_ratio(cpu: np.ndarray, gpu: np.ndarray) -> float | None:
    nz = gpu > 0
    if not nz.any() or np.any(cpu[~nz] != 0):
        return None
    r = cpu[nz] / gpu[nz]
    return float(np.round(r[0], 6)) if np.allclose(r, r[0], rtol=1e-9) else None


def import_expert_split(d: dict, graph: OpGraph, *, source: str = "split") -> dict[str, str]:
    """Read a split file (``{"cpus": [{"nodes": [...]}], "fpgas": [...]}``) into ``{op name: device}``.

    CPUs map to ``cpu`` (and ``cpu1``... if several), accelerators to ``gpu0``, ``gpu1``...; nodes the
    split leaves out are left for colocation to complete.
    """
    ids = graph.metadata.get("original_ids")
    if ids is None:
        raise PostplaceError(f"{source}: a split file needs a graph imported from a dnn-partitioning workload")
    by_id = {int(orig): graph.names[i] for i, orig in enumerate(ids)}
    out: dict[str, str] = {}
    for key, prefix in (("cpus", "cpu"), ("fpgas", "gpu")):
        for k, dev in enumerate(d.get(key, [])):
            name = prefix if prefix == "cpu" and k == 0 else f"{prefix}{k}"
            for nid in dev.get("nodes", []):
                if nid not in by_id:
                    raise PostplaceError(f"{source}: {key}[{k}] names node id {nid}, which the graph has not")
                out[by_id[nid]] = name
    return out
