"""Strategy configurations from the command line: ``--set KEY=VALUE`` and ``--config FILE.toml``.

Every search strategy has one frozen config dataclass (:class:`PostConfig`, :class:`AnnealConfig`...).
:func:`build_config` makes one from overrides, checking every value against its field's type: an
unknown field, a value of the wrong type, NaN or infinity, or a negative number is one error line that
names the field. ``--set`` values are text (``lr=0.05``, ``eps=none``, ``use_ce=false``); a TOML file
gives typed values, either at the top level or under a ``[STRATEGY]`` table.
"""

from __future__ import annotations

import dataclasses
import math
import tomllib
import typing
from pathlib import Path

from postplace.errors import PostplaceError


def config_class(strategy: str):
    """The config dataclass of a strategy name, and its default instance for that name."""
    from postplace.search.anneal import AnnealConfig
    from postplace.search.post import PostConfig
    from postplace.search.random_search import RandomConfig
    from postplace.search.reinforce import ReinforceConfig

    if strategy in ("post", "ce", "ppo"):
        return PostConfig, PostConfig()
    if strategy == "post-paper":
        return PostConfig, PostConfig.paper()
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
    path = Path(path)
    try:
        data = tomllib.loads(path.read_bytes().decode("utf-8"))
    except FileNotFoundError:
        raise PostplaceError(f"--config {path}: no such file") from None
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise PostplaceError(f"--config {path}: not a readable TOML file ({exc})") from None
    table = data.get(strategy, data)
    if not isinstance(table, dict):
        raise PostplaceError(f"--config {path}: [{strategy}] must be a table of config fields")
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
        values[key] = _coerce(raw, hints[key], f"{source} {key}")
    return dataclasses.replace(base, **values)


def _coerce(raw, hint, where: str):
    args = typing.get_args(hint)
    options = [a for a in args if a is not type(None)] if args else [hint]
    if type(None) in args and (raw is None or (isinstance(raw, str) and raw.lower() in ("none", "null"))):
        return None
    errors = []
    for typ in options:
        try:
            return _one(raw, typ, where)
        except PostplaceError as exc:
            errors.append(str(exc))
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
    if typ is int:
        if isinstance(raw, bool) or not (isinstance(raw, int) or (text and raw.strip().lstrip("-").isdigit())):
            raise PostplaceError(f"{where}: {raw!r} is not an integer")
        value = int(raw)
        if value < 0:
            raise PostplaceError(f"{where}: {value} is negative")
        return value
    if typ is float:
        if isinstance(raw, bool):
            raise PostplaceError(f"{where}: {raw!r} is not a number")
        try:
            value = float(raw)
        except (TypeError, ValueError, OverflowError):
            raise PostplaceError(f"{where}: {raw!r} is not a number") from None
        if not math.isfinite(value):
            raise PostplaceError(f"{where}: {raw!r} is not a finite number")
        if value < 0:
            raise PostplaceError(f"{where}: {value} is negative")
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
