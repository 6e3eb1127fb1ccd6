"""Evaluators that misbehave on purpose, for drills of distributed evaluation (they live here, not in
``tests/``, so that Ray worker processes can import them).

:class:`DyingFactory` wraps another factory; the evaluator it builds kills its own process (``os._exit``,
as a lost node or a segfault would) inside an ``evaluate`` call, according to a call counter shared
through a file by every process of the drill:

* ``die_at``: the calls (numbered from 0 over all processes) that die, e.g. ``(1,)`` kills the
  second call only;
* ``die_from``: every call from this number on dies (None: none).

Each call appends one line to ``log`` (``CALL PID ROWS``) before it runs, so a test can read who
evaluated what. :class:`SleepyEvaluator` sleeps ``seconds`` per placement and then answers like the
one it wraps: a stand-in for a real measurement in benchmarks.
"""

from __future__ import annotations

import fcntl
import os
import time
from dataclasses import dataclass

__all__ = ["DyingFactory", "SleepyFactory"]


@dataclass(frozen=True, eq=False)
class DyingFactory:
    inner: object
    log: str
    die_at: tuple = ()
    die_from: int | None = None
    num_gpus: float = 0.0

    def __call__(self):
        return _Dying(self.inner(), self)


class _Dying:
    def __init__(self, inner, spec: DyingFactory):
        self.inner, self.spec = inner, spec
        self.name = inner.name
        self.failure_step_time = getattr(inner, "failure_step_time", None)
        self.cluster = getattr(inner, "cluster", None)

    def evaluate(self, placements):
        with open(self.spec.log, "a+") as f:
            fcntl.flock(f, fcntl.LOCK_EX)
            f.seek(0)
            call = len(f.read().splitlines())
            f.write(f"{call} {os.getpid()} {len(placements)}\n")
            f.flush()
            fcntl.flock(f, fcntl.LOCK_UN)
        if call in self.spec.die_at or (self.spec.die_from is not None and call >= self.spec.die_from):
            os._exit(3)
        return self.inner.evaluate(placements)


@dataclass(frozen=True, eq=False)
class SleepyFactory:
    inner: object
    seconds: float
    num_gpus: float = 0.0

    def __call__(self):
        return _Sleepy(self.inner(), self.seconds)


class _Sleepy:
    def __init__(self, inner, seconds: float):
        self.inner, self.seconds = inner, seconds
        self.name = inner.name
        self.failure_step_time = getattr(inner, "failure_step_time", None)
        self.cluster = getattr(inner, "cluster", None)

    def evaluate(self, placements):
        time.sleep(self.seconds * len(placements))
        return self.inner.evaluate(placements)
