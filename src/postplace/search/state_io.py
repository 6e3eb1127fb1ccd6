"""Saving state as data: nested dicts, lists and numpy arrays to one JSON file plus one ``.npz``.

A run folder must be data a user can inspect and trust, never code (pickle runs code on load). The
state of a strategy or of the runner is a tree of dicts, lists, tuples, scalars and numpy arrays; it is
written as

* ``NAME.json``: ``{"format": FORMAT, "version": 1, "arrays": "<npz file name>", "arrays_sha256": ...,
  "body_sha256": ..., "body": <the tree, arrays replaced by {"__ndarray__": key}>}``;
* the ``.npz`` it names (numpy's zip of arrays, read with ``allow_pickle=False``).

The npz is written first under a fresh name, then the JSON replaces the old one atomically (temp file,
fsync, rename), then older npz files go: a crash at any moment leaves a JSON whose npz exists. Both
checksums are verified on load, so a flipped byte anywhere is one clear error, not a wrong resume.

Encoding: a dict with only ``str`` keys stays a JSON object; any other dict becomes
``{"__dict__": [[key, value], ...]}``; tuples ``{"__tuple__": [...]}``; bytes ``{"__bytes__": hex}``;
numpy scalars become Python numbers; floats keep ``inf`` and ``nan`` (JSON's ``Infinity``/``NaN``).
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import secrets
from pathlib import Path

import numpy as np

from postplace.errors import PostplaceError
from postplace.validate import read_json

FORMAT = "postplace-state"
_TAGS = ("__ndarray__", "__dict__", "__tuple__", "__bytes__")


def encode(obj, arrays: dict[str, np.ndarray]):
    """A JSON-able tree from ``obj``; arrays go into ``arrays`` under fresh keys."""
    if isinstance(obj, np.ndarray):
        key = f"a{len(arrays)}"
        if obj.dtype == object:
            raise TypeError("object arrays cannot be saved as data")
        arrays[key] = obj
        return {"__ndarray__": key}
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, bool | int | float | str) or obj is None:
        return obj
    if isinstance(obj, bytes):
        return {"__bytes__": obj.hex()}
    if isinstance(obj, tuple):
        return {"__tuple__": [encode(x, arrays) for x in obj]}
    if isinstance(obj, list):
        return [encode(x, arrays) for x in obj]
    if isinstance(obj, dict):
        if all(isinstance(k, str) for k in obj) and not (len(obj) == 1 and next(iter(obj)) in _TAGS):
            return {k: encode(v, arrays) for k, v in obj.items()}
        return {"__dict__": [[encode(k, arrays), encode(v, arrays)] for k, v in obj.items()]}
    raise TypeError(f"cannot save a {type(obj).__name__} as data")


def decode(tree, arrays):
    """The inverse of :func:`encode`."""
    if isinstance(tree, list):
        return [decode(x, arrays) for x in tree]
    if isinstance(tree, dict):
        if len(tree) == 1:
            ((tag, v),) = tree.items()
            if tag == "__ndarray__":
                return np.array(arrays[v])
            if tag == "__tuple__":
                return tuple(decode(x, arrays) for x in v)
            if tag == "__bytes__":
                return bytes.fromhex(v)
            if tag == "__dict__":
                return {_hashable(decode(k, arrays)): decode(x, arrays) for k, x in v}
        return {k: decode(v, arrays) for k, v in tree.items()}
    return tree


def _hashable(k):
    return tuple(k) if isinstance(k, list) else k


RUN_SETTINGS = "run.json"
"""A run folder's settings file (written first by ``postplace.place``; the report reads its cluster)."""


def settings_checksum(body: dict) -> str:
    """The checksum a run folder's ``run.json`` carries: sha256 of its sorted JSON without the checksum."""
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()


VOLATILE_METADATA = ("trace_seconds",)
"""Graph metadata that differs between two traces of one step (how long tracing took): not hashed."""


def fingerprint(obj) -> str:
    """A short hash of an OpGraph or a Cluster: what a finished run may be reused for, or resumed with. A
    graph traced again hashes alike (:data:`VOLATILE_METADATA` left out)."""
    data = _data(obj)
    meta = data.get("metadata") if hasattr(obj, "to_dict") else None
    if isinstance(meta, dict):
        data = {**data, "metadata": {k: v for k, v in meta.items() if k not in VOLATILE_METADATA}}
    return _hash(data)


def fingerprints(obj) -> set[str]:
    """The fingerprints a run folder may record for ``obj``: :func:`fingerprint`, and the one folders
    written before it left the trace time out recorded (whole metadata), so those still resume where
    the graph is the very one they traced (a cached graph)."""
    return {fingerprint(obj), _hash(_data(obj))}


def _data(obj):
    import dataclasses

    return obj.to_dict() if hasattr(obj, "to_dict") else _without_none(dataclasses.asdict(obj))


def _hash(data) -> str:
    return hashlib.sha256(json.dumps(data, sort_keys=True, default=str).encode()).hexdigest()[:16]


def _without_none(data):
    """Optional fields left out (a device with no bf16 peak) hash as they did before the field existed."""
    if isinstance(data, dict):
        return {k: _without_none(v) for k, v in data.items() if v is not None}
    if isinstance(data, list | tuple):
        return [_without_none(v) for v in data]
    return data


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _body_bytes(body) -> bytes:
    return json.dumps(body, sort_keys=True, separators=(",", ":")).encode()


def _write_atomic(path: Path, data: bytes) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    tmp.replace(path)


def save_state(path: str | Path, state) -> None:
    """Write ``state`` as ``path`` (JSON) plus a fresh ``.npz`` beside it (module docstring)."""
    path = Path(path)
    arrays: dict[str, np.ndarray] = {}
    body = encode(state, arrays)
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    npz = buf.getvalue()
    npz_name = f"{path.stem}-{secrets.token_hex(4)}.npz"
    _write_atomic(path.with_name(npz_name), npz)
    head = {
        "format": FORMAT,
        "version": 1,
        "arrays": npz_name,
        "arrays_sha256": _sha(npz),
        "body_sha256": _sha(_body_bytes(body)),
        "body": body,
    }
    _write_atomic(path, json.dumps(head).encode())
    for old in path.parent.glob(f"{path.stem}-*.npz"):
        if old.name != npz_name:
            old.unlink(missing_ok=True)


def load_state(path: str | Path):
    """Read what :func:`save_state` wrote; any damage is a :class:`PostplaceError` naming the file."""
    path = Path(path)
    bad = f"{path}: damaged or foreign checkpoint"
    try:
        head = read_json(path, "checkpoint", finite=False)
    except PostplaceError as exc:
        raise PostplaceError(f"{bad} ({str(exc).removeprefix(f'{path}: ')}); start a new run") from None
    if not isinstance(head, dict) or head.get("format") != FORMAT or head.get("version") != 1:
        raise PostplaceError(f"{bad}: not a {FORMAT} version 1 file; start a new run")
    body, name = head.get("body"), head.get("arrays")
    if not isinstance(name, str) or not re.fullmatch(re.escape(path.stem) + r"-[0-9a-f]{8}\.npz", name):
        raise PostplaceError(f"{bad}: its arrays file {name!r} is not one save_state names; start a new run")
    if _sha(_body_bytes(body)) != head.get("body_sha256"):
        raise PostplaceError(f"{bad}: its checksum does not match its content; start a new run")
    npz_path = path.with_name(name)
    try:
        npz = npz_path.read_bytes()
    except OSError:
        raise PostplaceError(f"{bad}: its arrays file {name} is missing; start a new run") from None
    if _sha(npz) != head.get("arrays_sha256"):
        raise PostplaceError(f"{bad}: {name} does not match its checksum; start a new run")
    try:
        with np.load(io.BytesIO(npz), allow_pickle=False) as z:
            arrays = {k: z[k] for k in z.files}
        return decode(body, arrays)
    except (ValueError, KeyError, TypeError, OSError) as exc:
        raise PostplaceError(f"{bad} ({type(exc).__name__}: {exc}); start a new run") from None
