"""The file families of the fuzz: structured mutations of the graph, cluster and placement files, and
format-agnostic corruptions of them, each case run through ``simulate`` (or ``info``).

A structured mutation sets one field of a valid file to a value of the wrong type, a non-finite or
negative number, a name that does not exist, a number past float range, a nesting too deep to
parse: certainly invalid, but for a documented optional field left out of a cluster (certainly
valid). A format-agnostic corruption (:func:`~postplace.testing.fuzz_inputs.agnostic_corruption`) may leave a
valid file or not: :func:`~postplace.testing.fuzz_expect.expect_files` decides from the documented
rules where it can. Also here: placement files for ``postplace train`` and corrupted run folders.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterator

from postplace.testing.fuzz_expect import expect_files
from postplace.testing.fuzz_inputs import (
    BIG,
    CLUSTER,
    CLUSTER_DOC,
    GRAPH,
    INVALID,
    PLACEMENT,
    UNDECIDED,
    VALID,
    Case,
    agnostic_corruption,
    base_cluster_toml,
    base_graph,
    base_placement,
    json_bytes,
    zoo_placement,
)

__all__ = ["file_cases", "run_folder_cases", "train_cases"]

BAD_NUMBERS = ["1", True, None, [], {}, BIG, float("nan"), float("inf"), -1.0]
BAD_INTS = ["0", True, None, 1.5, -7, 2**70]
GRAPH_FLOAT_FIELDS = ["flops", "bytes_accessed", "output_bytes", "persistent_bytes"]


def graph_mutation(rng: random.Random, doc: dict) -> tuple[str, bytes]:
    """One structured mutation of the graph file's dict that makes it certainly invalid."""
    d = json.loads(json.dumps(doc))
    ops, edges, n = d["ops"], d["edges"], len(doc["ops"]["name"])
    kind = rng.choice(
        [
            "version",
            "float_entry",
            "float_field",
            "inplace",
            "int_entry",
            "edge_entry",
            "edge_range",
            "cycle",
            "names",
            "phase",
            "kinds",
            "missing",
            "deep",
            "base",
            "measured",
            "slot",
            "top",
        ]
    )
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
            [
                [{"key": "G", "kind": "tpu", "times": [1.0] * n}],
                [{"key": "G", "kind": "gpu", "times": [1.0]}],
                [{"key": "G", "kind": "gpu", "times": ["1"] * n}],
                [{"key": "G", "kind": "gpu", "times": [-1.0] * n}],
                "x",
                [3],
                [{"kind": "gpu", "times": [1.0] * n}],
            ]
        )
    elif kind == "slot":
        e = rng.randrange(len(edges["src"]))
        edges["slot"][e] = -1
    else:
        d = rng.choice([[], "graph", 3, None, {"format": "postplace.opgraph"}])
    return kind, json_bytes(d)


def cluster_mutation(rng: random.Random) -> tuple[str, dict, bool]:
    """A structured mutation of the cluster document: (label, document, certainly invalid)."""
    d = json.loads(json.dumps(CLUSTER_DOC))
    kind = rng.choice(
        [
            "device_num",
            "link_num",
            "latency",
            "kind",
            "name",
            "link_end",
            "missing",
            "shape",
            "dup",
            "reserve",
            "disconnect",
        ]
    )
    if kind == "device_num":
        dev = rng.choice(d["device"])
        f = rng.choice(
            [
                "peak_flops",
                "memory_bandwidth",
                "memory",
                "launch_overhead",
                "reserve",
                "peak_flops_bf16",
                "peak_flops_fp16",
            ]
        )
        dev[f] = rng.choice(
            ["1e9", True, [1.0], {"a": 1}, float("nan"), float("inf"), -1.0, BIG]
            + ([0.0] if f in ("peak_flops", "memory_bandwidth", "memory", "peak_flops_bf16", "peak_flops_fp16") else [])
        )
        return f"device {f}={dev[f]!r}"[:60], d, True
    if kind in ("link_num", "latency"):
        link = rng.choice(d["link"])
        f = "latency" if kind == "latency" else "bandwidth"
        link[f] = rng.choice(
            ["1e9", True, [1.0], float("nan"), float("inf"), float("-inf"), -1.0, BIG]
            + ([0.0] if f == "bandwidth" else [])
        )
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


def placement_mutation(rng: random.Random) -> tuple[str, object]:
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


def _simulate(graph=GRAPH, cluster=CLUSTER, placement=PLACEMENT) -> list[str]:
    return ["simulate", graph, "--cluster", cluster, "--placement", placement, "--json"]


def _agnostic_case(category: str, label: str, argv: list[str], files: dict[str, bytes]) -> Case:
    expect, why = expect_files(files, argv)
    return Case(category, label, argv, files, expect, why=why)


def file_cases(rng: random.Random, per_kind: int) -> Iterator[Case]:
    """``per_kind`` each of graph, cluster and placement files, half structured, half format-agnostic."""
    graph_doc = base_graph().to_dict()
    graph_bytes = json.dumps(graph_doc).encode()
    cluster_bytes = base_cluster_toml().encode()
    place_bytes = json.dumps(base_placement()).encode()
    good = {GRAPH: graph_bytes, CLUSTER: cluster_bytes, PLACEMENT: place_bytes}
    for k in range(per_kind):
        if k % 2 == 0:
            label, data = graph_mutation(rng, graph_doc)
        else:
            label, data = agnostic_corruption(rng, graph_bytes)
        argv = _simulate() if rng.random() < 0.7 else ["info", GRAPH, "--cluster", CLUSTER, "--json"]
        files = {**good, GRAPH: data}
        yield Case("graph file", label, argv, files) if k % 2 == 0 else _agnostic_case("graph file", label, argv, files)
    for k in range(per_kind):
        if k % 2 == 0:
            label, doc, must = cluster_mutation(rng)
            yield Case(
                "cluster file",
                label,
                _simulate(),
                {**good, CLUSTER: base_cluster_toml(doc).encode()},
                INVALID if must else VALID,
            )
        else:
            label, data = agnostic_corruption(rng, cluster_bytes)
            yield _agnostic_case("cluster file", label, _simulate(), {**good, CLUSTER: data})
    for k in range(per_kind):
        if k % 2 == 0:
            label, doc = placement_mutation(rng)
            yield Case("placement file", label, _simulate(), {**good, PLACEMENT: json.dumps(doc).encode()})
        else:
            label, data = agnostic_corruption(rng, place_bytes)
            yield _agnostic_case("placement file", label, _simulate(), {**good, PLACEMENT: data})


def train_cases(rng: random.Random, n: int) -> Iterator[Case]:
    """``n`` placement files naming what the small RNNLM does not have, for ``postplace train``."""
    zoo_place = zoo_placement() if n else {}
    for _ in range(n):
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
        yield Case("train placement", kind, argv, {PLACEMENT: json.dumps(p).encode()}, INVALID)


def run_folder_cases(rng: random.Random, n: int) -> Iterator[Case]:
    """``n`` copies of a real run folder with one file corrupted (the benchmark applies the corruption
    to the real bytes), resumed: a corrupted state file may or may not still hold a state."""
    for _ in range(n):
        # a glob names the array file, whose name holds a checksum
        target = rng.choice(
            ["checkpoint.json", "checkpoint-*.npz", "run.json", "history.jsonl", "summary.json", "placement.json"]
        )
        label, data = agnostic_corruption(rng, b"\x00")  # the label only; the bytes are made from the real file
        yield Case(
            "run folder",
            f"{target}: {label}",
            ["place", "--resume", "run", "--json"],
            {f"run/{target}": label.encode()},
            UNDECIDED,
            copy_run=True,
        )
