"""The ``hp`` strategy's registration: the hierarchical planner (:mod:`postplace.search.hierarchical`)
and its config, made only when asked for, since that module needs torch and ``import postplace.search``
does not. Its named starts are here too: ``hp-probe`` (Post's probe start, no local moves) and
``hp-local`` (that start with them); ``hp`` itself starts as the paper's."""

from __future__ import annotations

from postplace.search.registry import register_strategy, register_variant


def _hierarchical_config():
    from postplace.search.hierarchical import HierarchicalConfig  # needs torch: only when asked for

    return HierarchicalConfig()


@register_strategy("hp", config=_hierarchical_config, rank=80)
def hierarchical_planner(space, *, seed=0, config=None):
    """A :class:`postplace.search.hierarchical.HierarchicalPlanner` (importing torch on the first call)."""
    from postplace.search.hierarchical import HierarchicalPlanner

    return HierarchicalPlanner(space, seed=seed, config=config)


register_variant("hp-probe", "hp", rank=90, init="probe", use_local=False)
register_variant("hp-local", "hp", rank=110, init="probe", use_local=True)
