"""Reports: the data of a real place run and a real compare run, their figures and their page.

The page must open offline (no network reference at all), hold every figure, and every PNG beside it
must be a valid image of the size recorded; the report's numbers must be the run's own numbers.
"""

import json
import re
import subprocess
import sys
from dataclasses import replace

import numpy as np
import pytest

from postplace.cluster import load_cluster
from postplace.comparison import compare
from postplace.errors import PostplaceError
from postplace.graph import OpGraph
from postplace.paper import PaperConfig, format_table, headline, reduction, run_paper
from postplace.report import build_report_data, write_report
from postplace.sim import Simulator
from postplace.sim.trace import memory_over_time

FIGURES = ("curves_samples", "curves_wall", "bars", "gantt", "memory_peak", "memory_time", "placement_map")


def two_layer_graph() -> OpGraph:
    """A two-layer training step with parameters, their updates colocated, and every phase."""
    names = ["param:l0.w", "param:l1.w", "x", "mm0", "relu0", "mm1", "loss", "g_mm1", "g_relu0", "g_mm0",
             "upd0", "upd1"]  # fmt: skip
    ix = {n: i for i, n in enumerate(names)}
    pairs = [("x", "mm0"), ("param:l0.w", "mm0"), ("mm0", "relu0"), ("relu0", "mm1"), ("param:l1.w", "mm1"),
             ("mm1", "loss"), ("loss", "g_mm1"), ("relu0", "g_mm1"), ("param:l1.w", "g_mm1"), ("g_mm1", "g_relu0"),
             ("mm0", "g_relu0"), ("g_relu0", "g_mm0"), ("x", "g_mm0"), ("g_mm0", "upd0"), ("param:l0.w", "upd0"),
             ("g_mm1", "upd1"), ("param:l1.w", "upd1")]  # fmt: skip
    edges = [(ix[a], ix[b], 2e6) for a, b in pairs]
    flops = [0, 0, 0, 4e9, 1e8, 4e9, 1e8, 8e9, 1e8, 8e9, 1e8, 1e8]
    phase = ["other"] * 3 + ["forward"] * 4 + ["backward"] * 3 + ["update"] * 2
    colocation = [0, 1, -1, -1, -1, -1, -1, -1, -1, -1, 0, 1]
    return OpGraph.build(names, edges, flops=flops, bytes_accessed=[4e6] * 12, output_bytes=[2e6] * 12,
                         persistent_bytes=[4e6, 4e6] + [0] * 10, colocation=colocation, phase=phase,
                         name="two-layer")  # fmt: skip


@pytest.fixture
def graph_file(tmp_path):
    path = tmp_path / "two_layer.json"
    two_layer_graph().save(path)
    return path


def check_page(folder, html_path, data):
    """The page is offline, holds every figure embedded, and every PNG is what report.json says."""
    from PIL import Image

    page = html_path.read_text()
    assert not re.search(r"""(src|href)\s*=\s*["']?\s*(https?:)?//""", page, re.I)
    assert "<script" not in page.lower() and "<link" not in page.lower() and "@import" not in page
    assert "http://" not in page and "https://" not in page
    assert set(data["figures"]) >= set(FIGURES)
    for name in FIGURES:
        fig = data["figures"][name]
        assert f'id="fig-{name}"' in page
        with Image.open(folder / fig["file"]) as im:
            im.verify()
        with Image.open(folder / fig["file"]) as im:
            assert im.format == "PNG" and im.size == (fig["width_px"], fig["height_px"])
            assert im.size[0] >= 600 and im.size[1] >= 250
    assert page.count("data:image/png;base64,") == len(FIGURES)
    trace = json.loads((folder / "trace.json").read_text())
    ops = [e for e in trace["traceEvents"] if e["ph"] == "X" and e.get("cat") != "transfer"]
    assert len(ops) == len(data["schedule"]["ops"]["device"])


def test_place_report(graph_file, tmp_path):
    run = tmp_path / "run"
    r = subprocess.run([sys.executable, "-m", "postplace.cli", "place", str(graph_file), "--cluster", "k80x2",
                        "--budget", "60", "--out", str(run), "--json"], capture_output=True, text=True)  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert f"report: {run / 'report.html'}" in r.stderr  # place writes it by default
    summary = json.loads((run / "summary.json").read_text())
    out = write_report(run, graph=str(graph_file))
    assert out == run / "report.html"
    data = json.loads((run / "report.json").read_text())
    check_page(run, out, data)
    # the report's numbers are the run's
    for key in ("best_step_time_s", "search_best_step_time_s", "single_device_step_time_s", "lower_bound_s"):
        assert data["numbers"][key] == summary[key]
    assert data["bars"][0]["best_s"] == summary["best_step_time_s"]
    assert data["lines"] == {"single_device_s": summary["single_device_step_time_s"],
                             "lower_bound_s": summary["lower_bound_s"]}  # fmt: skip
    # the schedule is the returned placement simulated again: same step time and peaks as the summary
    assert data["schedule"]["step_time_s"] == pytest.approx(summary["best_step_time_s"], rel=1e-12)
    assert data["memory"]["peak_bytes"] == pytest.approx([summary["peak_memory_bytes"][d] for d in
                                                          data["memory"]["devices"]], rel=1e-12)  # fmt: skip
    curve = data["curves"][0]
    assert curve["strategy"] == "post" and curve["x_samples"][-1] == summary["samples"] == 60
    if summary["returned"] == "search":
        assert curve["median_s"][-1] == summary["search_best_step_time_s"]
    history = [json.loads(x) for x in (run / "history.jsonl").read_text().splitlines()]
    feasible = [h["step_time_s"] for h in history if not (h["oom"] or h["failed"])]
    assert curve["median_s"][-1] == min(feasible)  # best so far after the last sample
    assert all(a >= b for a, b in zip(curve["median_s"], curve["median_s"][1:], strict=False))
    # against wall time: each sample at its batch's line in timing.jsonl, the last at the run's last batch
    timing = [json.loads(x) for x in (run / "timing.jsonl").read_text().splitlines()]
    assert curve["wall_source"] == "recorded per sample" and timing[-1]["samples"] == 60
    assert curve["per_seed"][0]["wall_s"][-1] == timing[-1]["time_s"]
    assert all(a <= b for a, b in zip(curve["per_seed"][0]["wall_s"], curve["per_seed"][0]["wall_s"][1:], strict=False))
    # the placement map counts every op once, parameters and their updates in the layer of the parameter
    pm = data["placement_map"]
    assert sum(sum(c.values()) for m in pm["modules"] for c in m["counts"].values()) == 12
    assert {m["module"] for m in pm["modules"]} == {"l0", "l1"}
    assert data["provenance"]["evaluator"] == "simulator" and data["provenance"]["budget"] == "60 samples"
    assert data["provenance"]["versions"]["postplace"]


def test_compare_report(tmp_path):
    g, c = two_layer_graph(), load_cluster("k80x2")
    names = ["single", "metis", "data-parallel", "random", "post"]
    rep = compare(g, c, names, budget=48, seeds=2, out=tmp_path)
    out = write_report(tmp_path, tmp_path / "html" / "index.html", graph=g)
    folder = out.parent
    data = json.loads((folder / "report.json").read_text())
    check_page(folder, out, data)
    rows = {r["strategy"]: r for r in rep["rows"]}
    assert [b["label"] for b in data["bars"]] == names
    for b in data["bars"]:
        assert b["best_s"] == rows[b["label"]]["best_step_time_s"]
    assert {b["label"]: b["kind"] for b in data["bars"]}["data-parallel"] == "data-parallel"
    assert {b["label"]: b["kind"] for b in data["bars"]}["metis"] == "placer"
    curves = {cv["strategy"]: cv for cv in data["curves"]}
    assert set(curves) == {"random", "post"}
    for name, cv in curves.items():
        assert cv["seeds"] == [0, 1] and len(cv["per_seed"]) == 2
        assert cv["median_s"][-1] == pytest.approx(rows[name]["best_step_time_s"], rel=1e-12)
        assert (cv["min_s"][-1], cv["max_s"][-1]) == (rows[name]["min_step_time_s"], rows[name]["max_step_time_s"])
    assert data["lines"]["lower_bound_s"] == rep["lower_bound_s"]
    # the schedule drawn is the best placement of the comparison (search or placer), never a worse one
    best = min(r["min_step_time_s"] for r in rep["rows"] if r["kind"] in ("search", "placer")
               and r["min_step_time_s"] is not None and not r["oom_count"])  # fmt: skip
    assert data["schedule"]["step_time_s"] == pytest.approx(best, rel=1e-12)


def test_memory_over_time_peaks_and_sums():
    """The timeline's maximum is the simulator's peak on every device, for several placements; it starts
    at the persistent bytes and, every activation freed, ends there."""
    g, c = two_layer_graph(), load_cluster("k80x2")
    sim = Simulator(g, c)
    rng = np.random.default_rng(1)
    for _ in range(6):
        dev = rng.integers(1, 3, g.num_ops)
        dev[10], dev[11] = dev[0], dev[1]  # colocation: updates with their parameters
        sched = sim.schedule(dev)
        lines = memory_over_time(sim.problem, sched.device)
        for d, (t, v) in enumerate(lines):
            assert v.max() == pytest.approx(sched.peak_memory[d], rel=1e-12)
            resident = 4e6 * (int(dev[0] == d) + int(dev[1] == d))
            assert v[0] == resident and v[-1] == pytest.approx(resident)
            assert np.all(np.diff(t) >= 0) and t[-1] == pytest.approx(sched.step_time)


def test_schedule_lanes_carry_every_transfer():
    """Each transfer appears on its sender's egress lane and its receiver's ingress lane."""
    g, c = two_layer_graph(), load_cluster("k80x2")
    from postplace.report._data import schedule_info

    dev = np.array([1, 2, 0, 1, 1, 2, 2, 2, 1, 1, 1, 2])
    sched_info, _, sched = schedule_info(g, c, dev, "test")
    lanes = {lane["name"]: lane["intervals"] for lane in sched_info["link_lanes"]}
    for _, _, a, b, _, start, end in sched.transfers:
        for lane in (f"{c.device_names[a]} egress", f"{c.device_names[b]} ingress"):
            assert [start, end] in [iv[:2] for iv in lanes[lane]]
    assert sum(len(v) for k, v in lanes.items() if k.endswith("egress")) == len(sched.transfers)


def test_report_errors_are_one_line(tmp_path):
    r = subprocess.run([sys.executable, "-m", "postplace.cli", "report", str(tmp_path)], capture_output=True,
                       text=True)  # fmt: skip
    assert r.returncode == 2 and r.stderr.startswith("error: ") and len(r.stderr.strip().splitlines()) == 1
    (tmp_path / "summary.json").write_text(json.dumps({"graph": "mystery", "cluster": "k80x2"}))
    with pytest.raises(PostplaceError, match="--graph"):
        build_report_data(tmp_path)


def test_headline_reductions_by_hand():
    rep = {"single_device_step_time_s": 2.0, "rows": [
        {"strategy": "post", "best_step_time_s": 1.0, "oom_count": 0},
        {"strategy": "hp", "best_step_time_s": 4.0, "oom_count": 0},
        {"strategy": "reinforce", "best_step_time_s": 1.25, "oom_count": 0},
        {"strategy": "metis", "best_step_time_s": 0.5, "oom_count": 1},  # OOM: not the best heuristic
        {"strategy": "heft", "best_step_time_s": 1.6, "oom_count": 0},
        {"strategy": "data-parallel", "best_step_time_s": 0.8, "oom_count": 0},
    ]}  # fmt: skip
    h = headline(rep, "m", "k80x2")
    assert h.reduction["hp"] == 1 - 1 / 4 and h.reduction["reinforce"] == pytest.approx(0.2)
    assert h.rival_s["best heuristic"] == 1.6 and h.reduction["single"] == 0.5
    assert h.reduction["data-parallel"] == pytest.approx(-0.25)
    assert "ppo" not in h.reduction and reduction(None, 1.0) is None


def test_paper_runs_resumes_and_reports(tmp_path, monkeypatch):
    """The whole experiment on a stand-in zoo: staged, resumable (a second call searches nothing)."""
    import postplace.zoo as zoo

    monkeypatch.setattr(zoo, "cached_graph", lambda name, size="full", optimizer="sgd": two_layer_graph())
    cfg = replace(PaperConfig.quick(), models=("two",), clusters=("k80x2",), budget=24, hp_budget=8,
                  strategies=("single", "metis", "data-parallel", "reinforce", "post", "hp"))  # fmt: skip
    seen = []
    data = run_paper(tmp_path, cfg, progress=lambda what, done, total: seen.append((done, total)))
    assert seen[-1][0] == pytest.approx(seen[-1][1]) and all(a[0] <= b[0] for a, b in zip(seen, seen[1:], strict=False))
    pair = json.loads((tmp_path / "two-k80x2" / "compare.json").read_text())
    rows = {r["strategy"]: r for r in pair["rows"]}
    assert set(rows) == set(cfg.strategies)
    assert json.loads((tmp_path / "two-k80x2" / "runs" / "hp" / "seed0" / "result.json").read_text())["samples"] == 8
    h = data["headline"][0]
    assert h["reduction"]["hp"] == reduction(rows["post"]["best_step_time_s"], rows["hp"]["best_step_time_s"])
    assert "vs hp" in format_table(data)
    mtime = (tmp_path / "two-k80x2" / "runs" / "post" / "seed0" / "result.json").stat().st_mtime_ns
    again = run_paper(tmp_path, cfg)
    assert again["headline"] == data["headline"]
    assert (tmp_path / "two-k80x2" / "runs" / "post" / "seed0" / "result.json").stat().st_mtime_ns == mtime
    # fewer planner seeds than the rest: its row merged in, with its own seed count
    fewer = run_paper(tmp_path, replace(cfg, seeds=2, hp_seeds=1))
    pair = json.loads((tmp_path / "two-k80x2" / "compare.json").read_text())
    rows = {r["strategy"]: r for r in pair["rows"]}
    assert [r["strategy"] for r in pair["rows"]] == list(cfg.strategies)
    assert (rows["hp"]["seeds"], rows["post"]["seeds"], pair["hp_seeds"]) == (1, 2, 1)
    assert fewer["config"]["planner_seeds"] == 1 and "x 1 seeds" in format_table(fewer)
    # collecting searches nothing and leaves out what did not finish
    import shutil

    shutil.rmtree(tmp_path / "two-k80x2" / "runs" / "reinforce" / "seed1")
    shutil.rmtree(tmp_path / "two-k80x2" / "runs" / "hp" / "seed0")
    got = run_paper(tmp_path, replace(cfg, seeds=2), collect=True)
    assert got["missing"] == {"two-k80x2": ["reinforce", "hp"]}
    assert not (tmp_path / "two-k80x2" / "runs" / "reinforce" / "seed1").exists()
    assert "left out: reinforce, hp" in format_table(got)
    page = write_report(tmp_path)
    assert page.exists() and (tmp_path / "two-k80x2" / "report.html").exists()
    assert "two-k80x2/report.html" in page.read_text() and "https://" not in page.read_text()
