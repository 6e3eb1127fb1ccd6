"""The flag families of the fuzz: every command's flags with bad values (zero or negative counts, bad
sizes, missing or endless files, names too long for the file system) and the flags added since the
first fuzz (``--microbatches``, ``--confirm``, ``--ray``, ``--optimizer``/``--lr``/``--precision``,
``--cluster workload:``, ``--budget``, ``--resume`` with other flags).

Each entry of a table is ``(argv, must)``: ``True`` certainly invalid, ``False`` certainly valid (the
README's command table or ``--help`` promises it), ``None`` undecided (the documentation does not
say: a count past any practical size, a spelling in another case, a measurement that needs a GPU).
"""

from __future__ import annotations

import json
from collections.abc import Iterator

from postplace.testing.fuzz_inputs import (
    CLUSTER,
    CLUSTER_DOC,
    GRAPH,
    HUGE,
    PLACEMENT,
    VALID,
    WORKLOAD,
    Case,
    base_cluster_toml,
    base_graph,
    base_placement,
    base_workload,
    expect_of,
    json_bytes,
)
from postplace.testing.fuzz_runs import RESUME

__all__ = ["FLAG_CASES", "flag_cases", "flag_family_cases"]

ZOO = ["rnnlm", "--size", "small"]  # the cheapest zoo model: batch 2, micro-batch counts 1 and 2
PLACE_G = [
    "place",
    GRAPH,
    "--cluster",
    CLUSTER,
    "--budget",
    "16",
    "--groups",
    "none",
    "--out",
    "out",
    "--json",
    "--no-report",
]
PLACE_Z = ["place", *ZOO, "--cluster", "k80x2", "--budget", "16", "--out", "out", "--json", "--no-report"]
PLACE_Z1 = [*PLACE_Z, "--microbatches", "1"]
COMPARE_Z = [
    "compare",
    *ZOO,
    "--cluster",
    "k80x2",
    "--strategies",
    "random",
    "--budget",
    "8",
    "--seeds",
    "1",
    "--out",
    "cmp",
    "--json",
    "--no-report",
]
SIMULATE_Z = ["simulate", *ZOO, "--cluster", "k80x2", "--placement", "single:gpu0", "--json"]
GRAPH_Z = ["graph", *ZOO, "--out", "g2.json"]
TRAIN_Z = ["train", *ZOO, "--placement", "single:cpu", "--steps", "1", "--threads", "1"]
SIMULATE_G = ["simulate", GRAPH, "--cluster", CLUSTER, "--placement", PLACEMENT, "--json"]


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
    # files that never end or are binary (a device), empty values, absurd thread counts
    (["info", "/dev/zero"], True),
    (["simulate", GRAPH, "--cluster", CLUSTER, "--placement", "/dev/zero"], True),
    (["simulate", "/dev/urandom", "--cluster", CLUSTER, "--placement", "single:gpu0"], True),
    (["place", GRAPH, "--cluster", CLUSTER, "--budget", "8", "--config", "/dev/zero", "--out", "o"], True),
    (["place", GRAPH, "--cluster", "/dev/zero", "--budget", "8", "--out", "o"], True),
    (["compare", GRAPH, "-c", CLUSTER, "--strategies", "random", "--seeds", "1", "--budget", "8", "--out", ""], True),
    (["graph", "rnnlm", "--size", "small", "--out", "."], True),
    (["report", ""], True),
    (["train", "rnnlm", "--size", "small", "--placement", "single:cpu", "--steps", "1", "--threads", "100000"], True),
    # paths longer than the file system allows (ENAMETOOLONG), as each file argument
    (["simulate", "x" * 5000, "--cluster", CLUSTER, "--placement", "single:gpu0"], True),
    (["simulate", GRAPH, "--cluster", "x" * 5000, "--placement", "single:gpu0"], True),
    (["simulate", GRAPH, "--cluster", CLUSTER, "--placement", "x" * 5000 + ".json"], True),
    (["place", GRAPH, "--cluster", CLUSTER, "--budget", "8", "--out", "x" * 5000], True),
    (["report", "x" * 5000], True),
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
    (["profile", "rnnlm", "--size", "small", "--runs", "1000000000000"], True),  # petabytes of timings
    (["calibrate", "rnnlm", "--runs", "1000000000000"], True),
    (["compare", GRAPH, "-c", CLUSTER, "--seeds", "1000000000", "--strategies", "random", "--budget", "8"], True),
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
    (["place", "gpt2", "--size", "small", "--cluster", CLUSTER, "--budget", "4", "--microbatch-colocation", "x"], True),
    (
        ["place", "gpt2", "--size", "small", "--cluster", CLUSTER, "--budget", "4", "--pin", "nothing_is_this=gpu0"],
        True,
    ),
    (["compare", "gpt2", "--size", "small", "--cluster", CLUSTER, "--budget", "4", "--microbatches", "3"], True),
    (["compare", GRAPH, "--cluster", CLUSTER, "--budget", "4", "--microbatches", "2"], True),
    (["compare", GRAPH, "--cluster", CLUSTER, "--budget", "4", "--microbatches", "auto"], True),
]


def flag_cases() -> Iterator[Case]:
    """The first fuzz's flag cases (:data:`FLAG_CASES`), on the base files."""
    good = {
        GRAPH: json.dumps(base_graph().to_dict()).encode(),
        CLUSTER: base_cluster_toml().encode(),
        PLACEMENT: json.dumps(base_placement()).encode(),
    }
    for argv, must in FLAG_CASES:
        yield Case("flags", " ".join(argv[:1] + argv[2:])[:60], list(argv), dict(good), expect_of(must))


def _workload_with(**machine) -> bytes:
    return json_bytes({**base_workload(), **machine})


def flag_family_cases() -> Iterator[Case]:
    """The flags added since the first fuzz: ``--microbatches``, ``--confirm``, ``--confirm-with``, ``--ray``,
    ``--optimizer`` / ``--lr`` / ``--precision``, ``--cluster workload:`` and ``--resume`` with other flags."""
    good = {
        GRAPH: json.dumps(base_graph().to_dict()).encode(),
        CLUSTER: base_cluster_toml().encode(),
        WORKLOAD: json_bytes(base_workload()),
    }
    families = {
        "--microbatches": [
            *[([*PLACE_G, "--microbatches", m], m != "1") for m in ("auto", "2", "0", "-1", HUGE, "1", "1.5", "")],
            *[
                ([*PLACE_Z, "--microbatches", m], m not in ("2", "auto"))
                for m in ("3", "4", "0", "-1", HUGE, "2", "auto", "1e3", " 2")
            ],
            ([*PLACE_Z, "--microbatches", "2", "--microbatch-colocation", "module"], False),
            *[([*COMPARE_Z, "--microbatches", m], m != "2") for m in ("3", "0", "-2", "auto", "2", HUGE)],
            *[([*SIMULATE_Z, "--microbatches", m], m != "2") for m in ("0", "-1", "3", "2", HUGE)],
            *[([*GRAPH_Z, "--microbatches", m], m != "2") for m in ("0", "-1", "3", HUGE, "2")],
            *[([*TRAIN_Z, "--microbatches", m], m != "2") for m in ("0", "3", "-1", HUGE)],
        ],
        "--confirm": [
            ([*PLACE_G, "--confirm", "1"], True),
            ([*PLACE_G, "--confirm", "-1"], True),
            ([*PLACE_G, "--confirm", "x"], True),
            ([*PLACE_Z, "--confirm", "1", "--microbatches", "auto"], None),  # the README allows it; GPUs measure
            ([*PLACE_Z1, "--confirm", "1", "--evaluator", "torch"], True),
            ([*PLACE_Z1, "--confirm", "-2"], True),
            ([*PLACE_Z1, "--confirm", HUGE, "--map-all-to", "cpu"], None),
            ([*PLACE_Z1, "--confirm", "1", "--map-all-to", "cpu"], False),
            ([*PLACE_Z1, "--confirm", "1"], None),  # measures on the GPUs of k80x2: a CPU-only machine has none
        ],
        "--confirm-with": [
            ([*PLACE_Z1, "--confirm", "1", "--confirm-with", w, "--map-all-to", "cpu"], True)
            for w in ("", "Launch", "processes", "launch,process", HUGE)
        ]
        + [
            ([*PLACE_Z1, "--confirm-with", "launch"], True),  # nothing to confirm
            ([*PLACE_Z1, "--confirm", "1", "--confirm-with", "launch", "--ray", "127.0.0.1:1"], True),
            ([*PLACE_Z1, "--confirm", "1", "--confirm-with", "launch", "--map-all-to", "gpu0"], True),
        ],
        "--ray": [
            *[
                ([*PLACE_G, "--ray", a], True)
                for a in (
                    "127.0.0.1:1",
                    "",
                    "127.0.0.1:99999",
                    "not an address",
                    "ray://127.0.0.1:1",
                    "127.0.0.1:1:2",
                    "[::1]:1",
                )
            ],
            ([*PLACE_G, "--ray", "127.0.0.1:1", "--budget", "5s"], True),
            ([*PLACE_Z1, "--ray", "127.0.0.1:1"], True),
            ([*PLACE_Z1, "--ray", "127.0.0.1:1", "--evaluator", "torch"], True),
            ([*PLACE_Z, "--ray", "127.0.0.1:1"], True),
            ([*PLACE_Z1, "--ray", "127.0.0.1:1", "--confirm", "1"], True),
        ],
        "--optimizer/--lr/--precision": [
            *[
                ([*PLACE_Z1, flag, v], must)
                for flag, v, must in (
                    ("--optimizer", "lamb", True),
                    ("--optimizer", "", True),
                    ("--optimizer", "ADAM", None),
                    ("--lr", "nan", True),
                    ("--lr", "inf", True),
                    ("--lr", "-1", True),
                    ("--lr", "x", True),
                    ("--lr", "1e400", True),
                    ("--lr", "0", None),
                    ("--lr", "-inf", True),
                    ("--precision", "fp8", True),
                    ("--precision", "BF16", True),
                    ("--precision", "", True),
                    ("--precision", "fp16", False),
                )
            ],
            ([*_on(PLACE_Z1, "k80x4"), "--precision", "bf16"], None),  # a K80 has no bf16 peak
            ([*PLACE_Z1, "--optimizer", "adam", "--lr", "3e-4"], False),
            ([*PLACE_G, "--optimizer", "adam"], True),
            ([*PLACE_G, "--lr", "0.1"], True),
            ([*PLACE_G, "--precision", "bf16"], True),
            ([*GRAPH_Z, "--lr", "nan"], True),
            ([*GRAPH_Z, "--lr", "-1"], True),
            ([*GRAPH_Z, "--precision", "fp8"], True),
            ([*TRAIN_Z, "--lr", "nan"], True),
            ([*TRAIN_Z, "--lr", "-1"], True),
            ([*TRAIN_Z, "--precision", "fp8"], True),
            ([*COMPARE_Z, "--lr", "nan"], True),
            ([*COMPARE_Z, "--precision", "fp8"], True),
            ([*COMPARE_Z, "--optimizer", "lamb"], True),
        ],
        "--cluster workload:": [
            *[
                (["simulate", WORKLOAD, "--cluster", c, "--placement", "single:gpu0", "--json"], must)
                for c, must in (
                    ("workload:", True),
                    ("workload:nosuch", True),
                    ("workload:missing.toml", True),
                    ("workload:workload:k80x2", True),
                    ("workload:.", True),
                    ("workload:" + CLUSTER, None),
                    ("workload:k80x4", False),
                )
            ],
            (["info", GRAPH, "--cluster", "workload:k80x2", "--json"], True),
            (_on(PLACE_Z1, "workload:k80x2"), True),
            *[
                ([*argv[:1], "big.json", *argv[2:]], True)
                for argv in (
                    ["info", WORKLOAD, "--cluster", "workload:k80x4", "--json"],
                    ["simulate", WORKLOAD, "--cluster", "workload:k80x4", "--placement", "single:gpu0", "--json"],
                    [
                        "place",
                        WORKLOAD,
                        "--cluster",
                        "workload:k80x4",
                        "--budget",
                        "16",
                        "--groups",
                        "none",
                        "--out",
                        "out",
                        "--json",
                        "--no-report",
                    ],
                    [
                        "compare",
                        WORKLOAD,
                        "--cluster",
                        "workload:k80x4",
                        "--strategies",
                        "random",
                        "--budget",
                        "8",
                        "--seeds",
                        "1",
                        "--out",
                        "cmp",
                        "--json",
                        "--no-report",
                    ],
                )
            ],
            *[
                ([*argv[:1], "cpus.json", *argv[2:]], True)
                for argv in (
                    ["info", WORKLOAD, "--cluster", "workload:k80x4", "--json"],
                    ["simulate", WORKLOAD, "--cluster", "workload:k80x4", "--placement", "single:cpu", "--json"],
                )
            ],
            (["info", "many.json", "--cluster", "workload:k80x4", "--json"], False),
            (["simulate", "many.json", "--cluster", "workload:k80x4", "--placement", "single:gpu0", "--json"], False),
        ],
    }
    for n in (64, 300):  # a cluster file with many devices: its routes must not take minutes
        doc = json.loads(json.dumps(CLUSTER_DOC))
        doc["device"][1]["names"] = [f"gpu{i}" for i in range(n)]
        doc["link"] = doc["link"][:2] + [
            {"a": f"gpu{i}", "b": "board", "bandwidth": 1.575e10, "latency": 1e-6} for i in range(n)
        ]
        yield Case(
            "cluster file (large)",
            f"{n} GPUs behind one switch",
            SIMULATE_G,
            {**good, CLUSTER: base_cluster_toml(doc).encode(), PLACEMENT: json.dumps(base_placement()).encode()},
            VALID,
        )
    extra = {
        "big.json": _workload_with(maxFPGAs=10**6),
        "cpus.json": _workload_with(maxCPUs=10**6),
        "many.json": _workload_with(maxFPGAs=60),
    }
    families["--budget"] = [
        ([*PLACE_G[:4], "--budget", b, *PLACE_G[6:]], must)
        for b, must in (
            ("\u00b2", True),
            ("\u0661\u0662", True),
            (HUGE, True),
            ("1" + "0" * 400 + "s", True),
            ("0", True),
            ("9" * 14 + "s", True),
            ("1e3", True),
            ("2s", False),
            ("0.5m", None),
        )
    ]
    for family, items in families.items():
        for argv, must in items:
            yield Case(family, _short(argv), list(argv), {**good, **extra}, expect_of(must))
    # --resume with other flags, on the graph file's run folder
    for flags, must in (
        (["--seed", "3"], True),
        (["--budget", "10"], True),
        (["--budget", "0"], True),
        (["--budget", "x"], True),
        (["--budget", "96"], False),
        (["--set", "lr=nan"], True),
        (["--set", "lr=0.1"], None),
        (["--set", "lr=0.5"], True),
        (["--microbatches", "2"], True),
        (["--microbatches", "auto"], True),
        (["--lr", "nan"], True),
        (["--precision", "bf16"], True),
        (["--optimizer", "adam"], True),
        (["--ray", "127.0.0.1:1"], True),
        (["--confirm", "1"], True),
        (["--out", "other"], True),
        (["--strategy", "random"], True),
        (["--groups", "4"], True),
        (["--cluster", "k80x2"], True),
        (["--pin", "conv=gpu1"], True),
        (["--exclude", "gpu1"], True),
        (["--warm-start", "m-etf"], True),
        (["--evaluator", "torch"], True),
        (["--size", "small"], True),
        (["--map-all-to", "cpu"], True),
        (["--budget", "\u00b2"], True),
        (["--budget", HUGE], True),
    ):
        yield Case(
            "run folder: --resume flags", " ".join(flags), [*RESUME, *flags], {}, expect_of(must), template="file"
        )
    for argv in (
        ["place", "--resume", "nosuch", "--json"],
        ["place", "--resume", GRAPH, "--json"],
        ["place", "--resume", ".", "--json"],
        ["report", "nosuch"],
        ["report", GRAPH],
    ):
        yield Case("run folder: --resume flags", " ".join(argv), list(argv), dict(good))


def _on(argv: list[str], cluster: str) -> list[str]:
    """``argv`` with ``--cluster`` set to ``cluster``."""
    k = argv.index("--cluster")
    return [*argv[: k + 1], cluster, *argv[k + 2 :]]


def _short(argv: list[str]) -> str:
    text = " ".join(a if a else "''" for a in argv)
    for long, short in (
        (" ".join(PLACE_Z1), "place Z1"),
        (" ".join(PLACE_Z), "place Z"),
        (" ".join(PLACE_G), "place G"),
        (" ".join(COMPARE_Z), "compare Z"),
        (" ".join(SIMULATE_Z), "simulate Z"),
        (" ".join(GRAPH_Z), "graph Z"),
        (" ".join(TRAIN_Z), "train Z"),
    ):
        text = text.replace(long, short)
    return text[:90]
