"""Cost models and clusters whose numbers a test writes down, so expected schedules are sums on paper."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from postplace.cluster import Cluster, Device, Link
from postplace.cost import OpTimes
from postplace.graph import OpGraph


@dataclass(frozen=True)
class TableCostModel:
    """Op i takes ``table[i][d]`` seconds on device d (inf where the op's kinds forbid d)."""

    table: object

    def op_times(self, graph: OpGraph, cluster: Cluster) -> OpTimes:
        t = np.array(self.table, dtype=np.float64).reshape(graph.num_ops, cluster.num_devices)
        allowed = (graph.allowed_kinds[:, None] & cluster.kind_bits[None, :]) != 0
        t = np.where(allowed, t, np.inf)
        return OpTimes(t, np.zeros_like(allowed), tuple(f"{n}: test table" for n in cluster.device_names))

    def transfer_time(self, cluster: Cluster, nbytes: float, a: int, b: int) -> float:
        return cluster.transfer_time(nbytes, a, b)


@dataclass(frozen=True)
class ConstantCostModel:
    """Every op takes ``seconds`` on every device it may use."""

    seconds: float

    def op_times(self, graph: OpGraph, cluster: Cluster) -> OpTimes:
        return TableCostModel(np.full((graph.num_ops, cluster.num_devices), self.seconds)).op_times(graph, cluster)

    def transfer_time(self, cluster: Cluster, nbytes: float, a: int, b: int) -> float:
        return cluster.transfer_time(nbytes, a, b)


def star_cluster(
    kinds=("cpu", "gpu", "gpu"),
    *,
    bandwidth: float = 1.0,
    latency: float = 0.0,
    memory: float = 1e12,
    shared: dict[str, list[str]] | None = None,
    shared_bandwidth: float | None = None,
) -> Cluster:
    """Devices ``cpu`` / ``gpu0``... each linked to one hub with ``bandwidth`` bytes/s and ``latency`` s.

    ``shared={"sw": ["gpu0", "gpu1"]}`` puts those devices behind a switch ``sw`` whose single uplink to
    the hub (``shared_bandwidth``, default ``bandwidth``) they share.
    """
    names, gpus = [], 0
    for k in kinds:
        if k == "gpu":
            names.append(f"gpu{gpus}")
            gpus += 1
        else:
            names.append("cpu" if "cpu" not in names else f"cpu{len(names)}")
    devices = tuple(Device(n, k, k, 1e12, 1e12, memory, 0.0) for n, k in zip(names, kinds, strict=True))
    shared = shared or {}
    behind = {d: sw for sw, ds in shared.items() for d in ds}
    links = [Link(n, behind.get(n, "hub"), bandwidth, latency) for n in names]
    links += [Link(sw, "hub", shared_bandwidth or bandwidth, 0.0) for sw in shared]
    return Cluster("test", devices, ("hub", *shared), tuple(links))
