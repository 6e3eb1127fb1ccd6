"""What the plan passes read off a traced step: its layers (units), its parameters, its gradient sums.

A traced step (:func:`postplace.graph.from_torch`, micro-batched by :mod:`postplace.graph.microbatch`)
names its ops so these can be found without torch:

* parameter ops are ``param:NAME`` (op type ``parameter``): slot 0 is the parameter, the other slots its
  optimizer state; the update ops of a parameter share its colocation id;
* micro-batch k's copy of op ``x`` is ``mb{k}_x``; the gradient sums are ``acc{k}_x`` (running total
  after micro-batch k) and the loss sums ``loss_sum{k}``: chains ``((v0 + v1) + v2) + ...``;
* every op says which ``nn.Module`` issued it; a *unit* is what FSDP wraps and activation checkpointing
  recomputes: the module path up to its first numbered part (``blocks.3``, ``layer2.1``); ops of no
  numbered module belong to the root unit ``""``.
"""

from __future__ import annotations

import re

import numpy as np

from postplace.graph import PHASES, OpGraph

FORWARD, BACKWARD, UPDATE, OTHER = (PHASES.index(p) for p in ("forward", "backward", "update", "other"))
_CHAIN = re.compile(r"^(?:acc(\d+)_|loss_sum(\d+)$)")


def unit_of(module: str) -> str:
    """The unit an op of ``module`` belongs to: the path up to its first numbered part, else the root ``""``.

    >>> unit_of("blocks.3.attn.wq"), unit_of("layer2.1.conv1"), unit_of("head"), unit_of("")
    ('blocks.3', 'layer2.1', '', '')
    """
    parts = module.split(".")
    for k, p in enumerate(parts):
        if p.isdigit() and k > 0:
            return ".".join(parts[: k + 1])
    return ""


_RANK_PREFIX = re.compile(r"^(?:t\d+/)?(?:r\d+/)?")


def traced_name(name: str, *, keep_clones: bool = False) -> str:
    """The traced op a planned op copies: its tensor rank's and replica's prefixes dropped, and a recomputed
    clone's ``rc:`` unless ``keep_clones``.

    >>> traced_name("t1/r3/rc:mb0_mm"), traced_name("r0/mb2_add"), traced_name("rc:x", keep_clones=True)
    ('mb0_mm', 'mb2_add', 'rc:x')
    """
    name = _RANK_PREFIX.sub("", name, count=1)
    return name if keep_clones else name.removeprefix("rc:")


def units(graph: OpGraph) -> list[str]:
    """Per op, its unit."""
    cache = {m: unit_of(m) for m in set(graph.module)}
    return [cache[m] for m in graph.module]


def numbered_units(graph: OpGraph) -> list[str]:
    """The step's numbered units in the order their first forward op runs."""
    seen: dict[str, None] = {}
    for u, ph in zip(units(graph), graph.phase.tolist(), strict=True):
        if u and ph == FORWARD:
            seen.setdefault(u, None)
    return list(seen)


def microbatch_count(graph: OpGraph) -> int:
    """The number of micro-batches the step was traced as (1 when no op says)."""
    return int(graph.microbatch.max()) + 1 if graph.num_ops and graph.microbatch.max() >= 0 else 1


def chain_positions(graph: OpGraph) -> np.ndarray:
    """Per op: k for a gradient sum ``acc{k}_...`` or loss sum ``loss_sum{k}`` that every micro-batch
    shares, else -1 (in a planned step too: a rank's or replica's copy is its traced op's)."""
    pos = np.full(graph.num_ops, -1, dtype=np.int64)
    for i, (nm, mb) in enumerate(zip(graph.names, graph.microbatch.tolist(), strict=True)):
        if mb == -1 and (m := _CHAIN.match(traced_name(nm))):
            pos[i] = int(m.group(1) or m.group(2))
    return pos


def parameter_ops(graph: OpGraph) -> np.ndarray:
    """``bool[n]``: the parameter ops (``param:...`` or op type ``parameter``)."""
    return np.array(
        [n.startswith("param:") or t == "parameter" for n, t in zip(graph.names, graph.op_types, strict=True)],
        dtype=bool,
    )


def tied_embedding(graph: OpGraph) -> bool:
    """A parameter the forward reads both by an embedding lookup and by another op (GPT-2's token table, which
    its output head multiplies by): a pipeline has it on its first stage and its last."""
    param = parameter_ops(graph)
    types = np.asarray(graph.op_types)
    src, dst = graph.edge_src, graph.edge_dst
    read = param[src] & (graph.phase[dst] == 0)
    for p in np.unique(src[read]).tolist():
        kinds = set(types[dst[read & (src == p)]].tolist())
        if "embedding" in kinds and len(kinds) > 1:
            return True
    return False
