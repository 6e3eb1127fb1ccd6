"""How long a collective takes on a set of devices, and what it holds: the algorithms NCCL runs.

:func:`collective_cost` prices one collective (all-reduce, reduce-scatter, all-gather, broadcast) of a
buffer of S bytes over k member devices given in rank order. The model:

* **Ring** (NCCL's algorithm within a node, over NVLink/NVSwitch or PCIe): rank i sends to rank
  ``(i + 1) % k``; each such pair's transfer takes the route a transfer between the two devices takes
  (:attr:`postplace.cluster.Cluster.route_resources`). Every link direction r is shared by the c_r pairs
  of all rings running at the same time that cross it, so a pair's effective bandwidth is the minimum
  over its link directions of ``bandwidth_r / c_r``, and one step of a pair takes
  ``latency(a, b) + chunk / effective bandwidth``. All pairs step in lockstep, so a step takes the
  slowest pair's time. An all-reduce is a reduce-scatter then an all-gather: ``2 (k - 1)`` steps of
  chunk S/k; a reduce-scatter or an all-gather ``k - 1`` steps of S/k; a broadcast is a pipelined
  chain from rank 0 (the ring without its last pair): ``(k - 1) * max latency + S / min effective
  bandwidth``. On uniform links an all-reduce is ``2 (k - 1) latency + 2 (k - 1) / k * S / bw`` (bus
  bytes ``2 (k - 1) / k * S``), a reduce-scatter or all-gather ``(k - 1) latency + (k - 1) / k * S / bw``.
* **Hierarchical** (NCCL across nodes): the members split into islands, the connected components of
  the graph joining two members whose route bandwidth (the smaller of the two directions) is strictly
  above the smallest such bandwidth among all members: the nodes. With n >= 2 islands of one size
  L >= 2 (islands ordered by their lowest rank, members within one by rank), an all-reduce is a
  reduce-scatter of S inside every island at once, an all-reduce of S/L across the islands (L rings at
  once, ring j joining the j-th member of every island), then an all-gather of S inside every island;
  a reduce-scatter is the reduce-scatter inside (S) then across (S/L); an all-gather the all-gather
  across (S/L) then inside (S). Phases run one after another; the rings of one phase share link
  directions (c_r counts the pairs of all of them) and a phase lasts as long as its slowest ring.
  Anything else (one island, islands of unequal sizes or of one member, any broadcast) is a flat ring.
* The collective holds every resource (egress and ingress ports, link directions) of every pair of
  every ring it uses, for its whole duration. ``wire_bytes`` is what all members send in all, summed
  over phases (``2 (k - 1) S`` for a flat-ring all-reduce).

One member (k = 1) costs nothing: 0 s, no resources, no bytes.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from postplace.cluster import Cluster
from postplace.graph import COLLECTIVE_KINDS


@dataclass(frozen=True)
class CollectiveCost:
    """What one collective costs on given devices.

    Parameters
    ----------
    seconds : float
        Its duration.
    resources : tuple of int
        Every port and link direction it holds for that duration (sorted, unique; resource ids as in
        :attr:`postplace.cluster.Cluster.route_resources`).
    wire_bytes : float
        Bytes sent by all members, all phases together.
    """

    seconds: float
    resources: tuple[int, ...]
    wire_bytes: float


def collective_cost(cluster: Cluster, kind: str, nbytes: float, members: tuple[int, ...]) -> CollectiveCost:
    """The duration, held resources and bytes on the wire of one collective (model: module docstring).

    Cached: the same collective on the same devices is priced once.

    Parameters
    ----------
    cluster : Cluster
    kind : str
        One of :data:`postplace.graph.COLLECTIVE_KINDS`.
    nbytes : float
        S, the full buffer's bytes (see :class:`postplace.graph.Collective`).
    members : tuple of int
        The member devices in rank order, all different.

    Returns
    -------
    CollectiveCost

    Raises
    ------
    ValueError
        For an unknown kind, a device id out of range, or a device named twice.

    Examples
    --------
    >>> from postplace.cluster import load_cluster
    >>> c = collective_cost(load_cluster("dgx8"), "all_reduce", 4.5e9, (1, 2))  # gpu0, gpu1 over NVSwitch
    >>> round(c.seconds, 9), c.wire_bytes  # 2 steps of (4 us + 2.25 GB / 450 GB/s)
    (0.010008, 9000000000.0)
    """
    return collective_cost_cached(cluster, str(kind), float(nbytes), tuple(int(m) for m in members))


@lru_cache(maxsize=65536)
def collective_cost_cached(cluster: Cluster, kind: str, S: float, members: tuple[int, ...]) -> CollectiveCost:
    """:func:`collective_cost` for arguments already of their types (a str, a float, a tuple of int), cached."""
    if kind not in COLLECTIVE_KINDS:
        raise ValueError(f"collective kind '{kind}' is not one of {COLLECTIVE_KINDS}")
    D = cluster.num_devices
    if any(m < 0 or m >= D for m in members):
        raise ValueError(f"collective members {members} name a device outside 0..{D - 1}")
    if len(set(members)) != len(members):
        raise ValueError(f"collective members {members} name a device twice; each rank needs its own device")
    k = len(members)
    if k <= 1:
        return CollectiveCost(0.0, (), 0.0)
    islands = _islands(cluster, members)
    L = len(islands[0])
    hierarchical = kind != "broadcast" and len(islands) > 1 and L > 1 and all(len(g) == L for g in islands)
    if not hierarchical:
        phases = [_phase(cluster, kind, S, [list(members)])]
    else:
        n = len(islands)
        inside = [list(g) for g in islands]
        across = [[g[j] for g in islands] for j in range(L)]
        if kind == "all_reduce":
            plan = [("reduce_scatter", S, inside), ("all_reduce", S / L, across), ("all_gather", S, inside)]
        elif kind == "reduce_scatter":
            plan = [("reduce_scatter", S, inside), ("reduce_scatter", S / L, across)]
        else:
            plan = [("all_gather", S / L, across), ("all_gather", S, inside)]
        phases = [_phase(cluster, kd, size, rings) for kd, size, rings in plan]
        assert n * L == k
    seconds = 0.0
    wire = 0.0
    held: set[int] = set()
    for t, w, res in phases:
        seconds += t
        wire += w
        held |= res
    return CollectiveCost(seconds, tuple(sorted(held)), wire)


def _pairs(ring: list[int], kind: str) -> list[tuple[int, int]]:
    """Who sends to whom: the ring's neighbours; a broadcast's chain from rank 0 has no wrap-around pair."""
    k = len(ring)
    last = k - 1 if kind == "broadcast" else k
    return [(ring[i], ring[(i + 1) % k]) for i in range(last)]


def _phase(cluster: Cluster, kind: str, S: float, rings: list[list[int]]) -> tuple[float, float, set[int]]:
    """(seconds, wire bytes, resources) of ``kind`` on buffer ``S`` in every ring of ``rings`` at once."""
    D = cluster.num_devices
    ptr, res = cluster.route_ptr, cluster.route_resources
    pairs = [_pairs(ring, kind) for ring in rings]
    routes = {p: res[ptr[p[0] * D + p[1]] : ptr[p[0] * D + p[1] + 1]].tolist() for ps in pairs for p in ps}
    share: dict[int, int] = {}
    for ps in pairs:
        for p in ps:
            for r in routes[p][2:]:  # the link directions (the two ports of a ring member are its own)
                share[r] = share.get(r, 0) + 1
    links = cluster.links

    def eff_bw(p):
        bw = float(cluster.bandwidth[p[0], p[1]])  # a route without shared links still has its bottleneck
        for r in routes[p][2:]:
            bw = min(bw, links[(r - 2 * D) // 2].bandwidth / share[r])
        return bw

    seconds = 0.0
    wire = 0.0
    for ring, ps in zip(rings, pairs, strict=True):
        k = len(ring)
        if k <= 1:
            continue
        if kind == "broadcast":
            t = (k - 1) * max(float(cluster.latency[a, b]) for a, b in ps) + S / min(eff_bw(p) for p in ps)
            wire += (k - 1) * S
        else:
            steps = 2 * (k - 1) if kind == "all_reduce" else k - 1
            chunk = S / k
            t = steps * max(float(cluster.latency[p[0], p[1]]) + chunk / eff_bw(p) for p in ps)
            wire += k * steps * chunk
        seconds = max(seconds, t)
    held = {r for ps in pairs for p in ps for r in routes[p]}
    return seconds, wire, held


def _islands(cluster: Cluster, members: tuple[int, ...]) -> list[list[int]]:
    """The members split into nodes: components joined by routes faster than the slowest among them."""
    k = len(members)
    idx = np.asarray(members, dtype=np.int64)
    bw = cluster.bandwidth[np.ix_(idx, idx)]
    both = np.minimum(bw, bw.T)
    off = ~np.eye(k, dtype=bool)
    slowest = both[off].min()
    from scipy.sparse.csgraph import connected_components

    _, label = connected_components(both > slowest, directed=False)
    groups: dict[int, list[int]] = {}
    for i in range(k):  # ranks in order, so islands come out ordered by their lowest rank
        groups.setdefault(int(label[i]), []).append(members[i])
    return list(groups.values())
