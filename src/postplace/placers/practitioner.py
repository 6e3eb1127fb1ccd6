"""The plans practitioners launch, as baselines: a plan's GPUs, its rewritten step simulated, its words.

``ddp``, ``zero1``, ``zero2``, ``fsdp``, each ``+recompute``, and per-unit hybrids
(:mod:`postplace.plans`) run on every GPU that ``--exclude`` leaves (``dp=K``: the first K) at the
step's micro-batch count; :func:`plan_step` rewrites the step and simulates it. A pin holds when every
copy of the pinned op lands on its device; otherwise the plan is refused. ``place``
(:mod:`postplace.api.candidates`), ``compare`` and ``simulate --plan`` (:func:`postplace.api.plans.simulate_plan`)
all time plans through here.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from postplace.cost import priced_on
from postplace.errors import PostplaceError
from postplace.plans.sizes import SIZES_KEY

__all__ = [
    "CHOICES",
    "PlanChoices",
    "PlanResult",
    "device_span",
    "microbatch_sizes",
    "plan_devices",
    "plan_replicas",
    "plan_step",
    "plan_words",
    "replica_models",
    "replica_sizes",
    "sized_graph",
]


@dataclass
class PlanResult:
    """One practitioner plan, simulated.

    Parameters
    ----------
    plan : str
        The plan as written back (``fsdp+recompute:m=8,dp=8``).
    name : str
        Its name in tables (``fsdp+recompute``).
    graph : postplace.graph.OpGraph
        The rewritten step (replicas and collectives).
    cluster : postplace.cluster.Cluster
    placement : numpy.ndarray
        ``int64[n]``: each op's device.
    devices : tuple of str
        The replicas' GPUs.
    microbatches : int
        The step's micro-batch count (all replicas together).
    step_time_s : float
        Simulated.
    peak_memory_bytes : numpy.ndarray
        ``[D]`` simulated peak per device.
    oom : bool
    bytes_moved : float
        Point-to-point bytes plus every collective's bytes on the wire.
    collective_bytes : dict
        Bytes on the wire per collective kind.
    evaluator : str
        ``"simulator"``.
    """

    plan: str
    name: str
    graph: object
    cluster: object
    placement: np.ndarray
    devices: tuple[str, ...]
    microbatches: int
    step_time_s: float
    peak_memory_bytes: np.ndarray
    oom: bool
    bytes_moved: float
    collective_bytes: dict
    evaluator: str = "simulator"

    @property
    def oom_devices(self) -> list[str]:
        """Devices whose simulated peak exceeds their capacity."""
        c = self.cluster
        return [c.device_names[d] for d in range(c.num_devices) if self.peak_memory_bytes[d] > c.capacity[d]]

    def describe(self) -> str:
        """The plan in words (``fsdp over 8 GPUs (gpu0..gpu7), 8 micro-batches, recompute``)."""
        return plan_words(self.plan, self.devices, self.microbatches)


def plan_words(plan, devices, microbatches: int) -> str:
    """A practitioner plan in the words users use: ``fsdp over 8 GPUs (gpu0..gpu7), 8 micro-batches,
    recompute``; a hybrid names the units FSDP shards and those it recomputes, runs of numbered units
    shortened (``blocks.1-11``).

    >>> plan_words("zero2+recompute", ["gpu0", "gpu1", "gpu2", "gpu3"], 8)
    'zero2 over 4 GPUs (gpu0..gpu3), 8 micro-batches, recompute'
    >>> plan_words("ddp:shard=root/blocks.1/blocks.2,recompute=blocks.6/blocks.7", ["gpu0"], 2)
    'hybrid over 1 GPU (gpu0), 2 micro-batches: FSDP for root, blocks.1-2, DDP for the rest; recompute blocks.6-7'
    """
    from postplace.plans import PlanSpec, parse_plan

    spec = plan if isinstance(plan, PlanSpec) else parse_plan(plan)
    devices = list(devices)
    level = "hybrid" if spec.shard is not None else spec.level
    words = f"{level} over {len(devices)} GPU{'s' if len(devices) > 1 else ''} ({device_span(devices)}), "
    tp = f"tp {spec.tensor}" + " with sequence parallelism" * spec.sequence
    dims = [tp] * bool(spec.tensor) + [f"pp {spec.pipeline}"] * bool(spec.pipeline)
    if dims:
        words += " x ".join([*dims, f"dp {spec.replicas_over(len(devices))}"]) + ", "
    if spec.pipeline:
        schedule = spec.schedule or "1f1b"
        words += {"1f1b": "1F1B", "gpipe": "GPipe"}.get(schedule, f"interleaved 1F1B ({schedule[12:]} chunks per GPU)")
        if spec.stage_blocks is not None:
            words += f" with {'/'.join(map(str, spec.stage_blocks))} blocks per stage"
        words += ", "
    words += f"{microbatches} micro-batch{'es' if microbatches > 1 else ''}"
    if spec.micro_sizes is not None:
        words += " of " + ", ".join(f"{n} sequence{'s' * (n > 1)} on the {model}s" for model, n in spec.micro_sizes)
    if spec.shard is not None:
        words += f": FSDP for {_units(spec.shard) or 'no unit'}, DDP for the rest"
    if spec.recompute:
        units = spec.recompute_units
        rule = " recompute (torchtitan's selective op rule)" if spec.selective else " recompute"
        words += (";" if spec.shard is not None else ",") + (
            rule + ("" if units is None else f" {_units(units) or 'nothing'}")
            if not spec.selective_units or units
            else ""
        )
        if spec.selective_units:
            words += (", " if units else " ") + f"selective op recomputation {_units(spec.selective_units)}"
    return words


def _units(names) -> str:
    """Unit names with runs of numbered ones shortened: ``root, blocks.1-3``."""
    out: list[str] = []
    run: list = []  # [prefix, first, last]
    for u in names:
        prefix, _, num = u.rpartition(".")
        if u and num.isdigit() and run and run[0] == prefix and int(num) == run[2] + 1:
            run[2] = int(num)
            continue
        if run:
            out.append(f"{run[0]}.{run[1]}" + (f"-{run[2]}" if run[2] != run[1] else ""))
            run = []
        if u and num.isdigit():
            run = [prefix, int(num), int(num)]
        else:
            out.append(u or "root")
    if run:
        out.append(f"{run[0]}.{run[1]}" + (f"-{run[2]}" if run[2] != run[1] else ""))
    return ", ".join(out)


def plan_devices(cluster, spec, exclude=()) -> list[int]:
    """The GPUs a plan runs on: the cluster's GPUs minus ``exclude``, the first ``spec.replicas`` of them
    (times ``tp x pp``, the GPUs of one replica: by default as many whole replicas as fit)."""
    excluded = {cluster.device_index(d) for d in exclude}
    gpus = [d for d, dev in enumerate(cluster.devices) if dev.kind == "gpu" and d not in excluded]
    pp = spec.model_parallel
    if gpus and pp > len(gpus):
        what = " x ".join(f"{k}={v}" for k, v in (("tp", spec.tensor), ("pp", spec.pipeline)) if v)
        raise PostplaceError(
            f"plan '{spec}': {what} needs {pp} GPUs and cluster '{cluster.name}' has {len(gpus)}"
            + (" after --exclude" if excluded else "")
            + "; lower them"
        )
    k = spec.replicas * pp if spec.replicas else len(gpus) // pp * pp
    if not gpus:
        raise PostplaceError(
            f"plan '{spec}': cluster '{cluster.name}' has no GPU left for replicas"
            + (" (--exclude removed them)" if excluded else "")
        )
    if k > len(gpus):
        what = f"dp={spec.replicas} x " + " x ".join(
            f"{name}={v}" for name, v in (("tp", spec.tensor), ("pp", spec.pipeline)) if v
        )
        raise PostplaceError(
            f"plan '{spec}': {what.removesuffix(' x ')} needs {k} GPUs and cluster '{cluster.name}' has {len(gpus)}"
            + (" after --exclude" if excluded else "")
            + "; lower dp"
        )
    return gpus[:k]


def plan_replicas(m: int, gpus: int, *, largest: bool) -> int:
    """How many of ``gpus`` GPUs a plan at m micro-batches runs on: all of them when they divide m; at a
    run's ``largest`` count otherwise the largest number of them that divides m (a batch of 8 on 16 GPUs
    runs data-parallel over 8, as a user would launch it); else 0 (no plan at this count).

    >>> plan_replicas(8, 4, largest=False), plan_replicas(8, 16, largest=True), plan_replicas(2, 4, largest=False)
    (4, 8, 0)
    """
    if m % gpus == 0:
        return gpus
    return max(k for k in range(1, gpus + 1) if m % k == 0) if largest else 0


def plan_step(graph, cluster, spec, devices: list[int], *, pins=(), cost_model=None) -> PlanResult:
    """Rewrite ``graph`` (already traced at the plan's micro-batch count) by ``spec`` and simulate it."""
    from postplace.plans import apply_plan
    from postplace.plans._step import microbatch_count
    from postplace.sim import Simulator

    if spec.micro_sizes is not None and graph.metadata.get(SIZES_KEY) != microbatch_sizes(cluster, spec, devices):
        raise PostplaceError(
            f"plan '{spec}': the step's micro-batches are not of the sizes its mbs= gives each replica's GPU model; "
            "build it with postplace.placers.practitioner.sized_graph"
        )
    if spec.pipeline and (spec.level == "fsdp" or spec.shard):
        raise PostplaceError(
            f"plan '{spec}': FSDP inside a pipeline (fsdp, or shard=, with pp) is neither simulated nor launched "
            "(the layered estimate and the grid leave it out too: its gathers of the embedding and head cross the "
            "stages); use zero1 or ddp with pp"
        )
    cpus = [d for d, dev in enumerate(cluster.devices) if dev.kind == "cpu"]
    cost_model = priced_on(cost_model, cluster, [*devices, *cpus])  # the GPUs the plan leaves out run nothing
    stage, key = None, None
    if spec.pipeline:  # each stage all-reduces its own gradients, over its GPUs in every replica
        slots = len(devices) // spec.pipeline
        stage = pipeline_stages(graph, cluster, spec, [devices[slots * s] for s in range(spec.pipeline)], cost_model)
        key = dict(zip(graph.names, (np.maximum(stage, 0) % spec.pipeline).tolist(), strict=True))
        if (spec.tensor or 1) > 1:
            _check_whole_cut(graph, spec, stage)
    planned = apply_plan(graph, spec, spec.replicas_over(len(devices)), bucket_key=key)
    cpu = cpus[0] if cpus else None
    if spec.pipeline:
        planned, dev = _pipelined(graph, planned, spec, stage, devices, cpu)
    else:
        dev = planned.placement(devices, cpu)
    _check_pins(pins, graph, planned.graph, cluster, dev, spec)
    res = Simulator(planned.graph, cluster, cost_model=cost_model).evaluate_ops(dev)
    if res.failed[0]:
        raise PostplaceError(f"plan '{spec}' on cluster '{cluster.name}': {res.reasons[0]}")
    coll = {k: float(v[0]) for k, v in (res.extra.get("collective_bytes") or {}).items()}
    m = microbatch_count(graph)
    names = tuple(cluster.device_names[d] for d in devices)
    return PlanResult(
        str(spec),
        spec.name,
        planned.graph,
        cluster,
        dev,
        names,
        m,
        float(res.step_time[0]),
        res.peak_mem[0].copy(),
        bool(res.oom[0]),
        float(res.bytes_moved[0]),
        coll,
    )


def sized_graph(graph_at, cluster, spec, devices: list[int], *, name: str | None = None):
    """The step ``spec`` runs on ``devices`` where its ``mbs=`` gives each GPU model its own micro-batch size:
    ``graph_at(n)`` is the step traced as the plan's micro-batch count of ``n`` sequences each, and replica r's
    micro-batches (``r * per .. (r + 1) * per - 1``, as :func:`postplace.plans.data_parallel` deals them) are
    of its GPU model's size (:func:`postplace.plans.sized_step`, which names it ``name``)."""
    from postplace.plans import sized_step

    sizes = microbatch_sizes(cluster, spec, devices)
    return sized_step({n: graph_at(n) for n in sorted(set(sizes))}, sizes, name=name)


def microbatch_sizes(cluster, spec, devices: list[int]) -> list[int]:
    """Each micro-batch's sequences under ``spec``'s ``mbs=`` on ``devices``, in micro-batch order (replica r's
    ``m / replicas`` in a row); one line where m is not a multiple of the replicas (or :func:`replica_sizes`
    refuses)."""
    each = replica_sizes(spec, cluster, devices)
    m = spec.microbatches or len(each)
    if m % len(each):
        raise PostplaceError(
            f"plan '{spec}': m={m} is not a multiple of its {len(each)} replicas; give m=j*{len(each)}"
        )
    return [n for n in each for _ in range(m // len(each))]


def replica_models(cluster, devices, tp: int) -> list[set[str]]:
    """The GPU models of each replica's tensor group (``tp`` neighbouring GPUs of ``devices``, in rank order)."""
    return [{cluster.devices[d].model for d in devices[r * tp : (r + 1) * tp]} for r in range(len(devices) // tp)]


def replica_sizes(spec, cluster, devices) -> list[int]:
    """Each replica's sequences per micro-batch under ``spec``'s ``mbs=``; one line for a tensor group of two GPU
    models (it runs one size), a model ``mbs=`` does not name, or one it names that none of ``devices`` is."""
    sizes = dict(spec.micro_sizes)
    models = {cluster.devices[d].model for d in devices}
    if extra := sorted(set(sizes) - models):
        raise PostplaceError(
            f"plan '{spec}': mbs= names {extra[0]}, which none of its GPUs is ({', '.join(sorted(models))})"
        )
    out = []
    for models in replica_models(cluster, devices, spec.tensor or 1):
        if len(models) > 1:
            raise PostplaceError(
                f"plan '{spec}': a tensor group of {' and '.join(sorted(models))} GPUs runs one micro-batch size; "
                "exclude GPUs so that each group is of one model, or drop mbs"
            )
        (model,) = models
        if model not in sizes:
            raise PostplaceError(f"plan '{spec}': mbs= gives no micro-batch size to its {model} GPUs; name every model")
        out.append(sizes[model])
    return out


def _check_whole_cut(graph, spec, stage: np.ndarray) -> None:
    """A pipeline of tensor-parallel groups sends whole values between stages: a cut between the layers of
    a split pair would send each GPU's part (Megatron-LM cuts between whole layers; launch refuses it too)."""
    from postplace.plans.tensor import split_activations

    split = split_activations(graph, tied=False)
    src, dst = graph.edge_src, graph.edge_dst
    cross = (stage[src] >= 0) & (stage[dst] >= 0) & (stage[src] != stage[dst]) & split[src]
    if cross.any():
        e = int(np.flatnonzero(cross)[0])
        raise PostplaceError(
            f"plan '{spec}': the stage cut of '{graph.name}' falls between the layers of a split pair (op "
            f"'{graph.names[src[e]]}' on stage {int(stage[src[e]])} sends a value split over the tensor-parallel "
            "group); pipelines of tensor-parallel groups cut between whole blocks: choose another pp or tp=1"
        )


def pipeline_stages(graph, cluster, spec, first: list[int], cost_model=None) -> np.ndarray:
    """Each op's pipeline stage (-1: none, an op the cut left off the pipeline's GPUs) in a plan with
    ``spec.pipeline`` stages on the GPUs ``first`` (the first pipeline's, stage order): the layers cut as
    :func:`postplace.placers.place_pipeline` cuts them, a numbered unit (a block) kept whole on the stage its
    forward starts on, as Megatron-LM cuts at layer boundaries. With ``interleaved-V`` the blocks are cut
    evenly into ``pp x V`` chunks, numbered as stages (chunk c on GPU ``c mod pp``); with ``stages=`` the blocks
    go to the stages in the counts given (the root's ops where the cut put them). The simulated plan and
    the launched one (:mod:`postplace.runtime.pipeline`) both cut here. The cut is then made a chain
    (:func:`_chained`): an op of a module called at several depths (the top module's stem pooling and final
    mean) goes up to the stage it reads from, so that a micro-batch's forward only flows to later stages."""
    from postplace.placers.pipeline import place_pipeline
    from postplace.plans._step import numbered_units, units
    from postplace.plans.schedule import chunks_of

    pp = spec.pipeline
    cut = place_pipeline(graph, cluster, stages=pp, devices=first, cost_model=cost_model)
    at = [first.index(d) if d in first else -1 for d in cut.tolist()]
    unit = units(graph)
    unit_stage: dict[str, int] = {}  # a numbered unit (a block) stays whole, on the stage of its first forward op
    for i in np.flatnonzero(graph.phase == 0).tolist():
        if unit[i] and at[i] >= 0:
            unit_stage.setdefault(unit[i], at[i])
    v = chunks_of(spec.schedule or "1f1b")
    if v > 1:  # interleaved: the blocks cut evenly into pp x V chunks, chunk c on GPU c mod pp (Megatron-LM's)
        numbered = numbered_units(graph)
        if len(numbered) < pp * v:
            raise PostplaceError(
                f"plan '{spec}': {spec.schedule} over pp={pp} cuts the layers into {pp * v} chunks, "
                f"and '{graph.name}' has {len(numbered)} blocks; lower pp or V"
            )
        unit_stage = {u: k * pp * v // len(numbered) for k, u in enumerate(numbered)}
        at = [pp * v - 1 if a == pp - 1 else a for a in at]  # the root's ops: the last stage's to the last chunk
    elif spec.stage_blocks is not None:  # the user's blocks per stage, in order
        numbered = numbered_units(graph)
        if sum(spec.stage_blocks) != len(numbered):
            raise PostplaceError(
                f"plan '{spec}': stages= gives {sum(spec.stage_blocks)} blocks and '{graph.name}' has "
                f"{len(numbered)}; give counts that add up to {len(numbered)}"
            )
        stage_of = np.repeat(np.arange(len(spec.stage_blocks)), spec.stage_blocks).tolist()
        unit_stage = dict(zip(numbered, stage_of, strict=True))
    stage = np.array(
        [unit_stage.get(unit[i], at[i]) if at[i] >= 0 else -1 for i in range(graph.num_ops)], dtype=np.int64
    )
    stage = _chained(graph, stage, unit)
    idle = sorted(set(range(pp * v)) - set(stage[(stage >= 0) & (graph.phase == 0)].tolist()))
    if idle:  # a stage with no layer: its GPUs would sit in the plan doing nothing, and launch would skip them
        numbered = numbered_units(graph)
        why = (
            f"'{graph.name}' has {len(numbered)} blocks, too few to cut into {pp * v}; lower pp"
            if len(numbered) < pp * v
            else "the cut, made a chain (a layer moved up to the stage it reads from), left it none; "
            "lower pp, or give each stage its blocks with stages=B/B..."
        )
        raise PostplaceError(
            f"plan '{spec}': pp={pp}{f' x {v} chunks' if v > 1 else ''} leaves stage {idle[0]} without a layer: {why}"
        )
    return stage


def _chained(graph, stage: np.ndarray, unit: list[str]) -> np.ndarray:
    """``stage`` with no micro-batch's forward flowing from a later stage to an earlier one, nor its backward
    from an earlier to a later, as 1F1B and interleaved schedules need.

    The cut takes a module as one layer, placed where it is first called, so a module called again deeper
    (a CNN's top module: its stem's max pool, then its final mean; an attention query called at every
    decoder step) sends back to an earlier stage. Such an op goes up to the stage it reads from (its
    backward with it), and whatever that makes read from a later stage follows, until none does; a cut that
    already is a chain is kept as is. What moves is a numbered unit whole, as the cut keeps it, else a
    colocation set (the tracer pairs an op with its backward) together with the weights it reads and their
    other readers. Such a set moves only to the one stage all its calls read from: calls reading from two
    stages (GPT-2's tied embedding and head) would need the weight on both (Megatron-LM's copy of a tied
    embedding on the last stage, its gradient all-reduced), which plans do not model, so that cut stays and
    1F1B still refuses it."""
    from postplace.cluster.placement import colocation_representative
    from postplace.plans._step import BACKWARD, FORWARD, parameter_ops

    rep = colocation_representative(graph)
    keys: dict[object, int] = {}
    gid = np.array([keys.setdefault(u or int(r), len(keys)) for u, r in zip(unit, rep.tolist(), strict=True)])
    numbered = np.zeros(len(keys), dtype=bool)
    numbered[gid[np.array([bool(u) for u in unit], dtype=bool)]] = True
    fixed = np.zeros(len(keys), dtype=bool)
    fixed[gid[stage < 0]] = True  # ops the cut left off the pipeline's GPUs stay there
    param = parameter_ops(graph)
    src, dst = graph.edge_src, graph.edge_dst
    root = list(range(len(keys)))

    def find(g: int) -> int:
        while root[g] != g:
            root[g] = root[root[g]]
            g = root[g]
        return g

    reads = param[src] & (gid[src] != gid[dst])
    for s, d in zip(src[reads].tolist(), dst[reads].tolist(), strict=True):
        if numbered[gid[s]] or numbered[gid[d]]:  # a weight shared across units: its readers stay
            fixed[gid[d]] = True
        else:
            root[find(gid[d])] = find(gid[s])
    gid = np.array([find(g) for g in gid.tolist()])
    fixed[[find(g) for g in np.flatnonzero(fixed).tolist()]] = True
    weighted = np.zeros(len(keys), dtype=bool)  # a numbered unit moves with its weights wherever it goes
    weighted[gid[param]] = True
    weighted[numbered] = False
    members: dict[int, list[int]] = {}
    for i, g in enumerate(gid.tolist()):
        members.setdefault(g, []).append(i)
    mb, phase = graph.microbatch, graph.phase
    same = (mb[src] >= 0) & (mb[src] == mb[dst]) & (phase[src] == phase[dst]) & (gid[src] != gid[dst])
    fwd, bwd = same & (phase[src] == FORWARD), same & (phase[src] == BACKWARD)
    inputs: dict[int, list[int]] = {}  # a weighted set's calls' inputs from outside it
    for s, d in zip(src[fwd].tolist(), dst[fwd].tolist(), strict=True):
        if weighted[gid[d]]:
            inputs.setdefault(int(gid[d]), []).append(s)
    # (a, b): b may not run on an earlier stage than a; forwards in program order, backwards reversed
    pairs = list(zip(src[fwd].tolist(), dst[fwd].tolist(), strict=True))
    pairs += list(zip(dst[bwd].tolist()[::-1], src[bwd].tolist()[::-1], strict=True))
    stage = stage.copy()
    moved = True
    while moved:
        moved = False
        for a, b in pairs:
            g, to = gid[b], stage[a]
            if stage[b] >= to or fixed[g] or (weighted[g] and any(stage[x] != to for x in inputs.get(g, ()))):
                continue
            stage[members[g]] = to
            moved = True
    return stage


def _pipelined(graph, planned, spec, at, devices, cpu):
    """``(planned step in the schedule's order, placement)`` of a plan with ``spec.pipeline`` stages: the
    layers cut as :func:`pipeline_stages` cuts them (``at``: each traced op's stage), each
    replica's op on GPU ``devices[slot + slots x stage]`` (a replica's slot, ``tp`` of them per replica),
    a made op (a collective's member) on the stage of the nearest op it exchanges data with; a tensor group's
    all-reduce or reduce-scatter on its partial sum's stage, its all-gather on its reader's (the launched
    pipeline's: a stage sends its tokens, the reading stage gathers them)."""
    from postplace.plans import PlannedStep
    from postplace.plans._step import traced_name
    from postplace.plans.schedule import pipeline_schedule

    pp, dp = spec.pipeline, planned.replicas
    stage_of = dict(zip(graph.names, at.tolist(), strict=True))
    g = planned.graph
    stage = np.array([stage_of.get(traced_name(n), -2) for n in g.names])
    near: list[list[int]] = [[] for _ in range(g.num_ops)]
    into: list[list[int]] = [[] for _ in range(g.num_ops)]
    for s, d in zip(g.edge_src.tolist(), g.edge_dst.tolist(), strict=True):
        near[s].append(d)
        near[d].append(s)
        into[d].append(s)
    for i in np.flatnonzero(stage == -2).tolist():  # a tensor group's collective: where the launch runs it
        kind = traced_name(g.names[i]).split(":", 1)[0]
        if kind in ("tp_all_reduce", "tp_reduce_scatter"):  # the stage holding the partial sum
            known = [stage[j] for j in into[i] if stage[j] >= 0]
        elif kind == "tp_all_gather":  # the stage reading the tokens (a stage sends its own tokens)
            known = [stage[j] for j in near[i] if j not in into[i] and stage[j] >= 0]
        else:
            continue
        if known:
            stage[i] = min(known)
    todo = np.flatnonzero(stage == -2).tolist()
    while todo:  # made ops: the stage of a neighbour, nearest first
        left = []
        for i in todo:
            known = [stage[j] for j in near[i] if stage[j] >= 0]
            if known:
                stage[i] = min(known)
            else:
                left.append(i)
        if len(left) == len(todo):
            break
        todo = left
    stage[stage == -2] = 0
    dev = np.asarray(devices, dtype=np.int64)[planned.replica + dp * (np.maximum(stage, 0) % pp)]
    if cpu is not None:
        dev[(g.allowed_kinds & 2) == 0] = cpu
    on_cpu = dev == cpu if cpu is not None else np.zeros(g.num_ops, dtype=bool)
    ordered = pipeline_schedule(g, np.where(on_cpu, -1, stage), spec.schedule or "1f1b", planned.replica)
    keep = {n: i for i, n in enumerate(g.names)}
    order = np.array([keep[n] for n in ordered.names])
    return PlannedStep(ordered, planned.replica[order], planned.replicas, planned.level), dev[order]


def _check_pins(pins, base, graph, cluster, dev, spec) -> None:
    if not pins:
        return
    from postplace.plans._step import traced_name
    from postplace.search.problem import parse_pins

    pin = parse_pins(list(pins), base, cluster)
    want = {base.names[i]: int(pin[i]) for i in np.flatnonzero(pin >= 0)}
    for j, name in enumerate(graph.names):
        own = traced_name(name, keep_clones=True)
        d = want.get(own)
        if d is not None and dev[j] != d:
            raise PostplaceError(
                f"plan '{spec}' runs op '{own}' on {cluster.device_names[dev[j]]} while --pin puts "
                f"it on {cluster.device_names[d]}; a replicated plan runs it on every replica: drop "
                "the pin or the plan"
            )


def device_span(names) -> str:
    """Device names, a run of three or more numbered GPUs shortened: ``gpu0..gpu7``; ``cpu, gpu0``."""
    names = list(names)
    if len(names) > 2 and all(n.startswith("gpu") and n[3:].isdigit() for n in names):
        ids = [int(n[3:]) for n in names]
        if ids == list(range(ids[0], ids[0] + len(ids))):
            return f"{names[0]}..{names[-1]}"
    return ", ".join(names)


@dataclass(frozen=True)
class ChoiceSearch:
    """What :meth:`PlanChoices.search` found: its best step that fits (inf: none), that choice per group (None:
    none), the sample that found it (1-based), the samples taken, how many new bests each origin made
    (``policy``, ``local``...; a warm start counts none), and each sample's origin and step (inf: over memory
    or failed), in the order taken."""

    best_step_s: float
    choice: tuple | None
    at: int
    samples: int
    new_bests: dict
    origins: tuple[str, ...] = ()
    step_times: tuple[float, ...] = ()


CHOICES = ("ddp", "fsdp", "ddp+recompute", "fsdp+recompute")
"""A unit group's plan choices in the per-unit plan space (:class:`PlanChoices`)."""


class PlanChoices:
    """The per-unit plan space as an evaluator a search strategy can drive (ask/tell, like placements).

    A "placement" is one choice per group of units: an index into :data:`CHOICES`. The groups are the
    root unit alone and the numbered units in up to ``runs`` contiguous runs; the choice of a group is
    whether FSDP shards its units (else DDP replicates them) and whether they are recomputed (the root,
    which holds the loss, never is). :meth:`evaluate` rewrites the step by that hybrid plan and
    simulates it; each distinct choice is tried once.

    Parameters
    ----------
    graph : OpGraph
        The step at its micro-batch count.
    cluster : Cluster
    devices : list of int
        The replicas' GPUs.
    runs : int
        How many runs the numbered units are cut into.
    pins, cost_model
        As :func:`plan_step` takes them.
    """

    name = "simulator"

    def __init__(self, graph, cluster, devices, *, runs: int = 8, pins=(), cost_model=None):
        from postplace.plans._step import numbered_units

        numbered = numbered_units(graph)
        cut = [numbered[i * len(numbered) // runs : (i + 1) * len(numbered) // runs] for i in range(runs)]
        self.groups = [[""], *[c for c in cut if c]]
        self.graph, self.cluster, self.devices = graph, cluster, list(devices)
        self.pins, self.cost_model = pins, cost_model
        self.tried: dict[tuple, PlanResult | None] = {}

    def space(self, home=None):
        """The :class:`postplace.search.SearchSpace` of the choices (every choice allowed everywhere); ``home``
        (a choice per group) marks each group's home column as its fastest device, so a prior anchored on
        the fastest (``init="speed"``) starts at that plan."""
        from postplace.search import SearchSpace

        allowed = np.ones((len(self.groups), len(CHOICES)), dtype=bool)
        unit_time = None
        if home is not None:
            unit_time = np.full(allowed.shape, 2.0)
            unit_time[np.arange(len(self.groups)), np.asarray(home, dtype=np.int64)] = 1.0
        return SearchSpace(
            allowed,
            failure_step_time=self.failing,
            unit_time=unit_time,
            device_names=CHOICES,
            device_kinds=("gpu",) * len(CHOICES),
        )

    failing = 1e9
    """The score of a plan that does not fit (seconds): far above any plan's step in this space."""

    def spec(self, choice):
        """The hybrid plan of one choice per group."""
        from postplace.plans import PlanSpec
        from postplace.plans._step import microbatch_count

        shard = [u for g, c in zip(self.groups, choice, strict=True) if c in (1, 3) for u in g]
        redo = [u for g, c in zip(self.groups, choice, strict=True) if c in (2, 3) for u in g if u]
        return PlanSpec(
            "ddp",
            bool(redo),
            microbatch_count(self.graph),
            len(self.devices),
            tuple(shard),
            tuple(redo) if redo else None,
        )

    def evaluate(self, placements):
        """Simulate each row's hybrid plan (:class:`postplace.sim.EvalResult`)."""
        from postplace.sim.simulate import EvalResult

        rows = np.atleast_2d(np.asarray(placements, dtype=np.int64))
        n, D = len(rows), self.cluster.num_devices
        step, peak = np.full(n, np.inf), np.zeros((n, D))
        oom, failed, reasons = np.zeros(n, dtype=bool), np.zeros(n, dtype=bool), [None] * n
        for i, row in enumerate(rows):
            key = tuple(int(x) for x in row)
            if key not in self.tried:
                try:
                    self.tried[key] = plan_step(
                        self.graph,
                        self.cluster,
                        self.spec(key),
                        self.devices,
                        pins=self.pins,
                        cost_model=self.cost_model,
                    )
                except PostplaceError:
                    self.tried[key] = None
            r = self.tried[key]
            if r is None:
                failed[i], reasons[i] = True, "the plan breaks a pin"
                continue
            step[i], peak[i], oom[i] = r.step_time_s, r.peak_memory_bytes, r.oom
        return EvalResult(step, peak, oom, failed, reasons, self.name)

    def search(self, strategy: str, budget: int, seed: int, *, start=None, config=None) -> ChoiceSearch:
        """Drive ``strategy`` (a name :func:`postplace.search.make_strategy` knows; ``config``: its config,
        default its own) over the choices for ``budget`` samples through the search runner. ``start`` (a choice
        per group): told first (a warm start), and Post and its family start anchored on it (``init="speed"``
        over :meth:`space`'s homes)."""
        from dataclasses import replace

        from postplace.search import Budget, PostConfig, make_strategy, run
        from postplace.search.origins import new_bests

        space = self.space(start)
        if config is None:
            config = getattr(make_strategy(strategy, space), "config", None)
        if start is not None and isinstance(config, PostConfig):
            config = replace(config, init="speed")
        chosen = make_strategy(strategy, space, seed=seed, config=config)
        warm = None if start is None else np.asarray(start, dtype=np.int64)
        found = run(chosen, self, Budget(samples=budget), warm_start=warm)
        if found.interrupted:  # Ctrl-C: the runner stopped; place stops too (its run folder resumes)
            raise KeyboardInterrupt
        choice = None if found.best_placement is None else tuple(int(x) for x in found.best_placement)
        return ChoiceSearch(
            found.best_step_time,
            choice,
            found.best_sample + 1,
            found.samples,
            new_bests(found.origins, found.step_times),
            tuple(found.origins),
            tuple(float(t) for t in found.step_times),
        )

    def best(self):
        """The fastest plan tried that fits, with its choice; (None, None) when none fits."""
        fits = [(r.step_time_s, key) for key, r in self.tried.items() if r is not None and not r.oom]
        if not fits:
            return None, None
        _, key = min(fits)
        return self.tried[key], key
