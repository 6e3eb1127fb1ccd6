"""Human-expert-style placements: layer-wise model parallelism, or a split written by an expert.

Scope and caveats: without a split file the placer reads layer numbers, embeddings and softmax only
from op names (patterns in :data:`LAYER_PATTERN`, :data:`EMBEDDING_PATTERN`, :data:`SOFTMAX_PATTERN`);
graphs whose names carry none get the contiguous split by work. No memory check.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np

from postplace.cluster import Cluster
from postplace.cluster.placement import from_mapping
from postplace.cost import CostModel
from postplace.errors import PostplaceError
from postplace.graph import OpGraph
from postplace.graph.dnn_partitioning import import_expert_split
from postplace.graph.opgraph import PHASES, read_json
from postplace.placers._common import (
    check_graph,
    constrained_devices,
    devices_of_kind,
    force_cpu_only,
    op_time_table,
    units,
)
from postplace.placers.registry import register_placer

__all__ = ["EMBEDDING_PATTERN", "LAYER_PATTERN", "SOFTMAX_PATTERN", "place_expert"]

LAYER_PATTERN = re.compile(r"(?:^|[^a-z])(?:layers?|lstm|rnn|gru|h)[._/-]?(\d+)(?![\d])", re.IGNORECASE)
EMBEDDING_PATTERN = re.compile(r"embed|(?:^|[^a-z])wte|(?:^|[^a-z])wpe", re.IGNORECASE)
SOFTMAX_PATTERN = re.compile(
    r"softmax|logits|lm_head|predictions|classifier|cross_entropy|(?:^|[^a-z])loss", re.IGNORECASE
)


@register_placer("expert", candidate=True, heuristic=True, rank=70)
def place_expert(
    graph: OpGraph,
    cluster: Cluster,
    *,
    cost_model: CostModel | None = None,
    seed: int = 0,
    split: str | Path | dict | None = None,
    allowed: np.ndarray | None = None,
) -> np.ndarray:
    """Place the model the way a human expert would split it over the GPUs.

    With ``split`` (a dnn-partitioning expert split file, or its parsed JSON): that split, read by
    :func:`postplace.graph.dnn_partitioning.import_expert_split`. When it names more accelerators than
    the cluster has GPUs, accelerator ``k`` of ``A`` goes to GPU ``floor(k * G / A)`` (consecutive
    accelerators share a GPU). Ops the split leaves out follow their colocation set, else the device
    of their nearest placed producer, else consumer.

    Without a split, the layer-wise placement of the RL placement papers:

    * if op names carry layer numbers (``layer.3``, ``lstm_1``, ``h.0``...; two or more distinct), each
      layer number gets its own GPU (an encoder's and a decoder's layer ``i`` share one, as in GNMT);
      the softmax, then the embeddings, get GPUs of their own (after and before the layers) while
      GPUs are left, else share the last and first layer's. With more layers than GPUs, consecutive
      layers share a GPU.
    * else consecutive ops are split evenly by work: the colocation units holding a forward op, in
      program order, go to GPU ``q`` when the middle of their work falls in the ``q``-th equal share of
      the total work (time on the first GPU).

    Ops not placed by either rule (backward or update ops not colocated with a forward op, ops without
    a layer number) follow their nearest placed producer, else consumer, else the first GPU. Ops that
    may not run on a GPU go to the CPU. Colocation sets are placed as units.

    Parameters
    ----------
    graph, cluster : OpGraph, Cluster
    cost_model : CostModel, optional
        Default :class:`postplace.cost.RooflineCostModel` (used for the work split).
    seed : int
        Unused (deterministic).
    split : path or dict, optional
        An expert split in the dnn-partitioning format.
    allowed : numpy.ndarray, optional
        ``[n_ops, D]`` bool: the user's constraints (pins, exclusions): devices no op may use are left
        out of the split, and an op the split puts where it may not go moves to its first allowed device.

    Returns
    -------
    numpy.ndarray
        int64 device id per op.

    References
    ----------
    A. Mirhoseini et al., "Device Placement Optimization with Reinforcement Learning", ICML 2017 (the
    human-expert baselines); Y. Wu et al., "Google's Neural Machine Translation System", 2016 (one
    LSTM layer per GPU).

    Examples
    --------
    >>> from postplace.graph import OpGraph
    >>> from postplace.testing import ConstantCostModel, star_cluster
    >>> names = ["embed", "layer.0", "layer.1", "softmax"]
    >>> g = OpGraph.build(names, [(0, 1), (1, 2), (2, 3)])
    >>> place_expert(g, star_cluster(("cpu", "gpu", "gpu", "gpu", "gpu")), cost_model=ConstantCostModel(1.0)).tolist()
    [1, 2, 3, 4]
    """
    check_graph(graph, cluster, "expert", allowed)
    if split is not None:
        return force_cpu_only(graph, cluster, _from_split(graph, cluster, split), allowed)
    gpus = constrained_devices(devices_of_kind(cluster, "gpu") or list(range(cluster.num_devices)), allowed)
    unit_of_op, members = units(graph)
    U = len(members)
    udev = np.full(U, -1, dtype=np.int64)
    names = [graph.names[m[0]] for m in members]
    layer = np.full(U, -1, dtype=np.int64)
    for u, m in enumerate(members):
        for i in m:
            hit = LAYER_PATTERN.search(graph.names[i])
            if hit:
                layer[u] = int(hit.group(1))
                break
    labels = sorted(set(layer[layer >= 0].tolist()))
    if len(labels) >= 2:
        emb = np.array([layer[u] < 0 and bool(EMBEDDING_PATTERN.search(names[u])) for u in range(U)])
        soft = np.array([layer[u] < 0 and bool(SOFTMAX_PATTERN.search(names[u])) for u in range(U)])
        L, G = len(labels), len(gpus)
        pos = {lab: q for q, lab in enumerate(labels)}
        own_soft = bool(soft.any()) and L + 1 <= G
        own_emb = bool(emb.any()) and L + int(own_soft) + 1 <= G
        if L <= G:
            layer_dev = {lab: gpus[int(own_emb) + q] for lab, q in pos.items()}
        else:
            layer_dev = {lab: gpus[q * G // L] for lab, q in pos.items()}
        emb_dev = gpus[0] if own_emb else layer_dev[labels[0]]
        soft_dev = gpus[int(own_emb) + L] if own_soft else layer_dev[labels[-1]]
        for u in range(U):
            if layer[u] >= 0:
                udev[u] = layer_dev[int(layer[u])]
            elif emb[u]:
                udev[u] = emb_dev
            elif soft[u]:
                udev[u] = soft_dev
    else:
        times = op_time_table(graph, cluster, cost_model, allowed)
        t = times[:, gpus[0]]
        t = np.where(np.isfinite(t), t, 0.0)
        fwd = PHASES.index("forward")
        lead = [u for u, m in enumerate(members) if np.any(graph.phase[m] == fwd)]
        work = np.array([t[members[u]].sum() for u in lead])
        total = float(work.sum())
        if lead:
            mid = np.cumsum(work) - work / 2
            share = np.floor(mid / total * len(gpus)).astype(np.int64) if total > 0 else np.zeros(len(lead), int)
            for u, q in zip(lead, np.clip(share, 0, len(gpus) - 1), strict=True):
                udev[u] = gpus[int(q)]
    dev = _complete(graph, udev[unit_of_op], unit_of_op, members, gpus[0])
    return force_cpu_only(graph, cluster, dev, allowed)


def _complete(graph: OpGraph, dev: np.ndarray, unit_of_op, members, fallback: int) -> np.ndarray:
    """Give unplaced units the device of their nearest placed producer, else consumer, else ``fallback``."""
    dev = dev.copy()
    for direction in (1, -1):
        rng = range(graph.num_ops) if direction == 1 else range(graph.num_ops - 1, -1, -1)
        for i in rng:
            if dev[i] >= 0:
                continue
            if direction == 1:
                nbrs = graph.edge_src[graph.in_edges[graph.in_ptr[i] : graph.in_ptr[i + 1]]]
            else:
                nbrs = graph.edge_dst[graph.out_ptr[i] : graph.out_ptr[i + 1]]
            placed = [int(dev[j]) for j in nbrs if dev[j] >= 0]
            if placed:
                dev[members[unit_of_op[i]]] = placed[0]
    dev[dev < 0] = fallback
    return dev


def _from_split(graph: OpGraph, cluster: Cluster, split) -> np.ndarray:
    source = "split"
    if isinstance(split, str | Path):  # anything else is checked as the parsed split it should be
        source = str(split)
        split = read_json(split)
        if not isinstance(split, dict):
            raise PostplaceError(f"{source}: an expert split file is one JSON object with 'cpus' and 'fpgas'")
    mapping = import_expert_split(split, graph, source=source)
    gpus = [cluster.device_names[d] for d in devices_of_kind(cluster, "gpu")]
    A = len(split.get("fpgas", []))
    if gpus and A > len(gpus):
        fold = {f"gpu{k}": gpus[k * len(gpus) // A] for k in range(A)}
        mapping = {op: fold.get(d, d) for op, d in mapping.items()}
    placed = _from_mapping_partial(graph, cluster, mapping, source)
    unit_of_op, members = units(graph)
    dev = _complete(graph, placed, unit_of_op, members, placed[placed >= 0][0] if (placed >= 0).any() else 0)
    return from_mapping(
        graph, cluster, {graph.names[i]: cluster.device_names[d] for i, d in enumerate(dev)}, source=source
    )


def _from_mapping_partial(graph: OpGraph, cluster: Cluster, mapping: dict, source: str) -> np.ndarray:
    """Device ids from ``{op name: device name}`` spread over colocation sets; -1 where nothing says."""
    dev = np.full(graph.num_ops, -1, dtype=np.int64)
    for name, device in mapping.items():
        try:
            dev[graph.index(name)] = cluster.device_index(device)
        except PostplaceError as exc:
            raise PostplaceError(f"{source}: {exc}") from None
    for m in graph.colocation_sets:
        placed = dev[m][dev[m] >= 0]
        if placed.size:
            dev[m[dev[m] < 0]] = placed[0]
    return dev
