"""The ``fsdp`` plan (ZeRO-3) as one program per rank (DESIGN.md section 7), as the simulated plan
(:mod:`postplace.plans.data_parallel`) writes it.

Each rank holds 1/k of every parameter and of its optimizer state: the parameter flattened, padded to a
multiple of k, rank r's slice (the scalar step counts stay whole). Replica r runs its own micro-batches as
under ``ddp`` (:mod:`postplace.runtime.ddp`); per micro-batch, each unit's (:func:`postplace.plans.unit_of`)
parameters are all-gathered before the first forward op that reads them and again before the first
backward op (a unit whose backward reads none gathers before its gradients leave, as FSDP unshards the
whole unit), and the views and casts of a parameter (``t(weight)``) are made again from each gather. Each
micro-batch's gradients of a unit are reduce-scattered as soon as its backward has made them all, every
rank keeping the sum of its own slices, and the update runs on the slices (the optimizer's ops are
elementwise). Nothing is gathered after the update: the next step's forward gathers. The sums run in
another order than one process's, so the result equals it within rounding.

With recomputation (``fsdp+recompute``, ``recompute=U/U``, ``+selective``: :mod:`postplace.runtime.recompute`)
a recomputed unit's backward all-gather comes first, before the first backward op of the unit that reads
one of its forward values, and the unit's forward ops run again from it: the recomputed ops read the
parameters, and the views and casts of them, of that backward gather, never the forward gather's, so a
unit's full parameters live from its forward gather to its last forward op only, as FSDP frees them. The
gathers are the plain plan's (the backward one exists anyway): the same collectives, the same bytes.

A hybrid per unit (``ddp:shard=U/U``, ``fsdp:shard=U/U``: :func:`fsdp_plan` with ``shard``, as the simulated
plan's ``data_parallel(shard=)``) shards only the units named: their parameters and same-shaped optimizer
state held as slices, gathered and reduce-scattered as above (``RankPlan.sharded`` names them, so the launcher
slices and joins those alone). Every other parameter is held whole, as under ``ddp``: its gradient summed over
the replica's micro-batches, all-reduced once after the backward in DDP's buckets
(:func:`postplace.runtime.ddp.gradient_buckets`, 25 MB), its update run whole. Recomputation works on both
kinds of unit (a whole unit's forward runs again from its held parameters).
"""

from __future__ import annotations

import operator

import torch
import torch.fx

from postplace.errors import PostplaceError
from postplace.graph import PHASES
from postplace.runtime.ddp import (
    MICROBATCH,
    chain_alias,
    check_replicas,
    completed,
    final_sums,
    gradient_buckets,
    graph_module,
    micro_batch_grads,
    micro_batch_groups,
    parameters,
    replica_plan,
    updated_parameter,
)
from postplace.runtime.ranks import ALL_GATHER, ALL_REDUCE, GATHER, REDUCE, REDUCE_SCATTER, SCATTER, RankPlan

__all__ = ["fsdp_plan", "fsdp_replica_program"]

ELEMENTWISE = ("sgd", "adam", "adamw")
"""The optimizers whose update is elementwise in each parameter, so a slice updates as the whole would."""

_FORWARD, _BACKWARD, _UPDATE = (PHASES.index(p) for p in ("forward", "backward", "update"))


def fsdp_plan(
    traced,
    devices: list[int],
    device_names,
    *,
    recompute=(),
    selective: bool | frozenset[str] = False,
    shard: frozenset[str] | None = None,
    bucket_bytes: float = 25e6,
) -> RankPlan:
    """Per-rank programs of the ``fsdp`` plan of ``traced`` over the logical devices ``devices``.

    Parameters
    ----------
    traced : postplace.graph.trace_torch.Traced
        The step traced as m micro-batches, m a multiple of ``len(devices)``.
    devices : list of int
        The replicas' logical devices.
    device_names : sequence of str
        Every logical device's name.
    recompute : collection of str
        Units (:func:`postplace.plans.unit_of`) whose forward runs again, from their backward gather,
        before their backward (:class:`postplace.runtime.recompute.Recomputation`).
    selective : bool or frozenset of str
        With ``recompute``: keep what torchtitan's selective op rule saves, as the simulated
        ``+selective`` plan does (:func:`postplace.plans.recompute.selective_saves`), in every recomputed
        unit (True) or in these (``selective=U/U``, the others recomputed whole).
    shard : frozenset of str, optional
        A hybrid (``ddp:shard=U/U``, ``fsdp:shard=U/U``): only these units' parameters sharded, the others
        held whole as under ``ddp`` (their gradients summed over the replica's micro-batches and all-reduced
        in buckets after the backward, their update whole). None: every unit sharded.
    bucket_bytes : float
        With ``shard``: DDP's bucket size for the gradients of the units held whole.

    Returns
    -------
    RankPlan
        ``sharded`` (the parameters held as slices, with their state), its collectives (per micro-batch and
        sharded unit: an all-gather before the forward, one before the backward, a reduce-scatter of the
        gradients; a hybrid's all-reduce per bucket of the others' gradients last) and ``partial_loss``.

    Raises
    ------
    PostplaceError
        Fewer than 2 replicas, a micro-batch count they do not divide, batch norm's shared statistics, an
        optimizer that is not elementwise (with a unit sharded), a step whose forward or backward reads a
        sharded parameter outside any micro-batch, or a recomputed or sharded unit the step does not have.
    """
    k, m = len(devices), traced.microbatches
    check_replicas(traced, k, "fsdp")
    sliced = _sliced(traced, shard)

    def build(r: int):
        rc = _recomputation(traced, recompute, selective)
        return _replica(traced, r, m // k, rc, None if shard is None else sliced, bucket_bytes)

    return replica_plan(traced, devices, device_names, build, sharded=sliced)


def fsdp_replica_program(
    traced,
    r: int,
    b: int,
    *,
    recompute=(),
    selective: bool | frozenset[str] = False,
    shard: frozenset[str] | None = None,
    bucket_bytes: float = 25e6,
):
    """Replica r's program of the ``fsdp`` plan (every parameter sliced; its ``b`` micro-batches) or, with
    ``shard``, of the per-unit hybrid (:func:`fsdp_plan`'s), its collective calls in order (``(kind, names, tag,
    owners)``) and the parameters it holds as slices (indices): the groups of a tensor-parallel plan
    (:func:`postplace.runtime.tensor.tensor_plan`) split it."""
    sliced = _sliced(traced, shard)
    rc = _recomputation(traced, recompute, selective)
    gm, calls = _replica(traced, r, b, rc, None if shard is None else sliced, bucket_bytes)
    return gm, calls, sliced


def _sliced(traced, shard) -> frozenset[int]:
    """The parameters (indices) held as slices: every one, or those of the units ``shard`` names (one line when
    it names a unit the step does not have); their optimizer must update elementwise."""
    from postplace.plans import unit_of
    from postplace.plans._step import units

    if shard is not None:
        known = set(units(traced.graph))
        bad = sorted(set(shard) - known)
        if bad:
            names = [u or "root" for u in sorted(known, key=lambda u: (u != "", u))]
            listed = ", ".join(names[:6]) + (", ..." if len(names) > 6 else "")
            raise PostplaceError(
                f"shard= names unit '{bad[0] or 'root'}', which the step does not have (its units: {listed})"
            )
    module, op_of = traced.graph.module, traced.op_of_node
    sliced = frozenset(
        i for i, p in enumerate(parameters(traced)) if shard is None or unit_of(module[op_of[p.name]]) in shard
    )
    if sliced:
        _elementwise(traced)
    return sliced


def _recomputation(traced, recompute, selective):
    """The replica's :class:`~postplace.runtime.recompute.Recomputation` of the units ``recompute`` (None: none)."""
    if not recompute:
        return None
    from postplace.runtime.recompute import Recomputation

    return Recomputation(traced, set(recompute), selective=selective)


def _elementwise(traced) -> None:
    if getattr(traced.optimizer, "name", None) not in ELEMENTWISE:
        raise PostplaceError(
            f"fsdp launch: the update runs on slices of each parameter, which holds for {', '.join(ELEMENTWISE)} "
            f"(elementwise), not for '{getattr(traced.optimizer, 'name', None)}'"
        )


def _replica(traced, r: int, b: int, rc=None, sliced: frozenset[int] | None = None, bucket_bytes: float = 25e6):
    """Replica r's GraphModule and its collective calls in order: ``(kind, names, tag)``; with ``rc`` (a
    :class:`~postplace.runtime.recompute.Recomputation`) its units' forward made again from their backward
    gathers. Only the parameters ``sliced`` names (indices, default all) are slices; the others are whole,
    their gradients summed over the replica's micro-batches and all-reduced in buckets before the update."""
    src = traced.gm.graph
    m = traced.microbatches
    first, last = r * b, r * b + b - 1
    phase = traced.graph.phase
    op_of = traced.op_of_node
    nodes = list(src.nodes)
    params = parameters(traced)
    from postplace.plans import unit_of

    # a unit's parameters of one dtype travel together (a unit mixing fp64 and fp32 gathers each apart)
    unit = {
        p: (unit_of(traced.graph.module[op_of[p.name]]), str(p.meta["val"].dtype))
        for i, p in enumerate(params)
        if sliced is None or i in sliced
    }
    unit_params: dict[tuple[str, str], list[torch.fx.Node]] = {}
    for p in unit:
        unit_params.setdefault(unit[p], []).append(p)
    g = torch.fx.Graph()
    env: dict[torch.fx.Node, torch.fx.Node] = {}
    reduced: dict[torch.fx.Node, torch.fx.Node] = {}
    calls: list[tuple[str, tuple[str, ...], str, tuple]] = []

    def op_phase(n) -> int:
        op = op_of.get(n.name, -1)
        return int(phase[op]) if op >= 0 else -1

    def updating(n) -> bool:
        return op_phase(n) == _UPDATE

    derived_memo: dict[torch.fx.Node, bool] = {}

    def derived(n) -> bool:
        """A parameter, or a view or cast of parameters alone (made again from each gather)."""
        if n in derived_memo:
            return derived_memo[n]
        ok = n in unit or (
            n.op == "call_function"
            and not updating(n)
            and bool(n.all_input_nodes)
            and all(derived(a) for a in n.all_input_nodes)
        )
        derived_memo[n] = ok
        return ok

    param_of = updated_parameter(traced, params)
    param_of_final, whole = {}, []  # a sharded parameter's gradient -> it; the others' gradients (DDP's)
    for x in final_sums(src, m, updating):
        ps = [p for u in x.users if updating(u) and (p := param_of(u)) is not None]
        if not ps and sliced is None:
            raise PostplaceError(f"fsdp launch: the gradient '{x.name}' updates no parameter the launcher can name")
        if any(p in unit for p in ps):
            param_of_final[x] = next(p for p in ps if p in unit)
        else:
            whole.append(x)
    finals = list(param_of_final)
    buckets = gradient_buckets(whole, bucket_bytes)
    grad_chain: set[torch.fx.Node] = set()
    per_mb = {x: micro_batch_grads(x, grad_chain) for x in finals}
    unit_grads: dict[tuple[str, str], list[torch.fx.Node]] = {}
    for x in finals:
        unit_grads.setdefault(unit[param_of_final[x]], []).append(x)
    waiting, completes = micro_batch_groups(unit_grads.items(), per_mb, first, last)

    gathered: dict[tuple[tuple[str, str], int, int], dict[torch.fx.Node, torch.fx.Node]] = {}

    def gather(u: tuple[str, str], mb: int, ph: int) -> dict[torch.fx.Node, torch.fx.Node]:
        key = (u, mb, ph)
        if key not in gathered:
            ps = unit_params[u]
            out = g.call_module(GATHER, (len(calls), [env[p] for p in ps]))
            gathered[key] = {p: g.call_function(operator.getitem, (out, i)) for i, p in enumerate(ps)}
            calls.append((ALL_GATHER, tuple(p.name for p in ps), f"@mb{mb - first}:{PHASES[ph]}", ()))
        return gathered[key]

    made: dict[tuple, torch.fx.Node] = {}

    def materialize(x: torch.fx.Node, mb: int, ph: int) -> torch.fx.Node:
        """``x`` (a parameter or a view of parameters) from micro-batch mb's gather for phase ``ph``."""
        if x in unit:
            return gather(unit[x], mb, ph)[x]
        key = (x, mb, ph)
        if key not in made:
            made[key] = g.node_copy(x, lambda a: materialize(a, mb, ph) if derived(a) else env[a])
        return made[key]

    def context(n) -> tuple[int, int]:
        j = MICROBATCH.match(n.name)
        op = op_of.get(n.name, -1)
        mb = int(j.group(1)) if j else (int(traced.graph.microbatch[op]) if op >= 0 else -1)
        ph = op_phase(n)
        if mb < 0 or ph not in (_FORWARD, _BACKWARD):
            raise PostplaceError(
                f"fsdp launch: node '{n.name}' reads a parameter outside a micro-batch's forward or backward; "
                "this step cannot be sharded"
            )
        return mb, ph

    def reduce_scatter(u: tuple[str, str], mb: int) -> None:
        gather(u, mb, _BACKWARD)  # FSDP unshards the whole unit for its backward, whatever it reads
        xs = unit_grads[u]
        out = g.call_module(SCATTER, (len(calls), [env[per_mb[x][mb]] for x in xs]))
        for i, x in enumerate(xs):
            part = g.call_function(operator.getitem, (out, i))
            reduced[x] = part if x not in reduced else g.call_function(operator.add, (reduced[x], part))
        calls.append((REDUCE_SCATTER, tuple(x.name for x in xs), f"@mb{mb - first}", ()))

    def reduce_all() -> None:
        """The whole parameters' gradients, in DDP's buckets in the order they become final, one all-reduce
        each, once the backward is done."""
        for bucket in buckets:
            out = g.call_module(REDUCE, (len(calls), [env[x] for x in bucket]))
            for i, x in enumerate(bucket):
                reduced[x] = g.call_function(operator.getitem, (out, i))
            calls.append((ALL_REDUCE, tuple(x.name for x in bucket), "", ()))

    def again(x: torch.fx.Node, seg: tuple[str, int]) -> torch.fx.Node:
        """The recomputed copy of ``x`` (a forward value of unit ``seg[0]`` at micro-batch ``seg[1]``), its
        parameters from the unit's backward gather, which comes first."""
        u, mb = seg
        for key in unit_params:
            if key[0] == u:
                gather(key, mb, _BACKWARD)
        return rc.again(g, x, seg, lambda a: materialize(a, mb, _BACKWARD) if derived(a) else outside(a))

    def outside(x: torch.fx.Node) -> torch.fx.Node:
        if x not in env:
            raise PostplaceError(
                f"fsdp launch: node '{x.name}' of replica {r} reads another replica's micro-batch "
                "value; this step cannot be split into replicas"
            )
        return env[x]

    def value(x: torch.fx.Node, n: torch.fx.Node, into: bool) -> torch.fx.Node:
        if into and x in reduced:
            return reduced[x]
        if not into and derived(x):
            return materialize(x, *context(n))
        if rc is not None and (seg := rc.reads_again(n, x)) is not None:
            return again(x, seg)
        return outside(x)

    for n in nodes:
        if n.op == "placeholder":
            env[n] = g.node_copy(n)
            continue
        if n.op == "output":
            g.output(torch.fx.map_arg(n.args[0], lambda x: env[x]))
            continue
        j = MICROBATCH.match(n.name)
        if j and not first <= int(j.group(1)) <= last:
            continue
        if n in grad_chain or (derived(n) and n not in unit):
            continue  # sums: the reduce-scattered ones are added instead; views of parameters: made per gather
        if chain_alias(n, env, first, last):  # the loss's running sum, as under ddp
            continue
        into = updating(n)
        if into and buckets and buckets[0][0] not in reduced:  # the backward is done: the all-reduces
            reduce_all()
        env[n] = g.node_copy(n, lambda x, n=n, into=into: value(x, n, into))
        if (done := completed(n, waiting, completes)) is not None:
            reduce_scatter(*done)
    if rc is not None:
        rc.prune(g, env.get)
    for node in [x for x in g.nodes if x.op == "placeholder" and not x.users and MICROBATCH.match(x.name)]:
        g.erase_node(node)  # other replicas' micro-batches
    return graph_module(traced, g, {GATHER: ALL_GATHER, SCATTER: REDUCE_SCATTER, REDUCE: ALL_REDUCE}), calls
