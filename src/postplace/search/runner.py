"""The runner: ask -> evaluate -> tell, with a budget, a cache, progress, history and checkpoints.

Strategies know nothing of this file (Optuna's split between samplers and the optimize loop). What it
guarantees:

* the strategy decides how many placements it wants at a time; the budget only caps the last batch;
* an identical placement is evaluated once (a cache keyed by the placement's bytes);
* ``history.jsonl`` gets one line per sample: its index, a hash of the placement, the step time, OOM /
  failed flags, whether it came from the cache;
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
from postplace.search.strategy import overflow_bytes
from postplace.sim import Evaluator

CHECKPOINT = "checkpoint.json"
HISTORY = "history.jsonl"
TIMING = "timing.jsonl"


@dataclass(frozen=True)
class Budget:
    samples: int | None = None
    seconds: float | None = None

    @classmethod
    def parse(cls, text: str | int) -> Budget:
        """``2400`` (samples) or ``60s`` / ``5m`` (wall-clock time)."""
        s = str(text).strip()
        m = re.fullmatch(r"(\d+(?:\.\d+)?)\s*([sm])", s)
        if m:
            return cls(seconds=float(m.group(1)) * (60 if m.group(2) == "m" else 1))
        if s.isdigit() and int(s) > 0:
            return cls(samples=int(s))
        raise PostplaceError(f"--budget '{text}': give a number of samples (2400) or a time (60s, 5m)")

    def describe(self) -> str:
        return f"{self.samples} samples" if self.samples is not None else f"{self.seconds:g} s"


@dataclass
class SearchResult:
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

    ``space``: the :class:`SearchSpace` whose ``allowed`` every placement must respect (default: the
    strategy's ``space`` attribute, if it has one).
    """
    out = Path(out_dir) if out_dir is not None else None
    allowed = getattr(space if space is not None else getattr(strategy, "space", None), "allowed", None)
    state = _RunState()
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        if resume:
            state = _RunState.load(out, strategy)
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
            _one_batch(strategy, evaluator, state, history, warm)
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


def _one_batch(strategy, evaluator, state: _RunState, history, placements: np.ndarray) -> None:
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
                "cached": i not in fresh}  # fmt: skip
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

    def snapshot(self, strategy) -> dict:
        """The state at a batch boundary. The curve and the cache only grow, so the snapshot keeps the
        curve's length and a reference to the cache (every entry is a fact about a placement, true at any
        time) instead of copying them at every batch."""
        return {
            "strategy": strategy.state_dict(),
            "runner": {k: v for k, v in self.__dict__.items() if k not in ("cache", "curve")},
            "curve": (self.curve, len(self.curve)),
            "cache": (self.cache, len(self.cache)),  # dicts keep insertion order: the first n entries
        }

    @classmethod
    def load(cls, out: Path, strategy) -> _RunState:
        path = out / CHECKPOINT
        if not path.exists():
            raise PostplaceError(f"{out}: no {CHECKPOINT} to resume from; start a new run with --out {out}")
        snap = load_state(path)
        try:
            runner = snap["runner"]
            state = cls(**{k: v for k, v in runner.items() if k in cls.__dataclass_fields__})
            keys = snap["cache_keys"]
            state.cache = {k.tobytes(): (float(t), bool(o), bool(f), r, float(x)) for k, t, o, f, r, x in zip(
                keys, snap["cache_step"], snap["cache_oom"], snap["cache_failed"], snap["cache_reasons"],
                snap["cache_overflow"], strict=True)}
            state.curve = [float(x) for x in snap["curve"]][: state.samples]
            if state.best_placement is not None:
                state.best_placement = np.asarray(state.best_placement, dtype=np.int64)
            strategy.load_state_dict(snap["strategy"])
        except (KeyError, TypeError, ValueError, IndexError, AttributeError) as exc:
            raise PostplaceError(f"{path}: a checkpoint of another kind of run ({type(exc).__name__}: {exc}); "
                                 "resume it with the strategy that wrote it, or start a new run") from None
        hist = out / HISTORY
        size = hist.stat().st_size if hist.exists() else -1
        if size < state.history_bytes:
            raise PostplaceError(f"{hist}: {max(size, 0)} bytes, shorter than the {state.history_bytes} the checkpoint "
                                 "covers: the run folder is damaged; start a new run")
        want = snap.get("history_digest")
        if want is not None and _history_digest(hist, state.history_bytes) != want:
            raise PostplaceError(f"{hist}: its first {state.history_bytes} bytes are not the ones the checkpoint "
                                 "recorded: the run folder is damaged; start a new run")  # fmt: skip
        with open(hist, "r+b") as f:  # drop samples the checkpoint does not cover
            f.truncate(state.history_bytes)
        if (out / TIMING).exists():
            _keep_timing(out / TIMING, state.samples)
        return state


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
        except (json.JSONDecodeError, TypeError, KeyError):
            continue
        if isinstance(n, int) and not isinstance(n, bool) and n > last and isinstance(t, int | float) \
                and not isinstance(t, bool) and np.isfinite(t) and t >= 0:  # fmt: skip
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
    """The lines of a ``history.jsonl`` (a torn last line, from a kill mid-write, is skipped); [] when
    there is no such file."""
    path = Path(path)
    if not path.exists():
        return []
    rows = []
    try:
        text = path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as exc:
        raise PostplaceError(f"{path}: not UTF-8 at byte {exc.start}: the run folder is damaged") from None
    for line in text.splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return rows


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
    with open(path, "rb") as f:
        left = size
        while left > 0:
            chunk = f.read(min(left, 1 << 20))
            if not chunk:
                break
            h.update(chunk)
            left -= len(chunk)
    return h.hexdigest()


def checkpoint_samples(out: str | Path) -> int:
    """How many samples the checkpoint in run folder ``out`` covers."""
    return int(load_state(Path(out) / CHECKPOINT)["runner"]["samples"])


def read_meta(out: str | Path) -> dict:
    """The ``meta`` dict a run folder's checkpoint was saved with."""
    return load_state(Path(out) / CHECKPOINT).get("meta", {})


class _Progress:
    def __init__(self, budget: Budget, done: int):
        from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

        total = budget.samples if budget.samples is not None else None
        self.budget = budget
        self.t0 = time.perf_counter()
        self.done0 = done
        self.p = Progress(TextColumn("search"), BarColumn(), TextColumn("{task.completed}/{task.total} samples"),
                          TextColumn("{task.fields[info]}"), TimeElapsedColumn(), transient=True)  # fmt: skip
        self.p.start()
        self.task = self.p.add_task("search", total=total, completed=done, info="")

    def update(self, state: _RunState) -> None:
        rate = (state.samples - self.done0) / max(time.perf_counter() - self.t0, 1e-9)
        info = (f"best {state.best_step_time * 1e3:.3f} ms  batch mean {state.last_batch_mean * 1e3:.3f} ms  "
                f"{rate:.0f} samples/s")  # fmt: skip
        self.p.update(self.task, completed=state.samples, info=info)

    def close(self) -> None:
        self.p.stop()
