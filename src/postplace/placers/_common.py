"""Shared machinery of the one-shot placers: op times, colocation units, and a memory account.

A *unit* is a colocation set (or a single unconstrained op): the thing a placer really places. Units
are identified by their representative op (the first op of the set, see
:func:`postplace.cluster.placement.colocation_representative`).

The memory account (:class:`MemoryAccount`) is what the memory-aware placers use to promise that a
placement fits. It never under-counts the simulator's peak (:mod:`postplace.sim.reference`):

* ``static`` graphs: a device holds the sum of the footprints (``persistent_bytes``) of its ops. This
  is exactly the simulator's figure.
* ``live`` graphs: persistent bytes + every output an op on the device allocates + every tensor the
  device receives from another device, as if nothing were ever freed. The simulator's peak is at most
  this, since it frees tensors but never allocates anything else.
"""

from __future__ import annotations

import numpy as np

from postplace.cluster import Cluster
from postplace.cluster.placement import colocation_representative, effective_kinds
from postplace.cost import CostModel, RooflineCostModel
from postplace.errors import PostplaceError
from postplace.graph import OpGraph


class PlacementError(PostplaceError):
    """A placer could not produce a placement (for example: the graph fits in no device's memory)."""


def op_time_table(
    graph: OpGraph, cluster: Cluster, cost_model: CostModel | None, allowed: np.ndarray | None = None
) -> np.ndarray:
    """``[n_ops, D]`` seconds, inf where an op (or its colocation set) may not use the device."""
    table = np.array((cost_model or RooflineCostModel()).op_times(graph, cluster).table, dtype=np.float64)
    return np.where(allowed_matrix(graph, cluster, allowed), table, np.inf)


def allowed_matrix(graph: OpGraph, cluster: Cluster, allowed: np.ndarray | None = None) -> np.ndarray:
    """``[n_ops, D]`` bool: op i may run on device d, given its colocation set's common kinds.

    ``allowed`` (``[n_ops, D]`` bool, optional): the user's constraints (pins, exclusions) on top of
    the kinds; it is intersected over each colocation set, since a set goes on one device.
    """
    ok = (effective_kinds(graph)[:, None] & cluster.kind_bits[None, :]) != 0
    if allowed is not None:
        allowed = np.asarray(allowed, dtype=bool)
        if allowed.shape != ok.shape:
            raise PostplaceError(f"allowed has shape {allowed.shape}; the graph and cluster need {ok.shape}")
        ok = ok & allowed
        for members in graph.colocation_sets:
            ok[members] = ok[members].all(axis=0)
    return ok


def constrained_devices(devices: list[int], allowed: np.ndarray | None) -> list[int]:
    """``devices`` without those no op may use under ``allowed`` (all of them if that leaves none)."""
    if allowed is None:
        return list(devices)
    kept = [d for d in devices if np.asarray(allowed)[:, d].any()]
    return kept or list(devices)


def units(graph: OpGraph) -> tuple[np.ndarray, list[np.ndarray]]:
    """``(unit_of_op, members)``: units numbered in order of their first op; members sorted."""
    rep = colocation_representative(graph)
    reps, unit_of_op = np.unique(rep, return_inverse=True)  # reps sorted = order of first op
    order = np.argsort(unit_of_op, kind="stable")
    splits = np.flatnonzero(np.diff(unit_of_op[order])) + 1
    members = np.split(order, splits) if graph.num_ops else []
    return unit_of_op.astype(np.int64), members


def devices_of_kind(cluster: Cluster, kind: str) -> list[int]:
    return [d for d, dev in enumerate(cluster.devices) if dev.kind == kind]


def default_devices(graph: OpGraph, cluster: Cluster) -> list[int]:
    """The GPUs where the cluster has any (Baechi places over GPUs), else every device."""
    gpus = devices_of_kind(cluster, "gpu")
    return gpus if gpus else list(range(cluster.num_devices))


def finite_mean(t: np.ndarray, axis: int = 1) -> np.ndarray:
    ok = np.isfinite(t)
    return np.where(ok, t, 0.0).sum(axis=axis) / np.maximum(ok.sum(axis=axis), 1)


def device_preference(times: np.ndarray) -> np.ndarray:
    """Rank of each device (0 = preferred) by total time of the ops every device may run, then by id."""
    common = np.isfinite(times).all(axis=1)
    rows = times[common] if common.any() else np.where(np.isfinite(times), times, 0.0)
    order = np.argsort(rows.sum(axis=0), kind="stable")
    rank = np.empty(times.shape[1], dtype=np.int64)
    rank[order] = np.arange(times.shape[1])
    return rank


def mean_transfer_time(cluster: Cluster, devices: list[int] | None = None):
    """``(latency, seconds per byte)`` averaged over ordered pairs of distinct devices (0, 0 for one)."""
    devs = list(range(cluster.num_devices)) if devices is None else list(devices)
    pairs = [(a, b) for a in devs for b in devs if a != b]
    if not pairs:
        return 0.0, 0.0
    lat = float(np.mean([cluster.latency[a, b] for a, b in pairs]))
    inv_bw = float(np.mean([1.0 / cluster.bandwidth[a, b] for a, b in pairs]))
    return lat, inv_bw


class MemoryAccount:
    """A conservative running account of device memory while a placement is built (module docstring).

    ``cost(u, d, dev)`` is the bytes placing unit ``u`` on device ``d`` adds given the devices ``dev``
    (-1 = not yet placed) of the other ops; in live mode every tensor a member reads from outside the
    unit is counted as received unless its producer is already on ``d``, so later placements never add
    to what was charged. ``used[d]`` is the running total. ``fraction`` < 1 counts only that fraction
    of the live-mode outputs and received tensors: no longer a guarantee, so callers check the result
    with the simulator.
    """

    def __init__(self, graph: OpGraph, cluster: Cluster, members: list[np.ndarray], fraction: float = 1.0):
        self.graph = graph
        self.capacity = cluster.capacity.astype(np.float64)
        self.used = np.zeros(cluster.num_devices)
        self.live = graph.memory_mode == "live"
        self.members = members
        self.fraction = float(fraction)
        own = graph.persistent_bytes.copy()
        if self.live:
            own = own + self.fraction * np.where(graph.inplace, 0.0, graph.output_bytes)
        self.static = np.array([own[m].sum() for m in members]) if members else np.zeros(0)
        self._received: list[set] = [set() for _ in range(cluster.num_devices)]
        self._inputs: list[list[tuple[int, int, float]]] | None = None

    def _unit_inputs(self):
        """Per unit: distinct (src op, slot, bytes) tensors read from ops outside the unit."""
        if self._inputs is None:
            g = self.graph
            inside = np.empty(g.num_ops, dtype=np.int64)
            for u, m in enumerate(self.members):
                inside[m] = u
            ins: list[list[tuple[int, int, float]]] = []
            for u, m in enumerate(self.members):
                seen = {}
                for j in m:
                    for k in range(g.in_ptr[j], g.in_ptr[j + 1]):
                        e = g.in_edges[k]
                        s = int(g.edge_src[e])
                        if inside[s] != u:
                            seen.setdefault((s, int(g.edge_slot[e])), float(g.edge_bytes[e]))
                ins.append([(s, sl, b) for (s, sl), b in seen.items()])
            self._inputs = ins
        return self._inputs

    def cost(self, u: int, d: int, dev: np.ndarray) -> float:
        """Bytes placing unit ``u`` on ``d`` would add (nothing is recorded)."""
        extra = 0.0
        if self.live:
            got = self._received[d]
            for s, sl, b in self._unit_inputs()[u]:
                if dev[s] != d and (s, sl) not in got:
                    extra += b
        return float(self.static[u]) + self.fraction * extra

    def fits(self, u: int, d: int, dev: np.ndarray) -> bool:
        return self.used[d] + self.cost(u, d, dev) <= self.capacity[d]

    def charge(self, u: int, d: int, dev: np.ndarray) -> None:
        self.used[d] += self.cost(u, d, dev)
        if self.live:
            got = self._received[d]
            for s, sl, _ in self._unit_inputs()[u]:
                if dev[s] != d:
                    got.add((s, sl))


def memory_account(graph: OpGraph, cluster: Cluster, dev: np.ndarray) -> np.ndarray:
    """Bytes per device of a complete placement under the conservative account (module docstring).

    Never below the simulator's peak; equal to it for ``static`` graphs.

    Parameters
    ----------
    graph : OpGraph
    cluster : Cluster
    dev : numpy.ndarray
        ``int[n_ops]``: a device id per op.

    Returns
    -------
    numpy.ndarray
        ``float64[D]``: every op's persistent bytes on its device, and in ``live`` memory mode also
        every output allocated there and every tensor received there (once per device).

    Examples
    --------
    >>> from postplace.graph import OpGraph
    >>> from postplace.placers import memory_account
    >>> from postplace.testing import star_cluster
    >>> g = OpGraph.build(["a", "b"], [(0, 1, 8.0)], output_bytes=[8.0, 4.0], persistent_bytes=[100.0, 0.0])
    >>> memory_account(g, star_cluster(("gpu", "gpu")), [0, 1]).tolist()
    [108.0, 12.0]
    """
    dev = np.asarray(dev, dtype=np.int64)
    used = np.bincount(dev, weights=graph.persistent_bytes, minlength=cluster.num_devices).astype(np.float64)
    if graph.memory_mode == "live":
        out = np.where(graph.inplace, 0.0, graph.output_bytes)
        used += np.bincount(dev, weights=out, minlength=cluster.num_devices)
        received = {}
        for e in range(graph.num_edges):
            s, t = int(graph.edge_src[e]), int(graph.edge_dst[e])
            if dev[s] != dev[t]:
                received[(s, int(graph.edge_slot[e]), int(dev[t]))] = float(graph.edge_bytes[e])
        for (_, _, d), b in received.items():
            used[d] += b
    return used


def check_graph(graph: OpGraph, cluster: Cluster, who: str, allowed: np.ndarray | None = None) -> None:
    """Errors a user can cause before any placer runs: an op no device of the cluster may run."""
    ok = allowed_matrix(graph, cluster, allowed).any(axis=1)
    bad = np.flatnonzero(~ok)
    if bad.size:
        why = "its allowed kinds, pins and exclusions" if allowed is not None else "its allowed kinds"
        raise PlacementError(
            f"{who}: op '{graph.names[bad[0]]}' may run on no device of cluster '{cluster.name}' "
            f"(check {why} and the cluster's device kinds)"
        )


def force_cpu_only(graph: OpGraph, cluster: Cluster, dev: np.ndarray, allowed: np.ndarray | None = None) -> np.ndarray:
    """Move every op whose colocation set may not use its device to the first device it may use."""
    allowed = allowed_matrix(graph, cluster, allowed)
    dev = np.asarray(dev, dtype=np.int64).copy()
    bad = ~allowed[np.arange(graph.num_ops), dev]
    for i in np.flatnonzero(bad):
        dev[i] = int(np.flatnonzero(allowed[i])[0])
    return dev
