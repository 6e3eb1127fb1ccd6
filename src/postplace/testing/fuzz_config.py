"""The value families of the fuzz: dnn-partitioning workload files (latencies of 1e308 or 0, integers
past 64 bits, machines of a million devices) through ``simulate``, ``info`` and ``place``, and
``--set``/``--config`` values (every strategy's fields out of range, NaN, infinite, huge, of the wrong
type; malformed forms and files).

A table's third column is ``must``: ``True`` certainly invalid, ``False`` certainly valid (within the
documented range: a config field's range is :func:`postplace.search.ranges.field_range`), ``None``
undecided (a value past any practical size, a latency that overflows a sum, a file's machine that a
preset cluster ignores).
"""

from __future__ import annotations

import json
import math
import random
from collections.abc import Iterator

from postplace.testing.fuzz_flags import PLACE_G
from postplace.testing.fuzz_inputs import (
    BIG,
    CLUSTER,
    GRAPH,
    HUGE,
    NAN,
    WORKLOAD,
    Case,
    base_cluster_toml,
    base_graph,
    base_workload,
    expect_of,
    json_bytes,
)

__all__ = ["WORKLOAD_MUTATIONS", "config_cases", "workload_cases"]


def _set_all(d: dict, key: str, value) -> dict:
    for n in d["nodes"]:
        n[key] = value
    return d


WORKLOAD_MUTATIONS = [
    # (label, mutate(doc) -> doc, certainly invalid)
    ("latencies 1e308 everywhere", lambda d: _set_all(_set_all(d, "fpgaLatency", 1e308), "cpuLatency", 1e308), None),
    ("latencies 0 everywhere", lambda d: _set_all(_set_all(d, "fpgaLatency", 0), "cpuLatency", 0), None),
    ("fpgaLatency 1e300 on one node", lambda d: d["nodes"][2].update(fpgaLatency=1e300) or d, None),
    ("cpuLatency 1e308 everywhere", lambda d: _set_all(d, "cpuLatency", 1e308), None),
    ("fpgaLatency 1e400", lambda d: d["nodes"][1].update(fpgaLatency=BIG) or d, True),
    ("fpgaLatency NaN", lambda d: d["nodes"][1].update(fpgaLatency=NAN) or d, True),
    ("fpgaLatency -1", lambda d: d["nodes"][1].update(fpgaLatency=-1) or d, True),
    ("fpgaLatency '1'", lambda d: d["nodes"][1].update(fpgaLatency="1") or d, True),
    ("size 1e30", lambda d: d["nodes"][1].update(size=1e30) or d, True),
    ("size 10**30 (an integer)", lambda d: d["nodes"][1].update(size=10**30) or d, True),
    ("size 10**20 everywhere (integers)", lambda d: _set_all(d, "size", 10**20), True),
    ("size 1e18", lambda d: d["nodes"][1].update(size=1e18) or d, None),
    ("edge size 10**25 (an integer)", lambda d: d["edges"][0].update(size=10**25) or d, True),
    ("edge size 1e300", lambda d: d["edges"][0].update(size=1e300) or d, True),
    ("id 10**30", lambda d: d["nodes"][0].update(id=10**30) or d, True),
    (
        "id 2**63 and an edge to it",
        lambda d: d["nodes"][0].update(id=2**63) or d["edges"][0].update(sourceId=2**63) or d,
        True,
    ),
    ("id -1", lambda d: d["nodes"][0].update(id=-1) or d, True),
    ("id 1.5", lambda d: d["nodes"][0].update(id=1.5) or d, True),
    ("id '1'", lambda d: d["nodes"][0].update(id="1") or d, True),
    ("colorClass 10**30", lambda d: d["nodes"][1].update(colorClass=10**30) or d, True),
    ("colorClass -2", lambda d: d["nodes"][1].update(colorClass=-2) or d, True),
    ("maxFPGAs 10**6", lambda d: d.update(maxFPGAs=10**6) or d, True),
    ("maxCPUs 10**6", lambda d: d.update(maxCPUs=10**6) or d, True),
    ("maxFPGAs 10**30", lambda d: d.update(maxFPGAs=10**30) or d, True),
    ("maxFPGAs 2.5", lambda d: d.update(maxFPGAs=2.5) or d, True),
    ("maxFPGAs '2'", lambda d: d.update(maxFPGAs="2") or d, True),
    ("maxFPGAs true", lambda d: d.update(maxFPGAs=True) or d, True),
    ("maxFPGAs 0 and maxCPUs 0", lambda d: d.update(maxFPGAs=0, maxCPUs=0) or d, True),
    ("maxFPGAs 0", lambda d: d.update(maxFPGAs=0) or d, None),
    ("maxFPGAs 64", lambda d: d.update(maxFPGAs=64) or d, None),
    ("maxSizePerFPGA 1", lambda d: d.update(maxSizePerFPGA=1) or d, None),
    ("maxSizePerFPGA 1e308", lambda d: d.update(maxSizePerFPGA=1e308) or d, True),
    ("maxSizePerFPGA -1", lambda d: d.update(maxSizePerFPGA=-1) or d, True),
    ("maxSizePerFPGA 0", lambda d: d.update(maxSizePerFPGA=0) or d, True),
    ("supportedOnFpga 'false'", lambda d: d["nodes"][1].update(supportedOnFpga="false") or d, True),
    ("isBackwardNode 2", lambda d: d["nodes"][1].update(isBackwardNode=2) or d, True),
    ("nodes empty", lambda d: d.update(nodes=[]) or d, True),
    ("a node is a list", lambda d: d["nodes"].__setitem__(2, [1, 2]) or d, True),
    ("edge to a missing id", lambda d: d["edges"][0].update(destId=99) or d, True),
    ("edge is a string", lambda d: d["edges"].__setitem__(0, "1->2") or d, True),
    ("duplicate id", lambda d: d["nodes"][2].update(id=2) or d, True),
    ("cycle", lambda d: d["edges"].append({"sourceId": 3, "destId": 2, "size": 1.0}) or d, True),
    ("name ''", lambda d: d["nodes"][1].update(name="") or d, True),
    ("name 3", lambda d: d["nodes"][1].update(name=3) or d, True),
    ("no fpgaLatency", lambda d: d["nodes"][1].pop("fpgaLatency") and d, True),
    ("backward-to-forward edge", lambda d: d["edges"].append({"sourceId": 4, "destId": 3, "size": 1.0}) or d, True),
    ("every node CPU-only", lambda d: _set_all(d, "supportedOnFpga", 0), False),
]


def workload_cases(rng: random.Random, n: int) -> Iterator[Case]:
    """dnn-partitioning workload files (latencies, sizes, ids past float or int64 range, the file's
    machine) through ``simulate``, ``info`` and ``place``, on a preset and on ``workload:PRESET``."""
    good = {GRAPH: json.dumps(base_graph().to_dict()).encode(), CLUSTER: base_cluster_toml().encode()}
    commands = [
        ["simulate", WORKLOAD, "--cluster", "k80x2", "--placement", "single:gpu0", "--json"],
        ["info", WORKLOAD, "--cluster", "workload:k80x2", "--json"],
        [
            "place",
            WORKLOAD,
            "--cluster",
            "workload:k80x2",
            "--budget",
            "16",
            "--groups",
            "none",
            "--out",
            "out",
            "--json",
            "--no-report",
        ],
    ]
    todo = [(m, c) for m in WORKLOAD_MUTATIONS for c in commands]
    picked = todo if n >= len(todo) else sorted(rng.sample(range(len(todo)), n))
    for item in picked:
        (label, mutate, must), argv = todo[item] if isinstance(item, int) else item
        data = json_bytes(mutate(json.loads(json.dumps(base_workload()))))
        if label.startswith("max") and not any(a.startswith("workload:") for a in argv):
            must = None  # the file's machine is only built for --cluster workload:PRESET
        yield Case("workload file", f"{argv[0]}: {label}", list(argv), {**good, WORKLOAD: data}, expect_of(must))


def config_cases(rng: random.Random, n: int) -> Iterator[Case]:
    """``--set`` and ``--config`` values: every strategy's fields out of range, NaN, infinite, of the
    wrong type, huge (in range: they must not hang), as ``--set`` text and as TOML; malformed forms
    and files. The fixed cases always run; ``n`` of the generated ones, seeded."""
    import dataclasses
    import typing

    from postplace.search import config_class
    from postplace.search.ranges import field_range

    good = {GRAPH: json.dumps(base_graph().to_dict()).encode(), CLUSTER: base_cluster_toml().encode()}
    base = list(PLACE_G)
    fixed = [
        (["--set", s], must)
        for s, must in (
            ("lr=nan", True),
            ("lr=inf", True),
            ("lr=-1", True),
            ("lr=x", True),
            ("lr=", True),
            ("lr=1e400", True),
            ("batch_size=0", True),
            ("batch_size=1.5", True),
            ("batch_size=" + HUGE, None),
            ("=1", True),
            ("lr", True),
            ("nope=1", True),
            ("init=0,1", True),
            ("init=9,9,9,9,9", True),
            ("use_ce=maybe", True),
            ("eps=none", None),
            ("lr=0.05", False),
            ("lr=0x10", True),
            ("batch_size=1_000", True),
            ("lr= 0.05 ", None),
        )
    ]
    fixed += [
        (["--strategy", "anneal", "--set", s], must)
        for s, must in (
            ("init=0,1", True),
            ("init=9,9,9,9,9", True),
            ("init=-1,0,0,0,0", True),
            ("init=0,1,1,1,1", True),
            ("cooling=1.5", True),
            ("moves_per_ask=" + HUGE, None),
            ("init=" + ",".join(["1"] * 400), True),
        )
    ]
    tomls = {
        "nan.toml": ("lr = nan\n", True),
        "inf.toml": ("lr = inf\n", True),
        "huge.toml": (f"batch_size = {HUGE}\n", None),
        "float_for_int.toml": ("batch_size = 1e3\n", True),
        "str.toml": ('[post]\nlr = "x"\n', True),
        "list.toml": ("lr = [1]\n", True),
        "table.toml": ("post = 3\n", True),
        "nested.toml": ("[post.sub]\nx = 1\n", True),
        "empty.toml": ("", False),
        "syntax.toml": ("lr = = 1\n", True),
        "date.toml": ("lr = 1979-05-27\n", True),
        "bool.toml": ("use_ce = 1\n", True),
        "unknown.toml": ("nope = 1\n", True),
        "init.toml": ("init = [0, 1]\n", True),
        "big_lr.toml": ("lr = 1e400\n", True),
        "int64.toml": ("batch_size = 9223372036854775807\n", None),
        "neg.toml": ("ce_every = -5\n", True),
        "other.toml": ("[anneal]\ncooling = 2\n", None),
    }
    files = {
        **good,
        **{k: v.encode() for k, (v, _) in tomls.items()},
        "latin1.toml": "lr = 0.1 # é\n".encode("latin-1"),
    }
    fixed += [(["--config", k], must) for k, (_, must) in tomls.items()]
    fixed += [
        (["--config", "latin1.toml"], True),
        (["--config", "missing.toml"], True),
        (["--config", "."], True),
        (["--config", GRAPH], True),
        (["--strategy", "anneal", "--config", "other.toml"], True),
    ]
    for extra, must in fixed:
        yield Case("--set/--config", " ".join(extra)[:80], [*base, *extra], files, expect_of(must))
    generated = []
    for strategy in ("post", "anneal", "random", "reinforce", "hp"):
        cls, _ = config_class(strategy)
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            r = field_range(cls, f.name)
            if r is None:  # a boolean
                generated += [(strategy, f.name, v, True) for v in ("2", "yes", "1.0")]
                continue
            kinds = typing.get_args(hints[f.name]) or (hints[f.name],)
            numeric = int in kinds or float in kinds
            if not numeric:
                generated.append((strategy, f.name, "nosuchword", True))
                continue
            if math.isfinite(r.lo):
                generated.append((strategy, f.name, repr(r.lo - 1 if int in kinds else r.lo - 0.5), True))
                if not r.lo_closed:
                    generated.append((strategy, f.name, repr(int(r.lo) if int in kinds else r.lo), True))
                    if float in kinds:  # just inside: must not overflow downstream
                        generated.append((strategy, f.name, "1e-300", False))
            if math.isfinite(r.hi):
                generated.append((strategy, f.name, repr(r.hi + 1), True))
            else:
                generated.append((strategy, f.name, HUGE if int in kinds else "1e300", None))
            generated += [(strategy, f.name, v, True) for v in ("nan", "inf", "-inf", "abc")]
            if int in kinds and float not in kinds:
                generated.append((strategy, f.name, "2.5", True))
    picked = generated if n >= len(generated) else [generated[k] for k in sorted(rng.sample(range(len(generated)), n))]
    for strategy, key, value, must in picked:
        as_toml = rng.random() < 0.3 and value not in ("abc", "nosuchword", "yes")
        extra = ["--strategy", strategy] + (["--config", "c.cfg.toml"] if as_toml else ["--set", f"{key}={value}"])
        text = f"[{strategy}]\n{key} = {value}\n"
        yield Case(
            "--set/--config",
            f"{strategy} {key}={value}" + (" (toml)" if as_toml else ""),
            [*base, *extra],
            {**good, "c.cfg.toml": text.encode()},
            expect_of(must),
        )
