"""METIS k-way partition of the op graph over the devices (Karypis and Kumar, 1998), with a memory repair.

Scope and caveats: METIS balances work and cuts bytes; it knows nothing of the schedule (a balanced
cut can still serialise on the critical path). Colocation sets are contracted to one vertex first, so
they are never split. The repair step respects capacities where it can (checked by the simulator);
when no move makes a device fit, the placement is returned as it is and the simulator reports it OOM.
"""

from __future__ import annotations

import numpy as np

from postplace.cluster import Cluster
from postplace.cost import CostModel
from postplace.graph import OpGraph
from postplace.graph.metis import part_graph, symmetric_csr
from postplace.placers._common import check_graph, constrained_devices, op_time_table, units
from postplace.placers.registry import register_placer

__all__ = ["place_metis"]

_SCALE = 1_000_000  # METIS takes integer weights: the largest weight maps to about this


@register_placer("metis", candidate=True, heuristic=True, rank=60)
def place_metis(
    graph: OpGraph,
    cluster: Cluster,
    *,
    cost_model: CostModel | None = None,
    seed: int = 0,
    devices: list | None = None,
    repair: bool = True,
    allowed: np.ndarray | None = None,
) -> np.ndarray:
    """Partition the (colocation-contracted, undirected) op graph into one part per device with METIS.

    Vertex weight = a unit's work (sum over its ops of the mean time over the devices it may use), edge
    weight = bytes between units, target part weights proportional to device speed (the inverse of
    the total time of the ops every device may run). Units that may not use their part's device (CPU-only
    ops) then move to the first allowed device. Repair, when the simulator says the partition is OOM:
    units are moved off over-full devices, largest first, to the allowed device with room that they
    exchange the most bytes with (ties: most free memory), until the simulator says it fits (details
    in ``_repair``); when no move achieves that, the placement stays OOM.

    Parameters
    ----------
    graph, cluster : OpGraph, Cluster
    cost_model : CostModel, optional
        Default :class:`postplace.cost.RooflineCostModel`.
    seed : int
        METIS's random seed.
    devices : list of str or int, optional
        Devices to partition over (default: all).
    repair : bool
        Move units off over-full devices (default True).
    allowed : numpy.ndarray, optional
        ``[n_ops, D]`` bool: the user's constraints (pins, exclusions); an op only goes where allowed.

    Returns
    -------
    numpy.ndarray
        int64 device id per op.

    References
    ----------
    G. Karypis, V. Kumar, "A Fast and High Quality Multilevel Scheme for Partitioning Irregular Graphs",
    SIAM J. Scientific Computing 20(1), 1998. Used as a placement baseline by Mirhoseini et al., ICML 2017.

    Examples
    --------
    >>> from postplace.graph import OpGraph
    >>> from postplace.testing import ConstantCostModel, star_cluster
    >>> g = OpGraph.build(list("abcd"), [(0, 1, 100.0), (2, 3, 100.0), (1, 3, 1.0)])
    >>> p = place_metis(g, star_cluster(("gpu", "gpu")), cost_model=ConstantCostModel(1.0))
    >>> bool(p[0] == p[1] and p[2] == p[3] and p[0] != p[2])
    True
    """
    check_graph(graph, cluster, "metis", allowed)
    times = op_time_table(graph, cluster, cost_model, allowed)
    D = cluster.num_devices
    devs = (
        constrained_devices(list(range(D)), allowed)
        if devices is None
        else [cluster.device_index(d) if isinstance(d, str) else int(d) for d in devices]
    )
    unit_of_op, members = units(graph)
    U = len(members)
    allowed = np.isfinite(times)
    unit_dev = np.full(U, devs[0], dtype=np.int64)
    if len(devs) > 1 and U > 1:
        ok = np.isfinite(times)
        mean = np.where(ok, times, 0.0).sum(axis=1) / np.maximum(ok.sum(axis=1), 1)
        work = np.bincount(unit_of_op, weights=mean, minlength=U)
        xadj, adjncy, summed = symmetric_csr(
            unit_of_op[graph.edge_src], unit_of_op[graph.edge_dst], graph.edge_bytes, U
        )
        common = allowed[:, devs].all(axis=1)
        rows = times[common][:, devs] if common.any() else np.where(allowed[:, devs], times[:, devs], 0.0)
        speed = 1.0 / np.maximum(rows.sum(axis=0), 1e-300)  # no time at all: the fastest there is
        parts = part_graph(
            len(devs), xadj, adjncy, vweights=work, eweights=summed, tpwgts=speed, scale=_SCALE, seed=seed
        )
        unit_dev = np.array(devs, dtype=np.int64)[parts]
    first = np.array([m[0] for m in members], dtype=np.int64)
    for u in np.flatnonzero(~allowed[first, unit_dev]):
        unit_dev[u] = int(np.flatnonzero(allowed[first[u]])[0])
    dev = unit_dev[unit_of_op]
    if repair:
        dev = _repair(graph, cluster, dev, unit_of_op, members, allowed[first], cost_model)
    return dev


def _repair(graph, cluster, dev, unit_of_op, members, unit_allowed, cost_model) -> np.ndarray:
    """Move units off over-full devices until the simulator says the placement fits, where it can.

    A unit's size is its persistent bytes plus a fraction ``f`` of its live-mode outputs (all of
    them in static mode, where that is the simulator's own account); ``f`` = 0, 1/4, 1/2, 1 are tried
    in turn, each repaired placement is simulated, and the first that is not OOM is returned (else the
    last one). Units leave an over-full device largest first, each to the allowed device with room
    that it exchanges the most bytes with (ties: the most free memory).
    """
    from postplace.sim import Simulator

    sim = Simulator(graph, cluster, cost_model=cost_model)
    if sim.evaluate(dev[None]).feasible[0]:
        return dev
    cap = cluster.capacity
    D = cluster.num_devices
    out = np.where(graph.inplace, 0.0, graph.output_bytes) if graph.memory_mode == "live" else np.zeros(graph.num_ops)
    fractions = (0.0, 0.25, 0.5, 1.0) if graph.memory_mode == "live" else (1.0,)
    best = dev
    for f in fractions:
        size_op = graph.persistent_bytes + f * out
        size = np.array([size_op[m].sum() for m in members])
        udev = np.array([dev[m[0]] for m in members], dtype=np.int64)
        used = np.bincount(udev, weights=size, minlength=D)
        trial = dev.copy()
        for d in np.flatnonzero(used > cap):
            for u in np.argsort(-size, kind="stable"):
                if used[d] <= cap[d]:
                    break
                if udev[u] != d:
                    continue
                room = [t for t in np.flatnonzero(unit_allowed[u]) if t != d and used[t] + size[u] <= cap[t]]
                if not room:
                    continue
                bytes_to = _bytes_to_devices(graph, trial, members[u], D)
                t = min(room, key=lambda t: (-bytes_to[t], -(cap[t] - used[t] - size[u]), t))
                used[d] -= size[u]
                used[t] += size[u]
                udev[u] = t
                trial[members[u]] = t
        best = trial
        if sim.evaluate(trial[None]).feasible[0]:
            return trial
    return best


def _bytes_to_devices(graph: OpGraph, dev: np.ndarray, ops: np.ndarray, D: int) -> np.ndarray:
    out = np.zeros(D)
    for i in ops:
        for e in range(graph.out_ptr[i], graph.out_ptr[i + 1]):
            out[dev[graph.edge_dst[e]]] += graph.edge_bytes[e]
        for k in range(graph.in_ptr[i], graph.in_ptr[i + 1]):
            e = graph.in_edges[k]
            out[dev[graph.edge_src[e]]] += graph.edge_bytes[e]
    return out
