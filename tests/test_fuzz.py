"""A small seeded subset of ``benchmarks/fuzz_cli.py``, in process: malformed graph, cluster and
placement files through the library readers and the simulator, and bad flags through the CLI's main.
Every case must end as one clean error line, or be accepted with a finite answer only when the input
may be valid. (The full run, with forks, timeouts and run folders, is the benchmark.)"""

import sys

import numpy as np
import pytest

from postplace.cli import main, parse_placement
from postplace.cluster import load_cluster
from postplace.errors import PostplaceError
from postplace.graph import load_graph
from postplace.sim import Simulator
from postplace.testing import fuzz

CASES = list(fuzz.cases(seed=7, per_kind=16, train=0, run_folder=0))
FILE_CASES = [c for c in CASES if c.category.endswith(" file")]
FLAG_CASES = [
    c for c in CASES if c.category == "flags" and c.argv[0] in ("simulate", "info") and "resnet50" not in c.argv
]


def test_the_subset_covers_every_kind_of_file_and_is_mostly_invalid():
    cats = {c.category for c in FILE_CASES}
    assert cats == {"graph file", "cluster file", "placement file"}
    assert len(FILE_CASES) == 48 and len(FLAG_CASES) >= 10
    assert sum(c.must_fail for c in FILE_CASES) >= 24


@pytest.mark.parametrize("case", FILE_CASES, ids=lambda c: f"{c.category}:{c.label}"[:60])
def test_malformed_files_are_clean_errors_through_the_library(case, tmp_path):
    for rel, data in case.files.items():
        (tmp_path / rel).write_bytes(data)
    try:
        g = load_graph(tmp_path / fuzz.GRAPH)
        c = load_cluster(tmp_path / fuzz.CLUSTER)
        dev = parse_placement(str(tmp_path / fuzz.PLACEMENT), g, c)
        sim = Simulator(g, c)
        sched = sim.schedule(dev)
    except PostplaceError as exc:
        assert "\n" not in str(exc)
        return
    assert not case.must_fail, f"accepted an invalid input: {case.label}"
    assert np.isfinite(sched.step_time) and sched.step_time >= sim.lower_bound > 0
    assert np.isfinite(sched.peak_memory).all()


@pytest.mark.parametrize("case", FLAG_CASES, ids=lambda c: c.label)
def test_bad_flags_exit_2_with_one_line(case, tmp_path, monkeypatch, capsys):
    for rel, data in case.files.items():
        (tmp_path / rel).write_bytes(data)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "argv", ["postplace", *case.argv])
    with pytest.raises(SystemExit) as ex:
        main()
        raise SystemExit(0)
    captured = capsys.readouterr()
    outcome = fuzz.classify(case, ex.value.code, captured.out, captured.err)
    assert outcome in (("clean", "usage") if case.must_fail else ("accepted",)), captured.err
