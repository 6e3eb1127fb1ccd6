"""Micro-batches as a graph pass: one traced micro-batch step becomes the step of m micro-batches.

:func:`replicate_microbatches` is a pass over the fx graph of a training step (torch.fx style: a
function from a GraphModule to a new GraphModule, the input left unchanged) that was traced on one
micro-batch (batch B/m):

* **Pre:** placeholders are ``n_shared`` shared values (parameters, buffers, optimizer state) then
  the micro-batch's own values (inputs, then targets); every ``call_function`` node carries
  ``meta["custom"]["phase"]`` (``forward``, ``backward`` or ``update``, as
  :mod:`postplace.graph.trace_torch` annotates); the output is the micro-batch's (already scaled) loss.
* **Post:** placeholders are the shared ones, then micro-batch 0's own values, micro-batch 1's...;
  in program order come micro-batch 0's forward and backward nodes, micro-batch 1's forward and
  backward nodes followed by one ``add`` per gradient that sums it into the running total, and so on
  (``acc{k}_{grad}``; gradient accumulation in program order: ``((g0 + g1) + g2) + ...``, the order of eager
  ``loss.backward()`` per micro-batch); then the update nodes once, reading the summed gradients;
  the output is the sum of the micro-batch losses (``loss_sum{k}``). A gradient here is any value a forward or
  backward node makes that an update node reads.
* Copies are named ``mb{k}_{name}`` and carry ``meta["custom"]["microbatch"] = k`` and
  ``["template"] = name`` (the node they copy); accumulation nodes carry ``["accumulate"] = True``
  and the ``param`` index of the update that reads them; loss sums ``["loss_sum"] = True``. Shared
  nodes (parameters, buffers, constants, the update) are not copied. Running statistics written in
  place by a forward node (batch norm) are therefore updated once per micro-batch, in order, as in
  eager gradient accumulation.

The pass copies nodes; it traces nothing, so m micro-batches cost one trace plus m cheap copies.
"""

from __future__ import annotations

import torch
import torch.fx
from torch.fx._lazy_graph_module import _make_graph_module, _use_lazy_graph_module

__all__ = ["replicate_microbatches"]

_PER_MB = ("forward", "backward")


def _phase(node: torch.fx.Node) -> str | None:
    return (node.meta.get("custom") or {}).get("phase")


def replicate_microbatches(gm: torch.fx.GraphModule, m: int, n_shared: int) -> torch.fx.GraphModule:
    """The GraphModule of ``gm``'s step run as ``m`` micro-batches (see the module docstring)."""
    with _use_lazy_graph_module(True):
        return _replicate(gm, m, n_shared)


def _replicate(gm, m, n_shared):
    if m < 1:
        raise ValueError(f"microbatches must be >= 1, got {m}")
    nodes = list(gm.graph.nodes)
    placeholders = [n for n in nodes if n.op == "placeholder"]
    shared_ph, own_ph = placeholders[:n_shared], placeholders[n_shared:]
    body = [n for n in nodes if n.op not in ("placeholder", "output")]
    per_mb = [n for n in body if n.op == "call_function" and _phase(n) in _PER_MB]
    per_mb_set = set(per_mb)
    shared = [n for n in body if n not in per_mb_set]
    (out_node,) = [n for n in nodes if n.op == "output"]

    # gradients: values of per-micro-batch nodes that shared nodes (the update) read
    grads: dict[torch.fx.Node, int | None] = {}
    for n in shared:
        for a in n.all_input_nodes:
            if a in per_mb_set and a not in grads:
                grads[a] = (n.meta.get("custom") or {}).get("param")
    g = torch.fx.Graph()
    env: dict[torch.fx.Node, torch.fx.Node] = {}
    for n in shared_ph:
        env[n] = g.node_copy(n, lambda a: env[a])
    envs: list[dict[torch.fx.Node, torch.fx.Node]] = []
    for k in range(m):
        ek = {}
        for n in own_ph:
            p = g.placeholder(f"mb{k}_{n.name}")
            p.meta = {**n.meta, "custom": {**(n.meta.get("custom") or {}), "microbatch": k, "template": n.name}}
            ek[n] = p
        envs.append(ek)

    def copy(n: torch.fx.Node, k: int) -> torch.fx.Node:
        ek = envs[k]

        def look(a):
            return ek[a] if a in ek else env[a]

        args = torch.fx.node.map_arg(n.args, look)
        kwargs = torch.fx.node.map_arg(n.kwargs, look)
        c = g.create_node(n.op, n.target, args, kwargs, name=f"mb{k}_{n.name}")
        c.meta = {**n.meta, "custom": {**(n.meta.get("custom") or {}), "microbatch": k, "template": n.name}}
        return c

    # shared nodes that per-micro-batch nodes read (constants, get_attr) must exist before them
    pre = [n for n in shared if n.op != "call_function" or _phase(n) != "update"]
    post = [n for n in shared if n.op == "call_function" and _phase(n) == "update"]
    for n in pre:
        env[n] = g.node_copy(n, lambda a: env[a])
    acc: dict[torch.fx.Node, torch.fx.Node] = {}
    loss = out_node.args[0]
    loss_node = loss[0] if isinstance(loss, list | tuple) else loss
    total = None
    add = torch.ops.aten.add.Tensor
    for k in range(m):
        for n in per_mb:
            envs[k][n] = copy(n, k)
        if isinstance(loss_node, torch.fx.Node) and loss_node in per_mb_set:
            lk = envs[k][loss_node]
            if total is None:
                total = lk
            else:
                total = g.create_node("call_function", add, (total, lk), name=f"loss_sum{k}")
                total.meta = {
                    "val": loss_node.meta.get("val"),
                    "custom": {"phase": "forward", "loss_sum": True, "microbatch": -1},
                }
        for gr, param in grads.items():
            gk = envs[k][gr]
            if gr not in acc:
                acc[gr] = gk
                continue
            s = g.create_node("call_function", add, (acc[gr], gk), name=f"acc{k}_{gr.name}")
            s.meta = {
                "val": gr.meta.get("val"),
                "custom": {"phase": "backward", "accumulate": True, "param": param, "microbatch": -1},
            }
            acc[gr] = s
    for n in post:
        env[n] = g.node_copy(n, lambda a: acc[a] if a in acc else env[a])

    def out_map(a):
        if a is loss_node and total is not None:
            return total
        return acc[a] if a in acc else env[a]

    g.output(torch.fx.node.map_arg(out_node.args[0], out_map))
    return _make_graph_module(gm, g)  # lazy: its Python code is written when first run
