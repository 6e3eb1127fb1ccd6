"""The placement map: how many ops of each module, phase and device a placement puts where.

Modules are the ops' module paths (recorded by a traced graph, else inferred from parameter names,
colocation and data edges, else a layer graph's op names), cut to the depth that keeps the map readable.
"""

from __future__ import annotations

import numpy as np

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


def placement_map_info(graph, cluster, ops: np.ndarray, depth: int | None = None, max_rows: int = MAP_MAX_ROWS) -> dict:
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
        "devices": list(cluster.device_names),
        "phases": phases,
        "module_source": how,
        "depth": depth if dotted else None,
        "max_depth": max((m.count(".") + 1 for m in full if not m.startswith("(")), default=1) if dotted else None,
        "modules": [{"module": m, "counts": counts[m]} for m in sorted(order, key=order.get)],
        "ops_per_device": np.bincount(ops, minlength=cluster.num_devices).tolist(),
    }
