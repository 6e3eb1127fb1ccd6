"""What a strategy config's field may take: each field declares its range where its default is written
(:func:`ranged`), and :func:`postplace.search.config.build_config` checks every value against it.

Below every strategy module (each imports :func:`ranged`), so that the config readers above them can
know every strategy without a circle of imports.
"""

from __future__ import annotations

import dataclasses
import math
import re
import typing

_INTERVAL = re.compile(r"\s*([\[(])\s*([^,\s]+)\s*,\s*([^,\s\])]+)\s*([\])])\s*")


@dataclasses.dataclass(frozen=True)
class Range:
    """The values a config field may take: numbers (or a tuple's items) in ``lo..hi`` (each end open
    or closed), text in ``choices``; ``why`` says what the field is, for the error line."""

    lo: float = -math.inf
    hi: float = math.inf
    lo_closed: bool = False
    hi_closed: bool = False
    choices: tuple[str, ...] = ()
    why: str = ""

    def holds(self, value) -> bool:
        if isinstance(value, str):
            return value in self.choices
        if isinstance(value, tuple):
            return all(self.holds(v) for v in value)
        above = value >= self.lo if self.lo_closed else value > self.lo
        below = value <= self.hi if self.hi_closed else value < self.hi
        return above and below

    def bounds(self) -> str:
        """``>= 1``, ``> 0`` or ``in [0, 1)``."""
        if self.hi == math.inf:
            return f"{'>=' if self.lo_closed else '>'} {self.lo:g}"
        return f"in {'[' if self.lo_closed else '('}{self.lo:g}, {self.hi:g}{']' if self.hi_closed else ')'}"

    def describe(self, hint) -> str:
        """What a value of a field of type ``hint`` must be: ``an integer >= 1``, ``none or a number in
        [0, 1)``, ``one of 'a', 'b'``, ``'random' or a list of integers >= 0``."""
        args = typing.get_args(hint)
        options = [a for a in args if a is not type(None)] if args and typing.get_origin(hint) is not tuple else [hint]
        parts = []
        for typ in options:
            if typ is str:
                words = ", ".join(f"'{c}'" for c in self.choices)
                parts.append(words if len(self.choices) == 1 or len(options) > 1 else f"one of {words}")
            elif typ is int:
                parts.append(f"an integer {self.bounds()}")
            elif typ is float:
                parts.append(f"a number {self.bounds()}")
            elif typing.get_origin(typ) is tuple:
                parts.append(f"a list of integers {self.bounds()}")
        text = " or ".join(parts)
        return f"none or {text}" if type(None) in args else text


def ranged(default, interval: str | None = None, why: str = "", *, choices: tuple[str, ...] = ()):
    """A config dataclass field with its default and its range: ``interval`` for numbers (and for each
    item of a tuple), written ``"[1, inf)"`` or ``"(0, 1]"``; ``choices`` for text; ``why`` a phrase
    saying what the field is (it ends the error line of a value out of range)."""
    lo, hi, lo_closed, hi_closed = -math.inf, math.inf, False, False
    if interval is not None:
        m = _INTERVAL.fullmatch(interval)
        if not m:
            raise ValueError(f"interval {interval!r}: write it as '[lo, hi)', '(0, 1]', '[1, inf)'...")
        lo, hi = float(m[2]), float(m[3])
        lo_closed, hi_closed = m[1] == "[", m[4] == "]"
    rng = Range(lo, hi, lo_closed, hi_closed, tuple(choices), why)
    if not isinstance(default, bool | type(None)) and not rng.holds(default):
        raise ValueError(f"default {default!r} is outside its own range")
    return dataclasses.field(default=default, metadata={"range": rng})


LIMITS: dict[str, dict[str, float]] = {
    "PostConfig": {"batch_size": 10**6, "ppo_epochs": 10**4},
    "ReinforceConfig": {"batch_size": 10**6},
    "RandomConfig": {"batch_size": 10**6},
    "AnnealConfig": {"moves_per_ask": 10**6},
    "HierarchicalConfig": {
        "num_groups": 10**6,
        "grouper_hidden": 4096,
        "placer_hidden": 4096,
        "device_embedding": 4096,
        "groupings_per_ask": 10**4,
        "placements_per_grouping": 10**4,
        "lr": 1e3,
        "tanh_constant": 1e3,
        "noise_std": 1e3,
    },
}
"""Upper bounds on fields whose declared range is open above, past which a value cannot be meant: it
allocates more memory than a machine has (a 10^20-unit hidden layer), runs for ever (10^20 PPO
epochs per batch) or overflows the float32 the hierarchical planner trains in (lr 1e300). A value
above one is an error line naming the bound, as a value outside the range is."""


def field_limit(cls, name: str) -> float | None:
    """The upper bound :data:`LIMITS` puts on field ``name`` of config class ``cls`` (None: its range only)."""
    return LIMITS.get(cls.__name__, {}).get(name)


def field_range(cls, name: str) -> Range | None:
    """The declared :class:`Range` of field ``name`` of config class ``cls`` (None for a boolean)."""
    return {f.name: f for f in dataclasses.fields(cls)}[name].metadata.get("range")
