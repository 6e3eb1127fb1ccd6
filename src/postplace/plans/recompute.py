"""Activation recomputation as a graph pass: a unit's forward runs again just before its backward.

What ``torch.utils.checkpoint`` (and torchtitan's full activation checkpointing of every transformer
block) does to one training step, written on the OpGraph:

* for every recomputed unit and micro-batch, the forward ops of the unit whose outputs its own backward
  reads are copied (``rc:NAME``, phase backward, the same cost), with the forward ops they read inside
  the unit; the backward ops read the copies. The unit's forward outputs are then read by the forward
  only, so the simulator frees them as soon as the next layer has run: between forward and backward a
  recomputed unit keeps only its input (and what the forward of later units reads);
* the copies wait for the gradient to reach the unit (zero-byte edges from the backward ops outside the
  unit that feed its backward), as checkpointing's backward hook does, and come just before the unit's
  backward in program order. A copy of an op that writes a tensor outside the unit in place (a batch
  norm's running statistics) allocates its output instead of writing it again.

*Selective* recomputation keeps some forward outputs instead of recomputing them. The rule offered is
torchtitan's selective op checkpointing (``torchtitan/models/llama/parallelize_llama.py``, Dec. 2024,
the rule of its published Llama 3.1 runs): within each checkpointed block, the outputs of attention
kernels and of every other matrix product (the 1st, 3rd, 5th... ``mm`` of the block's forward) are
saved; every other op (norms, rotary embeddings, activations, casts, the even ``mm``) is recomputed.

The pass is a function from a step to a step; :mod:`postplace.plans.data_parallel` runs after it.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable

from postplace.graph import OpGraph
from postplace.plans._draft import Draft
from postplace.plans._step import BACKWARD, FORWARD, numbered_units, units

__all__ = ["recompute", "selective_saves"]


def recompute(graph: OpGraph, which: list[str] | None = None, *, selective: bool = False) -> OpGraph:
    """The step with the units ``which`` (default: every numbered unit) recomputed in the backward pass.

    Parameters
    ----------
    graph : OpGraph
        A traced step (any micro-batch count).
    which : list of str, optional
        Unit names (:func:`postplace.plans.unit_of`); default all numbered units, as torchtitan's full
        activation checkpointing wraps every transformer block.
    selective : bool
        Keep what torchtitan's selective op rule saves (see the module docstring) and recompute the rest;
        ``metadata["recompute_rule"]`` then says ``"selective-op"`` (``"mixed"`` on a step whose other units
        an earlier pass recomputed whole).

    Returns
    -------
    OpGraph
        The same step with recomputation; ``metadata["recompute"]`` lists the units (an earlier pass's first).
    """
    unit = units(graph)
    targets = set(numbered_units(graph) if which is None else which)
    n = graph.num_ops
    phase, mb = graph.phase.tolist(), graph.microbatch.tolist()
    src, dst, slot, nbytes = (a.tolist() for a in (graph.edge_src, graph.edge_dst, graph.edge_slot, graph.edge_bytes))
    in_ptr, in_edges = graph.in_ptr.tolist(), graph.in_edges.tolist()

    segment = _segments(graph, targets)
    first_backward: dict[tuple, int] = {}
    for i in range(n):
        if phase[i] == BACKWARD and unit[i] in targets:
            first_backward.setdefault((unit[i], mb[i]), i)
    # the gradient reaching a unit: backward ops of other units feeding its backward, those before its
    # first backward op in program order (a later one, as in an RNN whose layer runs at every time step,
    # may itself wait for the unit's backward: waiting for it would be a cycle)
    triggers: dict[tuple, set[int]] = defaultdict(set)
    for e in range(len(src)):
        s, d = src[e], dst[e]
        if phase[s] == BACKWARD and phase[d] == BACKWARD and unit[d] in targets and unit[s] != unit[d]:
            if s < first_backward[(unit[d], mb[d])]:
                triggers[(unit[d], mb[d])].add(s)

    kept = _saves(graph, segment) if selective else set()
    draft = Draft(graph)
    for i in range(n):
        draft.copy(i, graph.names[i], (float(i), 0), inplace_base=int(graph.inplace_base[i]))
    clones: dict[int, int] = {}
    waits: list[tuple[int, int]] = []

    def clone(f: int) -> int:
        if f in kept:
            return f
        if f in clones:
            return clones[f]
        seg = segment[f]
        base = int(graph.inplace_base[f])
        key = (first_backward.get(seg, n) - 0.5, f)
        c = draft.copy(f, f"rc:{graph.names[f]}", key, phase=BACKWARD)
        clones[f] = c
        inner = False
        for k in range(in_ptr[f], in_ptr[f + 1]):
            e = in_edges[k]
            s = src[e]
            if segment.get(s) == seg and s not in kept:
                draft.edge(clone(s), c, slot[e], nbytes[e])
                inner = True
            else:
                draft.edge(s, c, slot[e], nbytes[e])
        if graph.inplace[f]:
            writes_inside = base >= 0 and segment.get(base) == seg
            draft.set(c, "inplace", writes_inside)
            draft.set(c, "inplace_base", clones[base] if writes_inside else -1)
        if not inner:
            waits.extend((t, c) for t in sorted(triggers.get(seg, ())))
        return c

    for e in range(len(src)):
        s, d = src[e], dst[e]
        if s in segment and phase[d] == BACKWARD and segment[s] == (unit[d], mb[d]):
            draft.edge(clone(s), d, slot[e], nbytes[e])
        else:
            draft.edge(s, d, slot[e], nbytes[e])
    for t, c in waits:  # after every data edge, so the ordering slot is one no tensor uses
        draft.order(t, c)
    earlier = list(graph.metadata.get("recompute") or [])  # a step already recomputing other units: a mix
    meta = {**graph.metadata, "recompute": [*earlier, *sorted(targets, key=_unit_order(graph))]}
    before = graph.metadata.get("recompute_rule", "full" if earlier else None)
    rule = "selective-op" if selective else "full"
    if before not in (None, rule) or (before is None and selective):
        meta["recompute_rule"] = rule if before is None else "mixed"
    out, _ = draft.freeze(f"{graph.name}+recompute", meta)
    return out


def selective_saves(graph: OpGraph, which: Iterable[str] | None = None) -> set[int]:
    """The forward ops of the units ``which`` (default: every numbered unit) whose outputs torchtitan's
    selective op rule keeps: attention kernels, and the odd matrix products (op type ``mm``) counted per
    unit and micro-batch in program order. :func:`recompute` with ``selective=True`` recomputes the other
    forward ops, and the launched plans (:mod:`postplace.runtime.recompute`) keep these same ops."""
    return _saves(graph, _segments(graph, set(numbered_units(graph) if which is None else which)))


def _segments(graph: OpGraph, targets: set[str]) -> dict[int, tuple[str, int]]:
    """The forward ops of the units ``targets``, each with its unit and micro-batch; a micro-batch's data
    (tokens, targets: op type ``input``) is fed, never made again, and is no unit's."""
    unit, phase, mb, kind = units(graph), graph.phase.tolist(), graph.microbatch.tolist(), graph.op_types
    return {
        i: (unit[i], mb[i])
        for i in range(graph.num_ops)
        if phase[i] == FORWARD and unit[i] in targets and kind[i] != "input"
    }


def _saves(graph: OpGraph, segment: dict[int, tuple]) -> set[int]:
    """:func:`selective_saves` over ``segment`` (forward op -> its unit and micro-batch)."""
    kept, count = set(), defaultdict(int)
    for f in sorted(segment):
        kind = graph.op_types[f]
        if kind == "mm":
            count[segment[f]] += 1
            if count[segment[f]] % 2 == 1:
                kept.add(f)
        elif "scaled_dot_product" in kind:
            kept.add(f)
    return kept


def _unit_order(graph: OpGraph):
    order = {u: k for k, u in enumerate(numbered_units(graph))}
    return lambda u: (order.get(u, len(order)), u)
