"""The CLI as a new user meets it: JSON outputs, and one clear error line for each kind of bad input."""

import json
import subprocess
import sys

import pytest

from postplace.graph import OpGraph
from tests.clihelp import run_cli


def run(*args, cwd=None):
    """The CLI in this process (tests/clihelp.py); ``test_the_command_runs_as_its_own_process`` keeps one
    run through ``python -m postplace.cli`` and one through the installed ``postplace`` script."""
    return run_cli(*args, cwd=cwd)


@pytest.fixture
def graph_file(tmp_path):
    g = OpGraph.build(
        ["a", "b", "c"],
        [(0, 1, 1e6), (1, 2, 1e6)],
        flops=[1e9, 2e9, 1e9],
        bytes_accessed=[1e6] * 3,
        output_bytes=[1e6] * 3,
        persistent_bytes=[4e6, 0, 0],
        colocation=[0, -1, 0],
        name="tiny",
    )
    path = tmp_path / "tiny.json"
    g.save(path)
    return path


def test_the_command_runs_as_its_own_process(graph_file):
    from pathlib import Path

    script = Path(sys.executable).with_name("postplace")  # the entry point pip installed beside the interpreter
    for command in ([sys.executable, "-m", "postplace.cli"], [str(script)]):
        r = subprocess.run(
            [*command, "info", str(graph_file), "--cluster", "k80x2", "--json"], capture_output=True, text=True
        )
        assert r.returncode == 0, r.stderr
        assert json.loads(r.stdout)["ops"] == 3
        bad = subprocess.run([*command, "info", "no/such/graph.json"], capture_output=True, text=True)
        assert bad.returncode == 2 and bad.stderr.startswith("error: ") and len(bad.stderr.splitlines()) == 1


def test_info_json(graph_file):
    r = run("info", str(graph_file), "--cluster", "k80x2", "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert (out["ops"], out["edges"], out["total_flops"], out["persistent_bytes"]) == (3, 2, 4e9, 4e6)
    assert 0 < out["lower_bound_s"] <= out["total_time_s"]["gpu"]


def test_simulate_json_and_trace(graph_file, tmp_path):
    trace = tmp_path / "trace.json"
    r = run(
        "simulate", str(graph_file), "--cluster", "k80x2", "--placement", "single:gpu1", "--json", "--trace", str(trace)
    )
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["evaluator"] == "simulator" and out["oom"] is False
    assert out["step_time_s"] >= out["lower_bound_s"] > 0
    assert set(out["peak_memory_bytes"]) == {"cpu", "gpu0", "gpu1"} and out["peak_memory_bytes"]["gpu1"] > 4e6
    events = json.loads(trace.read_text())["traceEvents"]
    assert sorted(e["name"] for e in events if e["ph"] == "X") == ["a", "b", "c"]


def test_simulate_a_placement_file(graph_file, tmp_path):
    placement = tmp_path / "p.json"
    placement.write_text(json.dumps({"a": "gpu0", "b": "gpu1"}))  # c follows a through colocation
    r = run("simulate", str(graph_file), "-c", "k80x2", "-p", str(placement), "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["transfers"] == 2


def assert_one_error_line(r, *fragments):
    assert r.returncode != 0
    assert "Traceback" not in r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), r.stderr
    for f in fragments:
        assert f in lines[0]


def test_truncated_json(graph_file):
    graph_file.write_text(graph_file.read_text()[:-40])
    assert_one_error_line(run("info", str(graph_file)), "truncated", str(graph_file))


def test_cycle(tmp_path):
    d = OpGraph.build(["a", "b"], [(0, 1)]).to_dict()
    d["edges"] = {"src": [0, 1], "dst": [1, 0], "slot": [0, 0], "bytes": [0.0, 0.0]}
    (tmp_path / "c.json").write_text(json.dumps(d))
    assert_one_error_line(run("info", str(tmp_path / "c.json")), "cycle: a -> b -> a")


def test_missing_field(graph_file):
    d = json.loads(graph_file.read_text())
    del d["edges"]["bytes"]
    graph_file.write_text(json.dumps(d))
    assert_one_error_line(run("info", str(graph_file)), "missing field 'edges.bytes'")


def test_unknown_preset(graph_file):
    assert_one_error_line(run("simulate", str(graph_file), "-c", "k80x3", "-p", "single:gpu0"), "k80x2, k80x4")


def test_unknown_device_in_placement(graph_file, tmp_path):
    p = tmp_path / "p.json"
    p.write_text(json.dumps({"a": "gpu7", "b": "gpu0"}))
    assert_one_error_line(run("simulate", str(graph_file), "-c", "k80x2", "-p", str(p)), "no device 'gpu7'")
    assert_one_error_line(run("simulate", str(graph_file), "-c", "k80x2", "-p", "single:tpu0"), "no device 'tpu0'")


def test_placement_splitting_a_colocation_set(graph_file, tmp_path):
    p = tmp_path / "p.json"
    p.write_text(json.dumps({"a": "gpu0", "b": "gpu0", "c": "gpu1"}))
    assert_one_error_line(run("simulate", str(graph_file), "-c", "k80x2", "-p", str(p)), "splits a colocation set")


def test_missing_file():
    assert_one_error_line(run("info", "no/such/graph.json"), "no such file")


def test_place_json_and_resume(graph_file, tmp_path):
    out = tmp_path / "run"
    r = run("place", str(graph_file), "-c", "k80x2", "--budget", "96", "--seed", "3", "--out", str(out), "--json")
    assert r.returncode == 0, r.stderr
    s = json.loads(r.stdout)
    for key in (
        "best_step_time_s",
        "search_best_step_time_s",
        "single_device_step_time_s",
        "lower_bound_s",
        "samples",
        "strategy",
        "seed",
        "evaluator",
    ):
        assert key in s
    assert s["samples"] == 96 and s["evaluator"] == "simulator" and s["strategy"] == "post"
    # the answer is the optimum, found by every placement of the 3 ops (a and c colocated) on 3 devices
    import itertools

    import numpy as np

    from postplace.cluster import load_cluster
    from postplace.sim import Simulator

    g = OpGraph.load(graph_file)
    every = np.array([[x, y, x] for x, y in itertools.product(range(3), repeat=2)])
    res = Simulator(g, load_cluster("k80x2")).evaluate_ops(every)
    assert s["best_step_time_s"] == pytest.approx(float(np.min(np.where(res.feasible, res.step_time, np.inf))))
    # the answer is the fastest of every candidate (DESIGN.md 4c: search, single device, pipeline, placers)
    assert {"search", "single:gpu0", "pipeline", "m-etf", "metis"} <= set(s["candidates"])
    assert s["best_step_time_s"] == min(v for v in s["candidates"].values() if v is not None)
    assert s["candidates"][s["returned"]] == s["best_step_time_s"]
    placement = json.loads((out / "placement.json").read_text())
    assert set(placement) == {"a", "b", "c"}
    # the written placement is readable by `simulate` and gives the same step time
    r2 = run("simulate", str(graph_file), "-c", "k80x2", "-p", str(out / "placement.json"), "--json")
    assert json.loads(r2.stdout)["step_time_s"] == s["best_step_time_s"]
    assert len((out / "history.jsonl").read_text().splitlines()) == 96
    # a finished run resumed stays finished and says the same
    r3 = run("place", "--resume", str(out), "--json")
    assert r3.returncode == 0, r3.stderr
    assert json.loads(r3.stdout)["best_step_time_s"] == s["best_step_time_s"]
    # starting again into the same folder is refused with one line
    assert_one_error_line(run("place", str(graph_file), "-c", "k80x2", "--out", str(out)), "--resume")


def test_place_returns_a_placer_that_beats_the_search_and_the_single_device(tmp_path):
    """A fork a -> (b, c) -> d with two heavy branches on k80x2. With one sample the search has only
    probed one device, so the answer must come from a one-shot placer that puts b and c on the two GPUs
    (a wrong rule, such as the best of the search and the single device, returns the slower one)."""
    g = OpGraph.build(
        ["a", "b", "c", "d"],
        [(0, 1, 1e6), (0, 2, 1e6), (1, 3, 1e6), (2, 3, 1e6)],
        flops=[1e8, 2e10, 2e10, 1e8],
        output_bytes=[1e6] * 4,
        name="fork",
    )
    g.save(tmp_path / "fork.json")
    r = run(
        "place",
        str(tmp_path / "fork.json"),
        "-c",
        "k80x2",
        "--budget",
        "1",
        "--groups",
        "none",
        "--out",
        str(tmp_path / "run"),
        "--json",
    )
    assert r.returncode == 0, r.stderr
    s = json.loads(r.stdout)
    cands = s["candidates"]
    assert len(cands) > 2 and s["returned"] not in ("search", "single:gpu0")
    assert s["best_step_time_s"] == cands[s["returned"]] == min(v for v in cands.values() if v is not None)
    # K80 die: 2.8e12 FLOP/s, 10 us launch per op; gpu0 -> gpu1: 5 + 5 us latency, 15.75 GB/s (the preset)
    flop, launch = 2.8e12, 1e-5
    single = (1e8 + 2e10 + 2e10 + 1e8) / flop + 4 * launch
    # a and b on one GPU, c and d on the other: a, a's output sent, c, d (b and its send overlap c)
    split = (1e8 + 2e10 + 1e8) / flop + 3 * launch + (5e-6 + 5e-6 + 1e6 / 1.575e10)
    assert s["single_device_step_time_s"] == pytest.approx(single, rel=1e-12)
    assert s["best_step_time_s"] == pytest.approx(split, rel=1e-12)
    assert s["search_best_step_time_s"] > s["best_step_time_s"]  # the one-sample search did not find it


def test_place_bad_budget(graph_file, tmp_path):
    assert_one_error_line(run("place", str(graph_file), "--budget", "soon", "--out", str(tmp_path / "x")), "--budget")


def test_place_warm_start_is_sample_zero_and_said(graph_file, tmp_path):
    heft = tmp_path / "heft"
    r = run(
        "place",
        str(graph_file),
        "-c",
        "k80x2",
        "--budget",
        "48",
        "--out",
        str(heft),
        "--json",
        "--warm-start",
        "heft",
        "--groups",
        "none",
    )
    assert r.returncode == 0, r.stderr
    s = json.loads(r.stdout)
    assert s["warm_start"] == "heft"
    first = json.loads((heft / "history.jsonl").read_text().splitlines()[0])
    from postplace.cluster import load_cluster
    from postplace.graph import load_graph
    from postplace.placers import place
    from postplace.sim import Simulator

    g, c = load_graph(graph_file), load_cluster("k80x2")
    heft_time = Simulator(g, c).evaluate_ops(place("heft", g, c)[None]).step_time[0]
    assert first["step_time_s"] == heft_time  # the heuristic's placement was sample 0
    assert_one_error_line(
        run("place", str(graph_file), "-c", "k80x2", "--warm-start", "nope", "--out", str(tmp_path / "x")), "nope"
    )


def test_train_prints_measured_step_times(tmp_path):
    r = run(
        "train",
        "rnnlm",
        "--size",
        "small",
        "--placement",
        "single:gpu1",
        "--cluster",
        "k80x2",
        "--steps",
        "3",
        "--map-all-to",
        "cpu",
        "--threads",
        "1",
    )
    assert r.returncode == 0, r.stderr
    assert "measured step time: median" in r.stdout and "simulated step time on k80x2" in r.stdout
    rows = [line.split() for line in r.stdout.splitlines() if line.split()[:1] in (["1"], ["2"], ["3"])]
    assert len(rows) == 3 and all(float(x[2]) > 0 for x in rows)
    assert_one_error_line(run("train", "rnnlm", "--placement", "single:gpu1", "--steps", "0"), "--steps")


def test_place_flag_errors(graph_file, tmp_path):
    assert_one_error_line(run("place", str(graph_file), "--seed", "-1", "--out", str(tmp_path / "x")), "seed")
    assert_one_error_line(run("place", str(graph_file), "--set", "clip", "--out", str(tmp_path / "x")), "KEY=VALUE")


def test_place_table_and_json_say_which_placement_was_returned(tmp_path):
    from tests.test_api import graph30

    graph30().save(tmp_path / "g30.json")
    args = (
        "place",
        str(tmp_path / "g30.json"),
        "-c",
        "k80x2",
        "--strategy",
        "random",
        "--budget",
        "1",
        "--groups",
        "none",
    )
    table = run(*args, "--out", str(tmp_path / "t"))
    assert table.returncode == 0, table.stderr
    assert "returned placement (m-etf)" in table.stdout and "search best" in table.stdout
    as_json = json.loads(run(*args, "--out", str(tmp_path / "j"), "--json").stdout)
    assert as_json["returned"] == "m-etf" and as_json["search_best_step_time_s"] > as_json["best_step_time_s"]
    assert_one_error_line(run("place", "--resume", str(tmp_path / "j"), "--out", str(tmp_path / "k")), "drop --out")


def test_a_flag_typer_cannot_parse_is_one_error_line():
    for args, flag in (
        (["train", "gpt2", "--steps", "abc", "-p", "x"], "--steps"),
        (["place", "--nope"], "--nope"),
        (["simulate"], "target"),
    ):
        r = run(*args)
        assert r.returncode == 2, args
        lines = [x for x in r.stderr.splitlines() if x.strip()]
        assert len(lines) == 1 and lines[0].startswith("error: ") and flag in lines[0], r.stderr
    bare = run()
    assert bare.returncode == 2 and "Usage" in bare.stdout + bare.stderr  # no command: the help, as before
