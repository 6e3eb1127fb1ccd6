"""What the documentation promises about a graph, cluster or placement file: the fuzz's own reading.

A format-agnostic corruption (a flipped bit, a truncation...) may leave a valid file or not. This
module decides which, without postplace's readers: it re-reads the bytes with Python's own parsers
(``json``, ``tomllib``) and checks the rules the documentation states, and returns
:data:`~postplace.testing.fuzz_inputs.VALID`, :data:`~postplace.testing.fuzz_inputs.INVALID` or
:data:`~postplace.testing.fuzz_inputs.UNDECIDED` with the reason. The rules and where they are written:

* every input file: UTF-8 text with no NUL byte; JSON is strict (no ``NaN``/``Infinity``, numbers
  within float range, integers of at most 308 digits); numbers are never booleans (``validate.py``);
* a graph file is what ``OpGraph.save`` writes (README, "TARGET is a graph file"): one object with
  ``"format": "postplace.opgraph"`` and ``"version": 1`` (``OpGraph.from_dict``); the per-op numbers
  (FLOPs, bytes) are finite numbers >= 0, byte counts at most ``MAX_BYTES`` = 1e18 (``validate.py``);
  op names are unique strings; op types, modules and the graph's name are free text; a phase is one
  of ``PHASES``, an allowed kind one of ``cpu``/``gpu``;
* a cluster file (``Cluster.from_toml_text``): ``[[device]]`` tables with ``name`` or ``names``,
  ``kind`` (``cpu``/``gpu``), positive ``peak_flops``, ``memory_bandwidth``, ``memory``; optional
  ``model``, ``reserve`` and ``launch_overhead`` (>= 0), ``peak_flops_bf16``/``_fp16`` (> 0);
  ``[[switch]]`` tables with a ``name``; ``[[link]]`` tables joining two named nodes with a positive
  ``bandwidth`` and an optional ``latency`` >= 0; names unique; every device reaches every other
  through switches (devices never forward: the module's docstring); a reserve below the memory;
* a placement file (``cluster/placement.py`` and the README's ``SPEC``): one object ``{op name: device
  name}``; ops left out take their colocation set's device; splitting a set, an unknown op or device,
  or a device of a kind the op may not use is an error.

What the rules do not decide is :data:`UNDECIDED`: a changed key, list length, edge end, colocation
or in-place field, duplicate keys. A change that keeps every rule is :data:`VALID`, so a refusal of it
is a defect (``refused-valid``): postplace promises more than these rules only by saying so.
"""

from __future__ import annotations

import json
import math
import tomllib

from postplace.testing.fuzz_inputs import (
    CLUSTER,
    GRAPH,
    INVALID,
    PLACEMENT,
    UNDECIDED,
    VALID,
    base_cluster_toml,
    base_graph,
)

__all__ = ["Verdict", "expect_files", "judge_cluster", "judge_graph", "judge_placement", "read_json", "read_toml"]

MAX_BYTES = 1e18  # validate.py: a graph's byte counts are at most this
KINDS = ("cpu", "gpu")
GRAPH_FORMAT = "postplace.opgraph"
FLOAT_FIELDS = ("flops", "bytes_accessed", "output_bytes", "persistent_bytes")
TEXT_FIELDS = ("op_type", "module")
DEVICE_REQUIRED = ("peak_flops", "memory_bandwidth", "memory")  # positive
DEVICE_OPTIONAL = {"reserve": 0.0, "launch_overhead": 0.0, "peak_flops_bf16": None, "peak_flops_fp16": None}


class Verdict(Exception):
    """Raised by a rule: the file is :data:`INVALID` or :data:`UNDECIDED`, and why."""

    def __init__(self, expect: str, why: str):
        super().__init__(why)
        self.expect, self.why = expect, why


def _bad(why: str):
    raise Verdict(INVALID, why)


def _open(why: str):
    raise Verdict(UNDECIDED, why)


def _text(data: bytes) -> str:
    if b"\0" in data:
        _bad("holds a NUL byte")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        _bad("not UTF-8")


def read_json(data: bytes):
    """The document, read as ``validate.py`` documents (strict JSON); :class:`Verdict` otherwise."""

    def reject(token):
        _bad(f"{token} in JSON")

    def as_float(token):
        if not math.isfinite(float(token)):
            _bad(f"{token[:20]} past float range")
        return float(token)

    def as_int(token):
        if len(token.lstrip("-")) > 308:
            _bad("an integer of more than 308 digits")
        return int(token)

    def pairs(items):
        keys = [k for k, _ in items]
        if len(set(keys)) != len(keys):
            _open("a key appears twice")
        return dict(items)

    try:
        return json.loads(
            _text(data), parse_constant=reject, parse_float=as_float, parse_int=as_int, object_pairs_hook=pairs
        )
    except (ValueError, RecursionError):
        _bad("not JSON")


def read_toml(data: bytes) -> dict:
    try:
        return tomllib.loads(_text(data))
    except (tomllib.TOMLDecodeError, RecursionError):
        _bad("not TOML")


def _number(x, where: str, *, positive=False, minimum=None, maximum=None) -> float:
    if isinstance(x, bool) or not isinstance(x, int | float):
        _bad(f"{where} is not a number")
    if not math.isfinite(float(x)):
        _bad(f"{where} is not finite")
    if positive and x <= 0:
        _bad(f"{where} is not positive")
    if minimum is not None and x < minimum:
        _bad(f"{where} is below {minimum}")
    if maximum is not None and x > maximum:
        _bad(f"{where} is above {maximum:g}")
    return float(x)


def _string(x, where: str) -> str:
    if not isinstance(x, str):
        _bad(f"{where} is not a string")
    return x


def _diff(a, b, path=()):
    """The paths where ``b`` differs from ``a`` at a leaf; :class:`Verdict` (undecided) on a changed shape."""
    if isinstance(a, dict) and isinstance(b, dict):
        if a.keys() != b.keys():
            _open(f"the keys of {'.'.join(map(str, path)) or 'the top'} changed")
        for k in a:
            yield from _diff(a[k], b[k], (*path, k))
    elif isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            _open(f"the length of {'.'.join(map(str, path))} changed")
        for k, (x, y) in enumerate(zip(a, b, strict=True)):
            yield from _diff(x, y, (*path, k))
    elif type(a) is not type(b) or a != b:
        yield path, b


def judge_graph(doc, base: dict) -> dict:
    """Check a graph document against the documented rules (``base``: the valid graph it was made from);
    the ops' names, allowed kinds and colocation for the placement check, or :class:`Verdict`."""
    if not isinstance(doc, dict):
        _bad("a graph file is one JSON object")
    if doc.get("format") != GRAPH_FORMAT:
        _bad("neither a postplace graph nor a dnn-partitioning workload")
    if type(doc.get("version")) is not int or doc["version"] != 1:
        _bad("graph version is not 1")
    from postplace.graph import PHASES

    for part, keys in (("ops", ("name", *FLOAT_FIELDS)), ("edges", ("src", "dst", "bytes"))):
        if not isinstance(doc.get(part), dict):
            _bad(f"no object '{part}'")
        for key in keys:
            if not isinstance(doc[part].get(key), list):
                _bad(f"no list '{part}.{key}'")
        if len({len(v) for v in doc[part].values() if isinstance(v, list)}) > 1:
            _bad(f"the lists of '{part}' differ in length (one entry per {part[:-1]})")
    for path, new in list(_diff(base, doc)):
        where = ".".join(map(str, path))
        head = path[:2]
        if path == ("name",):
            _string(new, where)
        elif head[0] == "ops" and head[1] in FLOAT_FIELDS:
            _number(new, where, minimum=0, maximum=None if head[1] == "flops" else MAX_BYTES)
        elif head == ("edges", "bytes"):
            _number(new, where, minimum=0, maximum=MAX_BYTES)
        elif head == ("ops", "name"):
            _string(new, where)
        elif head[0] == "ops" and head[1] in TEXT_FIELDS:
            _string(new, where)
        elif head == ("ops", "phase"):
            if isinstance(new, bool) or not isinstance(new, str | int) or (isinstance(new, str) and new not in PHASES):
                _bad(f"{where} is not a phase")
            _open(f"{where} is another phase")
        elif head == ("ops", "allowed_kinds"):
            if new not in KINDS:
                _bad(f"{where} is not a device kind")
        elif head in (("edges", "src"), ("edges", "dst")):
            if isinstance(new, bool) or not isinstance(new, int) or not 0 <= new < len(doc["ops"]["name"]):
                _bad(f"{where} is not an op index")
            _open(f"{where}: an edge moved")
        elif head == ("edges", "slot") and (isinstance(new, bool) or not isinstance(new, int) or new < 0):
            _bad(f"{where} is not a slot")
        else:
            _open(f"{where} changed")
    ops = doc["ops"]
    names = ops["name"]
    if len(set(names)) != len(names):
        _bad("two ops have one name")
    kinds = [[k] if isinstance(k, str) else list(k) for k in ops["allowed_kinds"]]
    if any(len(set(k)) != len(k) for k in kinds):
        _open("a kind is listed twice")
    return {"names": names, "kinds": kinds, "colocation": ops["colocation"]}


def judge_cluster(doc: dict) -> dict:
    """Check a cluster document against ``Cluster.from_toml_text``'s documented rules; ``{device name:
    kind}`` in order, or :class:`Verdict`."""
    for key in ("name", "description"):
        if key in doc:
            _string(doc[key], key)
    tables = {}
    for key in ("device", "switch", "link"):
        val = doc.get(key, [])
        if not isinstance(val, list) or not all(isinstance(e, dict) for e in val):
            _bad(f"'{key}' is not a list of tables")
        tables[key] = val
    devices: dict[str, str] = {}
    nodes: list[str] = []
    for k, e in enumerate(tables["device"]):
        where = f"device[{k}]"
        if "name" in e and "names" in e:
            _open(f"{where} has both name and names")
        if "names" in e:
            names = e["names"]
            if not isinstance(names, list) or not names:
                _bad(f"{where} names is not a non-empty list")
        elif "name" in e:
            names = [e["name"]]
        else:
            _bad(f"{where} has no name")
        for nm in names:
            _string(nm, f"{where} name")
        if "kind" not in e or e["kind"] not in KINDS:
            _bad(f"{where} kind is not cpu or gpu")
        if "model" in e:
            _string(e["model"], f"{where} model")
        for f in DEVICE_REQUIRED:
            if f not in e:
                _bad(f"{where} has no {f}")
            _number(e[f], f"{where} {f}", positive=True)
        for f, default in DEVICE_OPTIONAL.items():
            if f in e:
                _number(e[f], f"{where} {f}", minimum=0, positive=default is None)
        if e.get("reserve", 0.0) >= e["memory"]:
            _bad(f"{where} reserves all its memory")
        if set(e) - {"name", "names", "kind", "model", *DEVICE_REQUIRED, *DEVICE_OPTIONAL}:
            _open(f"{where} has an unknown field")
        for nm in names:
            devices[nm] = e["kind"]
            nodes.append(nm)
    for k, e in enumerate(tables["switch"]):
        if set(e) != {"name"}:
            (_bad if "name" not in e else _open)(f"switch[{k}] fields")
        nodes.append(_string(e["name"], f"switch[{k}] name"))
    if len(set(nodes)) != len(nodes):
        _bad("two nodes have one name")
    if any(nm == "" for nm in nodes):
        _open("an empty name")
    adj: dict[str, set[str]] = {nm: set() for nm in nodes}
    for k, e in enumerate(tables["link"]):
        where = f"link[{k}]"
        for end in ("a", "b"):
            if end not in e or not isinstance(e[end], str) or e[end] not in adj:
                _bad(f"{where} end {end} names no node")
        if "bandwidth" not in e:
            _bad(f"{where} has no bandwidth")
        _number(e["bandwidth"], f"{where} bandwidth", positive=True)
        if "latency" in e:
            _number(e["latency"], f"{where} latency", minimum=0)
        if set(e) - {"a", "b", "bandwidth", "latency"}:
            _open(f"{where} has an unknown field")
        if e["a"] == e["b"]:
            _open(f"{where} joins a node to itself")
        adj[e["a"]].add(e["b"])
        adj[e["b"]].add(e["a"])
    for start in devices:  # every device reaches every other; only switches forward
        seen, todo = {start}, [start]
        while todo:
            here = todo.pop()
            for nxt in adj[here]:
                if nxt not in seen:
                    seen.add(nxt)
                    if nxt not in devices:
                        todo.append(nxt)
        if set(devices) - seen:
            _bad(f"device {start} reaches no route to some device")
    unknown = set(doc) - {"name", "description", "device", "switch", "link"}
    if unknown:
        _open(f"unknown top-level keys {sorted(unknown)}")
    return devices


def judge_placement(doc, graph: dict, devices: dict[str, str]) -> list[str]:
    """Check a placement document against the documented rules; the device of every op, or :class:`Verdict`."""
    if not isinstance(doc, dict):
        _bad("a placement file is one JSON object")
    names = graph["names"]
    index = {nm: k for k, nm in enumerate(names)}
    dev: list[str | None] = [None] * len(names)
    for op, d in doc.items():
        if op not in index:
            _bad(f"op {op!r} is not in the graph")
        if not isinstance(d, str) or d not in devices:
            _bad(f"device {d!r} is not in the cluster")
        dev[index[op]] = d
    sets: dict[int, list[int]] = {}
    for k, c in enumerate(graph["colocation"]):
        if c >= 0:
            sets.setdefault(c, []).append(k)
    for members in sets.values():
        placed = {dev[k] for k in members if dev[k] is not None}
        if len(placed) > 1:
            _bad("the placement splits a colocation set")
        if placed:
            for k in members:
                dev[k] = next(iter(placed))
    if any(d is None for d in dev):
        _bad("an op has no device")
    for k, d in enumerate(dev):
        if devices[d] not in graph["kinds"][k]:
            _bad(f"op {names[k]!r} may not run on a {devices[d]}")
    return dev


def _flag(argv: list[str], flag: str) -> str | None:
    return argv[argv.index(flag) + 1] if flag in argv and argv.index(flag) + 1 < len(argv) else None


def expect_files(files: dict[str, bytes], argv: list[str]) -> tuple[str, str]:
    """(expectation, reason) of a ``simulate``/``info`` case on the fuzz's base file names, by the rules
    above: the graph, the cluster and (for ``simulate``) the placement file it reads, each read by the
    fuzz's own parsers."""
    good_cluster = base_cluster_toml().encode()
    try:
        graph = judge_graph(read_json(files[GRAPH]), base_graph().to_dict())
        devices = judge_cluster(read_toml(files.get(CLUSTER, good_cluster)))
        if argv[0] == "simulate" and _flag(argv, "--placement") == PLACEMENT:
            judge_placement(read_json(files[PLACEMENT]), graph, devices)
        elif argv[0] == "info":  # info runs nothing, but an op that no device of the cluster may run
            have = set(devices.values())
            if any(not have & set(k) for k in graph["kinds"]):
                _open("an op may run on no device of the cluster")
    except Verdict as v:
        return v.expect, v.why
    unchanged = files[GRAPH] == base_graph_bytes() and files.get(CLUSTER, good_cluster) == good_cluster
    return VALID, "unchanged" if unchanged else "a valid file still"


def base_graph_bytes() -> bytes:
    return json.dumps(base_graph().to_dict()).encode()
