"""The one registry of search strategies: each strategy module registers its own where it is defined.

A new strategy is one file: decorate its maker (a class or function ``make(space, *, seed, config)``) with
:func:`register_strategy`, giving its name, its default config and its rank, name its named starts with
:func:`register_variant`, and import the module in :mod:`postplace.search` so it registers.
:data:`STRATEGIES`, :data:`CONFIGS`, :data:`VARIANTS` and :func:`on_layers_names` are read from here by
:func:`config_class`, :func:`postplace.search.make_strategy` and the command line. This module imports no
strategy.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable

STRATEGIES: dict[str, Callable] = {}
"""Every strategy's maker by name: the strategies in rank order, then their named starts
(:data:`VARIANTS`) in rank order."""

CONFIGS: dict[str, Callable] = {}
"""Each strategy's default config, made on demand (a zero-argument callable), beside its maker in
:data:`STRATEGIES` (a named start of :data:`VARIANTS` is its strategy's default with the start's changes)."""

VARIANTS: dict[str, tuple[str, dict]] = {}
"""Named starts of a strategy: ``name -> (strategy, changes to its default config)``."""

_RANKS: dict[str, tuple[int, float]] = {}  # name -> (0 for a strategy and 1 for a named start, rank)
_ON_LAYERS: set[str] = set()


def _taken(name: str, what: str) -> None:
    if not isinstance(name, str) or not name:
        raise ValueError(f"a {what}'s name must be a non-empty string, not {name!r}")
    if name in STRATEGIES:
        kind = "named start" if name in VARIANTS else "strategy"
        raise ValueError(f"'{name}' is already registered as a {kind}; give the new {what} another name")


def _where(fn: Callable) -> tuple[str, str]:
    return getattr(fn, "__module__", ""), getattr(fn, "__qualname__", "")


def _reorder(table: dict) -> None:
    ordered = sorted(table.items(), key=lambda item: _RANKS[item[0]])  # stable: equal ranks as registered
    table.clear()
    table.update(ordered)


def register_strategy(name: str, *, config: Callable, rank: float = math.inf, on_layers: bool = False):
    """Decorator: register the decorated maker as the strategy ``name``, and return it unchanged.

    Parameters
    ----------
    name : str
        The strategy's name (``--strategy NAME``).
    config : callable
        Makes its default config with no arguments (its config dataclass, or a function).
    rank : float
        Where it stands in :data:`STRATEGIES` and :data:`CONFIGS` (lower first; equal ranks in the order
        registered; default: after those with a rank).
    on_layers : bool
        Written for units: on a micro-batched step it acts on Post's layers and stripes
        (:mod:`postplace.search.on_layers`), so a comparison differs only in the learning rule.

    Returns
    -------
    callable
        The decorator: it registers the maker ``make(space, *, seed, config)`` and returns it unchanged.

    Raises
    ------
    ValueError
        When ``name`` is taken by a strategy or a named start.

    Examples
    --------
    >>> from postplace.search import STRATEGIES
    >>> list(STRATEGIES)[:4]
    ['post', 'ce', 'ppo', 'post-start']
    """

    def add(make: Callable) -> Callable:
        old = STRATEGIES.get(name)
        if old is None or name in VARIANTS or _where(old) != _where(make):  # its own module again: a reload
            _taken(name, "strategy")
        if not callable(config):
            raise ValueError(f"strategy '{name}': config must be callable (it makes the default config)")
        _RANKS[name] = (0, rank)
        STRATEGIES[name] = make
        CONFIGS[name] = config
        if on_layers:
            _ON_LAYERS.add(name)
        _reorder(STRATEGIES)
        _reorder(CONFIGS)
        return make

    return add


def register_variant(name: str, base: str, *, rank: float = math.inf, **changes) -> None:
    """Register the named start ``name``: the strategy ``base`` with ``changes`` to its default config.

    Parameters
    ----------
    name : str
        The named start (``--strategy NAME``).
    base : str
        The registered strategy it starts (its module registers it first).
    rank : float
        Where it stands among the named starts in :data:`STRATEGIES` and :data:`VARIANTS` (lower first;
        default: after those with a rank).
    **changes
        Fields of ``base``'s default config and their values for this start.

    Raises
    ------
    ValueError
        When ``name`` is taken, or ``base`` is no registered strategy (register it first).

    Examples
    --------
    >>> from postplace.search import VARIANTS, config_class
    >>> VARIANTS["reinforce-probe"], config_class("reinforce-probe")[1].init
    (('reinforce', {'init': 'probe', 'use_local': False}), 'probe')
    """
    if VARIANTS.get(name) != (base, dict(changes)):  # the same start again (its module reloaded): kept
        _taken(name, "named start")
    if base not in CONFIGS:
        raise ValueError(f"named start '{name}': its strategy '{base}' is not registered (register it first)")
    _RANKS[name] = (1, rank)
    VARIANTS[name] = (base, dict(changes))
    STRATEGIES[name] = _variant(name)
    _reorder(VARIANTS)
    _reorder(STRATEGIES)


def _variant(name: str) -> Callable:
    base, _ = VARIANTS[name]

    def make(space, *, seed=0, config=None):
        s = STRATEGIES[base](space, seed=seed, config=config if config is not None else config_class(name)[1])
        s.name = name
        return s

    make.__name__ = make.__qualname__ = f"make_{name.replace('-', '_')}"
    return make


def base_of(name: str) -> str:
    """The strategy a name makes: ``name`` itself, or a named start's strategy.

    Parameters
    ----------
    name : str

    Returns
    -------
    str
    """
    return VARIANTS[name][0] if name in VARIANTS else name


def on_layers_names() -> tuple[str, ...]:
    """The strategies registered with ``on_layers=True``, in :data:`STRATEGIES`' order."""
    return tuple(name for name in STRATEGIES if name in _ON_LAYERS)


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
