"""A placement problem: a graph on a cluster, grouped, with pins and exclusions, ready for search."""

from __future__ import annotations

import re
from dataclasses import dataclass, replace

import numpy as np

from postplace.cluster import Cluster
from postplace.cluster.placement import check_kinds, effective_kinds
from postplace.cost import CostModel, RooflineCostModel, priced_on
from postplace.errors import PostplaceError
from postplace.graph import OpGraph
from postplace.graph.grouping import Grouping, group_ops, layer_groups
from postplace.graph.microbatch_names import copied_name
from postplace.search.layers import layer_space
from postplace.search.starts import comparable_devices
from postplace.search.strategy import SearchSpace
from postplace.sim import Simulator


@dataclass(frozen=True, eq=False)
class Problem:
    """A graph on a cluster, grouped into placement units, with its simulator and search space.

    What :func:`make_problem` returns and a search runs on.

    Parameters
    ----------
    graph : OpGraph
    cluster : Cluster
    grouping : postplace.graph.grouping.Grouping
        Each op's unit (``group_of_op``); ``expand`` / ``collapse`` turn unit-level placements into
        op-level ones and back.
    simulator : postplace.sim.Simulator
        Over the groups (``group_of_op`` set).
    space : SearchSpace
        What a strategy may know: allowed devices per unit, unit times, the failing score, memory.
    op_allowed : numpy.ndarray, optional
        ``bool[n_ops, D]``: op i may go on device d (kinds, pins and exclusions).
    """

    graph: OpGraph
    cluster: Cluster
    grouping: Grouping
    simulator: Simulator
    space: SearchSpace
    op_allowed: np.ndarray | None = None
    """``[n_ops, D]`` bool: op i may go on device d (kinds, pins and exclusions): what every candidate
    placement, the search's or a one-shot placer's, must respect."""


def pin_names(graph: OpGraph) -> list[str]:
    """The names pins match: an op's own name, except that a micro-batch copy (``mb3_conv``) answers to
    the name of the op it copies (``conv``) too, so a pattern means the same at every micro-batch count."""
    mb = graph.microbatch
    if mb is None:
        return list(graph.names)
    return [copied_name(n) if k >= 0 else n for n, k in zip(graph.names, mb, strict=True)]


def parse_pins(specs: list[str], graph: OpGraph, cluster: Cluster) -> np.ndarray:
    """``REGEX=DEVICE`` specs -> device id per op (-1 where unpinned); the first matching spec wins.
    A pattern that names an op names all its micro-batch copies (:func:`pin_names`)."""
    pin = np.full(graph.num_ops, -1, dtype=np.int64)
    names = pin_names(graph)
    for spec in specs:
        if "=" not in spec:
            raise PostplaceError(f"--pin '{spec}': write it as REGEX=DEVICE, e.g. --pin 'embedding.*=cpu'")
        pattern, device = spec.rsplit("=", 1)
        try:
            rx = re.compile(pattern)
        except re.error as exc:
            raise PostplaceError(f"--pin '{spec}': bad regular expression ({exc})") from None
        d = cluster.device_index(device)
        hits = [
            i
            for i, (name, own) in enumerate(zip(names, graph.names, strict=True))
            if pin[i] < 0 and (rx.search(name) or rx.search(own))
        ]
        if not hits:
            raise PostplaceError(f"--pin '{spec}': no op name matches '{pattern}'")
        pin[hits] = d
    return pin


def make_problem(
    graph: OpGraph,
    cluster: Cluster,
    *,
    groups: int | None = 256,
    pins: list[str] = (),
    exclude: list[str] = (),
    cost_model: CostModel | None = None,
    seed: int = 0,
    layers: bool = True,
) -> Problem:
    """Group the graph and derive the search space (allowed devices per group, times, failing score).

    Ops of different effective kinds or pins never share a group, and a colocation set follows any
    pin on one of its members.

    Parameters
    ----------
    graph : OpGraph
    cluster : Cluster
    groups : int or None
        About how many units to place (METIS over colocation units, weighted by op time); None: one
        unit per colocation set or unconstrained op.
    pins : sequence of str
        ``"REGEX=DEVICE"``: ops whose name matches go on DEVICE (the first matching pin wins; a
        pattern also names every micro-batch copy of an op).
    exclude : sequence of str
        Devices no op may use.
    cost_model : CostModel, optional
        Default :class:`postplace.cost.RooflineCostModel`.
    seed : int
        The grouping's random seed.
    layers : bool
        On a micro-batched step, group by layer (:func:`postplace.graph.grouping.layer_groups`: about
        ``groups`` layers, each split into its micro-batches' units and its shared ops' unit) and give
        the space its stripes (``space.layers``), so data parallelism and pipelines are one decision
        per layer. False: group the step like any graph.

    Returns
    -------
    Problem

    Raises
    ------
    PostplaceError
        For a malformed pin, a pattern no op matches, an unknown device, colocated ops pinned apart,
        excluding every device, an op left with no device (or one that may use no device of the cluster),
        or a graph with no op.

    Examples
    --------
    >>> from postplace.cluster import load_cluster
    >>> from postplace.graph import OpGraph
    >>> from postplace.search import make_problem
    >>> g = OpGraph.build(["a", "b", "c"], [(0, 1, 1e6), (1, 2, 1e6)], flops=[1e9, 4e9, 1e9],
    ...                   allowed_kinds=["cpu", "gpu", "gpu"])
    >>> p = make_problem(g, load_cluster("k80x2"), groups=None, pins=["^c$=gpu1"])
    >>> p.space.device_names, p.space.allowed.astype(int).tolist()
    (('cpu', 'gpu0', 'gpu1'), [[1, 0, 0], [0, 1, 1], [0, 0, 1]])
    """
    if not graph.num_ops:  # nothing to group or place: every later step would reduce over no op
        raise PostplaceError(
            f"graph '{graph.name}' has no op: there is nothing to place; give a graph file or model "
            "with at least one op"
        )
    check_kinds(graph, cluster)  # before the op times: a row of no runnable device is all NaN
    pin = parse_pins(list(pins), graph, cluster)
    excluded = {cluster.device_index(d) for d in exclude}
    if len(excluded) == cluster.num_devices:
        raise PostplaceError("--exclude removes every device; keep at least one")
    # excluded GPUs run nothing: a precision they lack is no error (bf16 on mixed's A100s, its V100s excluded)
    cost_model = priced_on(cost_model, cluster, [d for d in range(cluster.num_devices) if d not in excluded])
    # a colocation set follows any pin on one of its members
    for members in graph.colocation_sets:
        pinned = set(pin[members][pin[members] >= 0].tolist())
        if len(pinned) > 1:
            raise PostplaceError(
                f"--pin puts colocated ops ('{graph.names[members[0]]}' and its set) on different devices"
            )
        if pinned:
            pin[members] = pinned.pop()
    kinds = effective_kinds(graph).astype(np.int64)
    classes = kinds * (cluster.num_devices + 1) + (pin + 1)
    times = (cost_model or RooflineCostModel()).op_times(graph, cluster).table
    op_weight = np.where(np.isfinite(times), times, np.nan)
    op_weight = np.nan_to_num(np.nanmin(op_weight, axis=1), nan=0.0) + 1e-9
    lg = layer_groups(graph, groups, op_weight=op_weight, classes=classes, seed=seed) if layers else None
    grouping = (
        lg.grouping if lg is not None else group_ops(graph, groups, op_weight=op_weight, classes=classes, seed=seed)
    )
    G, D = grouping.num_groups, cluster.num_devices
    gop = grouping.group_of_op
    allowed = np.ones((G, D), dtype=bool)
    op_allowed = np.ones((graph.num_ops, D), dtype=bool)
    for d in range(D):
        ok = (kinds & cluster.kind_bits[d]) != 0
        if d in excluded:
            ok[:] = False
        ok &= (pin < 0) | (pin == d)
        op_allowed[:, d] = ok
        allowed[:, d] = np.bincount(gop, weights=~ok, minlength=G) == 0
    empty = np.flatnonzero(~allowed.any(axis=1))
    if empty.size:
        op = graph.names[np.flatnonzero(gop == empty[0])[0]]
        raise PostplaceError(f"op '{op}' has no device left after --pin/--exclude and its allowed kinds")
    unit_time = np.zeros((G, D))
    for d in range(D):
        unit_time[:, d] = np.bincount(gop, weights=np.where(np.isfinite(times[:, d]), times[:, d], 0.0), minlength=G)
    unit_time = np.where(allowed, unit_time, np.inf)
    su, du = gop[graph.edge_src], gop[graph.edge_dst]
    cross = su != du
    sim = Simulator(graph, cluster, cost_model=cost_model, group_of_op=gop)
    unit_bytes = _unit_bytes(graph, cluster, sim, times, kinds, gop, G)
    first = np.full(G, graph.num_ops, dtype=np.int64)
    np.minimum.at(first, gop, np.arange(graph.num_ops))
    position = first / max(graph.num_ops - 1, 1)
    space = SearchSpace(
        allowed=allowed,
        failure_step_time=sim.failure_step_time,
        unit_time=unit_time,
        device_names=cluster.device_names,
        device_kinds=tuple(dv.kind for dv in cluster.devices),
        features=None,
        edges=(su[cross], du[cross], graph.edge_bytes[cross]),
        unit_bytes=unit_bytes,
        capacity=np.asarray(cluster.capacity, dtype=np.float64).copy(),
        unit_position=position,
    )
    if lg is not None:
        stripes = layer_space(
            lg.layer_of_unit,
            lg.slot_of_unit,
            lg.microbatches,
            allowed,
            unit_time,
            comparable_devices(space),
            cluster.device_names,
            unit_bytes,
        )
        space = replace(space, layers=stripes)
    return Problem(graph, cluster, grouping, sim, space, op_allowed)


def _unit_bytes(graph: OpGraph, cluster: Cluster, sim: Simulator, times, kinds, gop, G: int) -> np.ndarray:
    """Bytes each unit adds to its device: its persistent bytes plus its outputs scaled so that, with
    every op on the fastest device (the others on the first device they may use), the units there sum
    to that device's simulated peak. Exact for ``static`` graphs (footprints only); for ``live`` ones it
    spreads the activations live at the peak over the units in proportion to their output bytes."""
    persistent = np.asarray(graph.persistent_bytes, dtype=np.float64)
    if graph.memory_mode != "live":
        return np.bincount(gop, weights=persistent, minlength=G)
    out = np.where(graph.inplace, 0.0, graph.output_bytes).astype(np.float64)
    ok = (kinds[:, None] & cluster.kind_bits[None, :]) != 0
    common = ok.all(axis=1)
    finite = np.where(np.isfinite(times), times, 0.0)
    if common.any():  # a device that cannot run an op every kind may run (no units for its precision) is never the
        # fastest, though its infinite times would read as free here
        total = np.where(np.isfinite(times[common]).all(axis=0), finite[common].sum(axis=0), np.inf)
    else:
        total = finite.sum(axis=0)
    fastest = int(np.argmin(total))
    dev = np.where(ok[:, fastest], fastest, np.argmax(ok, axis=1)).astype(np.int64)
    peak = float(sim.evaluate_ops(dev[None]).peak_mem[0, fastest])
    on = dev == fastest
    scale = max(peak - persistent[on].sum(), 0.0) / out[on].sum() if out[on].sum() > 0 else 0.0
    return np.bincount(gop, weights=persistent + scale * out, minlength=G)
