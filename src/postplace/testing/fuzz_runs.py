"""The run-folder families of the fuzz: a copy of a real run folder with one file damaged, deleted or
edited (checksums recomputed, so the edit reaches the reader's checks, not only the checksum's), then
``place --resume`` or ``report``.

:func:`run_edit_pool` lists every case, :func:`run_edit_cases` picks a seeded share of them and
:func:`apply_edit` applies one :class:`Edit` to a copy. A table's third column is True where the edit
certainly makes the folder invalid, False where it may not; the states a run stopped at any moment
can be in (killed before it wrote its checkpoint, its summary, its placement) are certainly valid:
the README's ``--resume DIR`` "continues a run stopped at any moment".
"""

from __future__ import annotations

import random
from collections.abc import Iterator

from postplace.testing.fuzz_edits import Edit, apply_edit
from postplace.testing.fuzz_inputs import (
    DELETE,
    HUGE,
    INF,
    INVALID,
    NAN,
    UNDECIDED,
    VALID,
    Case,
)

__all__ = ["Edit", "apply_edit", "run_edit_cases", "run_edit_pool"]

RESUME = ["place", "--resume", "run", "--json", "--no-report"]


RUN_JSON = [  # (path, value, certainly invalid), both templates
    ("seed", -1, True),
    ("seed", "0", True),
    ("seed", 1.5, True),
    ("seed", True, True),
    ("seed", 2**70, True),
    ("seed", 7, True),
    ("seed", NAN, True),
    ("seed", DELETE, True),
    ("groups", 0, True),
    ("groups", -3, True),
    ("groups", "x", True),
    ("groups", 10**12, True),
    ("groups", 2, True),
    ("groups", 1.5, True),
    ("budget", "abc", True),
    ("budget", 0, True),
    ("budget", "-5", True),
    ("budget", 1e308, True),
    ("budget", None, True),
    ("budget", [48], True),
    ("budget", HUGE + "0000", True),
    ("strategy", "nope", True),
    ("strategy", 3, True),
    ("strategy", "random", True),
    ("strategy", "anneal", True),
    ("target", "x", True),
    ("target", None, True),
    ("target.kind", "nope", True),
    ("target.kind", 3, True),
    ("graph_sha", "0" * 16, True),
    ("graph_sha", 3, True),
    ("cluster_sha", "0" * 16, True),
    ("cluster_sha", None, True),
    ("cluster_spec", "k80x4", True),
    ("cluster_spec", "/no/such.toml", True),
    ("cluster_spec", 3, True),
    ("cluster_spec", None, True),
    ("cluster_spec", "workload:k80x2", True),
    ("cluster_spec", "", True),
    ("cluster_spec", [], True),
    ("pins", 3, True),
    ("pins", ["(=gpu0"], True),
    ("pins", ["conv=gpu9"], True),
    ("pins", [1], True),
    ("pins", "conv=gpu0", True),
    ("pins", [".*=gpu1"], True),
    ("pins", [{"a": 1}], True),
    ("exclude", ["gpu9"], True),
    ("exclude", "gpu0", True),
    ("exclude", ["gpu1"], True),
    ("exclude", [None], True),
    ("warm_start", "nope", True),
    ("warm_start", 3, True),
    ("warm_start", "/no/such.json", True),
    ("warm_start", "m-etf", True),
    ("warm_start", ["m-etf"], True),
    ("evaluator", "nope", True),
    ("evaluator", 3, True),
    ("evaluator", "torch", True),
    ("map_all_to", 3, True),
    ("map_all_to", "cpu", True),
    ("config", 3, True),
    ("config", None, True),
    ("config", [], True),
    ("config.lr", "x", True),
    ("config.lr", NAN, True),
    ("config.lr", -1, True),
    ("config.lr", 0.05, True),
    ("config.batch_size", 0, True),
    ("config.batch_size", 16, True),
    ("config.batch_size", 2**70, True),
    ("config.nope", 1, True),
    ("config.init", [0] * 99, True),
    ("config.init", "speed", True),
    ("config.use_ce", "yes", True),
    ("config.lr", INF, True),
    ("config.batch_size", DELETE, True),
    ("format", "x", True),
    ("version", 2, True),
    ("version", "1", True),
    ("version", DELETE, False),
    ("microbatches", 0, True),
    ("microbatches", "x", True),
    ("microbatches", 3, True),
    ("microbatches", 2, True),
    ("microbatches", [1], True),
    ("microbatch_colocation", "x", True),
    ("microbatch_colocation", 3, True),
    ("microbatch_colocation", "module", True),
    ("microbatch_note", 3, True),
    ("graph", "renamed", False),
    ("extra_field", 1, False),
    ("checksum", 3, True),
    ("checksum", DELETE, True),
    ("", [], True),
    ("", "x", True),
]
RUN_JSON_FILE = [
    ("target.path", "/no/such.json", True),
    ("target.path", 3, True),
    ("target.path", "c.toml", True),
    ("target.path", None, True),
    ("budget", "96", False),
    ("budget", "2s", False),
    ("microbatches", "auto", True),
]
RUN_JSON_ZOO = [
    ("target.name", "nosuch", True),
    ("target.name", "gpt2", True),
    ("target.name", 3, True),
    ("target.size", "huge", True),
    ("target.size", 3, True),
    ("target.optimizer", "lamb", True),
    ("target.optimizer", {"name": "adam"}, True),
    ("target.optimizer", 3, True),
    ("target.optimizer.groups.0.lr", NAN, True),
    ("target.optimizer.groups.0.lr", -1, True),
    ("target.optimizer.groups.0.lr", 0.5, True),
    ("target.optimizer.name", "lamb", True),
    ("target.optimizer.groups", [], True),
    ("target.optimizer.groups.0.momentum", "x", True),
    ("target.precision", "fp8", True),
    ("target.precision", "bf16", True),
    ("target.precision", 3, True),
    ("target.microbatches", 2, True),
    ("microbatch_counts", [1], True),
    ("microbatch_counts", [1, 2, 4], True),
    ("microbatch_counts", [0, 1], True),
    ("microbatch_counts", "x", True),
    ("microbatch_counts", [2, 1], True),
    ("microbatch_counts", [1, 1], True),
    ("microbatch_counts", [1, 2**70], True),
    ("microbatch_counts", [1, 2.0], True),
    ("graph_shas", {"1": "x", "2": "y"}, True),
    ("graph_shas.2", 3, True),
    ("graph_shas", 3, True),
    ("microbatch_skipped", 3, True),
    ("microbatch_skipped", {"4": 3}, True),
    ("microbatches", 1, True),
    ("budget", "96", True),
    ("budget", "3", True),
]
CHECKPOINT = [  # (body path, value, certainly invalid); "@x" edits the head
    ("runner.samples", -1, True),
    ("runner.samples", "x", True),
    ("runner.samples", 10**12, True),
    ("runner.samples", 1.5, True),
    ("runner.samples", NAN, True),
    ("runner.samples", 0, True),
    ("runner.samples", 2**70, True),
    ("runner.samples", DELETE, True),
    ("runner.best_step_time", NAN, True),
    ("runner.best_step_time", -1.0, True),
    ("runner.best_step_time", "x", True),
    ("runner.best_step_time", 0.0, True),
    ("runner.best_step_time", 1e-9, True),
    ("runner.best_step_time", INF, True),
    ("runner.best_placement", [9, 9, 9, 9, 9], True),
    ("runner.best_placement", [0], True),
    ("runner.best_placement", "x", True),
    ("runner.best_placement", [-1, -1, -1, -1, -1], True),
    ("runner.best_placement", None, True),
    ("runner.best_placement", [[0]], True),
    ("runner.best_sample", -5, True),
    ("runner.best_sample", "x", True),
    ("runner.best_sample", 10**9, True),
    ("runner.elapsed", NAN, True),
    ("runner.elapsed", -1, True),
    ("runner.elapsed", "x", True),
    ("runner.elapsed", 1e308, True),
    ("runner.history_bytes", -1, True),
    ("runner.history_bytes", 10**12, True),
    ("runner.history_bytes", "x", True),
    ("runner.history_bytes", 0, True),
    ("runner.history_bytes", 2**70, True),
    ("runner.feasible", -1, True),
    ("runner.feasible", 10**6, True),
    ("runner.evaluations", -1, True),
    ("runner.checkpointed", "x", True),
    ("runner.last_batch_mean", "x", True),
    ("runner", "x", True),
    ("runner", DELETE, True),
    ("runner.nope", 1, False),
    ("strategy.name", "random", True),
    ("strategy.adam.t", -1, True),
    ("strategy.adam.t", "x", True),
    ("strategy.rng", "x", True),
    ("strategy.rng.bit_generator", "MT19937", True),
    ("strategy.rng.state.state", -1, True),
    ("strategy.samples_seen", -1, True),
    ("strategy.samples_seen", "x", True),
    ("strategy.config.lr", -1, True),
    ("strategy.config", 3, True),
    ("strategy.start", "x", True),
    ("strategy.recent", "x", True),
    ("strategy.recent", [[1, 2]], True),
    ("strategy", DELETE, True),
    ("strategy", 3, True),
    ("strategy.logits", [[0.0]], True),
    ("strategy.logits", "x", True),
    ("curve", [], True),
    ("curve", "x", True),
    ("cache_reasons", "x", True),
    ("cache_reasons", [], True),
    ("cache_reasons", [3] * 30, True),
    ("cache_step", [], True),
    ("cache_keys", "x", True),
    ("meta", "x", True),
    ("meta.settings_checksum", "0" * 64, True),
    ("meta", {}, False),
    ("meta", DELETE, False),
    ("history_digest", "0" * 32, True),
    ("history_digest", 3, True),
    ("", [], True),
    ("", None, True),
    ("@arrays", "../x.npz", True),
    ("@arrays", 3, True),
    ("@version", 2, True),
    ("@format", "x", True),
    ("@body_sha256", "0" * 64, True),
]
NPZ = [
    (path, t)
    for path in (
        "strategy.logits",
        "strategy.adam.m",
        "runner.best_placement",
        "curve",
        "cache_keys",
        "cache_step",
        "cache_oom",
        "cache_overflow",
        "strategy.recent.0.0",
    )
    for t in ("shorter", "longer", "float", "str", "nan", "neg", "huge", "empty", "scalar")
] + [("runner.best_placement", "other"), ("cache_step", "zero"), ("cache_step", "inf")]
HISTORY = [  # (line, value): a dict is merged into the line, text replaces it
    (0, {"step_time_s": "x"}),
    (0, {"step_time_s": NAN}),
    (0, {"step_time_s": -1}),
    (3, {"sample": "x"}),
    (3, {"oom": "yes"}),
    (0, "[1, 2]"),
    (0, "3"),
    (0, '"x"'),
    (0, "{}"),
    (0, "null"),
    (2, '{"a": '),
    (0, {"step_time_s": 1e308}),
    (0, {"step_time_s": None}),
    (1, {"step_time_s": 1e-12}),
    (0, "\x00\x00"),
    (0, {"step_time_s": 10**400}),
    (5, ""),
]
TIMING_LINES = [
    (0, {"samples": "x"}),
    (0, {"time_s": NAN}),
    (0, "[]"),
    (1, {"samples": 10**30}),
    (0, {"time_s": -1}),
    (0, "{"),
    (0, {"time_s": 1e308}),
    (2, {"samples": 1}),
]
SUMMARY = [  # report reads it (resume does not)
    ("best_step_time_s", "x"),
    ("best_step_time_s", NAN),
    ("best_step_time_s", -1),
    ("best_step_time_s", None),
    ("candidates", "x"),
    ("candidates", {"a": "x"}),
    ("candidates", [1]),
    ("strategy", 3),
    ("strategy", None),
    ("samples", "x"),
    ("samples", -1),
    ("microbatch_counts", "x"),
    ("microbatch_counts", [99]),
    ("microbatch_counts", [1, "x"]),
    ("microbatch_counts", [2**70]),
    ("target_spec", "x"),
    ("target_spec", {"kind": "zoo", "name": 3}),
    ("target_spec", {"kind": "zoo", "name": "rnnlm", "size": "huge"}),
    ("target_spec", {"kind": "file", "path": 3}),
    ("cluster", 3),
    ("cluster", "nosuch"),
    ("cluster", None),
    ("plan", 3),
    ("seed", "x"),
    ("groups", "x"),
    ("groups", 0),
    ("groups", -1),
    ("groups", 10**12),
    ("config", 3),
    ("config", {"lr": "x"}),
    ("figures", "x"),
    ("microbatches", 0),
    ("microbatches", "x"),
    ("microbatches", 10**9),
    ("microbatches", -1),
    ("lower_bound_s", "x"),
    ("lower_bound_s", 0),
    ("single_device", 3),
    ("single_device_step_time_s", "x"),
    ("search_best_step_time_s", "x"),
    ("budget", 3),
    ("budget", None),
    ("wall_time_s", "x"),
    ("candidate_notes", 3),
    ("graph", 3),
    ("returned", 3),
    ("samples", 10**30),
    ("", []),
    ("", "x"),
    ("", None),
]
PLACEMENT_EDITS = [
    ("conv", "gpu9", True),
    ("conv", 3, True),
    ("nope", "gpu0", True),
    ("", {}, True),
    ("", [], True),
    ("conv", "gpu1", True),
    ("conv", DELETE, True),
    ("", None, True),
]
PLANS = [
    ("counts", [1], True),
    ("counts", [1, 2, 4], True),
    ("counts", "x", True),
    ("rounds", [[1, 2], [2]], False),
    ("rounds", [[1, 2], [1, 2]], True),
    ("rounds", [[2, 1], [1]], True),
    ("rounds", [[1, 2], [3]], True),
    ("rounds", [[1, 2], [1], [1]], True),
    ("rounds", "x", True),
    ("format", "x", True),
    ("rounds", [[1, 2]], False),
    ("rounds", [], False),
    ("rounds", [[1, 2.0], [1]], True),
    ("rounds", [[True, 2], [1]], True),
    ("", [], True),
]
AGNOSTIC = ["flip", "truncate", "delete", "garbage", "non-utf8", "empty", "nul"]


def _resume_case(template: str, edits: list[Edit], must: bool | str, what: str = "resume") -> Case:
    """``must``: True certainly invalid, False not certainly (undecided), or the expectation itself."""
    argv = list(RESUME) if what == "resume" else ["report", "run"]  # the cluster is the one run.json records
    label = "; ".join(e.label() for e in edits)
    expect = must if isinstance(must, str) else INVALID if must else UNDECIDED
    return Case(f"run folder: {what}", f"[{template}] {label}", argv, {}, expect, template=template, edits=edits)


def run_edit_pool() -> list[Case]:
    """Every run-folder case: a copy of a real run (``file``: a graph file at one micro-batch count;
    ``zoo``: the small RNNLM over m = 1, 2, with ``m1/``, ``m2/`` and ``plans.json``) with one file
    damaged, deleted or edited (checksums recomputed), then ``place --resume`` or ``report``."""
    pool: list[Case] = []
    ck = {"file": "", "zoo": "m2/"}
    for t in ("file", "zoo"):
        for path, value, must in RUN_JSON + (RUN_JSON_FILE if t == "file" else RUN_JSON_ZOO):
            pool.append(_resume_case(t, [Edit("run.json", "set", path, value)], must))
        pool.append(_resume_case(t, [Edit("run.json", "set", "seed", 3, recompute=False)], True))
        d = ck[t]
        for path, value, must in CHECKPOINT:
            pool.append(_resume_case(t, [Edit(f"{d}checkpoint.json", "set", path, value)], must))
        pool.append(_resume_case(t, [Edit(f"{d}checkpoint.json", "set", "runner.samples", 3, recompute=False)], True))
        for path, how in NPZ:  # new values of a float array's numbers (not NaN) may be any state's
            valid = (how in ("float", "neg", "huge") and path in ("strategy.logits", "strategy.adam.m")) or (
                how in ("float", "huge") and path == "cache_overflow"
            )
            pool.append(_resume_case(t, [Edit(f"{d}checkpoint.json", "npz", path, how)], not valid))
        for line, value in HISTORY:
            for what in ("resume", "report"):
                pool.append(_resume_case(t, [Edit(f"{d}history.jsonl", "line", line, value)], False, what))
        for line, value in TIMING_LINES:
            for what in ("resume", "report"):
                pool.append(_resume_case(t, [Edit(f"{d}timing.jsonl", "line", line, value)], False, what))
        for path, value in SUMMARY:
            pool.append(_resume_case(t, [Edit("summary.json", "set", path, value)], False, "report"))
        for path, value, must in PLACEMENT_EDITS:
            must = must and not (t == "zoo" and value == DELETE)  # the zoo graph has no 'conv': nothing deleted
            pool.append(_resume_case(t, [Edit("placement.json", "set", path, value)], must, "report"))
            pool.append(_resume_case(t, [Edit("placement.json", "set", path, value)], False))
        files = [
            "run.json",
            f"{d}checkpoint.json",
            f"{d}checkpoint-*.npz",  # a glob: the array file's name holds a checksum
            f"{d}history.jsonl",
            f"{d}timing.jsonl",
            "summary.json",
            "placement.json",
        ] + (["plans.json", "m1/checkpoint.json", "m1/history.jsonl"] if t == "zoo" else [])
        for f in files:
            for kind in AGNOSTIC:
                for what in (
                    ("resume", "report") if f in ("summary.json", "placement.json") or "jsonl" in f else ("resume",)
                ):
                    pool.append(_resume_case(t, [Edit(f, "agnostic", "", kind)], False, what))
            # a run stopped before it wrote the file (no checkpoint: killed before its first one, so it starts
            # over): certainly valid; m1's checkpoint gone while m2 ran is no state a stopped run is in
            stopped = f in (f"{d}timing.jsonl", "summary.json", "placement.json", f"{d}checkpoint.json")
            pool.append(_resume_case(t, [Edit(f, "delete")], VALID if stopped else f != "m1/checkpoint.json"))
            if f in ("summary.json", "placement.json", f"{d}history.jsonl", f"{d}timing.jsonl"):
                # report: a folder without timing.jsonl estimates the wall-time axis (the README's "Reports")
                must = VALID if f == f"{d}timing.jsonl" else f in ("summary.json", "placement.json")
                pool.append(_resume_case(t, [Edit(f, "delete")], must, "report"))
    for path, value, must in PLANS:
        pool.append(_resume_case("zoo", [Edit("plans.json", "set", path, value)], must))
    for path, value, must in CHECKPOINT[:14]:
        pool.append(_resume_case("zoo", [Edit("m1/checkpoint.json", "set", path, value)], must))
    pool += [
        _resume_case("zoo", [Edit("m2", "delete")], False),
        _resume_case("zoo", [Edit("m2/checkpoint-*.npz", "swap")], True),
        _resume_case("zoo", [Edit("m1", "delete"), Edit("m2", "delete")], False),
        _resume_case("zoo", [Edit("m2/history.jsonl", "line", 0, {"step_time_s": "x"})], False, "report"),
        _resume_case("file", [Edit("run.json", "raw", "", "{}")], True),
        _resume_case("file", [Edit("checkpoint.json", "raw", "", "[]")], True),
    ]
    return pool


def run_edit_cases(rng: random.Random, n: int) -> Iterator[Case]:
    """``n`` cases of :func:`run_edit_pool`, seeded, in proportion to each (template, command) stratum."""
    pool = run_edit_pool()
    if n >= len(pool):
        yield from pool
        return
    strata: dict[tuple, list[int]] = {}
    for k, c in enumerate(pool):
        strata.setdefault((c.template, c.category), []).append(k)
    picked = []
    for ks in strata.values():
        picked += rng.sample(ks, max(1, round(n * len(ks) / len(pool))))
    for k in sorted(picked):
        yield pool[k]
