"""The one registry of placers: each placer module registers its own function where it is defined.

A new placer is one file: write ``place_x`` and decorate it with :func:`register_placer` (its name, its
roles, and its rank), then import the module in :mod:`postplace.placers` so it registers. Every list of
placer names (``place``'s candidates and the placers it leaves out of very large steps, ``compare``'s
one-shot rows, the paper's heuristics) is derived from :data:`REGISTRY`. This module imports no placer.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Placer:
    """One placer as the rest of the project sees it: its function, and the roles it plays.

    Parameters
    ----------
    fn : callable
        ``fn(graph, cluster, **kw) -> int64[n_ops]``.
    candidate : bool
        ``place`` weighs it beside the search (:data:`postplace.api.CANDIDATE_PLACERS`).
    heuristic : bool
        A one-shot heuristic of the literature: the best of them that fits is the paper's "best
        heuristic" column.
    quadratic : bool
        Its time grows with ops x ready ops: ``place`` leaves it out on very large steps.
    rank : float
        Where it stands in :data:`REGISTRY` (lower first; equal ranks in the order registered): the order
        ``place`` weighs the candidates in, which breaks ties, and ``compare`` lists its rows in.
    """

    fn: Callable[..., np.ndarray]
    candidate: bool = False
    heuristic: bool = False
    quadratic: bool = False
    rank: float = math.inf


REGISTRY: dict[str, Placer] = {}
"""Every placer by name, with its roles, in rank order (:attr:`Placer.rank`). Filled by
:func:`register_placer` as each placer module is imported."""

PLACERS: dict[str, Callable[..., np.ndarray]] = {}
"""Every placer's function by name, in :data:`REGISTRY`'s order (kept beside it by :func:`register`)."""


def register(name: str, placer: Placer) -> Placer:
    """Put ``placer`` in :data:`REGISTRY` (and its function in :data:`PLACERS`) under ``name``, in its
    rank's place.

    Parameters
    ----------
    name : str
    placer : Placer

    Returns
    -------
    Placer
        ``placer``.

    Raises
    ------
    ValueError
        When ``name`` is taken: two placers may not share a name.
    """
    if not isinstance(name, str) or not name:
        raise ValueError(f"a placer's name must be a non-empty string, not {name!r}")
    old = REGISTRY.get(name)
    if old is not None and (old.fn.__module__, old.fn.__qualname__) != (placer.fn.__module__, placer.fn.__qualname__):
        raise ValueError(
            f"placer '{name}' is registered twice ({REGISTRY[name].fn.__module__}."
            f"{REGISTRY[name].fn.__qualname__} and {placer.fn.__module__}.{placer.fn.__qualname__}); "
            "give the new one another name"
        )
    REGISTRY[name] = placer
    ordered = sorted(REGISTRY.items(), key=lambda item: item[1].rank)  # stable: equal ranks as registered
    REGISTRY.clear()
    REGISTRY.update(ordered)
    PLACERS.clear()
    PLACERS.update((n, p.fn) for n, p in ordered)
    return placer


def register_placer(
    name: str, *, candidate: bool = False, heuristic: bool = False, quadratic: bool = False, rank: float = math.inf
):
    """Decorator: register the decorated function as the placer ``name`` with these roles.

    Parameters
    ----------
    name : str
        The placer's name (``compare``'s row, ``--warm-start NAME``).
    candidate, heuristic, quadratic : bool
        Its roles (:class:`Placer`).
    rank : float
        Where it stands in :data:`REGISTRY` (:attr:`Placer.rank`; default: after those with a rank).

    Returns
    -------
    callable
        The decorator: it registers ``fn(graph, cluster, **kw) -> int64[n_ops]`` and returns it unchanged.

    Raises
    ------
    ValueError
        (When the decorator is applied) for a name that is taken.

    Examples
    --------
    >>> from postplace.placers import REGISTRY
    >>> REGISTRY["m-etf"].candidate, REGISTRY["m-etf"].quadratic, REGISTRY["heft"].candidate
    (True, True, False)
    """

    def add(fn: Callable[..., np.ndarray]) -> Callable[..., np.ndarray]:
        register(name, Placer(fn, candidate=candidate, heuristic=heuristic, quadratic=quadratic, rank=rank))
        return fn

    return add


def names(role: str | None = None) -> tuple[str, ...]:
    """The registered placers' names in :data:`REGISTRY`'s order.

    Parameters
    ----------
    role : str, optional
        ``"candidate"``, ``"heuristic"`` or ``"quadratic"``: only those that play it (:class:`Placer`).

    Returns
    -------
    tuple of str

    Examples
    --------
    >>> from postplace.placers.registry import names
    >>> names("quadratic")
    ('m-etf', 'm-sct')
    """
    if role not in (None, "candidate", "heuristic", "quadratic"):
        raise ValueError(f"unknown placer role {role!r}; choose candidate, heuristic or quadratic")
    return tuple(name for name, p in REGISTRY.items() if role is None or getattr(p, role))
