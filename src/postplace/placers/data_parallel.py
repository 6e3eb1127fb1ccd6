"""Data parallelism over the GPUs: a different kind of parallelism from placement, estimated analytically.

This is not a placer: it returns no op placement. Every GPU holds a whole replica of the model, runs
the whole step on its share of the global batch, then the GPUs sum their gradients with a ring
all-reduce. It is the baseline most users would run instead of model parallelism, so step times of
placements are compared with it for the same global batch.

Assumptions (each one a simplification, stated so results can be read with it):

* The batch is split evenly over k GPUs. An op's time on a GPU scales as ``(t - o) / k + o`` with
  ``o = min(launch overhead of the device, t)``: the work shrinks with the batch, the per-op launch
  overhead does not. Ops that may not run on a GPU stay on the CPU at full time (one CPU serves all
  replicas, so its total work per step does not shrink). Edge bytes are not scaled (they only matter
  for transfers to and from such CPU ops).
* Compute time = the simulator's step time of each replica (all ops on its GPU, CPU-only ops on the
  CPU) under the scaled times; the slowest replica sets the pace.
* Gradients are all-reduced after the whole backward pass (no overlap with it). The gradient bytes are
  ``gradient_bytes`` if given, else the persistent bytes of the update-phase ops that hold any, else
  (imported workloads) those of parameter nodes: source ops with zero time on every device, else every
  op's persistent bytes (an overestimate; ``gradient_source`` says which).
* Ring all-reduce over the GPUs in device order: ``2 (k - 1)`` steps, each moving ``bytes / k`` over
  every hop of the ring at once; a step takes the slowest hop's ``latency + (bytes / k) * u / bandwidth``
  where ``u`` is how many ring hops share a link direction on that hop's route (1 on the K80 presets).
  With uniform hops this is ``2 (k - 1) / k * bytes / bandwidth + 2 (k - 1) * latency``.
* Memory per GPU = parameter bytes on it + (single-device peak - parameter bytes) / k: parameters
  (static graphs: parameter nodes' footprints; live graphs: all persistent bytes) are replicated whole,
  activations shrink with the batch. OOM when that exceeds the GPU's capacity.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from postplace.cluster import Cluster
from postplace.cluster.placement import single_device
from postplace.cost import CostModel, OpTimes, RooflineCostModel
from postplace.graph import PHASES, OpGraph
from postplace.placers._common import PlacementError, check_graph, devices_of_kind

__all__ = ["DataParallelResult", "data_parallel_step_time", "gradient_bytes", "ring_allreduce_time"]


@dataclass(frozen=True, eq=False)
class DataParallelResult:
    """Estimated step of data parallelism over ``gpus`` (NOT a placement: no op-to-device map).

    ``step_time = compute_time + allreduce_time`` (seconds); ``peak_mem[k]`` bytes per GPU and
    ``oom`` when any exceeds its ``capacity``; ``gradient_bytes`` and where they came from.
    """

    step_time: float
    compute_time: float
    allreduce_time: float
    gradient_bytes: float
    gradient_source: str
    gpus: tuple[str, ...]
    peak_mem: np.ndarray
    capacity: np.ndarray
    oom: bool
    kind: str = "data-parallel (not a placement)"


@dataclass(frozen=True, eq=False)
class _Table:
    times: OpTimes

    def op_times(self, graph, cluster):
        return self.times

    def transfer_time(self, cluster, nbytes, a, b):
        return cluster.transfer_time(nbytes, a, b)


def _parameter_ops(graph: OpGraph, times: np.ndarray) -> tuple[np.ndarray, str]:
    upd = (graph.phase == PHASES.index("update")) & (graph.persistent_bytes > 0)
    if upd.any():
        return upd, "update-phase ops"
    zero = np.all(np.where(np.isfinite(times), times, 0.0) == 0.0, axis=1)
    source = np.diff(graph.in_ptr) == 0
    params = zero & source & (graph.persistent_bytes > 0)
    if params.any():
        return params, "parameter nodes (zero-time source ops)"
    return graph.persistent_bytes > 0, "all persistent bytes (no parameter ops recognised: an overestimate)"


def gradient_bytes(graph: OpGraph, cluster: Cluster, cost_model: CostModel | None = None) -> tuple[float, str]:
    """Bytes each GPU all-reduces per step, and where the figure comes from (module docstring)."""
    times = (cost_model or RooflineCostModel()).op_times(graph, cluster).table
    params, source = _parameter_ops(graph, times)
    return float(graph.persistent_bytes[params].sum()), source


def ring_allreduce_time(cluster: Cluster, gpus: list[int], nbytes: float) -> float:
    """Seconds for a ring all-reduce of ``nbytes`` over ``gpus`` in that order (module docstring)."""
    k = len(gpus)
    if k < 2 or nbytes <= 0:
        return 0.0
    D = cluster.num_devices
    hops = [(gpus[i], gpus[(i + 1) % k]) for i in range(k)]
    routes = [cluster.route_resources[cluster.route_ptr[a * D + b]:cluster.route_ptr[a * D + b + 1]] for a, b in hops]
    use: dict[int, int] = {}
    for r in routes:
        for res in r[2:]:
            use[int(res)] = use.get(int(res), 0) + 1
    chunk = nbytes / k
    step = 0.0
    for (a, b), r in zip(hops, routes, strict=True):
        per_byte = 1.0 / cluster.bandwidth[a, b]
        for res in r[2:]:
            link = cluster.links[(int(res) - 2 * D) // 2]
            per_byte = max(per_byte, use[int(res)] / link.bandwidth)
        step = max(step, cluster.latency[a, b] + chunk * per_byte)
    return float(2 * (k - 1) * step)


def data_parallel_step_time(graph: OpGraph, cluster: Cluster, *, cost_model: CostModel | None = None,
                            gpus: list | None = None, gradient_bytes: float | None = None) -> DataParallelResult:
    """Step time and per-GPU memory of data parallelism over the GPUs, for the same global batch.

    A different kind of parallelism from the placers (each GPU runs the whole graph); the assumptions
    are in the module docstring.

    Parameters
    ----------
    graph, cluster : OpGraph, Cluster
    cost_model : CostModel, optional
        Default :class:`postplace.cost.RooflineCostModel`.
    gpus : list of str or int, optional
        The replicas' GPUs, in ring order (default: every GPU).
    gradient_bytes : float, optional
        Bytes all-reduced per step (default: recognised from the graph).

    Returns
    -------
    DataParallelResult

    Raises
    ------
    PlacementError
        When the cluster has no GPU.

    References
    ----------
    P. Goyal et al., "Accurate, Large Minibatch SGD: Training ImageNet in 1 Hour", 2017 (synchronous
    data parallelism); A. Sergeev, M. Del Balso, "Horovod", 2018 (ring all-reduce, after Patarasuk and
    Yuan, "Bandwidth optimal all-reduce algorithms for clusters of workstations", JPDC 2009).

    Examples
    --------
    >>> from postplace.graph import OpGraph
    >>> from postplace.testing import TableCostModel, star_cluster
    >>> g = OpGraph.build(["f", "u"], [(0, 1)], phase=["forward", "update"], persistent_bytes=[0, 8])
    >>> r = data_parallel_step_time(g, star_cluster(("gpu", "gpu")), cost_model=TableCostModel([[2, 2], [2, 2]]))
    >>> r.compute_time, r.allreduce_time, r.step_time   # (2 + 2) / 2, 2 (2 - 1) * (8 / 2) / 1
    (2.0, 8.0, 10.0)
    """
    check_graph(graph, cluster, "data-parallel")
    ids = devices_of_kind(cluster, "gpu") if gpus is None else [
        cluster.device_index(d) if isinstance(d, str) else int(d) for d in gpus]
    if not ids:
        raise PlacementError(f"data-parallel: cluster '{cluster.name}' has no GPU to replicate the model on")
    from postplace.sim import Simulator

    k = len(ids)
    base = (cost_model or RooflineCostModel()).op_times(graph, cluster)
    table = np.array(base.table, dtype=np.float64)
    scaled = table.copy()
    for d in ids:
        t = table[:, d]
        o = np.minimum(cluster.devices[d].launch_overhead, np.where(np.isfinite(t), t, 0.0))
        scaled[:, d] = np.where(np.isfinite(t), (t - o) / k + o, np.inf)
    reps = np.stack([single_device(graph, cluster, cluster.device_names[d]) for d in ids])
    fast = Simulator(graph, cluster, cost_model=_Table(OpTimes(scaled, base.measured, base.sources)))
    compute = float(fast.evaluate(reps).step_time.max())
    params, source = _parameter_ops(graph, table)
    if gradient_bytes is None:
        grad = float(graph.persistent_bytes[params].sum())
    else:
        grad, source = float(gradient_bytes), "given"
    allreduce = ring_allreduce_time(cluster, ids, grad)
    full = Simulator(graph, cluster, cost_model=_Table(base)).evaluate(reps)
    replicated = params if graph.memory_mode == "static" else graph.persistent_bytes > 0
    peak = np.empty(k)
    for r, d in enumerate(ids):
        on = reps[r] == d
        p = float(graph.persistent_bytes[on & replicated].sum())
        peak[r] = p + (float(full.peak_mem[r, d]) - p) / k
    cap = cluster.capacity[ids]
    return DataParallelResult(
        step_time=compute + allreduce, compute_time=compute, allreduce_time=allreduce, gradient_bytes=grad,
        gradient_source=source, gpus=tuple(cluster.device_names[d] for d in ids), peak_mem=peak, capacity=cap,
        oom=bool(np.any(peak > cap)),
    )
