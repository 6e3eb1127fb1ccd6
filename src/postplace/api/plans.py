"""A named practitioner plan timed without a search: what ``postplace simulate --plan`` prints.

The plan runs on every GPU of the cluster that ``--exclude`` leaves (``dp=K`` takes the first K), at the
micro-batch count it names (``m=M``) or else one micro-batch per replica; the step is traced again at
that count, the plan's passes (:mod:`postplace.plans`) rewrite it, and the simulator times it
(:mod:`postplace.placers.practitioner`).
"""

from __future__ import annotations

from dataclasses import replace

from postplace.errors import PostplaceError
from postplace.placers.practitioner import PlanResult, plan_devices, plan_step, plan_words

__all__ = ["PlanResult", "estimate_plan_layered", "plan_devices", "plan_step", "plan_words", "simulate_plan"]


def simulate_plan(
    target,
    cluster,
    plan,
    *,
    size: str = "full",
    optimizer="sgd",
    lr: float | None = None,
    precision: str = "fp32",
    pins=(),
    exclude=(),
    microbatch_colocation: str = "none",
    cost_model=None,
) -> PlanResult:
    """Time one practitioner plan of ``target`` on ``cluster`` without a search.

    Parameters
    ----------
    target : str or OpGraph
        A zoo model name (traced again at the plan's micro-batch count) or a graph traced at the plan's
        micro-batch count (its default then).
    cluster : str, path or Cluster
    plan : str or PlanSpec
        ``ddp``, ``zero1``, ``zero2``, ``fsdp``, each optionally ``+recompute`` and ``:m=M,dp=K``.
    size, optimizer, lr, precision, microbatch_colocation
        The step traced, as :func:`postplace.place` takes them.
    pins, exclude
        ``REGEX=DEVICE`` pins and devices to leave out; a plan that breaks a pin is refused.
    cost_model : CostModel, optional

    Returns
    -------
    PlanResult

    Raises
    ------
    PostplaceError
        A plan that does not parse, an m that does not divide the batch or is no multiple of the
        replicas, more replicas than GPUs, a pin the plan breaks.
    """
    from postplace.api.target import load_cluster, load_target
    from postplace.graph import OpGraph
    from postplace.plans import PlanSpec, parse_plan
    from postplace.plans._step import microbatch_count

    spec = plan if isinstance(plan, PlanSpec) else parse_plan(plan)
    probe = load_target(target, size=size, optimizer=optimizer, lr=lr, precision=precision)
    c, _ = load_cluster(cluster, probe.graph)
    devices = plan_devices(c, spec, exclude)
    k = spec.replicas_over(len(devices))
    fixed = isinstance(target, OpGraph) or probe.spec.get("kind") == "file"  # cannot be traced again
    traced_m = microbatch_count(probe.graph) if fixed else None
    m = spec.microbatches or traced_m or k
    if traced_m is not None and (m != traced_m or m % k):
        raise PostplaceError(
            f"plan '{spec}' over {k} GPUs needs the step as a multiple of {k} micro-batches, "
            f"and '{probe.graph.name}' is one traced step of {traced_m}, which cannot be traced "
            "again; give a zoo model's name (or your module to postplace.place), or dp=1"
        )
    if m % k:
        raise PostplaceError(f"plan '{spec}': m={m} is not a multiple of its {k} replicas; give m=j*{k}")
    if probe.spec.get("kind") == "zoo" and spec.micro_sizes is None:
        _check_split(spec, target, size, m, k)
    if spec.micro_sizes is not None:
        graph = _sized(target, probe, c, spec, devices, m, k, size, optimizer, lr, precision, microbatch_colocation)
    elif m == 1 or traced_m is not None:
        graph = probe.graph
    else:
        graph = _traced(spec, target, size, optimizer, lr, precision, m, microbatch_colocation)
    return plan_step(graph, c, spec, devices, pins=pins, cost_model=cost_model)


def estimate_plan_layered(
    target: str,
    cluster,
    plan,
    *,
    size: str = "full",
    optimizer="sgd",
    lr: float | None = None,
    precision: str = "fp32",
    exclude=(),
    cost_model=None,
    blocks: int = 3,
):
    """Price one plan of a zoo transformer by the layered estimate (:mod:`postplace.placers.layered`): for
    steps the op-level simulation cannot hold (LLaMA-70B on 64 GPUs at a 1M-token batch).

    The model is traced as two micro-batches of the plan's size with ``blocks`` blocks, measured op by op on
    one tensor group, its middle block repeated to the model's depth, and the plan priced on one replica's
    pipeline. Arguments as :func:`simulate_plan` takes them (``target`` a zoo model's name).

    Returns
    -------
    tuple
        ``(LayeredResult, cluster, devices)``: the estimate, the cluster, the plan's GPUs in rank order.
    """
    from postplace.api.layered import pair_tracer, traced_pair, zoo_blocks
    from postplace.api.target import load_cluster
    from postplace.placers.layered import estimate_plan, measured_rule, measured_sizes, plan_costs
    from postplace.plans import PlanSpec, parse_plan

    spec = plan if isinstance(plan, PlanSpec) else parse_plan(plan)
    _, layers, batch = zoo_blocks(target, size)
    c, _ = load_cluster(cluster, None)
    devices = plan_devices(c, spec, exclude)
    k = spec.replicas_over(len(devices))
    m = spec.microbatches or k
    if spec.micro_sizes is not None:
        _check_batch(spec, c, devices, batch, m, k)
    elif m % k or batch % m:
        raise PostplaceError(
            f"plan '{spec}': m={m} must be a multiple of its {k} replicas and divide the batch of {batch}; "
            f"give m=j*{k} dividing {batch}"
        )
    if spec.micro_sizes is not None:  # each GPU model's units at its own size: the step traced at each
        graph, traced_at = None, pair_tracer(target, size, optimizer, lr, precision, min(blocks, layers))
    else:
        graph = traced_pair(target, size, batch, m, optimizer, lr, precision, min(blocks, layers))

    def measured(recompute: bool, selective: bool = False):
        rule = "selective" if selective else "full" if recompute else ""
        if spec.micro_sizes is not None:
            return measured_sizes(
                traced_at,
                c,
                devices,
                rule,
                spec.micro_sizes,
                tensor=spec.tensor or 1,
                sequence=spec.sequence,
                layers=layers,
                cost_model=cost_model,
            )
        return measured_rule(
            graph,
            c,
            devices,
            rule,
            tensor=spec.tensor or 1,
            sequence=spec.sequence,
            layers=layers,
            cost_model=cost_model,
        )

    costs = plan_costs(spec, measured)
    spec = spec if spec.microbatches else replace(spec, microbatches=m)
    return estimate_plan(costs, c, spec, devices), c, devices


def _traced(spec, target, size: str, optimizer, lr, precision: str, m: int, colocation: str, where: str = ""):
    """``target`` traced again as ``m`` micro-batches; a failure is one line naming the plan (and ``where``)."""
    from postplace.api.target import load_target

    try:
        return load_target(
            target,
            size=size,
            optimizer=optimizer,
            lr=lr,
            precision=precision,
            microbatches=m,
            microbatch_colocation=colocation,
        ).graph
    except PostplaceError as exc:
        raise PostplaceError(f"plan '{spec}': {where}{exc}") from None


def _sized(
    target, probe, cluster, spec, devices, m: int, replicas: int, size: str, optimizer, lr, precision, colocation
):
    """The step ``spec``'s ``mbs=`` runs: a zoo model traced as m micro-batches at each GPU model's size, joined
    (:func:`postplace.placers.practitioner.sized_graph`)."""
    from postplace import zoo
    from postplace.placers.practitioner import sized_graph

    if probe.spec.get("kind") != "zoo":
        raise PostplaceError(
            f"plan '{spec}': mbs= traces the step again at each GPU model's micro-batch size, which only a zoo "
            "model's name allows; drop mbs for a module or a graph file"
        )
    batch = int(zoo.spec(target).config(size)["batch"])
    _check_batch(spec, cluster, devices, batch, m, replicas)

    def graph_at(n: int):
        at = f"{zoo.base_size(size)}@{m * n}"
        return _traced(spec, target, at, optimizer, lr, precision, m, colocation, f"at {n} sequences per micro-batch: ")

    name = f"{target}-{zoo.base_size(size)}@{batch}-mb{m}-{colocation}-sized"
    try:
        return sized_graph(graph_at, cluster, spec, devices, name=name)
    except PostplaceError as exc:
        said = str(exc)
        raise PostplaceError(said if said.startswith(f"plan '{spec}'") else f"plan '{spec}': {said}") from None


def _check_split(spec, target: str, size: str, m: int, replicas: int) -> None:
    """One line unless the zoo model's batch splits into the plan's ``m`` micro-batches, saying what to change:
    a plan without m= runs one micro-batch per replica, so fewer replicas (dp=K) is the fix there."""
    from postplace import zoo

    batch = int(zoo.spec(target).config(size)["batch"])
    if batch % m == 0:
        return
    fits = [d for d in range(replicas, 0, -1) if batch % d == 0 and d > 1]
    if spec.microbatches is None:
        hint = f"give dp=K with K dividing {batch}" + (f" (e.g. {replace(spec, replicas=fits[0])})" if fits else "")
        raise PostplaceError(
            f"plan '{spec}' runs one micro-batch per replica by default, {m} here, and the batch of {batch} does not "
            f"split into {m}; {hint}, or a larger batch (--size SIZE@N)"
        )
    raise PostplaceError(
        f"plan '{spec}': m={m} does not divide the batch of {batch}; give an m dividing {batch} that is a multiple "
        f"of the replicas (dp=K for fewer of them), or a larger batch (--size SIZE@N)"
    )


def _check_batch(spec, cluster, devices, batch: int, m: int, replicas: int) -> None:
    """One line unless ``spec``'s micro-batch sizes per GPU model (``mbs=``) make exactly ``batch`` sequences: each
    replica runs ``m / replicas`` micro-batches of its GPU model's size."""
    from postplace.placers.practitioner import microbatch_sizes

    total = sum(microbatch_sizes(cluster, replace(spec, microbatches=m), devices))
    if total != batch:
        raise PostplaceError(
            f"plan '{spec}': {replicas} replicas running {m // replicas} micro-batch{'es' * (m // replicas > 1)} "
            "each of mbs= sizes make "
            f"{total} sequences, not the batch of {batch}; change mbs= or m"
        )
