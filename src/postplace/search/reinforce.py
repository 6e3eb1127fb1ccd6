"""REINFORCE: policy gradient with a moving-average baseline (Williams 1992), the method Post improved on.

Same policy as Post (a softmax over devices per unit). After every batch: advantage = reward minus an
exponential moving average of past batch-mean rewards, one Adam step of ascent on
``mean_i A_i log pi(x_i)``. Reward ``-sqrt(score)`` as in the hierarchical planner, with Post's scores
(infeasible samples above every feasible one, ordered by how far they overflow memory) and Post's
memory-aware start (``init="memory"``, the default), the paper's uniform one (``init="uniform"``, the
``reinforce-paper`` strategy) or Post's own probe start (``init="probe"``, the ``reinforce-probe``
strategy: :mod:`postplace.search.start_prior`), so that it can be measured against Post from the same start.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace

import numpy as np

from postplace.search.local import LocalSettings
from postplace.search.policy import Adam, CategoricalPolicy, reinforce_gradient
from postplace.search.post import initial_logits
from postplace.search.ranges import ranged
from postplace.search.registry import register_strategy, register_variant
from postplace.search.start_prior import make_probe, start_prior, start_state
from postplace.search.strategy import SearchSpace, rng_from_state, rng_state, scores


@dataclass(frozen=True)
class ReinforceConfig(LocalSettings):
    """REINFORCE's hyperparameters; each field's range (``ranged``) is checked by
    :func:`postplace.search.config.build_config`, and its reason is in the field's docstring. The
    local-move add-on's fields (:class:`postplace.search.local.LocalSettings`) are off by default."""

    batch_size: int = ranged(48, "[1, inf)", "placements per batch")
    """Placements per batch (the same K as Post, so the comparison is per sample). At least 1."""
    lr: float = ranged(0.1, "(0, inf)", "Adam learning rate")
    """Adam learning rate on the logits. Above 0: at 0 nothing is learned."""
    baseline_decay: float = ranged(0.9, "[0, 1)", "weight of the old baseline in its moving average")
    """Weight of the old baseline in the moving average (the hierarchical planner's 0.9 style). In
    [0, 1): ``B <- d B + (1 - d) mean reward`` averages only for d in [0, 1], and at 1 the baseline
    never moves from the first batch's mean, so once rewards improve every advantage is positive."""
    init: str = ranged("memory", why="start of the policy", choices=("uniform", "speed", "memory", "probe"))
    """'uniform', 'speed', 'memory' or 'probe': the same starts as Post's. 'memory' stays the default
    so that earlier numbers stay comparable; 'probe' asks Post's candidate starts first and starts from
    the one Post would choose, with Post's ``probe_margin``, ``partition_units`` and ``stripe_units``
    (:mod:`postplace.search.start_prior`), so REINFORCE and Post learn from the same start."""
    anchor_weight: float = ranged(0.7, "[0, 1]", "prior probability on each unit's home device")
    """Prior mass on each unit's home device with init='speed', 'memory' or 'probe' (for a partition or
    stripe start, Post's rule for those instead: :func:`postplace.search.start_prior.start_prior`). In
    [0, 1]: a probability, as PostConfig.anchor_weight."""
    fill_fraction: float = ranged(0.8, "(0, 1]", "share of each device's memory the memory fill may use")
    """With init='memory' or 'probe' (its memory fill): as PostConfig.fill_fraction, in (0, 1]."""


@register_strategy("reinforce", config=ReinforceConfig, rank=50, on_layers=True)
class ReinforceStrategy:
    """REINFORCE over Post's per-unit softmax policy; see the module docstring.

    Follows the :class:`postplace.search.Strategy` ask/tell contract. ``start_name`` and
    ``start_step_time`` say where the policy started: with ``init="probe"`` the probe's chosen start
    and its step time once its candidates are told (None before), else the prior's name and None.

    Parameters
    ----------
    space : SearchSpace
    seed : int
        Seed of its random generator.
    config : ReinforceConfig, optional
        Default ``ReinforceConfig()``.
    """

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
        # init='probe': Post's candidate starts, asked first; the best becomes the policy's start
        self.probe = make_probe(space, cfg.fill_fraction) if cfg.init == "probe" else None
        self.start_name = {"uniform": "uniform", "speed": "fastest", "memory": "fill"}.get(cfg.init, "fill")
        self.start_step_time: float | None = None
        self.last_origins: list[str] | None = None  # the last ask's, when not all the policy's

    def ask(self, max_n: int) -> np.ndarray:
        """The probe's candidates first (``init="probe"``), then up to ``batch_size`` policy samples."""
        self.last_origins = None  # the policy's
        if self.probe is not None and (first := self.probe.ask(max_n)) is not None:
            self.last_origins = self.probe.last_origins
            return first
        return self.policy.sample(self.rng, max(1, min(self.config.batch_size, max_n)))

    def tell(
        self, placements: np.ndarray, step_time: np.ndarray, feasible: np.ndarray, overflow: np.ndarray | None = None
    ) -> None:
        """One policy-gradient step on a batch; the probe's candidates, when told, only choose the start."""
        score = scores(
            np.asarray(step_time, dtype=np.float64),
            np.asarray(feasible),
            self.space.failure_step_time,
            overflow,
            self.space.overflow_scale,
        )
        feasible = np.asarray(feasible, dtype=bool)
        if self.probe is not None and self.probe.tell(np.asarray(placements), score, np.asarray(step_time), feasible):
            if self.probe.done:
                self._start_from_probe()
            return
        reward = -np.sqrt(score)
        if self.baseline is None:
            self.baseline = float(reward.mean())
        advantage = reward - self.baseline
        scale = max(float(np.abs(advantage).max()), 1e-12)
        grad = reinforce_gradient(self.policy, np.asarray(placements), advantage / scale)
        self.policy.logits = self.adam.step(self.policy.logits, grad)
        d = self.config.baseline_decay
        self.baseline = d * self.baseline + (1 - d) * float(reward.mean())

    def _start_from_probe(self) -> None:
        probe = self.probe
        self.start_name, self.start_step_time = probe.name, probe.step_time
        if probe.home is not None:
            prior = start_prior(self.space, probe, self.config.anchor_weight)
            self.policy.logits = CategoricalPolicy(self.space.allowed, prior).logits

    def state_dict(self) -> dict:
        """The policy's logits, Adam's moments, the random generator, the baseline and the start."""
        return {
            "name": self.name,
            "config": asdict(self.config),
            "logits": self.policy.logits.copy(),
            "adam": self.adam.state_dict(),
            "rng": rng_state(self.rng),
            "baseline": self.baseline,
            "start": start_state(self.probe, self.start_name, self.start_step_time),
        }

    def load_state_dict(self, state: dict) -> None:
        """Restore a state :meth:`state_dict` returned (one from before the start was recorded too)."""
        self.config = replace(self.config, **state["config"])
        self.policy.logits = state["logits"].copy()
        self.adam.load_state_dict(state["adam"])
        self.rng = rng_from_state(state["rng"])
        self.baseline = state["baseline"]
        start = state.get("start", {"scores": [], "out": 0, "name": self.start_name})
        if self.config.init == "probe":
            self.probe = self.probe or make_probe(self.space, self.config.fill_fraction)
            self.probe.load_state_dict(start)
        else:
            self.probe = None
        self.start_name, self.start_step_time = start["name"], start.get("step_time")


# Named starts (postplace.search.VARIANTS): -paper the paper's uniform start without local moves, -probe
# Post's probe start without them, -local that start with them.
register_variant("reinforce-paper", "reinforce", rank=40, init="uniform", use_local=False)
register_variant("reinforce-probe", "reinforce", rank=80, init="probe", use_local=False)
register_variant("reinforce-local", "reinforce", rank=100, init="probe", use_local=True)
