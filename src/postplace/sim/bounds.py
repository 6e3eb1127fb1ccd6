"""Bounds on the step time of any placement of a graph on a cluster.

``lower_bound`` is the larger of two bounds every schedule obeys:

* the critical path with every op on its fastest allowed device and free communication (collectives
  are communication: their member ops cost nothing);
* the total work spread ideally: the optimum of the fractional relaxation in which each op's work may
  be split over the devices it may use (``x[i, d]`` of op i on device d, costing ``x * time[i, d]``)
  and every device's share must fit in the makespan. Solved as a linear program with scipy's HiGHS;
  for very large graphs, where the LP would be slow, the weaker ``sum of fastest times / D`` is used.

``failure_step_time`` is strictly above the step time of any feasible placement (every op on its
slowest allowed device, one after another, plus every edge's transfer over the slowest route and every
collective at its worst, one after another): the score a search gives an OOM or failed placement so it
ranks below every feasible one.
"""

from __future__ import annotations

import numpy as np
from scipy.optimize import linprog
from scipy.sparse import coo_matrix

from postplace.sim.problem import SimProblem

LP_MAX_VARIABLES = 400_000


def _compute_time(p: SimProblem) -> np.ndarray:
    """``op_time`` with collective members at 0 where they may run: they are communication, not compute."""
    if not p.num_collectives:
        return p.op_time
    t = p.op_time.copy()
    members = p.coll_of >= 0
    t[members] = np.where(np.isfinite(t[members]), 0.0, t[members])
    return t


def critical_path(p: SimProblem) -> float:
    fastest = _compute_time(p).min(axis=1)
    finish = np.zeros(p.num_ops)
    g = p.graph
    for i in range(p.num_ops):
        start = 0.0
        for k in range(g.in_ptr[i], g.in_ptr[i + 1]):
            start = max(start, finish[g.edge_src[g.in_edges[k]]])
        finish[i] = start + fastest[i]
    return float(finish.max()) if p.num_ops else 0.0


def work_bound(p: SimProblem) -> float:
    t = _compute_time(p)
    n, D = t.shape
    simple = float(t.min(axis=1).sum() / D)
    ok = np.isfinite(t)
    nvar = int(ok.sum())
    if D == 1 or n == 0 or nvar > LP_MAX_VARIABLES:
        return simple
    # Devices with the same times for every op (a node's GPUs) are one kind holding `count` of them: the LP
    # over kinds, each kind's load at most count x T, has the same optimum (split a kind's share of an op
    # evenly over its devices; sum the devices' shares back), with D / kinds times fewer variables.
    _, first, kind = np.unique(np.where(ok, t, -1.0).T, axis=0, return_index=True, return_inverse=True)
    count = np.bincount(kind.ravel()).astype(float)
    t, ok, K = t[:, first], ok[:, first], len(first)
    ops, kinds = np.nonzero(ok)
    times = t[ops, kinds]
    nvar = len(ops)
    # variables: x (one per allowed (op, kind)), then T. minimise T.
    c = np.zeros(nvar + 1)
    c[-1] = 1.0
    eq = coo_matrix((np.ones(nvar), (ops, np.arange(nvar))), shape=(n, nvar + 1))
    ub_rows = np.concatenate([kinds, np.arange(K)])
    ub_cols = np.concatenate([np.arange(nvar), np.full(K, nvar)])
    ub_vals = np.concatenate([times, -count])
    ub = coo_matrix((ub_vals, (ub_rows, ub_cols)), shape=(K, nvar + 1))
    res = linprog(
        c, A_ub=ub.tocsr(), b_ub=np.zeros(K), A_eq=eq.tocsr(), b_eq=np.ones(n), bounds=(0, None), method="highs"
    )
    if res.status != 0:
        return simple
    # HiGHS is exact only to its tolerances; shave a hair so the bound stays a bound.
    return max(simple, float(res.fun) * (1 - 1e-7))


def lower_bound(p: SimProblem) -> float:
    """Seconds no placement's step can beat: the larger of the critical path and the work bound.

    See the module docstring for the two bounds.

    Parameters
    ----------
    p : SimProblem
        The graph, cluster and op times (:meth:`SimProblem.build`, or a Simulator's ``problem``).

    Returns
    -------
    float

    Examples
    --------
    >>> from postplace.cluster import load_cluster
    >>> from postplace.graph import OpGraph
    >>> from postplace.sim import SimProblem, lower_bound
    >>> g = OpGraph.build(["a", "b"], flops=[2.8e9, 2.8e9], allowed_kinds=["gpu", "gpu"])
    >>> round(lower_bound(SimProblem.build(g, load_cluster("k80x2"))), 6)  # 1 ms + 10 us each, one per GPU
    0.00101
    """
    return max(critical_path(p), work_bound(p))


def failure_step_time(p: SimProblem) -> float:
    """A score strictly above the step time of any feasible placement, for OOM and failed ones.

    Twice the sum of every op's time on its slowest allowed device, every edge's transfer at the
    largest latency and lowest bandwidth of any route, and every collective at its worst, plus one
    second. A collective of k members on S bytes takes at most ``2 k`` steps (hierarchical phases
    included), each at most the largest route latency, and sends at most ``3 S`` bytes along any one
    rank's ring path, over link directions that at most k pairs share: so at most
    ``2 k * latency + 3 S k / (the cluster's slowest link)``.

    Parameters
    ----------
    p : SimProblem

    Returns
    -------
    float
    """
    t = p.op_time
    slowest = np.where(np.isfinite(t), t, -np.inf).max(axis=1)
    off = ~np.eye(p.num_devices, dtype=bool)
    if off.any():
        worst_lat = float(p.latency[off].max())
        min_bw = float(p.bandwidth[off].min())
        comm = float(np.sum(worst_lat + p.edge_bytes / min_bw))
        slowest_link = min(link.bandwidth for link in p.cluster.links)
        for c, coll in enumerate(p.graph.collectives):
            k = len(p.collective_members(c))
            comm += 2 * k * worst_lat + 3 * coll.nbytes * k / slowest_link
    else:
        comm = 0.0
    return float(slowest.sum() + comm) * 2.0 + 1.0
