"""OpGraph: one training step as immutable arrays, and its single invariant checker.

Units everywhere: seconds, bytes, FLOPs (a multiply-add counts 2). Ops are stored in program order,
which is also a topological order: every edge goes from a lower index to a higher one. Edges are kept
sorted by (src, dst, slot), which gives a CSR view by source; ``in_ptr``/``in_edges`` give one by
destination.

An edge carries one output tensor of its source op: ``slot`` numbers the source's outputs, so two edges
with the same (src, slot) carry the same tensor (sent once per destination device by the simulator).

Measured times are kept per *device key*: a device model (``"K80"``) or a device kind (``"gpu"``),
the latter meaning "any device of that kind" (what a profiled file that does not name its hardware
gives). NaN in a measurement means "not measured for this op".

Each op also says the precision it computes in (an index into :data:`PRECISIONS`): the cost model
prices its FLOPs at the device's peak for that precision. Graphs and files that do not say are fp32.

Collective ops (all-reduce, reduce-scatter, all-gather, broadcast) are ops too: a :class:`Collective`
names the operation, and its members are the ops whose ``collective`` field is its index, one per rank,
ranks in op index order. Each member is an ordinary op otherwise (its local inputs, local consumers and
output bytes are its own); the simulator runs all members as one communication over their devices.
"""

from __future__ import annotations

import heapq
import json
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

import numpy as np

from postplace import validate as v
from postplace.errors import PostplaceError

FORMAT = "postplace.opgraph"
VERSION = 1
PHASES = ("forward", "backward", "update", "other")
DEVICE_KINDS = ("cpu", "gpu")
KIND_BITS = {"cpu": 1, "gpu": 2}
ALL_KINDS = 3
MEMORY_MODES = ("live", "static")
PRECISIONS = ("fp32", "bf16", "fp16")
COLLECTIVE_KINDS = ("all_reduce", "reduce_scatter", "all_gather", "broadcast")

_OP_FLOAT_FIELDS = ("flops", "bytes_accessed", "output_bytes", "persistent_bytes")
_BYTE_FIELDS = ("bytes_accessed", "output_bytes", "persistent_bytes", "edges.bytes")  # at most MAX_BYTES


class GraphError(PostplaceError):
    """An OpGraph broke one of its invariants."""


REDUCES_ACROSS = "reduces_across"
"""``OpGraph.metadata`` key: the names of the reductions (mean, sum, var, std, amax...) over some dimension other
than the last (and, of a tensor of 3 or more, the first: the sequences), or over every dimension
(:mod:`postplace.graph.fx_to_opgraph` records them): they mix what another
position along the batch or the sequence holds (a pooling over tokens, its backward's sum), so sequence
parallelism cannot run them on a rank's tokens alone (:mod:`postplace.plans.tensor`), unless the sum is a
parameter's gradient (summed over a rank's tokens, then all-reduced over the group). Absent on graphs not traced
here (a workload file): the op types alone are then the rule."""


@dataclass(frozen=True, eq=False)
class Measurement:
    """Measured op times for one device key (a device model, or a kind meaning any of that kind).

    Parameters
    ----------
    key : str
        A device model (``"K80"``) or a device kind (``"gpu"``: any device of that kind).
    kind : str
        The device kind the times are for, one of :data:`DEVICE_KINDS`.
    times : array of float
        Seconds per op of the graph; NaN where the op was not measured.
    provenance : str
        Where the times come from (the file and column, the profiling run).
    """

    key: str
    kind: str
    times: np.ndarray
    provenance: str


@dataclass(frozen=True)
class Collective:
    """One collective operation over the ops that are its members (one per rank, ranks in op order).

    Parameters
    ----------
    kind : str
        One of :data:`COLLECTIVE_KINDS`.
    nbytes : float
        S, the size of the full buffer: the all-reduced buffer, a reduce-scatter's input (each rank
        gets S/k), an all-gather's output (each rank contributes S/k), the broadcast buffer.
    name : str
        A label for traces and error messages (``""``: the collective is named by its index).

    Examples
    --------
    >>> from postplace.graph import Collective
    >>> Collective("all_reduce", 4e6, "grads")
    Collective(kind='all_reduce', nbytes=4000000.0, name='grads')
    """

    kind: str
    nbytes: float
    name: str = ""


@dataclass(frozen=True, eq=False)
class OpGraph:
    """The ops and data edges of one training step. Built once, never mutated; validated on build.

    Build one from plain lists with :meth:`build` (every per-op field optional), read one with
    :meth:`load` or :func:`postplace.graph.load_graph`, or trace one with
    :func:`postplace.graph.from_torch`. The constructor takes the arrays below; ``microbatch``,
    ``module`` and ``precision`` are optional in it and in graph files (older files load with -1,
    ``""`` and fp32; a file carries ``precision`` only when some op is not fp32).

    Parameters
    ----------
    names : sequence of str
        Per op: its unique name. Ops are in program order, a topological order.
    op_types : sequence of str
        Per op: its type (``"matmul"``, ``"op"``...).
    flops, bytes_accessed, output_bytes : array of float
        Per op: FLOPs, bytes read + written, and bytes of its output.
    persistent_bytes : array of float
        Per op: parameters and optimizer state it keeps (in ``static`` memory mode, the op's whole footprint).
    colocation : array of int
        Per op: ops sharing an id >= 0 must share a device; -1 = unconstrained.
    phase : array of int
        Per op: an index into :data:`PHASES`.
    allowed_kinds : array of int
        Per op: a bit mask over :data:`DEVICE_KINDS` (1 cpu, 2 gpu, 3 either).
    inplace : array of bool
        Per op: the output aliases an input and allocates nothing.
    edge_src, edge_dst, edge_slot, edge_bytes : array
        Per edge: source op, destination op, which output of the source it carries, and its bytes.
        Edges are stored sorted by (src, dst, slot).
    memory_mode : {"live", "static"}
        ``live``: an op's output is allocated when it runs (unless in place) and freed after its
        consumers; ``static``: only ``persistent_bytes`` count.
    measured : tuple of Measurement
        Measured op times, one per device key.
    name : str
        The graph's name.
    metadata : dict
        Free-form facts about the step (its optimizer, precision, parameter bytes...).
    inplace_base : array of int, optional
        For an in-place op, the op whose output tensor it writes, fed to it by an edge; -1 when not in
        place or not known, and then the simulator treats every input of the op as possibly written.
        Left out, it is the single source of an in-place op with one, else -1.
    microbatch : array of int, optional
        The micro-batch an op computes for, 0..m-1 in a step traced as m micro-batches; -1 for ops
        every micro-batch shares (parameters, buffers, gradient accumulation, the update) and for
        graphs that do not say.
    module : sequence of str, optional
        The ``nn.Module`` path that issued each op, ``""`` where unknown.
    precision : array of int or sequence of str, optional
        The dtype each op computes in, as an ``int8`` index into :data:`PRECISIONS` (0 fp32, 1 bf16,
        2 fp16); names are accepted too. Default: every op fp32.
    collective : array of int, optional
        Per op: -1 for an ordinary op, else the index into ``collectives`` of the collective it is a
        member of. Default: every op -1.
    collectives : tuple of Collective, optional
        The graph's collective operations; each needs at least one member. Default: none.

    Raises
    ------
    GraphError
        When an invariant is broken (see :meth:`validate`): fields of other lengths, duplicate names,
        negative or non-finite costs, edges that go backwards or out of range, colocated ops that
        allow no common device kind...

    Examples
    --------
    >>> from postplace.graph import OpGraph
    >>> g = OpGraph.build(["x", "w", "y"], [(0, 2, 4e6), (1, 2, 4e6)], flops=[0.0, 0.0, 2e9],
    ...                   persistent_bytes=[0.0, 4e6, 0.0], phase=["forward", "forward", "forward"])
    >>> g
    OpGraph('graph': 3 ops, 2 edges, 2e+09 FLOPs, 0.004 GB persistent, memory mode live)
    >>> g.index("y"), g.in_ptr.tolist()
    (2, [0, 0, 0, 2])
    """

    names: tuple[str, ...]
    op_types: tuple[str, ...]
    flops: np.ndarray
    bytes_accessed: np.ndarray
    output_bytes: np.ndarray
    persistent_bytes: np.ndarray
    colocation: np.ndarray
    phase: np.ndarray
    allowed_kinds: np.ndarray
    inplace: np.ndarray
    edge_src: np.ndarray
    edge_dst: np.ndarray
    edge_slot: np.ndarray
    edge_bytes: np.ndarray
    memory_mode: str = "live"
    measured: tuple[Measurement, ...] = ()
    name: str = "graph"
    metadata: dict = field(default_factory=dict)
    inplace_base: np.ndarray | None = None
    microbatch: np.ndarray | None = None
    module: tuple[str, ...] = ()
    precision: np.ndarray | None = None
    collective: np.ndarray | None = None
    collectives: tuple[Collective, ...] = ()

    def __repr__(self) -> str:
        return (
            f"OpGraph({self.name!r}: {self.num_ops} ops, {self.num_edges} edges, "
            f"{float(self.flops.sum()):.3g} FLOPs, {float(self.persistent_bytes.sum()) / 1e9:.3g} GB persistent, "
            f"memory mode {self.memory_mode})"
        )

    def __post_init__(self):
        set_ = object.__setattr__
        n = len(self.names)
        mb = np.full(n, -1) if self.microbatch is None else self.microbatch
        set_(self, "microbatch", _frozen(np.asarray(mb, dtype=np.int32)))
        set_(self, "module", tuple(str(x) for x in self.module) if len(self.module) else ("",) * n)
        set_(self, "precision", _frozen(_precision_array(self.precision, n, self.names, self.name)))
        coll = np.full(n, -1) if self.collective is None else self.collective
        set_(self, "collective", _frozen(np.asarray(coll, dtype=np.int64)))
        set_(self, "collectives", tuple(_collective(c, k, self.name) for k, c in enumerate(self.collectives)))
        set_(self, "names", tuple(str(x) for x in self.names))
        set_(self, "op_types", tuple(str(x) for x in self.op_types))
        for f in _OP_FLOAT_FIELDS:
            set_(self, f, _frozen(np.asarray(getattr(self, f), dtype=np.float64)))
        set_(self, "colocation", _frozen(np.asarray(self.colocation, dtype=np.int64)))
        set_(self, "phase", _frozen(np.asarray(self.phase, dtype=np.int8)))
        set_(self, "allowed_kinds", _frozen(np.asarray(self.allowed_kinds, dtype=np.uint8)))
        set_(self, "inplace", _frozen(np.asarray(self.inplace, dtype=np.bool_)))
        src = np.asarray(self.edge_src, dtype=np.int64)
        dst = np.asarray(self.edge_dst, dtype=np.int64)
        slot = np.asarray(self.edge_slot, dtype=np.int64)
        ebytes = np.asarray(self.edge_bytes, dtype=np.float64)
        if not (len(src) == len(dst) == len(slot) == len(ebytes)):
            raise GraphError(
                f"graph '{self.name}': edge arrays differ in length "
                f"(src {len(src)}, dst {len(dst)}, slot {len(slot)}, bytes {len(ebytes)})"
            )
        order = np.lexsort((slot, dst, src))
        set_(self, "edge_src", _frozen(src[order]))
        set_(self, "edge_dst", _frozen(dst[order]))
        set_(self, "edge_slot", _frozen(slot[order].astype(np.int32)))
        set_(self, "edge_bytes", _frozen(ebytes[order]))
        if self.inplace_base is None:
            set_(self, "inplace_base", _frozen(_sole_sources(len(self.names), self.inplace, src, dst)))
        else:
            set_(self, "inplace_base", _frozen(np.asarray(self.inplace_base, dtype=np.int64)))
        measured = []
        for m in self.measured:
            times = _frozen(np.asarray(m.times, dtype=np.float64))
            measured.append(Measurement(str(m.key), str(m.kind), times, str(m.provenance)))
        set_(self, "measured", tuple(measured))
        set_(self, "metadata", dict(self.metadata))
        self.validate()

    # ----------------------------------------------------------------------------- construction
    @classmethod
    def build(
        cls,
        names: Sequence[str],
        edges: Sequence[tuple] = (),
        *,
        op_types: Sequence[str] | None = None,
        flops=None,
        bytes_accessed=None,
        output_bytes=None,
        persistent_bytes=None,
        colocation=None,
        phase=None,
        allowed_kinds=None,
        inplace=None,
        inplace_base=None,
        memory_mode: str = "live",
        measured: Sequence[Measurement] = (),
        name: str = "graph",
        metadata: dict | None = None,
        microbatch=None,
        module: Sequence[str] = (),
        precision=None,
        collective=None,
        collectives: Sequence[Collective] = (),
    ) -> OpGraph:
        """Build a graph from plain lists; every per-op field defaults to zero / unconstrained.

        Parameters
        ----------
        names : sequence of str
            The ops' unique names, in program order.
        edges : sequence of tuple
            ``(src, dst)``, ``(src, dst, bytes)`` or ``(src, dst, bytes, slot)`` tuples of op indices
            (bytes default to 0, slot to 0).
        op_types, flops, bytes_accessed, output_bytes, persistent_bytes, colocation, inplace, inplace_base
            Per op, as the class takes them (default: ``"op"``, zeros, -1, False, and the sole source).
        phase : sequence of str or int, optional
            Names from :data:`PHASES` or their indices (default: every op ``forward``).
        allowed_kinds : sequence, optional
            Kind names, lists of them, or bit masks (default: any kind).
        memory_mode, measured, name, metadata, microbatch, module
            As the class takes them.
        precision : sequence, optional
            Names from :data:`PRECISIONS` or their indices (default: every op fp32).
        collective, collectives
            As the class takes them (default: no collectives).

        Returns
        -------
        OpGraph

        Raises
        ------
        GraphError
            When the graph breaks an invariant (unknown kind names included).

        Examples
        --------
        >>> g = OpGraph.build(["a", "b"], [(0, 1, 8.0)], flops=[2.0, 4.0])
        >>> g.num_ops, g.num_edges, float(g.flops.sum())
        (2, 1, 6.0)
        """
        n = len(names)
        zeros = np.zeros(n)
        src, dst, ebytes, slots = [], [], [], []
        for e in edges:
            src.append(int(e[0]))
            dst.append(int(e[1]))
            ebytes.append(float(e[2]) if len(e) > 2 else 0.0)
            slots.append(int(e[3]) if len(e) > 3 else 0)
        if phase is None:
            phase = np.zeros(n, dtype=np.int8)
        else:
            phase = [PHASES.index(p) if isinstance(p, str) else int(p) for p in phase]
        if allowed_kinds is None:
            allowed_kinds = np.full(n, ALL_KINDS, dtype=np.uint8)
        else:
            allowed_kinds = [kinds_mask(k) for k in allowed_kinds]
        return cls(
            names=tuple(names),
            op_types=tuple(op_types) if op_types is not None else ("op",) * n,
            flops=zeros if flops is None else flops,
            bytes_accessed=zeros if bytes_accessed is None else bytes_accessed,
            output_bytes=zeros if output_bytes is None else output_bytes,
            persistent_bytes=zeros if persistent_bytes is None else persistent_bytes,
            colocation=np.full(n, -1) if colocation is None else colocation,
            phase=phase,
            allowed_kinds=allowed_kinds,
            inplace=np.zeros(n, dtype=bool) if inplace is None else inplace,
            inplace_base=inplace_base,
            edge_src=src,
            edge_dst=dst,
            edge_slot=slots,
            edge_bytes=ebytes,
            memory_mode=memory_mode,
            measured=tuple(measured),
            name=name,
            metadata=metadata or {},
            microbatch=microbatch,
            module=tuple(module),
            precision=precision,
            collective=collective,
            collectives=tuple(collectives),
        )

    # ----------------------------------------------------------------------------- invariants
    def validate(self) -> None:
        """Check every invariant; raise :class:`GraphError` naming the ops and field involved."""
        n = self.num_ops
        where = f"graph '{self.name}'"
        per_op = ("op_types", *_OP_FLOAT_FIELDS, "colocation", "phase", "allowed_kinds", "inplace", "inplace_base")
        per_op += ("microbatch", "module", "precision", "collective")
        for fname in per_op:
            if len(getattr(self, fname)) != n:
                raise GraphError(f"{where}: field '{fname}' has {len(getattr(self, fname))} entries for {n} ops")
        if self.memory_mode not in MEMORY_MODES:
            raise GraphError(f"{where}: memory_mode '{self.memory_mode}' is not one of {MEMORY_MODES}")
        seen: dict[str, int] = {}
        for i, nm in enumerate(self.names):
            if nm in seen:
                raise GraphError(f"{where}: duplicate op name '{nm}' (ops {seen[nm]} and {i}); names must be unique")
            seen[nm] = i
        for fname in _OP_FLOAT_FIELDS:
            self._check_costs(fname, getattr(self, fname), per="op")
        self._check_costs("edges.bytes", self.edge_bytes, per="edge")
        for m in self.measured:
            if m.kind not in DEVICE_KINDS:
                raise GraphError(f"{where}: measurement '{m.key}' has kind '{m.kind}', not one of {DEVICE_KINDS}")
            if len(m.times) != n:
                raise GraphError(f"{where}: measurement '{m.key}' has {len(m.times)} times for {n} ops")
            present = ~np.isnan(m.times)
            self._check_costs(f"measured['{m.key}']", np.where(present, m.times, 0.0), per="op")
        bad = np.flatnonzero((self.phase < 0) | (self.phase >= len(PHASES)))
        if bad.size:
            raise GraphError(f"{where}: op '{self.names[bad[0]]}' has phase {self.phase[bad[0]]}; use 0..3 {PHASES}")
        bad = np.flatnonzero((self.allowed_kinds == 0) | (self.allowed_kinds > ALL_KINDS))
        if bad.size:
            raise GraphError(
                f"{where}: op '{self.names[bad[0]]}' field 'allowed_kinds' is {self.allowed_kinds[bad[0]]}; "
                "it must allow at least one of cpu (1), gpu (2)"
            )
        bad = np.flatnonzero((self.precision < 0) | (self.precision >= len(PRECISIONS)))
        if bad.size:
            raise GraphError(
                f"{where}: op '{self.names[bad[0]]}' field 'precision' is {self.precision[bad[0]]}; "
                f"use 0..{len(PRECISIONS) - 1} {PRECISIONS}"
            )
        bad = np.flatnonzero(self.colocation < -1)
        if bad.size:
            raise GraphError(f"{where}: op '{self.names[bad[0]]}' field 'colocation' is negative; use -1 for none")
        bad = np.flatnonzero(self.microbatch < -1)
        if bad.size:
            raise GraphError(
                f"{where}: op '{self.names[bad[0]]}' field 'microbatch' is {self.microbatch[bad[0]]}; "
                "use 0..m-1, or -1 for an op every micro-batch shares"
            )
        self._check_edges()
        self._check_inplace_base()
        self._check_colocation_kinds()
        self._check_collectives()

    def _check_collectives(self) -> None:
        where = f"graph '{self.name}'"
        C = len(self.collectives)
        bad = np.flatnonzero((self.collective < -1) | (self.collective >= C))
        if bad.size:
            i = int(bad[0])
            fix = f"-1 for an ordinary op or 0..{C - 1}, the index of its collective" if C else "-1 (no collectives)"
            raise GraphError(f"{where}: op '{self.names[i]}' field 'collective' is {self.collective[i]}; use {fix}")
        if not C:
            return
        size = np.bincount(self.collective[self.collective >= 0], minlength=C)
        for c, coll in enumerate(self.collectives):
            who = f"{where}: collective {c} ('{coll.name}')" if coll.name else f"{where}: collective {c}"
            if coll.kind not in COLLECTIVE_KINDS:
                raise GraphError(f"{who} has kind '{coll.kind}'; use one of {COLLECTIVE_KINDS}")
            if not (math.isfinite(coll.nbytes) and coll.nbytes >= 0):
                raise GraphError(f"{who} field 'nbytes' is {coll.nbytes!r}; it must be a finite number >= 0 (bytes)")
            if coll.nbytes > v.MAX_BYTES:
                raise GraphError(
                    f"{who} field 'nbytes' is {coll.nbytes:g} bytes, above the bound of "
                    f"{v.MAX_BYTES:g} bytes (1 EB); check the units"
                )
            if size[c] == 0:
                raise GraphError(f"{who} has no member ops; set the 'collective' field of one op per rank to {c}")
        # all members of a collective finish together, so a member that depends on another member of its
        # own collective (or two collectives that wait on each other) could never run: contract every
        # collective to one node and insist the result is still a DAG
        node = np.where(self.collective >= 0, self.num_ops + self.collective, np.arange(self.num_ops))
        src, dst = node[self.edge_src], node[self.edge_dst]
        keep = src != dst
        direct = np.flatnonzero(~keep & (self.collective[self.edge_src] >= 0))
        if direct.size:
            e = int(direct[0])
            c = int(self.collective[self.edge_src[e]])
            raise GraphError(
                f"{where}: collective {c} member '{self.names[self.edge_src[e]]}' feeds its fellow member "
                f"'{self.names[self.edge_dst[e]]}'; the members of a collective run together, so none may depend "
                "on another"
            )
        if topological_order(self.num_ops + C, src[keep].tolist(), dst[keep].tolist()) is None:
            cycle = find_cycle(self.num_ops + C, src[keep], dst[keep]) or []
            label = [self.names[x] if x < self.num_ops else f"collective {x - self.num_ops}" for x in cycle]
            path = " -> ".join([*label, label[0]] if label else label)
            raise GraphError(
                f"{where}: a collective waits on its own members: {path}; "
                "the members of a collective run together, so none may depend on another's output"
            )

    def _check_inplace_base(self) -> None:
        base = self.inplace_base
        ops = np.flatnonzero(base != -1)
        if not ops.size:
            return
        n = self.num_ops
        fed = np.isin(base[ops] * n + ops, self.edge_src * n + self.edge_dst) & (base[ops] >= 0) & (base[ops] < n)
        bad = ops[~fed | ~self.inplace[ops]]
        if bad.size:
            i, b = int(bad[0]), int(base[bad[0]])
            why = "is not in place" if not self.inplace[i] else "has no edge from it"
            raise GraphError(
                f"graph '{self.name}': op '{self.names[i]}' field 'inplace_base' is {b} but the op {why}; "
                "give the op that feeds it the tensor it writes, or -1"
            )

    def _check_costs(self, fname: str, values: np.ndarray, *, per: str) -> None:
        bad = np.flatnonzero(~np.isfinite(values) | (values < 0))
        if bad.size:
            i = int(bad[0])
            raise GraphError(
                f"graph '{self.name}': {self._who(i, per)} field '{fname}' is {values[i]!r}; "
                "costs must be finite non-negative numbers (seconds, bytes, FLOPs)"
            )
        big = np.flatnonzero(values > v.MAX_BYTES) if fname in _BYTE_FIELDS else ()
        if len(big):
            i = int(big[0])
            raise GraphError(
                f"graph '{self.name}': {self._who(i, per)} field '{fname}' is {values[i]:g} bytes, above "
                f"the bound of {v.MAX_BYTES:g} bytes (1 EB); check the file's units"
            )

    def _who(self, i: int, per: str) -> str:
        if per == "op":
            return f"op '{self.names[i]}'"
        return f"edge {self.names[self.edge_src[i]]} -> {self.names[self.edge_dst[i]]}"

    def _check_edges(self) -> None:
        n = self.num_ops
        where = f"graph '{self.name}'"
        bad = np.flatnonzero((self.edge_src < 0) | (self.edge_src >= n) | (self.edge_dst < 0) | (self.edge_dst >= n))
        if bad.size:
            e = int(bad[0])
            raise GraphError(
                f"{where}: edge {self.edge_src[e]} -> {self.edge_dst[e]} names an op that does not exist "
                f"(ops are 0..{n - 1})"
            )
        if np.any(self.edge_slot < 0):
            raise GraphError(f"{where}: an edge has a negative output slot")
        if self.num_edges:
            key = self.edge_src * (int(self.edge_slot.max()) + 1) + self.edge_slot
            order = np.lexsort((self.edge_bytes, key))
            k, b = key[order], self.edge_bytes[order]
            clash = np.flatnonzero((k[1:] == k[:-1]) & (b[1:] != b[:-1]))
            if clash.size:
                e = order[clash[0]]
                raise GraphError(
                    f"{where}: edges from '{self.names[self.edge_src[e]]}' slot {self.edge_slot[e]} carry different "
                    "byte counts; one output slot is one tensor (give other tensors their own slot)"
                )
        back = np.flatnonzero(self.edge_src >= self.edge_dst)
        if back.size:
            cycle = find_cycle(n, self.edge_src, self.edge_dst)
            if cycle is not None:
                names = " -> ".join(self.names[i] for i in [*cycle, cycle[0]])
                raise GraphError(f"{where}: the graph has a cycle: {names}; a training step must be a DAG")
            e = int(back[0])
            raise GraphError(
                f"{where}: ops are not in topological order (edge {self.names[self.edge_src[e]]} -> "
                f"{self.names[self.edge_dst[e]]} goes backwards); build it with topological_order()"
            )

    def _check_colocation_kinds(self) -> None:
        sets = self.colocation_sets
        for members in sets:
            mask = int(np.bitwise_and.reduce(self.allowed_kinds[members]))
            if mask == 0:
                names = ", ".join(self.names[i] for i in members[:4])
                raise GraphError(
                    f"graph '{self.name}': colocated ops ({names}) allow no common device kind; "
                    "relax 'allowed_kinds' or split the colocation set"
                )

    # ----------------------------------------------------------------------------- views
    @property
    def num_ops(self) -> int:
        """The number of ops."""
        return len(self.names)

    @property
    def num_edges(self) -> int:
        """The number of edges."""
        return len(self.edge_src)

    @cached_property
    def out_ptr(self) -> np.ndarray:
        """CSR row pointer over edges by source: out-edges of op i are ``out_ptr[i]:out_ptr[i+1]``."""
        return _frozen(np.searchsorted(self.edge_src, np.arange(self.num_ops + 1)).astype(np.int64))

    @cached_property
    def in_edges(self) -> np.ndarray:
        """Edge ids sorted by destination (stable); pair with :attr:`in_ptr`."""
        return _frozen(np.argsort(self.edge_dst, kind="stable").astype(np.int64))

    @cached_property
    def in_ptr(self) -> np.ndarray:
        """CSR row pointer over :attr:`in_edges`: in-edges of op i are ``in_edges[in_ptr[i]:in_ptr[i+1]]``."""
        sorted_dst = self.edge_dst[self.in_edges]
        return _frozen(np.searchsorted(sorted_dst, np.arange(self.num_ops + 1)).astype(np.int64))

    @cached_property
    def colocation_sets(self) -> list[np.ndarray]:
        """Op index arrays of every colocation id in use, in order of first op."""
        ids = self.colocation
        used = ids >= 0
        if not used.any():
            return []
        order = np.argsort(ids, kind="stable")
        order = order[used[order]]
        splits = np.flatnonzero(np.diff(ids[order])) + 1
        groups = np.split(order, splits)
        groups.sort(key=lambda g: int(g[0]))
        return groups

    def index(self, name: str) -> int:
        """Index of the op called ``name``.

        Parameters
        ----------
        name : str

        Returns
        -------
        int

        Raises
        ------
        GraphError
            When the graph has no such op.
        """
        try:
            return self._index[name]
        except KeyError:
            raise GraphError(f"graph '{self.name}' has no op named '{name}'") from None

    @cached_property
    def _index(self) -> dict[str, int]:
        return {nm: i for i, nm in enumerate(self.names)}

    def allowed(self, i: int, kind: str) -> bool:
        """Whether op ``i`` may run on a device of ``kind`` (``"cpu"`` or ``"gpu"``)."""
        return bool(self.allowed_kinds[i] & KIND_BITS[kind])

    @cached_property
    def precisions_used(self) -> tuple[str, ...]:
        """Names of the precisions some op computes in, in :data:`PRECISIONS` order (``()`` for no ops)."""
        present = np.zeros(len(PRECISIONS), dtype=bool)
        present[self.precision] = True
        return tuple(p for p, used in zip(PRECISIONS, present.tolist(), strict=True) if used)

    # ----------------------------------------------------------------------------- persistence
    def to_dict(self) -> dict:
        """The graph as JSON-able data (what :meth:`save` writes; :meth:`from_dict` reads it back)."""
        measured = [
            {
                "key": m.key,
                "kind": m.kind,
                "provenance": m.provenance,
                "times": [None if math.isnan(t) else float(t) for t in m.times],
            }
            for m in self.measured
        ]
        ops = {
            "name": list(self.names),
            "op_type": list(self.op_types),
            "flops": self.flops.tolist(),
            "bytes_accessed": self.bytes_accessed.tolist(),
            "output_bytes": self.output_bytes.tolist(),
            "persistent_bytes": self.persistent_bytes.tolist(),
            "colocation": self.colocation.tolist(),
            "phase": [PHASES[p] for p in self.phase],
            "allowed_kinds": _kinds_lists(self.allowed_kinds),
            "inplace": self.inplace.tolist(),
            "inplace_base": self.inplace_base.tolist(),
            "microbatch": self.microbatch.tolist(),
            "module": list(self.module),
        }
        if self.precision.any():  # an all-fp32 graph writes the file it always did
            ops["precision"] = [PRECISIONS[p] for p in self.precision.tolist()]
        extra = {}
        if self.collectives:  # so does a graph without collectives
            ops["collective"] = self.collective.tolist()
            extra["collectives"] = [{"kind": c.kind, "nbytes": c.nbytes, "name": c.name} for c in self.collectives]
        return {
            "format": FORMAT,
            "version": VERSION,
            "name": self.name,
            "memory_mode": self.memory_mode,
            "metadata": self.metadata,
            "ops": ops,
            "edges": {
                "src": self.edge_src.tolist(),
                "dst": self.edge_dst.tolist(),
                "slot": self.edge_slot.tolist(),
                "bytes": self.edge_bytes.tolist(),
            },
            "measured": measured,
            **extra,
        }

    @classmethod
    def from_dict(cls, d: dict, *, source: str = "graph") -> OpGraph:
        """Rebuild a graph from :meth:`to_dict` output, with one-line errors naming the field.

        Strict: numbers must be numbers (not strings or booleans) and finite, booleans booleans,
        names strings; ``"version": true`` is not version 1.
        """
        if not isinstance(d, dict):
            raise GraphError(f"{source}: a graph file is one JSON object")
        version = d.get("version")
        if type(version) is not int or version != VERSION:
            raise GraphError(f"{source}: graph file version {version!r} is not supported (expected {VERSION})")
        ops = _field(d, "ops", dict, source)
        edges = _field(d, "edges", dict, source)
        names = _field(ops, "name", list, source, "ops.")
        n = len(names)
        try:
            for k, nm in enumerate(names):
                v.string(nm, f"{source}: field 'ops.name[{k}]'")

            def col(key, default=None, check=None):
                if key not in ops:
                    if default is not None:
                        return default
                    raise GraphError(f"{source}: missing field 'ops.{key}'; re-export the graph with `postplace graph`")
                val = ops[key]
                if not isinstance(val, list) or len(val) != n:
                    raise GraphError(f"{source}: field 'ops.{key}' must be a list of {n} entries (one per op)")
                for k, x in enumerate(val):
                    if check is not None:
                        check(x, f"{source}: field 'ops.{key}[{k}]'")
                return val

            def ecol(key, integers):
                val = _field(edges, key, list, source, "edges.")
                check = v.integer if integers else v.number
                for k, x in enumerate(val):
                    check(x, f"{source}: field 'edges.{key}[{k}]'")
                return val

            def kinds(x, where):
                if isinstance(x, list):
                    for k in x:
                        v.string(k, where)
                elif not isinstance(x, str):
                    v.integer(x, where)

            def phase(x, where):
                if isinstance(x, str):
                    if x not in PHASES:
                        raise GraphError(f"{where} is '{x}'; use one of {PHASES}")
                else:
                    v.integer(x, where)

            def precision(x, where):
                v.string(x, where)
                if x not in PRECISIONS:
                    raise GraphError(f"{where} is '{x}'; use one of {PRECISIONS} (the dtype the op computes in)")

            src = ecol("src", True)
            slot = ecol("slot", True) if "slot" in edges else None
            measured = []
            for k, m in enumerate(_field(d, "measured", list, source) if "measured" in d else []):
                where = f"{source}: measured[{k}]"
                if not isinstance(m, dict):
                    raise GraphError(f"{where} must be an object with key, kind, times")
                times = _field(m, "times", list, where)
                for j, t in enumerate(times):
                    if t is not None:
                        v.number(t, f"{where}.times[{j}]")
                measured.append(
                    Measurement(
                        v.string(_field(m, "key", str, where), f"{where}.key"),
                        v.string(_field(m, "kind", str, where), f"{where}.kind"),
                        np.array([np.nan if t is None else t for t in times], dtype=np.float64),
                        v.string(m.get("provenance", ""), f"{where}.provenance"),
                    )
                )
            collectives = []
            for k, c in enumerate(_field(d, "collectives", list, source) if "collectives" in d else []):
                where = f"{source}: collectives[{k}]"
                if not isinstance(c, dict):
                    raise GraphError(f"{where} must be an object with kind, nbytes, name")
                kind = v.string(_field(c, "kind", str, where), f"{where}.kind")
                if kind not in COLLECTIVE_KINDS:
                    raise GraphError(f"{where}.kind is '{kind}'; use one of {COLLECTIVE_KINDS}")
                nbytes = v.number(_field(c, "nbytes", object, where), f"{where}.nbytes", minimum=0)
                collectives.append(Collective(kind, float(nbytes), v.string(c.get("name", ""), f"{where}.name")))
            metadata = d.get("metadata", {})
            if not isinstance(metadata, dict):
                raise GraphError(f"{source}: field 'metadata' must be an object")
            return cls(
                names=names,
                op_types=col("op_type", ["op"] * n, v.string),
                flops=np.asarray(col("flops", check=v.number), dtype=np.float64),
                bytes_accessed=np.asarray(col("bytes_accessed", check=v.number), dtype=np.float64),
                output_bytes=np.asarray(col("output_bytes", check=v.number), dtype=np.float64),
                persistent_bytes=np.asarray(col("persistent_bytes", check=v.number), dtype=np.float64),
                colocation=col("colocation", [-1] * n, v.integer),
                phase=[PHASES.index(p) if isinstance(p, str) else p for p in col("phase", [0] * n, phase)],
                allowed_kinds=[kinds_mask(k) for k in col("allowed_kinds", [ALL_KINDS] * n, kinds)],
                inplace=col("inplace", [False] * n, v.boolean),
                inplace_base=col("inplace_base", check=v.integer) if "inplace_base" in ops else None,
                microbatch=col("microbatch", [-1] * n, v.integer),
                module=col("module", [""] * n, v.string),
                precision=[PRECISIONS.index(p) for p in col("precision", ["fp32"] * n, precision)],
                collective=col("collective", [-1] * n, v.integer),
                collectives=tuple(collectives),
                edge_src=src,
                edge_dst=ecol("dst", True),
                edge_slot=slot if slot is not None else [0] * len(src),
                edge_bytes=ecol("bytes", False),
                memory_mode=v.string(d.get("memory_mode", "live"), f"{source}: field 'memory_mode'"),
                measured=tuple(measured),
                name=v.string(d.get("name", Path(source).stem), f"{source}: field 'name'"),
                metadata=metadata,
            )
        except GraphError as exc:
            msg = str(exc)
            raise GraphError(msg if msg.startswith(source) else f"{source}: {msg}") from None
        except PostplaceError as exc:
            raise GraphError(str(exc)) from None
        except (KeyError, TypeError, ValueError, OverflowError) as exc:
            raise GraphError(f"{source}: malformed graph file ({type(exc).__name__}: {exc})") from None

    def save(self, path: str | Path) -> None:
        """Write the graph as one versioned JSON file (atomically: a crash never leaves half a file).

        Parameters
        ----------
        path : str or path
            The file to write (replaced when it exists).

        Raises
        ------
        PostplaceError
            When the file cannot be written.
        """
        path = Path(path)
        if not path.name or path.is_dir():
            raise PostplaceError(f"{path}: is a folder, not a file; give a file name such as {path / 'graph.json'}")
        tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")  # two processes saving one cache entry at once
        try:
            tmp.write_text(json.dumps(self.to_dict(), separators=(",", ":")))
            tmp.replace(path)
        except OSError as exc:
            why = exc.strerror or exc
            raise PostplaceError(f"{path}: cannot write the graph ({why}); pick a writable path") from None

    @classmethod
    def load(cls, path: str | Path) -> OpGraph:
        """Read a graph written by :meth:`save`.

        Parameters
        ----------
        path : str or path

        Returns
        -------
        OpGraph

        Raises
        ------
        PostplaceError
            When the file is missing, is not JSON, or is not a valid postplace graph file.
        """
        d = read_json(path)
        if not isinstance(d, dict) or d.get("format") != FORMAT:
            raise GraphError(f'{path}: not a postplace graph file (no "format": "{FORMAT}")')
        return cls.from_dict(d, source=str(path))


# --------------------------------------------------------------------------------- helpers
def kinds_mask(k) -> int:
    """Bit mask of device kinds from a mask, a kind name, or a list of kind names."""
    if isinstance(k, str):
        k = [k]
    if isinstance(k, list | tuple):
        mask = 0
        for name in k:
            if name not in KIND_BITS:
                raise GraphError(f"unknown device kind '{name}'; use one of {DEVICE_KINDS}")
            mask |= KIND_BITS[name]
        return mask
    return int(k)


def _kinds_lists(masks: np.ndarray) -> list[list[str]]:
    names = {int(k): kinds_names(int(k)) for k in np.unique(masks)}
    return [names[k] for k in masks.tolist()]


def kinds_names(mask: int) -> list[str]:
    return [k for k in DEVICE_KINDS if mask & KIND_BITS[k]]


def read_json(path: str | Path):
    """Parse a JSON file with one-line errors (see :func:`postplace.validate.read_json`)."""
    return v.read_json(path)


def _field(d: dict, key: str, typ, source: str, prefix: str = ""):
    if key not in d:
        raise GraphError(f"{source}: missing field '{prefix}{key}'")
    v = d[key]
    if not isinstance(v, typ):
        raise GraphError(f"{source}: field '{prefix}{key}' must be a {typ.__name__}")
    return v


def _sole_sources(n: int, inplace, src: np.ndarray, dst: np.ndarray) -> np.ndarray:
    """Per op: the one op feeding an in-place op, if it has exactly one source; else -1."""
    base = np.full(n, -1, dtype=np.int64)
    inplace = np.asarray(inplace, dtype=bool)
    if len(inplace) != n or not len(src) or not inplace.any():
        return base
    first = np.full(n, -1, dtype=np.int64)
    count = np.zeros(n, dtype=np.int64)
    for s, d in sorted(set(zip(src.tolist(), dst.tolist(), strict=True))):
        if 0 <= d < n:
            count[d] += 1
            first[d] = s
    one = inplace & (count == 1)
    base[one] = first[one]
    return base


def _precision_array(values, n: int, names, graph: str) -> np.ndarray:
    """Per-op precision indices from None (all fp32), indices or names; an out-of-range index is kept
    (as int64) for :meth:`OpGraph.validate` to report, an unknown name is reported here."""
    if values is None:
        return np.zeros(n, dtype=np.int8)
    if isinstance(values, np.ndarray) and values.dtype.kind in "iu":
        idx = values.astype(np.int64)
    else:
        idx = np.empty(len(values), dtype=np.int64)
        for k, p in enumerate(values):
            if isinstance(p, str):
                if p not in PRECISIONS:
                    who = f"op '{names[k]}'" if k < len(names) else f"entry {k}"
                    raise GraphError(f"graph '{graph}': {who} field 'precision' is '{p}'; use one of {PRECISIONS}")
                idx[k] = PRECISIONS.index(p)
            else:
                idx[k] = int(p)
    in_range = not idx.size or (idx.min() >= 0 and idx.max() < len(PRECISIONS))
    return idx.astype(np.int8) if in_range else idx


def _collective(c, k: int, graph: str) -> Collective:
    """A :class:`Collective` from one (or from a ``(kind, nbytes[, name])`` tuple), fields coerced."""
    if isinstance(c, tuple):
        c = Collective(*c)
    if not isinstance(c, Collective):
        raise GraphError(f"graph '{graph}': collectives[{k}] is a {type(c).__name__}; give a Collective")
    try:
        return Collective(str(c.kind), float(c.nbytes), str(c.name))
    except (TypeError, ValueError):
        raise GraphError(f"graph '{graph}': collectives[{k}] field 'nbytes' is {c.nbytes!r}; give bytes") from None


def _frozen(a: np.ndarray) -> np.ndarray:
    a = np.ascontiguousarray(a)
    a.setflags(write=False)
    return a


def topological_order(n: int, src: Sequence[int], dst: Sequence[int]) -> list[int] | None:
    """Kahn's order that always takes the lowest-index ready node (keeps the given order where it can).

    Parameters
    ----------
    n : int
        The number of nodes, 0..n-1.
    src, dst : sequence of int
        The edges, ``src[k] -> dst[k]``.

    Returns
    -------
    list of int or None
        The nodes in a topological order; None if the graph has a cycle.

    Examples
    --------
    >>> from postplace.graph import topological_order
    >>> topological_order(3, [2, 0], [1, 2])
    [0, 2, 1]
    >>> topological_order(2, [0, 1], [1, 0]) is None
    True
    """
    succ: list[list[int]] = [[] for _ in range(n)]
    indeg = [0] * n
    for s, t in zip(src, dst, strict=True):
        succ[s].append(t)
        indeg[t] += 1
    ready = [i for i in range(n) if indeg[i] == 0]
    heapq.heapify(ready)
    order = []
    while ready:
        i = heapq.heappop(ready)
        order.append(i)
        for j in succ[i]:
            indeg[j] -= 1
            if indeg[j] == 0:
                heapq.heappush(ready, j)
    return order if len(order) == n else None


def find_cycle(n: int, src: Sequence[int], dst: Sequence[int]) -> list[int] | None:
    """The ops of one cycle, in edge order, or None for a DAG (iterative DFS)."""
    succ: list[list[int]] = [[] for _ in range(n)]
    for s, t in zip(src, dst, strict=True):
        succ[int(s)].append(int(t))
    color = [0] * n  # 0 new, 1 on stack, 2 done
    parent = [-1] * n
    for root in range(n):
        if color[root]:
            continue
        stack = [(root, 0)]
        color[root] = 1
        while stack:
            v, k = stack[-1]
            if k < len(succ[v]):
                stack[-1] = (v, k + 1)
                w = succ[v][k]
                if color[w] == 0:
                    color[w] = 1
                    parent[w] = v
                    stack.append((w, 0))
                elif color[w] == 1:
                    cycle = [v]
                    while cycle[-1] != w:
                        cycle.append(parent[cycle[-1]])
                    return cycle[::-1]
            else:
                color[v] = 2
                stack.pop()
    return None
