"""Op times per device: measured where the graph carries a measurement, roofline estimates elsewhere.

Two methods make a cost model, as in FlexFlow's estimator: :meth:`CostModel.op_times` (a table
``[n_ops, D]`` built once per graph and cluster) and :meth:`CostModel.transfer_time` (bytes between two
devices, over the route's slowest link). The simulator reads only the table and the cluster's routes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np

from postplace.cluster import Cluster
from postplace.graph import OpGraph


@dataclass(frozen=True, eq=False)
class OpTimes:
    """``table[i, d]``: seconds op i takes on device d (inf where the op may not run there).

    ``measured[i, d]`` says whether the time came from a measurement; ``sources[d]`` says in one line
    where device d's times came from, so no number hides whether it was measured or estimated.
    """

    table: np.ndarray
    measured: np.ndarray
    sources: tuple[str, ...]


class CostModel(Protocol):
    def op_times(self, graph: OpGraph, cluster: Cluster) -> OpTimes: ...

    def transfer_time(self, cluster: Cluster, nbytes: float, a: int, b: int) -> float: ...


@dataclass(frozen=True)
class RooflineCostModel:
    """The default cost model.

    For each op and device: the graph's measured time for that device's model; else one measured for
    the device's kind as a whole (a profiled file that does not name its hardware); else, only when
    ``allow_other_models`` is set, one measured on another model of the same kind (the source line
    says so); else the roofline ``max(FLOPs / peak, bytes / memory bandwidth)`` plus the device's
    launch overhead. Overhead is never added to a measured time.
    """

    allow_other_models: bool = False

    def op_times(self, graph: OpGraph, cluster: Cluster) -> OpTimes:
        n, D = graph.num_ops, cluster.num_devices
        table = np.empty((n, D))
        measured = np.zeros((n, D), dtype=bool)
        sources = []
        for d, dev in enumerate(cluster.devices):
            with np.errstate(over="ignore"):  # an overflow to inf is reported by the simulator's checks
                roof = np.maximum(graph.flops / dev.peak_flops, graph.bytes_accessed / dev.memory_bandwidth)
            times = roof + dev.launch_overhead
            have = np.zeros(n, dtype=bool)
            used = []
            for m in self._candidates(graph, dev):
                take = ~have & ~np.isnan(m.times)
                if take.any():
                    times = np.where(take, m.times, times)
                    have |= take
                    used.append(f"{int(take.sum())} measured ({m.key}: {m.provenance})")
            if n - int(have.sum()):
                used.append(f"{n - int(have.sum())} roofline estimates")
            allowed = (graph.allowed_kinds & dev.kind_bit) != 0
            table[:, d] = np.where(allowed, times, np.inf)
            measured[:, d] = have & allowed
            sources.append(f"{dev.name} ({dev.model}): " + "; ".join(used or ["no ops"]))
        return OpTimes(table, measured, tuple(sources))

    def _candidates(self, graph: OpGraph, dev):
        exact = [m for m in graph.measured if m.key == dev.model]
        kind = [m for m in graph.measured if m.key == dev.kind and m.key != dev.model]
        other = []
        if self.allow_other_models:
            other = [m for m in graph.measured if m.kind == dev.kind and m not in exact and m not in kind]
            other = [_Borrowed(m, dev.model) for m in other]
        return exact + kind + other

    def transfer_time(self, cluster: Cluster, nbytes: float, a: int, b: int) -> float:
        return cluster.transfer_time(nbytes, a, b)


@dataclass(frozen=True)
class _Borrowed:
    """A measurement from another model of the same kind, labelled as such."""

    inner: object
    target: str

    @property
    def key(self):
        return self.inner.key

    @property
    def times(self):
        return self.inner.times

    @property
    def provenance(self):
        return f"{self.inner.provenance}; borrowed from model {self.inner.key} for {self.target}"
