"""Post (or any strategy) over a 3D plan's per-block choices, each plan priced by the layered estimate.

The practitioner's grid (:mod:`postplace.placers.layered_grid`) chooses a plan's shape: dp x tp x pp, the
micro-batch count, the ZeRO level, the schedule. What it sets uniformly is where Post's per-layer policy
has room: which blocks recompute (a 1F1B pipeline's first stage holds pp micro-batches' activations, its
last one; the grid recomputes the same first k blocks on every stage), and where the stages are cut (the
embedding and the head make the end stages uneven; the grid balances time alone). A *layered space* is
those choices around one plan of the grid, its *base*, as the decisions of a
:class:`postplace.search.SearchSpace`, so every strategy of :mod:`postplace.search` (Post, its ablations,
local moves, random search, annealing) searches it through the same runner:

- one decision per block: column 0 its base setting (recomputed or not), column 1 the other;
- with a pipeline of one chunk per GPU, one decision per stage boundary: column j moves it by the j-th of
  0, -1, +1, -2, +2, ... blocks (up to ``reach``, kept small enough that every combination leaves every
  stage a block: no sample is infeasible by construction);
- a tensor degree per block is not a choice: Megatron-LM and torchtitan keep one degree through the
  blocks, and so does the base; the sharding level is the base's (per-block FSDP/DDP hybrids are priced
  op by op only).

So the row of zeros is the base, and a prior anchored on column 0 (``init="speed"``: column 0 is the
*fastest device*, unit_time 1 against 2) starts Post at the grid's plan. Every decoded plan is a
:class:`postplace.plans.PlanSpec` (``recompute=U/U``, ``stages=B/B``), which ``simulate --plan`` prices
again and a user launches. :class:`LayeredEvaluator` is the evaluator; :func:`search_plan` runs a strategy.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from postplace.errors import PostplaceError
from postplace.placers.layered import LayeredResult, UnitCosts, estimate_plan, mix_recompute
from postplace.plans.schedule import chunks_of
from postplace.search import Budget, SearchResult, SearchSpace, make_strategy, run
from postplace.sim.simulate import EvalResult

__all__ = ["LayeredEvaluator", "LayeredSpace", "PlanSearch", "layered_space", "search_plan"]

_FAILURE_FACTOR = 1e3
"""A plan this many times slower than the base counts as failed: it keeps the space's failing score above
every feasible one without a bound on what the estimate can return."""


def _offsets(reach: int) -> np.ndarray:
    """Column j of a boundary decision: 0, -1, +1, -2, +2, ... up to ``reach`` blocks."""
    return np.array([0] + [s * k for k in range(1, reach + 1) for s in (-1, 1)], dtype=np.int64)


@dataclass(frozen=True, eq=False)
class LayeredSpace:
    """The per-block choices around ``base`` (a plan with its micro-batch count and, in a pipeline, its
    ``stage_blocks``) on ``devices``, priced from ``plain`` and ``full`` (its units measured without and with
    recomputation; ``full`` None: no recompute decisions); ``space`` is what a strategy sees. See the module
    docstring."""

    base: object
    devices: tuple[int, ...]
    plain: UnitCosts
    full: UnitCosts | None
    base_recomputed: np.ndarray
    base_edges: np.ndarray
    reach: int
    space: SearchSpace

    @property
    def blocks(self) -> tuple[str, ...]:
        return self.plain.names[1:-1]

    @property
    def recompute_decisions(self) -> int:
        return len(self.blocks) if self.full is not None else 0

    def decode(self, row) -> object:
        """The plan a row of decisions stands for."""
        row = np.asarray(row, dtype=np.int64)
        rec = self.base_recomputed.copy()
        if self.full is not None:
            rec ^= row[: len(self.blocks)] == 1
        spec = replace(
            self.base,
            recompute=bool(rec.any()),
            recompute_units=None if rec.all() or not rec.any() else tuple(np.array(self.blocks)[rec].tolist()),
        )
        if len(self.base_edges):
            edges = self.base_edges + _offsets(self.reach)[row[self.recompute_decisions :]]
            spec = replace(spec, stage_blocks=tuple(np.diff([0, *edges.tolist(), len(self.blocks)]).tolist()))
        return spec

    def costs_of(self, spec) -> UnitCosts:
        """The unit costs ``spec`` (a decoded plan) is priced on."""
        if not spec.recompute:
            return self.plain
        if spec.recompute_units is None:
            return self.full
        return mix_recompute(self.plain, self.full, spec.recompute_units)


def layered_space(result: LayeredResult, spec, plain: UnitCosts, full: UnitCosts | None, devices, *, reach: int = 4):
    """The :class:`LayeredSpace` around the plan ``spec`` that the layered estimate priced as ``result`` (its
    cut becomes the base's ``stage_blocks``), its units measured as ``plain`` and ``full`` (None: the
    recompute decisions are left out) at the plan's tensor degree; stage boundaries move by at most
    ``reach`` blocks."""
    blocks = plain.names[1:-1]
    if full is not None and (full.names != plain.names or not full.recompute or plain.recompute):
        raise PostplaceError("layered_space: give the same units measured without and with recomputation")
    pp, v = spec.pipeline or 1, chunks_of(spec.schedule or "1f1b") if spec.pipeline else 1
    if spec.recompute and spec.recompute_units is None:
        base_recomputed = np.ones(len(blocks), dtype=bool)
    else:
        base_recomputed = np.isin(np.array(blocks), np.array(spec.recompute_units or (), dtype=object))
    edges = np.zeros(0, dtype=np.int64)
    if pp > 1 and v == 1:
        counts = [sum(u in blocks for u in stage) for stage in result.stage_units]
        spec = replace(spec, stage_blocks=tuple(counts))
        edges = np.cumsum(counts)[:-1].astype(np.int64)
        inner = [(c - 1) // 2 for c in counts[1:-1]]
        reach = max(0, min([reach, counts[0] - 1, counts[-1] - 1, *inner]))
        if reach == 0:
            edges = np.zeros(0, dtype=np.int64)
    rows = (len(blocks) if full is not None else 0) + len(edges)
    if rows == 0:
        raise PostplaceError(f"plan '{spec}': nothing to choose per block (no recompute measured, no stage to cut)")
    width = max(2 if full is not None else 1, 2 * reach + 1 if len(edges) else 1)
    allowed = np.zeros((rows, width), dtype=bool)
    allowed[: rows - len(edges), :2] = True
    allowed[rows - len(edges) :, : 2 * reach + 1] = True
    unit_time = np.where(allowed, 2.0, np.inf)
    unit_time[:, 0] = 1.0  # column 0, the base's choice, is every decision's home (init="speed")
    space = SearchSpace(
        allowed,
        failure_step_time=_FAILURE_FACTOR * result.step_time_s,
        unit_time=unit_time,
        device_names=tuple(f"choice{j}" for j in range(width)),
    )
    return LayeredSpace(spec, tuple(devices), plain, full, base_recomputed, edges, reach, space)


class LayeredEvaluator:
    """Prices rows of a :class:`LayeredSpace`'s decisions by :func:`postplace.placers.layered.estimate_plan`
    (the :class:`postplace.sim.simulate.Evaluator` contract): each stage's peak on each of its GPUs, so the
    runner tells a strategy how far a plan overflows. ``results`` keeps every plan priced, by its text."""

    name = "layered"

    def __init__(self, space: LayeredSpace, cluster):
        self.space, self.cluster = space, cluster
        self.results: dict[str, LayeredResult] = {}
        tp, pp = space.base.tensor or 1, space.base.pipeline or 1
        per_stage = len(space.devices) // pp
        self._stage_of = np.arange(len(space.devices)) // per_stage
        self._where = np.asarray(space.devices, dtype=np.int64)
        del tp

    def evaluate(self, placements: np.ndarray) -> EvalResult:
        n = len(placements)
        step, oom, failed = np.zeros(n), np.zeros(n, dtype=bool), np.zeros(n, dtype=bool)
        peak = np.zeros((n, self.cluster.num_devices))
        reasons: list[str | None] = [None] * n
        for i, row in enumerate(placements):
            spec = self.space.decode(row)
            r = estimate_plan(self.space.costs_of(spec), self.cluster, spec, list(self.space.devices))
            self.results[str(spec)] = r
            step[i], oom[i] = r.step_time_s, r.oom
            peak[i, self._where] = np.asarray(r.stage_peaks)[self._stage_of]
            if not r.step_time_s < self.space.space.failure_step_time:
                failed[i], reasons[i] = True, f"over {_FAILURE_FACTOR:g} times the base plan's step time"
        return EvalResult(step, peak, oom, failed, reasons, self.name)


@dataclass
class PlanSearch:
    """What :func:`search_plan` found: the ``best`` plan that fits (None: none did) with its ``result``,
    the runner's ``search`` (samples, curve, origins), and the strategy's name."""

    best: object | None
    result: LayeredResult | None
    search: SearchResult
    strategy: str


def search_plan(
    space: LayeredSpace,
    cluster,
    *,
    strategy: str = "post",
    samples: int = 1920,
    seed: int = 0,
    config=None,
    progress: bool = False,
) -> PlanSearch:
    """``strategy`` over ``space`` for ``samples`` plans, the base told first (a warm start): a
    :class:`PlanSearch`. Post and its family start anchored on the base (``init="speed"``, see the module
    docstring) unless ``config`` says otherwise."""
    from postplace.search import PostConfig

    if config is None and isinstance(getattr(make_strategy(strategy, space.space), "config", None), PostConfig):
        config = replace(make_strategy(strategy, space.space).config, init="speed")
    chosen = make_strategy(strategy, space.space, seed=seed, config=config)
    evaluator = LayeredEvaluator(space, cluster)
    base = np.zeros(space.space.num_units, dtype=np.int64)
    found = run(chosen, evaluator, Budget(samples=samples), warm_start=base, progress=progress)
    if found.best_placement is None:
        return PlanSearch(None, None, found, chosen.name)
    best = space.decode(found.best_placement)
    return PlanSearch(best, evaluator.results[str(best)], found, chosen.name)
