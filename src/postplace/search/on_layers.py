"""A rival of Post given Post's action space: on a micro-batched step, one stripe per layer.

At m > 1 Post decides per layer which stripe (:mod:`postplace.search.layers`) places its micro-batches,
a few dozen decisions, while a strategy written for units would place hundreds of (layer, micro-batch)
units one by one. A comparison of their learning rules needs one action space: :class:`OnLayers` runs a
unit strategy (REINFORCE, random search, annealing) over the layers as its units and the stripes as its
"devices" (:func:`postplace.search.layers.action_space`) and hands the runner the unit placements those
actions make, as Post does. Everything else (``name``, ``config``, ``policy``, ``start_name``...) is the
strategy's own, so the local-move add-on, run folders and reports see the strategy. A strategy that
starts from Post's probe (``init="probe"``) probes Post's own layer starts on the units, and its policy
is anchored on the winner's stripes, as Post's is.
"""

from __future__ import annotations

from dataclasses import replace
from types import SimpleNamespace

import numpy as np

from postplace.search.layers import action_space
from postplace.search.start_prior import make_probe
from postplace.search.strategy import SearchSpace, Wrapper, scores

__all__ = ["OnLayers", "on_layers"]


class OnLayers(Wrapper):
    """``make(action space)``'s strategy acting on ``space``'s layers (see the module docstring).

    Parameters
    ----------
    make : callable
        ``make(space) -> Strategy`` for the space of layers and stripes.
    space : SearchSpace
        The unit space of a micro-batched step (``space.layers`` set).
    """

    def __init__(self, make, space: SearchSpace):
        self.space = space
        self.layers = space.layers
        self.inner = make(replace(action_space(space), capacity=space.capacity))
        self._asked: dict[bytes, np.ndarray] = {}
        self.probe = None
        if getattr(self.inner, "probe", None) is not None:  # Post's layer starts, probed on the units
            self.probe = make_probe(space, self.inner.config.fill_fraction)
            self.inner.probe = None

    def ask(self, max_n: int) -> np.ndarray:
        if self.probe is not None and (first := self.probe.ask(max_n)) is not None:
            self.last_origins = self.probe.last_origins
            return first
        actions = np.atleast_2d(np.asarray(self.inner.ask(max_n)))
        self.last_origins = getattr(self.inner, "last_origins", None)
        placements = self.layers.expand(actions)
        self._asked = {row.tobytes(): a for row, a in zip(placements, actions, strict=True)}
        return placements

    def actions_of(self, placement: np.ndarray) -> np.ndarray | None:
        """The layer actions that make ``placement`` (one stripe per layer), or None where a layer's units
        follow no stripe (a warm start placed op by op)."""
        actions = self.layers.collapse(placement)  # per layer, the allowed stripe agreeing with most units
        return actions if np.array_equal(self.layers.expand(actions), placement) else None

    def tell(
        self, placements: np.ndarray, step_time: np.ndarray, feasible: np.ndarray, overflow: np.ndarray | None = None
    ) -> None:
        """The strategy learns from the actions of the placements it asked for, and of any other (a warm
        start) that is one stripe per layer; the rest it does not see."""
        placements = np.atleast_2d(np.asarray(placements, dtype=np.int64))
        if self.probe is not None:
            space = self.space
            score = scores(
                np.asarray(step_time, dtype=np.float64),
                np.asarray(feasible),
                space.failure_step_time,
                overflow,
                space.overflow_scale,
            )
            if self.probe.tell(placements, score, np.asarray(step_time), np.asarray(feasible, dtype=bool)):
                if self.probe.done:
                    self._start()
                return
        rows, actions = [], []
        for k, row in enumerate(placements):
            a = self._asked.get(row.tobytes())
            a = self.actions_of(row) if a is None else a
            if a is not None:
                rows.append(k)
                actions.append(a)
        if not rows:
            return
        pick = np.asarray(rows)
        self.inner.tell(
            np.asarray(actions),
            np.asarray(step_time)[pick],
            np.asarray(feasible)[pick],
            None if overflow is None else np.asarray(overflow)[pick],
        )

    def _start(self) -> None:
        """The strategy's policy anchored on the probe's winner, its stripes collapsed to layer actions."""
        probe = self.probe
        home = self.layers.collapse(probe.home) if probe.home is not None else None
        self.inner.probe = SimpleNamespace(name=probe.name, step_time=probe.step_time, home=home, done=True)
        try:
            self.inner._start_from_probe()
        finally:
            self.inner.probe = None

    def state_dict(self) -> dict:
        """The strategy's state (its ``start`` without probe progress: it probes nothing itself), and the
        probe of the units under ``layer_probe``."""
        state = self.inner.state_dict()
        if self.probe is not None:
            state["layer_probe"] = self.probe.state_dict()
        return state

    def load_state_dict(self, state: dict) -> None:
        self.inner.load_state_dict(state)
        if self.probe is not None:
            self.inner.probe = None
            self.probe.load_state_dict(state["layer_probe"])


def on_layers(make, space: SearchSpace, *, seed: int = 0, config=None):
    """``make(space, seed=, config=)``, on ``space``'s layers where it has them (a micro-batched step),
    else (or with a start placement given unit by unit, ``config.init``) on its units."""
    if space.layers is None or isinstance(getattr(config, "init", None), list | tuple | np.ndarray):
        return make(space, seed=seed, config=config)  # a start given unit by unit stays on units
    return OnLayers(lambda s: make(s, seed=seed, config=config), space)
