"""Random search: every unit's device drawn uniformly from its allowed devices. The floor."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from postplace.search.local import LocalSettings
from postplace.search.policy import CategoricalPolicy
from postplace.search.ranges import ranged
from postplace.search.registry import register_strategy
from postplace.search.strategy import SearchSpace, rng_from_state, rng_state


@dataclass(frozen=True)
class RandomConfig(LocalSettings):
    """Random search's setting; its range (``ranged``) is checked by
    :func:`postplace.search.config.build_config`. The local-move add-on's fields
    (:class:`postplace.search.local.LocalSettings`) are off by default."""

    batch_size: int = ranged(24, "[1, inf)", "placements per ask")
    """Placements per ask (any value gives the same samples for a seed: one stream of draws). At
    least 1."""


@register_strategy("random", config=RandomConfig, rank=60, on_layers=True)
class RandomStrategy:
    name = "random"

    def __init__(self, space: SearchSpace, *, seed: int = 0, config: RandomConfig | None = None):
        self.space = space
        self.config = config or RandomConfig()
        self.policy = CategoricalPolicy(space.allowed)
        self.rng = np.random.default_rng(seed)

    def ask(self, max_n: int) -> np.ndarray:
        return self.policy.sample(self.rng, max(1, min(self.config.batch_size, max_n)))

    def tell(
        self, placements: np.ndarray, step_time: np.ndarray, feasible: np.ndarray, overflow: np.ndarray | None = None
    ) -> None:
        pass  # learns nothing, by definition

    def state_dict(self) -> dict:
        return {"name": self.name, "rng": rng_state(self.rng)}

    def load_state_dict(self, state: dict) -> None:
        self.rng = rng_from_state(state["rng"])
