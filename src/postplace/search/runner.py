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
from postplace.search.state_io import load_state, save_state
from postplace.search.strategy import asked_origins, overflow_bytes
from postplace.sim import Evaluator

CHECKPOINT = "checkpoint.json"
HISTORY = "history.jsonl"
TIMING = "timing.jsonl"


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
            raise PostplaceError(f"--budget '{str(text)[:40]}': at most {MAX_BUDGET_SAMPLES:,} samples or "
                                 f"{MAX_BUDGET_SECONDS:g} s (a year), and at least 1 sample")  # fmt: skip
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
    bar = _Progress(budget, state.samples) if progress else None
    start = time.perf_counter() - state.elapsed
    snapshot = state.snapshot(strategy) if out is not None else None
    interrupted = False
    try:
        if warm_start is not None and state.samples == 0:
            warm = np.atleast_2d(np.asarray(warm_start, dtype=np.int64))
            _check_allowed(warm, allowed, "the warm start")
            _one_batch(_Told(strategy, "warm", len(warm)), evaluator, state, history, warm)
            _clock(timing, state, start)
            if out is not None:
                state.history_bytes = history.tell()
                snapshot = state.snapshot(strategy)
        while not _spent(budget, state, start):
            left = budget.samples - state.samples if budget.samples is not None else 1 << 30
            placements = np.atleast_2d(np.asarray(strategy.ask(left), dtype=np.int64))
            _check_allowed(placements, allowed, f"strategy '{getattr(strategy, 'name', '?')}'")
            _one_batch(strategy, evaluator, state, history, placements)
            state.elapsed = _clock(timing, state, start)
            if out is not None:
                state.history_bytes = history.tell()
                snapshot = state.snapshot(strategy)
                if state.samples - state.checkpointed >= checkpoint_every:
                    _save(out, snapshot, history, meta)
                    state.checkpointed = state.samples
            if bar:
                bar.update(state)
    except KeyboardInterrupt:
        interrupted = True
    finally:
        if bar:
            bar.close()
        if out is not None and snapshot is not None:
            _save(out, snapshot, history, meta)
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


def _check_allowed(placements: np.ndarray, allowed: np.ndarray | None, who: str) -> None:
    if allowed is None:
        return
    G, D = allowed.shape
    if placements.ndim != 2 or placements.shape[1] != G:
        raise PostplaceError(f"{who} gave placements of shape {placements.shape}; the search has {G} units")
    bad = (placements < 0) | (placements >= D)
    if not bad.any():
        bad = ~allowed[np.arange(G)[None, :], placements]
    if bad.any():
        r, g = (int(x[0]) for x in np.nonzero(bad))
        raise PostplaceError(f"{who} put unit {g} on device id {int(placements[r, g])}, which it may not use "
                             "(its kinds, --pin and --exclude)")


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
            state.cache[keys[i]] = (float(res.step_time[j]), bool(res.oom[j]), bool(res.failed[j]), res.reasons[j],
                                    float(over[j]))  # fmt: skip
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
        line = {"sample": n, "hash": placement_hash(placements[i]), "step_time_s": t, "oom": oom, "failed": failed,
                "cached": i not in fresh, "origin": origins[i]}  # fmt: skip
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
            "runner": {k: v for k, v in self.__dict__.items() if k not in _NOT_IN_RUNNER},
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
        state = _checked_state(cls, path, snap, allowed)
        _load_strategy(path, strategy, snap.get("strategy"), allowed)
        hist = out / HISTORY
        size = hist.stat().st_size if hist.exists() else -1
        if size < state.history_bytes:
            raise PostplaceError(f"{hist}: {max(size, 0)} bytes, shorter than the {state.history_bytes} the checkpoint "
                                 "covers: the run folder is damaged; start a new run")
        want = snap.get("history_digest")
        if want is not None and _history_digest(hist, state.history_bytes) != want:
            raise PostplaceError(f"{hist}: its first {state.history_bytes} bytes are not the ones the checkpoint "
                                 "recorded: the run folder is damaged; start a new run")  # fmt: skip
        lines = _count_lines(hist, state.history_bytes)
        if lines != state.samples:
            raise PostplaceError(f"{hist}: {lines} lines where the checkpoint covers {state.samples} samples: the run "
                                 "folder is damaged; start a new run")  # fmt: skip
        with open(hist, "r+b") as f:  # drop samples the checkpoint does not cover
            f.truncate(state.history_bytes)
        state.origins, state.step_times = _history_origins(hist)
        if (out / TIMING).exists():
            _keep_timing(out / TIMING, state.samples)
        return state


_INT64_MAX = 2**63 - 1
_NOT_IN_RUNNER = ("cache", "curve", "origins", "step_times")  # saved apart (the cache, the curve) or not at all


def _history_origins(path: Path) -> tuple[list[str], list[float]]:
    """Each line's origin (``"unknown"`` where it has none: written before origins were recorded) and
    step time (inf where OOM, failed or unreadable) of a history the checkpoint covers."""
    origins, times = [], []
    for line in path.read_bytes().decode("utf-8", errors="replace").splitlines():
        try:
            row = json.loads(line)
        except (json.JSONDecodeError, RecursionError):
            row = None
        row = row if isinstance(row, dict) else {}
        origin, t = row.get("origin"), row.get("step_time_s")
        origins.append(origin if isinstance(origin, str) else "unknown")
        ok = isinstance(t, int | float) and not isinstance(t, bool) and not (row.get("oom") or row.get("failed"))
        times.append(float(t) if ok else float("inf"))
    return origins, times


def _checked_state(cls, path: Path, snap, allowed: np.ndarray | None) -> _RunState:
    """A :class:`_RunState` from a checkpoint's data, or one error line naming what does not hold."""

    def bad(what: str) -> PostplaceError:
        return PostplaceError(f"{path}: {what} (edited or damaged); start a new run")

    if not isinstance(snap, dict) or not isinstance(snap.get("runner"), dict):
        raise bad("not a search checkpoint (no runner state)")
    runner = snap["runner"]

    def count(key: str, hi: int = _INT64_MAX) -> int:
        v = runner.get(key, 0)
        if type(v) is not int or not 0 <= v <= hi:
            raise bad(f"runner '{key}' is {str(v)[:40]}, not an integer in [0, {hi}]")
        return v

    def real(key: str, *, finite: bool, hi: float = np.inf) -> float:
        v = runner.get(key, 0.0)
        ok = isinstance(v, int | float) and not isinstance(v, bool) and not np.isnan(v) and v >= 0
        if not ok or (finite and not np.isfinite(v)) or (np.isfinite(hi) and v > hi):
            raise bad(f"runner '{key}' is {str(v)[:40]}, not a {'finite ' if finite else ''}number >= 0"
                      + (f" and <= {hi:g}" if np.isfinite(hi) else ""))  # fmt: skip
        return float(v)

    samples = count("samples")
    state = cls(samples=samples, feasible=count("feasible", samples), evaluations=count("evaluations", samples),
                checkpointed=count("checkpointed", samples), history_bytes=count("history_bytes"),
                best_step_time=real("best_step_time", finite=False), elapsed=real("elapsed", finite=True, hi=1e9),
                last_batch_mean=real("last_batch_mean", finite=False))  # fmt: skip
    best_sample = runner.get("best_sample", -1)
    if type(best_sample) is not int or not -1 <= best_sample < max(samples, 1):
        raise bad(f"runner 'best_sample' is {str(best_sample)[:40]}, not a sample of the run")
    state.best_sample = best_sample
    # the cache: one row per placement evaluated
    arrays = {k: snap.get(k) for k in ("cache_keys", "cache_step", "cache_oom", "cache_failed", "cache_overflow")}
    if not all(isinstance(a, np.ndarray) for a in arrays.values()):
        raise bad("its cache is not arrays")
    keys = arrays["cache_keys"]
    n = len(keys) if keys.ndim else -1
    kinds = {"cache_keys": "u", "cache_step": "f", "cache_oom": "b", "cache_failed": "b", "cache_overflow": "f"}
    for k, a in arrays.items():
        if a.dtype.kind != kinds[k] or a.shape[:1] != (n,) or a.ndim != (2 if k == "cache_keys" else 1):
            raise bad(f"its {k} has shape {a.shape} and type {a.dtype}; the cache has {max(n, 0)} rows")
    reasons = snap.get("cache_reasons")
    if not isinstance(reasons, list) or len(reasons) != n or not all(r is None or isinstance(r, str) for r in reasons):
        raise bad("its cache_reasons are not one text (or null) per cached placement")
    if n != state.evaluations:
        raise bad(f"its cache holds {n} placements where the runner evaluated {state.evaluations}")
    step, oom, failed = arrays["cache_step"], arrays["cache_oom"], arrays["cache_failed"]
    over = arrays["cache_overflow"]
    if np.isnan(step).any() or (step < 0).any() or np.isnan(over).any() or (over < 0).any():
        raise bad("its cached step times or overflows are negative or NaN")
    ok = ~(oom | failed)
    if not np.isfinite(step[ok]).all():
        raise bad("a feasible cached placement has an infinite step time")
    width = keys.shape[1]
    if width % 8:
        raise bad(f"its cached placements are {width} bytes, not whole int64 device ids")
    placements = np.ascontiguousarray(keys).view(np.int64).reshape(n, width // 8)
    # a checkpoint saved before the first sample (Ctrl-C or an error in the first batch) has an empty cache
    # whose keys have no width: there is no placement to check, and indexing ``allowed`` with a (0, 0)
    # array cannot broadcast
    if allowed is not None and n:
        G, D = allowed.shape
        if placements.shape[1] != G:
            units = placements.shape[1]
            raise PostplaceError(f"{path}: its cached placements have {units} units; the search has {G} (edited or "
                                 "damaged, or written by a postplace that grouped this step otherwise: micro-batched "
                                 "steps are grouped by layer since 2026-12); start a new run")  # fmt: skip
        if ((placements < 0) | (placements >= D)).any() or not allowed[np.arange(G)[None, :], placements].all():
            raise bad("a cached placement puts a unit on a device it may not use (its kinds, --pin, --exclude)")
    state.cache = {k.tobytes(): (float(t), bool(o), bool(f), r, float(x))
                   for k, t, o, f, r, x in zip(keys, step, oom, failed, reasons, over, strict=True)}  # fmt: skip
    # the best so far: the fastest feasible placement of the cache
    best = runner.get("best_placement")
    fastest = float(step[ok].min()) if ok.any() else float("inf")
    if best is None:
        if ok.any() or np.isfinite(state.best_step_time):
            raise bad("its runner has no best placement while the cache holds a feasible one")
    else:
        try:
            best = np.asarray(best)
        except (ValueError, TypeError):
            raise bad("its best placement is not an array of device ids") from None
        if best.dtype.kind not in "iu" or best.ndim != 1 or best.shape[0] != placements.shape[1]:
            raise bad(f"its best placement has shape {best.shape} and type {best.dtype}, not one device id per unit")
        best = best.astype(np.int64)
        entry = state.cache.get(best.tobytes())
        if entry is None or entry[1] or entry[2] or entry[0] != state.best_step_time or entry[0] != fastest:
            raise bad("its best placement and step time are not the fastest feasible placement of its cache")
        state.best_placement = best
    curve = snap.get("curve")
    # never rising, compared pairwise: np.diff warned on the inf - inf of the samples before a feasible one
    if not isinstance(curve, np.ndarray) or curve.dtype.kind != "f" or curve.shape != (samples,) or \
            np.isnan(curve).any() or (curve[1:] > curve[:-1]).any():  # fmt: skip
        raise bad(f"its curve is not {samples} best-so-far step times")
    if samples and curve[-1] != state.best_step_time:
        raise bad("its curve does not end at its best step time")
    state.curve = [float(x) for x in curve]
    if state.feasible > samples or (state.feasible and best is None):
        raise bad("its feasible sample count disagrees with its cache")
    meta = snap.get("meta", {})
    if not isinstance(meta, dict):
        raise bad("its meta is not an object")
    digest = snap.get("history_digest")
    if digest is not None and not isinstance(digest, str):
        raise bad("its history digest is not text")
    return state


def _load_strategy(path: Path, strategy, saved, allowed: np.ndarray | None) -> None:
    """Restore the strategy's state: its structure must be the one this strategy (with this run's
    config, on this search space) writes, and a copy of the restored strategy must ask for valid
    placements; else one error line."""
    import copy

    def bad(what: str) -> PostplaceError:
        return PostplaceError(f"{path}: {what}; resume it with the settings that wrote it, or start a new run")

    fresh = strategy.state_dict()
    why = _unlike(fresh, saved, "strategy")
    if not why and isinstance(fresh, dict) and "name" in fresh and saved.get("name") != fresh["name"]:
        why = f"it is the state of strategy '{str(saved.get('name'))[:30]}', not '{fresh['name']}'"
    if not why and allowed is not None:
        why = _bad_arrays(saved, "strategy", allowed)
    if why:
        raise bad(f"the strategy state does not fit this run ({why})")
    try:
        strategy.load_state_dict(saved)
        space = getattr(strategy, "space", None)
        probe = copy.deepcopy(strategy, {} if space is None else {id(space): space})
        placements = np.atleast_2d(np.asarray(probe.ask(1), dtype=np.int64))
        _check_allowed(placements, allowed, "the restored strategy")
    except PostplaceError as exc:
        raise bad(f"the restored strategy does not work ({exc})") from None
    except (KeyError, TypeError, ValueError, IndexError, AttributeError, OverflowError, ZeroDivisionError,
            FloatingPointError, RuntimeError) as exc:  # fmt: skip
        raise bad(f"a checkpoint of another kind of run ({type(exc).__name__}: {str(exc)[:120]})") from None


def _unlike(fresh, saved, where: str) -> str:
    """Why ``saved`` does not have the structure of ``fresh`` (a strategy's state now): '' when it does.
    Dicts need the same keys (a saved one may lack some), arrays the same dtype kind and shape (and
    finite values where the fresh ones are), scalars the same type; the config must be equal (a field
    it lacks, from before the field existed, counts as the run's: a field added later keeps the old
    behaviour at its default); lists are compared item by item when both have the same length."""
    if isinstance(fresh, dict):
        if not isinstance(saved, dict):
            return f"{where} is not an object"
        extra = set(saved) - set(fresh)
        if fresh and extra:  # an empty dict now (an optimizer's state before its first step) is open
            return f"{where} has unknown fields {sorted(map(str, extra))[:3]}"
        if where == "strategy.config" and _plain({**fresh, **saved}) != _plain(fresh):
            return "its config differs from the run's"
        return next((w for k in saved if k in fresh and (w := _unlike(fresh[k], saved[k], f"{where}.{k}"))), "")
    if isinstance(fresh, np.ndarray):
        if not isinstance(saved, np.ndarray) or saved.dtype.kind != fresh.dtype.kind or (
                fresh.ndim and saved.shape != fresh.shape):  # fmt: skip
            return f"{where} is not a {fresh.dtype} array of shape {fresh.shape}"
        if fresh.dtype.kind == "f" and np.isfinite(fresh).all() and not np.isfinite(saved).all():
            return f"{where} holds NaN or infinite values"
        return ""
    if isinstance(fresh, list | tuple):
        if not isinstance(saved, list | tuple):
            return f"{where} is not a list"
        if len(fresh) == len(saved):
            return next((w for k, (a, b) in enumerate(zip(fresh, saved, strict=True))
                         if (w := _unlike(a, b, f"{where}.{k}"))), "")  # fmt: skip
        return ""
    if fresh is None:
        return ""
    if isinstance(fresh, bool) or isinstance(fresh, str):
        return "" if type(saved) is type(fresh) else f"{where} is {str(saved)[:30]!r}, not a {type(fresh).__name__}"
    if isinstance(fresh, int):
        ok = type(saved) is int and (saved >= 0 or fresh < 0)
        return "" if ok else f"{where} is {str(saved)[:30]!r}, not a count"
    if isinstance(fresh, float):
        ok = isinstance(saved, int | float) and not isinstance(saved, bool) and not np.isnan(saved)
        return "" if ok else f"{where} is {str(saved)[:30]!r}, not a number"
    return ""


def _bad_arrays(saved, where: str, allowed: np.ndarray) -> str:
    """Why the arrays of a strategy's saved state cannot be its own: '' when they can. Arrays hold
    numbers (no text, no NaN); an integer array of one row per placement over the search's units holds
    device ids each unit may use; parallel lists (a list of lists of arrays, as the batches a strategy
    keeps: placements, scores, feasibility) agree on every batch's length."""
    G, D = allowed.shape
    if isinstance(saved, np.ndarray):
        if saved.dtype.kind not in "biuf":
            return f"{where} holds {saved.dtype} values, not numbers"
        if saved.dtype.kind == "f" and np.isnan(saved).any():
            return f"{where} holds NaN"
        if saved.dtype.kind in "iu" and saved.ndim == 2 and saved.shape[1] == G and saved.size:
            if ((saved < 0) | (saved >= D)).any() or not allowed[np.arange(G)[None, :], saved].all():
                return f"{where} puts a unit on a device it may not use"
        return ""
    if isinstance(saved, dict):
        return next((w for k, v in saved.items() if (w := _bad_arrays(v, f"{where}.{k}", allowed))), "")
    if isinstance(saved, list | tuple):
        why = next((w for k, v in enumerate(saved) if (w := _bad_arrays(v, f"{where}.{k}", allowed))), "")
        if why:
            return why
        rows = [x for x in saved if isinstance(x, list | tuple) and x and all(isinstance(a, np.ndarray) for a in x)]
        if len(rows) >= 2 and len(rows) == len(saved) and len({len(x) for x in rows}) == 1:
            for k in range(len(rows[0])):
                if len({a.shape[0] if a.ndim else -1 for a in (x[k] for x in rows)}) != 1:
                    return f"{where}: the lists' item {k} differ in length"
        return ""
    return ""


def _plain(x):
    if isinstance(x, dict):
        return {k: _plain(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [_plain(v) for v in x]
    return x


def _prefix_chunks(path: Path, size: int):
    """The first ``size`` bytes of ``path`` (fewer if it is shorter), in chunks of at most 1 MiB."""
    with open(path, "rb") as f:
        left = size
        while left > 0:
            chunk = f.read(min(left, 1 << 20))
            if not chunk:
                return
            yield chunk
            left -= len(chunk)


def _count_lines(path: Path, size: int) -> int:
    return sum(chunk.count(b"\n") for chunk in _prefix_chunks(path, size))


def _keep_timing(path: Path, samples: int) -> None:
    """Keep the timing lines a resumed checkpoint covers. The file is a record, not state: a damaged line
    is dropped, never an error."""
    kept = [row for row in read_timing(path) if row["samples"] <= samples]
    path.write_text("".join(json.dumps(row) + "\n" for row in kept))


def read_timing(path: str | Path) -> list[dict]:
    """The well-formed lines of a ``timing.jsonl`` with ``samples`` strictly increasing (a torn or damaged
    line, or one out of order, is left out); [] when there is no such file."""
    try:
        text = Path(path).read_bytes().decode("utf-8", errors="replace")
    except OSError:
        return []
    rows, last = [], 0
    for line in text.splitlines():
        try:
            row = json.loads(line)
            n, t = row["samples"], row["time_s"]
        except (json.JSONDecodeError, TypeError, KeyError, IndexError, RecursionError):
            continue
        if type(n) is int and last < n <= _INT64_MAX and type(t) in (int, float) and abs(t) <= 1e300 and t >= 0:
            rows.append({"samples": n, "time_s": float(t)})
            last = n
    return rows


def sample_times(timing: list[dict], n: int) -> np.ndarray | None:
    """Seconds since the run started at each of its first ``n`` samples (its batch's line in
    :func:`read_timing`'s rows); None when the rows do not reach sample ``n``."""
    ends = np.array([row["samples"] for row in timing], dtype=np.int64)
    if not n or not ends.size or ends[-1] < n:
        return None
    batch = np.searchsorted(ends, np.arange(1, n + 1), side="left")  # ends increase: the batch holding sample k
    return np.array([row["time_s"] for row in timing], dtype=float)[batch]


def read_history(path: str | Path) -> list[dict]:
    """The well-formed lines of a ``history.jsonl``; [] when there is no such file. A torn last line (a
    kill mid-write) is skipped, and so is any line that is not a sample: not an object, or whose
    ``step_time_s`` is not a finite number >= 0, or whose ``oom`` / ``failed`` is not true or false
    (the file is a record read by people and reports, never state)."""
    path = Path(path)
    if not path.exists():
        return []
    rows = []
    try:
        text = path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as exc:
        raise PostplaceError(f"{path}: not UTF-8 at byte {exc.start}: the run folder is damaged") from None
    except OSError as exc:
        raise PostplaceError(f"{path}: cannot read the history ({exc.strerror or exc})") from None
    for line in text.splitlines():
        try:
            row = json.loads(line)
        except (json.JSONDecodeError, RecursionError):
            continue
        if _sample_row(row):
            rows.append(row)
    return rows


def _sample_row(row) -> bool:
    if not isinstance(row, dict):
        return False
    t = row.get("step_time_s")
    if isinstance(t, bool) or not isinstance(t, int | float):
        return False
    try:
        if not (np.isfinite(float(t)) and t >= 0):
            return False
    except OverflowError:
        return False
    return all(isinstance(row.get(k, False), bool) for k in ("oom", "failed", "cached"))


def best_so_far(history: list[dict]) -> np.ndarray:
    """Best feasible step time after each sample of a history (inf before the first feasible one)."""
    t = np.array([h.get("step_time_s", np.inf) if not (h.get("oom") or h.get("failed")) else np.inf
                  for h in history], dtype=float)  # fmt: skip
    return np.minimum.accumulate(t) if t.size else t


def _save(out: Path, snapshot: dict, history, meta: dict | None) -> None:
    if history:
        history.flush()
    curve, n_curve = snapshot["curve"]
    cache, n_cache = snapshot["cache"]
    entries = list(cache.items())[:n_cache]
    width = len(entries[0][0]) if entries else 0
    keys = np.frombuffer(b"".join(k for k, _ in entries), dtype=np.uint8).reshape(len(entries), width)
    on_disk = {
        "strategy": snapshot["strategy"],
        "runner": snapshot["runner"],
        "curve": np.asarray(curve[:n_curve], dtype=np.float64),
        "cache_keys": keys,
        "cache_step": np.array([v[0] for _, v in entries], dtype=np.float64),
        "cache_oom": np.array([v[1] for _, v in entries], dtype=bool),
        "cache_failed": np.array([v[2] for _, v in entries], dtype=bool),
        "cache_reasons": [v[3] for _, v in entries],
        "cache_overflow": np.array([v[4] for _, v in entries], dtype=np.float64),
        "meta": meta or {},
        "history_digest": _history_digest(out / HISTORY, int(snapshot["runner"]["history_bytes"])),
    }
    save_state(out / CHECKPOINT, on_disk)


def _history_digest(path: Path, size: int) -> str:
    """A hash of the first ``size`` bytes of the history: what the checkpoint covers, so a resume can tell a
    damaged history from a whole one."""
    h = hashlib.blake2b(digest_size=16)
    for chunk in _prefix_chunks(path, size):
        h.update(chunk)
    return h.hexdigest()


def checkpoint_samples(out: str | Path) -> int:
    """How many samples the checkpoint in run folder ``out`` covers."""
    path = Path(out) / CHECKPOINT
    snap = load_state(path)
    runner = snap.get("runner") if isinstance(snap, dict) else None
    n = runner.get("samples") if isinstance(runner, dict) else None
    if type(n) is not int or n < 0:
        raise PostplaceError(f"{path}: no sample count (edited or damaged); start a new run")
    return n


def read_meta(out: str | Path) -> dict:
    """The ``meta`` dict a run folder's checkpoint was saved with."""
    path = Path(out) / CHECKPOINT
    snap = load_state(path)
    meta = snap.get("meta", {}) if isinstance(snap, dict) else None
    if not isinstance(meta, dict):
        raise PostplaceError(f"{path}: not a search checkpoint (its meta is not an object; edited or damaged); "
                             "start a new run")  # fmt: skip
    return meta


class _Progress:
    """A bar on a terminal; elsewhere (a log file, a pipe, CI) one plain line on stderr every
    :data:`PLAIN_EVERY_S` seconds, so a long run is never silent."""

    def __init__(self, budget: Budget, done: int):
        import sys

        total = budget.samples if budget.samples is not None else None
        self.budget, self.total = budget, total
        self.t0 = self.last = time.perf_counter()
        self.done0 = done
        self.p = None
        if sys.stderr.isatty():
            from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

            self.p = Progress(TextColumn("search"), BarColumn(), TextColumn("{task.completed}/{task.total} samples"),
                              TextColumn("{task.fields[info]}"), TimeElapsedColumn(), transient=True)  # fmt: skip
            self.p.start()
            self.task = self.p.add_task("search", total=total, completed=done, info="")

    def update(self, state: _RunState) -> None:
        import sys

        now = time.perf_counter()
        rate = (state.samples - self.done0) / max(now - self.t0, 1e-9)
        info = (f"best {state.best_step_time * 1e3:.3f} ms  batch mean {state.last_batch_mean * 1e3:.3f} ms  "
                f"{rate:.0f} samples/s")  # fmt: skip
        if self.p is not None:
            self.p.update(self.task, completed=state.samples, info=info)
        elif now - self.last >= PLAIN_EVERY_S:
            self.last = now
            of = f"/{self.total}" if self.total is not None else ""
            print(f"search: {state.samples}{of} samples, {info}, {now - self.t0:.0f} s", file=sys.stderr, flush=True)

    def close(self) -> None:
        if self.p is not None:
            self.p.stop()


#: seconds between two plain progress lines when stderr is not a terminal
PLAIN_EVERY_S = 10.0
