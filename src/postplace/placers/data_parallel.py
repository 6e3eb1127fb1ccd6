"""Data parallelism over the GPUs: the baseline most users would run instead of model parallelism.

Two figures, for two kinds of workload:

**Simulated, as a placement** (wherever the step can be traced as m micro-batches: a zoo model, a
user's module). :func:`data_parallel_placement` puts micro-batch j on replica GPU ``j % k`` and each
parameter, with its gradient sums and update, on one GPU (a sharded parameter server: every GPU sums
and updates its share, and sends its updated share to the others, moving the bytes of a ring
all-reduce). :func:`simulate_data_parallel` times that placement with the simulator, like any plan,
and reports the memory real data parallelism needs: every replica holds the whole parameters,
gradients and optimizer state (details in its docstring), so a replica that does not fit is OOM even
where the sharded placement fits.

**Estimated, analytically** (:func:`data_parallel_step_time`; for file workloads that cannot be
traced again, and labelled as an estimate wherever it is shown). Every GPU holds a whole replica of
the model, runs the whole step on its share of the global batch, then the GPUs sum their gradients
with a ring all-reduce. Its assumptions, each one a simplification, stated so results can be read
with it:

* The batch is split evenly over k GPUs. An op's time on a GPU scales as ``(t - o) / k + o`` with
  ``o = min(launch overhead of the device, t)``: the work shrinks with the batch, the per-op launch
  overhead does not. Ops that may not run on a GPU stay on the CPU at full time (one CPU serves all
  replicas, so its total work per step does not shrink). Edge bytes are not scaled (they only matter
  for transfers to and from such CPU ops).
* Compute time = the simulator's step time of each replica (all ops on its GPU, CPU-only ops on the
  CPU) under the scaled times; the slowest replica sets the pace.
* Gradients are all-reduced after the whole backward pass (no overlap with it). The gradient bytes
  (:func:`gradient_bytes`) are the parameters' own bytes, not their optimizer state: ``gradient_bytes``
  if given, else the trained parameter ops of a traced graph (ops named ``param:...``: their output
  bytes, or their persistent bytes / (1 + the graph's ``optimizer_slots``)), else the graph's
  ``metadata["param_bytes"]``, else the persistent bytes of the update-phase ops that hold any, else
  (imported workloads) those of parameter nodes: source ops with zero time on every device, else
  every op's persistent bytes (an overestimate). ``gradient_source`` says which.
* The all-reduce over the GPUs in device order is the simulator's collective
  (:mod:`postplace.sim.collectives`): within a node a ring of ``2 (k - 1)`` steps, each moving
  ``bytes / k`` over every hop at once, a step taking the slowest hop's ``latency + (bytes / k) * u /
  bandwidth`` where ``u`` is how many ring hops share a link direction; across nodes hierarchical
  (reduce-scatter inside, all-reduce across, all-gather inside). With uniform hops in one node this is
  ``2 (k - 1) / k * bytes / bandwidth + 2 (k - 1) * latency``.
* Memory per GPU = parameter bytes on it + (single-device peak - parameter bytes) / k: parameters
  (static graphs: parameter nodes' footprints; live graphs: all persistent bytes, optimizer state
  included) are replicated whole, activations shrink with the batch. OOM when that exceeds the GPU's
  capacity.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from postplace.cluster import Cluster
from postplace.cluster.placement import single_device
from postplace.cost import CostModel, OpTimes, RooflineCostModel
from postplace.graph import PHASES, OpGraph
from postplace.placers._common import PlacementError, check_graph, devices_of_kind

__all__ = [
    "DataParallelPlan",
    "DataParallelResult",
    "data_parallel_placement",
    "data_parallel_step_time",
    "gradient_bytes",
    "replicated_peak",
    "ring_allreduce_time",
    "simulate_data_parallel",
]


@dataclass(frozen=True, eq=False)
class DataParallelResult:
    """Estimated step of data parallelism over ``gpus`` (NOT a placement: no op-to-device map).

    What :func:`data_parallel_step_time` returns.

    Parameters
    ----------
    step_time : float
        ``compute_time + allreduce_time`` (seconds).
    compute_time : float
        Seconds the slowest replica takes for its share of the batch (every op time over k, its
        launch overhead kept whole).
    allreduce_time : float
        Seconds of the ring all-reduce of the gradients.
    gradient_bytes : float
        Bytes all-reduced per step.
    gradient_source : str
        Where ``gradient_bytes`` came from (``"given"``, or how the graph's parameters were recognised).
    gpus : tuple of str
        The replicas' GPUs, in ring order.
    peak_mem : numpy.ndarray
        ``[k]``: bytes per replica GPU.
    capacity : numpy.ndarray
        ``[k]``: each replica GPU's usable memory.
    oom : bool
        Some replica's ``peak_mem`` exceeds its ``capacity``.
    kind : str
        ``"data-parallel (not a placement)"``, so no table mistakes it for one.
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


def _traced_parameter_ops(graph: OpGraph) -> np.ndarray:
    """Parameter ops of a traced graph: named ``param:...`` (or of op type ``parameter``)."""
    return np.array(
        [n.startswith("param:") or t == "parameter" for n, t in zip(graph.names, graph.op_types, strict=True)],
        dtype=bool,
    )


def _parameter_ops(graph: OpGraph, times: np.ndarray) -> tuple[np.ndarray, str]:
    """The ops holding parameters (whose persistent bytes may include optimizer state), and how found."""
    traced = _traced_parameter_ops(graph)
    if traced.any():
        return traced, "parameter ops (param:...)"
    upd = (graph.phase == PHASES.index("update")) & (graph.persistent_bytes > 0)
    if upd.any():
        return upd, "update-phase ops"
    zero = np.all(np.where(np.isfinite(times), times, 0.0) == 0.0, axis=1)
    source = np.diff(graph.in_ptr) == 0
    params = zero & source & (graph.persistent_bytes > 0)
    if params.any():
        return params, "parameter nodes (zero-time source ops)"
    return graph.persistent_bytes > 0, "all persistent bytes (no parameter ops recognised: an overestimate)"


def _gradient_bytes(graph: OpGraph, params: np.ndarray, source: str) -> tuple[float, str]:
    """Bytes of the gradients of ``params`` (module docstring): the parameters' own bytes."""
    if source.startswith("parameter ops"):
        slots = int(graph.metadata.get("optimizer_slots", 0) or 0)
        own = np.where(graph.output_bytes > 0, graph.output_bytes, graph.persistent_bytes / (1 + slots))
        trained = params & (graph.persistent_bytes > own) if slots > 0 else params
        if slots > 0 and not trained.any():  # no optimizer state anywhere: every parameter counts
            trained = params
        return float(own[trained].sum()), source + (", trained ones' own bytes" if slots > 0 else ", their bytes")
    if "param_bytes" in graph.metadata:
        return float(graph.metadata["param_bytes"]), "graph metadata param_bytes"
    return float(graph.persistent_bytes[params].sum()), source


def gradient_bytes(graph: OpGraph, cluster: Cluster, cost_model: CostModel | None = None) -> tuple[float, str]:
    """Bytes each GPU all-reduces per step, and where the figure comes from (module docstring).

    The parameters' own bytes, never their optimizer state (SGD's momentum doubles a traced
    parameter op's persistent bytes; the gradient does not double).
    """
    times = (cost_model or RooflineCostModel()).op_times(graph, cluster).table
    return _gradient_bytes(graph, *_parameter_ops(graph, times))


def ring_allreduce_time(cluster: Cluster, gpus: list[int], nbytes: float) -> float:
    """Seconds for an all-reduce of ``nbytes`` over ``gpus`` in that order: the simulator's own collective
    (:func:`postplace.sim.collectives.collective_cost`: a ring inside a node, hierarchical across nodes),
    so the estimate and the simulated plans price a collective alike."""
    from postplace.sim.collectives import collective_cost

    if len(gpus) < 2 or nbytes <= 0:
        return 0.0
    return float(collective_cost(cluster, "all_reduce", float(nbytes), tuple(int(g) for g in gpus)).seconds)


def data_parallel_step_time(
    graph: OpGraph,
    cluster: Cluster,
    *,
    cost_model: CostModel | None = None,
    gpus: list | None = None,
    gradient_bytes: float | None = None,
) -> DataParallelResult:
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
    ids = (
        devices_of_kind(cluster, "gpu")
        if gpus is None
        else [cluster.device_index(d) if isinstance(d, str) else int(d) for d in gpus]
    )
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
        grad, source = _gradient_bytes(graph, params, source)
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
        step_time=compute + allreduce,
        compute_time=compute,
        allreduce_time=allreduce,
        gradient_bytes=grad,
        gradient_source=source,
        gpus=tuple(cluster.device_names[d] for d in ids),
        peak_mem=peak,
        capacity=cap,
        oom=bool(np.any(peak > cap)),
    )


# ------------------------------------------------------------------------- data parallelism as a placement
def _replica_gpus(graph: OpGraph, cluster: Cluster, gpus, allowed) -> list[int]:
    """The replica GPUs: ``gpus`` (default every GPU) less those no op may use under ``allowed``."""
    ids = (
        devices_of_kind(cluster, "gpu")
        if gpus is None
        else [cluster.device_index(d) if isinstance(d, str) else int(d) for d in gpus]
    )
    if allowed is not None:
        usable = np.asarray(allowed, dtype=bool).any(axis=0)
        ids = [d for d in ids if usable[d]]
    if not ids:
        why = " that the pins and exclusions leave usable" if allowed is not None else ""
        raise PlacementError(f"data-parallel: cluster '{cluster.name}' has no GPU{why} to replicate the model on")
    return ids


def _num_microbatches(graph: OpGraph, who: str) -> int:
    mb = np.asarray(graph.microbatch)
    if graph.num_ops == 0 or not (mb >= 0).any():
        raise PlacementError(
            f"{who}: graph '{graph.name}' has no micro-batches (every op is shared); trace the step with "
            "microbatches=m (m > 1) so that micro-batch j can run on GPU j"
        )
    return int(mb.max()) + 1


def data_parallel_placement(
    graph: OpGraph, cluster: Cluster, *, gpus: list | None = None, allowed: np.ndarray | None = None
) -> np.ndarray:
    """Data parallelism as a placement of a micro-batched step (op-level device ids).

    Micro-batch j on replica GPU ``gpus[j % k]`` (``k`` replica GPUs); each parameter with its
    gradient sums and update (its colocation set) on one GPU, parameters dealt out greedily, in program
    order, to the replica GPU holding the fewest parameter bytes so far (a sharded parameter server:
    every GPU sums and updates its share, so no single port carries every gradient, and the bytes moved
    are those of a ring all-reduce). A colocation set that holds ops of a micro-batch goes with its
    first such op's micro-batch (in traced graphs a batch-norm buffer goes with micro-batch 0). Ops that
    may not run on a GPU go to the first CPU. Colocation sets stay whole, so on a graph traced with
    micro-batch colocation ``module`` this is no data parallelism (:func:`simulate_data_parallel` refuses
    such graphs); here it is still returned, as a start for a search.

    Parameters
    ----------
    graph, cluster : OpGraph, Cluster
        ``graph`` is a step traced as m micro-batches (``microbatch`` >= 0 on each micro-batch's ops).
    gpus : list of str or int, optional
        The replica GPUs, in order (default: every GPU of the cluster).
    allowed : numpy.ndarray, optional
        ``[n_ops, D]`` bool: the user's constraints (pins, exclusions). GPUs no op may use are left out
        of the replicas; a colocation set whose data-parallel device it may not use moves to the first
        replica GPU it may use, else to the first device it may use, so pins hold.

    Returns
    -------
    numpy.ndarray
        int64 device id per op.

    Raises
    ------
    PlacementError
        When the graph has no micro-batches, the cluster has no usable GPU, or an op may use no device.

    Examples
    --------
    >>> from postplace.graph import OpGraph
    >>> from postplace.testing import star_cluster
    >>> g = OpGraph.build(["p", "f0", "f1", "u"], [(0, 1), (0, 2), (1, 3), (2, 3)], microbatch=[-1, 0, 1, -1],
    ...                   colocation=[0, -1, -1, 0], persistent_bytes=[8, 0, 0, 0])
    >>> data_parallel_placement(g, star_cluster(("cpu", "gpu", "gpu"))).tolist()
    [1, 1, 2, 1]
    """
    from postplace.cluster.placement import colocation_representative
    from postplace.placers._common import allowed_matrix

    _num_microbatches(graph, "data-parallel")
    check_graph(graph, cluster, "data-parallel", allowed)
    replicas = _replica_gpus(graph, cluster, gpus, allowed)
    cpus = devices_of_kind(cluster, "cpu")
    ok = allowed_matrix(graph, cluster, allowed)
    rep = colocation_representative(graph)
    mb = graph.microbatch
    dev = np.full(graph.num_ops, -1, dtype=np.int64)
    unit_mb: dict[int, int] = {}
    for i in range(graph.num_ops):  # a unit with any micro-batch op goes with the first such op
        if mb[i] >= 0:
            unit_mb.setdefault(int(rep[i]), int(mb[i]))
    load = dict.fromkeys(replicas, 0.0)
    unit_dev: dict[int, int] = {}
    for i in range(graph.num_ops):
        r = int(rep[i])
        if r not in unit_dev:
            if not ok[r, replicas].any() and any(ok[r, c] for c in cpus):  # CPU-only ops: the first CPU
                d = next(c for c in cpus if ok[r, c])
            elif r in unit_mb:
                d = replicas[unit_mb[r] % len(replicas)]
            else:
                d = min(replicas, key=lambda g: (load[g], g))
            if not ok[r, d]:  # pins, exclusions, kinds: the first replica GPU it may use, else any device
                among = [g for g in replicas if ok[r, g]]
                d = among[0] if among else int(np.flatnonzero(ok[r])[0])
            unit_dev[r] = d
        dev[i] = unit_dev[r]
        if r not in unit_mb and dev[i] in load:
            load[dev[i]] += float(graph.persistent_bytes[i])
    return dev


@dataclass(frozen=True, eq=False)
class DataParallelPlan:
    """Data parallelism over ``gpus``, simulated as a placement (:func:`simulate_data_parallel`).

    Parameters
    ----------
    placement : numpy.ndarray
        Op-level device ids (the sharded placement the simulator timed).
    step_time : float
        Its simulated step time (seconds), or ``inf`` where ``oom`` (a plan that does not fit is never
        a result).
    step_time_if_it_fit : float
        The simulated step time either way.
    peak_mem : numpy.ndarray
        ``[k]``: bytes per replica GPU (``gpus[k]``) with the whole state replicated.
    capacity : numpy.ndarray
        ``[k]``: each replica GPU's capacity.
    sharded_peak_mem : numpy.ndarray
        ``[D]``: the simulator's own peak per device of the sharded placement.
    oom : bool
        Some replica GPU (or another device) is above its capacity.
    gpus : tuple of str
        The replica GPUs.
    microbatches : int
        m, the micro-batches the step was traced as.
    note : str
        The assumptions, in one line.
    kind : str
        ``"data-parallel (simulated placement)"``.
    """

    placement: np.ndarray
    step_time: float
    step_time_if_it_fit: float
    peak_mem: np.ndarray
    capacity: np.ndarray
    sharded_peak_mem: np.ndarray
    oom: bool
    gpus: tuple[str, ...]
    microbatches: int
    note: str
    kind: str = "data-parallel (simulated placement)"


def replicated_peak(graph: OpGraph, placement: np.ndarray, sharded_peak: np.ndarray, replicas) -> np.ndarray:
    """Per device of ``replicas``: its simulated peak under ``placement`` (``sharded_peak``, ``[D]``) plus
    the persistent bytes of the shared ops (parameters, optimizer state, buffers: micro-batch -1)
    placed elsewhere: what it holds when every replica keeps the whole state, as real data parallelism
    does (:func:`simulate_data_parallel`)."""
    placement = np.asarray(placement)
    shared = (np.asarray(graph.microbatch) < 0) & (graph.persistent_bytes > 0)
    total = float(graph.persistent_bytes[shared].sum())
    return np.array(
        [sharded_peak[g] + total - float(graph.persistent_bytes[shared & (placement == g)].sum()) for g in replicas],
        dtype=np.float64,
    )


def simulate_data_parallel(
    graph: OpGraph,
    cluster: Cluster,
    *,
    cost_model: CostModel | None = None,
    allowed: np.ndarray | None = None,
    gpus: list | None = None,
) -> DataParallelPlan:
    """Data parallelism over the GPUs for a step traced as m micro-batches, timed by the simulator.

    The replica GPUs are ``gpus`` (default every GPU; those no op may use under ``allowed`` left out),
    at most m of them (a GPU with no micro-batch would not be a replica). The placement is
    :func:`data_parallel_placement`'s and the step time is the simulator's step time of it: micro-batch
    j on GPU ``j % k``, the parameters sent from their owner to the other replicas, each gradient sent
    to its parameter's owner, summed and applied there (a sharded parameter server moving the same
    bytes as a ring all-reduce, in the simulator's network model).

    Memory is that of real data parallelism, which replicates parameters, gradients and optimizer state
    on every GPU, while the sharded placement only holds each GPU's share. Per replica GPU g:
    ``simulated peak of g + (persistent bytes of all shared ops - those placed on g)``: the whole
    persistent state (parameters, optimizer state, buffers) on every replica. The simulated peak already
    holds the parameter copies g receives from the other owners; they stand in for DDP's full gradient
    buffer, so the figure is below real data parallelism's by at most g's own share of the parameter
    bytes (its own parameters' gradient buffer), never above it. ``oom`` when any replica GPU (or the
    simulator on any other device) is above capacity; then ``step_time`` is ``inf`` and the simulated
    time is kept in ``step_time_if_it_fit`` only.

    Parameters
    ----------
    graph, cluster : OpGraph, Cluster
    cost_model : CostModel, optional
        Passed to the simulator (default: its roofline model).
    allowed : numpy.ndarray, optional
        ``[n_ops, D]`` bool pins and exclusions (see :func:`data_parallel_placement`).
    gpus : list of str or int, optional
        The replica GPUs, in order.

    Returns
    -------
    DataParallelPlan

    Raises
    ------
    PlacementError
        As :func:`data_parallel_placement`; when a colocation set holds ops of two micro-batches
        (micro-batch colocation ``module``: data parallelism is no placement of that graph); or when
        the simulator rejects the placement.

    Examples
    --------
    >>> from postplace.graph import OpGraph
    >>> from postplace.testing import ConstantCostModel, star_cluster
    >>> g = OpGraph.build(["p", "f0", "f1", "u"], [(0, 1), (0, 2), (1, 3), (2, 3)], microbatch=[-1, 0, 1, -1],
    ...                   colocation=[0, -1, -1, 0], persistent_bytes=[8, 0, 0, 0])
    >>> plan = simulate_data_parallel(g, star_cluster(("gpu", "gpu")), cost_model=ConstantCostModel(1.0))
    >>> plan.step_time   # p, then f0 on gpu0 beside f1 on gpu1, then u: 1 + 1 + 1
    3.0
    >>> plan.sharded_peak_mem.tolist(), plan.peak_mem.tolist()   # gpu1 holds its own copy of p when replicated
    ([8.0, 0.0], [8.0, 8.0])
    """
    from postplace.sim import Simulator

    m = _num_microbatches(graph, "data-parallel")
    mb = np.asarray(graph.microbatch)
    for members in graph.colocation_sets:
        own = np.unique(mb[members][mb[members] >= 0])
        if own.size > 1:
            raise PlacementError(
                f"data-parallel: graph '{graph.name}' colocates micro-batches {own[0]} and {own[1]} "
                f"(op '{graph.names[members[0]]}' and its set; colocation mode 'module'?), so micro-batch j cannot "
                "run on GPU j; trace the step with micro-batch colocation 'none'"
            )
    ids = _replica_gpus(graph, cluster, gpus, allowed)[:m]
    placement = data_parallel_placement(graph, cluster, gpus=ids, allowed=allowed)
    res = Simulator(graph, cluster, cost_model=cost_model).evaluate_ops(placement[None])
    if res.failed[0]:
        raise PlacementError(f"data-parallel: the simulator rejected the placement: {res.reasons[0]}")
    sharded = np.asarray(res.peak_mem[0], dtype=np.float64)
    peak = replicated_peak(graph, placement, sharded, ids)
    cap = np.asarray(cluster.capacity, dtype=np.float64)
    others = np.ones(cluster.num_devices, dtype=bool)
    others[ids] = False
    oom = bool(np.any(peak > cap[ids]) or np.any(sharded[others] > cap[others]))
    simulated = float(res.step_time[0])
    note = (
        f"simulated placement of the {m}-micro-batch step on {len(ids)} GPU(s) (micro-batch j on GPU j mod "
        f"{len(ids)}, parameters sharded, gradients sent to their owner); memory: parameters, gradients and "
        "optimizer state replicated on every GPU"
    )
    return DataParallelPlan(
        placement=placement,
        step_time=float("inf") if oom else simulated,
        step_time_if_it_fit=simulated,
        peak_mem=peak,
        capacity=cap[ids],
        sharded_peak_mem=sharded,
        oom=oom,
        gpus=tuple(cluster.device_names[g] for g in ids),
        microbatches=m,
        note=note,
    )
