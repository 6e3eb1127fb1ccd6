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
``zero2`` shards the gradients too, as the simulated plan does: each of the replica's micro-batches'
gradients is reduce-scattered per bucket as soon as that micro-batch's backward has made them (the sums of
every replica landing on their owners; a padded ``reduce_scatter_tensor``, since owners hold unequal
shares), and each owner adds its micro-batches' sums; no rank sums another's gradients.
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
    REDUCE_SCATTER,
    SCATTER,
    Collective,
    RankComm,
    RankPlan,
    RankProgram,
)

__all__ = ["ddp_plan", "launchable", "replica_program", "whole_program"]

MICROBATCH = re.compile(r"^mb(\d+)_")  # a node of micro-batch k: "mb{k}_..."
_CHAIN = re.compile(r"^(?:acc(\d+)_|loss_sum(\d+)$)")
_UPDATE = PHASES.index("update")


def ddp_plan(
    traced,
    devices: list[int],
    device_names,
    *,
    bucket_bytes: float = 25e6,
    level: str = "ddp",
    recompute=(),
    selective: bool | frozenset[str] = False,
) -> RankPlan:
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
    level : {"ddp", "zero1", "zero2"}
        ``zero1``: each rank holds the optimizer state of the parameters it owns
        (:func:`postplace.plans.data_parallel.zero_owners`, the simulated plan's owners) and runs only
        their update; after the update each bucket's parameters are all-gathered from their owners.
        ``zero2``: also each micro-batch's gradients reduce-scattered to their owners, summed there.
    recompute : collection of str
        Units (:func:`postplace.plans.unit_of`) whose forward runs again before their backward
        (:func:`postplace.runtime.recompute.recompute_program`).
    selective : bool or frozenset of str
        With ``recompute``: keep what torchtitan's selective op rule saves, as the simulated
        ``+selective`` plan does (:func:`postplace.plans.recompute.selective_saves`), in every recomputed
        unit (True) or in these (``selective=U/U``, the others recomputed whole).

    Returns
    -------
    RankPlan
        With no messages, its ``collectives`` (one all-reduce per bucket of gradients; ``zero2``: one
        reduce-scatter per bucket and micro-batch instead; ZeRO then one all-gather per bucket of
        parameters) and ``partial_loss``.

    Raises
    ------
    PostplaceError
        Fewer than 2 replicas, a micro-batch count they do not divide, a step whose micro-batches
        write shared state (batch norm's running statistics): DDP would keep one copy per replica, or a
        recomputed unit the step does not have.
    """
    k, m = len(devices), traced.microbatches
    check_replicas(traced, k, level)
    if level not in ("ddp", "zero1", "zero2"):
        raise PostplaceError(f"launch runs ddp, zero1 and zero2 replicas, not '{level}'")
    owners = None
    if level != "ddp":
        from postplace.plans.data_parallel import zero_owners

        owners = zero_owners(traced.graph, k)

    def build(r: int):
        gm, calls = _replica(traced, r, m // k, bucket_bytes, owners, sharded_grads=level == "zero2")
        if recompute:
            from postplace.runtime.recompute import recompute_program

            recompute_program(gm, traced, set(recompute), selective=selective)
        return gm, calls

    return replica_plan(traced, devices, device_names, build)


def check_replicas(traced, k: int, plan: str) -> None:
    """k replicas of ``traced`` can run ``plan``: at least 2, dividing the micro-batches, and no batch norm
    (its running statistics are shared by every micro-batch: each replica would keep its own)."""
    m = traced.microbatches
    if k < 2 or m % k:
        raise PostplaceError(
            f"{plan} over {k} replica{'s' if k != 1 else ''} needs at least 2 and a micro-batch count they "
            f"divide; the step has {m} micro-batch{'es' if m > 1 else ''}"
        )
    if traced.graph.metadata.get("microbatch_norms"):
        raise PostplaceError(
            f"{plan} launch: the step's batch norms update running statistics shared by every micro-"
            "batch, which each replica would keep apart; launch a model without them"
        )


def replica_plan(traced, devices, device_names, build, *, sharded: frozenset[int] = frozenset()) -> RankPlan:
    """The :class:`RankPlan` of one replica per device: ``build(r) -> (GraphModule, calls)``, each call
    ``(kind, value names, tag, owner ranks)`` in the order the replica makes it (every replica the same);
    ``sharded``: the parameters held as slices (:attr:`RankPlan.sharded`)."""
    placeholders = [n.name for n in traced.gm.graph.nodes if n.op == "placeholder"]
    programs, calls = [], None
    for r in range(len(devices)):
        gm, mine = build(r)
        if calls is None:
            calls = mine
        elif mine != calls:  # the same graph cut the same way: never; checked because a mismatch would hang
            raise AssertionError("replicas call their collectives in different orders")
        kept = {n.name for n in gm.graph.nodes if n.op == "placeholder"}
        inputs = tuple(i for i, x in enumerate(placeholders) if x in kept)
        programs.append(
            RankProgram(r, devices[r], gm, inputs, (0,), tuple(("collective", j) for j in range(len(mine))))
        )
    vals = {n.name: n.meta.get("val") for n in traced.gm.graph.nodes}
    collectives = tuple(
        Collective(
            j,
            kind,
            "+".join(names) + tag,
            (sum(vals[x].numel() for x in names),),
            vals[names[0]].dtype,
            owners=tuple(who),
            shapes=tuple(tuple(vals[x].shape) for x in names),
        )
        for j, (kind, names, tag, who) in enumerate(calls)
    )
    return RankPlan(
        tuple(device_names),
        tuple(devices),
        (),
        tuple(programs),
        len(placeholders) - len(traced.inputs),  # the batch's placeholders come last
        collectives=collectives,
        partial_loss=True,
        sharded=sharded,
    )


def whole_program(traced) -> torch.fx.GraphModule:
    """A copy of the traced step's program (its nodes keep their names) for a caller to rewrite."""
    g = torch.fx.Graph()
    g.output(g.graph_copy(traced.gm.graph, {}))
    return torch.fx.GraphModule(traced.gm, g)


def replica_program(
    traced,
    r: int,
    b: int,
    bucket_bytes: float = 25e6,
    *,
    bucket_key=None,
    owners: dict | None = None,
    sharded_grads: bool = False,
) -> tuple[torch.fx.GraphModule, list[tuple[str, tuple[str, ...], str, tuple[int, ...]]]]:
    """Replica r's program of the ``ddp`` plan (its ``b`` micro-batches, its gradients all-reduced in buckets
    before the update) and its collective calls in order (``(kind, value names, tag, owners)``); with
    ``bucket_key`` (a final gradient sum's node -> a key) no bucket holds gradients of two keys: a pipeline's
    stages all-reduce their own (:mod:`postplace.runtime.pipeline`); with ZeRO-1's ``owners`` (parameter op ->
    replica) r updates its own parameters only and all-gathers the others' after the update; with
    ``sharded_grads`` too (ZeRO-2) each micro-batch's gradients are reduce-scattered to their owners."""
    return _replica(traced, r, b, bucket_bytes, owners, bucket_key=bucket_key, sharded_grads=sharded_grads)


def _replica(
    traced,
    r: int,
    b: int,
    bucket_bytes: float = 25e6,
    owners: dict | None = None,
    *,
    sharded_grads=False,
    bucket_key=None,
):
    """Replica r's GraphModule and its collective calls in order: ``(kind, value names, tag, owner ranks)``
    (the names of the gradients or parameters they carry; ``tag``: the local micro-batch of a per-micro-batch
    reduce-scatter). With ZeRO's ``owners`` (parameter op -> rank) the update runs for r's own parameters
    only, then each bucket's parameters are all-gathered; with ``sharded_grads`` (ZeRO-2) each micro-batch's
    gradients are reduce-scattered to their owners instead of all-reduced once. Every placeholder is kept
    but the optimizer state of parameters r does not own, and other replicas' micro-batches."""
    src = traced.gm.graph
    m = traced.microbatches
    first, last = r * b, r * b + b - 1
    phase = traced.graph.phase
    op_of = traced.op_of_node
    g = torch.fx.Graph()
    env: dict[torch.fx.Node, torch.fx.Node] = {}
    reduced: dict[torch.fx.Node, torch.fx.Node] = {}  # a final gradient sum -> what the update reads instead
    calls: list[tuple[str, tuple[str, ...], str, tuple[int, ...]]] = []

    def updating(n) -> bool:
        op = op_of.get(n.name, -1)
        return op >= 0 and phase[op] == _UPDATE

    finals = final_sums(src, m, updating)
    buckets = gradient_buckets(finals, bucket_bytes, bucket_key)
    param_of = updated_parameter(traced, parameters(traced))  # ZeRO: an update op -> its parameter placeholder

    def owner(p: torch.fx.Node) -> int:
        return owners.get(op_of[p.name], r)

    def params_of(final: torch.fx.Node) -> list[torch.fx.Node]:
        """The parameters a final gradient sum updates (a tied weight's one)."""
        return list(dict.fromkeys(p for u in final.users if updating(u) and (p := param_of(u)) is not None))

    skipped: set[torch.fx.Node] = set()  # ZeRO: the updates of parameters another rank owns, and what reads them

    def reduce_all() -> None:
        """Every gradient, in buckets of ``bucket_bytes`` in the order they become final, one all-reduce each."""
        for bucket in buckets:
            out = g.call_module(REDUCE, (len(calls), [env[x] for x in bucket]))
            for i, x in enumerate(bucket):
                reduced[x] = g.call_function(operator.getitem, (out, i))
            calls.append((ALL_REDUCE, tuple(x.name for x in bucket), "", ()))

    # ZeRO-2: each micro-batch's own gradient of each final sum, and which (bucket, micro-batch) it completes
    grad_chain: set[torch.fx.Node] = set()
    per_mb: dict[torch.fx.Node, dict[int, torch.fx.Node]] = {}
    waiting, completes = {}, {}
    if sharded_grads:
        per_mb = {x: micro_batch_grads(x, grad_chain) for x in finals}
        waiting, completes = micro_batch_groups(enumerate(buckets), per_mb, first, last)

    def reduce_scatter(bi: int, k: int) -> None:
        """Micro-batch k's gradients of bucket ``bi`` summed over the replicas onto their owners; each owner
        adds them to its running sums."""
        bucket = buckets[bi]
        who = tuple(owner(params_of(x)[0]) for x in bucket)
        out = g.call_module(SCATTER, (len(calls), [env[per_mb[x][k]] for x in bucket]))
        mine = [x for x, o in zip(bucket, who, strict=True) if o == r]
        for i, x in enumerate(mine):
            part = g.call_function(operator.getitem, (out, i))
            reduced[x] = part if x not in reduced else g.call_function(operator.add, (reduced[x], part))
            val = x.meta["val"]  # the sum's shape: a tensor-parallel split reads it
            part.meta["val"] = reduced[x].meta["val"] = val
        calls.append((REDUCE_SCATTER, tuple(x.name for x in bucket), f"@mb{k - first}", who))

    def gather_all() -> None:
        """ZeRO: each bucket's parameters from their owners, after every update, copied into the others'."""
        for bucket in buckets:
            params = list(dict.fromkeys(p for x in bucket for p in params_of(x)))
            who = tuple(owner(p) for p in params)
            mine = [env[p] for p in params if owner(p) == r]
            out = g.call_module(GATHER, (len(calls), mine))
            for i, p in enumerate(params):
                if owner(p) != r:
                    g.call_method("copy_", (env[p], g.call_function(operator.getitem, (out, i))))
            calls.append((ALL_GATHER, tuple(p.name for p in params), "", who))

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
                gather_all()
            g.output(torch.fx.map_arg(n.args[0], lambda x: value(x, False)))
            continue
        j = MICROBATCH.match(n.name)
        if j and not first <= int(j.group(1)) <= last:
            continue
        if n in grad_chain:  # ZeRO-2: the owner sums the reduced micro-batch gradients itself
            continue
        if chain_alias(n, env, first, last):
            continue
        into = updating(n)
        if into and finals and not reduced and not sharded_grads:  # the backward is done: the all-reduces
            reduce_all()
        if owners is not None and (
            (into and (p := param_of(n)) is not None and owner(p) != r) or any(a in skipped for a in n.all_input_nodes)
        ):
            skipped.add(n)
            continue
        env[n] = g.node_copy(n, lambda x, into=into: value(x, into))
        if (done := completed(n, waiting, completes)) is not None:
            reduce_scatter(*done)
    comms = {SCATTER: REDUCE_SCATTER} if sharded_grads else {REDUCE: ALL_REDUCE}
    if owners is not None:
        comms[GATHER] = ALL_GATHER
        for node in [x for x in g.nodes if x.op == "placeholder" and not x.users]:
            g.erase_node(node)  # the optimizer state of parameters another rank owns: never held here
    return graph_module(traced, g, comms), calls


def final_sums(src: torch.fx.Graph, m: int, updating) -> list[torch.fx.Node]:
    """The gradients' sums over the m micro-batches that the update reads (``acc{m-1}_x``), in graph order."""
    return [
        n
        for n in src.nodes
        if (c := _CHAIN.match(n.name)) and c.group(1) and int(c.group(1)) == m - 1 and any(updating(u) for u in n.users)
    ]


def parameters(traced) -> list[torch.fx.Node]:
    """The traced step's parameter placeholders: its first ones, in the model's parameter order."""
    return list(traced.gm.graph.nodes)[: sum(1 for _ in traced.model.parameters())]


def updated_parameter(traced, params: list[torch.fx.Node]):
    """``n -> p``: the parameter placeholder of ``params`` whose update op ``n`` is (an update op shares its
    parameter's colocation set), or None."""
    op_of, colocation = traced.op_of_node, traced.graph.colocation
    by_set = {int(colocation[op_of[p.name]]): p for p in params if colocation[op_of[p.name]] >= 0}

    def of(n: torch.fx.Node) -> torch.fx.Node | None:
        op = op_of.get(n.name, -1)
        return by_set.get(int(colocation[op])) if op >= 0 else None

    return of


def micro_batch_groups(groups, per_mb: dict, first: int, last: int) -> tuple[dict, dict]:
    """``(waiting, completes)`` for ``groups`` (``(key, final sums)`` pairs, a bucket or a unit): per
    ``(key, k)``, micro-batch k's own gradients of the group's sums still to be made (``per_mb``:
    :func:`micro_batch_grads`), and the ``(key, k)`` each of them belongs to; :func:`completed` reads them."""
    waiting: dict[tuple, set[torch.fx.Node]] = {}
    completes: dict[torch.fx.Node, tuple] = {}
    for key, sums in groups:
        for k in range(first, last + 1):
            for x in sums:
                waiting.setdefault((key, k), set()).add(per_mb[x][k])
                completes[per_mb[x][k]] = (key, k)
    return waiting, completes


def completed(n: torch.fx.Node, waiting: dict, completes: dict) -> tuple | None:
    """The ``(key, k)`` whose last own gradient the node just made ``n`` is (its reduce-scatter may go), or None."""
    key = completes.get(n)
    if key is None:
        return None
    waiting[key].discard(n)
    return None if waiting[key] else key


def chain_alias(n: torch.fx.Node, env: dict, first: int, last: int) -> bool:
    """A running sum over micro-batches (a gradient's ``acc{k}_x``, the loss's ``loss_sum{k}``) in the replica
    of micro-batches ``first..last``: before them it is left out, at the first it is that micro-batch's own
    value, past the last it is the sum at the last; True when so handled (else the sum is copied)."""
    c = _CHAIN.match(n.name)
    if not c:
        return False
    k = int(c.group(1) or c.group(2))
    nodes = [a for a in n.args if isinstance(a, torch.fx.Node)]
    own = next(a for a in nodes if a.name.startswith(f"mb{k}_"))
    prev = next(a for a in nodes if a is not own)
    if k < first:
        return True
    if k == first:
        env[n] = env[own]
        return True
    if k > last:
        env[n] = env[prev]
        return True
    return False


def graph_module(traced, g: torch.fx.Graph, comms: dict[str, str]) -> torch.fx.GraphModule:
    """A replica's GraphModule over ``g``: the traced step's constants, and a :class:`RankComm` of each kind
    ``comms`` names (submodule name -> kind)."""
    root = torch.nn.Module()
    for n in g.nodes:
        if n.op == "get_attr":
            setattr(root, n.target, getattr(traced.gm, n.target))
    for name, kind in comms.items():
        root.add_module(name, RankComm(kind))
    return torch.fx.GraphModule(root, g)


def gradient_buckets(finals: list[torch.fx.Node], bucket_bytes: float, key=None) -> list[list[torch.fx.Node]]:
    """The final gradient sums in buckets of ``bucket_bytes`` (one dtype each, and one ``key(sum)`` each when
    given), in the order they become final."""
    buckets: list[list[torch.fx.Node]] = []
    size = 0.0
    key = key or (lambda x: None)
    for x in finals:
        val = x.meta["val"]
        nbytes = val.numel() * val.element_size()
        head = buckets[-1][0] if buckets else None
        if head is None or size + nbytes > bucket_bytes or head.meta["val"].dtype != val.dtype or key(head) != key(x):
            buckets.append([])
            size = 0.0
        buckets[-1].append(x)
        size += nbytes
    return buckets


def micro_batch_grads(final: torch.fx.Node, chain: set) -> dict[int, torch.fx.Node]:
    """Micro-batch k's own gradient of the final sum ``final`` (``acc{m-1}_x``), for every k, walking its
    chain ``acc{k}_x = acc{k-1}_x + mb{k}_x`` down to micro-batch 0's value; the chain's sums go into ``chain``."""
    out = {}
    n = final
    while (c := _CHAIN.match(n.name)) and c.group(1):
        k = int(c.group(1))
        chain.add(n)
        nodes = [a for a in n.args if isinstance(a, torch.fx.Node)]
        own = next(a for a in nodes if a.name.startswith(f"mb{k}_"))
        out[k] = own
        n = next(a for a in nodes if a is not own)
    out[0] = n
    return out


def launchable(spec) -> bool:
    """The plan (a :class:`postplace.plans.PlanSpec`) is one :func:`postplace.runtime.launcher.launch_plan`
    runs: ``ddp``, ``zero1``, ``zero2`` or ``fsdp``, and the hybrids of ``ddp`` and ``fsdp`` per unit
    (``ddp:shard=U/U``: :func:`postplace.runtime.fsdp.fsdp_plan` with ``shard``), recomputed (``+recompute``,
    ``recompute=U/U``, ``+selective``, ``selective=U/U``) or not, with no tensor or pipeline parallelism."""
    hybrid = spec.shard is None or spec.level in ("ddp", "fsdp")
    return spec.level in ("ddp", "zero1", "zero2", "fsdp") and hybrid and not spec.pipeline and not spec.tensor
