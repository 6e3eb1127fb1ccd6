"""HEFT: Heterogeneous Earliest Finish Time list scheduling (Topcuoglu, Hariri, Wu, 2002).

Scope and caveats: HEFT ignores memory (a placement it returns may be OOM); it models a transfer as
``latency + bytes / bandwidth`` of the route, paid per edge, without link contention. The schedule it
builds is only used to choose devices; the simulator then runs its own (non-insertion) schedule.
"""

from __future__ import annotations

import bisect
import heapq

import numpy as np

from postplace.cluster import Cluster
from postplace.cluster.placement import colocation_representative
from postplace.cost import CostModel
from postplace.graph import OpGraph
from postplace.placers._common import (
    check_graph,
    device_preference,
    finite_mean,
    mean_transfer_time,
    op_time_table,
)
from postplace.placers.registry import register_placer

__all__ = ["heft_schedule", "place_heft", "upward_rank"]


def upward_rank(graph: OpGraph, times: np.ndarray, cluster: Cluster) -> np.ndarray:
    """``rank_u(i) = mean_time(i) + max over successors j of (mean_comm(i, j) + rank_u(j))``.

    Mean op time over the devices the op may use; mean communication over ordered pairs of distinct
    devices (``mean latency + bytes * mean(1 / bandwidth)``).
    """
    w = finite_mean(times)
    lat, inv_bw = mean_transfer_time(cluster)
    rank = np.zeros(graph.num_ops)
    for i in range(graph.num_ops - 1, -1, -1):
        best = 0.0
        for e in range(graph.out_ptr[i], graph.out_ptr[i + 1]):
            j = graph.edge_dst[e]
            best = max(best, lat + graph.edge_bytes[e] * inv_bw + rank[j])
        rank[i] = w[i] + best
    return rank


def heft_schedule(
    graph: OpGraph, cluster: Cluster, *, cost_model: CostModel | None = None, allowed: np.ndarray | None = None
):
    """HEFT's own schedule: ``(device, start, finish)`` arrays over ops (see :func:`place_heft`)."""
    check_graph(graph, cluster, "heft", allowed)
    times = op_time_table(graph, cluster, cost_model, allowed)
    n, D = times.shape
    rank = upward_rank(graph, times, cluster)
    rep = colocation_representative(graph)
    dev = np.full(n, -1, dtype=np.int64)
    set_dev = np.full(n, -1, dtype=np.int64)  # indexed by the colocation representative
    set_ok = np.ones((n, D), dtype=bool)  # devices every member of the set may use
    np.logical_and.at(set_ok, rep, np.isfinite(times))
    start = np.zeros(n)
    finish = np.zeros(n)
    slots: list[list[tuple[float, float]]] = [[] for _ in range(D)]  # busy intervals, sorted
    # EFT ties (zero-time ops) go to the device that runs the whole graph fastest, then the lower id
    preference = device_preference(times)
    pending = np.diff(graph.in_ptr).copy()
    ready = [(-rank[i], i) for i in range(n) if pending[i] == 0]
    heapq.heapify(ready)
    while ready:
        _, i = heapq.heappop(ready)
        forced = set_dev[rep[i]]  # the device of any member of i's colocation set placed already
        cands = [forced] if forced >= 0 else [d for d in range(D) if set_ok[rep[i], d]]
        best = None
        for d in cands:
            avail = 0.0
            for k in range(graph.in_ptr[i], graph.in_ptr[i + 1]):
                e = graph.in_edges[k]
                p = graph.edge_src[e]
                comm = 0.0 if dev[p] == d else cluster.transfer_time(graph.edge_bytes[e], int(dev[p]), d)
                avail = max(avail, finish[p] + comm)
            s = _insertion_start(slots[d], avail, times[i, d])
            f = s + times[i, d]
            if best is None or (f, preference[d]) < best[0]:
                best = ((f, preference[d]), s, d)
        (f, _), s, d = best
        dev[i], start[i], finish[i] = d, s, f
        set_dev[rep[i]] = d
        bisect.insort(slots[d], (s, f))
        for e in range(graph.out_ptr[i], graph.out_ptr[i + 1]):
            j = graph.edge_dst[e]
            pending[j] -= 1
            if pending[j] == 0:
                heapq.heappush(ready, (-rank[j], j))
    return dev, start, finish


def _insertion_start(slots: list[tuple[float, float]], ready: float, dur: float) -> float:
    """Earliest start >= ready of a gap of length dur between the busy intervals (or after the last).

    The intervals are disjoint and sorted, so the search starts at the last one starting before ``ready``.
    """
    k = max(bisect.bisect_right(slots, (ready, np.inf)) - 1, 0)
    prev_end = slots[k - 1][1] if k > 0 else 0.0
    for j in range(k, len(slots)):
        s, f = slots[j]
        if max(prev_end, ready) + dur <= s:
            return max(prev_end, ready)
        prev_end = max(prev_end, f)
    return max(prev_end, ready)


@register_placer("heft", heuristic=True, rank=90)
def place_heft(
    graph: OpGraph,
    cluster: Cluster,
    *,
    cost_model: CostModel | None = None,
    seed: int = 0,
    allowed: np.ndarray | None = None,
) -> np.ndarray:
    """Place ops by HEFT: upward-rank priorities, insertion-based earliest-finish-time device choice.

    Ops are taken from a ready list by decreasing upward rank (mean op times and mean communication
    times; ties to the lower op index), which is a topological order even where ranks tie. Each op goes
    to the device on which it finishes first (ties, as for zero-time ops: the device that runs the
    whole graph fastest, then the lower id), allowing it into an idle gap between ops already there
    (insertion policy). An op whose colocation set is already placed goes to that set's device.

    Parameters
    ----------
    graph, cluster : OpGraph, Cluster
    cost_model : CostModel, optional
        Default :class:`postplace.cost.RooflineCostModel`.
    seed : int
        Unused (deterministic).
    allowed : numpy.ndarray, optional
        ``[n_ops, D]`` bool: the user's constraints (pins, exclusions); an op only goes where allowed.

    Returns
    -------
    numpy.ndarray
        int64 device id per op.

    References
    ----------
    H. Topcuoglu, S. Hariri, M.-Y. Wu, "Performance-Effective and Low-Complexity Task Scheduling for
    Heterogeneous Computing", IEEE TPDS 13(3), 2002.

    Examples
    --------
    >>> from postplace.graph import OpGraph
    >>> from postplace.testing import TableCostModel, star_cluster
    >>> g = OpGraph.build(["a", "b", "c", "d"], [(0, 1, 1.0), (0, 2, 1.0), (1, 3, 1.0), (2, 3, 1.0)])
    >>> place_heft(g, star_cluster(("gpu", "gpu")), cost_model=TableCostModel([[1, 1], [4, 4], [4, 4], [1, 1]]))
    array([0, 0, 1, 1])
    """
    return heft_schedule(graph, cluster, cost_model=cost_model, allowed=allowed)[0]
