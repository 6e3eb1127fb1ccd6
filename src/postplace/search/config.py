"""Strategy configurations from the command line: ``--set KEY=VALUE`` and ``--config FILE.toml``.

Every search strategy has one frozen config dataclass (:class:`PostConfig`, :class:`AnnealConfig`...).
Each of its fields (booleans aside) declares its range where its default is written, with
:func:`ranged`: an interval for numbers (``"[1, inf)"``, ``"(0, 1]"``), the allowed words for text,
and a short phrase saying what the field is. :func:`build_config` makes a config from overrides,
checking every value against its field's type and range: an unknown field, a value of the wrong type,
NaN or infinity, or a value outside the range is one error line that names the field and the range::

    --set ce_every=0: ce_every must be an integer >= 1 (samples between cross-entropy steps)

``--set`` values are text (``lr=0.05``, ``eps=none``, ``use_ce=false``); a TOML file gives typed
values, either at the top level or under a ``[STRATEGY]`` table. A dict given to
``postplace.place(config=...)`` and the config a run folder's ``run.json`` records go through
:func:`build_config` too.
"""

from __future__ import annotations

import dataclasses
import math
import re
import tomllib
import typing
from pathlib import Path

from postplace.errors import PostplaceError

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
    "HierarchicalConfig": {"num_groups": 10**6, "grouper_hidden": 4096, "placer_hidden": 4096,
                           "device_embedding": 4096, "groupings_per_ask": 10**4, "placements_per_grouping": 10**4,
                           "lr": 1e3, "tanh_constant": 1e3, "noise_std": 1e3},
}  # fmt: skip
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


def config_class(strategy: str):
    """The config dataclass of a strategy name, and its default instance for that name (a named start
    of :data:`postplace.search.VARIANTS`: its strategy's default with the start's changes; ``post-start``:
    Post's default with learning off; ``local``: Post's with learning off and local moves on)."""
    from postplace.search import VARIANTS, learning_off
    from postplace.search.anneal import AnnealConfig
    from postplace.search.post import PostConfig, local_config
    from postplace.search.random_search import RandomConfig
    from postplace.search.reinforce import ReinforceConfig

    if strategy in VARIANTS:
        base, changes = VARIANTS[strategy]
        cls, default = config_class(base)
        return cls, dataclasses.replace(default, **changes)
    if strategy in ("post", "ce", "ppo"):
        return PostConfig, PostConfig()
    if strategy == "post-start":
        return PostConfig, learning_off(PostConfig())
    if strategy == "local":
        return PostConfig, local_config()
    if strategy == "reinforce":
        return ReinforceConfig, ReinforceConfig()
    if strategy == "anneal":
        return AnnealConfig, AnnealConfig()
    if strategy == "random":
        return RandomConfig, RandomConfig()
    if strategy == "hp":
        from postplace.search.hierarchical import HierarchicalConfig

        return HierarchicalConfig, HierarchicalConfig()
    raise PostplaceError(f"unknown strategy '{strategy}'")


def parse_set(items) -> dict[str, str]:
    """``["lr=0.05", "eps=none"]`` -> ``{"lr": "0.05", "eps": "none"}`` (text, typed later)."""
    out = {}
    for item in items or ():
        key, sep, value = str(item).partition("=")
        if not sep or not key.strip():
            raise PostplaceError(f"--set '{item}': write it as KEY=VALUE, e.g. --set lr=0.05")
        out[key.strip()] = value.strip()
    return out


def read_config_file(path: str | Path, strategy: str) -> dict:
    """The overrides in a TOML file: its ``[strategy]`` table if it has one, else its top level."""
    from postplace.validate import read_text

    path = Path(path)
    try:
        data = tomllib.loads(read_text(path, "config file"))
    except PostplaceError as exc:
        raise PostplaceError(f"--config {exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise PostplaceError(f"--config {path}: not a readable TOML file ({exc})") from None
    table = data.get(strategy, data)
    if not isinstance(table, dict):
        raise PostplaceError(f"--config {path}: [{strategy}] must be a table of config fields")
    from postplace.search import STRATEGIES

    own = table is not data  # inside [strategy] every table is a mistake; at the top, other strategies' tables
    for k, v in table.items():
        if isinstance(v, dict) and (own or k not in STRATEGIES):
            where = f"[{strategy}.{k}]" if own else f"[{k}]"
            raise PostplaceError(f"--config {path}: {where} is a table, not a config field of '{strategy}'; write "
                                 f"its fields as KEY = VALUE under [{strategy}] or at the top of the file")  # fmt: skip
    return {k: v for k, v in table.items() if not isinstance(v, dict)}


def build_config(strategy: str, overrides: dict | None = None, *, source: str = "--set"):
    """The strategy's default config with ``overrides`` (text or typed values) applied and checked."""
    cls, base = config_class(strategy)
    if not overrides:
        return base
    hints = typing.get_type_hints(cls)
    fields = {f.name for f in dataclasses.fields(cls)}
    values = {}
    for key, raw in overrides.items():
        if key not in fields:
            known = ", ".join(sorted(fields))
            raise PostplaceError(f"{source}: '{key}' is not a field of {cls.__name__}; its fields: {known}")
        values[key] = _coerce(raw, hints[key], source, key, field_range(cls, key))
        limit = field_limit(cls, key)
        if limit is not None and isinstance(values[key], int | float) and values[key] > limit:
            rng = field_range(cls, key)
            shown = raw if isinstance(raw, str) and len(raw) <= 24 else f"{values[key]:.3g}"
            raise PostplaceError(f"{source} {key}={shown}: {key} must be at most {limit:g}"
                                 + (f" ({rng.why})" if rng is not None and rng.why else "")
                                 + "; larger values exhaust memory or time")  # fmt: skip
    return dataclasses.replace(base, **values)


def _coerce(raw, hint, source: str, key: str, rng: Range | None):
    """``raw`` as a value of type ``hint`` inside ``rng``: the first of the hint's types that reads it
    and holds it in range (so ``--set init=0,1`` is a tuple, not the text '0,1'); else one error line,
    the range's when some type could read it, the types' otherwise."""
    where = f"{source} {key}"
    args = typing.get_args(hint)
    options = [a for a in args if a is not type(None)] if args else [hint]
    if type(None) in args and (raw is None or (isinstance(raw, str) and raw.lower() in ("none", "null"))):
        return None
    errors, read = [], []
    for typ in options:
        try:
            value = _one(raw, typ, where)
        except PostplaceError as exc:
            errors.append(str(exc))
            continue
        if rng is None or rng.holds(value):
            return value
        read.append(value)
    if read:
        value = read[-1]
        shown = (",".join(map(str, value)) if isinstance(value, tuple) else str(raw)
                 if not isinstance(raw, str) or raw.isprintable() else repr(raw))  # fmt: skip
        raise PostplaceError(f"{source} {key}={shown}: {key} must be {rng.describe(hint)}"
                             + (f" ({rng.why})" if rng.why else ""))  # fmt: skip
    raise PostplaceError(errors[0] if len(errors) == 1 else f"{where}: {raw!r} is not a valid value "
                         f"({'; '.join(e.split(': ', 1)[-1] for e in errors)})")


def _one(raw, typ, where: str):
    text = isinstance(raw, str)
    if typ is bool:
        if isinstance(raw, bool):
            return raw
        if text and raw.lower() in ("true", "false"):
            return raw.lower() == "true"
        raise PostplaceError(f"{where}: {raw!r} is not a boolean (true or false)")
    if typ is int:  # its sign and size are the field's range's to judge
        if isinstance(raw, bool) or not (isinstance(raw, int) or (text and re.fullmatch(r"[+-]?[0-9]+", raw.strip()))):
            raise PostplaceError(f"{where}: {raw!r} is not an integer")
        try:
            return int(raw)
        except ValueError:  # more digits than Python converts
            raise PostplaceError(f"{where}: {raw[:20]}... is not an integer of a sensible size") from None
    if typ is float:
        if isinstance(raw, bool):
            raise PostplaceError(f"{where}: {raw!r} is not a number")
        try:
            value = float(raw)
        except (TypeError, ValueError, OverflowError):
            raise PostplaceError(f"{where}: {raw!r} is not a number") from None
        if not math.isfinite(value):
            raise PostplaceError(f"{where}: {raw!r} is not a finite number")
        return value
    if typ is str:
        if not isinstance(raw, str):
            raise PostplaceError(f"{where}: {raw!r} is not text")
        return raw
    if typing.get_origin(typ) is tuple:
        items = raw.split(",") if text else raw
        if not isinstance(items, list | tuple):
            raise PostplaceError(f"{where}: {raw!r} is not a list")
        return tuple(_one(x, int, where) for x in items)
    raise PostplaceError(f"{where}: values of type {typ} cannot be set here")
