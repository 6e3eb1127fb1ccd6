"""The Simulator evaluator: many placements per call through the compiled kernel.

See :mod:`postplace.sim.reference` for the exact semantics; this module only prepares arrays, checks
placements, and turns kernel outputs into an :class:`EvalResult`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from postplace.cluster import Cluster
from postplace.cluster.placement import colocation_representative, invalid_reason
from postplace.cost import CostModel
from postplace.graph import COLLECTIVE_KINDS, OpGraph
from postplace.sim import bounds, kernel
from postplace.sim.problem import SimProblem
from postplace.sim.trace import Schedule


@dataclass(frozen=True, eq=False)
class EvalResult:
    """Results for ``n`` placements on ``D`` devices, as every evaluator returns them.

    It carries the name of the evaluator, so no number hides whether it was simulated or measured.

    Parameters
    ----------
    step_time : numpy.ndarray
        ``float64[n]``: seconds per step; inf where ``failed``.
    peak_mem : numpy.ndarray
        ``float64[n, D]``: each device's peak memory in bytes.
    oom : numpy.ndarray
        ``bool[n]``: some device's peak exceeds its capacity. The step time is still reported, and
        such a placement must never be called best.
    failed : numpy.ndarray
        ``bool[n]``: the placement could not be evaluated (invalid, or the run failed).
    reasons : list of str or None
        Why each placement failed; None where it did not fail.
    evaluator : str
        The evaluator's name (``"simulator"``, ``"torch"``...).
    busy : numpy.ndarray, optional
        ``float64[n, D]``: seconds each device computes (the simulator's).
    bytes_moved : numpy.ndarray, optional
        ``float64[n]``: bytes transferred between devices (the simulator's: point-to-point transfers plus
        every collective's bytes on the wire).
    extra : dict
        Anything else an evaluator reports. The simulator puts ``"collective_bytes"`` there for a graph
        with collectives: ``{kind: float64[n]}``, the wire bytes of the collectives of each kind present.

    Attributes
    ----------
    feasible : numpy.ndarray
        ``bool[n]``: neither OOM nor failed.
    """

    step_time: np.ndarray
    peak_mem: np.ndarray
    oom: np.ndarray
    failed: np.ndarray
    reasons: list[str | None]
    evaluator: str
    busy: np.ndarray | None = None
    bytes_moved: np.ndarray | None = None
    extra: dict = field(default_factory=dict)

    @property
    def feasible(self) -> np.ndarray:
        """``bool[n]``: neither OOM nor failed."""
        return ~self.oom & ~self.failed


def expand_placements(placements: np.ndarray, group_of_op: np.ndarray | None, num_ops: int) -> np.ndarray:
    """Op-level device ids ``[n, num_ops]`` from placements over groups (or over ops without a grouping)."""
    placements = np.atleast_2d(np.asarray(placements, dtype=np.int64))
    if group_of_op is not None:
        return placements[:, group_of_op]
    if placements.shape[1] != num_ops:
        raise ValueError(f"placements have {placements.shape[1]} columns for {num_ops} ops")
    return placements


class Evaluator(Protocol):
    """What the search runner drives: anything with a ``name`` and an ``evaluate`` method.

    :class:`Simulator` is the default; :class:`postplace.runtime.TorchEvaluator` measures real steps
    and :class:`postplace.distributed.RayEvaluator` spreads either over Ray actors.

    Attributes
    ----------
    name : str
        Recorded with every result (``"simulator"``, ``"torch"``...).
    """

    name: str

    def evaluate(self, placements: np.ndarray) -> EvalResult:
        """Evaluate a batch of placements.

        Parameters
        ----------
        placements : numpy.ndarray
            ``int[n, units]``: a device id per unit (group or op) for each of ``n`` placements.

        Returns
        -------
        EvalResult
        """
        ...


class Simulator:
    """Evaluates placements of ``graph`` on ``cluster`` by simulation.

    Placements that put an op on a kind of device it may not use, split a colocation set, name a
    device that does not exist or put two members of one collective on one device come back ``failed``
    with the reason; the others are simulated.

    Parameters
    ----------
    graph : OpGraph
    cluster : Cluster
    cost_model : CostModel, optional
        Default :class:`postplace.cost.RooflineCostModel`.
    group_of_op : numpy.ndarray, optional
        An int array over ops (the group of each op): placements are then arrays over groups; without
        it they are over ops.

    Raises
    ------
    PostplaceError
        When the graph cannot be priced on the cluster: an op no device may run, a step time that
        would not be finite, an op in a precision a device has no peak for.

    Examples
    --------
    >>> import numpy as np
    >>> from postplace.cluster import load_cluster
    >>> from postplace.graph import COLLECTIVE_KINDS, OpGraph
    >>> from postplace.sim import Simulator
    >>> g = OpGraph.build(["a", "b", "c"], [(0, 1, 1e6), (1, 2, 1e6)], flops=[1e9, 4e9, 1e9])
    >>> sim = Simulator(g, load_cluster("k80x2"))  # devices cpu, gpu0, gpu1
    >>> r = sim.evaluate(np.array([[1, 1, 1], [1, 2, 1], [1, 1, 5]]))
    >>> r.step_time.round(6).tolist(), r.bytes_moved.tolist(), r.reasons[2]
    ([0.002173, 0.00232, inf], [0.0, 2000000.0, 0.0], "op 'c' has device id 5; ids are 0..2")
    >>> round(sim.lower_bound, 6)  # the whole chain on one GPU is optimal here
    0.002173
    """

    name = "simulator"

    def __init__(
        self,
        graph: OpGraph,
        cluster: Cluster,
        *,
        cost_model: CostModel | None = None,
        group_of_op: np.ndarray | None = None,
    ):
        self.graph = graph
        self.cluster = cluster
        self.problem = SimProblem.build(graph, cluster, cost_model)
        self.group_of_op = None if group_of_op is None else np.asarray(group_of_op, dtype=np.int64)
        self._rep = colocation_representative(graph)
        self._allowed = graph.allowed_kinds
        self._lower_bound: float | None = None

    # ------------------------------------------------------------------------------ bounds
    @property
    def lower_bound(self) -> float:
        """Seconds no placement's step can beat (:func:`postplace.sim.lower_bound`; computed once)."""
        if self._lower_bound is None:
            self._lower_bound = bounds.lower_bound(self.problem)
        return self._lower_bound

    @property
    def failure_step_time(self) -> float:
        """A step time above any feasible placement's (:func:`postplace.sim.failure_step_time`)."""
        return bounds.failure_step_time(self.problem)

    @property
    def sources(self) -> tuple[str, ...]:
        """Where each device's op times come from (measured or roofline), one line per device."""
        return self.problem.op_times.sources

    # ------------------------------------------------------------------------------ evaluation
    def expand(self, placements: np.ndarray) -> np.ndarray:
        """Op-level device ids from group-level (or op-level) placements, shape ``[n, num_ops]``.

        Parameters
        ----------
        placements : numpy.ndarray
            ``int[units]`` or ``int[n, units]``.

        Returns
        -------
        numpy.ndarray
            ``int64[n, num_ops]``.
        """
        return expand_placements(placements, self.group_of_op, self.graph.num_ops)

    def evaluate(self, placements: np.ndarray) -> EvalResult:
        """Simulate placements over groups (or over ops when there is no grouping).

        Parameters
        ----------
        placements : numpy.ndarray
            ``int[units]`` or ``int[n, units]``: a device id per group (or per op).

        Returns
        -------
        EvalResult
        """
        return self.evaluate_ops(self.expand(placements))

    def evaluate_ops(self, op_placements: np.ndarray) -> EvalResult:
        """Simulate op-level placements ``[n, num_ops]``, whatever the grouping.

        Parameters
        ----------
        op_placements : numpy.ndarray
            ``int[num_ops]`` or ``int[n, num_ops]``.

        Returns
        -------
        EvalResult
        """
        ops = np.ascontiguousarray(np.atleast_2d(np.asarray(op_placements, dtype=np.int64)))
        n, D = ops.shape[0], self.cluster.num_devices
        failed = self._invalid_rows(ops)
        reasons: list[str | None] = [None] * n
        for r in np.flatnonzero(failed):
            reasons[r] = self._invalid_reason(ops[r])
        ok = np.flatnonzero(~failed)
        step = np.full(n, np.inf)
        peak = np.zeros((n, D))
        busy = np.zeros((n, D))
        moved = np.zeros(n)
        wire = np.zeros((n, self.problem.num_collectives))
        if ok.size:
            s, pk, bz, mv, wr = self._run(ops[ok])
            step[ok], peak[ok], busy[ok], moved[ok], wire[ok] = s, pk, bz, mv, wr
        oom = np.any(peak > self.cluster.capacity, axis=1) & ~failed
        extra = {}
        if self.graph.collectives:
            kinds = np.array([c.kind for c in self.graph.collectives])
            present = [k for k in COLLECTIVE_KINDS if (kinds == k).any()]
            extra["collective_bytes"] = {k: wire[:, kinds == k].sum(axis=1) for k in present}
        return EvalResult(step, peak, oom, failed, reasons, self.name, busy, moved, extra)

    def _invalid_rows(self, ops: np.ndarray) -> np.ndarray:
        bad = kernel.invalid_rows(ops, self._allowed, self.cluster.kind_bits, self._rep)
        p = self.problem
        if p.num_collectives and ops.shape[0]:
            # two members of one collective on one device: (collective, device) keys repeat in the row
            D = self.cluster.num_devices
            keys = np.sort(p.coll_of[p.coll_members] * D + np.clip(ops[:, p.coll_members], 0, D - 1), axis=1)
            bad |= np.any(keys[:, 1:] == keys[:, :-1], axis=1)
        return bad

    def _invalid_reason(self, dev: np.ndarray) -> str | None:
        reason = invalid_reason(self.graph, self.cluster, dev)
        if reason is None:
            reason = shared_device_reason(self.problem, dev)
        return reason

    def _run(self, ops: np.ndarray):
        p = self.problem
        m = ops.shape[0]
        D = self.cluster.num_devices
        makespan = np.empty(m)
        busy = np.empty((m, D))
        peak = np.empty((m, D))
        moved = np.empty(m)
        c_sec, c_ptr, c_res, c_wire = p.collective_arrays(ops)
        kernel.run_batch(
            ops,
            p.op_time,
            p.alloc_bytes,
            p.persistent,
            p.live_mode,
            p.out_ptr,
            p.edge_dst,
            p.edge_slot,
            p.edge_bytes,
            p.in_ptr,
            p.in_edges,
            p.edge_src,
            p.edge_alias,
            p.indegree,
            p.num_slots,
            p.latency,
            p.bandwidth,
            p.route_ptr,
            p.route_res,
            p.num_resources,
            p.coll_of,
            p.coll_ptr,
            p.coll_members,
            c_sec,
            c_ptr,
            c_res,
            c_wire,
            makespan,
            busy,
            peak,
            moved,
        )
        return makespan, peak, busy, moved, c_wire

    def schedule(self, placement: np.ndarray) -> Schedule:
        """The full schedule of one placement (op-level or group-level, as :meth:`evaluate` takes).

        Parameters
        ----------
        placement : numpy.ndarray
            One placement, as :meth:`evaluate` takes it.

        Returns
        -------
        Schedule

        Raises
        ------
        ValueError
            When the placement is invalid (the reason :meth:`evaluate` would give).
        """
        dev = np.ascontiguousarray(self.expand(placement)[0])
        reason = self._invalid_reason(dev)
        if reason:
            raise ValueError(reason)
        p = self.problem
        n, D, E, C = self.graph.num_ops, self.cluster.num_devices, self.graph.num_edges, p.num_collectives
        busy, peak = np.empty(D), np.empty(D)
        op_start, op_end = np.empty(n), np.empty(n)
        coll_start, coll_end = np.empty(C), np.empty(C)
        xi = [np.empty(E, dtype=np.int64) for _ in range(4)]
        xf = [np.empty(E) for _ in range(3)]
        c_sec, c_ptr, c_res, c_wire = (a[0] for a in p.collective_arrays(dev[None, :]))
        makespan, _, n_x = kernel.run_one(
            dev,
            p.op_time,
            p.alloc_bytes,
            p.persistent,
            p.live_mode,
            p.out_ptr,
            p.edge_dst,
            p.edge_slot,
            p.edge_bytes,
            p.in_ptr,
            p.in_edges,
            p.edge_src,
            p.edge_alias,
            p.indegree,
            p.num_slots,
            p.latency,
            p.bandwidth,
            p.route_ptr,
            p.route_res,
            p.num_resources,
            p.coll_of,
            p.coll_ptr,
            p.coll_members,
            c_sec,
            c_ptr,
            c_res,
            c_wire,
            busy,
            peak,
            op_start,
            op_end,
            coll_start,
            coll_end,
            *xi,
            *xf,
            *kernel.make_work(n, E, D, p.num_resources, p.num_slots, C),
        )
        transfers = [
            (
                int(xi[0][k]),
                int(xi[1][k]),
                int(xi[2][k]),
                int(xi[3][k]),
                float(xf[0][k]),
                float(xf[1][k]),
                float(xf[2][k]),
            )
            for k in range(n_x)
        ]
        collectives = [
            (
                coll.name or f"collective{c}",
                coll.kind,
                float(coll_start[c]),
                float(coll_end[c]),
                tuple(int(d) for d in dev[p.collective_members(c)]),
                float(c_wire[c]),
            )
            for c, coll in enumerate(self.graph.collectives)
        ]
        return Schedule(
            self.graph, self.cluster, dev, op_start, op_end, transfers, float(makespan), peak, busy, collectives
        )


def shared_device_reason(problem: SimProblem, dev: np.ndarray) -> str | None:
    """Why a placement cannot run its collectives (two members of one on one device), or None."""
    g, names = problem.graph, problem.cluster.device_names
    for c in range(problem.num_collectives):
        members = problem.collective_members(c)
        seen: dict[int, int] = {}
        for i in members.tolist():
            d = int(dev[i])
            if d in seen:
                coll = g.collectives[c]
                label = f"'{coll.name}'" if coll.name else str(c)
                return (
                    f"collective {label} ({coll.kind}) has members '{g.names[seen[d]]}' and '{g.names[i]}' both on "
                    f"{names[d]}; put each member of a collective on its own device"
                )
            seen[d] = i
    return None
