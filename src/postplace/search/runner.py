"""The runner: ask -> evaluate -> tell, with a budget, a cache, progress, history and checkpoints.

Strategies know nothing of this file (Optuna's split between samplers and the optimize loop). What it
guarantees:

* the strategy decides how many placements it wants at a time; the budget only caps the last batch;
* an identical placement is evaluated once (a cache keyed by the placement's bytes);
* ``history.jsonl`` gets one line per sample: its index, a hash of the placement, the step time, OOM /
  failed flags, whether it came from the cache, and its ``origin`` (:data:`postplace.search.strategy.ORIGINS`:
  ``probe:<start>``, ``policy``, ``local``, ``warm``; the strategy says, :func:`asked_origins`);
* ``timing.jsonl`` gets one line per batch: ``{"samples": samples so far, "time_s": seconds since the
  run started}``, the search's own time (a resumed run goes on from its checkpoint's clock). It is
  kept apart from the history, which a resumed run reproduces byte for byte; a resume keeps the lines
  its checkpoint covers;
* ``checkpoint.json`` + ``checkpoint-*.npz`` (data, never pickle: :mod:`postplace.search.state_io`,
  written atomically and checksummed) hold the strategy's state, the runner's state and the cache,
  every ``checkpoint_every`` samples, at the end, and on Ctrl-C (from the last completed batch). A run
  killed at any moment, even by ``kill -9``, resumes from its last checkpoint: the history is truncated
  to what the checkpoint covers (a history shorter than that is a damaged folder, an error), and for a
  sample budget the resumed run ends with the same best placement and the same history as an
  uninterrupted one. Resuming with a larger budget extends the run;
* every placement told to the strategy is checked against ``space.allowed`` (when a space is given):
  a placement outside it is an error, never evaluated;
* infeasible (OOM) and failed placements are never the best; the strategy is told, beside each
  sample's step time and feasibility, how many bytes it overflows (summed over devices, from the
  evaluator's peak memory and its cluster's capacity; inf for a failed evaluation).
"""

from __future__ import annotations

import hashlib
import json
import re
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from postplace.errors import PostplaceError
from postplace.search.checkpoint import (
    CHECKPOINT,
    NOT_IN_RUNNER,
    checked_state,
    load_strategy,
    save_checkpoint,
)
from postplace.search.history import (
    HISTORY,
    TIMING,
    count_lines,
    history_digest,
    history_origins,
    keep_timing,
)
from postplace.search.progress import Progress
from postplace.search.state_io import load_state
from postplace.search.strategy import asked_origins, check_allowed, overflow_bytes
from postplace.sim import Evaluator

MAX_BUDGET_SAMPLES = 10**12
"""The most samples a budget may ask for: far past any search (a million a second for ten days), and
within the 64-bit counts of a checkpoint."""
MAX_BUDGET_SECONDS = 366 * 86400.0


@dataclass(frozen=True)
class Budget:
    """How long a search runs: a number of samples, or seconds of wall-clock time.

    Parameters
    ----------
    samples : int, optional
        Stop after this many samples (the last batch is capped to it).
    seconds : float, optional
        Stop at the first batch that ends after this many seconds (used when ``samples`` is None).

    Examples
    --------
    >>> from postplace.search import Budget
    >>> Budget.parse(2400), Budget.parse("5m").describe()
    (Budget(samples=2400, seconds=None), '300 s')
    """

    samples: int | None = None
    seconds: float | None = None

    @classmethod
    def parse(cls, text: str | int) -> Budget:
        """``2400`` (samples) or ``60s`` / ``5m`` (wall-clock time).

        Parameters
        ----------
        text : str or int
            A positive whole number of samples, or a number followed by ``s`` or ``m``.

        Returns
        -------
        Budget

        Raises
        ------
        PostplaceError
            For anything else (``0``, ``-5``, ``"1h"``).
        """
        s = str(text).strip()
        m = re.fullmatch(r"([0-9]+(?:\.[0-9]+)?)\s*([sm])", s)  # ASCII digits: '²'.isdigit() is true
        if m and len(m.group(1)) <= 30:
            seconds = float(m.group(1)) * (60 if m.group(2) == "m" else 1)
            if seconds <= MAX_BUDGET_SECONDS:
                return cls(seconds=seconds)
        elif re.fullmatch(r"[0-9]+", s) and 0 < int(s[:30]) <= MAX_BUDGET_SAMPLES and len(s) <= 30:
            return cls(samples=int(s))
        if m or re.fullmatch(r"[0-9]+", s):
            raise PostplaceError(
                f"--budget '{str(text)[:40]}': at most {MAX_BUDGET_SAMPLES:,} samples or "
                f"{MAX_BUDGET_SECONDS:g} s (a year), and at least 1 sample"
            )
        raise PostplaceError(f"--budget '{str(text)[:40]}': give a number of samples (2400) or a time (60s, 5m)")

    def describe(self) -> str:
        """``"2400 samples"`` or ``"60 s"``."""
        return f"{self.samples} samples" if self.samples is not None else f"{self.seconds:g} s"


@dataclass
class SearchResult:
    """What :func:`run` returns: the best feasible placement found, and how the search got there.

    Parameters
    ----------
    best_placement : numpy.ndarray or None
        Over the strategy's units; None when nothing feasible was found.
    best_step_time : float
        Its step time (inf when nothing feasible was found).
    best_sample : int
        The index of the sample that found it (-1: none).
    samples : int
        Samples taken (those of a resumed run's earlier part included).
    feasible_samples : int
        Samples that were neither OOM nor failed.
    evaluations : int
        Placements the evaluator was called on (a placement seen before comes from the cache).
    wall_time_s : float
        Seconds the search ran, a resumed run's earlier part included.
    curve : list of float
        The best feasible step time after each sample (inf before the first).
    evaluator : str
        The evaluator's name.
    interrupted : bool
        The run stopped on Ctrl-C (its folder then resumes).
    origins : list of str
        Each sample's origin, as ``history.jsonl`` records it (``"unknown"`` for a resumed part written
        before origins were recorded).
    step_times : list of float
        Each sample's step time, inf where it was OOM or failed
        (:func:`postplace.search.origins.origin_stats` reads both).
    """

    best_placement: np.ndarray | None  # over the strategy's units; None when nothing feasible was found
    best_step_time: float
    best_sample: int
    samples: int
    feasible_samples: int
    evaluations: int
    wall_time_s: float
    curve: list[float] = field(default_factory=list)  # best feasible step time after each sample (inf before)
    evaluator: str = "simulator"
    interrupted: bool = False
    origins: list[str] = field(default_factory=list)
    step_times: list[float] = field(default_factory=list)


def placement_hash(p: np.ndarray) -> str:
    return hashlib.blake2b(np.ascontiguousarray(p, dtype=np.int64).tobytes(), digest_size=8).hexdigest()


def run(
    strategy,
    evaluator: Evaluator,
    budget: Budget,
    *,
    out_dir: str | Path | None = None,
    resume: bool = False,
    checkpoint_every: int = 240,
    progress: bool = False,
    warm_start: np.ndarray | None = None,
    meta: dict | None = None,
    space=None,
) -> SearchResult:
    """Drive ``strategy`` against ``evaluator`` until ``budget`` is spent; see the module docstring.

    Parameters
    ----------
    strategy : Strategy
        Asked for placements and told their results.
    evaluator : Evaluator
        Evaluates each batch (a placement seen before is not evaluated again).
    budget : Budget
    out_dir : str or path, optional
        The run folder: ``history.jsonl``, ``timing.jsonl`` and checkpoints. None: nothing is written.
    resume : bool
        Continue the run in ``out_dir`` from its last checkpoint (``budget`` may extend it).
    checkpoint_every : int
        Samples between checkpoints (one is also written at the end and on Ctrl-C).
    progress : bool
        Show a progress bar.
    warm_start : numpy.ndarray, optional
        A placement over the units evaluated first (in a run that has no samples yet).
    meta : dict, optional
        Recorded with every checkpoint.
    space : SearchSpace, optional
        The space whose ``allowed`` every placement must respect (default: the strategy's ``space``
        attribute, if it has one).

    Returns
    -------
    SearchResult
        ``interrupted`` is set when the run stopped on Ctrl-C.

    Raises
    ------
    PostplaceError
        When ``out_dir`` already holds a run and ``resume`` is not set, its checkpoint is missing or
        damaged, or a placement (the strategy's or the warm start) uses a device its unit may not.

    Examples
    --------
    >>> from postplace.cluster import load_cluster
    >>> from postplace.graph import OpGraph
    >>> from postplace.search import Budget, make_problem, make_strategy, run
    >>> g = OpGraph.build(["a", "b", "c"], [(0, 1, 1e6), (1, 2, 1e6)], flops=[1e9, 4e9, 1e9])
    >>> p = make_problem(g, load_cluster("k80x2"), groups=None)
    >>> r = run(make_strategy("random", p.space, seed=0), p.simulator, Budget(samples=32))
    >>> r.samples, r.evaluations <= r.samples, r.best_step_time >= p.simulator.lower_bound
    (32, True, True)
    """
    out = Path(out_dir) if out_dir is not None else None
    allowed = getattr(space if space is not None else getattr(strategy, "space", None), "allowed", None)
    state = _RunState()
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        if resume:
            state = _RunState.load(out, strategy, allowed)
        elif (out / CHECKPOINT).exists():
            raise PostplaceError(f"{out} already holds a run; pass --resume {out} to continue it, or pick a new --out")
        else:
            (out / HISTORY).write_text("")
            (out / TIMING).write_text("")
    history = open(out / HISTORY, "a") if out is not None else None  # noqa: SIM115
    # a folder from before timing was recorded gets none: lines for its resumed part alone would put
    # every earlier sample at the first resumed batch's time
    timing = open(out / TIMING, "a") if out is not None and (out / TIMING).exists() else None  # noqa: SIM115
    bar = Progress(budget, state.samples) if progress else None
    start = time.perf_counter() - state.elapsed
    snapshot = state.snapshot(strategy) if out is not None else None
    interrupted = False
    try:
        if warm_start is not None and state.samples == 0:
            warm = np.atleast_2d(np.asarray(warm_start, dtype=np.int64))
            check_allowed(warm, allowed, "the warm start")
            _one_batch(_Told(strategy, "warm", len(warm)), evaluator, state, history, warm)
            _clock(timing, state, start)
            if out is not None:
                state.history_bytes = history.tell()
                snapshot = state.snapshot(strategy)
        while not _spent(budget, state, start):
            left = budget.samples - state.samples if budget.samples is not None else 1 << 30
            placements = np.atleast_2d(np.asarray(strategy.ask(left), dtype=np.int64))
            check_allowed(placements, allowed, f"strategy '{getattr(strategy, 'name', '?')}'")
            _one_batch(strategy, evaluator, state, history, placements)
            state.elapsed = _clock(timing, state, start)
            if out is not None:
                state.history_bytes = history.tell()
                snapshot = state.snapshot(strategy)
                if state.samples - state.checkpointed >= checkpoint_every:
                    save_checkpoint(out, snapshot, history, meta)
                    state.checkpointed = state.samples
            if bar:
                bar.update(state)
    except KeyboardInterrupt:
        interrupted = True
    finally:
        if bar:
            bar.close()
        if out is not None and snapshot is not None:
            save_checkpoint(out, snapshot, history, meta)
        if history:
            history.close()
        if timing:
            timing.close()
    return SearchResult(
        best_placement=state.best_placement,
        best_step_time=state.best_step_time,
        best_sample=state.best_sample,
        samples=state.samples,
        feasible_samples=state.feasible,
        evaluations=state.evaluations,
        wall_time_s=time.perf_counter() - start,
        curve=list(state.curve),
        evaluator=evaluator.name,
        interrupted=interrupted,
        origins=list(state.origins),
        step_times=list(state.step_times),
    )


def _clock(timing, state: _RunState, start: float) -> float:
    """The run's elapsed seconds after a batch, written to ``timing.jsonl`` when the run has a folder."""
    elapsed = time.perf_counter() - start
    if timing:
        timing.write(json.dumps({"samples": state.samples, "time_s": round(elapsed, 6)}) + "\n")
        timing.flush()
    return elapsed


def _spent(budget: Budget, state: _RunState, start: float) -> bool:
    if budget.samples is not None:
        return state.samples >= budget.samples
    return time.perf_counter() - start >= budget.seconds


class _Told:
    """A strategy told placements it did not ask for (the warm start), all of one origin."""

    def __init__(self, strategy, origin: str, n: int):
        self.strategy, self.last_origins = strategy, [origin] * n

    def tell(self, *args) -> None:
        self.strategy.tell(*args)


def _one_batch(strategy, evaluator, state: _RunState, history, placements: np.ndarray) -> None:
    origins = asked_origins(strategy, len(placements))  # what its last ask says of them, before it is told
    keys = [p.tobytes() for p in placements]
    todo = [i for i, k in enumerate(keys) if k not in state.cache]
    todo_unique = list({keys[i]: i for i in todo}.values())
    if todo_unique:
        res = evaluator.evaluate(placements[todo_unique])
        state.evaluations += len(todo_unique)
        over = _overflow(evaluator, res)
        for j, i in enumerate(todo_unique):
            state.cache[keys[i]] = (
                float(res.step_time[j]),
                bool(res.oom[j]),
                bool(res.failed[j]),
                res.reasons[j],
                float(over[j]),
            )
    step = np.empty(len(placements))
    feasible = np.empty(len(placements), dtype=bool)
    overflow = np.zeros(len(placements))
    lines = []
    fresh = set(todo_unique)
    for i, k in enumerate(keys):
        t, oom, failed, reason, overflow[i] = state.cache[k]
        step[i], feasible[i] = t, not (oom or failed)
        n = state.samples + i
        if feasible[i] and t < state.best_step_time:
            state.best_step_time, state.best_placement, state.best_sample = t, placements[i].copy(), n
        state.curve.append(state.best_step_time)
        line = {
            "sample": n,
            "hash": placement_hash(placements[i]),
            "step_time_s": t,
            "oom": oom,
            "failed": failed,
            "cached": i not in fresh,
            "origin": origins[i],
        }
        state.origins.append(origins[i])
        state.step_times.append(t if feasible[i] else float("inf"))
        if reason:
            line["reason"] = reason
        lines.append(json.dumps(line))
    state.samples += len(placements)
    state.feasible += int(feasible.sum())
    state.last_batch_mean = float(np.mean(step[feasible])) if feasible.any() else float("inf")
    strategy.tell(placements, step, feasible, overflow)
    if history:
        history.write("\n".join(lines) + "\n")
        history.flush()


def _overflow(evaluator, res) -> np.ndarray:
    """Bytes above capacity summed over devices per evaluated placement (0 when the evaluator has no
    cluster to compare with; inf where the evaluation failed)."""
    capacity = getattr(getattr(evaluator, "cluster", None), "capacity", None)
    if capacity is None:
        return np.where(res.failed, np.inf, 0.0)
    return np.where(res.oom | res.failed, overflow_bytes(res.peak_mem, capacity, res.failed), 0.0)


@dataclass
class _RunState:
    samples: int = 0
    feasible: int = 0
    evaluations: int = 0
    best_step_time: float = float("inf")
    best_placement: np.ndarray | None = None
    best_sample: int = -1
    elapsed: float = 0.0
    checkpointed: int = 0
    last_batch_mean: float = float("inf")
    curve: list = field(default_factory=list)
    cache: dict = field(default_factory=dict)
    history_bytes: int = 0
    origins: list = field(default_factory=list)  # per sample; not checkpointed: a resume reads the history
    step_times: list = field(default_factory=list)  # per sample, inf where infeasible; the same

    def snapshot(self, strategy) -> dict:
        """The state at a batch boundary. The curve and the cache only grow, so the snapshot keeps the
        curve's length and a reference to the cache (every entry is a fact about a placement, true at any
        time) instead of copying them at every batch."""
        return {
            "strategy": strategy.state_dict(),
            "runner": {k: v for k, v in self.__dict__.items() if k not in NOT_IN_RUNNER},
            "curve": (self.curve, len(self.curve)),
            "cache": (self.cache, len(self.cache)),  # dicts keep insertion order: the first n entries
        }

    @classmethod
    def load(cls, out: Path, strategy, allowed: np.ndarray | None = None) -> _RunState:
        """The state a checkpoint saved, every field checked (type, range, shape, agreement with the
        cache, the search space ``allowed`` and the strategy), and the history cut to what it covers."""
        path = out / CHECKPOINT
        if not path.exists():
            raise PostplaceError(f"{out}: no {CHECKPOINT} to resume from; start a new run with --out {out}")
        snap = load_state(path)
        state = checked_state(cls, path, snap, allowed)
        load_strategy(path, strategy, snap.get("strategy"), allowed)
        hist = out / HISTORY
        size = hist.stat().st_size if hist.exists() else -1
        if size < state.history_bytes:
            raise PostplaceError(
                f"{hist}: {max(size, 0)} bytes, shorter than the {state.history_bytes} the checkpoint "
                "covers: the run folder is damaged; start a new run"
            )
        want = snap.get("history_digest")
        if want is not None and history_digest(hist, state.history_bytes) != want:
            raise PostplaceError(
                f"{hist}: its first {state.history_bytes} bytes are not the ones the checkpoint "
                "recorded: the run folder is damaged; start a new run"
            )
        lines = count_lines(hist, state.history_bytes)
        if lines != state.samples:
            raise PostplaceError(
                f"{hist}: {lines} lines where the checkpoint covers {state.samples} samples: the run "
                "folder is damaged; start a new run"
            )
        with open(hist, "r+b") as f:  # drop samples the checkpoint does not cover
            f.truncate(state.history_bytes)
        state.origins, state.step_times = history_origins(hist)
        if (out / TIMING).exists():
            keep_timing(out / TIMING, state.samples)
        return state
