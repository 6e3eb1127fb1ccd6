"""Seeded malformed inputs for the CLI and the library, and a judge of what each one produced.

:func:`cases` yields :class:`Case` objects: a category, a label, the files to write into a fresh
folder, the ``postplace`` arguments to run (paths relative to that folder) and whether the input is
certainly invalid (``must_fail``: accepting it is a wrong answer). Two kinds of mutation:

* structured: one field of a valid graph JSON, cluster TOML or placement JSON gets a value of the
  wrong type, a non-finite or negative number, a name that does not exist, a number past float
  range, a nesting too deep to parse; or a CLI flag gets a zero/negative count or a bad size;
* format-agnostic (``must_fail`` False, since the result may still be valid): flipped bytes,
  truncation, a deleted span, inserted garbage, non-UTF-8 bytes, an empty file.

:func:`classify` sorts one outcome (exit status, stdout, stderr, timed out) into ``clean`` (exit 2,
one ``error:`` line), ``usage`` (exit 2 from the argument parser, naming the flag), ``internal``
(exit 3 or a traceback), ``hang``, ``accepted`` (exit 0, and the answer checks out) or
``accepted-wrong`` (exit 0 for an invalid input, or an answer with a non-finite number).
``benchmarks/fuzz_cli.py`` runs them all; ``tests/test_fuzz.py`` a small seeded subset in process.
"""

from __future__ import annotations

import json
import math
import random
from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np

__all__ = ["Case", "base_cluster_toml", "base_graph", "base_placement", "cases", "classify"]

GRAPH, CLUSTER, PLACEMENT = "g.json", "c.toml", "p.json"
BIG = "__BIG_NUMBER__"


@dataclass
class Case:
    category: str
    label: str
    argv: list[str]
    files: dict[str, bytes] = field(default_factory=dict)
    must_fail: bool = True
    copy_run: bool = False  # start from a copy of the real tiny run folder (run-folder cases)


# ------------------------------------------------------------------------------------ base inputs
def base_graph():
    """Seven ops: a CPU-only input, a colocated forward/backward pair, an in-place op, two output slots."""
    from postplace.graph import OpGraph

    return OpGraph.build(
        ["param:w", "input:0", "conv", "relu_", "loss", "conv_bw", "update"],
        [(0, 2, 1e6), (1, 2, 4e6), (2, 3, 4e6), (2, 5, 4e6, 1), (3, 4, 4e6), (4, 5, 1e3), (5, 6, 1e6), (0, 6, 1e6)],
        op_types=["parameter", "input", "convolution", "relu_", "sum", "convolution_backward", "add_"],
        flops=[0, 0, 2e9, 1e6, 1e6, 4e9, 1e6],
        bytes_accessed=[1e6, 4e6, 9e6, 8e6, 4e6, 13e6, 3e6],
        output_bytes=[1e6, 4e6, 4e6, 4e6, 1e3, 1e6, 1e6],
        persistent_bytes=[2e6, 0, 0, 0, 0, 0, 0],
        colocation=[1, -1, 0, -1, -1, 0, 1],
        phase=["other", "forward", "forward", "forward", "forward", "backward", "update"],
        allowed_kinds=[["cpu", "gpu"], "cpu", *[["cpu", "gpu"]] * 5],
        inplace=[False, False, False, True, False, False, True],
        inplace_base=[-1, -1, -1, 2, -1, -1, 0],
        name="tiny",
    )


CLUSTER_DOC = {
    "name": "tiny",
    "device": [
        {"name": "cpu", "kind": "cpu", "model": "X", "peak_flops": 5e11, "memory_bandwidth": 5e10,
         "memory": 6e10, "reserve": 1e9, "launch_overhead": 5e-6},
        {"names": ["gpu0", "gpu1"], "kind": "gpu", "model": "G", "peak_flops": 3e12,
         "memory_bandwidth": 2.4e11, "memory": 1.2e10, "reserve": 5e8, "launch_overhead": 1e-5},
    ],
    "switch": [{"name": "host"}, {"name": "board"}],
    "link": [
        {"a": "cpu", "b": "host", "bandwidth": 7.7e10, "latency": 0.0},
        {"a": "board", "b": "host", "bandwidth": 1.575e10, "latency": 5e-6},
        {"a": "gpu0", "b": "board", "bandwidth": 1.575e10, "latency": 1e-6},
        {"a": "gpu1", "b": "board", "bandwidth": 1.575e10, "latency": 1e-6},
    ],
}  # fmt: skip


def _toml_value(x) -> str:
    if isinstance(x, bool):
        return "true" if x else "false"
    if isinstance(x, float):
        if math.isnan(x):
            return "nan"
        if math.isinf(x):
            return "inf" if x > 0 else "-inf"
        return repr(x)
    if isinstance(x, int):
        return str(x)
    if isinstance(x, str):
        return json.dumps(x) if x != BIG else "1" + "0" * 400
    if isinstance(x, list):
        return "[" + ", ".join(_toml_value(v) for v in x) + "]"
    if isinstance(x, dict):
        return "{" + ", ".join(f"{k} = {_toml_value(v)}" for k, v in x.items()) + "}"
    raise TypeError(type(x))


def base_cluster_toml(doc: dict | None = None) -> str:
    """The tiny cluster (1 CPU, 2 GPUs behind a switch) as TOML text, from ``doc`` (default the base)."""
    doc = CLUSTER_DOC if doc is None else doc
    lines = []
    for k, val in doc.items():
        if not (isinstance(val, list) and val and all(isinstance(e, dict) for e in val)):
            lines.append(f"{k} = {_toml_value(val)}")
    for k, val in doc.items():
        if isinstance(val, list) and val and all(isinstance(e, dict) for e in val):
            for entry in val:
                lines.append(f"[[{k}]]")
                lines += [f"{f} = {_toml_value(x)}" for f, x in entry.items()]
    return "\n".join(lines) + "\n"


def base_placement() -> dict:
    return {"param:w": "gpu1", "input:0": "cpu", "conv": "gpu0", "relu_": "gpu0", "loss": "gpu1"}


# ------------------------------------------------------------------------------------ mutations
def _json_bytes(doc) -> bytes:
    text = json.dumps(doc)
    return text.replace(f'"{BIG}"', "1e400").encode()


def _agnostic(rng: random.Random, data: bytes) -> tuple[str, bytes]:
    """One format-agnostic corruption of ``data``."""
    kind = rng.choice(["flip", "flip", "truncate", "delete", "garbage", "non-utf8", "empty", "nul"])
    b = bytearray(data)
    if kind == "flip":
        for _ in range(rng.randint(1, 4)):
            i = rng.randrange(len(b))
            b[i] ^= 1 << rng.randrange(8)
    elif kind == "truncate":
        b = b[: rng.randrange(len(b))]
    elif kind == "delete":
        i = rng.randrange(len(b))
        del b[i : i + rng.randint(1, 40)]
    elif kind == "garbage":
        i = rng.randrange(len(b) + 1)
        b[i:i] = bytes(rng.randrange(256) for _ in range(rng.randint(1, 30)))
    elif kind == "non-utf8":
        i = rng.randrange(len(b) + 1)
        b[i:i] = rng.choice([b"\xff", b"\xc3\x28", b"\xe2\x82", b"\x80\x80"])
    elif kind == "empty":
        b = bytearray()
    else:
        i = rng.randrange(len(b) + 1)
        b[i:i] = b"\x00" * rng.randint(1, 8)
    return kind, bytes(b)


BAD_NUMBERS = ["1", True, None, [], {}, BIG, float("nan"), float("inf"), -1.0]
BAD_INTS = ["0", True, None, 1.5, -7, 2**70]
GRAPH_FLOAT_FIELDS = ["flops", "bytes_accessed", "output_bytes", "persistent_bytes"]


def _graph_mutation(rng: random.Random, doc: dict) -> tuple[str, bytes]:
    """One structured mutation of the graph file's dict that makes it certainly invalid."""
    d = json.loads(json.dumps(doc))
    ops, edges, n = d["ops"], d["edges"], len(doc["ops"]["name"])
    kind = rng.choice(
        ["version", "float_entry", "float_field", "inplace", "int_entry", "edge_entry", "edge_range", "cycle",
         "names", "phase", "kinds", "missing", "deep", "base", "measured", "slot", "top"]
    )  # fmt: skip
    k = rng.randrange(n)
    if kind == "version":
        d["version"] = rng.choice([True, "1", 1.0, 2, None, [1], 0])
    elif kind == "float_entry":
        f = rng.choice(GRAPH_FLOAT_FIELDS)
        ops[f][k] = rng.choice(BAD_NUMBERS)
        kind = f"{f}[{k}]={ops[f][k]!r}"[:60]
    elif kind == "float_field":
        f = rng.choice(GRAPH_FLOAT_FIELDS)
        ops[f] = rng.choice([ops[f][:-1], "1", 3.0, None, {}, ops[f] + [1.0]])
        kind = f"{f}=wrong shape"
    elif kind == "inplace":
        ops["inplace"][k] = rng.choice(["false", "true", 0, 1, None, "no"])
    elif kind == "int_entry":
        f = rng.choice(["colocation", "inplace_base"])
        ops[f][k] = rng.choice(BAD_INTS) if f == "colocation" else rng.choice([*BAD_INTS, n + 3, 0])
        if f == "inplace_base" and ops[f][k] == 0 and k == 6:
            ops[f][k] = 4  # update's base is 0 already; any other op is wrong
    elif kind == "edge_entry":
        f = rng.choice(["src", "dst", "slot", "bytes"])
        e = rng.randrange(len(edges[f]))
        edges[f][e] = rng.choice(BAD_NUMBERS if f == "bytes" else BAD_INTS)
    elif kind == "edge_range":
        e = rng.randrange(len(edges["src"]))
        edges[rng.choice(["src", "dst"])][e] = rng.choice([n, n + 100, -1])
    elif kind == "cycle":
        edges["src"].append(n - 1)
        edges["dst"].append(0)
        edges["slot"].append(3)
        edges["bytes"].append(1.0)
    elif kind == "names":
        if rng.random() < 0.5:
            ops["name"][k] = ops["name"][(k + 1) % n]
        else:
            ops["name"][k] = rng.choice([5, None, True, ["a"]])
    elif kind == "phase":
        ops["phase"][k] = rng.choice(["sideways", 9, -1, None, True, 1.5])
    elif kind == "kinds":
        ops["allowed_kinds"][k] = rng.choice(["tpu", 0, 7, None, [3], ["cpu", 1], True, -1, 300])
    elif kind == "missing":
        f = rng.choice(["ops", "edges", "flops", "src", "dst", "bytes", "name"])
        (d if f in ("ops", "edges") else ops if f in ("flops", "name") else edges).pop(f)
        kind = f"missing {f}"
    elif kind == "deep":
        depth = rng.choice([5000, 100000])
        d["metadata"] = {"x": "__DEEP__"}
        return f"deep {depth}", json.dumps(d).replace('"__DEEP__"', "[" * depth + "]" * depth).encode()
    elif kind == "base":
        ops["inplace_base"][3] = rng.choice([4, 6, 1])  # relu_ is not fed by loss/update/input:0
    elif kind == "measured":
        d["measured"] = rng.choice(
            [[{"key": "G", "kind": "tpu", "times": [1.0] * n}], [{"key": "G", "kind": "gpu", "times": [1.0]}],
             [{"key": "G", "kind": "gpu", "times": ["1"] * n}], [{"key": "G", "kind": "gpu", "times": [-1.0] * n}],
             "x", [3], [{"kind": "gpu", "times": [1.0] * n}]]
        )  # fmt: skip
    elif kind == "slot":
        e = rng.randrange(len(edges["src"]))
        edges["slot"][e] = -1
    else:
        d = rng.choice([[], "graph", 3, None, {"format": "postplace.opgraph"}])
    return kind, _json_bytes(d)


def _cluster_mutation(rng: random.Random) -> tuple[str, dict, bool]:
    """A structured mutation of the cluster document: (label, document, certainly invalid)."""
    d = json.loads(json.dumps(CLUSTER_DOC))
    kind = rng.choice(["device_num", "link_num", "latency", "kind", "name", "link_end", "missing", "shape",
                       "dup", "reserve", "disconnect"])  # fmt: skip
    if kind == "device_num":
        dev = rng.choice(d["device"])
        f = rng.choice(["peak_flops", "memory_bandwidth", "memory", "launch_overhead", "reserve"])
        dev[f] = rng.choice(["1e9", True, [1.0], {"a": 1}, float("nan"), float("inf"), -1.0, BIG]
                            + ([0.0] if f in ("peak_flops", "memory_bandwidth", "memory") else []))  # fmt: skip
        return f"device {f}={dev[f]!r}"[:60], d, True
    if kind in ("link_num", "latency"):
        link = rng.choice(d["link"])
        f = "latency" if kind == "latency" else "bandwidth"
        link[f] = rng.choice(["1e9", True, [1.0], float("nan"), float("inf"), float("-inf"), -1.0, BIG]
                             + ([0.0] if f == "bandwidth" else []))  # fmt: skip
        return f"link {f}={link[f]!r}"[:60], d, True
    if kind == "kind":
        rng.choice(d["device"])["kind"] = rng.choice(["tpu", 3, True, ["gpu"]])
    elif kind == "name":
        d["device"][0]["name"] = rng.choice([5, True, ["cpu"], {"x": 1}])
    elif kind == "link_end":
        link = rng.choice(d["link"])
        link[rng.choice(["a", "b"])] = rng.choice(["gpu9", "nowhere", 3, True, ""])
    elif kind == "missing":
        where = rng.choice(["device", "link"])
        entry = rng.choice(d[where])
        f = rng.choice(list(entry))
        entry.pop(f)
        optional = {"model", "reserve", "launch_overhead", "latency"}
        return f"missing {where}.{f}", d, f not in optional
    elif kind == "shape":
        f = rng.choice(["device", "link", "switch"])
        d[f] = rng.choice([3, "x", [1, 2], True])
    elif kind == "dup":
        d["switch"].append({"name": rng.choice(["cpu", "host", "gpu0"])})
    elif kind == "reserve":
        d["device"][1]["reserve"] = rng.choice([1.2e10, 2e10])
    else:
        d["link"] = [x for x in d["link"] if x["a"] != "gpu1"]
    return kind, d, True


def _placement_mutation(rng: random.Random) -> tuple[str, object]:
    p = base_placement()
    kind = rng.choice(["unknown_op", "unknown_device", "device_type", "top", "split", "kind", "empty"])
    if kind == "unknown_op":
        p[rng.choice(["nope", "conv ", "CONV", "", "input:1"])] = "gpu0"
    elif kind == "unknown_device":
        p[rng.choice(list(p))] = rng.choice(["gpu9", "GPU0", "", "cuda:0", "tpu"])
    elif kind == "device_type":
        p[rng.choice(list(p))] = rng.choice([0, None, True, ["gpu0"], {"d": "gpu0"}, 1.5])
    elif kind == "top":
        return kind, rng.choice([[["conv", "gpu0"]], "gpu0", 3, None])
    elif kind == "split":
        p["conv_bw"] = "gpu1"  # conv is on gpu0 and colocated with conv_bw
    elif kind == "kind":
        p["input:0"] = "gpu0"  # a CPU-only op on a GPU
    else:
        p = {}
    return kind, p


# ------------------------------------------------------------------------------------ the cases
def _simulate(graph=GRAPH, cluster=CLUSTER, placement=PLACEMENT) -> list[str]:
    return ["simulate", graph, "--cluster", cluster, "--placement", placement, "--json"]


FLAG_CASES = [
    # (argv, certainly invalid)
    (["simulate", GRAPH, "--cluster", CLUSTER, "--placement", "single:gpu9", "--json"], True),
    (["simulate", GRAPH, "--cluster", CLUSTER, "--placement", "single:", "--json"], True),
    (["simulate", GRAPH, "--cluster", CLUSTER, "--placement", "", "--json"], True),
    (["simulate", GRAPH, "--cluster", CLUSTER, "--placement", "missing.json", "--json"], True),
    (["simulate", GRAPH, "--cluster", "nonexistent", "--placement", "single:gpu0", "--json"], True),
    (["simulate", GRAPH, "--cluster", "missing.toml", "--placement", "single:gpu0", "--json"], True),
    (["simulate", GRAPH, "--cluster", ".", "--placement", "single:gpu0", "--json"], True),
    (["simulate", ".", "--cluster", CLUSTER, "--placement", "single:gpu0", "--json"], True),
    (["simulate", GRAPH, "--cluster", CLUSTER, "--placement", "single:gpu0", "--trace", "no/such/dir/t.json"], True),
    (["simulate", "nosuchmodel", "--cluster", CLUSTER, "--placement", "single:gpu0"], True),
    (["simulate", "resnet50", "--size", "huge", "--cluster", CLUSTER, "--placement", "single:gpu0"], True),
    (["simulate", GRAPH, "--cluster", CLUSTER, "--placement", "single:gpu0", "--json"], False),
    (["simulate", GRAPH, "--cluster", "k80x4", "--placement", "single:gpu3", "--json"], False),
    (["info", GRAPH, "--cluster", CLUSTER, "--json"], False),
    (["info", GRAPH, "--cluster", "nonexistent"], True),
    (["info", "resnet50", "--size", "0"], True),
    (["info", "nosuchmodel"], True),
    (["info", "no/such/file.json"], True),
    (["graph", "resnet50", "--size", "tiny"], True),
    (["graph", "resnet50", "--size", "small", "--optimizer", "lamb"], True),
    (["graph", "nosuchmodel"], True),
    (["graph", "rnnlm", "--size", "small", "--out", "no/such/dir/g.json"], True),
    (["profile", "rnnlm", "--runs", "0"], True),
    (["profile", "rnnlm", "--runs", "-3"], True),
    (["profile", "rnnlm", "--size", "medium"], True),
    (["profile", "nosuchmodel"], True),
    (["profile", GRAPH, "--runs", "1"], True),
    (["train", "rnnlm", "--placement", "single:cpu", "--steps", "0"], True),
    (["train", "rnnlm", "--placement", "single:cpu", "--steps", "-2"], True),
    (["train", "rnnlm", "--placement", "single:cpu", "--steps", "1", "--threads", "0"], True),
    (["train", "rnnlm", "--placement", "single:cpu", "--steps", "1", "--size", "huge"], True),
    (["train", "rnnlm", "--placement", "single:cpu", "--steps", "1", "--optimizer", "lamb"], True),
    (["train", "rnnlm", "--placement", "missing.json", "--steps", "1"], True),
    (["train", "rnnlm", "--placement", "single:gpu7", "--steps", "1", "--cluster", "k80x4"], True),
    (["train", "nosuchmodel", "--placement", "single:cpu", "--steps", "1"], True),
    (["train", "rnnlm", "--placement", "single:cpu", "--steps", "1", "--device", "gpu0"], True),
    (["calibrate", "rnnlm", "--runs", "0"], True),
    (["calibrate", "rnnlm", "--threads", "0"], True),
    (["calibrate", "rnnlm", "--batches", "0,2,8"], True),
    (["calibrate", "rnnlm", "--batches", "a,b"], True),
    (["calibrate", "rnnlm", "--batches", "2,8"], True),
    (["calibrate", "rnnlm", "--size", "huge"], True),
    (["calibrate", "nosuchmodel"], True),
    (["train", "rnnlm", "--placement", "single:cpu", "--steps", "abc"], True),
    (["profile", "rnnlm", "--runs", "1.5"], True),
    (["simulate", GRAPH, "--cluster", CLUSTER], True),
    (["info"], True),
    (["place", GRAPH, "--cluster", CLUSTER, "--budget", "4", "--out", GRAPH], True),
    (["place", GRAPH, "--cluster", CLUSTER, "--budget", "4", "--out", f"{GRAPH}/run"], True),
    (["compare", GRAPH, "--cluster", CLUSTER, "--budget", "4", "--strategies", "random", "--out", GRAPH], True),
    (["report", GRAPH], True),
    (["report", "no/such/run"], True),
    (["paper", "--quick", "--out", GRAPH], True),
    (["paper", "--quick", "--collect", "--out", "no/such/paper"], True),
    (["clusters", "--json"], False),
    (["models"], False),
    (["place", GRAPH, "--cluster", CLUSTER, "--budget", "4", "--microbatches", "2"], True),
    (["place", GRAPH, "--cluster", CLUSTER, "--budget", "4", "--microbatches", "auto"], True),
    (["place", GRAPH, "--cluster", CLUSTER, "--budget", "4", "--microbatches", "0"], True),
    (["place", GRAPH, "--cluster", CLUSTER, "--budget", "4", "--microbatches", "two"], True),
    (["place", "gpt2", "--size", "small", "--cluster", CLUSTER, "--budget", "4", "--microbatches", "3"], True),
    (["place", "gpt2", "--size", "small", "--cluster", CLUSTER, "--budget", "4", "--microbatch-colocation", "x"],
     True),
    (["place", "gpt2", "--size", "small", "--cluster", CLUSTER, "--budget", "4", "--pin", "nothing_is_this=gpu0"],
     True),
    (["compare", "gpt2", "--size", "small", "--cluster", CLUSTER, "--budget", "4", "--microbatches", "3"], True),
    (["compare", GRAPH, "--cluster", CLUSTER, "--budget", "4", "--microbatches", "2"], True),
    (["compare", GRAPH, "--cluster", CLUSTER, "--budget", "4", "--microbatches", "auto"], True),
]


def cases(seed: int = 0, *, per_kind: int = 300, train: int = 15, run_folder: int = 60) -> Iterator[Case]:
    """Every fuzz case, in a fixed order for one ``seed``: ``per_kind`` each of graph, cluster and
    placement files (half structured, half format-agnostic), the flag cases, ``train`` placement
    files for ``postplace train`` and ``run_folder`` corrupted run folders."""
    rng = random.Random(seed)
    graph_doc = base_graph().to_dict()
    graph_bytes = json.dumps(graph_doc).encode()
    cluster_bytes = base_cluster_toml().encode()
    place_bytes = json.dumps(base_placement()).encode()
    good = {GRAPH: graph_bytes, CLUSTER: cluster_bytes, PLACEMENT: place_bytes}
    for k in range(per_kind):
        if k % 2 == 0:
            label, data = _graph_mutation(rng, graph_doc)
            must = True
        else:
            label, data = _agnostic(rng, graph_bytes)
            must = label in ("empty", "non-utf8")
        argv = _simulate() if rng.random() < 0.7 else ["info", GRAPH, "--cluster", CLUSTER, "--json"]
        yield Case("graph file", label, argv, {**good, GRAPH: data}, must)
    for k in range(per_kind):
        if k % 2 == 0:
            label, doc, must = _cluster_mutation(rng)
            data = base_cluster_toml(doc).encode()
        else:
            label, data = _agnostic(rng, cluster_bytes)
            must = label in ("empty", "non-utf8")
        yield Case("cluster file", label, _simulate(), {**good, CLUSTER: data}, must)
    for k in range(per_kind):
        if k % 2 == 0:
            label, doc = _placement_mutation(rng)
            data = json.dumps(doc).encode()
        else:
            label, data = _agnostic(rng, place_bytes)
            must = label in ("empty", "non-utf8")
        yield Case("placement file", label, _simulate(), {**good, PLACEMENT: data}, k % 2 == 0 or must)
    for argv, must in FLAG_CASES:
        yield Case("flags", " ".join(argv[:1] + argv[2:])[:60], list(argv), dict(good), must)
    zoo_place = _zoo_placement() if train else {}
    for _ in range(train):
        p = dict(zoo_place)
        kind = rng.choice(["unknown_op", "unknown_device", "device_type", "top"])
        if kind == "unknown_op":
            p["no_such_op"] = "cpu"
        elif kind == "unknown_device":
            p[rng.choice(list(p))] = rng.choice(["gpu9x", "tpu0", ""])
        elif kind == "device_type":
            p[rng.choice(list(p))] = rng.choice([0, None, ["cpu"]])
        else:
            p = rng.choice([[1], "cpu", None])
        argv = ["train", "rnnlm", "--size", "small", "--placement", PLACEMENT, "--steps", "1", "--threads", "1"]
        yield Case("train placement", kind, argv, {PLACEMENT: json.dumps(p).encode()}, True)
    for _ in range(run_folder):
        target = rng.choice(["checkpoint.json", "checkpoint-*.npz", "run.json", "history.jsonl", "summary.json",
                             "placement.json"])  # fmt: skip (a glob names the file whose name holds a checksum)
        label, data = _agnostic(rng, b"\x00")  # the label only; the bytes are made from the real file
        yield Case("run folder", f"{target}: {label}", ["place", "--resume", "run", "--json"],
                   {f"run/{target}": label.encode()}, False, copy_run=True)  # fmt: skip


def _zoo_placement() -> dict:
    """Every op of the small RNNLM on the CPU: a valid placement file for ``postplace train``."""
    from postplace import zoo

    return {name: "cpu" for name in zoo.cached_graph("rnnlm", "small").names}


def corrupt_run_file(rng: random.Random, data: bytes, label: str) -> bytes:
    """Apply the format-agnostic corruption ``label`` to a run folder file's real bytes."""
    for _ in range(50):
        kind, out = _agnostic(rng, data or b"\x00")
        if kind == label:
            return out
    return data[: len(data) // 2]


# ------------------------------------------------------------------------------------ the judge
def classify(case: Case, rc: int | None, out: str, err: str, check=None) -> str:
    """Sort one CLI outcome; ``check(out) -> bool`` verifies an accepted answer where it can."""
    if rc is None:
        return "hang"
    if "Traceback (most recent call last)" in err or rc not in (0, 2):
        return "internal"
    if rc == 2:
        lines = [x for x in err.splitlines() if x.strip()]
        if len(lines) == 1 and lines[0].startswith("error: "):
            return "clean"
        if any("Usage:" in x for x in lines) and any("Error" in x or "Invalid" in x or "Missing" in x for x in lines):
            return "usage"
        return "internal"
    if case.must_fail:
        return "accepted-wrong"
    if not _all_finite(out):
        return "accepted-wrong"
    if check is not None and not check(out):
        return "accepted-wrong"
    return "accepted"


def _all_finite(out: str) -> bool:
    """Every number in a JSON answer (the last line that parses) is finite."""
    for line in reversed(out.strip().splitlines()):
        try:
            doc = json.loads(line)
        except ValueError:
            continue

        def walk(x):
            if isinstance(x, dict):
                return all(walk(v) for v in x.values())
            if isinstance(x, list):
                return all(walk(v) for v in x)
            if isinstance(x, float):
                return bool(np.isfinite(x))
            return True

        return walk(doc)
    return "inf" not in out and "nan" not in out.lower().replace("nano", "")
