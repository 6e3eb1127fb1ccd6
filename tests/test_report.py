"""Reports: the data of a real place run and a real compare run, their figures and their page.

The page must open offline (no network reference at all), hold every figure, and every PNG beside it
must be a valid image of the size recorded; the report's numbers must be the run's own numbers.
"""

import json
import re
from dataclasses import replace
from html.parser import HTMLParser

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
from tests.clihelp import run_cli

FIGURES = ("curves_samples", "curves_wall", "bars", "gantt", "memory_peak", "memory_time", "placement_map")


def two_layer_graph() -> OpGraph:
    """A two-layer training step with parameters, their updates colocated, and every phase."""
    names = [
        "param:l0.w",
        "param:l1.w",
        "x",
        "mm0",
        "relu0",
        "mm1",
        "loss",
        "g_mm1",
        "g_relu0",
        "g_mm0",
        "upd0",
        "upd1",
    ]
    ix = {n: i for i, n in enumerate(names)}
    pairs = [
        ("x", "mm0"),
        ("param:l0.w", "mm0"),
        ("mm0", "relu0"),
        ("relu0", "mm1"),
        ("param:l1.w", "mm1"),
        ("mm1", "loss"),
        ("loss", "g_mm1"),
        ("relu0", "g_mm1"),
        ("param:l1.w", "g_mm1"),
        ("g_mm1", "g_relu0"),
        ("mm0", "g_relu0"),
        ("g_relu0", "g_mm0"),
        ("x", "g_mm0"),
        ("g_mm0", "upd0"),
        ("param:l0.w", "upd0"),
        ("g_mm1", "upd1"),
        ("param:l1.w", "upd1"),
    ]
    edges = [(ix[a], ix[b], 2e6) for a, b in pairs]
    flops = [0, 0, 0, 4e9, 1e8, 4e9, 1e8, 8e9, 1e8, 8e9, 1e8, 1e8]
    phase = ["other"] * 3 + ["forward"] * 4 + ["backward"] * 3 + ["update"] * 2
    colocation = [0, 1, -1, -1, -1, -1, -1, -1, -1, -1, 0, 1]
    return OpGraph.build(
        names,
        edges,
        flops=flops,
        bytes_accessed=[4e6] * 12,
        output_bytes=[2e6] * 12,
        persistent_bytes=[4e6, 4e6] + [0] * 10,
        colocation=colocation,
        phase=phase,
        name="two-layer",
    )


@pytest.fixture
def graph_file(tmp_path):
    path = tmp_path / "two_layer.json"
    two_layer_graph().save(path)
    return path


class _Tables(HTMLParser):
    """Every table of a page: rows of ``[tag, text, holds a nested table]`` cells; a nested table is a
    table of its own."""

    def __init__(self):
        super().__init__()
        self.tables, self.stack = [], []

    def handle_starttag(self, tag, attrs):
        if tag == "table":
            if self.stack and self.stack[-1]["rows"] and self.stack[-1]["rows"][-1]:
                self.stack[-1]["rows"][-1][-1][2] = True
            t = {"rows": [], "nested": bool(self.stack)}
            self.stack.append(t)
            self.tables.append(t)
        elif tag == "tr" and self.stack:
            self.stack[-1]["rows"].append([])
        elif tag in ("th", "td") and self.stack:
            self.stack[-1]["rows"][-1].append([tag, "", False])

    def handle_endtag(self, tag):
        if tag == "table":
            self.stack.pop()

    def handle_data(self, data):
        if self.stack and self.stack[-1]["rows"] and self.stack[-1]["rows"][-1]:
            self.stack[-1]["rows"][-1][-1][1] += data


def page_tables(page: str) -> list[dict]:
    p = _Tables()
    p.feed(page)
    return p.tables


def table_text(t: dict) -> list[list[str]]:
    return [[c[1].strip() for c in row] for row in t["rows"]]


def check_tables(page: str) -> None:
    """Every column of every table has a header and a value in at least one row; every key of a
    key-value table has a value."""
    for t in page_tables(page):
        rows = t["rows"]
        assert rows
        if len(rows[0]) > 1 and all(c[0] == "th" for c in rows[0]):  # a header row
            for j, head in enumerate(rows[0]):
                assert head[1].strip(), f"a column without a header: {table_text(t)[:3]}"
                assert any(len(r) > j and (r[j][1].strip() or r[j][2]) for r in rows[1:]), (
                    f"column '{head[1]}' is empty: {table_text(t)}"
                )
        else:  # key: value rows
            for r in rows:
                assert [c[0] for c in r] == ["th", "td"] and r[0][1].strip() and (r[1][1].strip() or r[1][2]), r


def step_table(page: str) -> list[list[str]]:
    return next(table_text(t) for t in page_tables(page) if table_text(t)[0][:2] == ["strategy", "kind"])


def visible_text(page: str) -> str:
    """The page without its embedded images (base64 can spell any word)."""
    return re.sub(r"data:image/png;base64,[A-Za-z0-9+/=]+", "", page)


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
    check_tables(page)
    trace = json.loads((folder / "trace.json").read_text())
    ops = [e for e in trace["traceEvents"] if e["ph"] == "X" and e.get("cat") != "transfer"]
    assert len(ops) == len(data["schedule"]["ops"]["device"])


def test_place_report(graph_file, tmp_path):
    run = tmp_path / "run"
    r = run_cli("place", str(graph_file), "--cluster", "k80x2", "--budget", "60", "--out", str(run), "--json")
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
    assert data["lines"] == {
        "single_device_s": summary["single_device_step_time_s"],
        "lower_bound_s": summary["lower_bound_s"],
    }
    # the schedule is the returned placement simulated again: same step time and peaks as the summary
    assert data["schedule"]["step_time_s"] == pytest.approx(summary["best_step_time_s"], rel=1e-12)
    assert data["memory"]["peak_bytes"] == pytest.approx(
        [summary["peak_memory_bytes"][d] for d in data["memory"]["devices"]], rel=1e-12
    )
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
    # issue 22 item 5: every candidate the CLI table and summary.json show is in the report, once each
    page = out.read_text()
    assert [c["key"] for c in data["candidates"]] == list(summary["candidates"])
    rows = step_table(page)
    labels = [r[0] for r in rows[1:]]
    for key, v in summary["candidates"].items():
        if key != "search":  # the search's own row is "post search best"
            assert labels.count(key) == 1, (key, labels)
            assert rows[1 + labels.index(key)][2] == ("-" if v is None else f"{v * 1e3:.3f}")
    assert {"m-topo", "m-etf", "m-sct", "metis", "expert", "pipeline"} <= set(labels)
    assert sum(cell.count("single device") for r in rows for cell in r) == 1  # not twice
    assert len(labels) == len(set(labels))
    # one seed: no "median" anywhere a person reads, nor a min-max range of one value
    text = visible_text(page)
    assert "median" not in text.lower() and "range" not in rows[0]
    from postplace.report._png import bar_legend_labels, curve_label

    assert not any("median" in x for x in bar_legend_labels(data) + [curve_label(c) for c in data["curves"]])
    assert "search (best of 1 seed)" in bar_legend_labels(data)
    # provenance: a table of readable values, the wall time to 3 significant digits, no raw JSON
    wall = summary["wall_time_s"]
    assert repr(wall) not in page and '{"' not in text
    prov = {r[0]: r[1] for t in page_tables(page) if not t["nested"] for r in table_text(t) if len(r) == 2}
    shown = prov["wall time"].removesuffix(" s")
    assert prov["wall time"].endswith(" s") and float(shown) == float(f"{wall:.3g}")
    assert len(shown.replace(".", "").lstrip("0")) == 3  # 3 significant digits, not 17
    assert prov["seed"] == "0" and prov["strategies"] == "post"
    # a candidate that failed shows its note (summary.json's candidate_notes) in the table and the chart data
    summary["candidates"]["metis"] = None
    summary["candidate_notes"]["metis"] = "OOM: does not fit"
    (run / "summary.json").write_text(json.dumps(summary))
    page = write_report(run, graph=str(graph_file)).read_text()
    check_tables(page)
    rows = step_table(page)
    metis = next(r for r in rows if r[0] == "metis")
    assert metis[2] == "-" and metis[-1] == "OOM: does not fit" and rows[0][-1] == "note"
    bars = json.loads((run / "report.json").read_text())["bars"]
    assert {b["label"]: b["note"] for b in bars}["metis"] == "OOM: does not fit"


def test_compare_report(tmp_path):
    g, c = two_layer_graph(), load_cluster("k80x2")
    names = ["single", "metis", "data-parallel", "random", "post"]
    rep = compare(g, c, names, budget=48, seeds=2, out=tmp_path)
    out = write_report(tmp_path, tmp_path / "html" / "index.html", graph=g)
    folder = out.parent / "index_files"  # a page outside the run folder keeps its files in NAME_files/
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
    best = min(
        r["min_step_time_s"]
        for r in rep["rows"]
        if r["kind"] in ("search", "placer") and r["min_step_time_s"] is not None and not r["oom_count"]
    )
    assert data["schedule"]["step_time_s"] == pytest.approx(best, rel=1e-12)
    # two seeds: the search rows are medians with their range, and the page says so; the single device
    # is its own row, not a second reference row
    page = out.read_text()
    rows = step_table(page)
    assert rows[0][2] == "best ms (search: median of 2 seeds)" and rows[0][3].startswith("range ms")
    assert [r[0] for r in rows[1:]] == names + ["lower bound"]
    assert sum(cell.count("single device") for r in rows for cell in r) == 1
    assert "median of 2 seeds" in visible_text(page)


def test_one_seed_compare_report_says_no_median(tmp_path):
    g, c = two_layer_graph(), load_cluster("k80x2")
    compare(g, c, ["metis", "random"], budget=24, seeds=1, out=tmp_path)
    out = write_report(tmp_path, graph=g)
    data = json.loads((tmp_path / "report.json").read_text())
    check_page(tmp_path, out, data)
    page = out.read_text()
    assert "median" not in visible_text(page).lower() and data["title"].endswith("x 1 seed")
    rows = step_table(page)
    assert rows[0][:3] == ["strategy", "kind", "best ms"] and not any(h.startswith("range") for h in rows[0])
    assert "OOM seeds" not in rows[0]  # no OOM anywhere: no column of zeros
    # no single-device row among the strategies: the reference row, once
    assert [r[0] for r in rows[1:]] == ["metis", "random", "best single device", "lower bound"]
    assert sum(cell.count("single device") for r in rows for cell in r) == 1
    from postplace.report._png import bar_legend_labels, curve_label

    assert [curve_label(cv) for cv in data["curves"]] == ["random"]
    assert not any("median" in x for x in bar_legend_labels(data))


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
    r = run_cli("report", str(tmp_path))
    assert r.returncode == 2 and r.stderr.startswith("error: ") and len(r.stderr.strip().splitlines()) == 1
    (tmp_path / "summary.json").write_text(
        json.dumps({"graph": "mystery", "cluster": "k80x2", "returned": "search", "best_step_time_s": 0.01})
    )
    with pytest.raises(PostplaceError, match="--graph"):
        build_report_data(tmp_path)


def test_headline_reductions_by_hand():
    rep = {
        "single_device_step_time_s": 2.0,
        "rows": [
            {"strategy": "post", "best_step_time_s": 1.0, "oom_count": 0},
            {"strategy": "hp", "best_step_time_s": 4.0, "oom_count": 0},
            {"strategy": "reinforce", "best_step_time_s": 1.25, "oom_count": 0},
            {"strategy": "metis", "best_step_time_s": 0.5, "oom_count": 1},  # OOM: not the best heuristic
            {"strategy": "heft", "best_step_time_s": 1.6, "oom_count": 0},
            {"strategy": "data-parallel", "best_step_time_s": 0.8, "oom_count": 0},
        ],
    }
    h = headline(rep, "m", "k80x2")
    assert h.reduction["hp"] == 1 - 1 / 4 and h.reduction["reinforce"] == pytest.approx(0.2)
    assert h.rival_s["best heuristic"] == 1.6 and h.reduction["single"] == 0.5
    assert h.reduction["data-parallel"] == pytest.approx(-0.25)
    assert "ppo" not in h.reduction and reduction(None, 1.0) is None


def test_paper_runs_resumes_and_reports(tmp_path, monkeypatch):
    """The whole experiment on a stand-in zoo: staged, resumable (a second call searches nothing)."""
    import postplace.zoo as zoo

    monkeypatch.setattr(zoo, "cached_graph", lambda name, size="full", optimizer="sgd": two_layer_graph())
    cfg = replace(
        PaperConfig.quick(),
        models=("two",),
        clusters=("k80x2",),
        budget=24,
        hp_budget=8,
        strategies=("single", "metis", "data-parallel", "reinforce-local", "post", "hp-local"),
    )
    seen = []
    data = run_paper(tmp_path, cfg, progress=lambda what, done, total: seen.append((done, total)))
    assert seen[-1][0] == pytest.approx(seen[-1][1]) and all(a[0] <= b[0] for a, b in zip(seen, seen[1:], strict=False))
    pair = json.loads((tmp_path / "two-k80x2" / "compare.json").read_text())
    rows = {r["strategy"]: r for r in pair["rows"]}
    assert set(rows) == set(cfg.strategies)
    hp = tmp_path / "two-k80x2" / "runs" / "hp-local" / "seed0" / "result.json"
    assert json.loads(hp.read_text())["samples"] == 8
    h = data["headline"][0]  # Post's default (probe start, local moves): the last table
    assert h["reduction"]["hp-local"] == reduction(
        rows["post"]["best_step_time_s"], rows["hp-local"]["best_step_time_s"]
    )
    assert "vs hp-local" in format_table(data)
    mtime = (tmp_path / "two-k80x2" / "runs" / "post" / "seed0" / "result.json").stat().st_mtime_ns
    again = run_paper(tmp_path, cfg)
    assert again["headline"] == data["headline"]
    assert (tmp_path / "two-k80x2" / "runs" / "post" / "seed0" / "result.json").stat().st_mtime_ns == mtime
    # fewer planner seeds than the rest: its row merged in, with its own seed count
    fewer = run_paper(tmp_path, replace(cfg, seeds=2, hp_seeds=1))
    pair = json.loads((tmp_path / "two-k80x2" / "compare.json").read_text())
    rows = {r["strategy"]: r for r in pair["rows"]}
    assert [r["strategy"] for r in pair["rows"]] == list(cfg.strategies)
    assert (rows["hp-local"]["seeds"], rows["post"]["seeds"], pair["hp_seeds"]) == (1, 2, 1)
    assert fewer["config"]["planner_seeds"] == 1 and "x 1 seeds" in format_table(fewer)
    # collecting searches nothing and leaves out what did not finish
    import shutil

    shutil.rmtree(tmp_path / "two-k80x2" / "runs" / "reinforce-local" / "seed1")
    shutil.rmtree(tmp_path / "two-k80x2" / "runs" / "hp-local" / "seed0")
    got = run_paper(tmp_path, replace(cfg, seeds=2), collect=True)
    assert got["missing"] == {"two-k80x2": ["reinforce-local", "hp-local"]}
    assert not (tmp_path / "two-k80x2" / "runs" / "reinforce-local" / "seed1").exists()
    assert "left out: reinforce-local, hp-local" in format_table(got)
    page = write_report(tmp_path)
    assert page.exists() and (tmp_path / "two-k80x2" / "report.html").exists()
    assert "two-k80x2/report.html" in page.read_text() and "https://" not in page.read_text()


def deep_module_graph(layers: int = 8) -> OpGraph:
    """A forward and backward chain through ``layers`` encoder layers, each with six modules five levels
    deep (``enc.layers.3.attn.q``): 48 leaf modules, 16 at depth 4. A residual add per layer records no
    module (``""``) and takes its input's."""
    leaves = ["attn.q", "attn.k", "attn.v", "attn.o", "mlp.fc1", "mlp.fc2"]
    fwd = []
    for i in range(layers):
        fwd += [(f"l{i}.{leaf}", f"enc.layers.{i}.{leaf}") for leaf in leaves] + [(f"l{i}.add", "")]
    names = [n for n, _ in fwd] + ["loss"] + [f"g_{n}" for n, _ in reversed(fwd)]
    module = [m for _, m in fwd] + ["(loss)"] + [m for _, m in reversed(fwd)]
    phase = ["forward"] * len(fwd) + ["forward"] + ["backward"] * len(fwd)
    n = len(names)
    return OpGraph.build(
        names,
        [(i, i + 1, 1e5) for i in range(n - 1)],
        flops=[1e8] * n,
        bytes_accessed=[1e5] * n,
        output_bytes=[1e5] * n,
        phase=phase,
        module=module,
        name="deep",
    )


def test_placement_map_groups_by_module_path_to_a_readable_depth(tmp_path):
    """Issue 22 item 6: the map follows OpGraph.module (kept by graph files) to the deepest level with
    at most 40 rows, not to the first two levels of parameter names."""
    from postplace.graph import load_graph
    from postplace.report._data import MAP_MAX_ROWS, map_depth, op_modules, placement_map_info

    g = deep_module_graph()
    g.save(tmp_path / "deep.json")
    loaded = load_graph(tmp_path / "deep.json")
    assert loaded.module == g.module  # a saved graph keeps its module paths
    c = load_cluster("k80x2")
    ops = np.arange(loaded.num_ops) % c.num_devices
    full, how = op_modules(loaded)
    assert "OpGraph.module" in how and full[5] == full[6] == "enc.layers.0.mlp.fc2"
    assert map_depth(full) == 4  # depth 5: 48 leaves + (loss) > 40 rows; depth 4: 17
    pm = placement_map_info(loaded, c, ops)
    mods = [m["module"] for m in pm["modules"]]
    assert pm["depth"] == 4 and pm["max_depth"] == 5 and len(mods) <= MAP_MAX_ROWS
    assert mods[:3] == ["enc.layers.0.attn", "enc.layers.0.mlp", "enc.layers.1.attn"] and mods[-1] == "(loss)"
    assert len(mods) == 8 * 2 + 1
    assert sum(sum(cnt.values()) for m in pm["modules"] for cnt in m["counts"].values()) == loaded.num_ops
    assert sum(m["counts"]["backward"][d] for m in pm["modules"] for d in m["counts"].get("backward", {})) == 56
    # a roomier map goes to the leaves; an explicit depth is honoured
    assert placement_map_info(loaded, c, ops, max_rows=60)["depth"] == 5
    assert len(placement_map_info(loaded, c, ops, max_rows=60)["modules"]) == 48 + 1
    assert [m["module"] for m in placement_map_info(loaded, c, ops, depth=2)["modules"]] == ["enc.layers", "(loss)"]
    # a graph with more layers than a map can show stops at the level above the layers
    big = deep_module_graph(layers=30)
    assert placement_map_info(big, c, np.zeros(big.num_ops, dtype=np.int64) + 1)["depth"] == 3


def test_report_of_a_graph_file_with_module_paths(tmp_path):
    """The whole path: a place run over a graph file with deep module paths draws its map by them."""
    import postplace

    g = deep_module_graph(layers=4)
    g.save(tmp_path / "deep.json")
    out = tmp_path / "run"
    postplace.place(str(tmp_path / "deep.json"), "k80x2", strategy="random", budget=8, out=out, groups=None)
    page = (out / "report.html").read_text()  # place writes it
    data = json.loads((out / "report.json").read_text())
    check_page(out, out / "report.html", data)
    pm = data["placement_map"]
    assert pm["depth"] == 5 and {"enc.layers.2.attn.q", "enc.layers.3.mlp.fc2"} <= {m["module"] for m in pm["modules"]}
    assert "enc.layers.3.mlp.fc2" in page and "module depth 5 of 5" in page
