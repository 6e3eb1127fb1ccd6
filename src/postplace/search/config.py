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
from postplace.search.ranges import Range, field_limit, field_range
from postplace.search.registry import STRATEGIES, config_class


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
    own = table is not data  # inside [strategy] every table is a mistake; at the top, other strategies' tables
    for k, v in table.items():
        if isinstance(v, dict) and (own or k not in STRATEGIES):
            where = f"[{strategy}.{k}]" if own else f"[{k}]"
            raise PostplaceError(
                f"--config {path}: {where} is a table, not a config field of '{strategy}'; write "
                f"its fields as KEY = VALUE under [{strategy}] or at the top of the file"
            )
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
            raise PostplaceError(
                f"{source} {key}={shown}: {key} must be at most {limit:g}"
                + (f" ({rng.why})" if rng is not None and rng.why else "")
                + "; larger values exhaust memory or time"
            )
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
        shown = (
            ",".join(map(str, value))
            if isinstance(value, tuple)
            else str(raw)
            if not isinstance(raw, str) or raw.isprintable()
            else repr(raw)
        )
        raise PostplaceError(
            f"{source} {key}={shown}: {key} must be {rng.describe(hint)}" + (f" ({rng.why})" if rng.why else "")
        )
    raise PostplaceError(
        errors[0]
        if len(errors) == 1
        else f"{where}: {raw!r} is not a valid value ({'; '.join(e.split(': ', 1)[-1] for e in errors)})"
    )


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
