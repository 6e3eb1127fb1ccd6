"""Edits of a run folder's files for the fuzz: :class:`Edit` says what to change, :func:`apply_edit`
changes it in a copy of a real run folder and recomputes the checksums the edit would otherwise break
(``run.json``'s, a checkpoint's body and arrays, a history's digest), so the edit reaches the reader's
own checks. The cases that use them are :mod:`postplace.testing.fuzz_runs`.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass

import numpy as np

from postplace.testing.fuzz_inputs import BIG, DELETE, corrupt_run_file

__all__ = ["Edit", "apply_edit"]


@dataclass
class Edit:
    """One change to a copy of a real run folder (:func:`apply_edit`):

    * ``set``: field ``path`` (dots; ``@x`` a checkpoint's head instead of its body) of a JSON file
      set to ``value`` (:data:`DELETE` removes it); ``run.json``'s checksum and a checkpoint's body
      checksum recomputed unless ``recompute`` is False;
    * ``npz``: the array at body ``path`` of a checkpoint transformed by ``value`` (``shorter``,
      ``longer``, ``float``, ``str``, ``nan``, ``neg``, ``huge``, ``empty``, ``scalar``, ``other``: another
      cached placement), the npz's checksum recomputed;
    * ``line``: line ``path`` of a JSONL file replaced (``value`` a dict merged into it, or raw text),
      a history's digest and byte count in the checkpoint recomputed;
    * ``raw``: the file's bytes replaced by ``value``; ``delete``: the file(s) or folder removed;
    * ``agnostic``: a format-agnostic corruption (``value`` its kind).
    """

    file: str
    kind: str
    path: str = ""
    value: object = None
    recompute: bool = True

    def label(self) -> str:
        v = self.value if isinstance(self.value, str) else json.dumps(self.value)
        v = "<delete>" if self.value == DELETE else v
        where = f"{self.file}:{self.path}" if self.path != "" else self.file
        return f"{where} {self.kind} {v}"[:100] + ("" if self.recompute else " (checksum kept)")


def walk_path(doc, path: str):
    """(container, key) of ``path`` ("a.b.0") in a JSON document."""
    parts = path.split(".")
    node = doc
    for p in parts[:-1]:
        node = node[int(p)] if isinstance(node, list) else node[p]
    last = parts[-1]
    return node, int(last) if isinstance(node, list) else last


def set_path(doc, path: str, value):
    if path == "":
        return value
    node, key = walk_path(doc, path)
    if value != DELETE:
        node[key] = value
    elif isinstance(node, dict):
        node.pop(key, None)
    elif -len(node) <= key < len(node):
        del node[key]
    return doc


def dumps_json(doc) -> bytes:
    return json.dumps(doc).replace(f'"{BIG}"', "1e400").encode()


def apply_edit(folder, edit: Edit, rng: random.Random) -> None:
    """Apply ``edit`` to the run folder ``folder`` (a copy), recomputing checksums as :class:`Edit` says."""
    import hashlib
    import io
    import shutil
    from pathlib import Path

    from postplace.search import state_io
    from postplace.search.state_io import settings_checksum as _checksum

    folder = Path(folder)
    paths = sorted(folder.glob(edit.file)) or [folder / edit.file]
    p = paths[0]
    if edit.kind == "delete":
        for q in paths:
            shutil.rmtree(q) if q.is_dir() else q.unlink(missing_ok=True)
        return
    if edit.kind == "raw":
        p.write_bytes(str(edit.value).encode())
        return
    if edit.kind == "agnostic":
        p.write_bytes(corrupt_run_file(rng, p.read_bytes() if p.exists() else b"", str(edit.value)))
        return
    if edit.kind == "swap":  # another count's arrays under this name, with a matching checksum
        other = sorted(folder.glob("m1/checkpoint-*.npz"))[0]
        shutil.copyfile(other, p)
        _recompute(p.parent / "checkpoint.json", arrays=p.read_bytes())
        return
    if edit.kind == "set" and p.name == "checkpoint.json":
        head = json.loads(p.read_bytes())
        if edit.path.startswith("@"):
            set_path(head, edit.path[1:], edit.value)
        else:
            head["body"] = set_path(head["body"], edit.path, edit.value)
            if edit.recompute:
                head["body_sha256"] = state_io._sha(state_io._body_bytes(head["body"]))
        p.write_bytes(dumps_json(head))
        return
    if edit.kind == "set":
        doc = set_path(json.loads(p.read_bytes()), edit.path, edit.value)
        if p.name == "run.json" and edit.recompute and isinstance(doc, dict):
            body = {k: v for k, v in doc.items() if k != "checksum"}
            if edit.path != "checksum":
                doc["checksum"] = _checksum(body)
        p.write_bytes(dumps_json(doc))
        return
    if edit.kind == "npz":
        ckpt = p if p.name == "checkpoint.json" else p.parent / "checkpoint.json"
        head = json.loads(ckpt.read_bytes())
        node, key = walk_path(head["body"], edit.path)
        name = node[key]["__ndarray__"]
        npz = ckpt.with_name(head["arrays"])
        with np.load(npz, allow_pickle=False) as z:
            arrays = {k: z[k] for k in z.files}
        arrays[name] = _transform(arrays[name], str(edit.value), arrays, head["body"])
        buf = io.BytesIO()
        np.savez(buf, **arrays)
        npz.write_bytes(buf.getvalue())
        _recompute(ckpt, arrays=buf.getvalue())
        return
    if edit.kind == "line":
        data = p.read_bytes()
        lines = data.decode("utf-8").splitlines(keepends=True) or ["{}\n"]
        k = min(int(edit.path), len(lines) - 1)
        if isinstance(edit.value, dict):
            row = json.loads(lines[k])
            row.update(edit.value)
            new = dumps_json(row).decode() + "\n"
        else:
            new = str(edit.value) + "\n"
        ckpt = p.parent / "checkpoint.json"
        if p.name == "history.jsonl" and ckpt.exists():
            head = json.loads(ckpt.read_bytes())
            covered = int(head["body"]["runner"]["history_bytes"])
            delta = len(new.encode()) - len(lines[k].encode())
            lines[k] = new
            text = "".join(lines).encode()
            p.write_bytes(text)
            head["body"]["runner"]["history_bytes"] = covered + delta
            head["body"]["history_digest"] = hashlib.blake2b(text[: covered + delta], digest_size=16).hexdigest()
            head["body_sha256"] = state_io._sha(state_io._body_bytes(head["body"]))
            ckpt.write_bytes(json.dumps(head).encode())
            return
        lines[k] = new
        p.write_bytes("".join(lines).encode())
        return
    raise ValueError(f"unknown edit kind {edit.kind}")


def _recompute(ckpt, *, arrays: bytes) -> None:
    from postplace.search import state_io

    head = json.loads(ckpt.read_bytes())
    head["arrays_sha256"] = state_io._sha(arrays)
    ckpt.write_bytes(json.dumps(head).encode())


def _transform(a: np.ndarray, how: str, arrays: dict, body: dict) -> np.ndarray:
    if how == "shorter":
        return a[:-1] if a.ndim else a
    if how == "longer":
        return np.concatenate([a, a[-1:]]) if a.ndim and len(a) else a
    if how == "float":
        return a.astype(np.float64) + 0.5
    if how == "str":
        return a.astype(str)
    if how == "nan":
        return np.full(a.shape, np.nan)
    if how == "inf":
        return np.full(a.shape, np.inf)
    if how == "zero":
        return np.zeros(a.shape, dtype=a.dtype)
    if how == "neg":
        return -np.abs(a.astype(np.int64)) - 1 if a.dtype.kind in "iub" else -np.abs(a) - 1
    if how == "huge":
        return np.full(a.shape, 2**62, dtype=np.int64) if a.dtype.kind in "iub" else np.full(a.shape, 1e308)
    if how == "empty":
        return np.zeros((0,) + a.shape[1:], dtype=a.dtype)
    if how == "scalar":
        return np.asarray(a.reshape(-1)[0] if a.size else 0)
    if how == "other":  # another placement the cache holds: valid, but not the best one
        keys = arrays[body["cache_keys"]["__ndarray__"]]
        for row in keys:
            cand = np.frombuffer(row.tobytes(), dtype=np.int64)
            if cand.shape == a.shape and not np.array_equal(cand, a):
                return cand.copy()
        return a
    raise ValueError(how)
