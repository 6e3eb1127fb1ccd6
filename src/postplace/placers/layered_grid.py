"""The practitioner's grid priced by the layered estimate (:mod:`postplace.placers.layered`): every plan of
:func:`postplace.placers.grid.grid_specs` and the plain ones at a size the op level cannot hold; where a plan
does not fit without recomputation, torchtitan's selective op checkpointing of every block and full
recomputation, then the fewest blocks per stage that fit (Megatron-LM's ``--recompute-method block
--recompute-num-layers k``)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace

from postplace.errors import PostplaceError
from postplace.placers.layered import (
    POST,
    PRE,
    LayeredResult,
    UnitCosts,
    estimate_plan,
    measured_rule,
    mix_recompute,
)
from postplace.plans import parse_plan

__all__ = ["LayeredGrid", "fewest_recomputed", "layered_grid"]


def fewest_recomputed(plain: UnitCosts, full: UnitCosts, cluster, spec, devices, cut):
    """The plan ``spec`` recomputing the first k blocks of every chunk of ``cut`` (Megatron-LM's
    ``--recompute-method block``) for the smallest k that fits, or None when only every block does: a
    :class:`LayeredResult`, with the number of plans priced. More recomputed blocks hold fewer activations, so
    k is found by halving."""
    blocks_of = [[u for u in chunk if u not in (PRE, POST)] for chunk in cut]
    if spec.one_chunk_pipeline:  # the cut in the plan's text, which
        spec = replace(spec, stage_blocks=tuple(len(b) for b in blocks_of))  # the mixed costs would cut anew
    lo, hi, found, priced = 1, max(len(b) for b in blocks_of) - 1, None, 0
    while lo <= hi:
        k = (lo + hi) // 2
        units = tuple(u for b in blocks_of for u in b[:k])
        attempt = replace(spec, recompute=True, recompute_units=units)
        r = estimate_plan(mix_recompute(plain, full, units), cluster, attempt, devices, cut=cut)
        priced += 1
        if r.oom:
            lo = k + 1
        else:
            found, hi = r, k - 1
    return found, priced


def _with_cut(result: LayeredResult) -> LayeredResult:
    """``result`` whose plan text names its pipeline's cut (``stages=``), so the text prices to the same plan on
    the op level and on the layered estimate whatever GPUs it runs on."""
    spec = parse_plan(result.plan)
    if not spec.one_chunk_pipeline or spec.stage_blocks is not None:
        return result
    counts = tuple(sum(u not in (PRE, POST) for u in stage) for stage in result.stage_units)
    return replace(result, plan=str(replace(spec, stage_blocks=counts)))


@dataclass
class LayeredGrid:
    """The practitioner's grid priced by the layered estimate: its ``best`` plan that fits (None: none
    does), every plan ``tried`` with its result, the ``notes`` of what was pruned, the seconds spent
    measuring units and pricing plans, how many plans were priced (``tried`` and the halving's steps), and the
    units measured, by (tensor degree, sequence parallelism, recompute rule: ``""``, ``"full"``, ``"selective"``),
    each repeated to the model's depth."""

    best: LayeredResult | None
    tried: list[LayeredResult]
    notes: list[str]
    measure_s: float
    price_s: float
    priced: int = 0
    costs: dict[tuple[int, bool, str], UnitCosts] = field(default_factory=dict)


def layered_grid(
    graph, cluster, gpus: list[int], microbatches: int, *, layers: int | None = None, cost_model=None, progress=None
) -> LayeredGrid:
    """Every plan of the practitioner's grid (:func:`postplace.placers.grid.grid_specs`) and the plain ones
    (``ddp``, ``zero1``, ``zero2``, ``fsdp``) at ``microbatches`` on ``gpus``, priced by the layered
    estimate; each first without recomputation, then, where it does not fit, with torchtitan's selective op
    checkpointing of every block and with full recomputation (the fewest blocks per stage that fit, when
    every block fits): a practitioner turns them on to fit, and keeps the faster. ``graph`` is the step
    traced as two micro-batches of the plan's size, ``layers`` the model's block count when it was traced
    with fewer. ``progress(line)`` hears each plan."""
    from postplace.placers.grid import grid_specs
    from postplace.plans import PlanSpec
    from postplace.plans._step import numbered_units, tied_embedding

    specs, notes = grid_specs(graph, cluster, gpus, microbatches, blocks=layers or len(numbered_units(graph)))
    plain = []
    if microbatches % len(gpus):
        notes.append(f"plain plans need m={microbatches} to be a multiple of the {len(gpus)} GPUs")
    else:
        plain = [PlanSpec(level, microbatches=microbatches) for level in ("ddp", "zero1", "zero2", "fsdp")]
    costs: dict[tuple[int, bool, str], UnitCosts] = {}
    measure_s = price_s = 0.0
    priced = 0
    tried: list[LayeredResult] = []

    def costs_at(spec, rule: str) -> UnitCosts:
        nonlocal measure_s
        key = (spec.tensor or 1, spec.sequence, rule)
        if key not in costs:
            t0 = time.perf_counter()
            costs[key] = measured_rule(
                graph, cluster, gpus, rule, tensor=key[0], sequence=key[1], layers=layers, cost_model=cost_model
            )
            measure_s += time.perf_counter() - t0
        return costs[key]

    tied = tied_embedding(graph)  # GPT-2: 1F1B's stages do not chain; its pipelines run GPipe, as the op grid's do
    if tied and any(s.pipeline for s in specs):
        notes.append(
            "1F1B refused (the stages do not form a chain: the embedding's table is the head's too); the pipelines "
            "run GPipe, interleaved ones are left out"
        )
        specs = [
            replace(s, schedule="gpipe") if s.pipeline else s
            for s in specs
            if not (s.pipeline and (s.schedule or "").startswith("interleaved"))
        ]
        specs = list({str(s): s for s in specs}.values())
    for spec in plain + specs:
        attempts = (spec, replace(spec, recompute=True, selective=True), replace(spec, recompute=True))
        for attempt, rule in zip(attempts, ("", "selective", "full"), strict=True):
            t0, measured_before = time.perf_counter(), measure_s
            devices = gpus[: len(gpus) // attempt.model_parallel * attempt.model_parallel]
            try:
                r = estimate_plan(costs_at(attempt, rule), cluster, attempt, devices)
                # recomputing every block fits and none does not: the fewest blocks per stage that fit
                priced += 1
                partial = None
                if rule == "full" and not r.oom:
                    partial, steps = fewest_recomputed(
                        costs_at(attempt, ""), costs_at(attempt, "full"), cluster, attempt, devices, r.stage_units
                    )
                    priced += steps
            except PostplaceError as exc:
                notes.append(f"{attempt}: {exc}")
                break
            finally:  # pricing only: a first measurement at this tp is the measuring's
                price_s += time.perf_counter() - t0 - (measure_s - measured_before)
            for x in (r, partial) if partial else (r,):
                x = _with_cut(x)
                tried.append(x)
                if progress:
                    progress(
                        f"{x.plan}: {x.step_time_s:.4g} s, {x.peak_bytes / 2**30:.1f} GiB{' OOM' if x.oom else ''}"
                    )
            if not r.oom and not rule:  # fits as it is: nothing to recompute
                break
    fits = [r for r in tried if not r.oom]
    best = min(fits, key=lambda r: r.step_time_s) if fits else None
    return LayeredGrid(best, tried, notes, measure_s, price_s, priced, costs)
