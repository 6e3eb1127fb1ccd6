"""``place --layered``: the answer for a zoo transformer at a size the op level cannot hold (LLaMA-70B on 64
GPUs at a 1M-token batch), every plan priced by the layered estimate (:mod:`postplace.placers.layered`).

Per micro-batch size (one sequence, and two where the batch allows): the step traced as two micro-batches of
a few blocks, the practitioner's grid on it (:func:`postplace.placers.layered_grid.layered_grid`: its best is
``best-3d``, its plain plans the data-parallel family's rows), then a strategy (Post by default) over the
per-block choices around the grid's fastest shapes (:mod:`postplace.placers.layered_search`: how each block
recomputes, not at all, whole or by torchtitan's selective op rule; where the stages are cut; on GPUs of several
models, also around the fastest plan without a pipeline at each tensor degree, each model's micro-batch size,
``mbs=``). The answer is
the fastest plan that fits among them, named as ``place`` names its candidates; every number is the layered
estimate's (simulated prices), and it says so.
"""

from __future__ import annotations

import functools
import json
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import numpy as np

from postplace.errors import PostplaceError

__all__ = [
    "LayeredCandidate",
    "LayeredComparison",
    "LayeredPlaceResult",
    "compare_layered",
    "pair_tracer",
    "place_layered",
    "traced_pair",
    "zoo_blocks",
]

EVALUATOR = "layered estimate (units measured on a few blocks, repeated; one replica's pipeline)"


@dataclass
class LayeredCandidate:
    """One plan ``place_layered`` considered: its row name (``search``, ``best-3d``, ``ddp``, ``fsdp+recompute``),
    the plan in ``simulate --plan``'s words and in a user's, and the layered estimate's step time and largest
    per-GPU peak (None, None and ``fits`` False where nothing of that row fits)."""

    name: str
    plan: str | None
    words: str
    step_time_s: float | None
    peak_bytes: float | None
    fits: bool


@dataclass
class LayeredPlaceResult:
    """What :func:`place_layered` returns: the answer, every candidate, and each search's record.

    Parameters
    ----------
    target, cluster : str
        The model (``llama 70b@256``) and the cluster's name.
    gpus, batch : int
        The GPUs the plans may use, the global batch in sequences.
    plan, words : str
        The answer in ``simulate --plan``'s words (None when nothing fits) and in a user's.
    returned : str
        The candidate it is (``search``, ``best-3d``, ``fsdp+recompute``...); None when nothing fits.
    step_time_s, peak_bytes, tokens_per_s_per_gpu : float
        The layered estimate's step time and largest per-GPU peak of the answer, and its throughput.
    candidates : list of LayeredCandidate
        Every row, in the order ``place --layered`` prints them.
    searches : list of dict
        Per base plan searched around: its plan and time, the best found, samples, new bests by origin, seconds.
    notes : list of str
        What the grids pruned.
    timing : dict
        Seconds tracing, measuring units, pricing the grid, searching, and in all (``wall_s``).
    """

    target: str
    cluster: str
    gpus: int
    batch: int
    plan: str | None
    words: str
    returned: str | None
    step_time_s: float | None
    peak_bytes: float | None
    tokens_per_s_per_gpu: float | None
    candidates: list[LayeredCandidate]
    searches: list[dict]
    notes: list[str]
    timing: dict = field(default_factory=dict)

    @property
    def summary(self) -> dict:
        out = asdict(self)
        out["evaluator"] = EVALUATOR
        return out


def zoo_blocks(target: str, size: str) -> tuple[dict, int, int]:
    """The zoo config of ``target`` at ``size``, its block count and batch; one error line where the layered
    estimate cannot take it (not a zoo model, no blocks)."""
    from postplace import zoo

    if not isinstance(target, str) or target not in zoo.MODELS:
        raise PostplaceError(
            f"the layered estimate traces a zoo transformer again at its own depth; '{target}' is not one "
            f"(zoo models: {', '.join(zoo.MODELS)}); time it op by op"
        )
    config = zoo.spec(target).config(size)
    layers = config.get("layers")
    if not layers:
        raise PostplaceError(f"the layered estimate needs a model made of blocks; '{target}' has no 'layers'")
    return config, int(layers), int(config["batch"])


def traced_pair(target: str, size: str, batch: int, m: int, optimizer, lr, precision: str, blocks: int):
    """The step of ``target`` traced as two micro-batches of a plan's size (``batch / m`` sequences) with
    ``blocks`` blocks, on the meta device: what the layered estimate measures."""
    from postplace import zoo

    return zoo.trace_model(
        target,
        f"{zoo.base_size(size)}@{2 * (batch // m)}",
        optimizer,
        lr=lr,
        precision=precision,
        microbatches=2,
        init=False,
        layers=blocks,
    ).graph


def pair_tracer(target: str, size: str, optimizer, lr, precision: str, blocks: int):
    """``at(n)``: the step traced as two micro-batches of n sequences (:func:`traced_pair`), each size once: a plan
    giving each GPU model its own micro-batch size (``mbs=``) is measured at each."""
    return functools.cache(lambda n: traced_pair(target, size, 2 * n, 2, optimizer, lr, precision, blocks))


def place_layered(
    target: str,
    cluster,
    *,
    size: str = "full",
    optimizer="sgd",
    lr: float | None = None,
    precision: str = "fp32",
    strategy: str = "post",
    samples: int = 2400,
    seed: int = 0,
    microbatches: int | None = None,
    bases: int = 3,
    exclude=(),
    cost_model=None,
    out: str | Path | None = None,
    progress=None,
) -> LayeredPlaceResult:
    """The fastest plan that fits a zoo transformer on ``cluster``, every plan priced by the layered estimate.

    See the module docstring; ``size`` carries the batch (``"70b@256"``).

    Parameters
    ----------
    target, size : str
        A zoo model with blocks (``llama``, ``gpt2``) and its size, ``@B`` for a batch of B sequences.
    optimizer, lr, precision
        The step's optimizer, its learning rate (None: the optimizer's default) and precision (``place``'s
        defaults; such models train with ``"adamw"`` and ``"bf16"``).
    strategy : str
        The strategy over the per-block choices (any of :func:`postplace.search.make_strategy`'s).
    samples : int
        Plans it prices in all, shared evenly around the grid's ``bases`` fastest shapes (the fastest by the
        grid is not always the one with the most room: at 70B the second is) and, on GPUs of several models,
        its fastest 1F1B pipeline.
    microbatches : int, optional
        The micro-batch count; None: one sequence per micro-batch, and two where the batch allows.
    exclude : sequence of str
        GPUs the plans may not use.
    out : path, optional
        A folder to write ``layered.json`` (the summary) into.
    progress : callable, optional
        Hears one line per stage of the work.

    Returns
    -------
    LayeredPlaceResult

    Examples
    --------
    >>> r = place_layered("llama", "dgx8", size="small@16", samples=24, bases=1)
    >>> r.returned in [c.name for c in r.candidates], r.step_time_s <= r.candidates[1].step_time_s
    (True, True)
    """
    from postplace.search import STRATEGIES, make_strategy

    say = progress or (lambda line: None)
    if not isinstance(samples, int) or isinstance(samples, bool) or samples < 1:
        raise PostplaceError(f"samples={samples!r}: give a positive number of plans to price")
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise PostplaceError(f"seed {seed!r}: give an integer >= 0")
    if strategy not in STRATEGIES:
        make_strategy(strategy, None)  # an unknown name is one line, before anything is traced
    t0 = time.perf_counter()
    grid = _grid_and_spaces(
        target, cluster, size, optimizer, lr, precision, microbatches, bases, exclude, cost_model, samples, say
    )
    t = time.perf_counter()
    searches, best_search = _search(grid, strategy, seed, say)
    grid.timing["search_s"] = time.perf_counter() - t
    candidates = [grid.row("search", best_search), *grid.candidates]
    grid.timing["wall_s"] = time.perf_counter() - t0
    ranked = [x for x in candidates if x.fits]
    # a tie goes to the plan the user would have launched anyway
    answer = min(ranked, key=lambda x: (x.step_time_s, x.name == "search")) if ranked else None
    seq = int(grid.config.get("seq", 0)) or None
    gpus = len(grid.gpus)
    result = LayeredPlaceResult(
        target=f"{target} {size}",
        cluster=grid.cluster.name,
        gpus=gpus,
        batch=grid.batch,
        plan=answer.plan if answer else None,
        words=answer.words if answer else f"no plan fits {gpus} GPUs of {grid.cluster.name}",
        returned=answer.name if answer else None,
        step_time_s=answer.step_time_s if answer else None,
        peak_bytes=answer.peak_bytes if answer else None,
        tokens_per_s_per_gpu=(grid.batch * seq / answer.step_time_s / gpus) if answer and seq else None,
        candidates=candidates,
        searches=searches,
        notes=grid.notes,
        timing=grid.timing,
    )
    _write_summary(out, "layered.json", result.summary)
    return result


@dataclass
class _Grid:
    """The grids' plans over the micro-batch counts, the candidates they make, and the spaces to search with
    each one's share of the plans."""

    cluster: object
    gpus: list[int]
    config: dict
    batch: int
    notes: list[str]
    candidates: list[LayeredCandidate]
    spaces: list  # (base result, micro-batch count, LayeredSpace, plans)
    timing: dict

    def row(self, name: str, found) -> LayeredCandidate:
        """A candidate row from ``(LayeredResult, micro-batch count)`` (None: nothing of the row fits)."""
        from postplace.placers.practitioner import plan_words
        from postplace.plans import parse_plan

        if found is None:
            return LayeredCandidate(name, None, "none fits, recomputing or not", None, None, False)
        r, m = found
        k = parse_plan(r.plan).model_parallel
        devices = self.gpus[: len(self.gpus) // k * k]
        words = plan_words(r.plan, [self.cluster.device_names[d] for d in devices], m)
        return LayeredCandidate(name, r.plan, words, r.step_time_s, r.peak_bytes, True)


def _grid_and_spaces(
    target, cluster, size, optimizer, lr, precision, microbatches, bases, exclude, cost_model, samples, say
) -> _Grid:
    """The grid at each micro-batch count, its candidate rows, and a layered space around each of its ``bases``
    fastest distinct shapes, ``samples`` shared evenly over them."""
    from postplace.api.target import load_cluster
    from postplace.placers.layered import measured_rule, measured_sizes
    from postplace.placers.layered_grid import layered_grid
    from postplace.placers.layered_search import layered_space, size_options
    from postplace.placers.practitioner import plan_devices
    from postplace.plans import PlanSpec, parse_plan
    from postplace.plans._step import numbered_units

    if not isinstance(bases, int) or isinstance(bases, bool) or bases < 1:
        raise PostplaceError(f"bases={bases!r}: give a positive number of the grid's shapes to search around")
    config, layers, batch = zoo_blocks(target, size)
    c, _ = load_cluster(cluster, None)
    gpus = plan_devices(c, PlanSpec("ddp"), exclude)
    if microbatches is not None:
        if not isinstance(microbatches, int) or microbatches < 1 or batch % microbatches:
            raise PostplaceError(
                f"--microbatches {microbatches}: the layered answer needs a count that divides the batch of {batch}"
            )
        counts = [microbatches]
    else:
        counts = [batch] + [batch // 2] * (batch % 2 == 0 and batch // 2 >= len(gpus))
    tried, notes, costs_by_m, timing = [], [], {}, {"trace_s": 0.0, "measure_s": 0.0, "grid_s": 0.0, "search_s": 0.0}
    for m in counts:
        t = time.perf_counter()
        graph = traced_pair(target, size, batch, m, optimizer, lr, precision, min(3, layers))
        timing["trace_s"] += time.perf_counter() - t
        if len(kinds := sorted({b.rpartition(".")[0] for b in numbered_units(graph)})) > 1:
            raise PostplaceError(
                f"--layered: the layered estimate repeats one kind of block, and {target} has several "
                f"({', '.join(kinds)}); drop --layered"
            )
        say(f"grid at {m} micro-batches of {batch // m} sequence{'s' if batch // m > 1 else ''}")
        grid = layered_grid(graph, c, gpus, m, layers=layers, cost_model=cost_model)
        timing["measure_s"] += grid.measure_s
        timing["grid_s"] += grid.price_s
        tried += [(r, m) for r in grid.tried]
        notes += [f"m={m}: {n}" for n in grid.notes]
        costs_by_m[m] = (graph, dict(grid.costs))
    if not tried:  # every plan refused: the reason, not "nothing fits"
        why = notes[-1].split(": ", 2)[-1] if notes else "the grid holds no plan"  # "m=8: PLAN: why" or "m=8: why"
        raise PostplaceError(f"--layered: no plan could be priced on {c.name}: {why}")
    fits = sorted((x for x in tried if not x[0].oom), key=lambda x: x[0].step_time_s)
    out = _Grid(c, gpus, config, batch, notes, [], [], timing)
    out.candidates.append(out.row("best-3d", fits[0] if fits else None))
    for level in ("ddp", "zero1", "zero2", "fsdp"):  # each level's fastest plain plan, recomputing where it must
        mine = [x for x in fits if (s := parse_plan(x[0].plan)).level == level and not s.tensor and not s.pipeline]
        out.candidates.append(out.row(parse_plan(mine[0][0].plan).name if mine else level, mine[0] if mine else None))
    shapes, chosen, cut_chosen = set(), [], False
    several = len({c.devices[d].model for d in gpus}) > 1
    for r, m in fits:
        s = parse_plan(r.plan)
        if (key := (s.level, s.tensor, s.sequence, s.pipeline, s.schedule, m)) in shapes:
            continue
        # on GPUs of several models, also the fastest pipeline of one chunk per GPU: its search decides each
        # stage's share of the blocks and where it recomputes, for GPUs of different speeds and memory
        if len(chosen) < bases or (several and s.one_chunk_pipeline and not cut_chosen):
            shapes.add(key)
            chosen.append((r, m))
            cut_chosen = cut_chosen or s.one_chunk_pipeline
    if several:  # and the fastest plan without a pipeline at each tensor degree: its GPU models' micro-batch sizes
        degrees = {parse_plan(r.plan).tensor for r, _ in chosen if not parse_plan(r.plan).pipeline}
        for r, m in fits:
            s = parse_plan(r.plan)
            if not s.pipeline and s.tensor not in degrees:
                degrees.add(s.tensor)
                chosen.append((r, m))
    traced_at = pair_tracer(target, size, optimizer, lr, precision, min(3, layers))

    def graph_at(n: int):
        t = time.perf_counter()
        graph = traced_at(n)
        timing["trace_s"] += time.perf_counter() - t
        return graph

    sized = {}

    def measure_sized(tp, sp, sizes, rule):
        if (key := (tp, sp, sizes, rule)) not in sized:
            t = time.perf_counter()
            sized[key] = measured_sizes(
                graph_at, c, gpus, rule, sizes, tensor=tp, sequence=sp, layers=layers, cost_model=cost_model
            )
            timing["measure_s"] += time.perf_counter() - t
        return sized[key]

    for k, (r, m) in enumerate(chosen):  # the plans shared evenly: the grid's order is no guide to the search's
        share = samples // len(chosen) + (k < samples % len(chosen))
        if share == 0:  # a budget too small for this shape: not searched (its base is priced already)
            continue
        spec = parse_plan(r.plan)
        tp, sp = spec.tensor or 1, spec.sequence
        graph, costs = costs_by_m[m]
        tm = time.perf_counter()
        for rule in ("", "full", "selective"):  # what the grid did not measure, for the search
            if (tp, sp, rule) not in costs:
                costs[tp, sp, rule] = measured_rule(
                    graph, c, gpus, rule, tensor=tp, sequence=sp, layers=layers, cost_model=cost_model
                )
        timing["measure_s"] += time.perf_counter() - tm
        devices = gpus[: len(gpus) // spec.model_parallel * spec.model_parallel]
        options = size_options(replace(spec, microbatches=m), batch, c, devices)
        space = layered_space(
            r,
            spec,
            costs[tp, sp, ""],
            costs[tp, sp, "full"],
            devices,
            selective=costs[tp, sp, "selective"],
            sizes=options,
            measure_sized=functools.partial(measure_sized, tp, sp),
        )
        out.spaces.append((r, m, space, share))
    return out


def _search(grid: _Grid, strategy: str, seed: int, say):
    """``strategy`` over the grid's spaces in two rounds, as successive halving spends a budget: half of each
    space's plans around its base, then the rest of all of them around the space whose search did best,
    from that search's best. The searches' records, and the best plan that fits with its micro-batch count
    (None: none)."""
    from postplace.placers.layered_search import search_plan

    searches, best = [], None

    def one(k: int, samples: int, start, round_: int):
        nonlocal best
        r, m, space, _ = grid.spaces[k]
        say(f"{strategy} over {space.space.num_units} per-block choices around {r.plan} ({samples} plans)")
        found = search_plan(
            space, grid.cluster, strategy=strategy, samples=samples, seed=seed + k + 100 * (round_ - 1), start=start
        )
        searches.append(_record(found, r, m, space, round_))
        if found.result is not None and (best is None or found.result.step_time_s < best[0].step_time_s):
            best = (
                replace(found.result, plan=str(found.best)),
                found.best.microbatches or m,
            )  # a size decision moves m
        return found

    halves = [max(1, share // 2) for *_, share in grid.spaces]
    first = [one(k, half, None, 1) for k, half in enumerate(halves)]
    rest = sum(share for *_, share in grid.spaces) - sum(halves)
    done = [(k, found) for k, found in enumerate(first) if found.result is not None]
    if rest > 0 and done:  # the rest around the space whose first search did best, from its best
        k, found = min(done, key=lambda x: x[1].result.step_time_s)
        one(k, rest, found.search.best_placement, 2)
    return searches, best


def _record(found, r, m, space, round_: int) -> dict:
    """One search's record."""
    from postplace.search.origins import new_bests

    return {
        "strategy": found.strategy,
        "round": round_,
        "base": r.plan,
        "base_step_time_s": r.step_time_s,
        "microbatches": m,
        "decisions": space.space.num_units,
        "best": None if found.best is None else str(found.best),
        "best_step_time_s": None if found.result is None else found.result.step_time_s,
        "samples": found.search.samples,
        "new_bests": new_bests(found.search.origins, found.search.step_times),
        "wall_s": found.search.wall_time_s,
    }


@dataclass
class LayeredComparison:
    """What :func:`compare_layered` returns: each strategy's own best beside ``best-3d``, the same spaces for all.

    Parameters
    ----------
    target, cluster : str
        The model (``llama 70b@256``) and the cluster's name.
    gpus, samples, seeds : int
        The GPUs, the plans each strategy prices per seed, the seeds.
    best_3d : LayeredCandidate
        The grid's best (the start of every search).
    rows : list of dict
        Per strategy: ``strategy``; ``step_time_s`` (its own best per seed; None where nothing fit); ``median_s``
        and ``over_best_3d`` (the median over seeds, and that over best-3d's); ``plan`` (the best seed's);
        ``new_bests`` (by origin, summed over seeds and spaces); ``wall_s``.
    timing : dict
        Seconds tracing, measuring, pricing the grid, and in all (``wall_s``).
    bases : list of dict
        The grid's plans the searches start from: ``plan``, ``microbatches``, ``step_time_s``.
    """

    target: str
    cluster: str
    gpus: int
    samples: int
    seeds: int
    best_3d: LayeredCandidate
    rows: list[dict]
    timing: dict = field(default_factory=dict)
    bases: list[dict] = field(default_factory=list)

    @property
    def summary(self) -> dict:
        out = asdict(self)
        out["evaluator"] = EVALUATOR
        return out


def compare_layered(
    target: str,
    cluster,
    *,
    strategies=("post", "post-start", "local", "random"),
    size: str = "full",
    optimizer="sgd",
    lr: float | None = None,
    precision: str = "fp32",
    samples: int = 2400,
    seeds: int = 1,
    microbatches: int | None = None,
    bases: int = 3,
    exclude=(),
    cost_model=None,
    out: str | Path | None = None,
    progress=None,
) -> LayeredComparison:
    """Each strategy's own best over the per-block choices :func:`place_layered` searches, on the same spaces.

    The grid and its spaces are built once; each strategy then runs ``seeds`` times with ``samples`` plans
    per seed, shared out over the spaces as :func:`place_layered` shares them, every run from the grid's plan.

    Parameters
    ----------
    target, cluster, size, optimizer, lr, precision, microbatches, bases, exclude, cost_model, progress
        As :func:`place_layered` takes them.
    strategies : sequence of str
        The strategies compared (default Post, its start without learning, local moves alone, random search).
    samples, seeds : int
        Plans per strategy and seed; seeds per strategy (0, 1, ...).
    out : path, optional
        A folder to write ``compare_layered.json`` (the summary) into.

    Returns
    -------
    LayeredComparison

    Examples
    --------
    >>> c = compare_layered("llama", "dgx8", size="small@16", strategies=("post", "local"), samples=12, bases=1)
    >>> [r["strategy"] for r in c.rows], all(r["over_best_3d"] <= 1 for r in c.rows)
    (['post', 'local'], True)
    """
    from postplace.search import STRATEGIES, make_strategy

    say = progress or (lambda line: None)
    names = [strategies] if isinstance(strategies, str) else list(strategies)
    for name in names:
        if name not in STRATEGIES:
            make_strategy(name, None)  # one line for an unknown name, before anything is traced
    for what, value in (("samples", samples), ("seeds", seeds)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise PostplaceError(f"{what}={value!r}: give a positive integer")
    t0 = time.perf_counter()
    grid = _grid_and_spaces(
        target, cluster, size, optimizer, lr, precision, microbatches, bases, exclude, cost_model, samples, say
    )
    rows, t_search = [], time.perf_counter()
    for name in names:
        t, times, plans, bests = time.perf_counter(), [], [], {}
        for seed in range(seeds):
            searches, best = _search(grid, name, seed, say)
            times.append(None if best is None else best[0].step_time_s)
            plans.append(None if best is None else best[0].plan)
            for record in searches:
                for origin, n in record["new_bests"].items():
                    bests[origin] = bests.get(origin, 0) + n
        found = [x for x in times if x is not None]
        median = float(np.median(found)) if found else None
        base = grid.candidates[0].step_time_s
        rows.append(
            {
                "strategy": name,
                "step_time_s": times,
                "median_s": median,
                "over_best_3d": median / base if median is not None and base else None,
                "plan": plans[int(np.argmin([x if x is not None else np.inf for x in times]))] if found else None,
                "new_bests": bests,
                "wall_s": time.perf_counter() - t,
            }
        )
    grid.timing["search_s"] = time.perf_counter() - t_search
    grid.timing["wall_s"] = time.perf_counter() - t0
    bases = [{"plan": r.plan, "microbatches": m, "step_time_s": r.step_time_s} for r, m, _, _ in grid.spaces]
    result = LayeredComparison(
        f"{target} {size}",
        grid.cluster.name,
        len(grid.gpus),
        samples,
        seeds,
        grid.candidates[0],
        rows,
        grid.timing,
        bases,
    )
    _write_summary(out, "compare_layered.json", result.summary)
    return result


def _write_summary(out, name: str, summary: dict) -> None:
    """``summary`` as ``out/name`` (JSON), when ``out`` is given."""
    if out is not None:
        folder = Path(out)
        folder.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text(json.dumps(summary, indent=1))
