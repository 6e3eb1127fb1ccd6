"""The layered estimate: a plan priced from its units' measured internals, for steps too big to simulate op by op.

At 64 GPUs and a 1M-token batch the op-level step (every micro-batch of every replica) is millions of ops.
But a transformer's step is one block repeated, and the data-parallel replicas and the tensor ranks of a
plan run the same program, so one replica's pipeline is enough, each stage a run of *units* (the
embedding side of the root, each block, the head side) whose times and bytes were measured once:

1. **Measured internals** (:func:`measure_units`): the step traced as TWO micro-batches of the plan's
   size, split over one tensor group (``ddp:tp=T,dp=1,m=2``, recomputing or not) and simulated op by op.
   Per unit, on the group's first GPU: the second micro-batch's forward and backward time (its backward
   with the gradient sums it adds, as every micro-batch after the first), the op times scaled so that
   the step's ops fill the time they took (the tensor all-reduces overlap some compute); its parameter,
   optimizer-state and saved-activation bytes (the simulator's memory at the second forward's end); the
   bytes its forward hands to later units. The update's time is shared out by parameter bytes (its
   foreach kernels take time in proportion to the bytes they touch).
2. **The plan on those units** (:func:`estimate_plan`): the first replica's pp GPUs, each with a compute
   stream and a communication stream that run their tasks in program order, as the simulator's devices
   and collectives do:

   - the schedule's slots in :func:`postplace.plans.schedule.slot_order`'s order, each ready when its
     micro-batch's forward from the previous chunk (backward from the next) has arrived, a point-to-point
     send of the boundary's bytes (:meth:`postplace.cluster.Cluster.transfer_time`); stage s holds the
     units the cut gives it (contiguous, balanced by time; interleaved: blocks cut evenly into pp x V
     chunks, as :func:`postplace.placers.practitioner.pipeline_stages` cuts them);
   - ``ddp``, ``zero1``, ``zero2``: gradients reduced in buckets of ``bucket_bytes`` in the order the last
     micro-batch's backward finalises them (ZeRO-2: every micro-batch's), an all-reduce (DDP, ZeRO-1) or a
     reduce-scatter (ZeRO-2) over the stage's data-parallel group, priced by
     :func:`postplace.sim.collectives.collective_cost` (the simulator's own formula); a unit's buckets are
     one task that ends when the last of them would; each unit's update after its reduction (the busiest
     ZeRO owner's share of it under ZeRO: whole parameters, as the op-level plan owns them), then ZeRO's
     all-gather of its fp32 parameters;
   - ``fsdp``: per micro-batch each unit's parameters gathered (in the step's precision) before its
     forward and again before its backward, one gather in flight ahead of the compute; its gradients
     reduce-scattered in fp32 after its backward, the update of the shard after the last. The root's two
     sides are one unit, gathered for the whole forward, as the op-level plan gathers it;
   - a per-unit hybrid (``ddp:shard=root/blocks.0-9``, no pipeline): the units it names as FSDP runs them,
     the others' gradients all-reduced in DDP's buckets after the last micro-batch's backward.

   Memory per GPU: the parameters, gradients and state each level keeps (a shard or whole; ZeRO: the
   busiest owner's), the gathered units in flight, the saved activations of the (micro-batch, chunk)
   pairs the slot order holds at once (a unit FSDP shards keeps no cast of its parameters: the backward
   casts the second gather), gradient sums from the first backward on, and the transient an accumulating
   backward needed in the measured step.

**GPUs of several models** (a cluster grown in two purchases): :func:`measured_rule` measures the units on a
tensor group of each model among the plan's GPUs. A stage's GPUs (every replica's, every tensor rank's) meet
in a collective at every unit or bucket, so the stage runs each unit at the slowest of its models' measured
times; each stage's peak is held against its own GPUs' memory. The cut (when not given) balances the stages'
times each on its own GPUs, as the op level's cut does (:func:`postplace.placers.practitioner.pipeline_stages`).

It leaves out contention between different groups' collectives on shared links, the op-level list
scheduler's reordering inside a slot, and the bucket boundaries inside a unit (its gradients are final
evenly over its backward). ``tests/test_layered.py`` holds it against the op-level simulation where both
run; :mod:`postplace.placers.layered_grid` runs the practitioner's grid on it, ``benchmarks/layered.py`` measures
both at 64 GPUs.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, replace

import numpy as np
from numba import njit

from postplace.errors import PostplaceError
from postplace.placers.practitioner import replica_sizes

__all__ = [
    "LayeredResult",
    "UnitCosts",
    "estimate_plan",
    "measure_units",
    "measured_rule",
    "measured_sizes",
    "mix_recompute",
    "op_level_cut",
    "plan_costs",
    "repeat_blocks",
    "sharded_units",
]

PRE, POST = "(embedding side)", "(head side)"
_BUCKET_BYTES = 25 * 2**20


@dataclass(frozen=True)
class UnitCosts:
    """One micro-batch's units, measured on a tensor group's first GPU (every size per tensor rank).

    Parameters
    ----------
    names : tuple of str
        ``(embedding side)``, the numbered units in order, ``(head side)``.
    forward_s, backward_s, accumulate_s, update_s : numpy.ndarray
        Seconds per unit: its forward, its backward (with the recomputed forward when measured so), the
        sums adding a micro-batch's gradients to the earlier ones', its share of the whole update.
    param_bytes, state_bytes : numpy.ndarray
        Its fp32 parameters; its optimizer state (and buffers).
    param_sizes : tuple of tuple of float
        Its parameters' persistent bytes one by one, in the step's order (ZeRO's owners are cut from them).
    activation_bytes : numpy.ndarray
        What its forward keeps for the backward, one micro-batch.
    boundary_bytes : numpy.ndarray
        What the units up to this one send to the later ones in one micro-batch's forward (a pipeline cut
        after it sends that; the backward sends the same back).
    transient_bytes : float
        The most an accumulating backward holds beyond the activations at its forward's end.
    single_bytes : float
        The first micro-batch's peak beyond the persistent bytes (no gradient sum lives through its forward).
    gather_dtype_bytes : float
        Bytes per parameter element FSDP gathers (the step's precision: 2 for bf16).
    tensor : int
    recompute : bool
    step_time_s : float
        The measured (op-level) step's time.
    recomputed : tuple of str, optional
        With ``recompute``: the units whose costs are the recomputing ones (:func:`mix_recompute`); None:
        every block.
    selective : bool
        With ``recompute``: measured under torchtitan's selective op rule (the step's ``+selective``).
    selected : tuple of str
        In a mix (``recomputed`` not None): the units whose costs are the selective rule's.
    model : str
        The GPU model they were measured on ("": not said).
    by_model : tuple of (str, UnitCosts)
        The same units measured on the other GPU models of a plan's GPUs (:func:`measured_rule` over GPUs of
        several models); empty when one model was measured.
    sequence : bool
        Measured with sequence parallelism over the tensor group (``sp``).
    micro_size : int
        Sequences per micro-batch they were measured at, where a plan gives each GPU model its own (``mbs=``;
        :func:`measured_sizes`); 0: not said (the plan's one size).
    tied : bool
        The embedding's table is the head's too (GPT-2): :func:`postplace.plans._step.tied_embedding`.
    cast_bytes : numpy.ndarray, optional
        Of ``activation_bytes``, the copies of its parameters in the step's precision that its forward keeps
        for the backward; a unit FSDP shards keeps none (its backward casts the second gather again). None:
        none measured.
    """

    names: tuple[str, ...]
    forward_s: np.ndarray
    backward_s: np.ndarray
    accumulate_s: np.ndarray
    update_s: np.ndarray
    param_bytes: np.ndarray
    param_sizes: tuple[tuple[float, ...], ...]
    state_bytes: np.ndarray
    activation_bytes: np.ndarray
    boundary_bytes: np.ndarray
    transient_bytes: float
    gather_dtype_bytes: float
    tensor: int
    recompute: bool
    single_bytes: float
    step_time_s: float
    recomputed: tuple[str, ...] | None = None
    selective: bool = False
    selected: tuple[str, ...] = ()
    model: str = ""
    by_model: tuple[tuple[str, UnitCosts], ...] = ()
    sequence: bool = False
    micro_size: int = 0
    tied: bool = False
    cast_bytes: np.ndarray | None = None

    def held(self, sharded: np.ndarray) -> np.ndarray:
        """What each unit's forward keeps for the backward, one micro-batch, where FSDP shards the units of
        the mask ``sharded``."""
        if self.cast_bytes is None:
            return self.activation_bytes
        return self.activation_bytes - np.where(sharded, self.cast_bytes, 0.0)

    def on(self, model: str) -> UnitCosts:
        """These units as measured on GPUs of ``model``; one line when they were not."""
        if not self.model or model == self.model:
            return self
        for name, costs in self.by_model:
            if name == model:
                return costs
        raise PostplaceError(
            f"the units were measured on {', '.join([self.model, *(m for m, _ in self.by_model)])} GPUs, not on "
            f"{model}: measure them over every GPU of the plan (postplace.placers.layered.measured_rule)"
        )

    def rules(self) -> dict[str, str]:
        """How each block's costs recompute: ``"full"``, ``"selective"`` or ``""`` (as
        :meth:`postplace.plans.PlanSpec.recompute_rules` says of a plan)."""
        blocks = self.names[1:-1]
        if not self.recompute:
            return dict.fromkeys(blocks, "")
        if self.recomputed is None:
            return dict.fromkeys(blocks, "selective" if self.selective else "full")
        rules = dict.fromkeys(blocks, "")
        rules.update(dict.fromkeys(self.recomputed, "full"))
        rules.update(dict.fromkeys(self.selected, "selective"))
        return rules


@dataclass(frozen=True)
class LayeredResult:
    """A plan priced by :func:`estimate_plan`: ``step_time_s``; the per-GPU ``peak_bytes`` of ``peak_stage``,
    the stage fullest against its own GPUs' memory (every stage's in ``stage_peaks``, every one of the plan's
    GPUs' in ``gpu_peaks``, in the order they were given: where each GPU model runs micro-batches of its own
    size, each model's own); ``oom`` when a GPU's peak is above its capacity; ``stage_units`` (each chunk's
    unit names)."""

    plan: str
    step_time_s: float
    peak_bytes: float
    peak_stage: int
    oom: bool
    stage_units: tuple[tuple[str, ...], ...]
    stage_peaks: tuple[float, ...] = ()
    gpu_peaks: tuple[float, ...] = ()


def measure_units(
    graph,
    cluster,
    gpus: list[int],
    *,
    tensor: int = 1,
    recompute: bool = False,
    selective: bool = False,
    sequence: bool = False,
    cost_model=None,
):
    """The units of ``graph`` (a step traced as two micro-batches) measured on one tensor group of ``tensor``
    of ``gpus`` (see the module docstring; with sequence parallelism where ``sequence``), every block
    recomputed (by torchtitan's selective op rule with ``selective``) or none: a :class:`UnitCosts`."""
    from postplace.cost import priced_on
    from postplace.graph import PHASES
    from postplace.placers.practitioner import plan_step
    from postplace.plans import PlanSpec
    from postplace.plans._step import (
        chain_positions,
        microbatch_count,
        numbered_units,
        parameter_ops,
        tied_embedding,
        traced_name,
        units,
    )
    from postplace.sim import Simulator
    from postplace.sim.trace import memory_over_time

    if microbatch_count(graph) != 2:
        raise PostplaceError(
            f"the layered estimate measures a step traced as two micro-batches (the second one accumulates its "
            f"gradients, as every one after the first does); '{graph.name}' has {microbatch_count(graph)}: trace "
            "it at twice the micro-batch's size with microbatches=2"
        )
    blocks = numbered_units(graph)
    if not blocks:
        raise PostplaceError(f"the layered estimate needs numbered units (blocks); '{graph.name}' has none")
    selective = bool(selective and recompute)
    spec = PlanSpec(
        "ddp",
        recompute=recompute,
        microbatches=2,
        replicas=1,
        tensor=tensor if tensor > 1 else None,
        selective=selective,
        sequence=sequence and tensor > 1,
    )
    res = plan_step(graph, cluster, spec, list(gpus[:tensor]), cost_model=cost_model)
    g = res.graph
    cpus = [d for d, dev in enumerate(cluster.devices) if dev.kind == "cpu"]
    sim = Simulator(g, cluster, cost_model=priced_on(cost_model, cluster, [*gpus[:tensor], *cpus]))
    sched = sim.schedule(res.placement)
    d0 = gpus[0]
    unit = units(g)
    fwd, bwd, upd = (PHASES.index(p) for p in ("forward", "backward", "update"))
    # the root's modules on the embedding side: those whose forward runs before the first block's, in the
    # first micro-batch (a module the forward also calls later, such as the top module, is the head side's)
    forward0 = [i for i in range(g.num_ops) if g.phase[i] == fwd and g.microbatch[i] == 0]
    first_block = next(k for k, i in enumerate(forward0) if unit[i])
    pre_modules = {g.module[i] for i in forward0[:first_block] if not unit[i]}
    pre_modules -= {g.module[i] for i in forward0[first_block:] if not unit[i]}
    index = {u: k + 1 for k, u in enumerate(blocks)}
    n = len(blocks) + 2
    on_d0 = sched.device == d0
    mine = np.flatnonzero(on_d0)
    which = np.array(
        [index[unit[i]] if unit[i] else (0 if g.module[i] in pre_modules else n - 1) for i in range(g.num_ops)]
    )
    clone = np.array([traced_name(nm, keep_clones=True).startswith("rc:") for nm in g.names])
    summing = (chain_positions(g) == 1) & (g.phase == bwd)  # the gradient sums after micro-batch 1
    second = g.microbatch == 1
    is_f = (g.phase == fwd) & ~clone
    is_b = (g.phase == bwd) | (clone & (g.phase == fwd))
    busy = sched.op_end - sched.op_start
    # the second micro-batch's units (its backward with the gradient sums it adds), the overlap of the
    # tensor all-reduces shared out so that both micro-batches' work fills the time they took
    b_done = float(sched.op_end[mine[is_b[mine]]].max())
    before = mine[(sched.op_end[mine] <= b_done) & (g.phase[mine] != upd)]
    scale = b_done / max(float(busy[before].sum()), 1e-30)
    forward = np.bincount(which[mine], weights=np.where(is_f & second, busy, 0.0)[mine], minlength=n) * scale
    backward = np.bincount(which[mine], weights=np.where(is_b & second, busy, 0.0)[mine], minlength=n) * scale
    accumulate = np.bincount(which[mine], weights=np.where(summing, busy, 0.0)[mine], minlength=n) * scale
    params = parameter_ops(g)
    param_bytes, persistent = np.zeros(n), np.zeros(n)
    sizes: list[list[float]] = [[] for _ in range(n)]
    for i in mine.tolist():
        persistent[which[i]] += g.persistent_bytes[i]
        if params[i]:
            param_bytes[which[i]] += g.output_bytes[i]
            sizes[which[i]].append(float(g.persistent_bytes[i]))
    update_total = max(sched.step_time - b_done, 0.0) + float(
        busy[mine[(g.phase[mine] == upd) & (sched.op_end[mine] <= b_done)]].sum()
    )
    update = update_total * param_bytes / max(param_bytes.sum(), 1.0)
    saved = np.zeros(g.num_ops, dtype=bool)
    src, dst = g.edge_src, g.edge_dst
    saved[src[is_f[src] & is_b[dst]]] = True
    saved &= on_d0 & second
    activation = np.bincount(which[saved], weights=g.output_bytes[saved], minlength=n)
    # of them, the casts of a parameter (every input a parameter): FSDP makes those again from its second gather
    param_input = np.zeros(g.num_ops, dtype=np.int64)
    np.add.at(param_input, dst, params[src])
    is_cast = saved & (param_input > 0) & (param_input == np.diff(g.in_ptr))
    cast = np.bincount(which[is_cast], weights=g.output_bytes[is_cast], minlength=n)
    # the activations: the outputs a unit's forward leaves for the backward (or its recomputation); the
    # simulator's own memory on the group's first GPU gives the rest: the most the second backward holds
    # beyond the persistent bytes, the first micro-batch's gradients and the second one's activations (its
    # gradients before they are summed, the head's logits: the whole model's, charged to every stage, so a
    # stage's estimate errs high), and the first micro-batch's peak
    times, held = memory_over_time(sim.problem, sched.device)[d0]
    resident = float(held[0])
    f_end = float(sched.op_end[mine[(is_f & second)[mine]]].max())
    first_done = float(sched.op_end[mine[(is_b & (g.microbatch == 0))[mine]]].max())
    transient = float(held[(times >= f_end) & (times <= b_done)].max()) - (
        resident + param_bytes.sum() + activation.sum()
    )
    single = float(held[times <= first_done].max()) - resident
    # what a cut after unit k sends in one micro-batch's forward: each value made at or before k and read after
    # it, once (the simulator sends a value once per receiving GPU, whatever its readers there)
    crossing = is_f[src] & is_f[dst] & second[src] & on_d0[src] & (which[src] < which[dst])
    value = src[crossing] * (int(g.edge_slot.max(initial=0)) + 1) + g.edge_slot[crossing]
    order = np.lexsort((-which[dst[crossing]], value))
    first = np.concatenate([[True], value[order][1:] != value[order][:-1]]) if len(order) else np.zeros(0, bool)
    latest = order[first]  # per value: the edge to its latest reader
    boundary = np.zeros(n + 1)
    np.add.at(boundary, which[src[crossing][latest]], g.edge_bytes[crossing][latest])
    np.add.at(boundary, which[dst[crossing][latest]], -g.edge_bytes[crossing][latest])
    boundary = np.cumsum(boundary)[:n]
    precision = graph.metadata.get("precision") or "fp32"
    return UnitCosts(
        names=(PRE, *blocks, POST),
        forward_s=forward,
        backward_s=backward,
        accumulate_s=accumulate,
        update_s=update,
        param_bytes=param_bytes,
        param_sizes=tuple(tuple(x) for x in sizes),
        state_bytes=persistent - param_bytes,
        activation_bytes=activation,
        boundary_bytes=boundary,
        transient_bytes=transient,
        single_bytes=single,
        gather_dtype_bytes=2.0 if precision in ("bf16", "fp16") else 4.0,
        tensor=tensor,
        recompute=recompute,
        step_time_s=float(sched.step_time),
        selective=selective,
        model=cluster.devices[d0].model,
        sequence=spec.sequence,
        tied=tied_embedding(graph),
        cast_bytes=cast,
    )


class _Streams:
    """Streams that each run their tasks in program order (the order they were added); a task starts when its
    stream is free and what it waits for has started (``("s", task)``) or ended (``("e", task)``), plus a lag."""

    def __init__(self):
        self.stream: list[int] = []
        self.seconds: list[float] = []
        self.waits: list[list] = [[], [], [], []]  # the waiting task, the task waited for, on its end?, lag

    def add(self, stream: int, seconds: float, after=()) -> int:
        t = len(self.stream)
        self.stream.append(stream)
        self.seconds.append(float(seconds))
        for kind, other, lag in after:
            self.waits[0].append(t)
            self.waits[1].append(other)
            self.waits[2].append(kind == "e")
            self.waits[3].append(float(lag))
        return t

    def add_many(self, stream: int, seconds) -> int:
        """Tasks one after another on ``stream``: the first one's id (the rest follow)."""
        first = len(self.stream)
        self.seconds.extend(np.asarray(seconds, dtype=np.float64).tolist())
        self.stream.extend([stream] * (len(self.seconds) - first))
        return first

    def depend(self, tasks, others, on_end: bool, lags) -> None:
        """Each of ``tasks`` waits for the same position of ``others`` (its end, else its start) plus a lag."""
        tasks = np.asarray(tasks).tolist()
        self.waits[0].extend(tasks)
        self.waits[1].extend(np.asarray(others).tolist())
        self.waits[2].extend([on_end] * len(tasks))
        self.waits[3].extend(np.asarray(lags, dtype=np.float64).tolist())

    def run(self) -> tuple[np.ndarray, np.ndarray]:
        n = len(self.stream)
        dur = np.asarray(self.seconds, dtype=np.float64)
        waiting = np.asarray(self.waits[0], dtype=np.int64)
        by_task = np.argsort(waiting, kind="stable")
        dep_ptr = np.concatenate([[0], np.cumsum(np.bincount(waiting, minlength=n))]).astype(np.int64)
        dep_task = np.asarray(self.waits[1], dtype=np.int64)[by_task]
        dep_end = np.asarray(self.waits[2], dtype=np.bool_)[by_task]
        dep_lag = np.asarray(self.waits[3], dtype=np.float64)[by_task]
        _, stream = np.unique(np.asarray(self.stream, dtype=np.int64), return_inverse=True)
        order_task = np.argsort(stream, kind="stable").astype(np.int64)
        order_ptr = np.concatenate([[0], np.cumsum(np.bincount(stream))]).astype(np.int64)
        start, end, ok = _run_streams(dur, dep_ptr, dep_task, dep_end, dep_lag, order_ptr, order_task)
        if not ok:
            raise PostplaceError("layered estimate: the plan's tasks wait on each other (a cycle)")
        return start, end


@njit(cache=True)
def _run_streams(dur, dep_ptr, dep_task, dep_end, dep_lag, order_ptr, order_task):  # pragma: no cover - numba
    """Each stream's tasks in its order, a task started when its stream is free and its dependences are met."""
    n = dur.shape[0]
    streams = order_ptr.shape[0] - 1
    start = np.full(n, np.nan)
    end = np.full(n, np.nan)
    head = order_ptr[:-1].copy()
    free = np.zeros(streams)
    left = n
    while left > 0:
        progress = False
        for s in range(streams):
            while head[s] < order_ptr[s + 1]:
                t = order_task[head[s]]
                ready = free[s]
                met = True
                for k in range(dep_ptr[t], dep_ptr[t + 1]):
                    at = end[dep_task[k]] if dep_end[k] else start[dep_task[k]]
                    if at != at:
                        met = False
                        break
                    ready = max(ready, at + dep_lag[k])
                if not met:
                    break
                start[t] = ready
                end[t] = ready + dur[t]
                free[s] = end[t]
                head[s] += 1
                left -= 1
                progress = True
        if not progress:
            return start, end, False
    return start, end, True


@functools.lru_cache(maxsize=256)
def _slots(schedule: str, gpu: int, gpus: int, count: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """:func:`postplace.plans.schedule.slot_order` as arrays: kind (0 forward, 1 backward), micro-batch, chunk."""
    from postplace.plans.schedule import slot_order

    order = slot_order(schedule, gpu, gpus, count)
    out = np.array([(k == "B", mb, c) for k, mb, c in order], dtype=np.int64).reshape(-1, 3)
    return out[:, 0], out[:, 1], out[:, 2]


def _cut(costs: UnitCosts, pp: int, v: int, stage_costs: list[UnitCosts] | None = None) -> list[list[int]]:
    """Each chunk's units: interleaved cuts the blocks evenly (the root's sides with the first and last
    chunks), else contiguous runs balanced by forward plus backward time, each stage's on its own GPUs
    (``stage_costs``; default ``costs`` for all): the smallest largest stage."""
    n = len(costs.names)
    blocks = list(range(1, n - 1))
    if pp * v > len(blocks):
        raise PostplaceError(
            f"layered estimate: pp={pp} x {v} chunks needs as many blocks; the model has {len(blocks)}: lower pp"
        )
    if v > 1:
        chunks = [[] for _ in range(pp * v)]
        for k, u in enumerate(blocks):
            chunks[k * pp * v // len(blocks)].append(u)
        chunks[0].insert(0, 0)
        chunks[-1].append(n - 1)
        return chunks
    prefix = [np.concatenate([[0.0], np.cumsum(c.forward_s + c.backward_s)]) for c in (stage_costs or [costs] * pp)]
    # best[k][i]: the smallest largest stage for units 0..i-1 in k stages, every stage at least one block
    best = np.full((pp + 1, n + 1), np.inf)
    back = np.zeros((pp + 1, n + 1), dtype=np.int64)
    best[0][0] = 0.0
    for k in range(1, pp + 1):
        for i in range(2, n + 1):
            j = np.arange(min(i, n - 1))  # units j..i-1, at least one block among them
            cand = np.maximum(best[k - 1][j], prefix[k - 1][i] - prefix[k - 1][j])
            back[k][i] = int(np.argmin(cand))
            best[k][i] = cand[back[k][i]]
    chunks, i = [], n
    for k in range(pp, 0, -1):
        j = int(back[k][i])
        chunks.append(list(range(j, i)))
        i = j
    return chunks[::-1]


def estimate_plan(
    costs: UnitCosts, cluster, spec, devices: list[int], *, cut=None, bucket_bytes: float = _BUCKET_BYTES
) -> LayeredResult:
    """``spec`` (a :class:`postplace.plans.PlanSpec` with its micro-batch count) on ``devices`` (the plan's
    GPUs in its rank order) priced from ``costs`` (measured at ``spec``'s tensor degree, recomputation and
    micro-batch size): a :class:`LayeredResult`. See the module docstring.

    ``cut``: each pipeline chunk's unit names (``costs.names``), to price a given cut; None: the plan's
    ``stage_blocks`` when it has them, else the cut of the module docstring."""
    from postplace.plans.schedule import chunks_of
    from postplace.sim.collectives import collective_cost_cached

    tp, pp = spec.tensor or 1, spec.pipeline or 1
    if spec.micro_sizes is not None:
        replica_sizes(spec, cluster, devices)  # one line for a group of two models or a model not named
    if tp != costs.tensor:
        raise PostplaceError(f"plan '{spec}': the units were measured at tp={costs.tensor}; measure them at tp={tp}")
    if spec.sequence != costs.sequence:
        said = "with" if costs.sequence else "without"
        raise PostplaceError(f"plan '{spec}': the units were measured {said} sp; measure them as the plan says")
    _check_units(spec, costs.names[1:-1])
    if spec.recompute_rules(costs.names[1:-1]) != costs.rules():
        raise PostplaceError(
            f"plan '{spec}': the unit costs given recompute other blocks, or by another rule, than the plan "
            "does; build them with postplace.placers.layered.plan_costs"
        )
    dp = len(devices) // (tp * pp)
    m = spec.microbatches or dp
    if dp < 1 or len(devices) != dp * tp * pp or m % dp:
        raise PostplaceError(f"plan '{spec}': {len(devices)} GPUs and m={m} do not make dp x tp x pp replicas")
    level, per = spec.level, m // dp
    if pp > 1 and (level == "fsdp" or spec.shard is not None):  # DeepSpeed and Megatron-LM: ZeRO-1 at most
        what = "FSDP (a unit sharded by shard=)" if level != "fsdp" or spec.shard else "FSDP"
        raise PostplaceError(
            f"plan '{spec}': {what} inside a pipeline is not priced by the layered estimate; use zero1 or ddp with pp"
        )
    sharded = sharded_units(spec, costs.names)
    if level in ("ddp", "fsdp"):  # a per-unit hybrid runs FSDP's program where any unit is sharded, else DDP's
        level = "fsdp" if sharded.any() else "ddp"
    if pp > 1 and costs.tied and spec.schedule != "gpipe":
        raise PostplaceError(  # as the op level refuses it (plans.schedule): its stages would not form a chain
            f"plan '{spec}': the embedding's table is the output head's too, read on the first stage and the last, "
            "so 1F1B's stages do not form a chain (plans do not model Megatron-LM's copy of a tied embedding); "
            "use schedule=gpipe"
        )
    if level == "zero2" and pp > 1:
        raise PostplaceError(
            f"plan '{spec}': ZeRO-2 inside a pipeline is not priced by the layered estimate; use zero1 or ddp with pp"
        )
    if spec.replicas is not None and spec.replicas != dp:
        raise PostplaceError(
            f"plan '{spec}': dp={spec.replicas} and {len(devices)} GPUs make dp={dp}; give as many GPUs"
        )
    # each stage's GPUs (every replica's, every tensor rank's) run in step: a stage whose GPUs are of several
    # models runs each unit at its slowest model's time
    stage_gpus = [[devices[tp * (r + dp * s) + j] for r in range(dp) for j in range(tp)] for s in range(pp)]
    if not costs.model and len({cluster.devices[d].model for d in devices}) > 1:
        raise PostplaceError(
            f"plan '{spec}': its GPUs are of several models and the unit costs say not which they were measured on; "
            "measure them with postplace.placers.layered.measured_rule over the plan's GPUs"
        )
    if spec.micro_sizes is not None:
        _check_sizes(spec, costs, {cluster.devices[d].model for d in devices})
    try:
        stage_costs = [
            _slowest([costs.on(m) for m in sorted({cluster.devices[d].model for d in g})]) for g in stage_gpus
        ]
    except PostplaceError as exc:
        raise PostplaceError(f"plan '{spec}': {exc}") from None
    schedule = (spec.schedule if pp > 1 else None) or "1f1b"  # one stage: F0 B0 F1 B1 ..., accumulation
    v = chunks_of(schedule)
    if cut is None and spec.stage_blocks is not None:  # the plan's own blocks per stage
        n_blocks = len(costs.names) - 2
        if sum(spec.stage_blocks) != n_blocks or len(spec.stage_blocks) != pp * v:
            raise PostplaceError(
                f"plan '{spec}': stages= gives {sum(spec.stage_blocks)} blocks to {len(spec.stage_blocks)} stages; "
                f"the model has {n_blocks} blocks and the plan {pp * v} chunks"
            )
        edges = np.concatenate([[1], 1 + np.cumsum(spec.stage_blocks)])
        edges[0], edges[-1] = 0, n_blocks + 2  # the embedding side first, the head side last
        cut = [[costs.names[u] for u in range(a, b)] for a, b in zip(edges[:-1], edges[1:], strict=True)]
    if cut is None:
        chunks = _cut(costs, pp, v, stage_costs)
    else:
        where = {u: k for k, u in enumerate(costs.names)}
        chunks = [[where[u] for u in names] for names in cut]
        n_units = len(costs.names)
        if len(chunks) != pp * v or [u for c in chunks for u in c] != list(range(n_units)) or not all(chunks):
            raise PostplaceError(
                f"plan '{spec}': a cut gives each of {pp * v} chunks a run of the units, in order and none empty "
                "(the embedding side first, the head side last)"
            )
    nc = len(chunks)
    gpu_of = [devices[tp * dp * (c % pp)] for c in range(nc)]
    group = [
        tuple(devices[tp * (r + dp * s)] for r in range(dp)) for s in range(pp)
    ]  # each stage's first tensor rank in every replica

    @functools.cache
    def coll(kind: str, nbytes: float, s: int) -> float:
        return collective_cost_cached(cluster, kind, float(nbytes), group[s]).seconds if dp > 1 else 0.0

    of_chunk = [stage_costs[c % pp] for c in range(nc)]
    f_arr, b_arr, acc_arr = (
        np.array([float(getattr(of_chunk[k], a)[c].sum()) for k, c in enumerate(chunks)])
        for a in ("forward_s", "backward_s", "accumulate_s")
    )
    held_by_stage = [sc.held(sharded) for sc in stage_costs]
    act_arr = np.array([float(held_by_stage[k % pp][c].sum()) for k, c in enumerate(chunks)])
    # after a replica's first micro-batch each backward adds its gradients to the sums: whole ones (DDP,
    # ZeRO-1), or the reduced shard (ZeRO-2 and FSDP reduce every micro-batch's)
    acc_arr /= dp if level in ("zero2", "fsdp") else 1
    p2p_arr = np.array(
        [
            *(
                cluster.transfer_time(float(costs.boundary_bytes[chunks[c][-1]]), gpu_of[c], gpu_of[c + 1])
                for c in range(nc - 1)
            ),
            0.0,
        ]
    )
    upd_per_byte = [sc.update_s.sum() / max(sc.param_bytes.sum(), 1.0) for sc in stage_costs]
    st = _Streams()
    if level == "fsdp":
        _hybrid(st, stage_costs[0], chunks[0], per, coll, upd_per_byte[0], dp, sharded, bucket_bytes)
    else:
        # program order per GPU: its slots, as arrays; slot_id[F or B, micro-batch, chunk] = the task
        slot_id = np.full((2, per, nc), -1, dtype=np.int64)
        for s in range(pp):
            kind, mb, c = _slots(schedule, s, pp, per)
            seconds = np.where(kind == 0, f_arr[c], b_arr[c] + np.where(mb > 0, acc_arr[c], 0.0))
            slot_id[kind, mb, c] = st.add_many(2 * s, seconds) + np.arange(len(kind))
        mb_all, c_all = np.meshgrid(np.arange(per), np.arange(nc), indexing="ij")
        later = c_all > 0  # a chunk's forward waits for the previous chunk's, sent
        st.depend(slot_id[0][later], slot_id[0, mb_all[later], c_all[later] - 1], True, p2p_arr[c_all[later] - 1])
        last = c_all == nc - 1  # the last chunk's backward follows its forward; the others wait for the next's
        st.depend(slot_id[1][last], slot_id[0][last], True, np.zeros(int(last.sum())))
        st.depend(slot_id[1][~last], slot_id[1, mb_all[~last], c_all[~last] + 1], True, p2p_arr[c_all[~last]])
        for s in range(pp):
            buckets = _buckets(stage_costs[s], chunks, s, pp, dp, level, coll, bucket_bytes, per)
            _reduce_and_update(st, s, per, level, slot_id, buckets, upd_per_byte[s])
    step = float(max(np.nanmax(st.run()[1]), 0.0))
    # each stage's peak on each of its GPU models, held against that model's memory: where the models run
    # micro-batches of their own sizes (mbs=), their activations differ; else the stage's slowest costs hold
    peaks, capacity, gpu_peak = [], [], {}
    for s in range(pp):
        models = sorted({cluster.devices[d].model for d in stage_gpus[s]})
        sources = [(m, costs.on(m)) for m in models] if spec.micro_sizes is not None else [(None, stage_costs[s])]
        fullest = None
        for model, source in sources:
            held = [d for d in stage_gpus[s] if model is None or cluster.devices[d].model == model]
            cap = min(float(cluster.capacity[d]) for d in held)
            kept = None if model is None else source.held(sharded)
            act = act_arr if kept is None else np.array([float(kept[c].sum()) for c in chunks])
            peak = _stage_peak(source, s, pp, nc, chunks, per, level, schedule, act, dp, bucket_bytes, sharded)
            gpu_peak.update(dict.fromkeys(held, peak))
            if fullest is None or peak / max(cap, 1.0) > fullest[0] / max(fullest[1], 1.0):
                fullest = (peak, cap)
        peaks.append(fullest[0])
        capacity.append(fullest[1])
    worst = int(np.argmax(np.asarray(peaks) / np.maximum(capacity, 1.0)))  # the fullest stage: the one that overflows
    return LayeredResult(
        str(spec),
        step,
        float(peaks[worst]),
        worst,
        any(peak > cap for peak, cap in zip(peaks, capacity, strict=True)),
        tuple(tuple(costs.names[u] for u in c) for c in chunks),
        tuple(float(x) for x in peaks),
        tuple(float(gpu_peak[d]) for d in devices),
    )


def _check_sizes(spec, costs: UnitCosts, models: set[str]) -> None:
    """One line unless ``costs`` were measured on each of the plan's GPU ``models`` at the micro-batch size its
    ``mbs=`` gives that model (every model named, and no other: :func:`replica_sizes` ran first)."""
    sizes = dict(spec.micro_sizes)
    for model in sorted(models):
        measured = costs.on(model).micro_size
        if measured != sizes[model]:
            raise PostplaceError(
                f"plan '{spec}': the units on {model} were measured at {measured or 'the plan-wide'} sequences per "
                f"micro-batch, not {sizes[model]}; measure them with postplace.placers.layered.measured_sizes"
            )


def _stage_peak(costs, s, pp, nc, chunks, per, level, schedule, act_arr, dp, bucket_bytes, sharded) -> float:
    """Stage s's peak bytes per GPU, its units' memory from ``costs`` (see the module docstring); under
    ``fsdp`` the ``sharded`` units (a mask over the units) are FSDP's, the others DDP's."""
    mine = [c for c in range(nc) if c % pp == s]
    units = [u for c in mine for u in chunks[c]]
    p, st_b = float(costs.param_bytes[units].sum()), float(costs.state_bytes[units].sum())
    blocks = [u for u in units if 0 < u < len(costs.names) - 1]
    if level == "fsdp":  # a shard of the sharded units' parameters, state and gradient sums; the others whole
        gathered = sorted((float(costs.param_bytes[u]) for u in blocks if sharded[u]), reverse=True)[:2]
        root = float(costs.param_bytes[0] + costs.param_bytes[-1]) if sharded[0] else 0.0
        split = [u for u in units if sharded[u]]
        p_split, st_split = float(costs.param_bytes[split].sum()), float(costs.state_bytes[split].sum())
        whole = p - p_split + st_b - st_split
        static = (p_split + st_split) / dp + whole + (root + sum(gathered)) * costs.gather_dtype_bytes / 4
        grads = p_split / dp + (p - p_split)  # the sums, from the first backward on
    else:
        owned = 1.0 if level == "ddp" else _owner_share(costs, units, dp)  # the busiest owner's state
        static = p + st_b * owned
        grads = p if level in ("ddp", "zero1") else p * owned + min(bucket_bytes, p)
    # along the GPU's slots: activations held, gradient sums alive from its first backward on, and a
    # backward's working memory on top while it runs
    kind, _, c = _slots(schedule, s, pp, per)
    after = np.cumsum(np.where(kind == 0, act_arr[c], -act_arr[c]))
    before = after - np.where(kind == 0, act_arr[c], -act_arr[c])
    backward = kind == 1
    live = np.where(np.arange(len(kind)) > int(np.argmax(backward)), grads, 0.0)
    most = max(
        float((after + live)[~backward].max(initial=0.0)),
        float((before + live + costs.transient_bytes)[backward].max(initial=0.0)),
        float((after[backward] + grads).max(initial=0.0)),
    )
    if per == 1 and pp == 1:  # one micro-batch: as the measured step's first one
        most = max(most, costs.single_bytes - costs.param_bytes.sum() + grads)
    return static + most


def _slowest(measured: list[UnitCosts]) -> UnitCosts:
    """One set of units' costs from the same units measured on several GPU models: each time the slowest
    model's, the transient bytes the most any needed."""
    if len(measured) == 1:
        return measured[0]
    most = {
        k: np.max([getattr(c, k) for c in measured], axis=0)
        for k in ("forward_s", "backward_s", "accumulate_s", "update_s")
    }
    return replace(
        measured[0],
        **most,
        transient_bytes=max(c.transient_bytes for c in measured),
        single_bytes=max(c.single_bytes for c in measured),
        model="",
        by_model=(),
    )


def _pieces(costs: UnitCosts, units: list[int], bucket_bytes: float):
    """Gradient buckets over ``units`` in backward order: ``(bytes, unit, fraction of its backward done)``
    when each bucket is full, the gradients of a unit final evenly over its backward."""
    order = np.asarray(units[::-1], dtype=np.int64)
    nbytes, unit, frac = _fill_buckets(costs.param_bytes[order].astype(np.float64), order, float(bucket_bytes))
    return list(zip(nbytes.tolist(), unit.tolist(), frac.tolist(), strict=True))


@njit(cache=True)
def _fill_buckets(sizes, units, bucket_bytes):  # pragma: no cover - numba
    """Each unit's bytes in ceil(size / bucket) equal pieces, poured into buckets launched when full."""
    cap = 16
    for x in sizes:
        cap += int(np.ceil(x / bucket_bytes)) + 1
    out_b, out_u, out_f = np.zeros(cap), np.zeros(cap, dtype=np.int64), np.zeros(cap)
    k, filled = 0, 0.0
    for i in range(sizes.shape[0]):
        if sizes[i] <= 0:
            continue
        pieces = max(1, int(np.ceil(sizes[i] / bucket_bytes)))
        for j in range(pieces):
            filled += sizes[i] / pieces
            if filled >= bucket_bytes:
                out_b[k], out_u[k], out_f[k] = filled, units[i], (j + 1) / pieces
                k += 1
                filled = 0.0
    if filled > 0:
        out_b[k], out_u[k], out_f[k] = filled, units[-1], 1.0
        k += 1
    return out_b[:k], out_u[:k], out_f[:k]


def _owner_share(costs: UnitCosts, units: list[int], dp: int) -> float:
    """The largest share of ``units``' parameter bytes one of ``dp`` ZeRO owners holds
    (:func:`postplace.plans.data_parallel.owners_of`'s rule)."""
    from postplace.plans.data_parallel import owners_of

    sizes = [x for u in units for x in costs.param_sizes[u]]
    if not sizes or sum(sizes) <= 0:
        return 1.0 / dp  # nothing to own
    return float(np.bincount(owners_of(sizes, dp), weights=sizes, minlength=dp).max() / sum(sizes))


def _buckets(costs, chunks, s, pp, dp, level, coll, bucket_bytes, per):
    """Stage s's gradient buckets per chunk: ``(lag after its backward slot's end, seconds, bytes, seconds of
    ZeRO's parameter all-gather)`` per unit, and the update's speed-up (the busiest ZeRO owner's share of it,
    inverted). Each unit's gradient sums (``per`` > 1: the last backward adds them) run inside its backward, as
    :func:`_hybrid` runs them."""
    mine = [c for c in range(len(chunks)) if c % pp == s]
    shard = 1.0
    if level in ("zero1", "zero2"):  # the busiest owner's share of the stage's update (whole parameters)
        shard = 1.0 / _owner_share(costs, sorted(u for c in mine for u in chunks[c]), dp)
    reduce_kind = "reduce_scatter" if level == "zero2" else "all_reduce"  # zero1: all-reduce, then the owners update
    b = costs.backward_s + (costs.accumulate_s / (dp if level == "zero2" else 1) if per > 1 else 0.0)
    groups_of = {}
    for c in mine:
        units = chunks[c]
        total = float(b[units].sum())
        before = {u: float(b[[w for w in units if w > u]].sum()) for u in units}  # backward runs last unit first
        groups: dict[int, list[tuple[float, float]]] = {}
        for nbytes, u, frac in _pieces(costs, units, bucket_bytes):
            groups.setdefault(u, []).append((nbytes, before[u] + frac * float(b[u]) - total))
        rows = []
        for pieces in groups.values():
            # one unit's buckets as one task (for speed): they become ready evenly, the stream takes them in
            # turn, so the last ends at max(free + all, first ready + all, last ready + its own): the task
            # starts at the later of the first one's readiness and the last one's less the others' time
            times = [coll(reduce_kind, nbytes, s) for nbytes, _ in pieces]
            lag = max(pieces[0][1], pieces[-1][1] + times[-1] - sum(times))
            gather = sum(coll("all_gather", x, s) for x, _ in pieces) if level in ("zero1", "zero2") else 0.0
            rows.append((lag, sum(times), sum(x for x, _ in pieces), gather))
        groups_of[c] = rows
    return groups_of, shard


def _reduce_and_update(st, s, per, level, slot_task, buckets_of, upd_per_byte):
    """Stage s's gradient buckets, updates and ZeRO's gathers as tasks."""
    compute, comm = 2 * s, 2 * s + 1
    groups_of, shard = buckets_of
    mine = sorted(groups_of, reverse=True)
    reduced = []  # (reduction task, bytes, the all-gather's seconds)
    for mb in range(per) if level == "zero2" else [per - 1]:
        for c in mine:
            slot = int(slot_task[1, mb, c])
            for lag, seconds, nbytes, gather in groups_of[c]:
                t = st.add(comm, seconds, [("e", slot, lag)])
                if mb == per - 1:
                    reduced.append((t, nbytes, gather))
    for t, nbytes, gather in reduced:
        last = st.add(compute, nbytes * upd_per_byte / shard, [("e", t, 0.0)])
        if level in ("zero1", "zero2"):
            st.add(comm, gather, [("e", last, 0.0)])


def sharded_units(spec, names) -> np.ndarray:
    """Which of a plan's units FSDP shards.

    Parameters
    ----------
    spec : postplace.plans.PlanSpec
        The plan: its ``shard=`` units, else all of them under ``fsdp`` and none under the other levels.
    names : tuple of str
        The units, as :class:`UnitCosts` names them (the embedding side, the blocks, the head side).

    Returns
    -------
    numpy.ndarray
        A mask over ``names``, the root's two sides together; one line for a unit that is not a block or
        the root.
    """
    if spec.shard is None:
        return np.full(len(names), spec.level == "fsdp")
    blocks = names[1:-1]
    if unknown := sorted(set(spec.shard) - set(blocks) - {""}, key=lambda u: (len(u), u)):
        raise PostplaceError(
            f"plan '{spec}': shard= names '{unknown[0]}', which is not a block of the model (its blocks: "
            f"{blocks[0]}..{blocks[-1]}, and root); the layered estimate shards the root and whole blocks"
        )
    mask = np.array([name in spec.shard for name in names])
    mask[0] = mask[-1] = "" in spec.shard
    return mask


def _hybrid(st, costs, units, per, coll, upd_per_byte, dp, sharded, bucket_bytes):
    """One replica (no pipeline) as tasks, FSDP for the ``sharded`` units and DDP for the others: per micro-batch
    a sharded unit gathered before its forward and again before its backward (one gather in flight ahead of the
    compute), its gradients reduce-scattered after its backward; the others' gradients all-reduced in buckets as
    the last micro-batch's backward finalises them; each unit's update (of its shard, or whole) after its
    reduction."""
    compute, comm = 0, 1
    n = len(costs.names)
    blocks = [u for u in units if 0 < u < n - 1]
    gbytes = costs.param_bytes * costs.gather_dtype_bytes / 4
    root = bool(sharded[0])
    root_gather = float(gbytes[0] + gbytes[-1])
    root_grads = float(costs.param_bytes[0] + costs.param_bytes[-1])
    buckets_of: dict[int, list[tuple[float, float]]] = {}  # a unit's DDP buckets: (bytes, fraction of its backward)
    for nbytes, u, frac in _pieces(costs, [u for u in units if not sharded[u]], bucket_bytes):
        buckets_of.setdefault(u, []).append((nbytes, frac))
    updates = []  # the last micro-batch's reductions: (task, bytes, seconds per byte of its update)

    def gather(nbytes, after=()):
        return st.add(comm, coll("all_gather", nbytes, 0), after)

    def waits(task):
        return [("e", task, 0.0)] if task is not None else []

    def ahead(u, task):  # the gather of unit u, issued as ``task`` starts (none when u is DDP's)
        return gather(gbytes[u], [("s", task, 0.0)]) if u is not None and sharded[u] else None

    def reduce(u, task, seconds, nbytes, last):
        if sharded[u]:
            rs = st.add(comm, coll("reduce_scatter", nbytes, 0), [("e", task, 0.0)])
            if last:
                updates.append((rs, nbytes, upd_per_byte / dp))
        elif last and u in buckets_of:
            # one unit's buckets as one task (for speed), as the pipeline path prices them (_buckets)
            pieces = buckets_of[u]
            times = [coll("all_reduce", x, 0) for x, _ in pieces]
            lag = max(pieces[0][1] * seconds, pieces[-1][1] * seconds + times[-1] - sum(times))
            t = st.add(comm, sum(times), [("s", task, lag)])
            updates.append((t, sum(x for x, _ in pieces), upd_per_byte))

    for mb in range(per):
        last = mb == per - 1
        acc = np.where(sharded, costs.accumulate_s / dp, costs.accumulate_s) if mb else np.zeros(n)
        # forward: the root gathered first, then each sharded block one gather ahead of the compute
        f_pre = st.add(compute, costs.forward_s[0], waits(gather(root_gather) if root else None))
        pending = ahead(blocks[0], f_pre)
        for k, u in enumerate(blocks):
            t = st.add(compute, costs.forward_s[u], waits(pending))
            pending = ahead(blocks[k + 1] if k + 1 < len(blocks) else None, t)
        f_post = st.add(compute, costs.forward_s[-1])
        # backward: the root gathered again, the blocks in reverse, each gathered while the one after it runs
        g_root = gather(root_gather, [("s", f_post, 0.0)]) if root else None
        b_post = st.add(compute, costs.backward_s[-1] + acc[-1], waits(g_root))
        rev = blocks[::-1]
        pending = ahead(rev[0], b_post)
        if not root:
            reduce(n - 1, b_post, costs.backward_s[-1] + acc[-1], 0.0, last)
        for k, u in enumerate(rev):
            t = st.add(compute, costs.backward_s[u] + acc[u], waits(pending))
            pending = ahead(rev[k + 1] if k + 1 < len(rev) else None, t)
            reduce(u, t, costs.backward_s[u] + acc[u], float(costs.param_bytes[u]), last)
        b_pre = st.add(compute, costs.backward_s[0] + acc[0])  # the compute stream's next task
        reduce(0, b_pre, costs.backward_s[0] + acc[0], root_grads, last)
    for task, nbytes, per_byte in updates:
        st.add(compute, nbytes * per_byte, [("e", task, 0.0)])


def measured_rule(
    graph, cluster, gpus: list[int], rule: str, *, tensor: int = 1, sequence: bool = False, layers=None, cost_model=None
):
    """:func:`measure_units` recomputing every block by ``rule`` (``""`` none, ``"full"``, ``"selective"``),
    repeated to ``layers`` blocks when given (:func:`repeat_blocks`). Where ``gpus`` are of several models,
    the units are measured on a tensor group of each (its first ``tensor`` GPUs of that model), the first
    model's costs carrying the others' (``by_model``)."""
    models = list(dict.fromkeys(cluster.devices[d].model for d in gpus))

    def on(model: str) -> UnitCosts:
        group = [d for d in gpus if cluster.devices[d].model == model][:tensor]
        if len(group) < tensor:
            raise PostplaceError(
                f"tp={tensor}: only {len(group)} of the GPUs are {model}s, and a tensor group runs on one GPU "
                "model; lower tp"
            )
        one = measure_units(
            graph,
            cluster,
            group,
            tensor=tensor,
            recompute=bool(rule),
            selective=rule == "selective",
            sequence=sequence,
            cost_model=cost_model,
        )
        return repeat_blocks(one, layers) if layers else one

    first = on(models[0])
    return replace(first, by_model=tuple((m, on(m)) for m in models[1:])) if len(models) > 1 else first


def measured_sizes(
    graph_at,
    cluster,
    gpus: list[int],
    rule: str,
    sizes,
    *,
    tensor: int = 1,
    sequence: bool = False,
    layers=None,
    cost_model=None,
) -> UnitCosts:
    """:func:`measured_rule` on each GPU model among ``gpus`` at its own micro-batch size: ``sizes`` maps a model to
    its sequences per micro-batch (a plan's ``mbs=``), ``graph_at(n)`` is the step traced as two micro-batches of
    ``n`` sequences. The first model's costs carry the others' (``by_model``), each marked with its size."""
    sizes = dict(sizes)
    each = []
    for model in dict.fromkeys(cluster.devices[d].model for d in gpus):
        if model not in sizes:
            raise PostplaceError(f"mbs= gives no micro-batch size to the {model} GPUs; name every model")
        mine = [d for d in gpus if cluster.devices[d].model == model]
        costs = measured_rule(
            graph_at(sizes[model]),
            cluster,
            mine,
            rule,
            tensor=tensor,
            sequence=sequence,
            layers=layers,
            cost_model=cost_model,
        )
        each.append((model, replace(costs, micro_size=sizes[model])))
    return replace(each[0][1], by_model=tuple(each[1:]))


def repeat_blocks(costs: UnitCosts, layers: int) -> UnitCosts:
    """``costs`` measured on the model cut to a few blocks, with ``layers`` blocks: each a copy of the middle
    measured one (every block of a zoo transformer runs the same ops at the same sizes), the embedding and
    head sides as measured. The first micro-batch's peak grows by the added blocks' activations and
    gradients (an upper bound: both are not all alive at once)."""
    blocks = costs.names[1:-1]
    if layers < 1 or not blocks:
        raise PostplaceError(f"repeat_blocks: layers={layers} needs a positive count and measured blocks")
    if len({b.rpartition(".")[0] for b in blocks}) > 1:  # an encoder and a decoder: two kinds of block
        raise PostplaceError(
            f"the layered estimate repeats one kind of block, and this model has several "
            f"({', '.join(sorted({b.rpartition('.')[0] for b in blocks}))}); time it op by op"
        )
    mid = 1 + (len(blocks) - 1) // 2
    prefix = blocks[0].rpartition(".")[0]

    def grow(a):
        return np.concatenate([a[:1], np.repeat(a[mid : mid + 1], layers), a[-1:]])

    added = layers - len(blocks)
    return UnitCosts(
        names=(PRE, *(f"{prefix}.{k}" for k in range(layers)), POST),
        forward_s=grow(costs.forward_s),
        backward_s=grow(costs.backward_s),
        accumulate_s=grow(costs.accumulate_s),
        update_s=grow(costs.update_s),
        param_bytes=grow(costs.param_bytes),
        param_sizes=(costs.param_sizes[0], *([costs.param_sizes[mid]] * layers), costs.param_sizes[-1]),
        state_bytes=grow(costs.state_bytes),
        activation_bytes=grow(costs.activation_bytes),
        boundary_bytes=grow(costs.boundary_bytes),
        transient_bytes=costs.transient_bytes,
        single_bytes=costs.single_bytes + added * float(costs.activation_bytes[mid] + costs.param_bytes[mid]),
        gather_dtype_bytes=costs.gather_dtype_bytes,
        tensor=costs.tensor,
        recompute=costs.recompute,
        step_time_s=float("nan"),
        selective=costs.selective,
        model=costs.model,
        by_model=tuple((m, repeat_blocks(c, layers)) for m, c in costs.by_model),
        sequence=costs.sequence,
        micro_size=costs.micro_size,
        tied=costs.tied,
        cast_bytes=None if costs.cast_bytes is None else grow(costs.cast_bytes),
    )


def mix_recompute(plain: UnitCosts, full: UnitCosts | None, units, *, selective: UnitCosts | None = None, selected=()):
    """Costs recomputing exactly ``units`` (names) whole and ``selected`` by the selective op rule: theirs from
    ``full`` and ``selective`` (measured recomputing every block by each rule), the others' from ``plain``
    (measured not), all at the same tensor degree and micro-batch size."""
    chosen, picked = set(units), set(selected)
    sources = [(chosen, full, False), (picked, selective, True)]
    for names, source, rule in sources:
        if names and (
            source is None
            or source.names != plain.names
            or source.tensor != plain.tensor
            or source.sequence != plain.sequence
            or not source.recompute
            or source.selective != rule
            or plain.recompute
        ):
            raise PostplaceError(
                "mix_recompute: give the same units measured without recomputation and with it by each rule mixed"
            )
    if unknown := (chosen | picked) - set(plain.names[1:-1]):
        raise PostplaceError(f"mix_recompute: '{sorted(unknown)[0] or 'root'}' is not a block of the model")
    if both := chosen & picked:
        raise PostplaceError(f"mix_recompute: {sorted(both)[0]!r} cannot be recomputed by both rules")
    out = {k: getattr(plain, k) for k in ("forward_s", "backward_s", "accumulate_s", "activation_bytes")}
    casts = plain.cast_bytes is not None and all(not names or src.cast_bytes is not None for names, src, _ in sources)
    out["cast_bytes"] = plain.cast_bytes if casts else None
    transient, single = plain.transient_bytes, plain.single_bytes
    for names, source, _ in sources:
        if not names:
            continue
        mask = np.array([name in names for name in plain.names])
        for k in out:
            if out[k] is not None:
                out[k] = np.where(mask, getattr(source, k), out[k])
        transient, single = max(transient, source.transient_bytes), max(single, source.single_bytes)
    return replace(
        plain,
        **out,
        transient_bytes=transient,
        single_bytes=single,
        recompute=bool(chosen or picked),
        recomputed=tuple(name for name in plain.names if name in chosen),
        selected=tuple(name for name in plain.names if name in picked),
        by_model=tuple(
            (
                m,
                mix_recompute(
                    other,
                    full.on(m) if full is not None else None,
                    units,
                    selective=selective.on(m) if selective is not None else None,
                    selected=selected,
                ),
            )
            for m, other in plain.by_model
        ),
    )


def plan_costs(spec, measured) -> UnitCosts:
    """The unit costs ``spec`` is priced on, from ``measured(recompute, selective=False)`` (the units measured
    at the plan's tensor degree without recomputation, or recomputing every block by the rule named): a plan
    that recomputes some blocks, or by two rules, mixes them."""
    plain = measured(False)
    _check_units(spec, plain.names[1:-1])
    rules = spec.recompute_rules(plain.names[1:-1])
    kinds = set(rules.values())
    if kinds == {""}:
        return plain
    if len(kinds) == 1:
        return measured(True, selective=kinds == {"selective"})
    full = [u for u, r in rules.items() if r == "full"]
    picked = [u for u, r in rules.items() if r == "selective"]
    return mix_recompute(
        plain,
        measured(True) if full else None,
        full,
        selective=measured(True, selective=True) if picked else None,
        selected=picked,
    )


def _check_units(spec, blocks) -> None:
    """One line when ``spec`` recomputes a unit that is not one of ``blocks`` (the root, a block past the end)."""
    named = set(spec.recompute_units or ()) | set(spec.selective_units or ())
    if unknown := sorted(named - set(blocks), key=lambda u: (len(u), u)):
        raise PostplaceError(
            f"plan '{spec}': '{unknown[0] or 'root'}' is not a block of the model (its blocks: "
            f"{blocks[0]}..{blocks[-1]}); the layered estimate recomputes blocks only"
        )


def op_level_cut(graph, cluster, spec, devices: list[int], names) -> list[list[str]]:
    """The cut :func:`postplace.placers.practitioner.pipeline_stages` makes of ``graph`` (traced at the plan's
    micro-batch count) as ``names`` (a :class:`UnitCosts`'s) per chunk, for :func:`estimate_plan`'s ``cut``: the
    layered estimate priced on the op level's own stages."""
    from postplace.placers.practitioner import pipeline_stages
    from postplace.plans._step import units

    pp = spec.pipeline
    stage = pipeline_stages(graph, cluster, spec, [devices[len(devices) // pp * s] for s in range(pp)])
    first: dict[str, int] = {}
    for i, u in enumerate(units(graph)):
        first.setdefault(u, i)
    cut: list[list[str]] = [[] for _ in range(int(stage.max()) + 1)]
    for name in names:
        chunk = 0 if name == PRE else len(cut) - 1 if name == POST else int(stage[first[name]])
        cut[chunk].append(name)
    return cut
