"""A small seeded subset of ``benchmarks/fuzz_cli.py``, in process: malformed graph, cluster and
placement files through the library readers and the simulator, and bad flags through the CLI's main.
Every case must end as one clean error line, or be accepted with a finite answer only when the input
may be valid; an input the documentation promises is valid must be accepted, and a ``simulate``
answer must fall within bounds the fuzz computes apart from the simulator. (The full run, with forks,
timeouts and run folders, is the benchmark.)"""

import json
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
    check = fuzz.simulate_check(case.files, case.argv if case.argv[0] == "simulate" else fuzz.SIMULATE_G)
    assert check is None or check(json.dumps({"step_time_s": sched.step_time})), case.label


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


VALID_CASES = [c for c in CASES if c.expect == fuzz.VALID and c.argv[0] in ("simulate", "info")]


def test_the_subset_has_valid_cases_of_each_file_kind():
    """Corrupted files that the documented rules still accept, and the files' own valid variants."""
    assert {c.category for c in VALID_CASES} >= {"flags", "cluster file"}
    assert len(VALID_CASES) >= 4


@pytest.mark.parametrize("case", VALID_CASES, ids=lambda c: f"{c.category}:{c.label}"[:60])
def test_a_valid_input_is_accepted_and_its_answer_checks_out(case, tmp_path, monkeypatch, capsys):
    """A certainly valid case (the documentation promises it is accepted) that is refused is a defect:
    ``refused-valid``; an accepted ``simulate`` must fall within the fuzz's own bounds."""
    for rel, data in case.files.items():
        (tmp_path / rel).write_bytes(data)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "argv", ["postplace", *case.argv])
    with pytest.raises(SystemExit) as ex:
        main()
        raise SystemExit(0)
    captured = capsys.readouterr()
    check = fuzz.simulate_check(case.files, case.argv)
    assert fuzz.classify(case, ex.value.code, captured.out, captured.err, check) == "accepted", captured.err


def test_classify_calls_a_clean_refusal_of_a_valid_input_refused_valid():
    err = "error: c.toml: device[0] field 'peak_flops' is 5e+11; it must be positive\n"
    usage = "Usage: postplace simulate [OPTIONS]\nError: Invalid value for '--placement'\n"
    for expect, want in ((fuzz.VALID, "refused-valid"), (fuzz.UNDECIDED, "clean"), (fuzz.INVALID, "clean")):
        case = fuzz.Case("cluster file", "flip", ["simulate"], expect=expect)
        assert fuzz.classify(case, 2, "", err) == want
        assert fuzz.classify(case, 2, "", usage) == ("refused-valid" if expect == fuzz.VALID else "usage")
    assert fuzz.classify(fuzz.Case("x", "y", ["simulate"], expect=fuzz.VALID), 0, '{"step_time_s": 1.0}', "") == (
        "accepted"
    )
    assert fuzz.classify(fuzz.Case("x", "y", ["simulate"]), 0, '{"step_time_s": 1.0}', "") == "accepted-wrong"


def test_the_documented_rules_decide_corrupted_files():
    """A byte-identical or still-valid file is valid, a file that is not JSON/TOML or breaks a stated
    rule is invalid, a changed key is undecided: judged by json/tomllib, not by postplace's readers."""
    good = _good()
    argv = fuzz.SIMULATE_G

    def judged(name, old, new):
        assert old in good[name]
        return fuzz.expect_files({**good, name: good[name].replace(old, new, 1)}, argv)[0]

    assert fuzz.expect_files(good, argv)[0] == fuzz.VALID
    assert judged(fuzz.GRAPH, b"2000000000.0", b"2000000001.0") == fuzz.VALID  # a flipped digit of FLOPs
    assert judged(fuzz.GRAPH, b'"convolution"', b'"convolutioo"') == fuzz.VALID  # an op type is free text
    assert judged(fuzz.GRAPH, b'"conv"', b'"conw"') == fuzz.INVALID  # the placement names 'conv'
    assert judged(fuzz.GRAPH, b'"conv_bw"', b'"conv_bg"') == fuzz.VALID  # the placement leaves it out
    assert judged(fuzz.GRAPH, b"2000000000.0", b"NaN") == fuzz.INVALID
    assert judged(fuzz.GRAPH, b'"metadata": {}', b'"metadatb": {}') == fuzz.UNDECIDED
    assert judged(fuzz.CLUSTER, b'kind = "gpu"', b'kind = "cpu"') == fuzz.VALID  # all ops may run on a CPU
    assert judged(fuzz.CLUSTER, b'kind = "cpu"', b'kind = "gpu"') == fuzz.INVALID  # input:0 is CPU-only
    assert judged(fuzz.CLUSTER, b"memory = 12000000000.0", b"memory = 1200000.0") == fuzz.INVALID  # < reserve
    assert judged(fuzz.CLUSTER, b'model = "G"', b'model = "F"') == fuzz.VALID
    assert judged(fuzz.PLACEMENT, b'"loss": "gpu1"', b'"loss": "gpu0"') == fuzz.VALID
    assert judged(fuzz.PLACEMENT, b'"conv": "gpu0"', b'"conv": "gpu2"') == fuzz.INVALID
    assert judged(fuzz.PLACEMENT, b'"input:0": "cpu"', b'"input:0": "gpu1"') == fuzz.INVALID
    assert fuzz.expect_files({**good, fuzz.PLACEMENT: b"{"}, argv)[0] == fuzz.INVALID


def test_the_independent_bounds_hold_the_simulator_and_catch_a_wrong_step_time():
    """simulate single:cpu puts every op on the CPU: its step time is the sum of the op times the fuzz
    prices itself; the placement file's step time lies within the fuzz's bounds; a time 1% off is caught."""
    good = _good()
    g, c = fuzz.base_graph(), load_cluster_text(fuzz.base_cluster_toml())
    for spec in ("single:cpu", "single:gpu0", fuzz.PLACEMENT):
        argv = ["simulate", fuzz.GRAPH, "--cluster", fuzz.CLUSTER, "--placement", spec, "--json"]
        check = fuzz.simulate_check(good, argv)
        dev = parse_placement(spec if spec.startswith("single:") else _write(good, spec), g, c)
        st = Simulator(g, c).schedule(dev).step_time
        assert check(json.dumps({"step_time_s": st})), spec
        assert not check(json.dumps({"step_time_s": st * 1.01})) or spec != "single:cpu"
        assert not check(json.dumps({"step_time_s": st * 0.99})), spec


def _good():
    return {
        fuzz.GRAPH: json.dumps(fuzz.base_graph().to_dict()).encode(),
        fuzz.CLUSTER: fuzz.base_cluster_toml().encode(),
        fuzz.PLACEMENT: json.dumps(fuzz.base_placement()).encode(),
    }


def load_cluster_text(text):
    from postplace.cluster.cluster import Cluster

    return Cluster.from_toml_text(text)


def _write(files, name):
    import tempfile
    from pathlib import Path

    p = Path(tempfile.mkdtemp()) / name
    p.write_bytes(files[name])
    return str(p)
