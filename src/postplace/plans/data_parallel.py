"""The data-parallel family as one graph pass: DDP, ZeRO-1, ZeRO-2 and FSDP (ZeRO-3) over k replicas.

:func:`data_parallel` turns a step traced as m micro-batches (gradient accumulation) into the step k
GPUs run under one of the plans practitioners launch. Replica r takes micro-batches ``r*m/k ..
(r+1)*m/k - 1``, sums its own gradients over them (the gradient sums of the other replicas' micro-batches
are dropped, the chain restarts at each replica's first micro-batch, and each sum runs right after its
gradient, as ``AccumulateGrad`` does inside the backward pass), and the replicas meet only in
collectives (:class:`postplace.graph.Collective`, one member op per replica):

``ddp``
    Every replica holds the whole model and optimizer state and runs the whole update. Gradients are
    all-reduced once per step, in buckets of ``bucket_bytes`` (DDP's ``bucket_cap_mb``, 25 MB) filled
    in the order the gradients become final in the last micro-batch's backward pass, each launched as
    soon as its last gradient is summed, so they overlap the rest of that backward. The all-reduce
    works in place on the gradients (they are DDP's bucket views), which stay until the update has
    read them.
``zero1``
    As ``ddp``, but each replica keeps 1/k of the optimizer state and runs 1/k of the update; then
    each bucket's parameters are all-gathered (their fp32 bytes) into every replica's copy.
``zero2``
    Gradients too are sharded: each micro-batch's gradients are reduce-scattered per bucket as its
    backward makes them (DeepSpeed's ZeRO-2 reduces every micro-batch), the shards summed over the
    micro-batches; the update of the shard and the all-gather of the parameters as in ``zero1``.
``fsdp``
    Parameters too are sharded (each replica keeps 1/k of the parameters and state). Per micro-batch
    each unit's (:func:`postplace.plans.unit_of`: a transformer block, a ResNet bottleneck, the root)
    parameters are all-gathered before its forward, freed after it, all-gathered again before its
    backward, and its gradients reduce-scattered per unit (FSDP2's defaults); a unit's gather waits
    for the previous gather's first reader to run, so one gather is in flight ahead of the compute, as
    FSDP's prefetch keeps it. Casts of a parameter (bf16 under autocast) read the gathered buffer
    and cost 1/k (FSDP2 casts the shard before gathering); those the backward reads are made again
    from the second gather.

On the wire: gradients in ``reduce_dtype`` (default fp32: DDP under autocast all-reduces the fp32
gradients of fp32 parameters; torchtitan's FSDP2 reduces in fp32), FSDP's gathers in ``param_dtype``
(default the step's precision: bf16 for a bf16 step, as torchtitan's ``mixed_precision_param``), and
ZeRO-1/2's parameter gathers in fp32. In memory the fp32 parameters and the optimizer state stay
(whole, or 1/k for what is sharded). Memory per GPU is then the simulator's live memory of the ops.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from postplace.errors import PostplaceError
from postplace.graph import OpGraph
from postplace.graph.microbatch_names import copied_name
from postplace.plans._draft import Draft
from postplace.plans._step import (
    BACKWARD,
    FORWARD,
    UPDATE,
    chain_positions,
    microbatch_count,
    parameter_ops,
    traced_name,
    unit_of,
)

__all__ = ["LEVELS", "PlannedStep", "data_parallel", "owners_of", "zero_owners"]

LEVELS = ("ddp", "zero1", "zero2", "fsdp")
_DTYPE_BYTES = {"fp32": 4.0, "bf16": 2.0, "fp16": 2.0}


@dataclass(frozen=True, eq=False)
class PlannedStep:
    """A step rewritten by a plan pass, and which replica runs each of its ops.

    Parameters
    ----------
    graph : OpGraph
        The rewritten step (with its collectives).
    replica : numpy.ndarray
        ``int[n]``: the GPU slot of each op (0..k-1): its replica, or under tensor parallelism
        ``tensor rank + tp x replica``.
    replicas : int
        k, the slots (the GPUs of one pipeline stage).
    level : str
        One of :data:`LEVELS`.
    """

    graph: OpGraph
    replica: np.ndarray
    replicas: int
    level: str

    def placement(self, devices: Sequence[int], cpu: int | None = None) -> np.ndarray:
        """Op-level device ids: replica r's ops on ``devices[r]``; ops no GPU may run on ``cpu``.

        Parameters
        ----------
        devices : sequence of int
            One device id per replica.
        cpu : int, optional
            The device of ops that may only run on a CPU.

        Returns
        -------
        numpy.ndarray
            ``int64[n]``.
        """
        dev = np.asarray(devices, dtype=np.int64)[self.replica]
        if cpu is not None:
            dev[(self.graph.allowed_kinds & 2) == 0] = cpu
        return dev


def data_parallel(
    graph: OpGraph,
    replicas: int,
    level: str = "ddp",
    *,
    bucket_bytes: float = 25e6,
    reduce_dtype: str = "fp32",
    param_dtype: str | None = None,
    shard: frozenset[str] | None = None,
    bucket_key: Mapping[str, int] | None = None,
) -> PlannedStep:
    """The step of ``replicas`` GPUs under ``level`` (see the module docstring).

    Parameters
    ----------
    graph : OpGraph
        A traced step of m micro-batches, m a multiple of ``replicas``.
    replicas : int
        k, the data-parallel degree.
    level : {"ddp", "zero1", "zero2", "fsdp"}
    bucket_bytes : float
        Gradient bucket size of ddp, zero1 and zero2 (bytes of the gradients).
    reduce_dtype : {"fp32", "bf16", "fp16"}
        The gradients' dtype on the wire.
    param_dtype : {"fp32", "bf16", "fp16"}, optional
        FSDP's gather dtype; default the step's precision.
    shard : frozenset of str, optional
        A hybrid: the units (:func:`postplace.plans.unit_of`, ``""`` the root) sharded as FSDP shards
        them, the others as ``level`` says; only with ``ddp`` (the others DDP) or ``fsdp`` (the others
        DDP too). Default: every unit for ``fsdp``, none for the other levels.
    bucket_key : mapping of str to int, optional
        A key per traced op name: no bucket holds gradients whose final sums have two keys (a pipeline's
        stages all-reduce their own gradients, each over its own GPUs).

    Returns
    -------
    PlannedStep

    Raises
    ------
    PostplaceError
        An unknown level or dtype, a replica count that does not divide the micro-batch count.
    """
    if level not in LEVELS:
        raise PostplaceError(f"plan '{level}' is not one of {', '.join(LEVELS)}")
    precision = str(graph.metadata.get("precision", "fp32"))
    param_dtype = param_dtype or (precision if precision in _DTYPE_BYTES else "fp32")
    for what, dt in (("reduce_dtype", reduce_dtype), ("param_dtype", param_dtype)):
        if dt not in _DTYPE_BYTES:
            raise PostplaceError(f"{what} '{dt}' is not one of {', '.join(_DTYPE_BYTES)}")
    m = microbatch_count(graph)
    if replicas < 1 or m % replicas:
        raise PostplaceError(
            f"{level} over {replicas} GPUs needs a micro-batch count that is a multiple of {replicas}, "
            f"and graph '{graph.name}' has {m}; trace the step as {replicas} x j micro-batches"
        )
    if shard is not None and level not in ("ddp", "fsdp"):
        raise PostplaceError(f"plan '{level}' shards by its own rule; a per-unit shard= goes with ddp or fsdp")
    if shard is None:
        shard = None if level == "fsdp" else frozenset()
    return _Pass(
        graph,
        replicas,
        level,
        bucket_bytes,
        _DTYPE_BYTES[reduce_dtype] / 4.0,
        _DTYPE_BYTES[param_dtype] / 4.0,
        param_dtype,
        reduce_dtype,
        shard,
        bucket_key or {},
    ).run()


class _Pass:
    def __init__(
        self, g, k, level, bucket_bytes, reduce_factor, param_factor, param_dtype, reduce_dtype, shard, bucket_key
    ):
        self.g, self.k, self.level = g, k, level
        self.bucket_key = bucket_key
        self.shard = shard  # the units FSDP shards (None: all of them)
        self.bucket_bytes, self.reduce_factor, self.param_factor = bucket_bytes, reduce_factor, param_factor
        self.meta = {
            "plan": level,
            "replicas": k,
            "bucket_bytes": bucket_bytes,
            "reduce_dtype": reduce_dtype,
            "param_dtype": param_dtype,
        }
        self.m = microbatch_count(g)
        self.b = self.m // k
        self.phase = g.phase.tolist()
        self.mb = g.microbatch.tolist()
        self.chain = chain_positions(g).tolist()
        self.is_param = parameter_ops(g).tolist()
        self.src, self.dst, self.slot, self.nbytes = (
            a.tolist() for a in (g.edge_src, g.edge_dst, g.edge_slot, g.edge_bytes)
        )
        self.in_ptr, self.in_edges = g.in_ptr.tolist(), g.in_edges.tolist()
        self.out_ptr = g.out_ptr.tolist()
        self.partitioned = level in ("zero1", "zero2")  # whole parameters per rank, not a shard of each
        self.draft = Draft(g)
        # replica -> (bucket, local micro-batch) -> [(template, src, slot, dst, bytes)]
        self.grads_r: dict[int, dict] = {}
        # replica -> (unit, local micro-batch, backward?) -> [(param, dst, bytes)]
        self.uses: dict[int, dict] = {}
        # (replica, bucket, local micro-batch) -> the member of its gradient collective
        self.rs_member: dict[tuple, int] = {}
        self._study()

    # ---------------------------------------------------------------------- the step's gradients
    def _inputs(self, i):
        return [self.src[self.in_edges[k]] for k in range(self.in_ptr[i], self.in_ptr[i + 1])]

    def _own(self, i):
        """A sum's own micro-batch's value (micro-batch k's gradient in acc{k})."""
        k = self.chain[i]
        return next(s for s in self._inputs(i) if self.mb[s] == k)

    def _prev(self, i):
        """A sum's running total before it (the sum of micro-batch k-1, or micro-batch 0's value)."""
        own = self._own(i)
        return next(s for s in self._inputs(i) if s != own)

    def _resolve(self, i, r):
        """What op ``i`` of the source is in replica r, and the output slot that holds it (None: the
        edge's own): a sum past r's micro-batches is r's last sum, the sum at r's first micro-batch is
        that micro-batch's own value (one output of its op, not always the first)."""
        if self.chain[i] < 0:
            return i, None
        last = (r + 1) * self.b - 1
        while self.chain[i] > last:
            p = self._prev(i)
            if self.chain[p] < 0:
                return p, self._slot_into(p, i)
            i = p
        if self.chain[i] % self.b == 0:
            own = self._own(i)
            return own, self._slot_into(own, i)
        return i, None

    def _slot_into(self, a, b):
        return next(self.slot[e] for e in self.in_edges[self.in_ptr[b] : self.in_ptr[b + 1]] if self.src[e] == a)

    def _in_replica(self, i, r):
        if self.chain[i] >= 0:
            if self.chain[i] // self.b != r or self.chain[i] % self.b == 0:
                return False
            if self.level == "zero2" and self.phase[i] == BACKWARD:  # gradient sums only on the owner
                owners = {self.owner[p] for p in self.grad_params.get(self._template(i), ())}
                return not owners or r in owners
            return True
        if self.partitioned and self.phase[i] == UPDATE:
            p = self.param_of_coloc.get(int(self.g.colocation[i]))
            return p is None or self.owner[p] == r
        return self.mb[i] < 0 or self.mb[i] // self.b == r

    def _template(self, i, slot=0):
        """The gradient a value is of, whatever micro-batch or sum it is: (``mm``, 0) for ``acc3_mm`` and
        ``mb1_mm``; the slot tells the outputs of one op apart (a layer norm's weight and bias gradients)."""
        if self.chain[i] >= 0:  # named after the traced node, which may be a view folded into its producer
            own = self._own(i)
            return copied_name(self.g.names[own]), self._slot_into(own, i)
        return copied_name(self.g.names[i]), slot

    def _sharded(self, tpl) -> bool:
        """The gradient is reduce-scattered every micro-batch (ZeRO-2, or a unit FSDP shards)."""
        return self.level == "zero2" or self.fsdp_grad[tpl]

    def _fsdp_update_or_sum(self, i) -> bool:
        """An update op of a parameter FSDP shards, or a sum of such a parameter's gradient."""
        if self.phase[i] == UPDATE:
            p = self.param_of_coloc.get(int(self.g.colocation[i]))
            return p is not None and self.fsdp_param[p]
        if self.chain[i] >= 0 and self.phase[i] == BACKWARD:
            return self.fsdp_grad.get(self._template(i), False)
        return False

    def _study(self):
        """Gradients (by template) with their bytes, parameters and finishing order; buckets; units."""
        g = self.g
        hybrid = self.level in ("ddp", "fsdp")
        self.fsdp_param = [
            self.is_param[i] and hybrid and (self.shard is None or unit_of(g.module[i]) in self.shard)
            for i in range(g.num_ops)
        ]
        param_of_coloc = {}
        for p in np.flatnonzero(parameter_ops(g)).tolist():
            if g.colocation[p] >= 0:
                param_of_coloc[int(g.colocation[p])] = p
        grad_bytes: dict[str, float] = {}
        grad_params: dict[str, list[int]] = defaultdict(list)
        grad_done: dict[str, int] = {}
        grad_final: dict[str, int] = {}  # the op the update reads the gradient from (its last sum)
        for e in range(len(self.src)):
            s, d = self.src[e], self.dst[e]
            if self.phase[d] != UPDATE or self.is_param[s] or self.phase[s] not in (FORWARD, BACKWARD):
                continue
            t = self._template(s, self.slot[e])
            grad_bytes.setdefault(t, self.nbytes[e])
            p = param_of_coloc.get(int(g.colocation[d]))
            if p is not None and p not in grad_params[t]:
                grad_params[t].append(p)
            grad_done[t] = self._own(s) if self.chain[s] >= 0 else s
            grad_final[t] = s
        order = sorted(grad_bytes, key=lambda t: (grad_done[t], t))
        self.grad_params = grad_params
        self.grad_bytes = grad_bytes
        # a gradient FSDP shards is reduce-scattered per unit, the others bucketed in finishing order
        self.fsdp_grad = {t: any(self.fsdp_param[p] for p in grad_params[t]) for t in order}
        self.bucket_of, self.bucket_kind, size, j = {}, {}, 0.0, 0
        key = None
        for t in order:
            if self.fsdp_grad[t]:
                unit = unit_of(g.module[grad_params[t][0]])
                self.bucket_of[t] = f"unit:{unit or 'root'}"
                self.bucket_kind[self.bucket_of[t]] = "fsdp"
                continue
            key, before = self.bucket_key.get(traced_name(g.names[grad_final[t]])), key
            if size > 0 and (size + grad_bytes[t] > self.bucket_bytes or key != before):
                j, size = j + 1, 0.0
            self.bucket_of[t] = f"bucket{j}"
            self.bucket_kind[self.bucket_of[t]] = "zero2" if self.level == "zero2" else "all_reduce"
            size += grad_bytes[t]
        self.buckets = list(dict.fromkeys(self.bucket_of.values()))
        self.update_sinks: dict[int, list[int]] = defaultdict(list)  # parameter -> its last update ops
        upd_of_coloc = defaultdict(list)
        for i in range(g.num_ops):
            if self.phase[i] == UPDATE and g.colocation[i] >= 0:
                upd_of_coloc[int(g.colocation[i])].append(i)
        for c, ops in upd_of_coloc.items():
            p = param_of_coloc.get(c)
            members = set(ops)
            for i in ops:
                outs = range(self.out_ptr[i], self.out_ptr[i + 1])
                if p is not None and not any(self.dst[e] in members for e in outs):
                    self.update_sinks[p].append(i)
        # FSDP: casts and views of parameters alone, per micro-batch (they read the gathered buffer)
        self.derived = [False] * g.num_ops
        for i in range(g.num_ops):
            ins = self._inputs(i)
            if self.phase[i] == FORWARD and self.mb[i] >= 0 and ins:
                self.derived[i] = all(self.fsdp_param[s] or self.derived[s] for s in ins)
        self.param_bytes = {p: float(g.output_bytes[p]) for p in np.flatnonzero(parameter_ops(g)).tolist()}
        self.param_of_coloc = param_of_coloc
        self.owner = zero_owners(g, self.k)
        self.slot0_bytes = dict(self.param_bytes)
        for e in range(len(self.src)):
            if self.is_param[self.src[e]] and self.slot[e] == 0:
                self.slot0_bytes[self.src[e]] = self.nbytes[e]

    # ---------------------------------------------------------------------- the pass
    def run(self) -> PlannedStep:
        g, k = self.g, self.k
        ncoloc = int(g.colocation.max()) + 1 if g.num_ops else 0
        self.ids: list[dict[int, int]] = []
        for r in range(k):
            self.ids.append(self._copy_replica(r, ncoloc))
        for r in range(k):
            self._wire_replica(r)
        self._collectives()
        name = f"{g.name}+{self.level}{k}" + ("" if self.shard is None or not self.shard else "+shard")
        graph, replica = self.draft.freeze(name, {**g.metadata, "data_parallel": self.meta})
        return PlannedStep(graph, replica, k, self.level)

    def _name(self, r, name):
        return f"r{r}/{name}" if self.k > 1 else name

    def _copy_replica(self, r, ncoloc):
        g, d, k = self.g, self.draft, self.k
        ids = {}
        for i in range(g.num_ops):
            if not self._in_replica(i, r):
                continue
            base = float(self._own(i)) + 0.5 if self.chain[i] >= 0 else float(i)
            change = {}
            scale = 1.0
            if self._fsdp_update_or_sum(i):
                scale = 1.0 / k  # every rank updates (and sums the gradients of) its shard of the parameter
            if self.is_param[i]:
                state = float(g.persistent_bytes[i]) - self.param_bytes[i]
                if self.partitioned:
                    change["persistent_bytes"] = self.param_bytes[i] + (state if self.owner[i] == r else 0.0)
                elif self.fsdp_param[i]:
                    change["persistent_bytes"] = float(g.persistent_bytes[i]) / k
                    change["output_bytes"] = self.param_bytes[i] / k
            if self.derived[i]:
                scale = 1.0 / k
                change.update(inplace=True)
            if g.colocation[i] >= 0:
                change["colocation"] = int(g.colocation[i]) + r * ncoloc
            ids[i] = d.copy(i, self._name(r, g.names[i]), (base, r, i), r, scale=scale, **change)
        for i, new in ids.items():
            b = int(g.inplace_base[i])
            if g.inplace[i] and b >= 0 and not self.derived[i]:
                rb = self._resolve(b, r)[0]
                d.set(new, "inplace_base", ids.get(rb, -1))
        return ids

    def _wire_replica(self, r):
        ids, d, first = self.ids[r], self.draft, r * self.b
        grads = self.grads_r.setdefault(r, defaultdict(list))
        uses_r = self.uses.setdefault(r, defaultdict(list))
        derived_bwd = []
        for e in range(len(self.src)):
            s, t = self.src[e], self.dst[e]
            if t not in ids and not self.partitioned:
                continue
            s, held = self._resolve(s, r)
            if s not in ids:
                continue
            slot = self.slot[e] if held is None else held
            kind = self._classify(s, t, slot)
            if t not in ids:  # a gradient reduced for its owner: this rank sends it and keeps no result
                if kind == "grad":
                    tpl = self._template(s, slot)
                    j = self.mb[s] - first if self._sharded(tpl) else -1
                    grads[(self.bucket_of[tpl], j)].append((tpl, ids[s], slot, None, self.nbytes[e]))
                continue
            if kind == "grad":
                tpl = self._template(s, slot)
                j = self.mb[s] - first if self._sharded(tpl) else -1
                grads[(self.bucket_of[tpl], j)].append((tpl, ids[s], slot, ids[t], self.nbytes[e]))
            elif kind == "param":
                back = self.phase[t] == BACKWARD
                uses_r[(unit_of(self.g.module[s]), self.mb[t] - first, back)].append((s, ids[t], self.nbytes[e]))
            elif kind == "derived-backward":
                derived_bwd.append((s, ids[t], slot, self.nbytes[e]))
            else:
                d.edge(ids[s], ids[t], slot, self.nbytes[e])
        clones: dict[int, int] = {}

        def clone(x, before):
            """Cast ``x`` again from the backward gather, just before its first reader (key ``before``)."""
            if x in clones:
                c = clones[x]
                d.key[c] = min(d.key[c], (before - 0.4, r, x))
                return c
            c = d.copy(
                x,
                self._name(r, f"bw:{self.g.names[x]}"),
                (before - 0.4, r, x),
                r,
                scale=1.0 / self.k,
                phase=BACKWARD,
                inplace=True,
            )
            clones[x] = c
            for kk in range(self.in_ptr[x], self.in_ptr[x + 1]):
                e = self.in_edges[kk]
                s = self.src[e]
                if self.is_param[s]:
                    uses_r[(unit_of(self.g.module[s]), self.mb[x] - first, True)].append((s, c, self.nbytes[e]))
                else:
                    d.edge(clone(s, before), c, self.slot[e], self.nbytes[e])
            return c

        for s, t, slot, nbytes in sorted(derived_bwd, key=lambda x: d.key[x[1]]):
            d.edge(clone(s, d.key[t][0]), t, slot, nbytes)

    def _classify(self, s, t, slot):
        if self.is_param[s]:
            if self.fsdp_param[s] and self.mb[t] >= 0 and self.phase[t] in (FORWARD, BACKWARD):
                return "param"
            return "edge"
        if self.derived[s] and self.phase[t] == BACKWARD:
            return "derived-backward"
        tpl = self._template(s, slot) if self.phase[s] in (FORWARD, BACKWARD) else None
        if tpl not in self.bucket_of:
            return "edge"
        if self._sharded(tpl):
            into = self.phase[t] == UPDATE or (self.chain[t] >= 0 and self.phase[t] == BACKWARD)
            return "grad" if into and self.mb[s] >= 0 else "edge"
        return "grad" if self.phase[t] == UPDATE else "edge"

    # ---------------------------------------------------------------------- the collectives
    def _collectives(self):
        k, d = self.k, self.draft
        keys = sorted(
            {key for r in range(k) for key in self.grads_r[r]}, key=lambda x: (x[1], self.buckets.index(x[0]))
        )
        for bucket, j in keys:
            per = [self.grads_r[r].get((bucket, j), []) for r in range(k)]
            tpls = [t for t, b in self.bucket_of.items() if b == bucket]
            slot_of = {t: q for q, t in enumerate(tpls)}
            size = sum(self.grad_bytes[t] for t in tpls)
            how = self.bucket_kind[bucket]
            kind = "all_reduce" if how == "all_reduce" else "reduce_scatter"
            tag = bucket + (f":mb{j}" if j >= 0 else "")
            c = d.add_collective(kind, size * self.reduce_factor, f"{kind}:{tag}")
            for r in range(k):
                kept = {t for t, _, _, dst, _ in per[r] if dst is not None}
                if how == "fsdp":
                    held = size / k
                elif how == "zero2":  # the owner's gradients, whole
                    held = sum(self.grad_bytes[t] for t in kept)
                else:
                    held = 0.0  # in place on the gradients (DDP's bucket views)
                srcs = list(dict.fromkeys((s, sl, nb) for _, s, sl, _, nb in per[r]))
                base = max((d.key[s][0] for s, _, _ in srcs), default=0.0) + 0.3
                mem = d.make(
                    self._name(r, f"{kind}:{tag}"),
                    (base, r, len(d)),
                    r,
                    phase=BACKWARD,
                    microbatch=j + r * self.b if j >= 0 else -1,
                    op_type=kind,
                    collective=c,
                    inplace=how == "all_reduce",
                    output_bytes=held,
                )
                for s, sl, nb in srcs:
                    d.edge(s, mem, sl, nb)
                for t, _, _, dst, nb in per[r]:
                    if dst is not None:
                        d.edge(mem, dst, slot_of[t], nb / k if how == "fsdp" else nb)
                self.rs_member[(r, bucket, j)] = mem
        if self.level in ("zero1", "zero2"):
            self._gather_updated()
        if any(self.fsdp_param):
            self._gather_units()

    def _gather_updated(self):
        k, d = self.k, self.draft
        for bucket in self.buckets:
            tpls = [t for t, b in self.bucket_of.items() if b == bucket]
            params = list(dict.fromkeys(p for t in tpls for p in self.grad_params[t]))
            size = sum(self.param_bytes[p] for p in params)
            c = d.add_collective("all_gather", size, f"all_gather:{bucket}")
            for r in range(k):
                ids = self.ids[r]
                sinks = [ids[u] for p in params if self.owner[p] == r for u in self.update_sinks.get(p, ()) if u in ids]
                base = max((d.key[s][0] for s in sinks), default=float(self.g.num_ops)) + 0.3
                mem = d.make(
                    self._name(r, f"all_gather:{bucket}"),
                    (base, r, len(d)),
                    r,
                    phase=UPDATE,
                    op_type="all_gather",
                    collective=c,
                )
                for s in sinks:
                    d.order(s, mem)
                if self.level == "zero1" and (r, bucket, -1) in self.rs_member:
                    d.order(self.rs_member[(r, bucket, -1)], mem)  # the whole gradients stay until the step ends

    def _gather_units(self):
        """Each unit's parameters gathered before its forward and again before its backward, per micro-batch:
        all of them both times (FSDP unshards the whole unit, whatever the backward reads; a unit whose
        backward reads none of them gathers before its gradients are reduce-scattered)."""
        k, d = self.k, self.draft
        members: dict[int, list[tuple]] = defaultdict(list)  # replica -> [(first reader key, member, reader)]
        fwd = sorted(
            {(u, j) for r in range(k) for (u, j, back) in self.uses[r] if not back}, key=lambda x: (x[1], x[0])
        )
        unit_params: dict[str, list[int]] = defaultdict(list)
        for r in range(1):
            for (u, _, _), lst in self.uses[r].items():
                unit_params[u].extend(p for p, _, _ in lst)
        for u in unit_params:
            unit_params[u] = sorted(set(unit_params[u]))
        for u, j in fwd:
            for back in (False, True):
                per = [self.uses[r].get((u, j, back), []) for r in range(k)]
                readers = [[t for _, t, _ in lst] for lst in per]
                if back and not per[0]:
                    rs = [(r, f"unit:{u or 'root'}", j) for r in range(k)]
                    readers = [[self.rs_member[x]] if x in self.rs_member else [] for x in rs]
                if not readers[0]:
                    continue
                params = unit_params[u]
                slot_of = {p: q for q, p in enumerate(params)}
                size = sum(self.param_bytes[p] for p in params) * self.param_factor
                tag = f"{u or 'root'}:mb{j}:{'backward' if back else 'forward'}"
                c = d.add_collective("all_gather", size, f"all_gather:{tag}")
                for r in range(k):
                    ids = self.ids[r]
                    first = min(readers[r], key=lambda t: d.key[t])
                    mem = d.make(
                        self._name(r, f"all_gather:{tag}"),
                        (d.key[first][0] - 0.45, r, len(d)),
                        r,
                        phase=BACKWARD if back else FORWARD,
                        microbatch=j + r * self.b,
                        op_type="all_gather",
                        collective=c,
                        output_bytes=size,
                    )
                    for p in params:
                        d.edge(ids[p], mem, 0, self.slot0_bytes[p])
                    for p, t, nb in per[r]:
                        d.edge(mem, t, slot_of[p], nb)
                    if not per[r]:
                        for t in readers[r]:
                            d.order(mem, t)
                    members[r].append((d.key[first][0], mem, first))
        for r in range(k):  # prefetch: a gather waits for the previous gather's first reader
            seq = sorted(members[r])
            for (_, _, reader), (_, mem, _) in zip(seq, seq[1:], strict=False):
                d.order(reader, mem)


def zero_owners(g: OpGraph, k: int) -> dict[int, int]:
    """Which of k ranks owns each parameter op of ``g`` under ZeRO-1/2 (its optimizer state, its update, its
    reduced gradient): :func:`owners_of` over the parameters' persistent bytes in the graph's parameter order.
    The launcher's ``zero1`` ranks (:mod:`postplace.runtime.ddp`) own the same parameters."""
    params = np.flatnonzero(parameter_ops(g)).tolist()
    return dict(zip(params, owners_of([float(g.persistent_bytes[p]) for p in params], k), strict=True))


def owners_of(sizes, k: int) -> list[int]:
    """ZeRO's owners of parameters of ``sizes`` bytes, in order: as DeepSpeed, the flat parameters cut into k
    contiguous ranges of about equal size; a parameter belongs, whole, to the rank whose range holds its
    middle."""
    total = float(sum(sizes)) or 1.0
    owner, before = [], 0.0
    for size in sizes:
        owner.append(min(k - 1, int((before + size / 2) / total * k)))
        before += size
    return owner
