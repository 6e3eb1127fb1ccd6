"""The ask/tell contract every search strategy follows (as Optuna separates samplers from trials).

A strategy proposes placements (``ask``) and learns from their results (``tell``). It never calls an
evaluator, never reads files and never looks at the clock: the runner drives it. It owns a seeded
``numpy.random.Generator`` and can save and restore its whole state, so a run resumes exactly.

Placements are int arrays ``[k, G]`` over the G placement units (groups) of a :class:`SearchSpace`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

import numpy as np


@dataclass(frozen=True, eq=False)
class SearchSpace:
    """What a strategy may know about the problem: units, devices, and what is allowed where.

    ``allowed[g, d]``: unit g may go on device d (kinds, pins and exclusions already applied; every row
    has at least one True). ``unit_time[g, d]``: summed op time of unit g on device d (inf where not
    allowed), for strategies that start from device-aware priors. ``failure_step_time``: the score an
    OOM or failed placement gets, proven above every feasible step time. ``features``: optional per-unit
    feature rows (op-type counts, sizes) for learned placers such as the hierarchical planner.
    ``edges``: optional (src unit, dst unit, bytes) arrays of the unit graph.
    """

    allowed: np.ndarray
    failure_step_time: float
    unit_time: np.ndarray | None = None
    device_names: tuple[str, ...] = ()
    device_kinds: tuple[str, ...] = ()
    features: np.ndarray | None = None
    edges: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None
    extra: dict = field(default_factory=dict)

    @property
    def num_units(self) -> int:
        return self.allowed.shape[0]

    @property
    def num_devices(self) -> int:
        return self.allowed.shape[1]


class Strategy(Protocol):
    """``ask(max_n)`` returns between 1 and ``max_n`` placements, as many as the strategy wants next
    (so results never depend on how an evaluator batches); ``tell`` gets exactly those placements back
    with their results, in the same order."""

    name: str

    def ask(self, max_n: int) -> np.ndarray: ...

    def tell(self, placements: np.ndarray, step_time: np.ndarray, feasible: np.ndarray) -> None: ...

    def state_dict(self) -> dict: ...

    def load_state_dict(self, state: dict) -> None: ...


def scores(step_time: np.ndarray, feasible: np.ndarray, failure_step_time: float) -> np.ndarray:
    """Step times with every infeasible (OOM or failed) sample replaced by the failing step time."""
    return np.where(feasible, step_time, failure_step_time)


def rng_state(rng: np.random.Generator) -> dict:
    return rng.bit_generator.state


def rng_from_state(state: dict) -> np.random.Generator:
    rng = np.random.default_rng()
    rng.bit_generator.state = state
    return rng
