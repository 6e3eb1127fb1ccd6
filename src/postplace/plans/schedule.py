"""Pipeline schedules as a graph pass: the order each stage runs its micro-batches' forwards and backwards.

The simulator runs, on each device, the ready op earliest in program order. A pipeline's schedule is
therefore an order: this pass gives each stage's *slots* (the forward, or the backward, of one
micro-batch on that stage) the order a schedule names, stores the ops in that program order, and adds
zero-byte ordering edges from the last ops of each slot to the first ops of the next on the same stage,
so no slot starts before the one the schedule puts before it has finished. The bubble and the memory
then come out of the simulation; nothing is assumed.

* ``gpipe`` (Huang et al. 2019): every forward, then every backward. A stage holds all m micro-batches'
  activations at once.
* ``1f1b`` (PipeDream-Flush, Narayanan et al. 2021; Megatron-LM's default): stage s of p runs
  ``min(p - s - 1, m)`` warm-up forwards, then alternates one forward and one backward, then drains the
  remaining backwards. The bubble is GPipe's, ``(p - 1) / (m + p - 1)`` of the step on a uniform
  stack, but stage s holds at most ``p - s`` micro-batches' activations instead of m.
* ``interleaved-V`` (Narayanan et al. 2021, Sec. 2.2): each of the p GPUs holds V chunks of layers, chunk
  c on GPU ``c mod p`` (so ``stage_of_op`` numbers the V x p chunks); micro-batches go through the chunks
  in groups of p (m a multiple of p), GPU d warms up with ``2 (p - d - 1) + (V - 1) p`` chunk forwards,
  then alternates. The bubble shrinks V-fold: ``(p - 1) / (V m + p - 1)`` of the step on a uniform
  stack, for more activations held and V times the point-to-point messages.

Ops that belong to no micro-batch (parameters, gradient sums, the update) keep their data edges only.
"""

from __future__ import annotations

from collections import defaultdict

import numpy as np

from postplace.errors import PostplaceError
from postplace.graph import OpGraph
from postplace.plans._draft import Draft
from postplace.plans._step import BACKWARD, FORWARD

__all__ = ["SCHEDULES", "pipeline_schedule", "slot_order"]

SCHEDULES = ("gpipe", "1f1b", "interleaved-V")


def chunks_of(schedule: str) -> int:
    """V of ``interleaved-V`` (1 for the others); one error line for a schedule of no such name."""
    if schedule in ("gpipe", "1f1b"):
        return 1
    head, _, v = schedule.partition("-")
    if head == "interleaved" and v.isdigit() and int(v) >= 1:
        return int(v)
    raise PostplaceError(
        f"unknown pipeline schedule '{schedule}'; use gpipe, 1f1b or interleaved-V (V >= 1 chunks "
        "per GPU, e.g. interleaved-2)"
    )


def slot_order(schedule: str, gpu: int, gpus: int, microbatches: int) -> list[tuple[str, int, int]]:
    """The slots GPU ``gpu`` of ``gpus`` runs, in order: ``(kind, micro-batch, stage)``, kind ``F`` or ``B``.

    >>> [f"{k}{j}" for k, j, _ in slot_order("1f1b", 0, 3, 4)]
    ['F0', 'F1', 'F2', 'B0', 'F3', 'B1', 'B2', 'B3']
    >>> [f"{k}{j}" for k, j, _ in slot_order("gpipe", 2, 3, 2)]
    ['F0', 'F1', 'B0', 'B1']
    >>> [f"{k}{j}@{s}" for k, j, s in slot_order("interleaved-2", 1, 2, 2)]
    ['F0@1', 'F1@1', 'F0@3', 'B0@3', 'F1@3', 'B1@3', 'B0@1', 'B1@1']
    """
    m, v, p = microbatches, chunks_of(schedule), gpus
    if schedule == "gpipe":
        return [("F", k, gpu) for k in range(m)] + [("B", k, gpu) for k in range(m)]
    if v > 1 and m % p:
        raise PostplaceError(
            f"schedule {schedule}: {m} micro-batches do not split into groups of the {p} GPUs; give m a multiple of {p}"
        )

    def nth(i: int, backward: bool) -> tuple[int, int]:  # the i-th chunk pass of this GPU: (micro-batch, stage)
        group, within = divmod(i, p * v)
        chunk = within // p
        return group * p + within % p, (v - 1 - chunk if backward else chunk) * p + gpu

    total = v * m
    warm = min(total, p - gpu - 1 if v == 1 else 2 * (p - gpu - 1) + (v - 1) * p)
    out = [("F", *nth(i, False)) for i in range(warm)]
    for i in range(total - warm):
        out += [("F", *nth(warm + i, False)), ("B", *nth(i, True))]
    return out + [("B", *nth(i, True)) for i in range(total - warm, total)]


def _check_chain(graph: OpGraph, inside: dict[int, tuple], schedule: str) -> None:
    """A schedule that interleaves forwards and backwards needs the stages to form a chain: a micro-batch's
    forward flows from each stage to a later one, its backward to an earlier one. A module that runs at
    both ends of the model (GPT-2's tied embedding and head) breaks it, and ordering such a cut would
    make a cycle: say so in one line."""
    for s, d in zip(graph.edge_src.tolist(), graph.edge_dst.tolist(), strict=True):
        a, b = inside.get(s), inside.get(d)
        if a is None or b is None or a[0] != b[0] or a[3] != b[3] or a[2] != b[2]:
            continue
        if (a[2] == "F" and b[1] < a[1]) or (a[2] == "B" and b[1] > a[1]):
            raise PostplaceError(
                f"schedule {schedule}: the stages of '{graph.name}' do not form a chain (op '{graph.names[d]}' of "
                f"stage {b[1]} consumes '{graph.names[s]}' of stage {a[1]} in the "
                f"{'forward' if a[2] == 'F' else 'backward'}, as a weight read at several depths can make it, "
                "such as a tied embedding and head); use schedule=gpipe"
            )


def pipeline_schedule(graph: OpGraph, stage_of_op, schedule: str = "1f1b", pipeline_of_op=None) -> OpGraph:
    """The step with each pipeline stage's micro-batches run in ``schedule``'s order.

    Parameters
    ----------
    graph : OpGraph
        A step traced as m micro-batches.
    stage_of_op : array of int
        Each op's stage (0 first), or -1 for an op in none.
    schedule : str
        ``gpipe``, ``1f1b`` or ``interleaved-V`` (then ``stage_of_op`` numbers V x p chunks, chunk c on
        GPU ``c mod p``).
    pipeline_of_op : array of int, optional
        With data parallelism over pipelines: each op's pipeline (replica); each pipeline is scheduled
        over its own micro-batches, numbered in order. Default: one pipeline.

    Returns
    -------
    OpGraph
        The same ops (same names) in the schedule's program order, with ordering edges;
        ``metadata["schedule"]`` names it.
    """
    stage_of_op = np.asarray(stage_of_op, dtype=np.int64)
    if stage_of_op.shape != (graph.num_ops,):
        raise PostplaceError(f"pipeline schedule: {stage_of_op.shape[0]} stages given for {graph.num_ops} ops")
    pipe = np.zeros(graph.num_ops, dtype=np.int64) if pipeline_of_op is None else np.asarray(pipeline_of_op)
    stages, v = int(stage_of_op.max()) + 1, chunks_of(schedule)
    if stages % v:
        raise PostplaceError(f"schedule {schedule}: {stages} stages do not split into {v} chunks per GPU")
    gpus = stages // v
    phase, mb = graph.phase.tolist(), graph.microbatch.tolist()
    own: dict[int, dict[int, int]] = defaultdict(dict)  # pipeline -> its micro-batches numbered in order
    for i in np.argsort(graph.microbatch, kind="stable").tolist():
        if mb[i] >= 0 and stage_of_op[i] >= 0:
            own[int(pipe[i])].setdefault(mb[i], len(own[int(pipe[i])]))
    slots: dict[tuple[int, int, str, int], list[int]] = defaultdict(list)
    for i in range(graph.num_ops):
        s, r = int(stage_of_op[i]), int(pipe[i])
        if s >= 0 and mb[i] >= 0 and phase[i] in (FORWARD, BACKWARD):
            slots[(r, s, "F" if phase[i] == FORWARD else "B", own[r][mb[i]])].append(i)
    position = np.zeros(graph.num_ops, dtype=np.int64)
    sequences = []
    for r, mine in own.items():
        m = len(mine)
        for d in range(gpus):
            seq = [(r, s, kind, k) for kind, k, s in slot_order(schedule, d, gpus, m) if (r, s, kind, k) in slots]
            for j, slot in enumerate(seq):
                position[slots[slot]] = j
            sequences.append(seq)

    draft = Draft(graph)
    draft.collectives = list(graph.collectives)
    for i in range(graph.num_ops):
        draft.copy(i, graph.names[i], (int(position[i]), i), inplace_base=int(graph.inplace_base[i]))
        draft.collective[i] = int(graph.collective[i])
    src, dst = graph.edge_src.tolist(), graph.edge_dst.tolist()
    for e, (s, d) in enumerate(zip(src, dst, strict=True)):
        draft.edge(s, d, int(graph.edge_slot[e]), float(graph.edge_bytes[e]))
    inside: dict[int, tuple] = {i: key for key, ops in slots.items() for i in ops}
    if schedule != "gpipe":
        _check_chain(graph, inside, schedule)
    has_pred, has_succ = set(), set()
    for s, d in zip(src, dst, strict=True):
        if s in inside and inside.get(d) == inside[s]:
            has_succ.add(s)
            has_pred.add(d)
    for seq in sequences:
        for before, after in zip(seq, seq[1:], strict=False):
            exits = [i for i in slots[before] if i not in has_succ]
            entries = [i for i in slots[after] if i not in has_pred]
            for a in exits:
                for b in entries:
                    draft.order(a, b)
    try:
        out, _ = draft.freeze(f"{graph.name}+{schedule}", {**graph.metadata, "schedule": schedule})
    except AssertionError:  # the schedule's order against the orders the step already carries
        raise PostplaceError(
            f"schedule {schedule}: ordering the stages of '{graph.name}' this way conflicts with the "
            "order the plan already imposes (FSDP's gathers and reduce-scatters, say) on these "
            "stages; try another schedule, or ddp/zero2 with pp"
        ) from None
    return out
