"""``postplace paper``: the Post paper's comparison on the zoo, as one resumable experiment.

Gao, Chen and Li (NeurIPS 2018) compare Post with its own ablations (cross-entropy only, PPO only),
with policy gradient (REINFORCE) and the hierarchical planner (the RL state of the art then), and with
hand-made placements, on Inception-V3, ResNet-50, RNNLM and NMT on one CPU plus 2 or 4 K80 GPUs, with
about 2,400 sampled placements per search; they report up to 63.7% shorter training steps than the RL
state of the art. :func:`run_paper` runs that grid here, one :func:`postplace.comparison.compare` folder
per model x machine (so it resumes exactly as ``compare`` does: finished runs are read back, unfinished
ones continue from their checkpoint), then writes the headline tables (``paper.json``, ``paper.md``):
Post's step-time reduction ``1 - post / rival`` against each rival, per model and machine, three times
(:data:`postplace.report.markdown.TABLES`), every strategy of a table from the same start and with local
moves (:mod:`postplace.search.local`) alike: from the paper's uniform start without local moves
(``post-paper`` against ``ce-paper``, ``ppo-paper``, ``reinforce-paper`` and ``hp``, the paper's
algorithms), from Post's default probe start without them (``post-probe`` against ``post-start``,
``ce-probe``, ``ppo-probe``, ``reinforce-probe`` and ``hp-probe``), and from that start with them (``post``
against ``local``, the moves alone, ``ce``, ``ppo``, ``reinforce-local`` and ``hp-local``), since a
comparison from different starts or with different add-ons measures those as much as the learning.
Read across tables, ``effects`` says what local moves and the probe start add to each method
(:data:`postplace.report.markdown.EFFECTS`).
Per pair ``paper.json`` also records each search's start (name, step time), its final step time and
the share of the gap to the lower bound that learning closed (``starts``).

The order of work puts the expensive part last: every cheap search strategy on every pair first, then
the hierarchical planners (``hp``, ``hp-probe``, ``hp-local``) one seed at a time over all pairs (their runs take
minutes, the others seconds), then the one-shot placers and the tables. An experiment stopped early
therefore has complete rows for everything but the planners' later seeds.
"""

from __future__ import annotations

import csv
import json
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from postplace.comparison import PLACER_NAMES, compare
from postplace.errors import PostplaceError
from postplace.placers import REGISTRY
from postplace.report.markdown import COLUMNS, EFFECTS, OTHERS, TABLES, format_table

PAPER_MODELS = ("inception_v3", "resnet50", "rnnlm", "nmt2", "nmt4")
PAPER_CLUSTERS = ("k80x2", "k80x4")
CHEAP_SEARCH = (
    "random",
    "anneal",
    "reinforce-paper",
    "ce-paper",
    "ppo-paper",
    "post-paper",
    "post-start",
    "reinforce-probe",
    "ce-probe",
    "ppo-probe",
    "post-probe",
    "local",
    "reinforce-local",
    "ce",
    "ppo",
    "post",
)
"""Search strategies that cost about a millisecond per sample (the planner ``hp`` about 0.13 s): the
strategies of every table (:data:`postplace.report.markdown.TABLES`), with random search and annealing."""
PLANNERS = ("hp", "hp-probe", "hp-local")
"""The hierarchical planner in each table: run last, with their own budget and seeds."""
HEURISTICS = tuple(name for name, p in REGISTRY.items() if p.heuristic)
"""One-shot placers whose best (that fits) is the "best heuristic" column."""
PAPER_CLAIM = 0.637
"""The paper's headline: up to 63.7% shorter step time than the RL state of the art (its abstract)."""
_HP_COST = 150.0  # a planner sample costs ~150 cheap ones (full paper run, benchmarks/RESULTS.md): progress weights


@dataclass(frozen=True)
class PaperConfig:
    """What to run. The defaults are the paper's experiment; :meth:`quick` is a few-minute version."""

    models: tuple[str, ...] = PAPER_MODELS
    clusters: tuple[str, ...] = PAPER_CLUSTERS
    size: str = "full"
    """Zoo model size (``full``: the paper's batch sizes; ``small`` for quick runs)."""
    budget: int = 2400
    """Samples per search run (the paper: about 2,400)."""
    hp_budget: int | None = None
    """Samples per hierarchical-planner run; None = ``budget``, 0 = leave the planner out."""
    seeds: int = 3
    hp_seeds: int | None = None
    """Seeds of the hierarchical planner; None = ``seeds`` (fewer where its minutes per run do not fit)."""
    strategies: tuple[str, ...] = (*PLACER_NAMES, *CHEAP_SEARCH, *PLANNERS)

    @classmethod
    def quick(cls) -> PaperConfig:
        """Small graphs, 240 samples, one seed, the planner at 48 samples: minutes on 2 cores."""
        return cls(size="small", budget=240, hp_budget=48, seeds=1)

    @property
    def planner_seeds(self) -> int:
        return self.seeds if self.hp_seeds is None else self.hp_seeds

    @property
    def planner_budget(self) -> int:
        return self.budget if self.hp_budget is None else self.hp_budget


@dataclass
class Headline:
    model: str
    cluster: str
    post_s: float | None
    hp_seeds: int | None = None
    reduction: dict = field(default_factory=dict)  # rival -> 1 - post / rival (None: a side is missing)
    rival_s: dict = field(default_factory=dict)
    post: str = "post"  # the strategy that is Post in this table


def reduction(post: float | None, other: float | None) -> float | None:
    """``1 - post / other``: positive when Post's step is shorter; None when either is missing."""
    if post is None or other is None or other <= 0:
        return None
    return 1.0 - post / other


def gap_closed(start: float | None, final: float | None, lower_bound: float | None) -> float | None:
    """The share of the gap from the start to the lower bound that the search closed,
    ``(start - final) / (start - lower_bound)``; None when the start was not probed or is at the bound."""
    if start is None or final is None or lower_bound is None or start - lower_bound <= 0:
        return None
    return (start - final) / (start - lower_bound)


def headline(report: dict, model: str, cluster: str, post: str = "post", rivals=None) -> Headline:
    """Post's reduction against each rival from one ``compare.json`` report: ``post`` is the strategy
    that is Post, ``rivals`` the search rows it is measured against (None: every rival of
    :data:`COLUMNS` present), then the best heuristic, single device, data parallelism and pipeline."""
    rows = {r["strategy"]: r for r in report["rows"]}

    def best(name: str) -> float | None:
        r = rows.get(name)
        return None if r is None or r["best_step_time_s"] is None else r["best_step_time_s"]

    names = [c for c in COLUMNS if c not in OTHERS and c != post] if rivals is None else rivals
    post_name, post = post, best(post)
    rivals = {name: best(name) for name in names if name in rows}
    fits = [
        rows[h]["best_step_time_s"]
        for h in HEURISTICS
        if h in rows and rows[h]["best_step_time_s"] is not None and not rows[h]["oom_count"]
    ]
    rivals["best heuristic"] = min(fits) if fits else None
    rivals["single"] = report.get("single_device_step_time_s")
    rivals["data-parallel"] = best("data-parallel")
    rivals["pipeline"] = best("pipeline")
    planner = next((rows[p] for p in names if p in PLANNERS and p in rows), None)
    hp_seeds = planner.get("seeds") if planner is not None else None
    return Headline(
        model, cluster, post, hp_seeds, {k: reduction(post, v) for k, v in rivals.items()}, rivals, post_name
    )


def effects(reports: dict, pairs) -> dict:
    """What one mechanism adds (:data:`postplace.report.markdown.EFFECTS`): per model x machine of
    ``reports`` (``{pair: compare.json}``), ``1 - with / without`` for each ``(without, with)`` of
    ``pairs`` present, and per column the pairs, how many it helps on, the median, smallest and largest."""
    per = {}
    for pair, rep in reports.items():
        best = {r["strategy"]: r["best_step_time_s"] for r in rep["rows"]}
        per[pair] = {f"{a} -> {b}": reduction(best.get(b), best.get(a)) for a, b in pairs if a in best and b in best}
    summary = {}
    for col in dict.fromkeys(c for vals in per.values() for c in vals):
        vals = [v[col] for v in per.values() if v.get(col) is not None]
        if vals:
            summary[col] = {
                "pairs": len(vals),
                "helps": sum(v > 0 for v in vals),
                "median": statistics.median(vals),
                "min": min(vals),
                "max": max(vals),
            }
    return {"pairs": per, "summary": summary}


def starts(report: dict) -> dict:
    """Each search row's start in one ``compare.json`` report: its name and step time, the final step
    time (the row's best) and :func:`gap_closed`; with the pair's lower bound."""
    lb = report.get("lower_bound_s")
    rows = {}
    for r in report["rows"]:
        if r.get("kind") != "search":
            continue
        start, final = r.get("start_step_time_s"), r.get("best_step_time_s")
        rows[r["strategy"]] = {
            "start_name": r.get("start_name"),
            "start_step_time_s": start,
            "final_step_time_s": final,
            "gap_closed": gap_closed(start, final, lb),
        }
    return {"lower_bound_s": lb, "strategies": rows}


def run_paper(
    out: Path,
    config: PaperConfig | None = None,
    *,
    progress: Callable[[str, float, float], None] | None = None,
    collect: bool = False,
) -> dict:
    """Run (or resume) the experiment under ``out``; write ``paper.json`` and ``paper.md``; return the data.

    ``progress(what, done, total)`` is called before each piece of work and at the end, ``done`` and
    ``total`` in cheap-search-run units (a planner run weighs ``_HP_COST`` times its budget share).
    ``collect=True`` searches nothing: it tables the runs that finished (the planner with the seeds it
    finished on each pair, from seed 0 on) and lists what is missing in ``paper.json``.
    """
    from postplace.cluster import load_cluster
    from postplace.validate import make_folder
    from postplace.zoo import cached_graph

    config = config or PaperConfig()
    out = Path(out)
    if collect and not any((out / f"{m}-{c}" / "runs").is_dir() for m in config.models for c in config.clusters):
        raise PostplaceError(f"--collect: no runs under {out} to table; run `postplace paper --out {out}` first")
    make_folder(out)
    t0 = time.perf_counter()
    strategies = list(config.strategies)
    if config.planner_budget <= 0:
        strategies = [s for s in strategies if s not in PLANNERS]
    planners = [s for s in strategies if s in PLANNERS]
    cheap = [s for s in strategies if s not in PLACER_NAMES and s not in PLANNERS]
    pairs = [(m, c) for m in config.models for c in config.clusters]
    hp_weight = _HP_COST * config.planner_budget / config.budget
    total = len(pairs) * (len(cheap) * config.seeds + hp_weight * config.planner_seeds * len(planners) + 1)
    total = len(pairs) if collect else total
    done = 0.0
    graphs: dict[str, object] = {}
    clusters = {c: load_cluster(c) for c in config.clusters}

    def graph(model: str):
        if model not in graphs:
            graphs[model] = cached_graph(model, config.size)
        return graphs[model]

    def retraced(model: str, cluster: str) -> dict:
        """The step at every micro-batch count ``place`` weighs: the data-parallel and pipeline rows
        are simulated on them (the search rows keep the paper's m = 1)."""
        from postplace.api.over_m import microbatch_counts, trace_counts
        from postplace.zoo import MODELS, spec

        if model not in MODELS:
            return None  # no step to trace again: data parallelism is the analytic estimate
        batch = int(spec(model).config(config.size)["batch"])
        gpus = sum(d.kind == "gpu" for d in clusters[cluster].devices)
        return trace_counts(
            lambda k: graph(model) if k == 1 else cached_graph(model, config.size, microbatches=k),
            microbatch_counts(batch, gpus),
        )[0]

    def tell(what: str) -> None:
        if progress:
            progress(what, done, total)

    def folder(m: str, c: str) -> Path:
        return out / f"{m}-{c}"

    tasks = [
        (f"{m} on {c}: {name} x {config.seeds} seeds", (m, c), [name], config.budget, config.seeds, config.seeds)
        for m, c in pairs
        for name in cheap
    ]  # 1. the cheap searches, all seeds
    tasks += [  # 2. the planners, one seed at a time over every pair
        (
            f"{m} on {c}: {name} seed {k - 1} ({config.planner_budget} samples)",
            (m, c),
            [name],
            config.planner_budget,
            k,
            hp_weight,
        )
        for k in range(1, config.planner_seeds + 1)
        for m, c in pairs
        for name in planners
    ]
    pending = [] if collect else list(tasks)
    while pending:  # a pair another process is working on is skipped, and waited for only at the end
        for task in list(pending):
            what, (m, c), names, budget, seeds, weight = task
            with _PairLock(folder(m, c), wait=task is pending[0] and _all_locked(pending, folder)) as got:
                if not got:
                    continue
                tell(what)
                compare(graph(m), clusters[c], names, budget=budget, seeds=seeds, out=folder(m, c))
            pending.remove(task)
            done += weight
    heads, reports, missing = {key: [] for key in TABLES}, {}, {}
    for m, c in pairs:  # 3. the placers, and every row read back into one compare.json per pair
        tell(f"{m} on {c}: one-shot placers and the table")
        if collect:
            names, cfg = _finished(strategies, config, folder(m, c))
            missing[f"{m}-{c}"] = [s for s in strategies if s not in names]
            rep = _assemble(graph(m), clusters[c], names, cfg, folder(m, c), retraced(m, c))
        else:
            with _PairLock(folder(m, c), wait=True):
                rep = _assemble(graph(m), clusters[c], strategies, config, folder(m, c), retraced(m, c))
        reports[f"{m}-{c}"] = rep
        for key, t in TABLES.items():
            heads[key].append(headline(rep, m, c, t["post"], t["rivals"]))
        done += 1
    tell("done")
    tables = {
        key: {
            **t,
            "rivals": list(t["rivals"]),
            "headline": [asdict(h) for h in heads[key]],
            "summary": _summary(heads[key]),
        }
        for key, t in TABLES.items()
    }
    data = {
        "config": {
            **asdict(config),
            "planner_budget": config.planner_budget if planners else 0,
            "planner_seeds": config.planner_seeds if planners else 0,
        },
        "paper_claim": {
            "max_reduction_vs_rl": PAPER_CLAIM,
            "source": "Gao, Chen, Li, NeurIPS 2018 (Post), abstract: up to 63.7% vs the RL state of the art",
        },
        "evaluator": "simulator",
        "pairs": [f"{m}-{c}" for m, c in pairs],
        "tables": tables,
        # one headline for readers of a single table (older tools): Post's default (probe start, local moves)
        "headline": tables["local"]["headline"],
        "summary": tables["local"]["summary"],
        "effects": {name: effects(reports, pairs) for name, pairs in EFFECTS.items()},
        "starts": {pair: starts(rep) for pair, rep in reports.items()},
        "wall_time_s_this_call": time.perf_counter() - t0,
        "missing": missing if collect else {},
    }
    (out / "paper.json").write_text(json.dumps(data, indent=1))
    (out / "paper.md").write_text(format_table(data) + "\n")
    return data


def _finished(strategies: list[str], config: PaperConfig, folder: Path) -> tuple[list[str], PaperConfig]:
    """The strategies whose runs all finished (placers always), and the planners' finished seed count
    (the fewest of those that finished one)."""
    from dataclasses import replace

    def done_seeds(name: str) -> int:
        k = 0
        while (folder / "runs" / name / f"seed{k}" / "result.json").exists():
            k += 1
        return k

    names = [
        s
        for s in strategies
        if s in PLACER_NAMES
        or (s in PLANNERS and done_seeds(s) > 0)
        or (s not in PLANNERS and done_seeds(s) >= config.seeds)
    ]
    planned = [done_seeds(s) for s in names if s in PLANNERS]
    if planned:
        config = replace(config, hp_seeds=min(min(planned), config.planner_seeds))
    return names, config


def _assemble(graph, cluster, strategies: list[str], config: PaperConfig, folder: Path, retraced: dict | None) -> dict:
    """One pair's ``compare.json`` with every row: a single ``compare`` call where the planners have as
    many seeds and samples as the rest, else the planners' rows (with their own seed count) merged into the
    others'."""
    same = config.planner_seeds == config.seeds and config.planner_budget == config.budget
    planners = [s for s in strategies if s in PLANNERS]
    if not planners or same:  # else a shared call would find the planners' runs stale (other budget)
        return compare(
            graph, cluster, strategies, budget=config.budget, seeds=config.seeds, out=folder, retraced=retraced
        )
    hp = compare(graph, cluster, planners, budget=config.planner_budget, seeds=config.planner_seeds, out=folder)
    rest = [s for s in strategies if s not in PLANNERS]
    rep = compare(graph, cluster, rest, budget=config.budget, seeds=config.seeds, out=folder, retraced=retraced)
    rows = rep["rows"]
    for name, row in zip(planners, hp["rows"], strict=True):  # in the order of strategies: each at its place
        rows.insert(strategies.index(name), row)
    rep["hp_seeds"], rep["hp_budget_samples"] = config.planner_seeds, config.planner_budget
    (folder / "compare.json").write_text(json.dumps(rep, indent=1))
    with open(folder / "compare.csv", "w", newline="") as f:
        w = csv.writer(f)
        cols = [k for k in rows[0] if k != "per_seed"]
        w.writerow(cols)
        w.writerows([r[k] for k in cols] for r in rows)
    return rep


class _PairLock:
    """An advisory lock on one pair's folder (``flock``: released by the system when a process dies), so
    two ``paper`` processes started on the same folder share the work instead of colliding."""

    def __init__(self, folder: Path, *, wait: bool):
        self.path, self.wait, self.f = folder / ".paper.lock", wait, None

    def __enter__(self) -> bool:
        import fcntl

        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.f = open(self.path, "w")  # noqa: SIM115
        try:
            fcntl.flock(self.f, fcntl.LOCK_EX | (0 if self.wait else fcntl.LOCK_NB))
        except BlockingIOError:
            self.f.close()
            self.f = None
            return False
        return True

    def __exit__(self, *exc) -> None:
        if self.f is not None:
            self.f.close()  # closing releases the lock


def _all_locked(pending: list, folder) -> bool:
    """True when every pending task's pair is locked by someone else (then wait for the first)."""
    for _, (m, c), *_ in pending:
        with _PairLock(folder(m, c), wait=False) as got:
            if got:
                return False
    return True


def _summary(heads: list[Headline]) -> dict:
    """Per rival: how many pairs Post beats it on, the median and the largest reduction."""
    out = {}
    for rival in dict.fromkeys(r for h in heads for r in h.reduction):
        vals = [h.reduction[rival] for h in heads if h.reduction.get(rival) is not None]
        if vals:
            out[rival] = {
                "pairs": len(vals),
                "post_faster": sum(v > 0 for v in vals),
                "median": statistics.median(vals),
                "max": max(vals),
                "min": min(vals),
            }
    return out
