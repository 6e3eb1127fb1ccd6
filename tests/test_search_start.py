"""Issue 20, part 3: the search's start recorded and measured apart.

The start a search began from (Post's probe, or the same probe given to a rival) is recorded in the run
folder, ``compare.json`` and the paper's tables; ``post-start`` samples that start with no learning; and
the paper table shows Post against each rival twice, every strategy of a table from the same start.
"""

import dataclasses
import json

import numpy as np
import pytest

import postplace
from postplace.api.settings import read_settings
from postplace.cluster import load_cluster
from postplace.comparison import compare, parse_strategies
from postplace.errors import PostplaceError
from postplace.graph import OpGraph
from postplace.search import LEARNING, PostConfig, make_problem, make_strategy
from postplace.search.starts import StartProbe
from postplace.testing.contracts import toy_score

pytestmark = pytest.mark.usefixtures("torch_one_thread")


def layered_graph(width: int = 4, depth: int = 6, name: str = "layered") -> OpGraph:
    """``width`` parallel branches of ``depth`` ops of uneven work between a source and a sink: on
    ``k80x4`` the one-GPU start is far above the lower bound and a METIS partition of the branches beats
    it, so the probe has a real choice to make."""
    rng = np.random.default_rng(3)
    n = 2 + width * depth
    names = ["src"] + [f"b{b}_{i}" for b in range(width) for i in range(depth)] + ["sink"]
    edges = []
    for b in range(width):
        first = 1 + b * depth
        edges += [(0, first, 2e6), (first + depth - 1, n - 1, 2e6)]
        edges += [(first + i, first + i + 1, 2e6) for i in range(depth - 1)]
    return OpGraph.build(
        names,
        edges,
        flops=rng.uniform(2e10, 8e10, n),
        output_bytes=np.full(n, 2e6),
        persistent_bytes=rng.uniform(1e6, 3e6, n),
        name=name,
    )


def cluster():
    return load_cluster("k80x4")


def space():
    return make_problem(layered_graph(), cluster()).space


def told(strategy, sp, max_n=100):
    """Ask once and tell the toy score of what was asked; returns the placements."""
    p = np.atleast_2d(strategy.ask(max_n))
    step, feasible, overflow = toy_score(sp)(p)
    strategy.tell(p, step, feasible, overflow)
    return p


# ------------------------------------------------------------------------------ the run folder
def test_a_place_run_folder_records_the_start_and_its_simulated_step_time(tmp_path):
    g, c = layered_graph(), load_cluster("k80x4")
    out = tmp_path / "run"
    r = postplace.place(g, "k80x4", budget=96, groups=None, out=out, report=False)
    run_json = json.loads((out / "run.json").read_text())
    summary = json.loads((out / "summary.json").read_text())
    start = summary["search_start"]
    assert run_json["search_start"] == start == r.summary["search_start"]
    assert summary["figures"]["search_start"] == "simulated"
    # the start is the probe's choice over the same space, and its step time that placement's, simulated again
    problem = make_problem(g, c, groups=None, seed=0)
    probe = StartProbe(problem.space)
    homes = dict(probe.candidates)
    assert start["name"] in homes and len(homes) > 1
    again = problem.simulator.evaluate(homes[start["name"]][None])
    assert again.feasible[0] and start["step_time_s"] == float(again.step_time[0])
    # the start is no setting: the settings read back without it, and a resumed run records it again
    assert "search_start" not in read_settings(out).to_json()
    again = postplace.resume(out, budget=144, report=False)
    assert again.summary["samples"] == 144 and json.loads((out / "run.json").read_text())["search_start"] == start


def test_a_run_over_micro_batch_counts_records_each_counts_start(tmp_path):
    from postplace.api import load_target
    from postplace.report import build_report_data
    from postplace.report._html import start_line

    out = tmp_path / "auto"
    r = postplace.place("gpt2", "k80x2", size="small", budget=48, out=out, microbatches="auto", report=False)
    per = r.summary["search_start_per_microbatches"]
    assert set(per) == {"1", "2"} == set(r.summary["best_per_microbatches"])
    assert json.loads((out / "run.json").read_text())["search_start_per_microbatches"] == per
    assert r.summary["search_start"] == per[str(r.summary["search_microbatches"])]
    c = load_cluster("k80x2")
    for m, start in per.items():  # each count's start is its own probe's choice, at its simulated step time
        problem = make_problem(load_target("gpt2", size="small", microbatches=int(m)).graph, c, groups=256, seed=0)
        homes = dict(make_strategy("post", problem.space).probe.candidates)
        assert start["step_time_s"] == float(problem.simulator.evaluate(homes[start["name"]][None]).step_time[0])
    data, _ = build_report_data(out)
    assert start_line(data).startswith(f"<p>Search start: m=1: {per['1']['name']}, ")


def test_a_folder_from_before_the_start_was_recorded_still_reports_and_resumes(tmp_path):
    from postplace.api.settings import _checksum
    from postplace.report import build_report_data

    out = tmp_path / "run"
    postplace.place(layered_graph(), "k80x4", budget=48, groups=None, strategy="anneal", out=out, report=False)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["search_start"] == {"name": None, "step_time_s": None}  # anneal has no start
    for name in ("summary.json", "run.json"):  # as a folder written before this change
        d = json.loads((out / name).read_text())
        d.pop("search_start")
        if name == "run.json":
            d["checksum"] = _checksum({k: v for k, v in d.items() if k != "checksum"})
        (out / name).write_text(json.dumps(d))
    data, _ = build_report_data(out)
    assert data["search_start"] is None
    assert postplace.resume(out, budget=96, report=False).summary["samples"] == 96


def test_a_damaged_start_in_run_json_is_one_error_line(tmp_path):
    from postplace.api.settings import _checksum

    out = tmp_path / "run"
    postplace.place(layered_graph(), "k80x4", budget=48, groups=None, out=out, report=False)
    d = json.loads((out / "run.json").read_text())
    d["search_start"] = {"name": 3, "step_time_s": -1}
    d["checksum"] = _checksum({k: v for k, v in d.items() if k != "checksum"})
    (out / "run.json").write_text(json.dumps(d))
    with pytest.raises(PostplaceError, match="field 'search_start'") as err:
        read_settings(out)
    assert "\n" not in str(err.value)


def test_the_report_line_names_the_start():
    from postplace.report._html import start_line

    data = {"search_start": {"name": "part4-work", "step_time_s": 0.1234, "kind": "simulated", "per_m": []}}
    assert start_line(data) == "<p>Search start: part4-work, 123.4 ms (simulated).</p>"
    per = {
        "name": "fastest",
        "step_time_s": 0.01,
        "kind": "simulated",
        "per_m": [{"m": 1, "name": "fastest", "step_time_s": 0.01}, {"m": 2, "name": "uniform", "step_time_s": None}],
    }
    assert start_line({"search_start": per}) == (
        "<p>Search start: m=1: fastest, 10.00 ms; m=2: uniform (not probed) (simulated).</p>"
    )
    assert start_line({"search_start": None}) == ""


# ------------------------------------------------------------------------------ compare
def test_compare_rows_record_each_search_start(tmp_path):
    names = ["random", "post-start", "post", "reinforce-probe", "post-paper"]
    rep = compare(layered_graph(), cluster(), names, budget=48, seeds=2, out=tmp_path)
    rows = {r["strategy"]: r for r in rep["rows"]}
    probe = StartProbe(make_problem(layered_graph(), cluster()).space)
    assert rows["random"]["start_name"] is None and rows["random"]["start_step_time_s"] is None
    assert rows["post-paper"]["start_name"] == "uniform" and rows["post-paper"]["start_step_time_s"] is None
    for name in ("post-start", "post", "reinforce-probe"):
        assert rows[name]["start_name"] == rows["post"]["start_name"] in dict(probe.candidates)
        assert rows[name]["start_step_time_s"] == rows["post"]["start_step_time_s"] is not None
        assert [s["start_name"] for s in rows[name]["per_seed"]] == [rows[name]["start_name"]] * 2
    assert "start_name" in (tmp_path / "compare.csv").read_text().splitlines()[0]
    # a second call reads the finished runs back, starts included
    again = compare(layered_graph(), cluster(), ["post"], budget=48, seeds=2, out=tmp_path)
    assert again["rows"][0]["start_step_time_s"] == rows["post"]["start_step_time_s"]


def test_the_new_names_are_typed_as_compare_takes_them():
    assert "post-start" in parse_strategies("all")
    for name in ("post-paper", "ce-paper", "ppo-paper", "reinforce-paper", "reinforce-probe", "hp-probe"):
        assert parse_strategies(f"post,{name}") == ["post", name]
    with pytest.raises(PostplaceError, match="unknown 'hp-prob'"):
        parse_strategies("hp-prob")


# ------------------------------------------------------------------------------ post-start
def test_post_start_samples_its_start_and_never_learns():
    sp = space()
    s = make_strategy("post-start", sp, seed=0)
    assert s.name == "post-start"
    off = [f.name for f in dataclasses.fields(PostConfig) if f.name in LEARNING]
    assert off and not any(getattr(s.config, k) for k in off)
    assert s.config.init == "probe" and s.config.batch_size == PostConfig().batch_size
    told(s, sp)  # the probe's candidates: the start is chosen
    post = make_strategy("post", sp, seed=0)
    told(post, sp)
    assert s.start_name == post.start_name and s.start_step_time == post.start_step_time
    np.testing.assert_array_equal(s.policy.logits, post.policy.logits)  # Post's start, exactly
    after_probe = s.policy.logits.copy()
    for _ in range(12):  # past PPO batches and a cross-entropy step (ce_every 480 at batch 48: 10 batches)
        told(s, sp, 48)
    np.testing.assert_array_equal(s.policy.logits, after_probe)
    told(post, sp, 48)
    assert not np.array_equal(post.policy.logits, after_probe)  # Post itself learns from the same batch


# ------------------------------------------------------------------------------ rivals from the same start
@pytest.mark.parametrize("name", ["reinforce-probe", "hp-probe", "ce", "ppo"])
def test_a_rival_from_the_probe_asks_its_candidates_first_and_starts_where_post_does(name):
    sp = space()
    cfg = None
    if name == "hp-probe":
        from postplace.search.hierarchical import HierarchicalConfig

        cfg = HierarchicalConfig(grouper_hidden=8, placer_hidden=16, device_embedding=8, init="probe")
    s = make_strategy(name, sp, seed=4, config=cfg)
    post = make_strategy("post", sp, seed=4)
    probe = StartProbe(sp)
    first = told(s, sp)
    np.testing.assert_array_equal(first, np.stack([h for _, h in probe.candidates]))
    told(post, sp)
    assert s.start_name == post.start_name is not None and s.start_step_time == post.start_step_time
    assert s.name == name
    told(s, sp, 8)  # then its own samples


def test_on_a_micro_batched_step_the_rivals_probe_posts_layer_starts():
    """Where the space has layers (Post decides a stripe per layer), the probe's candidates are Post's
    layer starts (stripes among them), and a rival starting from one anchors its units on it."""
    from postplace.search.layers import layer_candidates
    from postplace.testing import ConstantCostModel, star_cluster
    from tests.test_layers import chain_step

    c = star_cluster(("cpu", "gpu", "gpu"), bandwidth=1.0)
    sp = make_problem(chain_step(8, 2), c, groups=4, cost_model=ConstantCostModel(1.0)).space
    assert sp.layers is not None
    starts = layer_candidates(sp, PostConfig().fill_fraction)
    assert any(name.startswith("stripe") for name, _ in starts)
    post, rf = make_strategy("post", sp, seed=0), make_strategy("reinforce-probe", sp, seed=0)
    first = told(rf, sp)
    np.testing.assert_array_equal(first, np.stack([h for _, h in starts]))
    np.testing.assert_array_equal(told(post, sp), first)
    assert rf.start_name == post.start_name is not None and rf.start_step_time == post.start_step_time


def test_reinforce_from_the_probe_starts_from_posts_prior_and_hp_from_a_bias_towards_it():
    from postplace.search.hierarchical import HierarchicalConfig

    sp = space()
    post, rf = make_strategy("post", sp, seed=1), make_strategy("reinforce-probe", sp, seed=1)
    told(post, sp), told(rf, sp)
    np.testing.assert_allclose(rf.policy.logits, post.policy.logits)  # the same anchored prior, same weight rule
    cfg = HierarchicalConfig(grouper_hidden=8, placer_hidden=16, device_embedding=8)
    plain = make_strategy("hp", sp, seed=1, config=cfg)
    hp = make_strategy("hp-probe", sp, seed=1, config=dataclasses.replace(cfg, init="probe"))
    assert plain.config.init == "none" and plain.start_name == "none" and plain.start_step_time is None
    told(hp, sp)
    home = dict(StartProbe(sp).candidates)[hp.start_name]
    on_home = np.mean([(hp.ask(4) == home).mean() for _ in range(20)])
    on_home_plain = np.mean([(plain.ask(4) == home).mean() for _ in range(20)])
    # the first samples come from the start: here a partition, 0.5 of each unit's prior on its home, which
    # groups of mixed homes dilute (about 0.43 of the units on their home, against 0.2 from the paper's start)
    assert on_home > on_home_plain + 0.1


@pytest.mark.parametrize("name", ["reinforce-probe", "hp-probe"])
def test_a_state_taken_during_the_probe_resumes_exactly(name):
    """The strategy contract's round trip runs after the probe; this one cuts inside it."""
    from postplace.search import config_class

    cfg = config_class(name)[1]
    if name == "hp-probe":
        cfg = dataclasses.replace(cfg, grouper_hidden=8, placer_hidden=16, device_embedding=8)
    sp = space()
    a = make_strategy(name, sp, seed=2, config=cfg)
    told(a, sp, 3)  # three of the candidates told
    b = make_strategy(name, sp, seed=9, config=cfg)
    b.load_state_dict(a.state_dict())
    for _ in range(5):
        np.testing.assert_array_equal(told(a, sp, 8), told(b, sp, 8))
    assert a.start_name == b.start_name is not None and a.start_step_time == b.start_step_time


# ------------------------------------------------------------------------------ the paper
def test_the_paper_shows_three_tables_what_each_mechanism_adds_and_names_each_start(tmp_path, monkeypatch):
    import postplace.zoo as zoo
    from postplace.paper import PLANNERS, PaperConfig, format_table, gap_closed, reduction, run_paper
    from postplace.report.markdown import TABLES

    monkeypatch.setattr(zoo, "cached_graph", lambda name, size="full", optimizer="sgd": layered_graph(name=name))
    searches = [n for t in TABLES.values() for n in (t["post"], *t["rivals"])]
    cfg = dataclasses.replace(
        PaperConfig.quick(),
        models=("layered",),
        clusters=("k80x4",),
        budget=48,
        hp_budget=8,
        strategies=("single", *searches),
    )
    data = run_paper(tmp_path, cfg)
    assert set(data["tables"]) == {"uniform", "probe", "local"} and set(PLANNERS) <= set(searches)
    uniform, probe, local = (data["tables"][k] for k in ("uniform", "probe", "local"))
    assert (uniform["post"], probe["post"], local["post"]) == ("post-paper", "post-probe", "post")
    assert data["headline"] == local["headline"]  # Post's default: its probe start with local moves
    assert set(uniform["headline"][0]["reduction"]) >= {"ce-paper", "ppo-paper", "reinforce-paper", "hp"}
    assert set(probe["headline"][0]["reduction"]) >= {
        "post-start",
        "ce-probe",
        "ppo-probe",
        "reinforce-probe",
        "hp-probe",
    }
    assert set(local["headline"][0]["reduction"]) >= {"local", "ce", "ppo", "reinforce-local", "hp-local"}
    text = format_table(data)
    assert "From the paper's uniform start, no local moves: post-paper against ce-paper" in text
    assert "From Post's probe start, no local moves: post-probe against post-start" in text
    assert "From Post's probe start, with local moves: post against local" in text
    assert "From the paper's uniform start, no local moves, Post (post-paper) vs hp:" in text
    assert "From Post's probe start, with local moves, Post (post) vs reinforce-local:" in text
    # read across tables: what local moves and the probe start add to each method, 1 - with / without
    rep = json.loads((tmp_path / "layered-k80x4" / "compare.json").read_text())
    best = {r["strategy"]: r["best_step_time_s"] for r in rep["rows"]}
    moves = data["effects"]["local moves"]["pairs"]["layered-k80x4"]
    assert moves["post-probe -> post"] == reduction(best["post"], best["post-probe"])
    assert moves["post-start -> local"] == reduction(best["local"], best["post-start"])
    assert moves["hp-probe -> hp-local"] == reduction(best["hp-local"], best["hp-probe"])
    start = data["effects"]["the probe start"]["pairs"]["layered-k80x4"]
    assert start["reinforce-paper -> reinforce-probe"] == reduction(best["reinforce-probe"], best["reinforce-paper"])
    assert "What local moves add to each method" in text and "post-start -> local" in text
    # per pair: each search's start, its final step time and the share of the gap learning closed
    pair = data["starts"]["layered-k80x4"]
    rows = {r["strategy"]: r for r in rep["rows"]}
    for name in (
        "post",
        "post-start",
        "ce",
        "ppo",
        "reinforce-probe",
        "hp-probe",
        "post-probe",
        "local",
        "reinforce-local",
        "hp-local",
    ):
        r = pair["strategies"][name]
        assert r["start_name"] == pair["strategies"]["post"]["start_name"] is not None
        assert r["start_step_time_s"] == rows[name]["start_step_time_s"] is not None
        assert r["final_step_time_s"] == rows[name]["best_step_time_s"] <= r["start_step_time_s"]
        assert r["gap_closed"] == gap_closed(r["start_step_time_s"], r["final_step_time_s"], rep["lower_bound_s"])
        assert 0 <= r["gap_closed"] <= 1
    for name in ("post-paper", "ce-paper", "reinforce-paper", "hp"):
        assert pair["strategies"][name]["gap_closed"] is None  # not probed: no start time to close a gap from
    assert "gap closed" in text and (tmp_path / "paper.md").read_text().strip() == text
    # resumable: a second call searches nothing and gives the same tables
    mtime = (tmp_path / "layered-k80x4" / "runs" / "hp-probe" / "seed0" / "result.json").stat().st_mtime_ns
    assert run_paper(tmp_path, cfg)["tables"] == data["tables"]
    assert (tmp_path / "layered-k80x4" / "runs" / "hp-probe" / "seed0" / "result.json").stat().st_mtime_ns == mtime


def test_a_paper_json_from_before_the_two_tables_still_formats():
    from postplace.report.markdown import format_table

    old = {
        "config": {"seeds": 1, "budget": 240, "planner_budget": 48, "size": "small"},
        "paper_claim": {"max_reduction_vs_rl": 0.637},
        "headline": [
            {
                "model": "rnnlm",
                "cluster": "k80x2",
                "post_s": 0.01,
                "hp_seeds": 1,
                "reduction": {"hp": 0.25, "reinforce": 0.1},
            }
        ],
        "summary": {"hp": {"pairs": 1, "post_faster": 1, "median": 0.25, "max": 0.25, "min": 0.25}},
    }
    text = format_table(old)
    assert "vs hp: Post faster on 1/1 pairs, median +25.0%" in text and "+10.0%" in text
