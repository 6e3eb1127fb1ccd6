"""Checks at the edge: every file and flag a user gives is read here, or checked with these helpers.

Each helper either returns a clean Python value or raises :class:`PostplaceError` with one line that
says what is wrong, where (file and field, or flag) and how to fix it. Nothing past the readers has to
guess whether a number is finite, a flag positive, or a file text: a bad input never reaches the
simulator, where it would end as a traceback, a hang (a NaN latency) or an infinite result.

Rules: numbers are ``int``/``float`` but never ``bool`` (``true`` is not 1 here), finite, and within
float range (``1e400`` in JSON is an error, not ``inf``); a graph's byte counts are at most ``MAX_BYTES``;
integers fit in 64 bits; text files are UTF-8; JSON may not nest deeper than Python can parse (a
``RecursionError`` becomes an error line).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from postplace.errors import PostplaceError

__all__ = [
    "boolean",
    "integer",
    "make_folder",
    "number",
    "parse_json",
    "positive_int",
    "read_json",
    "read_text",
    "string",
]

INT64_MAX = 2**63 - 1
# The most bytes one tensor, edge or op may count: 1 EB, a million times the memory of a large machine.
# Past it a file has the wrong unit or a corrupt number, and sums of such byte counts (and the times
# made from them) overflow float range downstream, where METIS crashed the process on them.
MAX_BYTES = 1e18


MAX_FILE_BYTES = 2**30
"""The largest input file read (1 GiB): the largest graph postplace writes here is 35 MB (NMT-4 at 16
micro-batches); past the limit the input is a stream that never ends (a FIFO, ``/dev/zero``), not a file."""
_SNIFF_BYTES = 1 << 16


def read_text(path: str | Path, what: str = "file") -> str:
    """A file's text, decoded as UTF-8; a missing, unreadable, binary (a NUL byte in its first 64 KiB:
    ``/dev/zero``, ``/dev/urandom``), endless or non-UTF-8 file is one error line."""
    path = Path(path)
    try:
        with open(path, "rb") as f:
            data = f.read(_SNIFF_BYTES)
            if b"\0" in data:
                raise PostplaceError(
                    f"{path}: holds NUL bytes, so it is not a text {what} (a binary file or a "
                    "device?); give a UTF-8 JSON or TOML file"
                )
            data += f.read(max(MAX_FILE_BYTES + 1 - len(data), 0))
        if len(data) > MAX_FILE_BYTES:
            raise PostplaceError(
                f"{path}: larger than {MAX_FILE_BYTES:,} bytes, past any {what} postplace reads (an endless stream?)"
            )
    except FileNotFoundError:
        raise PostplaceError(f"{path}: no such {what}") from None
    except IsADirectoryError:
        raise PostplaceError(f"{path}: is a folder, not a {what}") from None
    except OSError as exc:
        raise PostplaceError(f"{path}: cannot read the {what} ({exc.strerror or exc})") from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        raise PostplaceError(
            f"{path}: not UTF-8 text (byte {exc.start}, line {line}); save the {what} as UTF-8"
        ) from None


def parse_json(text: str, source: str, *, finite: bool = True):
    """Parse JSON strictly: no NaN/Infinity, no number beyond float range, no absurd nesting. With
    ``finite=False`` (a file postplace wrote, whose readers check each field: a step time may be
    ``Infinity`` there) NaN, Infinity and numbers past float range are read as floats; integers of
    hundreds of digits and absurd nesting are still one error line."""

    def reject(token):
        raise PostplaceError(f"{source}: the value {token} is not allowed; numbers must be finite")

    def as_float(token):
        v = float(token)
        if finite and not math.isfinite(v):
            raise PostplaceError(f"{source}: the number {token[:40]} is too large for a float; numbers must be finite")
        return v

    def as_int(token):
        if len(token.lstrip("-")) > 308:  # past float range whatever it is used for (and int() would balk)
            raise PostplaceError(f"{source}: the integer {token[:20]}... has {len(token)} digits; it is too large")
        return int(token)

    try:
        return json.loads(text, parse_constant=reject if finite else float, parse_float=as_float, parse_int=as_int)
    except json.JSONDecodeError as exc:
        ends_open = text.rstrip()[-1:] not in ("}", "]")
        hint = " (the file looks truncated: it does not end with } or ])" if ends_open else ""
        raise PostplaceError(
            f"{source}: not valid JSON at line {exc.lineno} column {exc.colno}: {exc.msg}{hint}"
        ) from None
    except RecursionError:
        raise PostplaceError(f"{source}: JSON nested too deeply to read; this is not a file postplace wrote") from None


def read_json(path: str | Path, what: str = "JSON file", *, finite: bool = True):
    """:func:`read_text` then :func:`parse_json` (``finite``: as it takes it)."""
    return parse_json(read_text(path, what), str(path), finite=finite)


def _is_number(v) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)


def number(v, where: str, *, minimum: float | None = None, positive: bool = False) -> float:
    """A finite number (not a bool, not a string) as float, optionally >= ``minimum`` or > 0."""
    if not _is_number(v):
        raise PostplaceError(f"{where} must be a number, not {_describe(v)}")
    try:
        f = float(v)
    except OverflowError:
        raise PostplaceError(f"{where} is {v}, too large for a float") from None
    if not math.isfinite(f):
        raise PostplaceError(f"{where} is {v}; it must be finite")
    if positive and f <= 0:
        raise PostplaceError(f"{where} is {v}; it must be positive")
    if minimum is not None and f < minimum:
        raise PostplaceError(f"{where} is {v}; it must be >= {minimum:g}")
    return f


def integer(v, where: str, *, minimum: int | None = None) -> int:
    """An integer (not a bool, not a float, not a string) within 64 bits, optionally >= ``minimum``."""
    if not isinstance(v, int) or isinstance(v, bool):
        raise PostplaceError(f"{where} must be an integer, not {_describe(v)}")
    if abs(v) > INT64_MAX:
        raise PostplaceError(f"{where} is {v}, too large for a 64-bit integer")
    if minimum is not None and v < minimum:
        raise PostplaceError(f"{where} is {v}; it must be >= {minimum}")
    return v


def string(v, where: str) -> str:
    if not isinstance(v, str):
        raise PostplaceError(f"{where} must be a string, not {_describe(v)}")
    return v


def boolean(v, where: str) -> bool:
    if not isinstance(v, bool):
        raise PostplaceError(f"{where} must be true or false, not {_describe(v)}")
    return v


def positive_int(v: int, flag: str, *, minimum: int = 1) -> int:
    """A CLI count: ``--steps 0`` or ``--runs -1`` is an error naming the flag."""
    if v < minimum:
        raise PostplaceError(f"{flag} {v}: give an integer >= {minimum}")
    return v


def make_folder(path: str | Path, what: str = "--out") -> Path:
    """Create the output folder ``path`` and its parents, or say in one line why it cannot be one."""
    path = Path(path)
    for p in (path, *path.parents):
        if p.exists() and not p.is_dir():
            where = "" if p == path else f" ({p} is)"
            raise PostplaceError(f"{what} {path}: a file, not a folder{where}; give a new or existing folder")
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise PostplaceError(f"{what} {path}: cannot create the folder ({exc.strerror}); pick another path") from None
    return path


def _describe(v) -> str:
    if isinstance(v, bool):
        return f"the boolean {str(v).lower()}"
    if isinstance(v, str):
        return f"the string {v[:40]!r}"
    if v is None:
        return "null"
    if isinstance(v, dict):
        return "a table/object"
    if isinstance(v, list):
        return "a list"
    return f"{type(v).__name__} {str(v)[:40]}"
