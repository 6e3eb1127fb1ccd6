"""Activation recomputation in a replica's program (DESIGN.md section 7), as the simulated pass
(:mod:`postplace.plans.recompute`) writes it: for every recomputed unit and micro-batch, the forward ops of
the unit whose outputs the unit's own backward reads run again just before the first backward op that
needs them, from the unit's inputs, and that backward reads the copies, so between the forward and the
backward a recomputed unit keeps only its inputs alive (its output, the next unit's input, stays for the
next unit's backward, as checkpointing saves a block's input).

``ddp``, ``zero1`` and ``zero2`` rewrite their replica's program afterwards (:func:`recompute_program`);
``fsdp`` (:mod:`postplace.runtime.fsdp`) makes the copies while it writes its program
(:meth:`Recomputation.again`), from the unit's backward all-gather: the gather comes before the unit's
recomputed ops, which read its parameters (and their views, ``t(weight)``) from it, so the forward
gather's full parameters die with the forward.

Two kinds of forward op are kept instead of run again, as ``torch.utils.checkpoint`` keeps their effect:
a random op (dropout: running it again would draw another mask; checkpointing replays the generator, here
its output is kept), and an op that writes in place a value the recomputation does not make again (it
would write twice). *Selective* recomputation (``+selective``, or ``selective=U/U`` for some units beside
others recomputed whole) keeps, besides, the ops torchtitan's selective op rule saves
(:func:`postplace.plans.recompute.selective_saves`, the very set the simulated pass keeps: attention kernels
and every other ``mm`` of a unit). Recomputed values equal the forward's
bit for bit (same ops, same inputs).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import numpy as np
import torch
import torch.fx

from postplace.errors import PostplaceError
from postplace.graph import PHASES
from postplace.runtime.placed import written_args

__all__ = ["Recomputation", "keeps_output", "recompute_program", "recomputed_units", "selective_of"]

_FORWARD, _BACKWARD = PHASES.index("forward"), PHASES.index("backward")


class Recomputation:
    """Which forward values of a traced step a replica's program makes again, and their copies.

    Parameters
    ----------
    traced : postplace.graph.trace_torch.Traced
        The step the program runs (its nodes are found by name: ``traced.op_of_node``).
    which : collection of str
        The recomputed units (:func:`postplace.plans.unit_of`; ``""`` the root).
    selective : bool or collection of str
        Keep the outputs torchtitan's selective op rule saves
        (:func:`postplace.plans.recompute.selective_saves`) instead of making them again: in every unit of
        ``which`` (True), in none (False), or in these units only (the others recomputed whole).

    Raises
    ------
    PostplaceError
        A unit the step does not have.
    """

    def __init__(self, traced, which: Iterable[str], *, selective: bool | Iterable[str] = False):
        from postplace.plans import unit_of
        from postplace.plans._step import units
        from postplace.plans.recompute import selective_saves

        graph = traced.graph
        self.which = set(which)
        known = set(units(graph))
        bad = sorted(self.which - known)
        if bad:
            raise PostplaceError(
                f"recompute= or selective= names unit '{bad[0] or 'root'}', which the step does not have (its units: "
                f"{', '.join(u or 'root' for u in sorted(known, key=lambda u: (u != '', u))[:6])}, ...)"
            )
        if isinstance(selective, bool | np.bool_):
            by_rule = self.which if selective else set()
        elif isinstance(selective, str) or not all(isinstance(u, str) for u in selective):
            raise PostplaceError(f"selective={selective!r}: give True, False, or a collection of unit names")
        elif extra := sorted(set(selective) - self.which):
            raise PostplaceError(
                f"selective names unit '{extra[0] or 'root'}', which is not among the recomputed units"
            )
        else:
            by_rule = set(selective)
        self.saved = frozenset(selective_saves(graph, by_rule)) if by_rule else frozenset()
        self.made = 0  # how many ops run again
        self._op_of = traced.op_of_node
        self._phase = graph.phase.tolist()
        self._unit = [unit_of(m) for m in graph.module]
        self._mb = graph.microbatch.tolist()
        self._input = [kind == "input" for kind in graph.op_types]
        self._copies: dict[torch.fx.Node, torch.fx.Node] = {}

    def _op(self, n: torch.fx.Node) -> int:
        return self._op_of.get(n.name, -1) if n.op == "call_function" else -1

    def kept(self, n: torch.fx.Node) -> bool:
        """A forward output of a recomputed unit read as the forward left it: a random or in-place op's
        (:func:`keeps_output`) or, selectively, one the selective rule saves."""
        return keeps_output(n) or self._op(n) in self.saved

    def segment(self, n: torch.fx.Node) -> tuple[str, int] | None:
        """``(unit, micro-batch)`` of a forward value of a recomputed unit that is made again, else None."""
        op = self._op(n)
        if op < 0 or self._phase[op] != _FORWARD or self._unit[op] not in self.which or self.kept(n):
            return None
        if self._input[op]:  # a micro-batch's data (tokens, targets): fed, never made again
            return None
        return self._unit[op], int(self._mb[op])

    def reads_again(self, reader: torch.fx.Node, x: torch.fx.Node) -> tuple[str, int] | None:
        """The ``(unit, micro-batch)`` whose recomputed copy of ``x`` the node ``reader`` reads instead of
        ``x``: ``reader`` is a backward op of the unit and micro-batch that make ``x`` again; else None."""
        op = self._op(reader)
        if op < 0 or self._phase[op] != _BACKWARD:
            return None
        seg = self.segment(x)
        return seg if seg == (self._unit[op], int(self._mb[op])) else None

    def again(
        self, graph: torch.fx.Graph, x: torch.fx.Node, seg: tuple[str, int], read: Callable[[torch.fx.Node], object]
    ) -> torch.fx.Node:
        """The copy in ``graph`` (at its insertion point) of ``x``, a value of the segment ``seg``: its inputs
        of the segment made again too, each other input ``read(input)`` (the unit's inputs, kept outputs,
        parameters). A copy's ``meta["recompute"]`` names the traced node it makes again."""
        if self.segment(x) != seg:
            return read(x)
        if x not in self._copies:
            c = graph.node_copy(x, lambda a: self.again(graph, a, seg, read))
            c.meta["recompute"] = x.name
            self._copies[x] = c
            self.made += 1
        return self._copies[x]

    def prune(self, graph: torch.fx.Graph, node_of: Callable[[torch.fx.Node], torch.fx.Node | None]) -> None:
        """Erase from ``graph`` the program's nodes (``node_of(traced node)``) of the values made again that
        nothing reads any more, last first: a forward value only the backward read (autograd's ``detach``
        of a saved tensor, which sits in the backward and belongs to the forward op), else it would keep the
        forward's values alive until the backward."""
        nodes = [n for x in self._copies if (n := node_of(x)) is not None and n.graph is graph]
        order = {n: i for i, n in enumerate(graph.nodes)}
        for n in sorted(nodes, key=order.__getitem__, reverse=True):
            if not n.users and not written_args(n) and not n.is_impure():
                graph.erase_node(n)


def recomputed_units(spec, traced) -> tuple[str, ...]:
    """The units a recomputing plan (a :class:`postplace.plans.PlanSpec`) runs again: those it names
    (``recompute=U/U`` and ``selective=U/U``), else every numbered unit (``+recompute``)."""
    if spec.recompute_units is not None:
        return tuple(spec.recompute_units) + tuple(spec.selective_units or ())
    from postplace.plans._step import numbered_units

    return tuple(numbered_units(traced.graph))


def selective_of(spec) -> bool | frozenset[str]:
    """The ``selective`` argument of :class:`Recomputation` for a plan: True with ``+selective``, its
    ``selective=U/U`` units in a mix of rules, else False."""
    return True if spec.selective else frozenset(spec.selective_units or ()) or False


def recompute_program(gm: torch.fx.GraphModule, traced, which, *, selective: bool | Iterable[str] = False) -> int:
    """Rewrite ``gm`` (a replica's program of ``traced`` whose nodes keep the traced names: ``ddp``, ``zero1``,
    ``zero2``) so the backward of each unit in ``which`` reads recomputed forward values (``selective``:
    :class:`Recomputation`); returns how many ops it runs again."""
    rc = Recomputation(traced, which, selective=selective)
    for n in list(gm.graph.nodes):
        for a in n.all_input_nodes:
            if (seg := rc.reads_again(n, a)) is not None:
                with gm.graph.inserting_before(n):
                    n.replace_input_with(a, rc.again(gm.graph, a, seg, lambda x: x))
    rc.prune(gm.graph, lambda x: x)
    gm.recompile()
    return rc.made


def keeps_output(n: torch.fx.Node) -> bool:
    """A forward op whose output the recomputation keeps instead of making again: a random op, or one that
    writes in place (dropout's ``bernoulli_`` and ``div_``)."""
    if torch.Tag.nondeterministic_seeded in getattr(n.target, "tags", ()):
        return True
    return bool(written_args(n))
