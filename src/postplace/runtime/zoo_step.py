"""Placed steps of zoo models, traced as m micro-batches or one: what ``apply``, ``train`` and the
measuring evaluator share.

A placement of a step traced as m micro-batches (gradient accumulation: m forward + backward passes of
loss / m, one update) names the ops of that graph: micro-batch k's copies of the forward and backward
ops are called ``mb{k}_<name>``, the shared ops (parameters, buffers, optimizer state, the gradient
sums and the update) keep their names. :func:`placement_microbatches` reads m back from those names
(so a ``placement.json`` needs no header), :func:`check_placement_microbatches` turns a mismatch with
the m asked for into one error line, and :func:`apply_zoo` traces a zoo model with the placement's m
and builds its :class:`~postplace.runtime.placed.PlacedStep`; one call of that step runs the whole
accumulated step (m micro-batches, one update).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import numpy as np

from postplace.errors import PostplaceError
from postplace.graph.microbatch_names import placement_microbatches

__all__ = ["apply_zoo", "check_placement_microbatches", "placement_microbatches", "trace_zoo_step"]


def _describe(m: int) -> str:
    if m == 1:
        return "a step traced as one micro-batch (no mb0_... op names)"
    return f"a step traced as {m} micro-batches (op names mb0_...mb{m - 1}_)"


def check_placement_microbatches(
    op_names: Iterable[str], microbatches: int | None, source: str, flag: str = "--microbatches"
) -> int:
    """The micro-batch count of a placement's op names, checked against ``microbatches`` (None: any);
    a mismatch is one :class:`PostplaceError` line that names both counts."""
    found = placement_microbatches(op_names)
    if microbatches is not None and found != microbatches:
        raise PostplaceError(
            f"{source} is a placement of {_describe(found)}, but {flag} {microbatches} was asked for; "
            f"give {flag} {found}"
        )
    return found


def trace_zoo_step(
    name: str,
    size: str,
    *,
    microbatches: int = 1,
    colocation: str = "none",
    optimizer="sgd",
    lr: float | None = None,
    precision: str = "fp32",
    batch: int | None = None,
):
    """:func:`postplace.zoo.trace_model` with the micro-batch request checked first (one-line errors)."""
    from postplace.zoo import trace_model

    if isinstance(microbatches, bool) or not isinstance(microbatches, int | np.integer) or microbatches < 1:
        raise PostplaceError(f"microbatches {microbatches!r}: give a count of 1 or more")
    if colocation not in ("none", "module"):
        raise PostplaceError(f"micro-batch colocation '{colocation}': use none or module")
    return trace_model(
        name,
        size,
        optimizer,
        lr=lr,
        precision=precision,
        microbatches=int(microbatches),
        colocation=colocation,
        batch=batch,
    )


def apply_zoo(
    name: str,
    size: str,
    placement,
    cluster,
    *,
    microbatches: int = 1,
    colocation: str = "none",
    model=None,
    device_map: str | Mapping[str, str] | None = None,
    optimizer="sgd",
    lr: float | None = None,
    precision: str = "fp32",
    batch: int | None = None,
):
    """The placed training step of zoo model ``name`` at ``size``, traced as ``microbatches`` micro-batches.

    Parameters
    ----------
    name, size : str
        The zoo model and its size.
    placement : array of int or dict
        Op-level device ids ``int[num_ops]`` of that graph, or ``{op name: device name}`` (with a
        :class:`~postplace.cluster.Cluster`, a partial mapping is completed through colocation and
        checked against the cluster's rules, as ``placement.json`` is read).
    cluster : Cluster, str, path or list of str
        A Cluster, a preset name or cluster file, or a list of logical device names.
    microbatches, colocation
        How the placed graph was traced (a result's ``target_spec`` ``microbatches`` /
        ``microbatch_colocation``); a placement of another m is one error line.
    model : torch.nn.Module, optional
        The module whose parameters and buffers the step starts from (default: the freshly built zoo
        model); it must have the zoo model's parameters.
    device_map : str or mapping, optional
        Logical device -> torch device; ``"cpu"`` runs every device on the CPU.
    optimizer, lr, precision, batch
        As for :func:`postplace.zoo.trace_model` (a result's ``target_spec`` records the optimizer and
        precision it was placed for).

    Returns
    -------
    postplace.runtime.placed.PlacedStep
        Each call runs the m micro-batches and one update.

    Raises
    ------
    PostplaceError
        When the placement is for another micro-batch count or does not fit the traced graph, and
        whatever :func:`postplace.runtime.apply` raises.
    """
    from postplace.runtime.placed import apply

    if isinstance(cluster, str):
        from postplace.cluster import load_cluster

        cluster = load_cluster(cluster)
    what = f"placement for {name} ({size})"
    if isinstance(placement, Mapping):
        check_placement_microbatches(placement, microbatches, what, "microbatches")
    traced = trace_zoo_step(
        name,
        size,
        microbatches=microbatches,
        colocation=colocation,
        optimizer=optimizer,
        lr=lr,
        precision=precision,
        batch=batch,
    )
    g = traced.graph
    if isinstance(placement, Mapping):
        if hasattr(cluster, "device_names"):
            from postplace.cluster.placement import from_mapping

            placement = from_mapping(g, cluster, dict(placement), source=what)
    else:
        placement = np.asarray(placement, dtype=np.int64).reshape(-1)
        if placement.shape[0] != g.num_ops:
            raise PostplaceError(
                f"{what} has {placement.shape[0]} entries, but the step traced as {microbatches} micro-batch"
                f"{'es' if microbatches != 1 else ''} has {g.num_ops} ops; give the micro-batch count the "
                "placement was made for (a result's target_spec['microbatches'])"
            )
    return apply(model if model is not None else traced.model, traced, placement, cluster, device_map=device_map)


def random_like(x, gen):
    """A new random batch tensor shaped and typed as ``x`` (from torch generator ``gen``): normal floats,
    integers (labels, token ids) below ``x``'s largest + 1."""
    import torch

    if x.is_floating_point():
        return torch.randn(x.shape, generator=gen, dtype=x.dtype)
    hi = int(x.max()) + 1 if x.numel() else 1
    return torch.randint(0, max(hi, 1), x.shape, generator=gen, dtype=x.dtype)
