"""Search: ask/tell strategies over placements, and the runner that drives them.

Strategy names (:data:`STRATEGIES`): ``post`` (Post from its probe start, the default), ``ce`` and
``ppo`` (Post with one half switched off, the same start), ``post-start`` (Post's probe start with every
learning step switched off: it samples its start prior only, the row that says how much learning adds),
``reinforce`` (REINFORCE from Post's memory-aware prior), ``hp`` (the hierarchical planner, the paper's
start), ``random``, ``anneal`` and ``local`` (local moves alone from Post's start, no learning). Named
starts of the learning rivals (:data:`VARIANTS`): ``-paper`` is the paper's uniform start
(``post-paper``, ``ce-paper``, ``ppo-paper``, ``reinforce-paper``; ``hp`` itself starts as the
paper's), and the paper's algorithm: no local moves; ``-probe`` Post's probe start without local moves
(``post-probe``, ``ce-probe``, ``ppo-probe``, ``reinforce-probe``, ``hp-probe``); ``-local`` that start with
them (``reinforce-local``, ``hp-local``; ``post``, ``ce`` and ``ppo`` have both by default).

Local moves (:mod:`postplace.search.local`) are an add-on, not part of Post: every strategy's config
has ``use_local`` (with ``local_fraction``, ``local_units`` and the ablations ``local_pick`` and
``policy_segments``), on by default for ``post``, ``ce`` and
``ppo`` only; :func:`make_strategy` gives the add-on to a strategy whose config asks for it.

Each strategy registers itself where it is defined (:func:`register_strategy` on its maker, with its
default config and rank; :func:`register_variant` for its named starts; :mod:`postplace.search.registry`),
so a new strategy is its own module, imported below.
"""

# Each strategy module registers its strategies and named starts where it defines them
# (postplace.search.registry); importing them here fills STRATEGIES, CONFIGS and VARIANTS, in the order
# their ranks give, whatever the order of these imports.
from postplace.search import hp  # noqa: F401  (registers hp, hp-probe, hp-local without importing torch)
from postplace.search.anneal import AnnealConfig, AnnealStrategy
from postplace.search.local import LocalSettings, with_local
from postplace.search.post import (
    LEARNING,
    LocalStrategy,
    PostConfig,
    PostStrategy,
    learning_off,
    post_start_strategy,
)
from postplace.search.post import ce_strategy as ce_strategy
from postplace.search.post import local_config as local_config
from postplace.search.post import ppo_strategy as ppo_strategy
from postplace.search.problem import Problem, make_problem
from postplace.search.random_search import RandomConfig as RandomConfig
from postplace.search.random_search import RandomStrategy as RandomStrategy
from postplace.search.registry import (
    CONFIGS,
    STRATEGIES,
    VARIANTS,
    base_of,
    config_class,
    on_layers_names,
    register_strategy,
    register_variant,
)
from postplace.search.reinforce import ReinforceConfig as ReinforceConfig
from postplace.search.reinforce import ReinforceStrategy as ReinforceStrategy
from postplace.search.runner import Budget, SearchResult, run
from postplace.search.strategy import SearchSpace, Strategy, scores


def __getattr__(name: str):
    """``ON_LAYERS``: the strategies written for units that act, on a micro-batched step, on Post's layers and
    stripes (:mod:`postplace.search.on_layers`), so a comparison differs only in the learning rule (those
    registered with ``on_layers=True``; the hierarchical planner keeps its own grouper). Read when asked, so a
    strategy registered after import is in it."""
    if name == "ON_LAYERS":
        return on_layers_names()
    raise AttributeError(f"module 'postplace.search' has no attribute '{name}'")


def make_strategy(name: str, space: SearchSpace, *, seed: int = 0, config=None) -> Strategy:
    """A strategy by name; ``post`` with ``config="paper"`` gives the paper's uniform start.

    Parameters
    ----------
    name : str
        A key of :data:`STRATEGIES`: ``post``, ``ce``, ``ppo``, ``post-start``, ``reinforce``,
        ``random``, ``anneal``, ``hp``, ``local``, or a named start of :data:`VARIANTS` (``post-paper``,
        ``ce-paper``, ``ppo-paper``, ``reinforce-paper``, ``post-probe``, ``ce-probe``, ``ppo-probe``,
        ``reinforce-probe``, ``hp-probe``, ``reinforce-local``, ``hp-local``).
    space : SearchSpace
        What the strategy places (``make_problem(...).space``).
    seed : int
        Seed of the strategy's random generator.
    config : dataclass or str, optional
        The strategy's config (e.g. :class:`PostConfig`); ``"paper"`` for Post's paper setting (any
        other string is ignored). None: the strategy's defaults (a named start's own).

    Returns
    -------
    Strategy
        With the local-move add-on (:class:`postplace.search.local.WithLocalMoves`) when its config
        says ``use_local`` and it does not make the moves itself.

    Raises
    ------
    PostplaceError
        For an unknown name.

    Examples
    --------
    >>> import numpy as np
    >>> from postplace.search import SearchSpace, make_strategy
    >>> space = SearchSpace(np.ones((3, 2), dtype=bool), failure_step_time=10.0)
    >>> make_strategy("post", space, config="paper").name, make_strategy("anneal", space).name
    ('post-paper', 'anneal')
    >>> make_strategy("reinforce-probe", space).config.init, make_strategy("post-start", space).config.use_ppo
    ('probe', False)
    """
    from postplace.errors import PostplaceError

    if name == "post" and config == "paper":
        name = "post-paper"
    if name not in STRATEGIES:
        raise PostplaceError(f"unknown strategy '{name}'; choose one of {', '.join(STRATEGIES)}")
    config = None if isinstance(config, str) else config
    if base_of(name) in on_layers_names():
        from postplace.search.on_layers import on_layers

        return with_local(on_layers(STRATEGIES[name], space, seed=seed, config=config))
    return with_local(STRATEGIES[name](space, seed=seed, config=config))


__all__ = [
    "CONFIGS",
    "LEARNING",
    "STRATEGIES",
    "VARIANTS",
    "AnnealConfig",
    "AnnealStrategy",
    "Budget",
    "LocalSettings",
    "LocalStrategy",
    "PostConfig",
    "PostStrategy",
    "Problem",
    "SearchResult",
    "SearchSpace",
    "Strategy",
    "config_class",
    "learning_off",
    "make_problem",
    "make_strategy",
    "post_start_strategy",
    "register_strategy",
    "register_variant",
    "run",
    "scores",
]
