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
- **The backward pass is imported the right way round.** Operator graphs (any edge from a forward to
  a backward node) are taken as written. Layer graphs have no forward-to-backward edge, and their
  backward edges *mirror* the forward ones in the same direction (``node1 -> node4`` beside
  ``node1grad -> node4grad``), while a real backward pass runs against the forward one
  (``node4grad`` computes the gradient ``node1grad`` needs). A backward edge ``a -> b`` mirrors a
  forward edge when some forward edge joins the colour class of ``a`` to that of ``b``; it runs
  against the forward pass when one joins the class of ``b`` to that of ``a``. If every backward
  edge between two classes mirrors and none runs against, the file is a mirrored layer graph: every
  backward-to-backward edge is reversed (``metadata["backward_edges"] == "reversed"``, the count in
  ``metadata["reversed_edges"]``). If none mirrors, the backward edges are kept (``"as given"``). A
  mix, or a mirrored file with a backward edge that mirrors nothing, is refused with an error naming
  two such edges: the file's backward direction cannot be read from it. A backward-to-forward edge
  in a file without forward-to-backward edges is refused too (the ``isBackwardNode`` flags are off).
- Layer graphs carry no edge from a forward node to its backward partner. When the file has no
  forward-to-backward edge at all, a zero-byte edge is added from every forward node to every backward
  node of the same colorClass (the backward node reads that activation); they are colocated, so the
  edge costs no transfer. The number added is kept in ``metadata["added_dependencies"]``.
- The file's own machine (``maxSizePerFPGA`` bytes, ``maxFPGAs``, ``maxCPUs``) is kept in
  ``metadata`` as ``max_size_per_accelerator``, ``max_accelerators`` and ``max_cpus`` (None where
  absent); ``postplace.cluster.from_workload`` builds a cluster from them.
- Ids are non-negative integers and may start at 0 or 1; unknown extra keys are ignored; booleans
  are ``true``/``false`` or ``0``/``1`` (anything else, e.g. the string ``"false"``, is an error).
  Every malformed field (missing, wrong type, NaN/inf, negative) is one error naming the node or
  edge and the field. Ops are stored in a topological order that keeps the file's id order wherever
  the edges allow it.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from postplace.errors import PostplaceError
from postplace.graph.opgraph import KIND_BITS, Measurement, OpGraph, find_cycle, topological_order
from postplace.validate import INT64_MAX, MAX_BYTES

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
    machine = _machine(d, source)
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
        name = node.get("name", f"node{nid}")
        if not isinstance(name, str) or not name:
            raise PostplaceError(f"{where} (id {nid}) field 'name' is {name!r}; it must be a non-empty string")
        who = f" (node '{name}', id {nid})"
        color = node.get("colorClass")
        if color is not None:
            color = _number(node, "colorClass", where, integer=True, who=who)
        rows.append(
            (
                nid,
                name,
                _number(node, "fpgaLatency", where, who=who),
                _number(node, "cpuLatency", where, who=who),
                _bytes(node, "size", where, who=who),
                _flag(node, "supportedOnFpga", where, default=True, who=who),
                _flag(node, "isBackwardNode", where, default=False, who=who),
                color,
            )
        )
    src, dst, ebytes = [], [], []
    for k, e in enumerate(edges):
        where = f"{source}: edges[{k}]"
        if not isinstance(e, dict):
            raise PostplaceError(f"{where} is not an object")
        ends = []
        for key in ("sourceId", "destId"):
            ident = _number(e, key, where, integer=True)
            if ident not in index_of_id:
                raise PostplaceError(f"{where} field '{key}' is {ident}, which no node has")
            ends.append(index_of_id[ident])
        src.append(ends[0])
        dst.append(ends[1])
        ebytes.append(_bytes(e, "size", where, who=f" (edge {e['sourceId']} -> {e['destId']})"))

    n = len(rows)
    backward = np.array([r[6] for r in rows], dtype=bool)
    color = [r[7] for r in rows]
    orientation, reversed_edges = _orient_backward(backward, color, src, dst, [r[1] for r in rows], source)
    added = 0
    if orientation != "explicit":
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
            "backward_edges": orientation,
            "reversed_edges": reversed_edges,
            "added_dependencies": added,
            **machine,
        },
    )


def describe_backward(metadata: dict) -> str | None:
    """One line on how an imported workload's backward pass was oriented (None for other graphs)."""
    how = metadata.get("backward_edges")
    added = metadata.get("added_dependencies", 0)
    deps = f"; {added} forward-to-backward dependencies added" if added else ""
    if how == "reversed":
        n = metadata.get("reversed_edges", 0)
        return f"backward edges reversed: layer graph ({n} mirrored the forward ones{deps})"
    if how == "as given":
        return f"backward edges as given: they already run against the forward ones{deps}"
    if how == "explicit":
        return "backward edges as given: operator graph (explicit forward-to-backward edges)"
    if how == "none":
        return f"no backward edges to orient{deps}"
    return None


def _orient_backward(
    backward: np.ndarray, color: list, src: list[int], dst: list[int], names: list[str], source: str
) -> tuple[str, int]:
    """Decide, and apply in place on ``src``/``dst``, the direction of the backward edges.

    Returns ``(how, reversed)``: how is ``explicit`` (forward-to-backward edges exist: untouched),
    ``none`` (no backward-to-backward edge), ``as given`` or ``reversed``.
    """
    pairs = list(zip(src, dst, strict=True))
    if any(not backward[s] and backward[t] for s, t in pairs):
        return "explicit", 0
    bad = next(((s, t) for s, t in pairs if backward[s] and not backward[t]), None)
    if bad is not None:
        raise PostplaceError(
            f"{source}: edge {names[bad[0]]} -> {names[bad[1]]} goes from a backward node to a forward one while "
            "no edge goes from a forward node to a backward one; check the file's isBackwardNode flags"
        )
    bb = [k for k, (s, t) in enumerate(pairs) if backward[s] and backward[t]]
    if not bb:
        return "none", 0
    forward_pairs = {
        (color[s], color[t])
        for s, t in pairs
        if not backward[s] and not backward[t] and color[s] is not None and color[t] is not None
    }
    mirrors, against, unmatched = [], [], []
    for k in bb:
        cs, ct = color[src[k]], color[dst[k]]
        same = (cs, ct) in forward_pairs
        rev = (ct, cs) in forward_pairs
        if cs is not None and cs == ct and same:
            continue  # inside one class, mirrored by a forward edge inside it: fits either direction
        if same and not rev:
            mirrors.append(k)
        elif rev and not same:
            against.append(k)
        elif not same:
            unmatched.append(k)
    if not mirrors:
        return "as given", 0
    if against or unmatched:
        other = (against or unmatched)[0]
        why = "runs against the forward edges" if against else "mirrors no forward edge between its colour classes"

        def edge(k: int) -> str:
            return f"{names[src[k]]} -> {names[dst[k]]}"

        raise PostplaceError(
            f"{source}: the backward pass is neither mirrored nor consistently oriented: backward edge "
            f"{edge(mirrors[0])} mirrors a forward edge but {edge(other)} {why}; with no forward-to-backward "
            "edge its direction cannot be read (write the backward edges all one way, or add the "
            "forward-to-backward edges)"
        )
    for k in bb:
        src[k], dst[k] = dst[k], src[k]
    return "reversed", len(bb)


def _machine(d: dict, source: str) -> dict:
    """The file's own machine: accelerator memory (bytes) and counts, None where the file omits them."""
    out = {}
    for key, name, integer in (
        ("maxSizePerFPGA", "max_size_per_accelerator", False),
        ("maxFPGAs", "max_accelerators", True),
        ("maxCPUs", "max_cpus", True),
    ):
        if d.get(key) is None:
            out[name] = None
        elif integer:
            out[name] = _number(d, key, source, integer=True)
        else:
            out[name] = _bytes(d, key, source)
    if out["max_size_per_accelerator"] == 0:
        raise PostplaceError(f"{source} field 'maxSizePerFPGA' is 0; it must be a positive number of bytes")
    return out


def _flag(obj: dict, key: str, where: str, *, default: bool, who: str = "") -> bool:
    if key not in obj:
        return default
    v = obj[key]
    if isinstance(v, bool):
        return v
    if isinstance(v, int) and v in (0, 1):
        return bool(v)
    raise PostplaceError(f"{where} field '{key}' is {v!r}{who}; it must be true, false, 0 or 1")


def _number(obj: dict, key: str, where: str, *, integer: bool = False, who: str = ""):
    if key not in obj:
        raise PostplaceError(f"{where} has no field '{key}'{who}; add it (see the dnn-partitioning format)")
    v = obj[key]
    if isinstance(v, bool) or not isinstance(v, int | float):
        raise PostplaceError(f"{where} field '{key}' is {v!r}{who}; it must be a number")
    if isinstance(v, int) and abs(v) > INT64_MAX:  # numpy cannot hold it, nor float precisely
        raise PostplaceError(
            f"{where} field '{key}' is {str(v)[:20]}... ({len(str(v))} digits){who}; it is too large "
            "for a 64-bit integer: check the file"
        )
    if not np.isfinite(v) or v < 0:
        raise PostplaceError(f"{where} field '{key}' is {v!r}{who}; it must be a finite non-negative number")
    if integer:
        if v != int(v):
            raise PostplaceError(f"{where} field '{key}' is {v!r}{who}; it must be an integer")
        return int(v)
    return float(v)


def _bytes(obj: dict, key: str, where: str, *, who: str = "") -> float:
    """A byte count: a finite non-negative number, at most ``MAX_BYTES`` (sums of larger ones leave float
    range in the simulator and METIS)."""
    v = _number(obj, key, where, who=who)
    if v > MAX_BYTES:
        raise PostplaceError(
            f"{where} field '{key}' is {v:g} bytes{who}, above the bound of {MAX_BYTES:g} bytes "
            "(1 EB); check the file's units"
        )
    return v


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
    with np.errstate(over="ignore", invalid="ignore"):  # 1e308 ms over 1 ms: not a ratio anyone wrote
        r = cpu[nz] / gpu[nz]
    if not np.isfinite(r).all():
        return None
    return float(np.round(r[0], 6)) if np.allclose(r, r[0], rtol=1e-9) else None


def import_expert_split(d: dict, graph: OpGraph, *, source: str = "split") -> dict[str, str]:
    """Read a split file (``{"cpus": [{"nodes": [...]}], "fpgas": [...]}``) into ``{op name: device}``.

    CPUs map to ``cpu`` (and ``cpu1``... if several), accelerators to ``gpu0``, ``gpu1``...; nodes the
    split leaves out are left for colocation to complete.
    """
    if not isinstance(d, dict):
        raise PostplaceError(
            f"{source}: an expert split is one JSON object with 'cpus' and 'fpgas', not a {type(d).__name__}"
        )
    ids = graph.metadata.get("original_ids")
    if ids is None:
        raise PostplaceError(f"{source}: a split file needs a graph imported from a dnn-partitioning workload")
    by_id = {int(orig): graph.names[i] for i, orig in enumerate(ids)}
    out: dict[str, str] = {}
    for key, prefix in (("cpus", "cpu"), ("fpgas", "gpu")):
        devices = d.get(key, [])
        if not isinstance(devices, list):
            raise PostplaceError(
                f"{source}: field '{key}' must be a list of objects with 'nodes', not {str(devices)[:40]!r}"
            )
        for k, dev in enumerate(devices):
            nodes = dev.get("nodes", []) if isinstance(dev, dict) else None
            if not isinstance(nodes, list):
                raise PostplaceError(f"{source}: {key}[{k}] must be an object whose 'nodes' is a list of node ids")
            name = prefix if prefix == "cpu" and k == 0 else f"{prefix}{k}"
            for nid in nodes:
                if type(nid) is not int:  # a bool is an int, and 1.0 == 1 would find node 1: neither is an id
                    raise PostplaceError(f"{source}: {key}[{k}] names node id {str(nid)[:40]!r}; node ids are integers")
                if nid not in by_id:
                    raise PostplaceError(f"{source}: {key}[{k}] names node id {nid}, which the graph has not")
                out[by_id[nid]] = name
    return out
