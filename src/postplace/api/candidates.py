"""The candidates ``place`` chooses from (DESIGN.md section 4c) and the choice:

* the search's own best (reported on its own as ``search_best_step_time_s``);
* the warm start's own op-level placement, when there is one;
* data parallelism, the GPipe-style pipeline, the best single device and the memory-aware one-shot
  placers (:data:`CANDIDATE_PLACERS`), each under the same pins and exclusions, judged by the same
  evaluator;
* where plans are simulated: the practitioner plans (:func:`plan_candidates`), Post's search over per-unit
  plans from the fastest uniform one (:func:`hybrid_candidate`, its record ``plan_search``) and the 3D grid's
  best (:func:`grid_candidate`).

The fastest feasible one is returned (ties: that order), and ``returned`` names it.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from postplace.api.result import Candidate
from postplace.api.summary import plan_gpus
from postplace.errors import PostplaceError
from postplace.placers import REGISTRY

CANDIDATE_PLACERS = tuple(name for name, p in REGISTRY.items() if p.candidate)
"""The one-shot placers ``place`` weighs beside the search, in the order that breaks ties."""

OWNER_DP = "param-server"
OWNER_DP_SHARDED = "param-server (sharded state)"
"""Micro-batch k on GPU k, each parameter's gradient sent every micro-batch to the GPU that owns it and
updates it: data parallelism as a placement of the micro-batched step, but a parameter server, not DDP
(whose rows are the practitioner plans below). Its memory is judged as DDP's (every replica holds the
whole state); where that does not fit, the sharded variant holds each owner's share only."""

PRACTITIONER_PLANS = ("ddp", "zero2", "fsdp", "ddp+recompute", "zero2+recompute", "fsdp+recompute")
"""The plans users launch instead (DESIGN.md 4c), each a candidate at every micro-batch count that is a
multiple of the GPUs it runs on."""


QUADRATIC_PLACERS = tuple(name for name, p in REGISTRY.items() if p.quadratic)


QUADRATIC_PLACER_MAX_OPS = 20_000
"""Above this many ops m-ETF and m-SCT (ops x ready ops, and m-SCT's LP) take minutes: 20 s each on
Inception-V3 at 16 micro-batches (17,693 ops) on 2 cores; they are left out with a note, as on the
large micro-batch counts of big models, where the other candidates still run."""


def warm_start_ops(spec: str, problem) -> np.ndarray:
    """The op-level placement of a warm start: a placer (run under the problem's constraints),
    ``single:DEVICE``, or a placement JSON file (which must respect the constraints)."""
    from postplace.placers import PLACERS
    from postplace.placers import place as run_placer
    from postplace.placers.single import on_device

    graph, c, allowed = problem.graph, problem.cluster, problem.op_allowed
    if spec.startswith("single:"):
        ops = on_device(graph, c, spec.split(":", 1)[1])
    elif spec in PLACERS:
        ops = run_placer(spec, graph, c, cost_model=problem.simulator.problem.cost_model, allowed=allowed)
    elif Path(spec).exists():
        from postplace.cluster.placement import from_mapping
        from postplace.graph.microbatch_names import placement_microbatches
        from postplace.validate import read_json

        d = read_json(spec)
        if not isinstance(d, dict):
            raise PostplaceError(f"{spec}: a placement file is one JSON object {{op name: device name}}")
        if placement_microbatches(d) == placement_microbatches(graph.names):
            ops = from_mapping(graph, c, d, source=str(spec))
        else:  # made at another micro-batch count
            ops = _mapped_placement(spec, d, graph, c)
    else:
        raise PostplaceError(
            f"--warm-start '{spec}': give a placer ({', '.join(PLACERS)}), single:DEVICE, or a placement JSON file"
        )
    bad = np.flatnonzero(~allowed[np.arange(graph.num_ops), ops])
    if bad.size:
        i = int(bad[0])
        raise PostplaceError(
            f"--warm-start {spec} puts op '{graph.names[i]}' on {c.device_names[ops[i]]}, which "
            "--pin/--exclude (or its kinds) forbid; drop the warm start or the constraint"
        )
    return ops


def _mapped_placement(spec: str, d: dict, graph, c) -> np.ndarray:
    """A placement file ``spec`` (read: ``d``) made for the same step at another micro-batch count (its
    op names say which), mapped to ``graph``: an op takes the device of the op of its own name, else of
    the op it copies (``mb3_conv`` -> ``conv``), else of that op's copy in the file's micro-batch
    ``k mod m_file``; colocation sets follow their
    first placed member, and an op still unplaced follows its first placed input, else its first
    placed consumer, else the first device its kinds allow. Refused in one line where even that
    leaves the placement invalid."""
    from postplace.cluster.placement import effective_kinds, invalid_reason
    from postplace.graph.microbatch_names import placement_microbatches
    from postplace.search.problem import pin_names

    m_file = placement_microbatches(d)
    dev = np.full(graph.num_ops, -1, dtype=np.int64)
    for i, (name, tmpl) in enumerate(zip(graph.names, pin_names(graph), strict=True)):
        k = int(graph.microbatch[i])
        got = d.get(name, d.get(tmpl, d.get(f"mb{k % m_file}_{tmpl}") if k >= 0 else None))
        if isinstance(got, str) and got in c.device_names:
            dev[i] = c.device_index(got)
    for members in graph.colocation_sets:
        placed = dev[members][dev[members] >= 0]
        if placed.size:
            dev[members] = placed[0]
    kinds = effective_kinds(graph)
    sets = {int(i): members for members in graph.colocation_sets for i in members}

    def follow(i: int, neighbours) -> None:
        placed = [int(dev[j]) for j in neighbours if dev[j] >= 0 and kinds[i] & c.kind_bits[dev[j]]]
        if placed:
            dev[sets.get(i, [i])] = placed[0]

    for i in range(graph.num_ops):  # stored in program order: inputs come first
        if dev[i] < 0:
            follow(i, graph.edge_src[graph.in_edges[graph.in_ptr[i] : graph.in_ptr[i + 1]]])
    for i in range(graph.num_ops - 1, -1, -1):  # sources no input placed (a micro-batch's labels): consumers
        if dev[i] < 0:
            follow(i, graph.edge_dst[graph.edge_src == i])
    for i in np.flatnonzero(dev < 0):
        ok = [e for e in range(c.num_devices) if kinds[i] & c.kind_bits[e]]
        dev[sets.get(int(i), [i])] = ok[0] if ok else 0
    reason = invalid_reason(graph, c, dev)
    if reason:
        raise PostplaceError(
            f"--warm-start {spec}: made for {m_file} micro-batch(es), it cannot be mapped to "
            f"'{graph.name}' ({reason}); pin that count with --microbatches {m_file}"
        )
    return dev


def plan_candidates(problem, *, pins=(), exclude=(), largest: bool = True) -> list[Candidate]:
    """The practitioner plans (:data:`PRACTITIONER_PLANS`) at this problem's micro-batch count m, on every
    GPU ``--exclude`` leaves when m is a multiple of their number; at the run's ``largest`` count
    otherwise on the first k of them, k the largest divisor of m they allow (a batch of 8 on 16 GPUs
    runs data-parallel over 8, as a user would launch it); none below 2 GPUs. A plan that breaks a pin,
    or does not fit, is a candidate with a note and no step time."""
    from postplace.placers.practitioner import plan_devices, plan_replicas, plan_step
    from postplace.plans import parse_plan
    from postplace.plans._step import microbatch_count

    graph, c = problem.graph, problem.cluster
    m = microbatch_count(graph)
    cm = problem.simulator.problem.cost_model
    cands = []
    for name in PRACTITIONER_PLANS:
        spec = parse_plan(name)
        try:
            devices = plan_devices(c, spec, exclude)
        except PostplaceError as exc:
            cands.append(Candidate(name, None, None, False, str(exc)))
            continue
        every = len(devices)
        devices = devices[: plan_replicas(m, every, largest=largest)]
        if len(devices) < 2:
            continue
        try:
            r = plan_step(graph, c, spec, devices, pins=pins, cost_model=cm)
        except PostplaceError as exc:
            cands.append(Candidate(name, None, None, False, str(exc)))
            continue
        note = f"OOM: does not fit ({', '.join(r.oom_devices)})" if r.oom else ""
        if len(devices) < every and not note:
            note = f"dp={len(devices)} of {every} GPUs"
        cands.append(
            Candidate(
                name,
                r.placement,
                None if r.oom else r.step_time_s,
                not r.oom,
                note,
                r.graph,
                f"{spec.name}:m={m},dp={len(devices)}",
            )
        )
    return cands


HYBRID_WORK = 2e6
"""The hybrid's search tries ``HYBRID_WORK / (ops x replicas)`` plans, at most :data:`HYBRID_PLANS`, and is
left out below 8: ResNet-50 over 4 K80s at m = 4 gets 48, GPT-2 over 8 GPUs 42, LLaMA-1B over 8 GPUs 10,
LLaMA-7B none (each of its plans takes 6 s to rewrite and simulate). A count, not a time, so an answer does
not depend on the machine's speed."""

HYBRID_PLANS = 48


def hybrid_candidate(
    problem, plans: list[Candidate], *, pins=(), exclude=(), seed: int = 0
) -> tuple[list, dict | None]:
    """Post over the per-unit plan space: per group of units (the root, and the numbered units in up to eight
    runs), DDP or FSDP, recomputed or not (:class:`postplace.placers.practitioner.PlanChoices`).

    Post (the product's default: cross-entropy, PPO and local moves) starts at the fastest uniform DDP or FSDP
    plan at this micro-batch count (told first, its prior anchored there) and spends the plans
    :data:`HYBRID_WORK` allows. Returns ``(candidates, record)``: the best plan as ``hybrid`` when it fits and
    beats every uniform DDP and FSDP plan (the corners of the space), else no candidate; ``record`` (None
    where the search did not run) says the start, its step, Post's own best and the plan, the samples, and the
    new bests per origin, for ``summary.json``'s ``plan_search``. ``benchmarks/post_plans.py`` measures
    strategies on the same space from the uniform start."""
    from postplace.placers.practitioner import CHOICES, PlanChoices
    from postplace.plans import parse_plan

    corners = [p for p in plans if p.feasible and p.plan and parse_plan(p.plan).level in ("ddp", "fsdp")]
    if not corners:
        return [], None
    start = min(corners, key=lambda p: p.step_time_s)
    devices = plan_gpus(start)
    budget = min(HYBRID_PLANS, int(HYBRID_WORK / (problem.graph.num_ops * len(devices))))
    if budget < 8:
        return [], None
    space = PlanChoices(
        problem.graph, problem.cluster, devices, pins=pins, cost_model=problem.simulator.problem.cost_model
    )
    home = [CHOICES.index(parse_plan(start.plan).name)] * len(space.groups)
    found = space.search("post", budget, int(seed), start=home)
    best = None if found.choice is None else space.tried[found.choice]
    record = {
        "strategy": "post",
        "space": f"{len(space.groups)} unit groups x {', '.join(CHOICES)}",
        "start": start.name,
        "start_plan": start.plan,
        "start_step_time_s": start.step_time_s,
        "best_step_time_s": None if best is None else best.step_time_s,
        "best_plan": None if best is None else start.plan if found.choice == tuple(home) else best.plan,
        "samples": found.samples,
        "found_at_sample": found.at if best is not None else None,
        "new_bests": found.new_bests,
    }
    if best is None or best.step_time_s >= min(p.step_time_s for p in corners):
        return [], record
    origins = ", ".join(f"{k} {n}" for k, n in found.new_bests.items()) or "none"
    note = (
        f"found by Post over {record['space']} from {start.name} ({found.samples} plans, "
        f"{(1 - best.step_time_s / start.step_time_s) * 100:.2f}% below it; new bests: {origins})"
    )
    return [Candidate("hybrid", best.placement, best.step_time_s, True, note, best.graph, best.plan)], record


GRID_WORK = 2e6
"""The ``best-3d`` grid simulates plans while their op x GPU count adds up to at most this (each plan
counts its step's ops times its GPUs, twice when recomputed); the rest of the grid is left out with a
note that says so. Whole grids fit for ResNet-50 on ``k80x4`` at m = 4 (49,008 per plan) and GPT-2 on
``dgx8`` at m = 8 (84,160 per plan, 23 allowed, its grid 14); LLaMA-7B there (366,824 per plan) gets
the first 6 of its 18 (tensor parallelism 2, a 2-stage pipeline: about 70 s on 2 cores, where the whole
grid would add 3 minutes to ``place``: ``benchmarks/plans_3d.py`` runs it). A count, not a time, so an
answer does not depend on the machine's speed."""


def grid_candidate(problem, plans: list[Candidate], *, pins=(), exclude=()) -> list[Candidate]:
    """``best-3d``: the fastest plan of the practitioner's grid at this micro-batch count
    (:func:`postplace.placers.grid.best_3d`: every tp x pp x dp over the GPUs ``--exclude`` leaves,
    pruned as a practitioner prunes it), or of the plain plans ``plans`` where none of the grid beats
    them; none below 2 GPUs or when nothing fits."""
    from postplace.placers.grid import best_3d
    from postplace.placers.practitioner import plan_devices
    from postplace.plans import parse_plan
    from postplace.plans._step import microbatch_count

    try:
        gpus = plan_devices(problem.cluster, parse_plan("ddp"), exclude)
    except PostplaceError:
        return []
    m = microbatch_count(problem.graph)
    if len(gpus) < 2:
        return []
    grid = best_3d(
        problem.graph, problem.cluster, gpus, pins=pins, cost_model=problem.simulator.problem.cost_model, work=GRID_WORK
    )
    plans = [p for p in plans if p.name in PRACTITIONER_PLANS and p.plan]
    options = [(p.step_time_s, p.placement, p.graph, p.plan) for p in plans if p.feasible]
    if grid.best is not None:
        b = grid.best
        options.append((b.step_time_s, b.placement, b.graph, b.plan))
    if not options and not grid.tried:
        return []
    if not options:
        return [Candidate("best-3d", None, None, False, f"no plan of the grid at m={m} fits; " + "; ".join(grid.notes))]
    step, placement, graph, plan = min(options, key=lambda o: o[0])
    tried = len(grid.tried) + len(plans)
    note = f"best of {tried} plans at m={m} (the plain plans and the tp x pp x dp grid)"
    if grid.notes:
        note += "; " + "; ".join(n for n in grid.notes if ": schedule" not in n)
    return [Candidate("best-3d", placement, step, True, note, graph, plan)]


def search_candidate(problem, result) -> Candidate:
    if result.best_placement is not None:
        return Candidate("search", problem.grouping.expand(result.best_placement), result.best_step_time, True)
    return Candidate("search", None, None, False, "no feasible sample")


def oneshot_candidates(problem, judge, warm_ops, warm_start: str | None = None) -> list[Candidate]:
    """The warm start's own placement (``warm_ops``, named by its spec ``warm_start``), data parallelism (a
    micro-batched graph: micro-batch k on GPU k,
    judged OOM where the replicated state does not fit), the GPipe-style pipeline (the fastest of 2,
    4... stages) and the memory-aware placers, each under the problem's pins and exclusions, judged by
    ``judge``; failed and OOM ones carry a note and no step time."""
    from postplace.placers import PlacementError
    from postplace.placers import place as run_placer

    cm = problem.simulator.problem.cost_model
    c, graph, allowed = problem.cluster, problem.graph, problem.op_allowed
    named: list[tuple[str, np.ndarray | None, str]] = []
    if warm_ops is not None:
        named.append((f"warm-start:{warm_start}", warm_ops, ""))
    if len(set(np.asarray(graph.microbatch).tolist()) - {-1}) >= 2:  # data parallelism needs micro-batches
        from postplace.placers.data_parallel import simulate_data_parallel

        try:
            dp = simulate_data_parallel(graph, c, cost_model=cm, allowed=allowed)
        except PlacementError as exc:
            named.append((OWNER_DP, None, str(exc)))
        else:
            if len(set(dp.placement[np.asarray(graph.microbatch) >= 0].tolist())) < 2:
                named.append((OWNER_DP, None, "fewer than 2 GPUs left for replicas"))
            elif dp.oom:  # its simulated peak is the sharded one: say what replication needs instead
                worst = int(np.argmax(dp.peak_mem - dp.capacity))
                named.append(
                    (
                        OWNER_DP,
                        None,
                        f"OOM: replicated parameters, gradients and optimizer state "
                        f"need {dp.peak_mem[worst] / 1e9:.2f} GB on {dp.gpus[worst]} "
                        f"of {dp.capacity[worst] / 1e9:.2f} GB",
                    )
                )
                named.append((OWNER_DP_SHARDED, dp.placement, ""))
            else:
                named.append((OWNER_DP, dp.placement, ""))
    for name in CANDIDATE_PLACERS:
        if name in QUADRATIC_PLACERS and graph.num_ops > QUADRATIC_PLACER_MAX_OPS:
            named.append(
                (
                    name,
                    None,
                    f"skipped: {graph.num_ops} ops (its time grows with the square of the ops; "
                    f"it runs up to {QUADRATIC_PLACER_MAX_OPS})",
                )
            )
            continue
        try:
            ops = run_placer(name, graph, c, cost_model=cm, allowed=allowed)
        except PlacementError as exc:
            named.append((name, None, str(exc)))
            continue
        if name == "single":
            name = "single:" + c.device_names[int(np.bincount(ops, minlength=c.num_devices).argmax())]
        named.append((name, ops, ""))
    todo = [k for k, (_, ops, _) in enumerate(named) if ops is not None]
    cands: list[Candidate] = []
    if todo:
        res = judge.evaluate_ops(np.stack([named[k][1] for k in todo]))
    for j, k in enumerate(todo):
        name, ops, _ = named[k]
        ok = bool(res.feasible[j])
        note = "" if ok else ("OOM: does not fit" if res.oom[j] else f"failed: {res.reasons[j]}")
        if name == OWNER_DP_SHARDED and ok:
            note = "ZeRO-style: each GPU holds its share of the state and fetches the parameters"
        named[k] = (name, ops, note)
        cands.append(Candidate(name, ops, float(res.step_time[j]) if ok else None, ok, note))
    for name, ops, note in named:
        if ops is None:
            cands.append(Candidate(name, None, None, False, note))
    return cands
