"""The ``ddp`` plan as one program per rank: each replica's micro-batches, its own gradient sums, and a
torch.distributed all-reduce of every gradient before the update (DESIGN.md section 7).

A step traced as m micro-batches sums each gradient over them in a chain (``acc1_x = mb0_x + mb1_x``,
``acc2_x = acc1_x + mb2_x``...) and the update reads the chain's last sum. Replica r of k runs
micro-batches ``r*b .. r*b + b - 1`` (b = m/k) of the same fx graph: the other replicas' micro-batch
nodes are left out, its chain starts at its own first micro-batch's value (the sum before it belongs to
other replicas) and stops at its last, and every update node reads, instead of the whole step's sum, the
all-reduce (a sum over the replicas) of the replica's own: the gradient of the whole step, on every
rank, so every rank runs the same update to the same parameters. The loss each rank returns is its
micro-batches' share of the step's loss (each micro-batch's loss is already divided by m); the launcher
sums them.

The all-reduces run once the backward pass is done, before the first update node, in DDP's buckets:
the gradients in the order they become final, up to ``bucket_bytes`` (DDP's ``bucket_cap_mb``, 25 MB)
per bucket, each bucket one flat buffer and one all-reduce, in the same order on every rank (a collective
must be called in one order by all). The bytes each rank all-reduces in a step are the step's gradient
bytes, what the simulated ``ddp`` plan's buckets hold. DDP's overlap of the buckets with the backward
pass is a timing the simulator prices, not numerics, and is not reproduced here. The sum's order differs
from one process's chain (``(a + b) + (c + d)`` instead of ``((a + b) + c) + d``), so the result equals
the one-process step within rounding, not bit for bit.

``zero1`` (:func:`ddp_plan` with ``level="zero1"``) is the same step but for the update: each rank owns whole
parameters (:func:`postplace.plans.data_parallel.zero_owners`, the simulated plan's owners, as DeepSpeed cuts
the flat parameters into k ranges), holds their optimizer state alone (the others' state placeholders are
not in its program), runs their update alone (the update ops of a parameter share its colocation set), and
after the update each bucket's parameters are all-gathered from their owners into every rank's copy.
"""

from __future__ import annotations

import operator
import re

import torch
import torch.fx

from postplace.errors import PostplaceError
from postplace.graph import PHASES
from postplace.runtime.ranks import (
    ALL_GATHER,
    ALL_REDUCE,
    GATHER,
    REDUCE,
    Collective,
    RankComm,
    RankPlan,
    RankProgram,
)

__all__ = ["ddp_plan", "launchable"]

_MICROBATCH = re.compile(r"^mb(\d+)_")
_CHAIN = re.compile(r"^(?:acc(\d+)_|loss_sum(\d+)$)")
_UPDATE = PHASES.index("update")


def ddp_plan(traced, devices: list[int], device_names, *, bucket_bytes: float = 25e6, level: str = "ddp") -> RankPlan:
    """Per-rank programs of the ``ddp`` (or ``zero1``) plan of ``traced`` over the logical devices
    ``devices`` (one replica each, in order).

    Parameters
    ----------
    traced : postplace.graph.trace_torch.Traced
        The step traced as m micro-batches, m a multiple of ``len(devices)``.
    devices : list of int
        The replicas' logical devices.
    device_names : sequence of str
        Every logical device's name.
    bucket_bytes : float
        DDP's bucket size (``bucket_cap_mb``): gradients all-reduced together, one flat buffer each.
    level : {"ddp", "zero1"}
        ``zero1``: each rank holds the optimizer state of the parameters it owns
        (:func:`postplace.plans.data_parallel.zero_owners`, the simulated plan's owners) and runs only
        their update; after the update each bucket's parameters are all-gathered from their owners.

    Returns
    -------
    RankPlan
        With no messages, one all-reduce per bucket of gradients (``collectives``; for ``zero1`` then one
        all-gather per bucket of parameters) and ``partial_loss``.

    Raises
    ------
    PostplaceError
        Fewer than 2 replicas, a micro-batch count they do not divide, or a step whose micro-batches
        write shared state (batch norm's running statistics): DDP would keep one copy per replica.
    """
    k, m = len(devices), traced.microbatches
    if k < 2 or m % k:
        raise PostplaceError(
            f"ddp over {k} processes needs at least 2 and a micro-batch count they divide; the "
            f"step has {m} micro-batch{'es' if m > 1 else ''}"
        )
    if traced.graph.metadata.get("microbatch_norms"):
        raise PostplaceError(
            "ddp launch: the step's batch norms update running statistics shared by every micro-"
            "batch, which each replica would keep apart; launch a model without them"
        )
    if level not in ("ddp", "zero1"):
        raise PostplaceError(f"launch runs ddp and zero1 replicas, not '{level}'")
    owners = None
    if level == "zero1":
        from postplace.plans.data_parallel import zero_owners

        owners = zero_owners(traced.graph, k)
    placeholders = [n.name for n in traced.gm.graph.nodes if n.op == "placeholder"]
    programs, reduced, gathered = [], None, None
    for r in range(k):
        gm, order, gathers = _replica(traced, r, m // k, bucket_bytes, owners)
        if reduced is None:
            reduced, gathered = order, gathers
        elif order != reduced or gathers != gathered:  # the same graph cut the same way: never; checked because
            raise AssertionError("ddp replicas call their collectives in different orders")  # a mismatch would hang
        kept = {n.name for n in gm.graph.nodes if n.op == "placeholder"}
        programs.append(
            RankProgram(r, devices[r], gm, tuple(i for i, x in enumerate(placeholders) if x in kept), (0,), ())
        )
    vals = {n.name: n.meta.get("val") for n in traced.gm.graph.nodes}
    collectives = tuple(
        Collective(j, "all_reduce", "+".join(names), (sum(vals[x].numel() for x in names),), vals[names[0]].dtype)
        for j, names in enumerate(reduced)
    ) + tuple(
        Collective(
            len(reduced) + j,
            ALL_GATHER,
            "+".join(names),
            (sum(vals[x].numel() for x in names),),
            vals[names[0]].dtype,
            owners=tuple(who),
            shapes=tuple(tuple(vals[x].shape) for x in names),
        )
        for j, (names, who) in enumerate(gathered)
    )
    n_persistent = len(placeholders) - len(traced.inputs)  # the batch's placeholders come last
    return RankPlan(
        tuple(device_names),
        tuple(devices),
        (),
        tuple(programs),
        n_persistent,
        collectives=collectives,
        partial_loss=True,
    )


def _replica(traced, r: int, b: int, bucket_bytes: float = 25e6, owners: dict | None = None):
    """Replica r's GraphModule, the values it all-reduces (buckets of gradient node names, in order) and,
    with ZeRO-1's ``owners`` (parameter op -> rank), the parameters it all-gathers: ``[(names, owner
    ranks)]`` per bucket. Every placeholder is kept but the optimizer state of parameters r does not own."""
    src = traced.gm.graph
    m = traced.microbatches
    first, last = r * b, r * b + b - 1
    phase = traced.graph.phase
    op_of = traced.op_of_node
    g = torch.fx.Graph()
    env: dict[torch.fx.Node, torch.fx.Node] = {}
    reduced: dict[torch.fx.Node, torch.fx.Node] = {}
    order: list[tuple[str, ...]] = []
    comm = REDUCE

    def updating(n) -> bool:
        op = op_of.get(n.name, -1)
        return op >= 0 and phase[op] == _UPDATE

    finals = [
        n
        for n in src.nodes
        if (c := _CHAIN.match(n.name)) and c.group(1) and int(c.group(1)) == m - 1 and any(updating(u) for u in n.users)
    ]
    param_node, param_of_coloc = {}, {}  # ZeRO-1: parameter op -> its placeholder; colocation set -> parameter op
    if owners is not None:
        n_params = sum(1 for _ in traced.model.parameters())
        for n in list(src.nodes)[:n_params]:
            param_node[op_of[n.name]] = n
        colocation = traced.graph.colocation
        param_of_coloc = {int(colocation[p]): p for p in owners if colocation[p] >= 0}

    def param_of(n) -> int | None:
        op = op_of.get(n.name, -1)
        return param_of_coloc.get(int(traced.graph.colocation[op])) if op >= 0 else None

    skipped: set[torch.fx.Node] = set()  # ZeRO-1: the updates of parameters another rank owns, and what reads them

    def reduce_all() -> None:
        """Every gradient, in buckets of ``bucket_bytes`` in the order they become final, one all-reduce each."""
        buckets: list[list[torch.fx.Node]] = []
        size = 0.0
        for x in finals:
            val = x.meta["val"]
            nbytes = val.numel() * val.element_size()
            if not buckets or size + nbytes > bucket_bytes or buckets[-1][0].meta["val"].dtype != val.dtype:
                buckets.append([])
                size = 0.0
            buckets[-1].append(x)
            size += nbytes
        for bucket in buckets:
            out = g.call_module(comm, (len(order), [env[x] for x in bucket]))
            for i, x in enumerate(bucket):
                reduced[x] = g.call_function(operator.getitem, (out, i))
            order.append(tuple(x.name for x in bucket))

    gathers: list[tuple[tuple[str, ...], tuple[int, ...]]] = []

    def gather_all() -> list[tuple[tuple[str, ...], tuple[int, ...]]]:
        """ZeRO-1: each bucket's parameters from their owners, after every update, copied into the others'."""
        done = []
        for j, names in enumerate(order):
            params = []
            for x in names:
                for u in node_of[x].users:
                    p = param_of(u) if updating(u) else None
                    if p is not None and p not in params:
                        params.append(p)
            who = tuple(owners[p] for p in params)
            mine = [env[param_node[p]] for p in params if owners[p] == r]
            out = g.call_module(GATHER, (len(order) + j, mine))
            for i, p in enumerate(params):
                if owners[p] != r:
                    g.call_method("copy_", (env[param_node[p]], g.call_function(operator.getitem, (out, i))))
            done.append((tuple(param_node[p].name for p in params), who))
        return done

    node_of = {n.name: n for n in src.nodes}

    def value(x: torch.fx.Node, into_update: bool) -> torch.fx.Node:
        if into_update and x in reduced:
            return reduced[x]
        if x not in env:
            raise PostplaceError(
                f"ddp launch: node '{x.name}' of replica {r} reads another replica's micro-batch "
                "value; this step cannot be split into replicas"
            )
        return env[x]

    for n in src.nodes:
        if n.op == "placeholder":
            env[n] = g.node_copy(n)
            continue
        if n.op == "output":
            if owners is not None:
                gathers = gather_all()
            g.output(torch.fx.map_arg(n.args[0], lambda x: value(x, False)))
            continue
        j = _MICROBATCH.match(n.name)
        if j and not first <= int(j.group(1)) <= last:
            continue
        c = _CHAIN.match(n.name)
        if c:
            k = int(c.group(1) or c.group(2))
            nodes = [a for a in n.args if isinstance(a, torch.fx.Node)]
            own = next(a for a in nodes if a.name.startswith(f"mb{k}_"))
            prev = next(a for a in nodes if a is not own)
            if k < first:
                continue
            if k == first:
                env[n] = env[own]
                continue
            if k > last:
                env[n] = env[prev]
                continue
        into = updating(n)
        if into and finals and not reduced:  # the backward is done: every gradient's all-reduce, in buckets
            reduce_all()
        if owners is not None and (
            (into and owners.get(param_of(n), r) != r) or any(a in skipped for a in n.all_input_nodes)
        ):
            skipped.add(n)
            continue
        env[n] = g.node_copy(n, lambda x, into=into: value(x, into))
    root = torch.nn.Module()
    for n in g.nodes:
        if n.op == "get_attr":
            setattr(root, n.target, getattr(traced.gm, n.target))
    root.add_module(comm, RankComm(ALL_REDUCE))
    if owners is not None:
        root.add_module(GATHER, RankComm(ALL_GATHER))
        for node in [x for x in g.nodes if x.op == "placeholder" and not x.users]:
            g.erase_node(node)  # the optimizer state of parameters another rank owns: never held here
    return torch.fx.GraphModule(root, g), order, gathers


def launchable(spec) -> bool:
    """The plan (a :class:`postplace.plans.PlanSpec`) is one :func:`postplace.runtime.launcher.launch_plan`
    runs: ``ddp`` or ``zero1`` with no recomputation, no per-unit sharding, no tensor or pipeline parallelism."""
    return (
        spec.level in ("ddp", "zero1")
        and not spec.recompute
        and spec.shard is None
        and not spec.pipeline
        and not spec.tensor
    )
