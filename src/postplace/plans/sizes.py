"""Micro-batches of several sizes in one step: the op level of a plan's ``mbs=`` (a size per GPU model).

A plan with ``mbs=`` (:attr:`postplace.plans.PlanSpec.micro_sizes`) has every replica run the same count of
micro-batches, each of its GPU model's size, so the collectives meet as in the plain plan and the fast GPUs take
more of the batch. A step traced as m micro-batches has one size; the same step traced as m micro-batches of
another size has the same ops and edges in the same order, with other FLOPs and bytes. :func:`sized_step` takes
each micro-batch's ops and the values they send from the trace at its own size; the ops every micro-batch
shares (parameters, gradient sums, the update) are the same in every trace. The plan's passes and the simulator
then see each micro-batch at its size: its compute, its activations' memory, what it sends.

A model whose trace changes shape with the size (a micro-batch of one sequence has a dimension squeezed away in
some models: other ops, not other sizes) is refused in one line; measured op times are per size, so a graph
with them is too.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace

import numpy as np

from postplace.errors import PostplaceError
from postplace.graph import OpGraph

__all__ = ["SIZES_KEY", "sized_step"]

SIZES_KEY = "microbatch_sizes"
"""``OpGraph.metadata`` key of a sized step: each micro-batch's sequences (samples), in micro-batch order."""


def sized_step(traced: Mapping[int, OpGraph], sizes: Sequence[int], *, name: str | None = None) -> OpGraph:
    """The step whose micro-batch k is of ``sizes[k]`` sequences.

    Parameters
    ----------
    traced : mapping of int to OpGraph
        For each size in ``sizes``, the step traced as ``len(sizes)`` micro-batches of that size.
    sizes : sequence of int
        Each micro-batch's size.
    name : str, optional
        The joined step's name (default: the first trace's, which names its batch, not this one's).

    Returns
    -------
    OpGraph
        The trace at ``sizes[0]`` with each other size's micro-batches taken from its own trace, and
        ``metadata[SIZES_KEY]`` = ``sizes``; a zoo step's batch (``metadata["zoo"]["config"]["batch"]``, which
        model FLOPs and tokens per second count, and the batch its ``size`` names) is their sum.

    Raises
    ------
    PostplaceError
        A trace missing, of another micro-batch count, with measured op times, or whose ops differ from the
        first's.
    """
    sizes = [int(n) for n in sizes]
    if missing := sorted(set(sizes) - set(traced)):
        raise PostplaceError(f"sized_step: no trace at {missing[0]} sequences per micro-batch; trace every size")
    base = traced[sizes[0]]
    mb = np.asarray(base.microbatch)
    flops, accessed, output = base.flops.copy(), base.bytes_accessed.copy(), base.output_bytes.copy()
    edge_bytes = base.edge_bytes.copy()
    for n in sorted(set(sizes)):
        other = traced[n]
        _check_alike(base, sizes[0], other, n, len(sizes))
        if n == sizes[0]:
            continue
        ops = np.isin(mb, [k for k, s in enumerate(sizes) if s == n])
        flops[ops], accessed[ops], output[ops] = other.flops[ops], other.bytes_accessed[ops], other.output_bytes[ops]
        sent = ops[base.edge_src]  # a value carries its maker's size
        edge_bytes[sent] = other.edge_bytes[sent]
    metadata = {**base.metadata, SIZES_KEY: sizes}
    zoo = metadata.get("zoo")
    if isinstance(zoo, dict) and "batch" in (zoo.get("config") or {}):
        zoo = {**zoo, "config": {**zoo["config"], "batch": sum(sizes)}}
        if isinstance(zoo.get("size"), str):  # "small@24", the first trace's batch: this step's
            zoo["size"] = f"{zoo['size'].split('@')[0]}@{sum(sizes)}"
        metadata["zoo"] = zoo
    return replace(
        base,
        flops=flops,
        bytes_accessed=accessed,
        output_bytes=output,
        edge_bytes=edge_bytes,
        name=base.name if name is None else name,
        metadata=metadata,
    )


def _check_alike(base: OpGraph, size: int, other: OpGraph, n: int, m: int) -> None:
    """One line unless ``other`` (traced at ``n``) has ``base``'s ops, edges and ``m`` micro-batches."""
    if base.measured or other.measured:
        raise PostplaceError(
            f"graph '{base.name}' carries measured op times, which hold at one micro-batch size; give traced "
            "steps (a zoo model) to micro-batches of several sizes, or drop mbs"
        )
    count = int(np.asarray(other.microbatch).max()) + 1
    if count != m:
        raise PostplaceError(f"sized_step: the trace at {n} sequences has {count} micro-batches, not {m}")
    alike = (
        other.names == base.names
        and other.op_types == base.op_types
        and np.array_equal(other.microbatch, base.microbatch)
        and np.array_equal(other.edge_src, base.edge_src)
        and np.array_equal(other.edge_dst, base.edge_dst)
        and np.array_equal(other.edge_slot, base.edge_slot)
    )
    if not alike:
        raise PostplaceError(
            f"the step traced at {n} sequences per micro-batch has other ops than at {size} ({other.num_ops} "
            f"against {base.num_ops}; a micro-batch of one sequence often squeezes a dimension away): give every "
            "GPU model 2 sequences or more, or price the plan with the layered estimate"
        )
