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
has ``use_local`` (with ``local_fraction`` and ``local_units``), on by default for ``post``, ``ce`` and
``ppo`` only; :func:`make_strategy` gives the add-on to a strategy whose config asks for it.
"""

import dataclasses

from postplace.search.anneal import AnnealConfig, AnnealStrategy
from postplace.search.local import LocalSettings, with_local
from postplace.search.post import LocalStrategy, PostConfig, PostStrategy, ce_strategy, local_config, ppo_strategy
from postplace.search.problem import Problem, make_problem
from postplace.search.random_search import RandomConfig, RandomStrategy
from postplace.search.reinforce import ReinforceConfig, ReinforceStrategy
from postplace.search.runner import Budget, SearchResult, run
from postplace.search.strategy import SearchSpace, Strategy, scores

LEARNING = ("use_ce", "use_ppo", "use_local")
"""Post's learning steps, each a boolean of :class:`PostConfig` (those it has): all off in ``post-start``."""


def learning_off(config: PostConfig) -> PostConfig:
    """``config`` with every learning step of :data:`LEARNING` that :class:`PostConfig` has switched off.

    Parameters
    ----------
    config : PostConfig

    Returns
    -------
    PostConfig
        The same start and sampling, no cross-entropy, PPO or local step.
    """
    names = {f.name for f in dataclasses.fields(PostConfig)}
    return dataclasses.replace(config, **{k: False for k in LEARNING if k in names})


def post_start_strategy(space: SearchSpace, *, seed: int = 0, config: PostConfig | None = None) -> PostStrategy:
    """Post's start alone (``post-start``): Post with every learning step switched off.

    With ``config`` (default ``PostConfig()``: the probe start) otherwise, so its policy stays the
    start's prior and it samples that prior only: the row that says how much learning adds to the start.

    Parameters
    ----------
    space : SearchSpace
    seed : int
    config : PostConfig, optional
        Its learning switches are turned off whatever they say.

    Returns
    -------
    PostStrategy
        Named ``post-start``.
    """
    s = PostStrategy(space, seed=seed, config=learning_off(config or PostConfig()))
    s.name = "post-start"
    return s


VARIANTS = {
    "post-paper": ("post", {"init": "uniform", "use_local": False}),
    "ce-paper": ("ce", {"init": "uniform", "use_local": False}),
    "ppo-paper": ("ppo", {"init": "uniform", "use_local": False}),
    "reinforce-paper": ("reinforce", {"init": "uniform", "use_local": False}),
    "post-probe": ("post", {"use_local": False}),
    "ce-probe": ("ce", {"use_local": False}),
    "ppo-probe": ("ppo", {"use_local": False}),
    "reinforce-probe": ("reinforce", {"init": "probe", "use_local": False}),
    "hp-probe": ("hp", {"init": "probe", "use_local": False}),
    "reinforce-local": ("reinforce", {"init": "probe", "use_local": True}),
    "hp-local": ("hp", {"init": "probe", "use_local": True}),
}
"""Named starts of a strategy: ``name -> (strategy, changes to its default config)``. ``-paper``: the
paper's uniform start and algorithm (no local moves); ``-probe``: Post's probe start
(:mod:`postplace.search.start_prior`) without local moves; ``-local``: that start with local moves
(:mod:`postplace.search.local`), as ``post``, ``ce`` and ``ppo`` make them by default."""


def _hierarchical(space, *, seed=0, config=None):
    # the hierarchical planner needs torch; import it only when that strategy is asked for
    from postplace.search.hierarchical import HierarchicalPlanner

    return HierarchicalPlanner(space, seed=seed, config=config)


def _variant(name: str):
    base, _ = VARIANTS[name]

    def make(space, *, seed=0, config=None):
        s = STRATEGIES[base](space, seed=seed, config=config if config is not None else config_class(name)[1])
        s.name = name
        return s

    return make


STRATEGIES = {
    "post": PostStrategy,
    "ce": ce_strategy,
    "ppo": ppo_strategy,
    "post-start": post_start_strategy,
    "reinforce": ReinforceStrategy,
    "random": RandomStrategy,
    "anneal": AnnealStrategy,
    "hp": _hierarchical,
    "local": LocalStrategy,
}
STRATEGIES.update({name: _variant(name) for name in VARIANTS})


def _hierarchical_config():
    from postplace.search.hierarchical import HierarchicalConfig  # needs torch: only when asked for

    return HierarchicalConfig()


CONFIGS = {
    "post": PostConfig,
    "ce": PostConfig,
    "ppo": PostConfig,
    "post-start": lambda: learning_off(PostConfig()),
    "reinforce": ReinforceConfig,
    "random": RandomConfig,
    "anneal": AnnealConfig,
    "hp": _hierarchical_config,
    "local": local_config,
}
"""Each strategy's default config, made on demand, beside its maker in :data:`STRATEGIES` (a named start
of :data:`VARIANTS` is its strategy's default with the start's changes)."""


def config_class(strategy: str):
    """The config dataclass of a strategy name, and its default instance for that name.

    Parameters
    ----------
    strategy : str
        A key of :data:`CONFIGS` or of :data:`VARIANTS` (its strategy's default with the start's changes).

    Returns
    -------
    tuple
        ``(config class, default config)``.

    Raises
    ------
    PostplaceError
        For a name that is no strategy.
    """
    if strategy in VARIANTS:
        base, changes = VARIANTS[strategy]
        cls, default = config_class(base)
        return cls, dataclasses.replace(default, **changes)
    if strategy not in CONFIGS:
        from postplace.errors import PostplaceError

        raise PostplaceError(f"unknown strategy '{strategy}'")
    default = CONFIGS[strategy]()
    return type(default), default
ON_LAYERS = ("reinforce", "random", "anneal")
"""Strategies written for units that act, on a micro-batched step, on Post's layers and stripes
(:mod:`postplace.search.on_layers`), so a comparison differs only in the learning rule. The hierarchical
planner keeps its own grouper."""


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
    base = VARIANTS[name][0] if name in VARIANTS else name
    if base in ON_LAYERS:
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
    "run",
    "scores",
]
