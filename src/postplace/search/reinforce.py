"""REINFORCE: policy gradient with a moving-average baseline (Williams 1992), the method Post improved on.

Same policy as Post (a softmax over devices per unit). After every batch: advantage = reward minus an
exponential moving average of past batch-mean rewards, one Adam step of ascent on
``mean_i A_i log pi(x_i)``. Reward ``-sqrt(score)`` as in the hierarchical planner, with Post's scores
(infeasible samples above every feasible one, ordered by how far they overflow memory) and Post's
memory-aware start.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace

import numpy as np

from postplace.search.config import ranged
from postplace.search.policy import Adam, CategoricalPolicy, reinforce_gradient
from postplace.search.post import initial_logits
from postplace.search.strategy import SearchSpace, rng_from_state, rng_state, scores


@dataclass(frozen=True)
class ReinforceConfig:
    """REINFORCE's hyperparameters; each field's range (``ranged``) is checked by
    :func:`postplace.search.config.build_config`, and its reason is in the field's docstring."""

    batch_size: int = ranged(48, "[1, inf)", "placements per batch")
    """Placements per batch (the same K as Post, so the comparison is per sample). At least 1."""
    lr: float = ranged(0.1, "(0, inf)", "Adam learning rate")
    """Adam learning rate on the logits. Above 0: at 0 nothing is learned."""
    baseline_decay: float = ranged(0.9, "[0, 1)", "weight of the old baseline in its moving average")
    """Weight of the old baseline in the moving average (the hierarchical planner's 0.9 style). In
    [0, 1): ``B <- d B + (1 - d) mean reward`` averages only for d in [0, 1], and at 1 the baseline
    never moves from the first batch's mean, so once rewards improve every advantage is positive."""
    init: str = ranged("memory", why="start of the policy", choices=("uniform", "speed", "memory"))
    """'uniform', 'speed' or 'memory': the same starts as Post's (its default 'memory'), for a fair
    ablation (Post's 'probe' start is Post's own)."""
    anchor_weight: float = ranged(0.7, "[0, 1]", "prior probability on each unit's home device")
    """Prior mass on each unit's home device with init='speed' or 'memory'. In [0, 1]: a probability,
    as PostConfig.anchor_weight."""
    fill_fraction: float = ranged(0.8, "(0, 1]", "share of each device's memory the memory fill may use")
    """With init='memory': as PostConfig.fill_fraction, in (0, 1]."""


class ReinforceStrategy:
    name = "reinforce"

    def __init__(self, space: SearchSpace, *, seed: int = 0, config: ReinforceConfig | None = None):
        self.space = space
        self.config = config or ReinforceConfig()
        cfg = self.config
        init = initial_logits(space, cfg.init, cfg.anchor_weight, cfg.fill_fraction)
        self.policy = CategoricalPolicy(space.allowed, init)
        self.adam = Adam(space.allowed.shape, self.config.lr)
        self.rng = np.random.default_rng(seed)
        self.baseline: float | None = None

    def ask(self, max_n: int) -> np.ndarray:
        return self.policy.sample(self.rng, max(1, min(self.config.batch_size, max_n)))

    def tell(
        self, placements: np.ndarray, step_time: np.ndarray, feasible: np.ndarray, overflow: np.ndarray | None = None
    ) -> None:
        reward = -np.sqrt(scores(np.asarray(step_time, dtype=np.float64), np.asarray(feasible),
                                 self.space.failure_step_time, overflow, self.space.overflow_scale))  # fmt: skip
        if self.baseline is None:
            self.baseline = float(reward.mean())
        advantage = reward - self.baseline
        scale = max(float(np.abs(advantage).max()), 1e-12)
        grad = reinforce_gradient(self.policy, np.asarray(placements), advantage / scale)
        self.policy.logits = self.adam.step(self.policy.logits, grad)
        d = self.config.baseline_decay
        self.baseline = d * self.baseline + (1 - d) * float(reward.mean())

    def state_dict(self) -> dict:
        return {"name": self.name, "config": asdict(self.config), "logits": self.policy.logits.copy(),
                "adam": self.adam.state_dict(), "rng": rng_state(self.rng), "baseline": self.baseline}  # fmt: skip

    def load_state_dict(self, state: dict) -> None:
        self.config = replace(self.config, **state["config"])
        self.policy.logits = state["logits"].copy()
        self.adam.load_state_dict(state["adam"])
        self.rng = rng_from_state(state["rng"])
        self.baseline = state["baseline"]
