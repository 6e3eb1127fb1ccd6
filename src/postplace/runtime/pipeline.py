"""Pipeline plans (``ddp:pp=P,m=M[,dp=K],schedule=S``) as one program per rank (DESIGN.md section 7), as the
simulated plan (:func:`postplace.placers.practitioner.plan_step`) writes them.

The layers are cut into stages where the simulated plan cuts them (:func:`postplace.placers.practitioner.
pipeline_stages`, one function for both); replica r's stage s runs on the plan's GPU ``r + dp x (s mod
pp)`` (Megatron-LM's rank order). Each replica's program is the ``ddp`` replica's (its own micro-batches,
its gradient sums; :func:`postplace.runtime.ddp.replica_program`) with its gradients all-reduced in
buckets per stage, over the ranks that hold that stage in every replica (one process group per stage,
made once); with one replica nothing is all-reduced. The replica's program is then put in the schedule's
order and cut by stage into per-rank programs with a send/recv for every tensor that crosses stages
(:func:`postplace.runtime.ranks.rank_plan`).

The schedule's order: each GPU runs its *slots* (the forward or the backward of one micro-batch on one
stage) in the order :func:`postplace.plans.schedule.slot_order` gives (``gpipe``, ``1f1b``,
``interleaved-V``), the order the simulated plan's ordering edges impose. The program's nodes are put in
one global order that keeps every data edge and every read and write of a storage in their traced order
(a parameter written in place by the update is read by nothing after it) and admits a slot's nodes only
once the slots before it on its GPU are done; ops of no slot (parameters, gradient sums, the update)
run as soon as what they read is made. Every rank posts its messages and collectives in that one order,
which :meth:`~postplace.runtime.ranks.RankPlan.check` proves cannot deadlock.

Numerics: with one replica each op runs on the same inputs as in the one-process step, so losses and
parameters equal it bit for bit; with more, the gradients are summed over the replicas as ``ddp``
sums them (another order: equal within rounding). Random ops (dropout) draw from each rank's generator
in the global order: with ``gpipe`` and ``1f1b`` that is the traced order (each micro-batch's forwards
before the next one's), so the masks are the one-process step's; ``interleaved-V`` runs micro-batch
j + 1's first chunk before micro-batch j's later ones, so its masks are drawn in another order (the same
distribution, not the same bits); with several replicas each draws its own micro-batches' masks from
the seed, as ``ddp`` does. A training batch norm's backward takes the running statistics and ignores
them: they are not a read that would hold the next micro-batch's forward behind it.

With ``tp=T`` the pipeline is built over each tensor-parallel group's first GPU and every rank then made T
parts (:func:`postplace.runtime.tensor.tensor_ranks`): part j of a stage sends to part j of the next.

``zero1:pp=P`` is the same pipeline of replicas, each owning the parameters the simulated plan gives it
(:func:`postplace.plans.data_parallel.zero_owners`): it updates them alone and each stage's buckets of them are
all-gathered over that stage's ranks after the update.

With recomputation (``+recompute``, ``+selective``, ``recompute=U/U``) each replica's program is rewritten as a
``ddp`` replica's is (:func:`postplace.runtime.recompute.recompute_program`), and a recomputed forward op runs in
its micro-batch's backward slot on its stage, before the backward ops that read it.

Not here: ZeRO-2 or FSDP with a pipeline of several replicas (:func:`postplace.runtime.launcher.launch_plan`
runs a ZeRO pipeline of one replica as ddp's: it shards nothing); a step with ops only a CPU may run and more
than one replica.
"""

from __future__ import annotations

import dataclasses
import heapq

import numpy as np
import torch
import torch.fx

from postplace.errors import PostplaceError
from postplace.graph import PHASES
from postplace.runtime.placed import aliased_arg, written_args
from postplace.runtime.ranks import RECV, SEND, Collective, RankPlan, RankProgram, batch_messages, rank_plan

__all__ = ["pipeline_plan", "schedule_order"]

_FORWARD, _BACKWARD = PHASES.index("forward"), PHASES.index("backward")


def pipeline_plan(
    traced, spec, cluster, devices: list[int], *, bucket_bytes: float = 25e6, cost_model=None, device="cpu"
) -> RankPlan:
    """Per-rank programs of the pipeline plan ``spec`` of ``traced`` on the logical GPUs ``devices``.

    Parameters
    ----------
    traced : postplace.graph.trace_torch.Traced
        The step traced as m micro-batches, m a multiple of the replicas.
    spec : postplace.plans.PlanSpec
        A ``ddp`` plan with ``pipeline`` stages.
    cluster : Cluster
        The plan's cluster (the cut is priced on it).
    devices : list of int
        The plan's GPUs (:func:`postplace.placers.practitioner.plan_devices`): ``pp x dp`` of them.
    bucket_bytes : float
        DDP's bucket size for each stage's all-reduces.
    cost_model : optional
        The cost model the cut is priced with (the simulator's default when None).
    device : str or torch.device
        The torch device every rank's program runs on.

    Returns
    -------
    RankPlan
        Checked (:meth:`~postplace.runtime.ranks.RankPlan.check`): messages between stages, one all-reduce
        per bucket of each stage's gradients over that stage's ranks, ``partial_loss`` with several replicas.

    Raises
    ------
    PostplaceError
        A plan this module does not run (see the module docstring), a micro-batch count the replicas do
        not divide, a schedule that cannot order the step's stages, or programs that could deadlock.
    """
    from postplace.placers.practitioner import pipeline_stages

    pp = spec.pipeline
    if not pp or spec.level not in ("ddp", "zero1") or spec.shard is not None:
        raise PostplaceError(
            f"plan '{spec}': launch runs pipelines of ddp or zero1 replicas (ddp:pp=P, zero1:pp=P, tp=T or not, "
            "+recompute or not) so far; ZeRO-2 or a per-unit hybrid in a pipeline is simulated only, FSDP in a "
            "pipeline neither simulated nor launched"
        )
    every = list(devices)
    t = spec.tensor or 1
    devices = every[::t]  # each tensor-parallel group's first GPU: the pipeline of groups is cut as one of GPUs
    k, m = len(devices), traced.microbatches
    dp = k // pp
    if dp * pp != k:
        raise PostplaceError(f"plan '{spec}': {k} GPUs make no whole replicas of {pp} stages; give {pp} x dp GPUs")
    if m % dp:
        raise PostplaceError(
            f"plan '{spec}': its {dp} replicas do not divide the {m} micro-batches; give dp with m a multiple of it"
        )
    graph = traced.graph
    stage = pipeline_stages(graph, cluster, spec, [devices[dp * s] for s in range(pp)], cost_model)
    gpu = np.maximum(stage, 0) % pp
    cpus = [d for d, dev in enumerate(cluster.devices) if dev.kind == "cpu"]
    on_cpu = (graph.allowed_kinds & 2) == 0
    if on_cpu.any() and (dp > 1 or not cpus):
        name = graph.names[int(np.flatnonzero(on_cpu)[0])]
        raise PostplaceError(
            f"plan '{spec}': op '{name}' runs on a CPU only, which {dp} replicas would share; launch it with dp=1"
            if cpus
            else f"plan '{spec}': op '{name}' runs on a CPU only and cluster '{cluster.name}' has none"
        )
    if dp > 1:
        from postplace.runtime.ddp import check_replicas, replica_program

        check_replicas(traced, dp, f"plan '{spec}'")
    owners = None
    if spec.level == "zero1":  # the simulated plan's owners over the whole model's parameters
        if dp < 2:
            raise PostplaceError(f"plan '{spec}': zero1 shards over 2 or more replicas and the plan has {dp}")
        from postplace.plans.data_parallel import zero_owners

        if t == 1:
            owners = zero_owners(traced.graph, dp)
        else:
            from postplace.runtime.tensor import zero_owners_split

            owners = zero_owners_split(traced, t, dp, tied=False)
    sequence = None
    if spec.sequence:  # the simulated plan's ops split by tokens; named on the traced nodes before any copy
        from postplace.runtime.tensor import sequence_split_of

        sequence = sequence_split_of(traced, spec, tied=False)
    schedule = spec.schedule or "1f1b"
    names = list(cluster.device_names)
    b = m // dp
    replicas = []
    for r in range(dp):
        op_device = np.asarray(devices, dtype=np.int64)[r + dp * gpu]
        if cpus:
            op_device[on_cpu] = cpus[0]
        if dp > 1:
            gm, calls = replica_program(
                traced,
                r,
                b,
                bucket_bytes,
                bucket_key=lambda x: int(gpu[traced.op_of_node.get(x.name, 0)]),
                owners=owners,
            )
        else:
            from postplace.runtime.ddp import whole_program

            gm, calls = whole_program(traced), []
        if spec.recompute:  # each backward slot runs its units' forward again first (the simulated plan's)
            from postplace.runtime.recompute import recompute_program, recomputed_units, selective_of

            recompute_program(gm, traced, set(recomputed_units(spec, traced)), selective=selective_of(spec))
        ordered = schedule_order(gm, traced, stage, schedule, pp, f"plan '{spec}'")
        plan_r = rank_plan(dataclasses.replace(traced, gm=ordered), op_device, names, device)
        replicas.append((_traced_inputs(plan_r, ordered, traced), calls))
    plan = _merge(traced, replicas, devices, dp, gpu, names)
    if t > 1:
        from postplace.runtime.tensor import tensor_ranks

        plan = tensor_ranks(plan, traced, t, every, sequence=sequence)
    plan = batch_messages(plan)
    plan.check()
    return plan


def schedule_order(gm: torch.fx.GraphModule, traced, stage, schedule: str, pp: int, what: str) -> torch.fx.GraphModule:
    """A copy of ``gm`` (a replica's program of ``traced``) with its nodes in the schedule's global order
    (module docstring); ``stage`` per op of ``traced.graph`` (-1: none); ``what`` names the plan in errors."""
    from postplace.plans.schedule import slot_order

    graph, op_of = traced.graph, traced.op_of_node
    nodes = [n for n in gm.graph.nodes if n.op != "output"]
    pos = {n: i for i, n in enumerate(nodes)}
    mbs = sorted(
        {int(graph.microbatch[op]) for n in nodes if (op := op_of.get(n.name, -1)) >= 0 and graph.microbatch[op] >= 0}
    )
    local = {j: i for i, j in enumerate(mbs)}  # the replica's micro-batches, numbered in order

    def slot_key(n) -> tuple | None:
        again = n.meta.get("recompute")  # a recomputed forward op runs in its micro-batch's backward slot
        op = op_of.get(again or n.name, -1)
        if (
            n.op in ("placeholder", "get_attr")
            or op < 0
            or stage[op] < 0
            or graph.microbatch[op] < 0
            or graph.phase[op] not in (_FORWARD, _BACKWARD)
        ):
            return None
        kind = "F" if graph.phase[op] == _FORWARD and not again else "B"
        return int(stage[op]) % pp, kind, local[int(graph.microbatch[op])], int(stage[op])

    keys = {n: slot_key(n) for n in nodes}
    present = set(keys.values())
    sequence = {  # per GPU, its slots in the schedule's order: (gpu, kind, micro-batch, stage)
        d: [(d, kind, j, s) for kind, j, s in slot_order(schedule, d, pp, len(mbs)) if (d, kind, j, s) in present]
        for d in range(pp)
    }
    index = {key: i for seq in sequence.values() for i, key in enumerate(seq)}
    left = {key: 0 for key in index}
    for key in keys.values():
        if key is not None:
            left[key] += 1
    deps = _dependencies(nodes, pos)
    waiting = {n: len(d) for n, d in deps.items()}
    users: dict[torch.fx.Node, list[torch.fx.Node]] = {n: [] for n in nodes}
    for n, d in deps.items():
        for a in d:
            users[a].append(n)
    current = dict.fromkeys(range(pp), 0)
    held: dict[tuple, list[int]] = {}
    ready = []

    def admit(n) -> None:
        key = keys[n]
        if key is None or index[key] == current[key[0]]:
            heapq.heappush(ready, pos[n])
        else:
            held.setdefault(key, []).append(pos[n])

    for n in nodes:
        if not waiting[n]:
            admit(n)
    order = []
    while ready:
        n = nodes[heapq.heappop(ready)]
        order.append(n)
        for u in users[n]:
            waiting[u] -= 1
            if not waiting[u]:
                admit(u)
        if keys[n] is not None:
            left[keys[n]] -= 1
            d, seq = keys[n][0], sequence[keys[n][0]]
            while current[d] < len(seq) and not left[seq[current[d]]]:  # the slot is done: admit the next
                current[d] += 1
                for p in held.pop(seq[current[d]], []) if current[d] < len(seq) else ():
                    heapq.heappush(ready, p)
    if len(order) < len(nodes):
        stuck = nodes[min(p for ps in held.values() for p in ps)] if held else nodes[0]
        raise PostplaceError(
            f"{what}: schedule {schedule} cannot order this step's stages (node '{stuck.name}' waits for its "
            "stage's earlier slots, which wait for it: a weight read at several depths, such as a tied "
            "embedding and head)" + ("; use schedule=gpipe" if schedule != "gpipe" else "")
        )
    g = torch.fx.Graph()
    env: dict[torch.fx.Node, torch.fx.Node] = {}
    for n in order:
        env[n] = g.node_copy(n, lambda a: env[a])
        if env[n].name != n.name:  # rank_plan and the messages name nodes as the traced step does
            raise AssertionError(f"node {n.name} renamed {env[n].name} when reordered")
    out = next(n for n in gm.graph.nodes if n.op == "output")
    g.node_copy(out, lambda a: env[a])
    return torch.fx.GraphModule(gm, g)


def _dependencies(nodes: list[torch.fx.Node], pos: dict) -> dict[torch.fx.Node, set[torch.fx.Node]]:
    """What each node must come after: the nodes it reads, and for every storage written in place, the
    traced order of its reads and writes (a write after every access before it, a read after the write
    before it)."""
    deps = {n: set(n.all_input_nodes) for n in nodes}
    root: dict[torch.fx.Node, torch.fx.Node] = {}
    for n in nodes:
        base = aliased_arg(n)
        root[n] = root.get(base, base) if base is not None else n
    written = {root[n.args[k]] for n in nodes for k in written_args(n)}
    last_write: dict[torch.fx.Node, torch.fx.Node] = {}
    since: dict[torch.fx.Node, list[torch.fx.Node]] = {}  # accesses since the last write, per storage
    for n in nodes:
        reads = {root[a] for a in _read_inputs(n) if root[a] in written}
        writes = {root[n.args[k]] for k in written_args(n)}
        for s in reads - writes:
            if s in last_write:
                deps[n].add(last_write[s])
            since.setdefault(s, []).append(n)
        for s in writes:
            deps[n].update(x for x in since.get(s, []) if x is not n)
            if s in last_write:
                deps[n].add(last_write[s])
            last_write[s], since[s] = n, []
    for n in nodes:
        deps[n].discard(n)
    return deps


def _read_inputs(n: torch.fx.Node) -> list[torch.fx.Node]:
    """The inputs ``n`` reads: all of them, less the running statistics a training-mode batch norm's backward
    takes and ignores (it reads the batch's saved statistics), so that a later micro-batch's forward may
    update them before an earlier one's backward, as every pipeline schedule has it."""
    if (
        n.op == "call_function"
        and getattr(n.target, "overloadpacket", None) is torch.ops.aten.native_batch_norm_backward
        and len(n.args) > 7
        and n.args[7] is True
    ):
        ignored = {a for a in n.args[3:5] if isinstance(a, torch.fx.Node)}
        return [a for a in n.all_input_nodes if a not in ignored]
    return n.all_input_nodes


def _traced_inputs(plan: RankPlan, gm: torch.fx.GraphModule, traced) -> RankPlan:
    """``plan``'s program inputs as indices into the traced step's placeholders (the same under ddp; ZeRO-1's
    replica program has none of the optimizer state of parameters other replicas own, so its own are shifted)."""
    held = [n.name for n in gm.graph.nodes if n.op == "placeholder"]
    every = {n.name: i for i, n in enumerate(n for n in traced.gm.graph.nodes if n.op == "placeholder")}
    programs = tuple(dataclasses.replace(p, inputs=tuple(every[held[i]] for i in p.inputs)) for p in plan.programs)
    return dataclasses.replace(plan, programs=programs, n_persistent=len(every) - len(traced.inputs))


def _merge(traced, replicas, devices, dp: int, gpu, names) -> RankPlan:
    """One :class:`RankPlan` of the replicas' plans: ranks in device order, each replica's messages after
    the previous one's, each stage's all-reduces over that stage's ranks."""
    used = sorted({d for plan, _ in replicas for d in plan.ranks})
    rank_of = {d: q for q, d in enumerate(used)}
    messages, programs = [], [None] * len(used)
    for plan, _ in replicas:
        offset = len(messages)
        for msg in plan.messages:
            messages.append(
                dataclasses.replace(
                    msg, index=msg.index + offset, src=rank_of[plan.ranks[msg.src]], dst=rank_of[plan.ranks[msg.dst]]
                )
            )
        for prog in plan.programs:
            for node in prog.gm.graph.nodes:
                if node.op == "call_module" and node.target in (SEND, RECV):
                    node.args = (node.args[0] + offset, *node.args[1:])
            prog.gm.recompile()
            q = rank_of[prog.device]
            actions = tuple((kind, i + offset if kind in ("send", "recv") else i) for kind, i in prog.actions)
            programs[q] = RankProgram(q, prog.device, prog.gm, prog.inputs, prog.outputs, actions)
    vals = {n.name: n.meta.get("val") for n in traced.gm.graph.nodes}
    collectives = []
    for j, (kind, values, tag, who) in enumerate(replicas[0][1]):
        g = int(gpu[traced.op_of_node[values[0]]])
        collectives.append(
            Collective(
                j,
                kind,
                "+".join(values) + tag,
                (sum(vals[x].numel() for x in values),),
                vals[values[0]].dtype,
                owners=tuple(who),  # ZeRO-1's all-gathers: replica r is position r of the stage's group
                shapes=tuple(tuple(vals[x].shape) for x in values),
                group=tuple(rank_of[devices[r + dp * g]] for r in range(dp)),
            )
        )
    first = replicas[0][0]
    return RankPlan(
        tuple(names),
        tuple(used),
        tuple(messages),
        tuple(programs),
        first.n_persistent,
        collectives=tuple(collectives),
        partial_loss=dp > 1,
    )
