"""The fuzz's judge: one CLI outcome (exit status, stdout, stderr, timed out) and what the case's
documentation promises (:attr:`Case.expect`) make one of :data:`OUTCOMES`.

* ``clean``: exit 2 with one ``error:`` line, for an input that is invalid or undecided;
* ``usage``: exit 2 from the argument parser, naming the flag, for such an input;
* ``refused-valid``: either of those for an input the documentation promises is accepted
  (``expect`` :data:`VALID`): a refusal of a valid input is a defect, not a clean error;
* ``internal``: exit 3 or any other status, or a traceback; ``hang``: killed after the timeout;
* ``accepted``: exit 0, every number of the answer finite, and ``check`` (where given) holds;
* ``accepted-wrong``: exit 0 for a certainly invalid input, a non-finite number, or a failed ``check``.

A ``check`` is the benchmark's own verification of an accepted answer:
:func:`postplace.testing.fuzz_oracle.simulate_check` compares ``simulate``'s step time with bounds the
fuzz computes itself from the files, not with the simulator's.
"""

from __future__ import annotations

import json

import numpy as np

from postplace.testing.fuzz_inputs import INVALID, VALID, Case

__all__ = ["OUTCOMES", "classify"]

OUTCOMES = ("clean", "usage", "refused-valid", "internal", "hang", "accepted", "accepted-wrong")


def classify(case: Case, rc: int | None, out: str, err: str, check=None) -> str:
    """Sort one CLI outcome; ``check(out) -> bool`` verifies an accepted answer where it can."""
    if rc is None:
        return "hang"
    if "Traceback (most recent call last)" in err or rc not in (0, 2):
        return "internal"
    if rc == 2:
        lines = [x for x in err.splitlines() if x.strip()]
        if len(lines) == 1 and lines[0].startswith("error: "):
            refused = "clean"
        elif any("Usage:" in x for x in lines) and any("Error" in x or "Invalid" in x or "Missing" in x for x in lines):
            refused = "usage"
        else:
            return "internal"
        return "refused-valid" if case.expect == VALID else refused
    if case.expect == INVALID:
        return "accepted-wrong"
    if not _all_finite(out):
        return "accepted-wrong"
    if check is not None and not check(out):
        return "accepted-wrong"
    return "accepted"


def _all_finite(out: str) -> bool:
    """Every number in a JSON answer (the last line that parses) is finite."""
    for line in reversed(out.strip().splitlines()):
        try:
            doc = json.loads(line)
        except ValueError:
            continue

        def walk(x):
            if isinstance(x, dict):
                return all(walk(v) for v in x.values())
            if isinstance(x, list):
                return all(walk(v) for v in x)
            if isinstance(x, float):
                return bool(np.isfinite(x))
            return True

        return walk(doc)
    return "inf" not in out and "nan" not in out.lower().replace("nano", "")
