"""The arrays both simulators read: one graph on one cluster under one cost model."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from postplace.cluster import Cluster
from postplace.cost import CostModel, OpTimes, RooflineCostModel
from postplace.errors import PostplaceError
from postplace.graph import OpGraph
from postplace.sim.collectives import collective_cost_cached


@dataclass(frozen=True, eq=False)
class SimProblem:
    """Everything the simulation kernels need, as flat arrays (numba reads these directly).

    Build one with :meth:`build`; the fields are copies or views of the graph's, the cluster's and the
    cost model's arrays.

    Parameters
    ----------
    graph : OpGraph
    cluster : Cluster
    cost_model : CostModel
    op_times : OpTimes
        The cost model's table with its provenance.
    op_time : numpy.ndarray
        ``float64[n, D]``: seconds op i takes on device d (inf where it may not run).
    alloc_bytes : numpy.ndarray
        ``float64[n]``: bytes an op's output allocates in live memory mode (0 if in place, or in static mode).
    persistent : numpy.ndarray
        ``float64[n]``: bytes an op keeps on its device for the whole step.
    live_mode : bool
        The graph's memory mode is ``live``.
    out_ptr, edge_dst, edge_slot, edge_bytes, edge_src : numpy.ndarray
        The edges in CSR order by source (:attr:`OpGraph.out_ptr`).
    in_ptr, in_edges : numpy.ndarray
        The edges by destination (:attr:`OpGraph.in_ptr`, :attr:`OpGraph.in_edges`).
    edge_alias : numpy.ndarray
        ``bool[E]``: the edge feeds an in-place op the tensor it writes (live mode only).
    indegree : numpy.ndarray
        Per op, its number of in-edges.
    num_slots : int
        One more than the largest output slot (1 for a graph without edges).
    latency, bandwidth : numpy.ndarray
        ``float64[D, D]``: the route a -> b's summed latency and bottleneck bandwidth.
    route_ptr, route_res : numpy.ndarray
        The resources each transfer a -> b holds (:attr:`Cluster.route_resources`).
    num_resources : int
        Ports and link directions (:attr:`Cluster.num_resources`).
    capacity : numpy.ndarray
        ``float64[D]``: usable memory per device.
    coll_of : numpy.ndarray
        ``int64[n]``: the collective op i is a member of, -1 for an ordinary op (:attr:`OpGraph.collective`).
    coll_ptr, coll_members : numpy.ndarray
        CSR over collectives: the members of collective c, in rank (op index) order, are
        ``coll_members[coll_ptr[c]:coll_ptr[c + 1]]``.
    num_collectives : int
        The graph's number of collectives.
    """

    graph: OpGraph
    cluster: Cluster
    cost_model: CostModel
    op_times: OpTimes
    op_time: np.ndarray  # float64[n, D]
    alloc_bytes: np.ndarray  # float64[n]: bytes an op's output allocates in live mode (0 if in place)
    persistent: np.ndarray  # float64[n]
    live_mode: bool
    out_ptr: np.ndarray
    edge_dst: np.ndarray
    edge_slot: np.ndarray
    edge_bytes: np.ndarray
    in_ptr: np.ndarray
    in_edges: np.ndarray
    edge_src: np.ndarray
    edge_alias: np.ndarray  # bool[E]: the edge feeds an in-place op the tensor it writes (live mode only)
    indegree: np.ndarray
    num_slots: int
    latency: np.ndarray  # float64[D, D]
    bandwidth: np.ndarray  # float64[D, D]
    route_ptr: np.ndarray
    route_res: np.ndarray
    num_resources: int
    capacity: np.ndarray
    coll_of: np.ndarray  # int64[n]
    coll_ptr: np.ndarray  # int64[C + 1]
    coll_members: np.ndarray  # int64[M]
    num_collectives: int

    @classmethod
    def build(cls, graph: OpGraph, cluster: Cluster, cost_model: CostModel | None = None) -> SimProblem:
        """The arrays for ``graph`` on ``cluster``, op times from ``cost_model``.

        Parameters
        ----------
        graph : OpGraph
        cluster : Cluster
        cost_model : CostModel, optional
            Default :class:`postplace.cost.RooflineCostModel`.

        Returns
        -------
        SimProblem

        Raises
        ------
        PostplaceError
            When step times could not be finite: an op no device of the cluster may run, or an op or
            transfer time that overflows.
        """
        cost_model = cost_model or RooflineCostModel()
        times = cost_model.op_times(graph, cluster)
        _check_finite(graph, cluster, times.table, getattr(times, "unable", None))
        live = graph.memory_mode == "live"
        # a parameter or buffer op's output is the tensor its persistent bytes already hold: counting it
        # again as a live allocation held every parameter twice (and FSDP's shards as whole parameters)
        holds = np.isin(np.asarray(graph.op_types), ("parameter", "buffer"))
        holds &= graph.persistent_bytes >= graph.output_bytes
        alloc = np.where(graph.inplace | holds, 0.0, graph.output_bytes) if live else np.zeros(graph.num_ops)
        dst_base = graph.inplace_base[graph.edge_dst]
        alias = graph.inplace[graph.edge_dst] & ((dst_base == -1) | (dst_base == graph.edge_src))
        C = len(graph.collectives)
        member_ops = np.flatnonzero(graph.collective >= 0)
        coll_members = member_ops[np.argsort(graph.collective[member_ops], kind="stable")].astype(np.int64)
        coll_ptr = np.zeros(C + 1, dtype=np.int64)
        coll_ptr[1:] = np.cumsum(np.bincount(graph.collective[member_ops], minlength=C))
        return cls(
            graph=graph,
            cluster=cluster,
            cost_model=cost_model,
            op_times=times,
            op_time=np.ascontiguousarray(times.table),
            alloc_bytes=alloc,
            persistent=np.ascontiguousarray(graph.persistent_bytes),
            live_mode=live,
            out_ptr=graph.out_ptr,
            edge_dst=graph.edge_dst,
            edge_slot=graph.edge_slot.astype(np.int64),
            edge_bytes=graph.edge_bytes,
            in_ptr=graph.in_ptr,
            in_edges=graph.in_edges,
            edge_src=graph.edge_src,
            edge_alias=np.ascontiguousarray(alias & live, dtype=np.bool_),
            indegree=np.diff(graph.in_ptr),
            num_slots=int(graph.edge_slot.max()) + 1 if graph.num_edges else 1,
            latency=np.ascontiguousarray(cluster.latency),
            bandwidth=np.ascontiguousarray(cluster.bandwidth),
            route_ptr=cluster.route_ptr,
            route_res=cluster.route_resources,
            num_resources=cluster.num_resources,
            capacity=cluster.capacity,
            coll_of=np.ascontiguousarray(graph.collective, dtype=np.int64),
            coll_ptr=coll_ptr,
            coll_members=np.ascontiguousarray(coll_members),
            num_collectives=C,
        )

    @property
    def num_ops(self) -> int:
        """The graph's number of ops."""
        return self.graph.num_ops

    @property
    def num_devices(self) -> int:
        """The cluster's number of devices."""
        return self.cluster.num_devices

    def collective_members(self, c: int) -> np.ndarray:
        """The member ops of collective ``c``, in rank (op index) order."""
        return self.coll_members[self.coll_ptr[c] : self.coll_ptr[c + 1]]

    def collective_arrays(self, placements: np.ndarray):
        """What each collective costs under each op-level placement, as flat arrays for the kernel.

        Parameters
        ----------
        placements : numpy.ndarray
            ``int64[m, n]``: op-level placements whose collectives' members are on distinct devices.

        Returns
        -------
        seconds : numpy.ndarray
            ``float64[m, C]``: each collective's duration.
        res_ptr : numpy.ndarray
            ``int64[m, C + 1]``: CSR pointer per row into ``res``.
        res : numpy.ndarray
            ``int64[m, R]``: the resources each collective holds (rows padded to the longest).
        wire : numpy.ndarray
            ``float64[m, C]``: bytes each collective sends.
        """
        m, C = placements.shape[0], self.num_collectives
        seconds = np.zeros((m, C))
        wire = np.zeros((m, C))
        res_ptr = np.zeros((m, C + 1), dtype=np.int64)
        if not C:
            return seconds, res_ptr, np.zeros((m, 0), dtype=np.int64), wire
        # placements of a batch often agree on where the members are: price each distinct layout once
        sub = np.ascontiguousarray(placements[:, self.coll_members])
        first: dict[bytes, int] = {}
        row_of = np.array([first.setdefault(sub[r].tobytes(), r) for r in range(m)], dtype=np.int64)
        ptr = self.coll_ptr.tolist()
        colls = [(c.kind, c.nbytes) for c in self.graph.collectives]
        held: dict[int, list[int]] = {}
        for u in first.values():
            layout = sub[u].tolist()
            res = held[u] = []
            for c, (kind, nbytes) in enumerate(colls):
                cost = collective_cost_cached(self.cluster, kind, nbytes, tuple(layout[ptr[c] : ptr[c + 1]]))
                seconds[u, c] = cost.seconds
                wire[u, c] = cost.wire_bytes
                res.extend(cost.resources)
                res_ptr[u, c + 1] = len(res)
        res_all = np.zeros((m, max(1, max(len(h) for h in held.values()))), dtype=np.int64)
        for u, res in held.items():
            res_all[u, : len(res)] = res
        return seconds[row_of], res_ptr[row_of], res_all[row_of], wire[row_of]


def _check_finite(graph: OpGraph, cluster: Cluster, table: np.ndarray, unable: np.ndarray | None = None) -> None:
    """Refuse a graph and cluster whose step times could not be finite numbers (an op no device may run,
    an op or transfer time that overflows, or a sum of them that does): such a run would print ``inf``
    as a result or score every placement alike. One line names the op, device or edge to fix."""
    where = f"graph '{graph.name}' on cluster '{cluster.name}'"
    runnable = np.isfinite(table)
    if graph.num_ops and not runnable.any(axis=1).all():
        i = int(np.flatnonzero(~runnable.any(axis=1))[0])
        kinds = "/".join(k for k, bit in (("cpu", 1), ("gpu", 2)) if graph.allowed_kinds[i] & bit)
        raise PostplaceError(
            f"{where}: op '{graph.names[i]}' may only run on {kinds} and the cluster has no such device; "
            "use a cluster with one"
        )
    allowed = (graph.allowed_kinds[:, None] & cluster.kind_bits[None, :]) != 0
    bad = np.argwhere(allowed & ~runnable & (True if unable is None else ~unable))
    if bad.size:
        i, d = (int(x) for x in bad[0])
        raise PostplaceError(
            f"{where}: op '{graph.names[i]}' on {cluster.device_names[d]} takes {table[i, d]} s (flops "
            f"{graph.flops[i]:.3g}, bytes {graph.bytes_accessed[i]:.3g} against the device's peak_flops and "
            "memory_bandwidth); fix the graph's op or the device's figures"
        )
    D = cluster.num_devices
    with np.errstate(over="ignore", invalid="ignore"):
        worst_op = float(np.where(runnable, table, 0.0).max(axis=1).sum())
        worst_comm = 0.0
        if D > 1 and graph.num_edges:
            off = ~np.eye(D, dtype=bool)
            worst_comm = float(np.sum(cluster.latency[off].max() + graph.edge_bytes / cluster.bandwidth[off].min()))
        total = (worst_op + worst_comm) * 2.0 + 1.0
    if not np.isfinite(total):
        what = "op times" if not np.isfinite(worst_op) else "transfer times (edge bytes / link bandwidth)"
        raise PostplaceError(
            f"{where}: the {what} add up past the largest float, so no step time would be finite; "
            "check the graph's flops/bytes and the cluster's rates for absurd values"
        )
