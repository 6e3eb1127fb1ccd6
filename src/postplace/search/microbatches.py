"""Search over the number of micro-batches: one placement search per (m, colocation mode), best of all.

A step traced as m micro-batches (``from_torch(..., microbatches=m)``) is a different graph for the
same global batch, so step times of its placements compare directly with the m = 1 placement's:
a pipeline (a layer's micro-batches on one device, successive layers on successive devices) and data
parallelism (micro-batch i on device i) are placements of the m-graph. :func:`search_microbatches`
tries every m of ``ms`` that divides the batch, under each colocation mode of ``colocations`` (m = 1
has one), splits the sample budget evenly between the candidates, runs the same strategy on each
through the simulator, and returns the best feasible plan with its m and mode, beside every
candidate's own result. It takes a graph factory, so callers decide where graphs come from (the
zoo's cache: :func:`postplace.zoo.graph_factory`; a user's model: a closure over ``from_torch``).

Example::

    plan = search_microbatches(graph_factory("gpt2"), load_cluster("k80x4"), batch=8, budget=9600)
    plan.m, plan.colocation, plan.step_time, plan.placement_map()
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from postplace.cluster import Cluster
from postplace.cost import CostModel
from postplace.errors import PostplaceError
from postplace.graph import OpGraph
from postplace.search.problem import make_problem
from postplace.search.runner import Budget, run

__all__ = [
    "Candidate",
    "MicrobatchPlan",
    "data_parallel_placement",
    "microbatch_candidates",
    "search_microbatches",
]

GraphFactory = Callable[[int, str], OpGraph]


@dataclass
class Candidate:
    """One (m, colocation) search: its best feasible step time (inf: none found) and op placement."""

    m: int
    colocation: str
    step_time: float
    placement: np.ndarray | None  #: op-level device ids of the best placement, or None
    peak_memory: float | None
    samples: int
    lower_bound: float
    num_ops: int
    wall_time_s: float
    graph: OpGraph | None = field(default=None, repr=False)


@dataclass
class MicrobatchPlan:
    """The best candidate (``best``; None when no candidate found a feasible placement) and all of them."""

    best: Candidate | None
    candidates: list[Candidate]
    device_names: tuple[str, ...] = ()

    @property
    def m(self) -> int | None:
        return self.best.m if self.best else None

    @property
    def colocation(self) -> str | None:
        return self.best.colocation if self.best else None

    @property
    def step_time(self) -> float:
        return self.best.step_time if self.best else float("inf")

    def placement_map(self) -> dict[str, str] | None:
        """``{op name: device name}`` of the best plan (the format ``placement.json`` uses)."""
        if self.best is None or self.best.graph is None:
            return None
        return {n: self.device_names[d] for n, d in zip(self.best.graph.names, self.best.placement, strict=True)}


def microbatch_candidates(batch: int, ms: Sequence[int] = (1, 2, 4, 8), colocations: Sequence[str] = ("none",)):
    """``(m, colocation)`` pairs to try: every m of ``ms`` dividing ``batch``; m = 1 once (no mode)."""
    out = []
    for m in ms:
        if m < 1:
            raise PostplaceError(f"micro-batch counts must be >= 1, got {m}")
        if batch % m:
            continue
        for c in colocations if m > 1 else ("none",):
            if (m, c) not in out:
                out.append((m, c))
    if not out:
        raise PostplaceError(f"no micro-batch count of {list(ms)} divides the batch of {batch}")
    return out


def search_microbatches(
    graph_for: GraphFactory,
    cluster: Cluster,
    *,
    batch: int,
    ms: Sequence[int] = (1, 2, 4, 8),
    colocations: Sequence[str] = ("none",),
    budget: int = 2400,
    strategy: str = "post",
    seed: int = 0,
    groups: int | None = 256,
    cost_model: CostModel | None = None,
    progress: Callable[[Candidate], None] | None = None,
    warm_start: bool = False,
) -> MicrobatchPlan:
    """Search every candidate (see :func:`microbatch_candidates`) with ``budget // candidates``
    samples each and return the best feasible plan over all (module docstring).

    ``graph_for(m, colocation)`` gives the step traced as m micro-batches; ``progress`` is called
    with each candidate as it finishes; ``warm_start=True`` seeds each search of m > 1 under
    colocation ``none`` with :func:`data_parallel_placement` (its first sample; off by default, like
    ``--warm-start``, so a plan found on its own stays apart from a seeded one).
    """
    from postplace.search import make_strategy

    cands = microbatch_candidates(batch, ms, colocations)
    per = budget // len(cands)
    if per < 1:
        raise PostplaceError(f"a budget of {budget} samples cannot be split over {len(cands)} candidates")
    results: list[Candidate] = []
    for m, coloc in cands:
        t0 = time.perf_counter()
        graph = graph_for(m, coloc)
        problem = make_problem(graph, cluster, groups=groups, cost_model=cost_model, seed=seed)
        seed_placement = None
        if warm_start and m > 1 and coloc == "none":
            seed_placement = problem.grouping.collapse(data_parallel_placement(graph, cluster))
        r = run(make_strategy(strategy, problem.space, seed=seed), problem.simulator, Budget(samples=per),
                warm_start=seed_placement)  # fmt: skip
        ops, peak = None, None
        if r.best_placement is not None:
            ops = problem.grouping.expand(r.best_placement)
            peak = float(problem.simulator.evaluate_ops(ops[None]).peak_mem[0].max())
        step = r.best_step_time if ops is not None else float("inf")
        c = Candidate(m, coloc, step, ops, peak, r.samples, problem.simulator.lower_bound, graph.num_ops,
                      time.perf_counter() - t0, graph)  # fmt: skip
        results.append(c)
        if progress is not None:
            progress(c)
    feasible = [c for c in results if c.placement is not None]
    best = min(feasible, key=lambda c: (c.step_time, c.m)) if feasible else None
    for c in results:  # keep only the winner's graph alive
        if c is not best:
            c.graph = None
    return MicrobatchPlan(best, results, tuple(cluster.device_names))


def data_parallel_placement(graph: OpGraph, cluster: Cluster) -> np.ndarray:
    """Data parallelism as a placement of a micro-batched step: micro-batch k on GPU ``k % #GPUs``,
    each parameter with its gradient sums and update on one GPU, parameters dealt out greedily to the
    GPU holding the fewest parameter bytes (a sharded parameter server: every GPU sums and updates its
    share, so no single port carries every gradient). Ops that may not run on a GPU go to the first
    CPU. Op-level device ids; colocation sets stay whole.

    The placement a search would have to find for data parallelism; also a warm start for one.
    """
    from postplace.cluster.placement import colocation_representative, effective_kinds
    from postplace.graph.opgraph import KIND_BITS

    gpus = [d for d in range(cluster.num_devices) if cluster.devices[d].kind == "gpu"]
    if not gpus:
        raise PostplaceError(f"data_parallel_placement: cluster '{cluster.name}' has no GPU")
    cpus = [d for d in range(cluster.num_devices) if cluster.devices[d].kind == "cpu"]
    rep = colocation_representative(graph)
    kinds = effective_kinds(graph)
    mb = graph.microbatch
    dev = np.full(graph.num_ops, -1, dtype=np.int64)
    unit_mb: dict[int, int] = {}
    for i in range(graph.num_ops):  # a unit with any micro-batch op goes with the first such op
        if mb[i] >= 0:
            unit_mb.setdefault(int(rep[i]), int(mb[i]))
    load = dict.fromkeys(gpus, 0.0)
    unit_dev: dict[int, int] = {}
    for i in range(graph.num_ops):
        r = int(rep[i])
        if r not in unit_dev:
            if not kinds[i] & KIND_BITS["gpu"]:
                unit_dev[r] = cpus[0] if cpus else gpus[0]
            elif r in unit_mb:
                unit_dev[r] = gpus[unit_mb[r] % len(gpus)]
            else:
                d = min(gpus, key=lambda g: (load[g], g))
                unit_dev[r] = d
        dev[i] = unit_dev[r]
        if r not in unit_mb:
            load[dev[i]] += float(graph.persistent_bytes[i])
    return dev
