"""Post's probe start for the other learning strategies (REINFORCE, the hierarchical planner).

With ``init="probe"`` a strategy first asks :class:`postplace.search.starts.StartProbe`'s candidate
homes, one evaluation each, exactly as Post does (the same candidates: on a micro-batched step whose
space has layers, :func:`postplace.search.layers.layer_candidates`), and once they are told starts
from the chosen home as Post does (``PostStrategy._start_from_probe``): the prior of
:func:`postplace.search.post.anchored_prior` on it, with ``anchor_weight`` on each unit's home, or for
a spread-out start ``1 - min(0.5, u / G)``, u Post's ``partition_units`` for a METIS partition
(``part...``) and its ``stripe_units`` for a layer stripe (``stripe...``). These strategies place
units, not layers, so G is the units' count, u for a stripe is the units ``stripe_units`` layers hold on
average, and the home is the start's unit placement (Post on layers counts and anchors layer decisions;
a rival run on layers, :mod:`postplace.search.on_layers`, counts layers as Post does).
A strategy whose config has no such field takes Post's default (:data:`POST_DEFAULTS`), so every rival
given this start starts where Post does. Why: a comparison of learning methods from different starts
measures the starts as much as the learning (issue 20).
"""

from __future__ import annotations

import numpy as np

from postplace.search.post import PostConfig, anchored_prior, start_probe, start_state, start_weight
from postplace.search.starts import StartProbe
from postplace.search.strategy import SearchSpace

__all__ = ["POST_DEFAULTS", "make_probe", "start_prior", "start_state", "start_weight"]

POST_DEFAULTS = PostConfig()
"""Post's default config: the probe's margin and fill, the home's weight and the partition's spread."""


def make_probe(space: SearchSpace, fill_fraction: float = POST_DEFAULTS.fill_fraction) -> StartProbe:
    """Post's probe over ``space`` (its ``probe_margin`` and candidates), with the strategy's own
    ``fill_fraction``."""
    return start_probe(space, fill_fraction, POST_DEFAULTS.probe_margin)


def start_prior(
    space: SearchSpace,
    probe: StartProbe,
    anchor_weight: float = POST_DEFAULTS.anchor_weight,
    partition_units: float = POST_DEFAULTS.partition_units,
    stripe_units: float = POST_DEFAULTS.stripe_units,
) -> np.ndarray:
    """Log-probabilities ``[G, D]`` of the anchored prior on the probe's chosen home (the probe done)."""
    if space.layers is not None:  # units, not layers: as many units per sample as stripe_units layers hold
        stripe_units *= space.num_units / space.layers.num_layers
    weight = start_weight(probe.name, space.num_units, anchor_weight, partition_units, stripe_units)
    return anchored_prior(space, probe.home, weight)
