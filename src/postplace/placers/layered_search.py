"""Post (or any strategy) over a 3D plan's per-block choices, each plan priced by the layered estimate.

The practitioner's grid (:mod:`postplace.placers.layered_grid`) chooses a plan's shape: dp x tp x pp, the
micro-batch count, the ZeRO level, the schedule. What it sets uniformly is where Post's per-layer policy
has room: how each block recomputes (a 1F1B pipeline's first stage holds pp micro-batches' activations, its
last one; the grid recomputes the same first k blocks on every stage, and whole, where torchtitan's selective
op rule keeps the matrix products' outputs and recomputes the cheap ops: more memory for less time), and where
the stages are cut (the embedding and the head make the end stages uneven; the grid balances time alone). A
*layered space* is those choices around one plan of the grid, its *base*, as the decisions of a
:class:`postplace.search.SearchSpace`, so every strategy of :mod:`postplace.search` (Post, its ablations,
local moves, random search, annealing) searches it through the same runner:

- one decision per block: how it recomputes, column 0 its base setting, then the others of not at all,
  whole, and by the selective op rule (those measured);
- with a pipeline of one chunk per GPU, one decision per stage boundary: column j moves it by the j-th of
  0, -1, +1, -2, +2, ... blocks (up to ``reach``, kept small enough that every combination leaves every
  stage a block: no sample is infeasible by construction);
- on GPUs of several models (the base's stages on GPUs of different speeds), one decision per stage of a
  1F1B pipeline instead: its share of the blocks (its base count times one of :data:`SHARES`, the counts then
  scaled to the model's blocks, every stage at least one) and whether all its blocks recompute whole (the
  memory a fast stage's extra blocks need), so a single decision moves blocks from every other stage to
  one, and a stage of fast GPUs can take twice its even share;
- on GPUs of several models, around a plan without a pipeline, one more decision: each GPU model's micro-batch
  size (``mbs=``, :func:`size_options`): every replica runs the same count of micro-batches, so the
  collectives meet, and the fast GPUs take more sequences per micro-batch (neither Megatron-LM nor torchtitan
  offers it, so the grid never does; column 0 is the base's even split), and whether every block recomputes
  (the memory larger micro-batches need: one decision moves the plan to a split that fits, as a stage's
  share does), whole where its own decision does not say the selective rule;
- around a DDP or FSDP plan without a pipeline, whether each block is sharded (FSDP: gathered twice per
  micro-batch, its gradients reduce-scattered every micro-batch, a shard of its state kept) or replicated
  (DDP: its gradients all-reduced once, after the last micro-batch), folded into the block's decision (its
  columns: each recompute rule with the base's sharding, then each with the other), and one decision for the
  root unit (the embedding and the head): a plan ``ddp:shard=root/blocks.0-59`` that shards the blocks memory
  needs sharded and leaves the rest to DDP's one all-reduce (FSDP inside a pipeline is not a plan, so a
  pipeline's base offers none; nor do ZeRO's levels, which shard by their own rule);
- a tensor degree per block is not a choice: Megatron-LM and torchtitan keep one degree through the
  blocks, and so does the base.

So the row of zeros is the base, and a prior anchored on column 0 (``init="speed"``: column 0 is the
*fastest device*, unit_time 1 against 2) starts Post at the grid's plan. Every decoded plan is a
:class:`postplace.plans.PlanSpec` (``recompute=U/U``, ``selective=U/U``, ``stages=B/B``), which
``simulate --plan`` prices again, op by op or layered, and ``launch`` runs.
:class:`LayeredEvaluator` is the evaluator; :func:`search_plan` runs a strategy.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from postplace.errors import PostplaceError
from postplace.placers.layered import LayeredResult, UnitCosts, estimate_plan, plan_costs, sharded_units
from postplace.placers.practitioner import replica_models
from postplace.plans.schedule import chunks_of
from postplace.search import Budget, SearchResult, SearchSpace, make_strategy, run
from postplace.sim.simulate import EvalResult

__all__ = [
    "MAX_SIZE",
    "SHARES",
    "LayeredEvaluator",
    "LayeredSpace",
    "PlanSearch",
    "apportion",
    "layered_space",
    "search_plan",
    "size_options",
    "tidied",
]

MAX_SIZE = 8
"""The most sequences per micro-batch a GPU model's size decision offers (:func:`size_options`)."""

TIDY_SLACK = 1e-3
"""How much slower (relative) the tidy form of a search's best may price and still be returned: a user writes
``recompute=blocks.0-36`` and not ``recompute=blocks.0-9/blocks.11-14/...``, and the blocks' order moves the
estimate by the overlap of a few transfers only."""

_FAILURE_FACTOR = 1e3
"""A plan this many times slower than the base counts as failed: it keeps the space's failing score above
every feasible one without a bound on what the estimate can return."""


SHARES = 1.25 ** np.array([0, -1, 1, -2, 2, -3, 3, -4, 4], dtype=np.float64)
"""Column j of a stage's share decision (GPUs of several models): its base block count times the j-th of 1,
0.8, 1.25, 0.64, 1.5625, ... (0.41 to 2.44), the stages' counts then scaled to the model's blocks."""


def apportion(weights: np.ndarray, total: int) -> np.ndarray:
    """``total`` blocks shared in proportion to ``weights`` (largest remainders), every stage at least one."""
    exact = weights / weights.sum() * total
    counts = np.maximum(1, np.floor(exact).astype(np.int64))
    while counts.sum() < total:
        counts[int(np.argmax(exact - counts))] += 1
    while counts.sum() > total:
        counts[int(np.argmax(np.where(counts > 1, counts - exact, -np.inf)))] -= 1
    return counts


def _offsets(reach: int) -> np.ndarray:
    """Column j of a boundary decision: 0, -1, +1, -2, +2, ... up to ``reach`` blocks."""
    return np.array([0] + [s * k for k in range(1, reach + 1) for s in (-1, 1)], dtype=np.int64)


@dataclass(frozen=True, eq=False)
class LayeredSpace:
    """The per-block choices around ``base`` (a plan with its micro-batch count and, in a pipeline, its
    ``stage_blocks``) on ``devices``, priced from ``measured`` (its units by recomputation rule: ``""`` none,
    ``"full"``, ``"selective"``); ``rule_columns[b]`` are block b's rules, its base's first (one column: no
    recompute decisions); ``space`` is what a strategy sees. See the module docstring."""

    base: object
    devices: tuple[int, ...]
    measured: dict
    rule_columns: tuple[tuple[str, ...], ...]
    base_edges: np.ndarray
    reach: int
    space: SearchSpace
    per_stage: bool = False
    size_options: tuple = ()
    """The size decision's options (the last row; none when empty): ``(m, sizes)``, the micro-batch count and
    each GPU model's sequences per micro-batch (None: the base's even split, column 0); column j is option
    ``j % len``, and from ``j >= len`` on every block recomputes (whole, where its own decision does not say
    the selective rule)."""
    measure_sized: object = None
    """``measure_sized(sizes, rule)``: the units measured on each model at its size, recomputing by ``rule``."""
    base_sharded: tuple[bool, ...] = ()
    """With sharding decisions (a DDP or FSDP base without a pipeline): whether the base shards each block, then
    the root; empty: none."""

    @property
    def blocks(self) -> tuple[str, ...]:
        return self.measured[""].names[1:-1]

    @property
    def recompute_decisions(self) -> int:
        """The per-block decisions (each block's recompute rule and, with sharding decisions, its sharding)."""
        return len(self.blocks) if len(self.rule_columns[0]) > 1 or self.base_sharded else 0

    def decode(self, row) -> object:
        """The plan a row of decisions stands for."""
        row = np.asarray(row, dtype=np.int64)
        k = self.recompute_decisions
        width = len(self.rule_columns[0])
        rules = [cols[row[b] % width if k else 0] for b, cols in enumerate(self.rule_columns)]
        sharded = None
        if self.base_sharded:  # column j >= width flips the block's sharding; the root's own decision after them
            flips = [*(row[:k] >= width), row[k] == 1]
            sharded = [base != flip for base, flip in zip(self.base_sharded, flips, strict=True)]
            k += 1
        counts = None
        if len(self.base_edges):
            counts = np.diff([0, *self.base_edges.tolist(), len(self.blocks)])
            if self.per_stage:  # a stage's share, and whether all its blocks recompute whole
                share, whole = row[k:] % len(SHARES), row[k:] // len(SHARES)
                counts = apportion(counts * SHARES[share], len(self.blocks))
                stage = np.repeat(np.arange(len(counts)), counts)
                rules = ["full" if whole[stage[b]] else r for b, r in enumerate(rules)]
            else:
                counts = np.diff([0, *(self.base_edges + _offsets(self.reach)[row[k:]]).tolist(), len(self.blocks)])
        if self.size_options:  # the last decision: each GPU model's micro-batch size, and whether every block
            # recomputes (the memory a larger micro-batch needs), whole where its own rule is not the selective one
            m, sizes = self.size_options[int(row[-1]) % len(self.size_options)]
            if row[-1] >= len(self.size_options):
                rules = ["selective" if r == "selective" else "full" for r in rules]
        spec = _with_rules(self.base, self.blocks, rules)
        if sharded is not None and tuple(sharded) != self.base_sharded:  # the row of zeros is the base as written
            spec = _with_sharding(spec, self.blocks, sharded)
        if self.size_options:
            spec = replace(spec, microbatches=m, micro_sizes=sizes)
        return spec if counts is None else replace(spec, stage_blocks=tuple(int(c) for c in counts))

    def costs_of(self, spec) -> UnitCosts:
        """The unit costs ``spec`` (a decoded plan) is priced on."""
        if spec.micro_sizes is not None:
            return plan_costs(
                spec,
                lambda recompute, selective=False: self.measure_sized(spec.micro_sizes, _rule(recompute, selective)),
            )
        return plan_costs(spec, lambda recompute, selective=False: self.measured[_rule(recompute, selective)])


def size_options(spec, batch: int, cluster, devices, *, most: int = MAX_SIZE) -> tuple:
    """The size decision's columns around ``spec`` (a plan without a pipeline, its ``microbatches`` given) on
    ``devices`` of several GPU models: ``(m, None)`` (the base) first, then every ``(m, sizes)`` whose replicas,
    each running ``m / dp`` micro-batches of its GPU model's size (1 to ``most`` sequences, not all equal: an
    even split is the grid's), make exactly ``batch`` sequences; empty on GPUs of one model."""
    groups = replica_models(cluster, devices, spec.tensor or 1)
    dp = len(groups)
    if spec.pipeline or any(len(g) > 1 for g in groups):  # a tensor group of two models runs one size
        return ()
    models = [next(iter(g)) for g in groups]
    names = list(dict.fromkeys(models))
    if len(names) < 2:
        return ()
    replicas = np.array([models.count(n) for n in names])
    options = [(spec.microbatches, None)]
    for per in range(1, batch + 1):
        if batch % per:
            continue
        target = batch // per
        for sizes in np.ndindex(*([most] * len(names))):
            s = np.array(sizes) + 1
            if int(replicas @ s) == target and len(set(s.tolist())) > 1:
                options.append((per * dp, tuple((n, int(x)) for n, x in zip(names, s, strict=True))))
    return tuple(options) if len(options) > 1 else ()


def _with_sharding(spec, blocks, sharded):
    """``spec`` sharding the blocks and then the root as the mask ``sharded`` says: ``fsdp`` for all of them,
    ``ddp`` for none, else the base's level with ``shard=`` the units sharded (the root first)."""
    if all(sharded):
        return replace(spec, level="fsdp", shard=None)
    if not any(sharded):
        return replace(spec, level="ddp", shard=None)
    units = ("",) * bool(sharded[-1]) + tuple(b for b, on in zip(blocks, sharded, strict=False) if on)
    return replace(spec, shard=units)


def _rule(recompute: bool, selective: bool) -> str:
    return "" if not recompute else "selective" if selective else "full"


def _with_rules(base, blocks, rules):
    """``base`` recomputing each of ``blocks`` by its rule: the plan's words for it (``+recompute``,
    ``+selective``, ``recompute=U/U``, ``selective=U/U``)."""
    full = tuple(b for b, r in zip(blocks, rules, strict=True) if r == "full")
    picked = tuple(b for b, r in zip(blocks, rules, strict=True) if r == "selective")
    plain = replace(base, recompute=False, recompute_units=None, selective=False, selective_units=None)
    if not full and not picked:
        return plain
    if len(full) == len(blocks) or len(picked) == len(blocks):
        return replace(plain, recompute=True, selective=bool(picked))
    if not full:  # one rule over some blocks: the plan's +selective
        return replace(plain, recompute=True, recompute_units=picked, selective=True)
    return replace(plain, recompute=True, recompute_units=full, selective_units=picked or None)


def layered_space(
    result: LayeredResult,
    spec,
    plain: UnitCosts,
    full: UnitCosts | None,
    devices,
    *,
    selective: UnitCosts | None = None,
    reach: int = 4,
    sizes: tuple = (),
    measure_sized=None,
    sharding: bool = True,
):
    """The :class:`LayeredSpace` around the plan ``spec`` that the layered estimate priced as ``result`` (its
    cut becomes the base's ``stage_blocks``), its units measured as ``plain``, ``full`` and ``selective``
    (recomputing every block whole and by the selective op rule; None: that rule is not a choice) at the
    plan's tensor degree; stage boundaries move by at most ``reach`` blocks (GPUs of one model: ``plain`` measured
    on one), or each stage takes a share of the blocks (:data:`SHARES`) and may recompute them all whole (GPUs of
    several models). ``sizes``: the columns of a size decision (:func:`size_options`), each plan's units measured
    by ``measure_sized(sizes, rule)``; empty: none. ``sharding``: around a DDP or FSDP plan without a
    pipeline, whether each block and the root are sharded is a choice too."""
    blocks = plain.names[1:-1]
    measured = {"": plain, "full": full, "selective": selective}
    for rule, costs in measured.items():
        if costs is not None and (costs.names != plain.names or costs.rules() != dict.fromkeys(blocks, rule)):
            raise PostplaceError(
                "layered_space: give the same units measured without recomputation, recomputing every block "
                "whole, and by the selective op rule"
            )
    base_rules = spec.recompute_rules(blocks)
    if any(measured[r] is None for r in base_rules.values()):
        raise PostplaceError(f"plan '{spec}': its blocks recompute by a rule whose costs were not given")
    available = [r for r in ("", "full", "selective") if measured[r] is not None]
    rule_columns = tuple((base_rules[b], *(r for r in available if r != base_rules[b])) for b in blocks)
    measured = {r: c for r, c in measured.items() if c is not None}
    pp = spec.pipeline or 1
    edges = np.zeros(0, dtype=np.int64)
    per_stage = False
    if pp > 1 and spec.one_chunk_pipeline:  # interleaved cuts the blocks evenly
        counts = [sum(u in blocks for u in stage) for stage in result.stage_units]
        spec = replace(spec, stage_blocks=tuple(counts))
        edges = np.cumsum(counts)[:-1].astype(np.int64)
        # GPUs of several models: each stage's share of the blocks, toward its GPUs' speed, far from the even cut
        per_stage = bool(plain.by_model)
        if not per_stage:
            inner = [(c - 1) // 2 for c in counts[1:-1]]
            reach = max(0, min([reach, counts[0] - 1, counts[-1] - 1, *inner]))
            if reach == 0:
                edges = np.zeros(0, dtype=np.int64)
    choices = len(available)
    base_sharded: tuple[bool, ...] = ()
    replicas = len(devices) // (spec.tensor or 1)
    if sharding and pp == 1 and spec.level in ("ddp", "fsdp") and replicas > 1:  # one replica shards nothing
        mask = sharded_units(spec, plain.names)
        base_sharded = (*(bool(x) for x in mask[1:-1]), bool(mask[0]))
    block_width = choices * (2 if base_sharded else 1)
    stage_rows = pp if per_stage else len(edges)
    stage_width = len(SHARES) * (2 if "full" in available else 1) if per_stage else 2 * reach + 1
    if sizes and (spec.pipeline or measure_sized is None):
        raise PostplaceError(f"plan '{spec}': a size decision needs a plan without a pipeline and measure_sized")
    size_rows = 1 if sizes else 0
    size_width = len(sizes) * (2 if "full" in available else 1)  # each split, then each with every block recomputed
    block_rows = (len(blocks) if block_width > 1 else 0) + bool(base_sharded)  # and the root's sharding
    rows = block_rows + stage_rows + size_rows
    if rows == 0:
        raise PostplaceError(f"plan '{spec}': nothing to choose per block (no recompute measured, no stage to cut)")
    width = max(block_width, stage_width if stage_rows else 1, size_width)
    allowed = np.zeros((rows, width), dtype=bool)
    allowed[: len(blocks) if block_width > 1 else 0, :block_width] = True
    if base_sharded:
        allowed[block_rows - 1, :2] = True
    allowed[rows - stage_rows - size_rows : rows - size_rows, :stage_width] = True
    if size_rows:
        allowed[-1, :size_width] = True
    unit_time = np.where(allowed, 2.0, np.inf)
    unit_time[:, 0] = 1.0  # column 0, the base's choice, is every decision's home (init="speed")
    space = SearchSpace(
        allowed,
        failure_step_time=_FAILURE_FACTOR * result.step_time_s,
        unit_time=unit_time,
        device_names=tuple(f"choice{j}" for j in range(width)),
    )
    return LayeredSpace(
        spec,
        tuple(devices),
        measured,
        rule_columns,
        edges,
        reach,
        space,
        per_stage,
        tuple(sizes),
        measure_sized,
        base_sharded,
    )


class LayeredEvaluator:
    """Prices rows of a :class:`LayeredSpace`'s decisions by :func:`postplace.placers.layered.estimate_plan`
    (the :class:`postplace.sim.simulate.Evaluator` contract): each stage's peak on each of its GPUs, so the
    runner tells a strategy how far a plan overflows. ``results`` keeps every plan priced, by its text."""

    name = "layered"

    def __init__(self, space: LayeredSpace, cluster):
        self.space, self.cluster = space, cluster
        self.results: dict[str, LayeredResult] = {}
        self._where = np.asarray(space.devices, dtype=np.int64)

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
            peak[i, self._where] = r.gpu_peaks
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
    start=None,
) -> PlanSearch:
    """``strategy`` over ``space`` for ``samples`` plans, the base told first (a warm start; ``start``: this
    row of decisions instead, such as an earlier search's best): a :class:`PlanSearch`. Post and its family
    start anchored on the base (``init="speed"``, see the module docstring) unless ``config`` says otherwise."""
    from postplace.search import PostConfig

    if config is None and isinstance(
        default := getattr(make_strategy(strategy, space.space), "config", None), PostConfig
    ):
        config = replace(default, init="speed")
    chosen = make_strategy(strategy, space.space, seed=seed, config=config)
    evaluator = LayeredEvaluator(space, cluster)
    base = np.zeros(space.space.num_units, dtype=np.int64) if start is None else np.asarray(start, dtype=np.int64)
    found = run(chosen, evaluator, Budget(samples=samples), warm_start=base, progress=progress)
    if found.interrupted:  # Ctrl-C: the runner stopped; so does place --layered (no run folder to resume)
        raise KeyboardInterrupt
    if found.best_placement is None:
        return PlanSearch(None, None, found, chosen.name)
    best = space.decode(found.best_placement)
    result = evaluator.results[str(best)]
    tidy = tidied(space, best)
    if tidy != best:  # the same rules in Megatron-LM's order, kept where it fits and prices within 0.1%
        again = estimate_plan(space.costs_of(tidy), cluster, tidy, list(space.devices))
        if not again.oom and again.step_time_s <= result.step_time_s * (1 + TIDY_SLACK):
            best, result = tidy, again
    return PlanSearch(best, result, found, chosen.name)


def tidied(space: LayeredSpace, spec):
    """``spec`` with each stage's recompute rules in Megatron-LM's order: whole first, then selective, then
    none, as ``--recompute-method block`` recomputes a stage's first blocks, and its sharded blocks last.
    Every block of a zoo transformer runs the same ops, so a search's scattered choice
    (``recompute=blocks.1-25/blocks.27-38``) is nearly always worth the same as the tidy one
    (``recompute=blocks.0-36``), which a user can write (:data:`TIDY_SLACK`)."""
    rules = spec.recompute_rules(space.blocks)
    n = len(space.blocks)
    if spec.stage_blocks is not None:
        chunk = np.repeat(np.arange(len(spec.stage_blocks)), spec.stage_blocks)
    else:  # one stage, or interleaved chunks cut evenly (estimate_plan's cut)
        chunks = (spec.pipeline or 1) * (chunks_of(spec.schedule) if spec.pipeline else 1)
        chunk = np.arange(n) * chunks // n
    order = {"full": 0, "selective": 1, "": 2}
    tidy = []
    for c in range(int(chunk.max()) + 1):
        tidy += sorted((rules[b] for b, k in zip(space.blocks, chunk, strict=True) if k == c), key=order.__getitem__)
    out = _with_rules(spec, space.blocks, tidy)
    if spec.shard:  # the last blocks sharded: a first block left to DDP spares each forward's unhidden gather
        sharded = sharded_units(spec, space.measured[""].names)
        first = len(space.blocks) - int(sharded[1:-1].sum())
        out = _with_sharding(out, space.blocks, [*(b >= first for b in range(len(space.blocks))), bool(sharded[0])])
    return out
