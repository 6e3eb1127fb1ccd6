"""The fuzz's valid inputs, the :class:`Case` it runs, and the format-agnostic corruptions of bytes.

The base inputs are one small valid input of each kind: a seven-op graph (:func:`base_graph`), a
cluster of one CPU and two GPUs (:data:`CLUSTER_DOC`, as TOML by :func:`base_cluster_toml`), a
placement of that graph on it (:func:`base_placement`) and a dnn-partitioning workload
(:func:`base_workload`). :func:`agnostic_corruption` corrupts any bytes without knowing their format (flipped
bits, truncation, a deleted span, garbage, non-UTF-8 bytes, NUL bytes, an empty file).

Every :class:`Case` carries what the documentation promises about it (``expect``): :data:`INVALID`
(it must be refused), :data:`VALID` (the README, the CLI table or a documented file format promise it
is accepted) or :data:`UNDECIDED` (the documentation does not decide: a corruption that may or may
not leave a valid file, a value past any practical size).
"""

from __future__ import annotations

import json
import math
import random
from dataclasses import dataclass, field

__all__ = [
    "CLUSTER_DOC",
    "INVALID",
    "UNDECIDED",
    "VALID",
    "Case",
    "base_cluster_toml",
    "base_graph",
    "base_placement",
    "base_workload",
    "corrupt_run_file",
    "expect_of",
]

GRAPH, CLUSTER, PLACEMENT, WORKLOAD = "g.json", "c.toml", "p.json", "w.json"
BIG = "__BIG_NUMBER__"  # as a value: a number past float range (1e400 in JSON, 400 digits in TOML)
NAN, INF = float("nan"), float("inf")
DELETE = "__DELETE__"  # as an edit's value: remove the field
HUGE = "99999999999999999999"  # a count past 64 bits, as a flag's text

INVALID, VALID, UNDECIDED = "invalid", "valid", "undecided"
EXPECTATIONS = (INVALID, VALID, UNDECIDED)


def expect_of(must) -> str:
    """The expectation a family's table writes as True (certainly invalid), False (certainly valid) or
    None (the documentation does not decide)."""
    return UNDECIDED if must is None else INVALID if must else VALID


@dataclass
class Case:
    """One fuzz case: the files to write into a fresh folder, the ``postplace`` arguments to run there
    and ``expect``, what the documentation promises: :data:`INVALID` (accepting it is a wrong answer),
    :data:`VALID` (refusing it is a defect: ``refused-valid``) or :data:`UNDECIDED`."""

    category: str
    label: str
    argv: list[str]
    files: dict[str, bytes] = field(default_factory=dict)
    expect: str = INVALID
    copy_run: bool = False  # start from a copy of the real tiny run folder (run-folder cases)
    template: str | None = None  # run_edit_cases: "file" (a graph file's run) or "zoo" (a run over m)
    edits: list = field(default_factory=list)  # run_edit_cases: the Edit objects applied to the copy
    why: str = ""  # how ``expect`` was decided, where the fuzz's own reading of the files decided it

    def __post_init__(self):
        if self.expect not in EXPECTATIONS:
            raise ValueError(f"expect must be one of {EXPECTATIONS}, not {self.expect!r}")

    @property
    def must_fail(self) -> bool:
        """Certainly invalid (what the two-valued fuzz called it)."""
        return self.expect == INVALID


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
        {
            "name": "cpu",
            "kind": "cpu",
            "model": "X",
            "peak_flops": 5e11,
            "memory_bandwidth": 5e10,
            "memory": 6e10,
            "reserve": 1e9,
            "launch_overhead": 5e-6,
        },
        {
            "names": ["gpu0", "gpu1"],
            "kind": "gpu",
            "model": "G",
            "peak_flops": 3e12,
            "memory_bandwidth": 2.4e11,
            "memory": 1.2e10,
            "reserve": 5e8,
            "launch_overhead": 1e-5,
        },
    ],
    "switch": [{"name": "host"}, {"name": "board"}],
    "link": [
        {"a": "cpu", "b": "host", "bandwidth": 7.7e10, "latency": 0.0},
        {"a": "board", "b": "host", "bandwidth": 1.575e10, "latency": 5e-6},
        {"a": "gpu0", "b": "board", "bandwidth": 1.575e10, "latency": 1e-6},
        {"a": "gpu1", "b": "board", "bandwidth": 1.575e10, "latency": 1e-6},
    ],
}


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


def base_workload() -> dict:
    """A small dnn-partitioning workload: a CPU-only input, two layers, their backward nodes, the
    file's own machine (two 1 GB accelerators, one CPU)."""

    def node(i, name, fpga, color=None, bw=0, **kw):
        d = {"id": i, "name": name, "fpgaLatency": fpga, "cpuLatency": 10 * fpga, "size": 1e6, "isBackwardNode": bw}
        return {**d, **({} if color is None else {"colorClass": color}), **kw}

    nodes = [
        node(1, "in", 0.1, supportedOnFpga=0),
        node(2, "conv", 2.0, 1),
        node(3, "fc", 1.0, 2),
        node(4, "fc_grad", 1.5, 2, 1),
        node(5, "conv_grad", 3.0, 1, 1),
    ]
    edges = [{"sourceId": a, "destId": b, "size": s, "cost": 0} for a, b, s in ((1, 2, 4e6), (2, 3, 2e6), (4, 5, 2e6))]
    return {"maxSizePerFPGA": 1e9, "maxFPGAs": 2, "maxCPUs": 1, "nodes": nodes, "edges": edges}


def zoo_placement() -> dict:
    """Every op of the small RNNLM on the CPU: a valid placement file for ``postplace train``."""
    from postplace import zoo

    return {name: "cpu" for name in zoo.cached_graph("rnnlm", "small").names}


# ------------------------------------------------------------------------------------ corruptions
def json_bytes(doc) -> bytes:
    text = json.dumps(doc)
    return text.replace(f'"{BIG}"', "1e400").encode()


def agnostic_corruption(rng: random.Random, data: bytes) -> tuple[str, bytes]:
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


def corrupt_run_file(rng: random.Random, data: bytes, label: str) -> bytes:
    """Apply the format-agnostic corruption ``label`` to a run folder file's real bytes."""
    for _ in range(50):
        kind, out = agnostic_corruption(rng, data or b"\x00")
        if kind == label:
            return out
    return data[: len(data) // 2]
