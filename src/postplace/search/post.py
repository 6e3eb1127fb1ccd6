"""Post: cross-entropy minimization interleaved with proximal policy optimization.

Gao, Chen, Li. "Post: Device Placement with Cross-Entropy Minimization and Proximal Policy
Optimization". NeurIPS 2018. The policy is one softmax over the D devices per unit (a product of
categoricals). Placements are sampled ``batch_size`` (K) at a time; after each batch:

* at every multiple of ``ce_every`` (N) samples: the cross-entropy step. The elite is the best
  ``elite_fraction`` of the *feasible* samples since the last CE step (at least one; if none is feasible
  the step is skipped); each unit's distribution becomes the elite's device frequencies, mixed with
  uniform over its allowed devices by ``eps``. Adam's moments are reset, since the logits just jumped;
* otherwise: PPO. ``ppo_epochs`` Adam steps of gradient ascent on the clipped surrogate over the batch,
  with the log-probabilities recorded when the batch was sampled.

Reward ``-sqrt(step time)`` (the hierarchical planner's), advantage = reward minus the batch mean over
the batch std (zero when the std is zero). Infeasible samples score the failing step time, above every
feasible one, and never enter the elite.

Configurations: ``paper`` starts uniform over each unit's allowed devices, as the paper does; the
default starts from a device-aware prior (``init="speed"``, see :func:`speed_prior`) because a uniform
start over one slow CPU and several identical GPUs spends most of the budget undoing random spreads.
The ``ce`` and ``ppo`` ablations are this file with one half switched off.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace

import numpy as np

from postplace.search.policy import (
    Adam,
    CategoricalPolicy,
    cross_entropy_update,
    normalized_advantage,
    ppo_gradient,
)
from postplace.search.strategy import SearchSpace, rng_from_state, rng_state, scores


@dataclass(frozen=True)
class PostConfig:
    batch_size: int = 48
    """K: placements sampled per batch; PPO runs after every batch. The paper does not state K; chosen
    by the recorded sweep (benchmarks/sweep.py on zoo models, then small enumerated instances; see
    benchmarks/RESULTS.md, 'Post's defaults')."""
    ce_every: int = 480
    """N: a cross-entropy step replaces PPO at every multiple of N samples (a multiple of K). Sweep."""
    elite_fraction: float = 0.1
    """Share of the recent feasible samples kept as the elite: 10%, as in the paper."""
    eps: float | None = None
    """Mixing weight of uniform-over-allowed after a CE step, so no allowed device reaches zero. None:
    ``min(eps_cap, eps_units / G)``, so that about ``eps_units`` units per sample are redrawn
    uniformly whatever the number of units G (a fixed eps redraws many units of a large graph, most of
    them onto a slow CPU)."""
    eps_units: float = 2.0
    """With eps=None: expected number of units per sample redrawn uniformly after a CE step. Sweep."""
    eps_cap: float = 0.25
    """With eps=None: the largest eps used (small graphs). Chosen on small enumerated instances."""
    lr: float = 0.1
    """Adam learning rate on the logits (PPO steps). Sweep."""
    ppo_epochs: int = 10
    """Gradient steps per PPO update over one batch (the paper: 'several, e.g. 10')."""
    clip: float = 0.1
    """PPO clip range. 0.1 (Schulman et al. 2017 also use it) rather than 0.2: the same zoo score, and
    100/100 instead of 93/100 optima reached on small enumerated instances (RESULTS.md)."""
    init: str = "speed"
    """'uniform' (the paper) or 'speed' (device-aware prior, see speed_prior)."""
    anchor_weight: float = 0.7
    """With init='speed': prior probability mass on each unit's anchor device (the fastest overall).
    Sweep (0.5, 0.7, 0.9)."""
    use_ce: bool = True
    """Run cross-entropy steps (False: the 'ppo' ablation)."""
    use_ppo: bool = True
    """Run PPO steps (False: the 'ce' ablation)."""

    @classmethod
    def paper(cls) -> PostConfig:
        """The paper's setting: uniform start."""
        return cls(init="uniform")


def speed_prior(space: SearchSpace, anchor_weight: float) -> np.ndarray:
    """Initial logits: most mass on one anchor device, the rest spread by relative speed.

    The anchor is the device with the least total time over all units (first by index among equals, so
    identical GPUs stop competing for the same role); each unit keeps ``anchor_weight`` on it (when
    allowed) and spreads the rest over its other allowed devices in proportion to their speed on that
    unit (1 / time). It is a prior, not an answer: every allowed device keeps a non-zero probability.
    """
    allowed = space.allowed
    if space.unit_time is None:
        return np.zeros(allowed.shape)
    t = np.where(allowed, space.unit_time, np.inf)
    finite = np.where(np.isfinite(t), t, 0.0)
    anchor = int(np.argmin(np.where(allowed.all(axis=0), finite.sum(axis=0), np.inf)))
    speed = np.where(allowed, 1.0 / np.maximum(t, 1e-12), 0.0)
    speed[:, anchor] = 0.0
    rest = speed / np.maximum(speed.sum(axis=1, keepdims=True), 1e-300)
    has_anchor = allowed[:, anchor]
    others = allowed.sum(axis=1) > 1
    p = np.where(has_anchor[:, None] & others[:, None], (1 - anchor_weight) * rest, rest)
    p[has_anchor, anchor] = np.where(others[has_anchor], anchor_weight, 1.0)
    p = np.where(allowed, np.maximum(p, 1e-6), 0.0)
    with np.errstate(divide="ignore"):
        return np.log(p / p.sum(axis=1, keepdims=True))


class PostStrategy:
    name = "post"

    def __init__(self, space: SearchSpace, *, seed: int = 0, config: PostConfig | None = None):
        self.space = space
        self.config = config or PostConfig()
        if self.config.ce_every % self.config.batch_size:
            raise ValueError("ce_every must be a multiple of batch_size")
        init = speed_prior(space, self.config.anchor_weight) if self.config.init == "speed" else None
        self.policy = CategoricalPolicy(space.allowed, init)
        self.adam = Adam(space.allowed.shape, self.config.lr)
        self.rng = np.random.default_rng(seed)
        self.samples_seen = 0
        self.recent_placements: list[np.ndarray] = []  # since the last CE step
        self.recent_scores: list[np.ndarray] = []
        self.recent_feasible: list[np.ndarray] = []
        self._pending_log_prob: np.ndarray | None = None

    # ---------------------------------------------------------------------------- ask / tell
    def ask(self, max_n: int) -> np.ndarray:
        # never cross a CE boundary inside one batch
        to_boundary = self.config.ce_every - self.samples_seen % self.config.ce_every
        k = max(1, min(self.config.batch_size, max_n, to_boundary))
        placements = self.policy.sample(self.rng, k)
        self._pending_log_prob = self.policy.log_prob(placements)
        return placements

    def tell(self, placements: np.ndarray, step_time: np.ndarray, feasible: np.ndarray) -> None:
        cfg = self.config
        score = scores(np.asarray(step_time, dtype=np.float64), np.asarray(feasible), self.space.failure_step_time)
        old_log_prob = self._pending_log_prob
        if old_log_prob is None or len(old_log_prob) != len(placements):
            old_log_prob = self.policy.log_prob(placements)
        self._pending_log_prob = None
        self.samples_seen += len(placements)
        self.recent_placements.append(np.asarray(placements))
        self.recent_scores.append(score)
        self.recent_feasible.append(np.asarray(feasible, dtype=bool))

        if cfg.use_ce and self.samples_seen % cfg.ce_every == 0:
            self._cross_entropy_step()
        elif cfg.use_ppo:
            self._ppo_step(np.asarray(placements), score, old_log_prob)
        if not cfg.use_ce and self.samples_seen % cfg.ce_every == 0:
            self._forget_recent()

    def _ppo_step(self, placements: np.ndarray, score: np.ndarray, old_log_prob: np.ndarray) -> None:
        advantage = normalized_advantage(-np.sqrt(score))
        if not advantage.any():
            return
        for _ in range(self.config.ppo_epochs):
            grad = ppo_gradient(self.policy, placements, old_log_prob, advantage, self.config.clip)
            self.policy.logits = self.adam.step(self.policy.logits, grad)

    def _cross_entropy_step(self) -> None:
        placements = np.concatenate(self.recent_placements)
        score = np.concatenate(self.recent_scores)
        feasible = np.concatenate(self.recent_feasible)
        self._forget_recent()
        ok = np.flatnonzero(feasible)
        if ok.size == 0:
            return  # no feasible sample: nothing to fit
        n_elite = max(1, int(np.floor(self.config.elite_fraction * ok.size)))
        elite = ok[np.argsort(score[ok], kind="stable")[:n_elite]]
        cross_entropy_update(self.policy, placements[elite], self.eps)
        self.adam.reset(self.policy.logits.shape)

    @property
    def eps(self) -> float:
        cfg = self.config
        return cfg.eps if cfg.eps is not None else min(cfg.eps_cap, cfg.eps_units / self.space.num_units)

    def _forget_recent(self) -> None:
        self.recent_placements, self.recent_scores, self.recent_feasible = [], [], []

    # ---------------------------------------------------------------------------- state
    def state_dict(self) -> dict:
        return {
            "name": self.name,
            "config": asdict(self.config),
            "logits": self.policy.logits.copy(),
            "adam": self.adam.state_dict(),
            "rng": rng_state(self.rng),
            "samples_seen": self.samples_seen,
            "recent": [list(map(np.copy, x)) for x in
                       (self.recent_placements, self.recent_scores, self.recent_feasible)],  # fmt: skip
        }

    def load_state_dict(self, state: dict) -> None:
        self.config = replace(self.config, **state["config"])
        self.policy.logits = state["logits"].copy()
        self.adam.load_state_dict(state["adam"])
        self.rng = rng_from_state(state["rng"])
        self.samples_seen = int(state["samples_seen"])
        self.recent_placements, self.recent_scores, self.recent_feasible = (list(x) for x in state["recent"])
        self._pending_log_prob = None


def ce_strategy(space: SearchSpace, *, seed: int = 0, config: PostConfig | None = None) -> PostStrategy:
    """The cross-entropy method alone (Post without PPO)."""
    s = PostStrategy(space, seed=seed, config=replace(config or PostConfig(), use_ppo=False))
    s.name = "ce"
    return s


def ppo_strategy(space: SearchSpace, *, seed: int = 0, config: PostConfig | None = None) -> PostStrategy:
    """PPO alone (Post without cross-entropy steps)."""
    s = PostStrategy(space, seed=seed, config=replace(config or PostConfig(), use_ce=False))
    s.name = "ppo"
    return s
