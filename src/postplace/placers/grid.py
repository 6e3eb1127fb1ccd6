"""The practitioner's grid: the 3D plans someone tuning Megatron-LM or torchtitan by hand would try at one
micro-batch count, each simulated; the fastest that fits is the row ``best-3d`` (DESIGN.md section 4c).

At m micro-batches on G GPUs the grid is every (tp, pp, dp) with ``tp x pp x dp = G``, pruned as a
practitioner prunes it:

* tp a power of two that divides the model's heads, within one node (a tensor group never crosses the
  slow links), and only where :func:`postplace.plans.tensor.split_linears` finds layers to split;
* pp at most the model's numbered units (blocks), each pipeline holding at least pp micro-batches
  (``m / dp >= pp``) and dp dividing m; the schedule 1F1B (GPipe's bubble with fewer activations held),
  and interleaved 1F1B with 2 chunks per GPU where the blocks make 2 pp chunks and each pipeline's
  micro-batches are a multiple of pp (Megatron-LM's condition);
* the sharding ``zero1`` (Megatron-LM's distributed optimizer) or ``fsdp`` (torchtitan's FSDP2) under
  model parallelism, pipelines with ``zero1`` only (FSDP's gathers and a schedule's order conflict in
  :mod:`postplace.placers.practitioner`: not built); without model parallelism, the plain plans ``place``
  already weighs (``ddp``, ``zero2``, ``fsdp``, each with and without recomputation) stand in for the
  tp 1 x pp 1 corner;
* with tp, sequence parallelism (``sp``: Megatron-LM's ``--sequence-parallel``, torchtitan's default) and
  without, every shape without first;
* recomputation only where the plan does not fit without it (a practitioner turns it on to fit, since it
  costs a third more compute): first torchtitan's selective op rule (``+selective``, which keeps half the
  matrix products and the attention outputs, so recomputes less; not where it saves nothing, as on GPT-2,
  whose products are ``addmm`` and ``bmm``), then every block whole (``+recompute``), as the layered grid
  (:mod:`postplace.placers.layered_grid`) tries them.

The grid is tried in order of model parallelism (least first, tp before pp at equal width), as far as
``work`` allows (a count of op x GPU simulations, not a time, so an answer does not depend on the
machine's speed); what was pruned or left out is said in the notes.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np

from postplace.errors import PostplaceError

__all__ = ["GRID_LEVELS", "GridResult", "best_3d", "grid_specs", "groups_within_nodes", "node_size"]

GRID_LEVELS = ("zero1", "fsdp")


@dataclass
class GridResult:
    """The grid at one micro-batch count: its best plan that fits (None: none fits), every plan tried with
    its step time (None: out of memory or refused), and what was pruned or left out."""

    best: object | None
    tried: list[tuple[str, float | None]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def node_size(cluster, gpus: list[int]) -> int:
    """How many of ``gpus`` share the first one's fastest links (its node): 1 when it has none faster.

    A tensor-parallel group stays within this many neighbouring GPUs."""
    if len(gpus) < 2:
        return len(gpus)
    bw = np.minimum(cluster.bandwidth, cluster.bandwidth.T)
    row = bw[gpus[0], gpus[1:]]
    return 1 + int(np.sum(row >= row.max()))


def groups_within_nodes(cluster, gpus: list[int], t: int) -> bool:
    """Every tensor group of ``t`` neighbouring GPUs of ``gpus`` is joined by links as fast as the fastest each
    of its GPUs has to any GPU of the cluster: its node's (after ``--exclude`` a group may straddle two nodes
    even when ``t`` fits one; nodes of different GPU generations each have their own fastest links)."""
    if t < 2:
        return True
    bw = np.minimum(cluster.bandwidth, cluster.bandwidth.T)
    every = np.asarray([d for d, dev in enumerate(cluster.devices) if dev.kind == "gpu"], dtype=np.int64)
    fastest = {  # each GPU's fastest link to any other GPU of the cluster (an excluded neighbour's too)
        int(d): float(np.delete(bw[d, every], np.flatnonzero(every == d)).max(initial=0.0)) for d in every
    }
    idx = np.asarray(gpus, dtype=np.int64)
    for k in range(0, len(idx) - t + 1, t):
        group = idx[k : k + t]
        block = bw[np.ix_(group, group)][~np.eye(t, dtype=bool)]
        if block.min() < max(fastest.get(int(d), 0.0) for d in group):
            return False
    return True


def grid_specs(graph, cluster, gpus: list[int], microbatches: int, *, blocks: int | None = None):
    """``(specs, notes)``: the grid's model-parallel plans at ``microbatches`` on ``gpus``, in the order
    they are tried, and what the practitioner's rules pruned. ``blocks``: the model's block count when
    ``graph`` was traced with fewer (:mod:`postplace.placers.layered`)."""
    from postplace.plans import PlanSpec
    from postplace.plans._step import numbered_units
    from postplace.plans.tensor import split_linears

    G, m = len(gpus), microbatches
    config = (graph.metadata.get("zoo") or {}).get("config") or {}
    heads = [int(config[k]) for k in ("heads", "kv_heads") if config.get(k)]
    node = node_size(cluster, gpus)
    splits = bool(split_linears(graph)[0])
    blocks = blocks or len(numbered_units(graph))
    notes = []
    if not splits:
        notes.append("tp: no linear layers to split")
    tps = [
        t
        for t in (2**k for k in range(8))
        if t <= node
        and G % t == 0
        and all(h % t == 0 for h in heads)
        and (t == 1 or splits)
        and groups_within_nodes(cluster, gpus, t)
    ]
    shapes, skipped = [], 0
    for tp in tps:
        for pp in (p for p in range(1, G // tp + 1) if (G // tp) % p == 0 and p <= max(blocks, 1)):
            dp = G // (tp * pp)
            if tp * pp == 1:
                continue
            if m % dp or (pp > 1 and m // dp < pp):
                skipped += 1
                continue
            shapes.append((tp * pp, -tp, tp, pp, dp))
    if skipped:
        notes.append(f"{skipped} shapes need dp to divide m={m} and m/dp >= pp")
    if any(pp > 1 for *_, pp, _ in shapes):
        notes.append("pipelines with zero1 only (FSDP's gathers conflict with a schedule's order: not built)")
    specs = []
    for _, _, tp, pp, dp in sorted(shapes):
        schedules = [None] if pp == 1 else ["1f1b"]
        if pp > 1 and blocks >= 2 * pp and (m // dp) % pp == 0:  # Megatron-LM's virtual stages, 2 per GPU
            schedules.append("interleaved-2")
        shape = [
            PlanSpec(
                level,
                microbatches=m,
                replicas=dp,
                pipeline=pp if pp > 1 else None,
                schedule=schedule,
                tensor=tp if tp > 1 else None,
            )
            for schedule in schedules
            for level in GRID_LEVELS
            if pp == 1 or level == "zero1"
        ]
        specs += shape
    # Megatron-LM's --sequence-parallel (torchtitan's default with tp) beside plain tp: it holds less and
    # computes the norms once per group, and gathers again in the backward; after every plain shape, so that
    # a work budget spends itself on the shapes first
    specs += [replace(spec, sequence=True) for spec in specs if spec.tensor]
    return specs, notes


def best_3d(graph, cluster, gpus: list[int], *, plain=(), pins=(), cost_model=None, work: float = np.inf) -> GridResult:
    """The grid at ``graph``'s micro-batch count on ``gpus`` (see the module docstring).

    Parameters
    ----------
    graph : OpGraph
        The step traced at the grid's micro-batch count.
    cluster : Cluster
    gpus : list of int
        The GPUs the plans run on (all of them: dp x tp x pp = their count).
    plain : sequence of PlanResult
        The plain plans already simulated at this count (the tp 1 x pp 1 corner).
    pins, cost_model
        As :func:`postplace.placers.practitioner.plan_step` takes them.
    work : float
        Op x GPU simulations the grid may spend; the rest of the grid is left out with a note.
    """

    from postplace.placers.practitioner import plan_step
    from postplace.plans._step import microbatch_count
    from postplace.plans.recompute import selective_saves

    specs, notes = grid_specs(graph, cluster, gpus, microbatch_count(graph))
    out = GridResult(None, [(p.plan, None if p.oom else p.step_time_s) for p in plain], notes)
    fits = [p for p in plain if not p.oom]

    spent, left, schedule = 0.0, 0, "1f1b"
    # the selective rule saves nothing on a model without its matrix products or attention kernels (GPT-2's
    # addmm and bmm): there it is full recomputation by another name, not worth a simulation
    saves = bool(selective_saves(graph))

    def simulate(spec):
        """The plan simulated (or its error line), its work counted."""
        nonlocal spent
        spent += graph.num_ops * len(gpus) * (2 if spec.recompute else 1)
        try:
            return plan_step(graph, cluster, spec, gpus, pins=pins, cost_model=cost_model), None
        except PostplaceError as exc:
            return None, str(exc)

    for spec in specs:
        if spent >= work:
            left += 1
            continue
        if schedule == "gpipe" and (spec.schedule or "").startswith("interleaved"):
            continue  # stages that do not chain: no 1F1B of any kind
        selective = [replace(spec, recompute=True, selective=True)] if saves else []
        for attempt in (spec, *selective, replace(spec, recompute=True)):
            if attempt.pipeline and schedule == "gpipe":
                attempt = replace(attempt, schedule=schedule)
            r, error = simulate(attempt)
            if error and schedule == "1f1b" and "do not form a chain" in error:  # a tied embedding and head
                schedule = "gpipe"
                out.notes.append(
                    "1F1B refused (the stages do not form a chain: a weight read at several depths, "
                    "as a tied embedding and head); the pipelines run GPipe"
                )
                attempt = replace(attempt, schedule=schedule)
                r, error = simulate(attempt)
            out.tried.append((str(attempt), None if r is None or r.oom else r.step_time_s))
            if error and attempt.selective:
                continue  # the selective rule's own refusal: recomputing every block may still go
            if error:
                out.notes.append(f"{attempt}: {error}")
                break
            if not r.oom:
                fits.append(r)
                break
    if left:
        out.notes.append(f"{left} plans left out (work budget); benchmarks/plans_3d.py tries the whole grid")
    out.best = min(fits, key=lambda r: r.step_time_s) if fits else None
    return out
