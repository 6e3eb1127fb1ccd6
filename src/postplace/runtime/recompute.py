"""Activation recomputation in a replica's program (DESIGN.md section 7), as the simulated pass
(:mod:`postplace.plans.recompute`) writes it: for every recomputed unit and micro-batch, the forward ops of
the unit whose outputs its backward reads run again just before the first backward op that needs them,
from the unit's inputs, and the backward reads the copies, so between the forward and the backward a
recomputed unit keeps only its inputs alive.

Two kinds of forward op are kept instead of run again, as ``torch.utils.checkpoint`` keeps their effect:
a random op (dropout: running it again would draw another mask; checkpointing replays the generator, here
its output is kept), and an op that writes in place a value the recomputation does not make again (it
would write twice). Recomputed values equal the forward's bit for bit (same ops, same inputs).
"""

from __future__ import annotations

import torch
import torch.fx

from postplace.graph import PHASES
from postplace.runtime.placed import written_args

__all__ = ["keeps_output", "recompute_program"]

_FORWARD, _BACKWARD = PHASES.index("forward"), PHASES.index("backward")


def recompute_program(gm: torch.fx.GraphModule, traced, which: set[str]) -> int:
    """Rewrite ``gm`` (a replica's program of ``traced``) so the backward of each unit in ``which``
    reads recomputed forward values; returns how many ops it runs again."""
    from postplace.plans import unit_of

    graph = traced.graph
    op_of = traced.op_of_node

    def where(n: torch.fx.Node) -> tuple[int, str, int] | None:
        op = op_of.get(n.name, -1)
        if op < 0 or n.op != "call_function":
            return None
        return int(graph.phase[op]), unit_of(graph.module[op]), int(graph.microbatch[op])

    copies: dict[torch.fx.Node, torch.fx.Node] = {}
    made = 0

    def again(x: torch.fx.Node, unit: str, mb: int) -> torch.fx.Node:
        nonlocal made
        w = where(x)
        if w is None or w[0] != _FORWARD or w[1] != unit or w[2] != mb or keeps_output(x):
            return x  # the unit's input, a parameter, or a kept output: read as the forward left it
        if x not in copies:
            args = torch.fx.map_arg(x.args, lambda a: again(a, unit, mb))
            kwargs = torch.fx.map_arg(x.kwargs, lambda a: again(a, unit, mb))
            copies[x] = gm.graph.call_function(x.target, args, kwargs)
            copies[x].meta = dict(x.meta)
            made += 1
        return copies[x]

    for n in list(gm.graph.nodes):
        w = where(n)
        if w is None or w[0] != _BACKWARD:
            continue
        for a in n.all_input_nodes:
            wa = where(a)
            if wa is None or wa[0] != _FORWARD or wa[1] not in which or keeps_output(a):
                continue
            with gm.graph.inserting_before(n):
                n.replace_input_with(a, again(a, wa[1], wa[2]))
    gm.recompile()
    return made


def keeps_output(n: torch.fx.Node) -> bool:
    """A forward op whose output the recomputation keeps instead of making again: a random op, or one that
    writes in place (dropout's ``bernoulli_`` and ``div_``)."""
    if torch.Tag.nondeterministic_seeded in getattr(n.target, "tags", ()):
        return True
    return bool(written_args(n))
