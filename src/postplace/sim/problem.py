"""The arrays both simulators read: one graph on one cluster under one cost model."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from postplace.cluster import Cluster
from postplace.cost import CostModel, OpTimes, RooflineCostModel
from postplace.graph import OpGraph


@dataclass(frozen=True, eq=False)
class SimProblem:
    """Everything the simulation kernels need, as flat arrays (numba reads these directly)."""

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

    @classmethod
    def build(cls, graph: OpGraph, cluster: Cluster, cost_model: CostModel | None = None) -> SimProblem:
        cost_model = cost_model or RooflineCostModel()
        times = cost_model.op_times(graph, cluster)
        live = graph.memory_mode == "live"
        alloc = np.where(graph.inplace, 0.0, graph.output_bytes) if live else np.zeros(graph.num_ops)
        dst_base = graph.inplace_base[graph.edge_dst]
        alias = graph.inplace[graph.edge_dst] & ((dst_base == -1) | (dst_base == graph.edge_src))
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
        )

    @property
    def num_ops(self) -> int:
        return self.graph.num_ops

    @property
    def num_devices(self) -> int:
        return self.cluster.num_devices
