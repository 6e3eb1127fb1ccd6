"""Baechi's memory-aware placers: m-TOPO, m-ETF and m-SCT (Jeon et al., SoCC 2020).

All three place colocation sets as units and keep a memory account
(:class:`postplace.placers._common.MemoryAccount`): a unit goes on a device only if the account says
it fits. For ``static`` graphs the account is the simulator's own figure. For ``live`` graphs the
guaranteed account (persistent bytes + every output and received tensor, as if nothing were freed) is
far above the real peak on long graphs, so by default (``memory="checked"``) they first place with
only a fraction (0, 1/4, 1/2) of the outputs and received tensors counted, run the simulator on each
result and return the first that is not OOM, and fall back to the guaranteed account
(``memory="conservative"`` uses only that one). Either way every placement they return is feasible in
the simulator (never OOM); when a unit fits on no device under the guaranteed account they raise
:class:`PlacementError`.

As in Baechi, they place over the GPUs (``devices`` changes that); ops that may not run on any of them
(CPU-only ops) go to a device of a kind they may use. Transfers are modelled as ``latency + bytes /
bandwidth`` of the route, per edge, without link contention; each scheduler's internal schedule only
chooses devices, and the simulator then times the placement.
"""

from __future__ import annotations

import numpy as np
from scipy.optimize import linprog
from scipy.sparse import coo_matrix

from postplace.cluster import Cluster
from postplace.cost import CostModel
from postplace.graph import OpGraph
from postplace.placers._common import (
    MemoryAccount,
    PlacementError,
    check_graph,
    constrained_devices,
    default_devices,
    finite_mean,
    mean_transfer_time,
    op_time_table,
    units,
)
from postplace.placers.registry import register_placer

__all__ = ["list_schedule", "place_m_etf", "place_m_sct", "place_m_topo", "sct_favorites"]

LIVE_FRACTIONS = (0.0, 0.25, 0.5)  # tried in order (then 1.0, the guarantee) under memory="checked"


def _memory_checked(run, graph: OpGraph, cluster: Cluster, cost_model, memory: str) -> np.ndarray:
    """``run(fraction)`` under the account policy of the module docstring; the result is never OOM."""
    if memory not in ("checked", "conservative"):
        raise PlacementError(f"memory must be 'checked' or 'conservative', not {memory!r}")
    if graph.memory_mode == "live" and memory == "checked":
        from postplace.sim import Simulator

        sim = None
        for f in LIVE_FRACTIONS:
            try:
                dev = run(f)
            except PlacementError:
                continue
            sim = sim or Simulator(graph, cluster, cost_model=cost_model)
            if sim.evaluate(dev[None]).feasible[0]:
                return dev
    return run(1.0)


def _candidates(times: np.ndarray, devices: list[int]) -> np.ndarray:
    """``[n, D]`` bool: op may go on d: among ``devices`` where allowed, else any allowed device."""
    allowed = np.isfinite(times)
    among = np.zeros_like(allowed)
    among[:, devices] = allowed[:, devices]
    none = ~among.any(axis=1)
    among[none] = allowed[none]
    return among


def _resolve_devices(graph: OpGraph, cluster: Cluster, devices, allowed=None) -> list[int]:
    if devices is None:
        return constrained_devices(default_devices(graph, cluster), allowed)
    return [cluster.device_index(d) if isinstance(d, str) else int(d) for d in devices]


def _no_room(who: str, graph: OpGraph, cluster: Cluster, members, u: int, acct: MemoryAccount) -> PlacementError:
    free = ", ".join(
        f"{cluster.device_names[d]} {max(acct.capacity[d] - acct.used[d], 0) / 1e9:.3g} GB"
        for d in range(cluster.num_devices)
    )
    return PlacementError(
        f"{who}: op '{graph.names[members[u][0]]}' (with its colocation set, {acct.static[u] / 1e9:.3g} GB) fits on "
        f"no device of cluster '{cluster.name}' (free: {free}); the graph does not fit in the cluster's memory"
    )


# ------------------------------------------------------------------------------------------ m-TOPO
@register_placer("m-topo", candidate=True, heuristic=True, rank=30)
def place_m_topo(
    graph: OpGraph,
    cluster: Cluster,
    *,
    cost_model: CostModel | None = None,
    seed: int = 0,
    devices: list | None = None,
    memory: str = "checked",
    allowed: np.ndarray | None = None,
) -> np.ndarray:
    """m-TOPO: fill the devices one after another in topological order, each up to an equal share of memory.

    Units (colocation sets) are taken in program order (a topological order of the ops; a unit comes
    at its first op). The current device takes the next unit while its memory account stays within
    ``min(capacity, total / k)`` (``total`` = the units' memory, ``k`` = the number of devices);
    otherwise the next device becomes current. The last device takes the rest up to its capacity; a
    unit that fits nowhere in that order goes to the first device with room.

    Parameters
    ----------
    graph, cluster : OpGraph, Cluster
    cost_model : CostModel, optional
        Only used to know which devices each op may use.
    seed : int
        Unused (deterministic).
    devices : list of str or int, optional
        Devices to fill, in order (default: the GPUs, else every device).
    memory : {"checked", "conservative"}
        The memory account policy for live graphs (module docstring).
    allowed : numpy.ndarray, optional
        ``[n_ops, D]`` bool: the user's constraints (pins, exclusions); an op only goes where allowed.

    Returns
    -------
    numpy.ndarray
        int64 device id per op; never OOM in the simulator.

    Raises
    ------
    PlacementError
        When some unit fits on no device.

    References
    ----------
    B. Jeon, L. Cai, P. Srivastava, J. Jiang, X. Ke, Y. Meng, C. Xie, I. Gupta, "Baechi: Fast Device
    Placement of Machine Learning Graphs", ACM SoCC 2020 (m-TOPO).

    Examples
    --------
    >>> from postplace.graph import OpGraph
    >>> from postplace.testing import star_cluster
    >>> g = OpGraph.build(list("abcd"), [(0, 1), (1, 2), (2, 3)], persistent_bytes=[1, 1, 1, 1],
    ...                   memory_mode="static")
    >>> place_m_topo(g, star_cluster(("gpu", "gpu"), memory=3)).tolist()
    [0, 0, 1, 1]
    """
    check_graph(graph, cluster, "m-topo", allowed)
    return _memory_checked(
        lambda f: _m_topo(graph, cluster, cost_model, devices, f, allowed), graph, cluster, cost_model, memory
    )


def _m_topo(graph: OpGraph, cluster: Cluster, cost_model, devices, fraction: float, allowed=None) -> np.ndarray:
    times = op_time_table(graph, cluster, cost_model, allowed)
    devs = _resolve_devices(graph, cluster, devices, allowed)
    cand = _candidates(times, devs)
    unit_of_op, members = units(graph)
    acct = MemoryAccount(graph, cluster, members, fraction)
    dev = np.full(graph.num_ops, -1, dtype=np.int64)
    share = float(acct.static.sum()) / max(len(devs), 1)
    cur = 0
    for u, m in enumerate(members):
        ok = cand[m[0]]
        chosen = -1
        d = devs[cur]
        while (
            cur < len(devs) - 1
            and ok[d]
            and acct.used[d] > 0
            and (acct.used[d] + acct.cost(u, d, dev) > min(acct.capacity[d], share))
        ):
            cur += 1
            d = devs[cur]
        if ok[d] and acct.fits(u, d, dev):
            chosen = d
        if chosen < 0:
            chosen = next((d for d in [*devs, *range(cluster.num_devices)] if ok[d] and acct.fits(u, d, dev)), -1)
        if chosen < 0:
            raise _no_room("m-topo", graph, cluster, members, u, acct)
        acct.charge(u, chosen, dev)
        dev[m] = chosen
    return dev


# ------------------------------------------------------------------------------------------ m-ETF / m-SCT
def _static_level(graph: OpGraph, w: np.ndarray) -> np.ndarray:
    """Longest path of op times from each op to an exit, communication ignored (ETF's tie-breaker)."""
    level = np.zeros(graph.num_ops)
    for i in range(graph.num_ops - 1, -1, -1):
        succ = graph.edge_dst[graph.out_ptr[i] : graph.out_ptr[i + 1]]
        level[i] = w[i] + (level[succ].max() if succ.size else 0.0)
    return level


def list_schedule(
    graph: OpGraph,
    cluster: Cluster,
    *,
    cost_model: CostModel | None = None,
    devices: list | None = None,
    favorites: np.ndarray | None = None,
    who: str = "m-etf",
    memory_fraction: float = 1.0,
    allowed: np.ndarray | None = None,
):
    """The memory-aware ETF list scheduler behind m-ETF and m-SCT: ``(device, start, finish)`` over ops.

    At each step, among the ready ops (all predecessors scheduled) and the devices the op may use and
    its unit fits on, the pair with the earliest start time is scheduled (start = max(device free,
    data ready), data ready = max over in-edges of the producer's finish + its transfer time when on
    another device); ties go to the op with the larger static level, then the lower op index, then the
    earlier finish, then the lower device id. An op whose colocation set is already placed may only
    go to that device. With ``favorites`` (int per op: its favourite child, -1 none; see
    :func:`sct_favorites`), a ready favourite child whose favourite parent is the last op scheduled on
    its device goes first, to that device (Hanen and Munier's SCT rule), if it fits.
    ``memory_fraction`` < 1 relaxes the live-mode account (no guarantee: see the module docstring).
    """
    check_graph(graph, cluster, who, allowed)
    times = op_time_table(graph, cluster, cost_model, allowed)
    n, D = times.shape
    devs = _resolve_devices(graph, cluster, devices, allowed)
    cand = _candidates(times, devs)
    unit_of_op, members = units(graph)
    acct = MemoryAccount(graph, cluster, members, memory_fraction)
    level = _static_level(graph, finite_mean(np.where(cand, times, np.inf)))
    fav_parent = np.full(n, -1, dtype=np.int64)
    if favorites is not None:
        for i, j in enumerate(favorites):
            if j >= 0:
                fav_parent[j] = i
    dev = np.full(n, -1, dtype=np.int64)
    unit_dev = np.full(len(members), -1, dtype=np.int64)
    start = np.zeros(n)
    finish = np.zeros(n)
    dev_free = np.zeros(D)
    last = np.full(D, -1, dtype=np.int64)
    data_ready = np.zeros((n, D))
    pending = np.diff(graph.in_ptr).copy()
    ready = [i for i in range(n) if pending[i] == 0]
    while ready:
        r = np.array(ready, dtype=np.int64)
        ur = unit_of_op[r]
        placed = unit_dev[ur]
        allow = cand[r].copy()
        fixed = np.flatnonzero(placed >= 0)
        allow[fixed] = False
        allow[fixed, placed[fixed]] = True
        est = np.where(allow, np.maximum(dev_free[None, :], data_ready[r]), np.inf)

        def fits(k: int, d: int, ur=ur) -> bool:
            return unit_dev[ur[k]] >= 0 or acct.fits(int(ur[k]), d, dev)

        pick = None
        if favorites is not None:
            best = None
            for k, i in enumerate(r):
                p = fav_parent[i]
                if p >= 0 and dev[p] >= 0 and last[dev[p]] == p and allow[k, dev[p]] and fits(k, int(dev[p])):
                    key = (est[k, dev[p]], i)
                    if best is None or key < best[0]:
                        best = (key, k, int(dev[p]))
            if best is not None:
                pick = best[1:]
        if pick is None:
            fin = est + np.where(np.isfinite(times[r]), times[r], np.inf)
            kk, dd = np.meshgrid(np.arange(len(r)), np.arange(D), indexing="ij")
            order = np.lexsort((dd.ravel(), fin.ravel(), r[kk].ravel(), -level[r][kk].ravel(), est.ravel()))
            for flat in order:  # best pair first; the memory check only where needed
                k, d = divmod(int(flat), D)
                if not np.isfinite(est[k, d]):
                    break
                if fits(k, d):
                    pick = (k, d)
                    break
        if pick is None:
            u = next(int(x) for x in ur if unit_dev[x] < 0)
            raise _no_room(who, graph, cluster, members, u, acct)
        k, d = pick
        i = int(r[k])
        u = unit_of_op[i]
        if unit_dev[u] < 0:
            acct.charge(u, d, dev)
            unit_dev[u] = d
        dev[i] = d
        start[i] = max(dev_free[d], data_ready[i, d])
        finish[i] = start[i] + times[i, d]
        dev_free[d] = finish[i]
        last[d] = i
        ready.remove(i)
        for e in range(graph.out_ptr[i], graph.out_ptr[i + 1]):
            j = graph.edge_dst[e]
            arrive = np.full(D, finish[i])
            nbytes = graph.edge_bytes[e]
            for b in range(D):
                if b != d:
                    arrive[b] += cluster.transfer_time(nbytes, d, b)
            data_ready[j] = np.maximum(data_ready[j], arrive)
            pending[j] -= 1
            if pending[j] == 0:
                ready.append(int(j))
    return dev, start, finish


@register_placer("m-etf", candidate=True, heuristic=True, quadratic=True, rank=40)
def place_m_etf(
    graph: OpGraph,
    cluster: Cluster,
    *,
    cost_model: CostModel | None = None,
    seed: int = 0,
    devices: list | None = None,
    memory: str = "checked",
    allowed: np.ndarray | None = None,
) -> np.ndarray:
    """m-ETF: Earliest Task First list scheduling that only puts an op where its memory fits.

    See :func:`list_schedule` for the exact rule and tie-breaks.

    Parameters
    ----------
    graph, cluster : OpGraph, Cluster
    cost_model : CostModel, optional
        Default :class:`postplace.cost.RooflineCostModel`.
    seed : int
        Unused (deterministic).
    devices : list of str or int, optional
        Devices to schedule on (default: the GPUs, else every device).
    memory : {"checked", "conservative"}
        The memory account policy for live graphs (module docstring).
    allowed : numpy.ndarray, optional
        ``[n_ops, D]`` bool: the user's constraints (pins, exclusions); an op only goes where allowed.

    Returns
    -------
    numpy.ndarray
        int64 device id per op; never OOM in the simulator.

    Raises
    ------
    PlacementError
        When some unit fits on no device.

    References
    ----------
    J.-J. Hwang, Y.-C. Chow, F. D. Anger, C.-Y. Lee, "Scheduling Precedence Graphs in Systems with
    Interprocessor Communication Times", SIAM J. Computing 18(2), 1989 (ETF); Jeon et al., "Baechi",
    SoCC 2020 (m-ETF).

    Examples
    --------
    >>> from postplace.graph import OpGraph
    >>> from postplace.testing import TableCostModel, star_cluster
    >>> g = OpGraph.build(["a", "b", "c"], [(0, 1, 1.0), (0, 2, 1.0)])
    >>> place_m_etf(g, star_cluster(("gpu", "gpu")), cost_model=TableCostModel([[1, 1], [3, 3], [3, 3]])).tolist()
    [0, 0, 1]
    """
    check_graph(graph, cluster, "m-etf", allowed)

    def run(f):
        return list_schedule(
            graph, cluster, cost_model=cost_model, devices=devices, who="m-etf", memory_fraction=f, allowed=allowed
        )[0]

    return _memory_checked(run, graph, cluster, cost_model, memory)


def sct_favorites(
    graph: OpGraph,
    cluster: Cluster,
    *,
    cost_model: CostModel | None = None,
    devices: list | None = None,
    allowed: np.ndarray | None = None,
) -> np.ndarray:
    """Favourite child per op (-1: none) from the LP relaxation of SCT (Hanen and Munier, 1995).

    Variables: start ``t_i`` per op, ``x_ij`` in [0, 1] per producer-consumer pair (0: j runs right
    after i on i's device, no transfer), makespan ``w``. Constraints: ``t_j >= t_i + p_i + c_ij x_ij``;
    at most one favourite child per op (``sum_j x_ij >= outdeg(i) - 1``) and one favourite parent
    (``sum_i x_ij >= indeg(j) - 1``); ``t_i + p_i <= w``. Minimise ``w`` (plus a 1e-4-weighted
    ``sum c_ij x_ij`` so that slack pairs are not communicated for nothing). ``p_i`` = mean time of op i
    over the devices; ``c_ij`` = mean transfer time of the pair's bytes. ``x_ij < 0.5`` rounds to a
    favourite. Solved with scipy's HiGHS (``linprog(method="highs")``).
    """
    times = op_time_table(graph, cluster, cost_model, allowed)
    devs = _resolve_devices(graph, cluster, devices, allowed)
    cand = _candidates(times, devs)
    p = finite_mean(np.where(cand, times, np.inf))
    lat, inv_bw = mean_transfer_time(cluster, devs)
    n = graph.num_ops
    pairs: dict[tuple[int, int], float] = {}
    for e in range(graph.num_edges):
        key = (int(graph.edge_src[e]), int(graph.edge_dst[e]))
        pairs[key] = pairs.get(key, 0.0) + float(graph.edge_bytes[e])
    fav = np.full(n, -1, dtype=np.int64)
    if not pairs:
        return fav
    src = np.array([k[0] for k in pairs])
    dst = np.array([k[1] for k in pairs])
    c = lat + np.array(list(pairs.values())) * inv_bw
    m = len(src)
    nv = n + m + 1  # t (n), x (m), w
    W = nv - 1
    rows, cols, vals, rhs = [], [], [], []
    r = 0
    ar = np.arange(m)
    # precedence: t_i - t_j + c x <= -p_i
    rows += [r + ar, r + ar, r + ar]
    cols += [src, dst, n + ar]
    vals += [np.ones(m), -np.ones(m), c]
    rhs.append(-p[src])
    r += m
    for group in (src, dst):  # one favourite child per op, one favourite parent per op
        deg = np.bincount(group, minlength=n)
        multi = np.flatnonzero(deg >= 2)
        row_of = np.full(n, -1)
        row_of[multi] = r + np.arange(len(multi))
        sel = deg[group] >= 2
        rows.append(row_of[group[sel]])
        cols.append(n + ar[sel])
        vals.append(-np.ones(int(sel.sum())))
        rhs.append(-(deg[multi] - 1.0))
        r += len(multi)
    # makespan: t_i - w <= -p_i
    rows += [r + np.arange(n), r + np.arange(n)]
    cols += [np.arange(n), np.full(n, W)]
    vals += [np.ones(n), -np.ones(n)]
    rhs.append(-p)
    r += n
    A = coo_matrix((np.concatenate(vals), (np.concatenate(rows), np.concatenate(cols))), shape=(r, nv)).tocsr()
    obj = np.zeros(nv)
    obj[W] = 1.0
    obj[n : n + m] = 1e-4 * c / max(m, 1)
    bounds = [(0, None)] * n + [(0, 1)] * m + [(0, None)]
    res = linprog(obj, A_ub=A, b_ub=np.concatenate(rhs), bounds=bounds, method="highs")
    if res.status != 0:
        raise PlacementError(f"m-sct: the LP relaxation could not be solved ({res.message})")
    x = res.x[n : n + m]
    for k in np.flatnonzero(x < 0.5):
        fav[src[k]] = dst[k]
    return fav


@register_placer("m-sct", candidate=True, heuristic=True, quadratic=True, rank=50)
def place_m_sct(
    graph: OpGraph,
    cluster: Cluster,
    *,
    cost_model: CostModel | None = None,
    seed: int = 0,
    devices: list | None = None,
    memory: str = "checked",
    allowed: np.ndarray | None = None,
) -> np.ndarray:
    """m-SCT: ETF list scheduling that runs each op's LP-chosen favourite child right after it, where memory fits.

    The favourite children come from the LP relaxation of :func:`sct_favorites`; the scheduler is
    :func:`list_schedule` with the favourite-child rule.

    Parameters
    ----------
    graph, cluster : OpGraph, Cluster
    cost_model : CostModel, optional
        Default :class:`postplace.cost.RooflineCostModel`.
    seed : int
        Unused (deterministic).
    devices : list of str or int, optional
        Devices to schedule on (default: the GPUs, else every device).
    memory : {"checked", "conservative"}
        The memory account policy for live graphs (module docstring).
    allowed : numpy.ndarray, optional
        ``[n_ops, D]`` bool: the user's constraints (pins, exclusions); an op only goes where allowed.

    Returns
    -------
    numpy.ndarray
        int64 device id per op; never OOM in the simulator.

    Raises
    ------
    PlacementError
        When some unit fits on no device, or the LP fails.

    References
    ----------
    C. Hanen, A. Munier, "An approximation algorithm for scheduling dependent tasks on m processors with
    small communication delays", ETFA 1995 (SCT); Jeon et al., "Baechi", SoCC 2020 (m-SCT).

    Examples
    --------
    >>> from postplace.graph import OpGraph
    >>> from postplace.testing import TableCostModel, star_cluster
    >>> g = OpGraph.build(["a", "b", "c"], [(0, 1, 5.0), (1, 2, 5.0)])
    >>> place_m_sct(g, star_cluster(("gpu", "gpu")), cost_model=TableCostModel([[1, 1], [1, 1], [1, 1]])).tolist()
    [0, 0, 0]
    """
    check_graph(graph, cluster, "m-sct", allowed)
    fav = sct_favorites(graph, cluster, cost_model=cost_model, devices=devices, allowed=allowed)

    def run(f):
        return list_schedule(
            graph,
            cluster,
            cost_model=cost_model,
            devices=devices,
            favorites=fav,
            who="m-sct",
            memory_fraction=f,
            allowed=allowed,
        )[0]

    return _memory_checked(run, graph, cluster, cost_model, memory)
