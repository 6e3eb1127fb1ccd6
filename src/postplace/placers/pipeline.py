"""A GPipe-style pipeline: the layers cut into contiguous stages, one device per stage, balanced by time.

On a step traced as m micro-batches every micro-batch's copy of a layer goes to that layer's stage, so
the simulator overlaps micro-batch j + 1's forward on one stage with micro-batch j's on the next (the
order among ready ops is the simulator's: program order, so a stage runs micro-batch j's backward as
soon as it is ready rather than after every forward, as 1F1B schedules do). On an m = 1 graph it is
a plain layer-wise model-parallel split.

Layers, their order, and their cost (each one a simplification, stated so results can be read with it):

* A *layer* is a module path (``graph.module``). The unit placed is a colocation set (or a free op):
  it belongs to the layer of its first forward op that carries a module, else of its first op that
  carries one (a parameter with its gradient sums and update belongs to its module). On graphs
  without module paths (imported workloads) every unit with a forward op is a layer of its own. A
  unit with neither follows its nearest producer (the latest in program order), else its first
  consumer, else the first layer.
* Layers are ordered by their first forward op that has an input (so a loss whose targets are fed at
  the start of the program still sits after the model's last layer), else their first forward op,
  else their first op.
* A layer's time on a device = the sum of its ops' times there (all micro-batches; forward, backward,
  update; an op that may not run on that kind of device counts 0, since it goes elsewhere).
  Transfers are not counted: stages are balanced by compute only.
* The cut minimises the largest stage time (stage s on ``devices[s]``, so a faster GPU takes more
  layers), exactly, by dynamic programming over the layer order (``O(L^2 S)`` for L layers and S
  stages); among cuts with that bottleneck, the one with the smallest sum of squared stage times
  (the most even). Stages may be empty when that is optimal.
* Memory: each stage's bound must fit its device: ``static`` graphs, the sum of footprints (the
  simulator's own figure); ``live`` graphs, persistent bytes + the outputs of the stage's forward ops
  (every micro-batch's activations held at once), and, stricter, persistent bytes + every output of
  the stage. The cuts found without a bound and under each bound are simulated and the first that
  fits (in that order: the most balanced first) is returned; when none fits, the time-balanced cut
  is returned and the simulator reports it OOM.
* Placement: a unit goes on its stage's device; where it may not (CPU-only ops, pins, exclusions), on
  the nearest stage's device it may use, else on the first device it may use.
"""

from __future__ import annotations

import numpy as np

from postplace.cluster import Cluster
from postplace.cost import CostModel, RooflineCostModel
from postplace.graph import PHASES, OpGraph
from postplace.placers._common import (
    PlacementError,
    allowed_matrix,
    check_graph,
    constrained_devices,
    devices_of_kind,
    units,
)
from postplace.placers.registry import register_placer

__all__ = ["pipeline_layers", "place_pipeline", "stage_counts"]

_BLOCK = 256  # columns of the dynamic programme's (i, j) table computed at once


def pipeline_layers(graph: OpGraph) -> tuple[np.ndarray, list[str]]:
    """``(layer_of_op, names)``: each op's layer index in pipeline order, and each layer's name
    (a module path, or ``unit:OP`` for a layer that is a unit of a graph without module paths)."""
    n = graph.num_ops
    unit_of_op, members = units(graph)
    if n == 0:
        return np.zeros(0, dtype=np.int64), []
    fwd = graph.phase == PHASES.index("forward")
    has_input = np.diff(graph.in_ptr) > 0
    mod = graph.module
    first_any: dict[str, int] = {}
    first_fwd: dict[str, int] = {}
    first_fwd_in: dict[str, int] = {}
    for i in range(n):
        m = mod[i]
        if m:
            first_any.setdefault(m, i)
            if fwd[i]:
                first_fwd.setdefault(m, i)
                if has_input[i]:
                    first_fwd_in.setdefault(m, i)
    keys: dict[tuple, int] = {}  # layer key -> position (an op index) in program order
    unit_key: list[tuple | None] = []
    for u, mem in enumerate(members):
        with_mod = [int(i) for i in mem if mod[i]]
        if with_mod:
            f = [i for i in with_mod if fwd[i]]
            m = mod[(f or with_mod)[0]]
            key = ("m", m)
            keys[key] = first_fwd_in.get(m, first_fwd.get(m, first_any[m]))
        elif fwd[mem].any():
            key = ("u", u)
            f = mem[fwd[mem]]
            f_in = f[has_input[f]]
            keys[key] = int((f_in if f_in.size else f)[0])
        else:
            key = None
        unit_key.append(key)
    order = sorted(keys, key=lambda k: keys[k])
    index = {k: li for li, k in enumerate(order)}
    layer_u = np.array([index[k] if k is not None else -1 for k in unit_key], dtype=np.int64)
    if (layer_u < 0).any():  # units with no module and no forward op: nearest producer, else first consumer
        for i in range(n):
            u = unit_of_op[i]
            if layer_u[u] >= 0:
                continue
            srcs = graph.edge_src[graph.in_edges[graph.in_ptr[i] : graph.in_ptr[i + 1]]]
            srcs = [int(s) for s in srcs if layer_u[unit_of_op[s]] >= 0]
            if srcs:
                layer_u[u] = layer_u[unit_of_op[max(srcs)]]
        for i in range(n - 1, -1, -1):
            u = unit_of_op[i]
            if layer_u[u] >= 0:
                continue
            dsts = graph.edge_dst[graph.out_ptr[i] : graph.out_ptr[i + 1]]
            dsts = [int(d) for d in dsts if layer_u[unit_of_op[d]] >= 0]
            if dsts:
                layer_u[u] = layer_u[unit_of_op[min(dsts)]]
        if not order:
            order = [("u", -1)]
        layer_u[layer_u < 0] = 0
    names = [
        k[1] if k[0] == "m" else (f"unit:{graph.names[members[k[1]][0]]}" if k[1] >= 0 else "(all)") for k in order
    ]
    return layer_u[unit_of_op], names


def _stage_devices(graph: OpGraph, cluster: Cluster, devices, allowed) -> list[int]:
    if devices is not None:
        return [cluster.device_index(d) if isinstance(d, str) else int(d) for d in devices]
    gpus = devices_of_kind(cluster, "gpu")
    return constrained_devices(gpus if gpus else list(range(cluster.num_devices)), allowed)


def _partition(T: np.ndarray, mem: np.ndarray | None, cap: np.ndarray) -> np.ndarray | None:
    """Contiguous cut of L layers into S stages (module docstring): ``stage_of_layer``, or None when
    no cut fits ``mem`` (``[L, S]`` bytes; None = no bound) under ``cap`` (``[S]``)."""
    L, S = T.shape
    P = np.vstack([np.zeros((1, S)), np.cumsum(T, axis=0)])  # [L + 1, S]
    M = None if mem is None else np.vstack([np.zeros((1, S)), np.cumsum(mem, axis=0)])
    idx = np.arange(L + 1)

    def run(prev_value, combine, limit):
        """One DP over stages; ``combine(prev, cost)``; stage costs above ``limit`` are not allowed."""
        best = np.full((S, L + 1), np.inf)
        arg = np.zeros((S, L + 1), dtype=np.int64)
        prev = prev_value
        for s in range(S):
            cur = np.full(L + 1, np.inf)
            for j0 in range(0, L + 1, _BLOCK):
                j = idx[j0 : j0 + _BLOCK]
                cost = P[j, s][None, :] - P[:, s][:, None]  # [i, j]
                ok = (idx[:, None] <= j[None, :]) & (cost <= limit)
                if M is not None:
                    ok &= (M[j, s][None, :] - M[:, s][:, None]) <= cap[s]
                val = np.where(ok, combine(prev[:, None], np.maximum(cost, 0.0)), np.inf)
                a = np.argmin(val, axis=0)
                arg[s, j] = a
                cur[j] = val[a, np.arange(j.size)]
            best[s] = cur
            prev = cur
        return best, arg

    start = np.full(L + 1, np.inf)
    start[0] = 0.0
    best, _ = run(start, np.maximum, np.inf)
    bottleneck = best[S - 1, L]
    if not np.isfinite(bottleneck):
        return None
    limit = bottleneck * (1 + 1e-9) + 1e-300
    best, arg = run(start, lambda p, c: p + c * c, limit)
    if not np.isfinite(best[S - 1, L]):  # rounding: keep the bottleneck cut
        best, arg = run(start, np.maximum, np.inf)
    stage = np.zeros(L, dtype=np.int64)
    j = L
    for s in range(S - 1, -1, -1):
        i = int(arg[s, j])
        stage[i:j] = s
        j = i
    return stage


@register_placer("pipeline", candidate=True, rank=20)
def place_pipeline(
    graph: OpGraph,
    cluster: Cluster,
    *,
    stages: int | None = None,
    devices: list | None = None,
    cost_model: CostModel | None = None,
    seed: int = 0,
    allowed: np.ndarray | None = None,
) -> np.ndarray:
    """A GPipe-style pipeline: layers in order, cut into contiguous stages balanced by time and memory.

    Every micro-batch's copy of a layer, and the layer's parameters, gradient sums and update, go to
    the layer's stage; the details (what a layer is, the balance, the memory bounds) are in the module
    docstring.

    Parameters
    ----------
    graph, cluster : OpGraph, Cluster
    stages : int, optional
        Number of stages (default: the fastest in the simulator of 2, 4, 8... stages below the number
        of ``devices`` and one stage per device, fitting ones first: :func:`stage_counts`).
    devices : list of str or int, optional
        The stages' devices, stage s on ``devices[s]`` (default: the GPUs that the pins and exclusions
        leave usable, in device order, else every device); with ``stages`` < their number, the first
        ``stages`` of them.
    cost_model : CostModel, optional
        Op times for the balance, and the simulator's model for the memory check (default
        :class:`postplace.cost.RooflineCostModel`).
    seed : int
        Unused (deterministic).
    allowed : numpy.ndarray, optional
        ``[n_ops, D]`` bool: the user's constraints (pins, exclusions); an op only goes where allowed.

    Returns
    -------
    numpy.ndarray
        int64 device id per op. May be OOM in the simulator when no cut fits (module docstring).

    Raises
    ------
    PlacementError
        When ``stages`` is below 1 or above the number of devices, or an op may use no device.

    References
    ----------
    Y. Huang et al., "GPipe: Efficient Training of Giant Neural Networks using Pipeline Parallelism",
    NeurIPS 2019 (stages balanced by a cost estimate); D. Narayanan et al., "PipeDream: Generalized
    Pipeline Parallelism for DNN Training", SOSP 2019 (the exact linear-partition programme).

    Examples
    --------
    >>> from postplace.graph import OpGraph
    >>> from postplace.testing import ConstantCostModel, star_cluster
    >>> g = OpGraph.build(list("abcd"), [(0, 1), (1, 2), (2, 3)], module=["l0", "l1", "l2", "l3"])
    >>> place_pipeline(g, star_cluster(("cpu", "gpu", "gpu")), cost_model=ConstantCostModel(1.0)).tolist()
    [1, 1, 2, 2]
    """
    check_graph(graph, cluster, "pipeline", allowed)
    devs = _stage_devices(graph, cluster, devices, allowed)
    cost_model = cost_model or RooflineCostModel()
    if stages is not None or len(devs) <= 2:
        return _pipeline(graph, cluster, len(devs) if stages is None else stages, devs, cost_model, allowed)
    options = [_pipeline(graph, cluster, s, devs, cost_model, allowed) for s in stage_counts(len(devs))]
    from postplace.sim import Simulator

    res = Simulator(graph, cluster, cost_model=cost_model).evaluate_ops(np.stack(options))
    score = np.where(res.feasible, res.step_time, np.inf)
    return options[int(np.argmin(score))] if np.isfinite(score).any() else options[-1]


def stage_counts(devices: int) -> list[int]:
    """The stage counts ``place_pipeline`` tries by default: 2, 4, 8... below ``devices``, and ``devices``."""
    return [s for s in (2, 4, 8, 16, 32, 64) if s < devices] + [devices]


def _pipeline(graph, cluster, stages, devs, cost_model, allowed) -> np.ndarray:
    n = graph.num_ops
    S = int(stages)
    if S < 1:
        raise PlacementError(f"pipeline: stages must be at least 1, not {stages}")
    if S > len(devs):
        raise PlacementError(
            f"pipeline: {S} stages need {S} devices; cluster '{cluster.name}' offers "
            f"{len(devs)} ({', '.join(cluster.device_names[d] for d in devs) or 'none'})"
        )
    devs = devs[:S]
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    table = np.array(cost_model.op_times(graph, cluster).table, dtype=np.float64)
    ok = allowed_matrix(graph, cluster, allowed)
    kind_ok = allowed_matrix(graph, cluster)
    layer_of_op, _ = pipeline_layers(graph)
    L = int(layer_of_op.max()) + 1
    runs_there = kind_ok[:, devs]  # [n, S]: the op would run on the stage's device (kinds allow it)
    times = np.where(runs_there & np.isfinite(table[:, devs]), table[:, devs], 0.0)
    T = np.stack([np.bincount(layer_of_op, weights=times[:, s], minlength=L) for s in range(S)], axis=1)
    cap = np.asarray(cluster.capacity, dtype=np.float64)[devs]

    def per_stage(b):
        return np.stack(
            [np.bincount(layer_of_op, weights=np.where(runs_there[:, s], b, 0.0), minlength=L) for s in range(S)],
            axis=1,
        )

    if graph.memory_mode == "static":
        bounds = [per_stage(graph.persistent_bytes)]
    else:
        out = np.where(graph.inplace, 0.0, graph.output_bytes)
        fwd = graph.phase == PHASES.index("forward")
        bounds = [per_stage(graph.persistent_bytes + np.where(fwd, out, 0.0)), per_stage(graph.persistent_bytes + out)]
    cuts: list[np.ndarray] = []
    for mem in [None, *bounds]:
        stage = _partition(T, mem, cap)
        if stage is not None and not any(np.array_equal(stage, c) for c in cuts):
            cuts.append(stage)
    placements = [_place_units(graph, cluster, devs, c[layer_of_op], ok) for c in cuts]
    if len(placements) == 1:
        return placements[0]
    from postplace.sim import Simulator

    res = Simulator(graph, cluster, cost_model=cost_model).evaluate_ops(np.stack(placements))
    fits = np.flatnonzero(res.feasible)
    return placements[int(fits[0])] if fits.size else placements[0]


def _place_units(
    graph: OpGraph, cluster: Cluster, devs: list[int], stage_of_op: np.ndarray, ok: np.ndarray
) -> np.ndarray:
    """Each unit on its stage's device, or the nearest stage's device it may use, else the first it may use."""
    _, members = units(graph)
    dev = np.empty(graph.num_ops, dtype=np.int64)
    S = len(devs)
    for mem in members:
        r = int(mem[0])
        s = int(stage_of_op[r])
        d = devs[s]
        if not ok[r, d]:
            near = sorted(range(S), key=lambda t: (abs(t - s), t))
            d = next((devs[t] for t in near if ok[r, devs[t]]), None)
            if d is None:
                d = int(np.flatnonzero(ok[r])[0])
        dev[mem] = d
    return dev
