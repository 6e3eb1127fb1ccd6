"""Simulated annealing over placements: the MCMC search FlexFlow uses, as a same-budget baseline.

Source: Jia, Zaharia, Aiken, "Beyond Data and Model Parallelism for Deep Neural Networks" (SysML 2019),
section 5.2: start from a placement, propose a random change of one unit's device, accept it with the
Metropolis probability ``min(1, exp(-beta * (new - old)))`` on the simulated cost, keep the best seen.

What FlexFlow fixes and what we chose where it is silent:

- **Proposal** (FlexFlow): one unit, chosen uniformly among the units with more than one allowed
  device, moves to a device drawn uniformly from its other allowed devices. A disallowed device is never
  proposed.
- **Cost scale** (ours): FlexFlow uses a constant ``beta`` on raw milliseconds, which ties the constant
  to one model's step time. We write ``beta = 1 / (T * s_best)`` with ``s_best`` the best score seen so
  far (feasible or not), so the temperature ``T`` is relative: at ``T = 0.1`` a move 10% worse than the
  best step time is accepted with probability ``1/e``, whatever the model.
- **Schedule** (ours): geometric cooling ``T_i = max(T_min, T_0 * cooling**i)`` per proposal decided;
  ``cooling = 1.0`` is FlexFlow's constant temperature.
- **Infeasible** placements (OOM, failed) score above every feasible step time
  (:func:`postplace.search.strategy.scores`: the failing step time, raised by how far the placement
  overflows memory when the runner says), so a chain that starts infeasible walks downhill towards
  less overflow until it finds a feasible placement, then never returns to an infeasible one at low
  temperature.
- **Batches** (ours): ``moves_per_ask`` proposals are drawn from the same current placement and decided
  in order in ``tell``; the first accepted one moves the chain and the rest are discarded (still
  counted for the best). That is exactly the sequential chain, where the discarded proposals are
  speculative work; with the default of 1 no work is wasted.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace

import numpy as np

from postplace.search.local import LocalSettings
from postplace.search.ranges import ranged
from postplace.search.registry import register_strategy
from postplace.search.strategy import SearchSpace, rng_from_state, rng_state, scores


@dataclass(frozen=True)
class AnnealConfig(LocalSettings):
    """Simulated annealing's settings, each with its range.

    Each field's range (``ranged``) is checked by :func:`postplace.search.config.build_config`, and
    its reason is in the field's docstring.

    Parameters
    ----------
    init : "random" or tuple of int
        The start placement: ``"random"`` (default; each unit uniform over its allowed devices) or a
        tuple of G device ids.
    temperature : float
        Initial relative temperature T_0 (default 0.1, > 0).
    cooling : float
        Factor on the temperature per decided proposal (default 0.998, in (0, 1]).
    min_temperature : float
        Floor of the temperature (default 1e-4, > 0).
    moves_per_ask : int
        Proposals per ask (default 1, >= 1).
    local_fraction, local_units, use_local
        The local-move add-on (:class:`postplace.search.local.LocalSettings`), off by default.

    Examples
    --------
    >>> from postplace.search import AnnealConfig
    >>> AnnealConfig(init=(1, 1, 2), cooling=1.0).cooling
    1.0
    """

    init: str | tuple[int, ...] = ranged("random", "[0, inf)", "the start placement", choices=("random",))
    """Start placement: 'random' (each unit uniform over its allowed devices, ours: no heuristic gets
    an unfair head start, DESIGN.md section 4) or a tuple of G device ids. FlexFlow starts from data
    parallelism or an expert strategy; pass such a placement here to do the same. Device ids are
    >= 0; their count and whether each unit may use its device are checked against the problem."""
    temperature: float = ranged(0.1, "(0, inf)", "initial relative temperature")
    """Initial relative temperature T_0 (ours): a move 10% worse than the best seen is accepted with
    probability 1/e at the start. Above 0: the acceptance exponent divides by T."""
    cooling: float = ranged(0.998, "(0, 1]", "factor on the temperature per decided proposal")
    """Multiplicative cooling per decided proposal (ours): T falls by about 100x over Post's budget of
    2,400 samples (0.998**2400 = 0.008). 1.0 is FlexFlow's constant beta. In (0, 1]: above 1 would
    heat the chain up, and 0 drops it to min_temperature after one proposal."""
    min_temperature: float = ranged(1e-4, "(0, inf)", "floor of the temperature")
    """Floor of T (ours): keeps acceptance of equal-cost moves (delta 0, always accepted) and of tiny
    worsenings possible, so the chain can still cross plateaus late. Above 0: T reaches 0 once
    ``cooling**i`` underflows, and the acceptance exponent divides by T."""
    moves_per_ask: int = ranged(1, "[1, inf)", "proposals per ask")
    """Proposals per ask (FlexFlow: 1, a strictly sequential chain). More gives the evaluator a batch
    at the price of speculative proposals discarded after an acceptance. At least 1."""


@register_strategy("anneal", config=AnnealConfig, rank=70, on_layers=True)
class AnnealStrategy:
    """Simulated annealing (Metropolis MCMC) over placements; see the module docstring.

    Follows the :class:`postplace.search.Strategy` ask/tell contract; :func:`postplace.search.run`
    drives it.

    Parameters
    ----------
    space : SearchSpace
    seed : int
        Seed of its random generator.
    config : AnnealConfig, optional
        Default ``AnnealConfig()``.

    Raises
    ------
    ValueError
        When ``config.init`` is not ``"random"`` nor a placement of the space's units on devices
        they may use.

    Examples
    --------
    >>> space = SearchSpace(np.ones((4, 2), dtype=bool), failure_step_time=100.0)
    >>> s = AnnealStrategy(space, seed=0)
    >>> p = s.ask(8)            # the first ask returns the start placement
    >>> p.shape
    (1, 4)
    >>> s.tell(p, np.array([3.0]), np.array([True]))
    >>> s.ask(8).shape         # then one single-unit move per ask
    (1, 4)
    """

    name = "anneal"

    def __init__(self, space: SearchSpace, *, seed: int = 0, config: AnnealConfig | None = None):
        self.space = space
        self.config = config or AnnealConfig()
        self.rng = np.random.default_rng(seed)
        allowed = np.asarray(space.allowed, dtype=bool)
        self._choices = [np.flatnonzero(row) for row in allowed]
        self._movable = np.flatnonzero(allowed.sum(axis=1) > 1)
        self.current: np.ndarray | None = None
        """The chain's placement (None until the start placement's result is told)."""
        self.current_score = np.inf
        self.best: np.ndarray | None = None
        """Best feasible placement seen (never an OOM or failed one), None until one is seen."""
        self.best_score = np.inf
        self.scale = np.inf
        """Best score seen, feasible or not: the cost scale s_best in beta = 1 / (T * s_best)."""
        self.decided = 0
        self.accepted = 0
        if not (isinstance(self.config.init, str) and self.config.init == "random"):
            self._given_start()  # a bad start is refused when the strategy is made, not at its first ask

    # ------------------------------------------------------------------------------ helpers
    @property
    def temperature(self) -> float:
        """The current temperature: ``max(min_temperature, temperature * cooling ** decided)``."""
        c = self.config
        return max(c.min_temperature, c.temperature * c.cooling**self.decided)

    def _start(self) -> np.ndarray:
        if isinstance(self.config.init, str) and self.config.init == "random":
            return np.array([c[self.rng.integers(c.size)] for c in self._choices], dtype=np.int64)
        return self._given_start()

    def _given_start(self) -> np.ndarray:
        """``config.init`` as a placement of the space's units on devices they may use, else ValueError."""
        init = self.config.init
        if isinstance(init, str):
            raise ValueError(f"AnnealConfig.init: unknown start {init!r}; use 'random' or a placement")
        try:
            start = np.asarray(init, dtype=np.int64)
        except (TypeError, ValueError, OverflowError):
            raise ValueError(f"AnnealConfig.init: {init!r} is not a list of device ids") from None
        if start.shape != (self.space.num_units,):
            raise ValueError(f"AnnealConfig.init: {start.size} device ids for {self.space.num_units} units")
        if ((start < 0) | (start >= self.space.num_devices)).any():
            bad = np.flatnonzero((start < 0) | (start >= self.space.num_devices))
            raise ValueError(
                f"AnnealConfig.init: units {bad[:5].tolist()} name no device (ids are 0..{self.space.num_devices - 1})"
            )
        if not np.all(self.space.allowed[np.arange(start.size), start]):
            bad = np.flatnonzero(~self.space.allowed[np.arange(start.size), start])
            raise ValueError(f"AnnealConfig.init: units {bad[:5].tolist()} are on devices they may not use")
        return start

    def _propose(self) -> np.ndarray:
        p = self.current.copy()
        if self._movable.size == 0:  # nothing can move: the only placement there is
            return p
        g = self._movable[self.rng.integers(self._movable.size)]
        others = self._choices[g][self._choices[g] != p[g]]
        p[g] = others[self.rng.integers(others.size)]
        return p

    # ------------------------------------------------------------------------------ ask / tell
    def ask(self, max_n: int) -> np.ndarray:
        """The start placement first; then up to ``moves_per_ask`` single-unit moves (:meth:`Strategy.ask`)."""
        if self.current is None:
            return self._start()[None, :]
        k = max(1, min(self.config.moves_per_ask, max_n))
        return np.stack([self._propose() for _ in range(k)])

    def tell(
        self, placements: np.ndarray, step_time: np.ndarray, feasible: np.ndarray, overflow: np.ndarray | None = None
    ) -> None:
        """Accept or reject the proposals in order, Metropolis's rule (:meth:`Strategy.tell`)."""
        placements = np.atleast_2d(np.asarray(placements, dtype=np.int64))
        feasible = np.asarray(feasible, dtype=bool)
        s = scores(
            np.asarray(step_time, dtype=np.float64),
            feasible,
            self.space.failure_step_time,
            overflow,
            self.space.overflow_scale,
        )
        for i in range(placements.shape[0]):
            if feasible[i] and s[i] < self.best_score:
                self.best, self.best_score = placements[i].copy(), float(s[i])
            self.scale = min(self.scale, float(s[i]))
        if self.current is None:  # the start placement (or the first told, should a runner seed one)
            self.current, self.current_score = placements[0].copy(), float(s[0])
            return
        for i in range(placements.shape[0]):
            # ALGO LOGIC: Metropolis acceptance of proposal i against the chain's current placement
            delta = float(s[i]) - self.current_score
            beta = 1.0 / (self.temperature * max(self.scale, 1e-300))
            self.decided += 1
            if delta <= 0 or self.rng.random() < np.exp(-beta * delta):
                self.current, self.current_score = placements[i].copy(), float(s[i])
                self.accepted += 1
                break  # later proposals in this batch were drawn from the old placement: speculative

    # ------------------------------------------------------------------------------ state
    def state_dict(self) -> dict:
        """The chain, its scores, counters, config and random generator, as JSON-able data."""
        cfg = asdict(self.config)
        if not isinstance(cfg["init"], str):
            cfg["init"] = [int(x) for x in cfg["init"]]

        def arr(a):
            return None if a is None else a.tolist()

        return {
            "name": self.name,
            "config": cfg,
            "rng": rng_state(self.rng),
            "current": arr(self.current),
            "current_score": self.current_score,
            "best": arr(self.best),
            "best_score": self.best_score,
            "scale": self.scale,
            "decided": self.decided,
            "accepted": self.accepted,
        }

    def load_state_dict(self, state: dict) -> None:
        """Restore a state :meth:`state_dict` returned."""
        cfg = dict(state["config"])
        if not isinstance(cfg["init"], str):
            cfg["init"] = tuple(int(x) for x in cfg["init"])
        self.config = replace(self.config, **cfg)
        self.rng = rng_from_state(state["rng"])

        def arr(a):
            return None if a is None else np.asarray(a, dtype=np.int64)

        self.current, self.current_score = arr(state["current"]), float(state["current_score"])
        self.best, self.best_score = arr(state["best"]), float(state["best_score"])
        self.scale = float(state["scale"])
        self.decided, self.accepted = int(state["decided"]), int(state["accepted"])
