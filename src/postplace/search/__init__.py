"""Search: ask/tell strategies over placements, and the runner that drives them."""

from postplace.search.anneal import AnnealConfig, AnnealStrategy
from postplace.search.post import PostConfig, PostStrategy, ce_strategy, ppo_strategy
from postplace.search.problem import Problem, make_problem
from postplace.search.random_search import RandomStrategy
from postplace.search.reinforce import ReinforceStrategy
from postplace.search.runner import Budget, SearchResult, run
from postplace.search.strategy import SearchSpace, Strategy, scores

STRATEGIES = {
    "post": PostStrategy,
    "ce": ce_strategy,
    "ppo": ppo_strategy,
    "reinforce": ReinforceStrategy,
    "random": RandomStrategy,
    "anneal": AnnealStrategy,
    "hp": lambda space, *, seed=0, config=None: _hierarchical()(space, seed=seed, config=config),
}


def _hierarchical():
    # the hierarchical planner needs torch; import it only when that strategy is asked for
    from postplace.search.hierarchical import HierarchicalPlanner

    return HierarchicalPlanner


def make_strategy(name: str, space: SearchSpace, *, seed: int = 0, config=None) -> Strategy:
    """A strategy by name; ``post`` with ``config="paper"`` gives the paper's uniform start.

    Parameters
    ----------
    name : str
        A key of :data:`STRATEGIES` (``post``, ``ce``, ``ppo``, ``reinforce``, ``random``, ``anneal``,
        ``hp``) or ``post-paper``.
    space : SearchSpace
        What the strategy places (``make_problem(...).space``).
    seed : int
        Seed of the strategy's random generator.
    config : dataclass or str, optional
        The strategy's config (e.g. :class:`PostConfig`); ``"paper"`` for Post's paper setting (any
        other string is ignored). None: the strategy's defaults.

    Returns
    -------
    Strategy

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
    """
    from postplace.errors import PostplaceError

    if name == "post-paper" or (name == "post" and config == "paper"):
        s = PostStrategy(space, seed=seed, config=config if isinstance(config, PostConfig) else PostConfig.paper())
        s.name = "post-paper"
        return s
    if name not in STRATEGIES:
        raise PostplaceError(f"unknown strategy '{name}'; choose one of {', '.join([*STRATEGIES, 'post-paper'])}")
    return STRATEGIES[name](space, seed=seed, config=None if isinstance(config, str) else config)


__all__ = [
    "STRATEGIES",
    "AnnealConfig",
    "AnnealStrategy",
    "Budget",
    "PostConfig",
    "PostStrategy",
    "Problem",
    "SearchResult",
    "SearchSpace",
    "Strategy",
    "make_problem",
    "make_strategy",
    "run",
    "scores",
]
