"""Grouping: the units a search places. Colocation first, then a balanced partition into G groups.

Post (like the hierarchical planner) places groups of ops, not single ops: the search space shrinks
from D^n to D^G. The pass:

1. contracts every colocation set to one unit (an op's gradient and update ops stay with it);
2. keeps apart ops that must not share a device anyway: different effective device kinds (a CPU-only
   op never drags GPU-capable ops onto the CPU) and different pins; and, in a step traced as several
   micro-batches, ops of different micro-batches (:func:`microbatch_classes`: otherwise a layer's
   copies, joined through their shared parameter, would land in one group and data parallelism
   could not be placed);
3. if more units than ``num_groups`` remain, partitions the unit graph into ``num_groups`` balanced
   parts with METIS (pymetis, recursive bisection): vertex weight = work, clipped at one part's share,
   plus a per-unit term (a few huge units must not leave parts empty); edge weight = bytes moved, so
   heavy edges stay inside a group. Parts are then split by the classes of step 2 and renumbered by first op.

``num_groups=None`` skips step 3 (op-level placement: one unit per colocation set).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np

from postplace.graph.metis import part_graph, symmetric_csr
from postplace.graph.opgraph import OpGraph


@dataclass(frozen=True, eq=False)
class Grouping:
    """``group_of_op[i]`` is op i's group; groups are numbered by their first op in program order."""

    group_of_op: np.ndarray
    num_groups: int

    def members(self, g: int) -> np.ndarray:
        return np.flatnonzero(self.group_of_op == g)

    def expand(self, placements: np.ndarray) -> np.ndarray:
        """Op-level device ids from group-level placements ``[k, G]`` (or one ``[G]``)."""
        return np.asarray(placements)[..., self.group_of_op]

    def collapse(self, op_placement: np.ndarray) -> np.ndarray:
        """Group-level placement from an op-level one: each group takes the device of its first op."""
        return np.asarray(op_placement)[..., self._first_op]

    @cached_property
    def _first_op(self) -> np.ndarray:
        return np.unique(self.group_of_op, return_index=True)[1]


def colocation_units(graph: OpGraph) -> np.ndarray:
    """Unit id per op: one per colocation set, one per unconstrained op, numbered in program order."""
    n = graph.num_ops
    rep = np.arange(n)
    for members in graph.colocation_sets:
        rep[members] = members[0]
    _, unit = np.unique(rep, return_inverse=True)
    return unit


def microbatch_classes(graph: OpGraph, unit: np.ndarray) -> np.ndarray | None:
    """Per op, the micro-batch of its colocation unit (0..m-1; m for units shared by all micro-batches
    or spanning several), or None when the graph has fewer than two micro-batches. Grouping keeps
    micro-batches apart with it, so a step traced with colocation ``none`` can still place micro-batch
    i on device i (data parallelism) after coarsening; units spanning micro-batches (colocation
    ``module``) stay whole."""
    mb = graph.microbatch.astype(np.int64)
    top = int(mb.max()) if mb.size else -1
    if top < 1:
        return None
    n_units = int(unit.max()) + 1
    lo = np.full(n_units, top + 1)
    hi = np.full(n_units, -1)
    own = mb >= 0
    np.minimum.at(lo, unit[own], mb[own])
    np.maximum.at(hi, unit[own], mb[own])
    cls = np.where((hi >= 0) & (lo == hi), hi, top + 1)
    return cls[unit]


def group_ops(
    graph: OpGraph,
    num_groups: int | None = 256,
    *,
    op_weight: np.ndarray | None = None,
    classes: np.ndarray | None = None,
    seed: int = 0,
) -> Grouping:
    """Group ``graph``'s ops into at most about ``num_groups`` units (see the module docstring).

    ``op_weight``: work per op (default FLOPs + 1); ``classes``: int per op, ops of different classes
    never share a group (e.g. effective kind mask and pin); ``seed``: METIS's random seed.

    >>> g = OpGraph.build(["a", "b", "c", "d"], [(0, 1, 9.0), (1, 2, 1.0), (2, 3, 9.0)])
    >>> group_ops(g, 2).group_of_op.tolist()
    [0, 0, 1, 1]
    """
    unit = colocation_units(graph)
    mb_class = microbatch_classes(graph, unit)
    if mb_class is not None:
        classes = mb_class if classes is None else _split_by(np.asarray(classes), mb_class)
    if classes is not None:
        unit = _split_by(unit, classes)
    n_units = int(unit.max()) + 1 if graph.num_ops else 0
    if num_groups is None or n_units <= num_groups:
        return Grouping(unit, n_units)
    weight = graph.flops + 1.0 if op_weight is None else np.asarray(op_weight, dtype=np.float64)
    part = _metis(graph, unit, n_units, weight, num_groups, seed)
    group = _renumber(part[unit])
    if classes is not None:
        group = _split_by(group, classes)
    return Grouping(group, int(group.max()) + 1 if group.size else 0)


def _metis(graph: OpGraph, unit: np.ndarray, n_units: int, weight: np.ndarray, parts: int, seed: int):
    # symmetric adjacency with summed weights per unit pair
    xadj, adjncy, summed = symmetric_csr(unit[graph.edge_src], unit[graph.edge_dst], graph.edge_bytes, n_units)
    work = np.bincount(unit, weights=weight, minlength=n_units)
    # A unit heavier than one part's share cannot be balanced and makes METIS leave parts empty:
    # clip work at the share, and add a per-unit term so that light units still spread over parts.
    clipped = np.minimum(work, work.sum() / parts)
    balance = clipped / max(clipped.sum(), 1e-300) + 1.0 / n_units
    return part_graph(parts, xadj, adjncy, vweights=balance, eweights=summed, scale=1000, recursive=True, seed=seed)


def _split_by(ids: np.ndarray, classes: np.ndarray) -> np.ndarray:
    pairs = ids.astype(np.int64) * (int(np.max(classes)) + 1) + np.asarray(classes, dtype=np.int64)
    return _renumber(pairs)


def _renumber(ids: np.ndarray) -> np.ndarray:
    """Number ids by first appearance (program order)."""
    _, first, inv = np.unique(ids, return_index=True, return_inverse=True)
    order = np.argsort(first, kind="stable")
    rank = np.empty_like(order)
    rank[order] = np.arange(order.size)
    return rank[inv]


@dataclass(frozen=True, eq=False)
class LayerGrouping:
    """Units of a micro-batched step that line up across micro-batches: unit = (layer, slot).

    A *layer* is a set of ops of the step traced once (a template op with all its micro-batch copies,
    and shared ops); its *slot* j < m holds micro-batch j's copies, slot m its shared ops (parameters,
    gradient sums, the update). So micro-batch j's part of layer l is one unit in every micro-batch,
    and a plan such as "micro-batch j of every layer on GPU j" is one decision per layer.
    """

    grouping: Grouping
    layer_of_unit: np.ndarray
    """``[G]``: the layer of each unit."""
    slot_of_unit: np.ndarray
    """``[G]``: the micro-batch of each unit (0..m-1), m for a unit of shared ops."""
    num_layers: int
    microbatches: int


def layer_groups(
    graph: OpGraph,
    num_layers: int | None = 256,
    *,
    op_weight: np.ndarray | None = None,
    classes: np.ndarray | None = None,
    seed: int = 0,
) -> LayerGrouping | None:
    """Group a micro-batched step by layer: about ``num_layers`` layers, each split by slot.

    None when the graph has fewer than two micro-batches. The pass folds every micro-batch copy onto
    the op it copies (``mb3_conv`` -> ``conv``) and a colocation set onto one folded unit, partitions
    the folded graph as :func:`group_ops` does (METIS, work balanced, bytes cut; ``classes`` kept
    apart), then splits each layer by the slot of each colocation unit (:func:`microbatch_classes`:
    a set holding ops of one micro-batch and shared ops, such as a batch-norm buffer, goes with that
    micro-batch).

    >>> g = OpGraph.build(["p", "mb0_f", "mb1_f", "u"], [(0, 1), (0, 2), (1, 3), (2, 3)],
    ...                   microbatch=[-1, 0, 1, -1], colocation=[0, -1, -1, 0])
    >>> lg = layer_groups(g, 4)
    >>> lg.layer_of_unit.tolist(), lg.slot_of_unit.tolist()
    ([0, 1, 1], [2, 0, 1])
    """
    from postplace.graph.microbatch_names import copied_name

    unit = colocation_units(graph)
    slot = microbatch_classes(graph, unit)
    if slot is None:
        return None
    m = int(graph.microbatch.max()) + 1
    mb = graph.microbatch
    keys = [copied_name(n) if k >= 0 else n for n, k in zip(graph.names, mb, strict=True)]
    _, template = np.unique(np.array(keys, dtype=object), return_inverse=True)
    fold = _join(template, unit)
    if classes is not None:
        fold = _split_by(fold, classes)
    n_fold = int(fold.max()) + 1
    if num_layers is not None and n_fold > num_layers:
        weight = graph.flops + 1.0 if op_weight is None else np.asarray(op_weight, dtype=np.float64)
        layer = _renumber(_metis(graph, fold, n_fold, weight, num_layers, seed)[fold])
        if classes is not None:
            layer = _split_by(layer, classes)
    else:
        layer = fold
    group = _renumber(layer.astype(np.int64) * (m + 1) + slot)
    G = int(group.max()) + 1
    layer_of_unit = np.zeros(G, dtype=np.int64)
    slot_of_unit = np.zeros(G, dtype=np.int64)
    layer_of_unit[group] = layer
    slot_of_unit[group] = slot
    return LayerGrouping(Grouping(group, G), layer_of_unit, slot_of_unit, int(layer.max()) + 1, m)


def _join(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Connected components of ops sharing an ``a`` id or a ``b`` id, numbered in program order."""
    from scipy.sparse import coo_matrix
    from scipy.sparse.csgraph import connected_components

    na, nb = int(a.max()) + 1, int(b.max()) + 1
    edges = coo_matrix((np.ones(a.size), (a, na + b)), shape=(na + nb, na + nb))
    _, comp = connected_components(edges, directed=False)
    return _renumber(comp[a])
