"""Placements: one device id per op, read from and written to ``{op name: device name}`` JSON.

A partial placement is completed through colocation (an op with no device takes the device of its
colocation set); a placement that splits a colocation set, names an unknown op or device, or puts an
op on a device kind it may not use is an error with one line that says which.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from postplace.cluster.cluster import Cluster
from postplace.errors import PostplaceError
from postplace.graph import OpGraph
from postplace.graph.opgraph import KIND_BITS, read_json


def effective_kinds(graph: OpGraph) -> np.ndarray:
    """Each op's allowed kinds intersected over its colocation set (what it can really use)."""
    mask = graph.allowed_kinds.copy()
    for members in graph.colocation_sets:
        mask[members] = np.bitwise_and.reduce(graph.allowed_kinds[members])
    return mask


def check_kinds(graph: OpGraph, cluster: Cluster) -> None:
    """One error line when an op (with its colocation set) may use no device of ``cluster``: a cpu-only op
    on a cluster without a cpu, or a colocation set whose members share no kind.

    Raises
    ------
    PostplaceError
        Naming the first such op, the kinds it may use and the cluster's devices.
    """
    mask = effective_kinds(graph)
    have = int(np.bitwise_or.reduce(cluster.kind_bits)) if cluster.num_devices else 0
    bad = np.flatnonzero((mask & have) == 0)
    if not bad.size:
        return
    i = int(bad[0])
    devices = ", ".join(f"{d.name} ({d.kind})" for d in cluster.devices)
    if mask[i] == 0:  # each member alone may run somewhere; together they share no kind
        raise PostplaceError(
            f"graph '{graph.name}': op '{graph.names[i]}' is colocated with ops that may only run "
            "on another device kind, so its set may run on no device; fix the allowed kinds or the "
            "colocation of the graph"
        )
    kinds = "/".join(k for k, bit in KIND_BITS.items() if mask[i] & bit)
    raise PostplaceError(
        f"graph '{graph.name}': op '{graph.names[i]}' may only run on a {kinds} device, and cluster "
        f"'{cluster.name}' has none (its devices: {devices}); add a {kinds} device to the cluster "
        "file or use a cluster that has one"
    )


def single_device(graph: OpGraph, cluster: Cluster, device: str) -> np.ndarray:
    """Every op on ``device``; ops that may not run there go to the first device of a kind they may use
    (one error line when some op may use no device of the cluster: :func:`check_kinds`)."""
    d = cluster.device_index(device)
    check_kinds(graph, cluster)
    mask = effective_kinds(graph)
    dev = np.full(graph.num_ops, d, dtype=np.int64)
    misfit = (mask & cluster.kind_bits[d]) == 0
    for i in np.flatnonzero(misfit):
        dev[i] = next(k for k in range(cluster.num_devices) if mask[i] & cluster.kind_bits[k])
    return dev


def colocation_representative(graph: OpGraph) -> np.ndarray:
    """For each op, the first op of its colocation set (itself when unconstrained)."""
    rep = np.arange(graph.num_ops)
    for members in graph.colocation_sets:
        rep[members] = members[0]
    return rep


def invalid_reason(graph: OpGraph, cluster: Cluster, dev: np.ndarray) -> str | None:
    """Why an op-level placement is not allowed, or None when it is."""
    D = cluster.num_devices
    bad = np.flatnonzero((dev < 0) | (dev >= D))
    if bad.size:
        return f"op '{graph.names[bad[0]]}' has device id {dev[bad[0]]}; ids are 0..{D - 1}"
    bad = np.flatnonzero((graph.allowed_kinds & cluster.kind_bits[dev]) == 0)
    if bad.size:
        i = bad[0]
        kinds = "/".join(k for k, bit in (("cpu", 1), ("gpu", 2)) if graph.allowed_kinds[i] & bit)
        return f"op '{graph.names[i]}' may only run on {kinds} but is placed on {cluster.device_names[dev[i]]}"
    rep = colocation_representative(graph)
    bad = np.flatnonzero(dev != dev[rep])
    if bad.size:
        i = bad[0]
        return (
            f"placement splits a colocation set: '{graph.names[rep[i]]}' is on {cluster.device_names[dev[rep[i]]]} "
            f"but '{graph.names[i]}' on {cluster.device_names[dev[i]]}; put them on one device"
        )
    return None


def from_mapping(graph: OpGraph, cluster: Cluster, mapping: dict, *, source: str = "placement") -> np.ndarray:
    """An op-level placement from ``{op name: device name}``, completed through colocation."""
    dev = np.full(graph.num_ops, -1, dtype=np.int64)
    for name, device in mapping.items():
        if not isinstance(device, str):
            raise PostplaceError(f"{source}: op '{name}' maps to {device!r}; use a device name such as 'gpu0'")
        if name not in graph._index:
            raise PostplaceError(f"{source}: op '{name}' is not in graph '{graph.name}'; check the op names")
        try:
            dev[graph.index(name)] = cluster.device_index(device)
        except PostplaceError as exc:
            raise PostplaceError(f"{source}: op '{name}': {exc}") from None
    for members in graph.colocation_sets:
        placed = dev[members][dev[members] >= 0]
        if placed.size and np.any(placed != placed[0]):
            a = members[dev[members] == placed[0]][0]
            b = members[(dev[members] >= 0) & (dev[members] != placed[0])][0]
            raise PostplaceError(
                f"{source}: placement splits a colocation set: '{graph.names[a]}' on {cluster.device_names[dev[a]]} "
                f"but '{graph.names[b]}' on {cluster.device_names[dev[b]]}; put them on one device"
            )
        if placed.size:
            dev[members] = placed[0]
    missing = np.flatnonzero(dev < 0)
    if missing.size:
        names = ", ".join(f"'{graph.names[i]}'" for i in missing[:3])
        raise PostplaceError(
            f"{source}: {missing.size} ops have no device (e.g. {names}); give every op, or one op of each "
            "colocation set, a device"
        )
    reason = invalid_reason(graph, cluster, dev)
    if reason:
        raise PostplaceError(f"{source}: {reason}")
    return dev


def to_mapping(graph: OpGraph, cluster: Cluster, dev: np.ndarray) -> dict[str, str]:
    return {name: cluster.device_names[int(d)] for name, d in zip(graph.names, dev, strict=True)}


def load_placement(path: str | Path, graph: OpGraph, cluster: Cluster) -> np.ndarray:
    d = read_json(path)
    if not isinstance(d, dict):
        raise PostplaceError(f"{path}: a placement file is one JSON object {{op name: device name}}")
    return from_mapping(graph, cluster, d, source=str(path))


def save_placement(path: str | Path, graph: OpGraph, cluster: Cluster, dev: np.ndarray) -> None:
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(to_mapping(graph, cluster, dev), indent=0))
    tmp.replace(path)
