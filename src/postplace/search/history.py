"""A search's records: ``history.jsonl`` (one line per sample) and ``timing.jsonl`` (one line per batch),
written by the runner (:mod:`postplace.search.runner`), read here by resumes, reports and comparisons.
Both are records, not state: a torn or damaged line is left out where they are read as records.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np

from postplace.errors import PostplaceError

HISTORY = "history.jsonl"

TIMING = "timing.jsonl"

INT64_MAX = 2**63 - 1


def history_origins(path: Path) -> tuple[list[str], list[float]]:
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


def count_lines(path: Path, size: int) -> int:
    """The lines in the first ``size`` bytes of ``path``."""
    return sum(chunk.count(b"\n") for chunk in _prefix_chunks(path, size))


def keep_timing(path: Path, samples: int) -> None:
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
        if type(n) is int and last < n <= INT64_MAX and type(t) in (int, float) and abs(t) <= 1e300 and t >= 0:
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
    t = np.array(
        [h.get("step_time_s", np.inf) if not (h.get("oom") or h.get("failed")) else np.inf for h in history],
        dtype=float,
    )
    return np.minimum.accumulate(t) if t.size else t


def history_digest(path: Path, size: int) -> str:
    """A hash of the first ``size`` bytes of the history: what the checkpoint covers, so a resume can tell a
    damaged history from a whole one."""
    h = hashlib.blake2b(digest_size=16)
    for chunk in _prefix_chunks(path, size):
        h.update(chunk)
    return h.hexdigest()
