"""Seeded malformed inputs for the CLI and the library, and a judge of what each one produced.

:func:`cases` yields :class:`Case` objects: a category, a label, the files to write into a fresh
folder, the ``postplace`` arguments to run (paths relative to that folder) and what the documentation
promises (``expect``): certainly invalid (accepting it is a wrong answer), certainly valid (refusing
it is a defect) or undecided. The jobs live in their own modules, all re-exported here:

* :mod:`~postplace.testing.fuzz_inputs`: :class:`Case`, the valid base inputs, format-agnostic
  corruptions of bytes (flipped bytes, truncation, a deleted span, garbage, non-UTF-8, empty);
* :mod:`~postplace.testing.fuzz_expect`: what the documented file rules say of a corrupted file, read
  with ``json``/``tomllib`` (so a corruption that leaves a valid file is a valid case);
* :mod:`~postplace.testing.fuzz_files`: structured mutations of the graph, cluster and placement files;
  placement files for ``train``; corrupted run folders;
* :mod:`~postplace.testing.fuzz_flags`: bad flags of every command, and the flag families added since;
* :mod:`~postplace.testing.fuzz_config`: dnn-partitioning workload files and ``--set``/``--config`` values;
* :mod:`~postplace.testing.fuzz_runs` and :mod:`~postplace.testing.fuzz_edits`: run folders edited file
  by file with their checksums recomputed, through ``place --resume`` and ``report``;
* :mod:`~postplace.testing.fuzz_judge`: :func:`classify`, one outcome of :data:`OUTCOMES`
  (``refused-valid`` for a valid input refused);
* :mod:`~postplace.testing.fuzz_oracle`: bounds on an accepted step time computed apart from the simulator.

``benchmarks/fuzz_cli.py`` runs them all; ``tests/test_fuzz.py`` a small seeded subset in process.
"""

from __future__ import annotations

import random
from collections.abc import Iterator

from postplace.testing.fuzz_config import WORKLOAD_MUTATIONS, config_cases, workload_cases
from postplace.testing.fuzz_edits import Edit, apply_edit, dumps_json, set_path, walk_path
from postplace.testing.fuzz_expect import expect_files
from postplace.testing.fuzz_files import (
    BAD_INTS,
    BAD_NUMBERS,
    GRAPH_FLOAT_FIELDS,
    cluster_mutation,
    file_cases,
    graph_mutation,
    placement_mutation,
    run_folder_cases,
    train_cases,
)
from postplace.testing.fuzz_flags import (
    COMPARE_Z,
    FLAG_CASES,
    GRAPH_Z,
    PLACE_G,
    PLACE_Z,
    PLACE_Z1,
    SIMULATE_G,
    SIMULATE_Z,
    TRAIN_Z,
    ZOO,
    flag_cases,
    flag_family_cases,
)
from postplace.testing.fuzz_inputs import (
    BIG,
    CLUSTER,
    CLUSTER_DOC,
    DELETE,
    GRAPH,
    HUGE,
    INF,
    INVALID,
    NAN,
    PLACEMENT,
    UNDECIDED,
    VALID,
    WORKLOAD,
    Case,
    agnostic_corruption,
    base_cluster_toml,
    base_graph,
    base_placement,
    base_workload,
    corrupt_run_file,
    expect_of,
    json_bytes,
)
from postplace.testing.fuzz_judge import OUTCOMES, classify
from postplace.testing.fuzz_oracle import place_check, placement_bounds, simulate_check
from postplace.testing.fuzz_runs import RESUME, run_edit_cases, run_edit_pool

__all__ = [
    "BAD_INTS",
    "BAD_NUMBERS",
    "BIG",
    "CLUSTER",
    "CLUSTER_DOC",
    "COMPARE_Z",
    "DELETE",
    "FLAG_CASES",
    "GRAPH",
    "GRAPH_FLOAT_FIELDS",
    "GRAPH_Z",
    "HUGE",
    "INF",
    "INVALID",
    "NAN",
    "OUTCOMES",
    "PLACEMENT",
    "PLACE_G",
    "PLACE_Z",
    "PLACE_Z1",
    "RESUME",
    "SIMULATE_G",
    "SIMULATE_Z",
    "TRAIN_Z",
    "UNDECIDED",
    "VALID",
    "WORKLOAD",
    "WORKLOAD_MUTATIONS",
    "ZOO",
    "Case",
    "Edit",
    "agnostic_corruption",
    "cluster_mutation",
    "dumps_json",
    "graph_mutation",
    "json_bytes",
    "placement_mutation",
    "set_path",
    "walk_path",
    "apply_edit",
    "base_cluster_toml",
    "base_graph",
    "base_placement",
    "base_workload",
    "cases",
    "classify",
    "config_cases",
    "corrupt_run_file",
    "expect_files",
    "expect_of",
    "flag_family_cases",
    "place_check",
    "placement_bounds",
    "run_edit_cases",
    "run_edit_pool",
    "simulate_check",
    "workload_cases",
]


def cases(
    seed: int = 0,
    *,
    per_kind: int = 300,
    train: int = 15,
    run_folder: int = 60,
    workload: int = 0,
    flags: bool = False,
    run_edits: int = 0,
    config: int = 0,
) -> Iterator[Case]:
    """Every fuzz case, in a fixed order for one ``seed``: ``per_kind`` each of graph, cluster and
    placement files (half structured, half format-agnostic), the flag cases, ``train`` placement
    files for ``postplace train`` and ``run_folder`` corrupted run folders; then the families added
    since (all off by default): ``workload`` dnn-partitioning workload files, ``flags`` the flag
    families (``--microbatches``, ``--confirm``, ``--ray``, ``--optimizer``/``--lr``/``--precision``,
    ``--cluster workload:``, ``--resume`` with flags), ``config`` ``--set``/``--config`` values and
    ``run_edits`` run folders damaged file by file or edited with their checksums recomputed, for
    ``place --resume`` and ``report`` (:func:`run_edit_cases`)."""
    rng = random.Random(seed)
    yield from file_cases(rng, per_kind)
    yield from flag_cases()
    yield from train_cases(rng, train)
    yield from run_folder_cases(rng, run_folder)
    if workload:
        yield from workload_cases(rng, workload)
    if flags:
        yield from flag_family_cases()
    if config:
        yield from config_cases(rng, config)
    if run_edits:
        yield from run_edit_cases(rng, run_edits)
