"""The library's place(): candidates, constraints on every path, warm starts, summaries, run folders."""

import doctest
import json

import numpy as np
import pytest

import postplace
from postplace.cluster import load_cluster
from postplace.cluster.placement import load_placement
from postplace.errors import PostplaceError
from postplace.graph import OpGraph
from postplace.placers import place as run_placer
from postplace.sim import Simulator
from tests.tracehelp import CAPTURED_TARGETS


def graph30(cpu_only=()):
    rng = np.random.default_rng(0)
    n = 30
    out = rng.integers(1, 5, n).astype(float) * 1e6
    edges = [(i, j, out[i]) for j in range(1, n) for i in range(max(0, j - 3), j) if rng.random() < 0.5]
    kinds = [["cpu"] if i in cpu_only else ["cpu", "gpu"] for i in range(n)]
    return OpGraph.build(
        [f"op{i}" for i in range(n)],
        edges,
        flops=rng.uniform(1e9, 1e10, n),
        output_bytes=out,
        persistent_bytes=rng.integers(0, 3, n).astype(float) * 1e6,
        allowed_kinds=kinds,
        name="g30",
    )


def test_docstring_example_runs():
    import importlib
    import pkgutil

    import postplace.api

    assert "Examples" in postplace.place.__doc__
    attempted = 0
    for info in pkgutil.iter_modules(postplace.api.__path__):  # each file of the package, where its code lives
        result = doctest.testmod(importlib.import_module(f"postplace.api.{info.name}"), optionflags=doctest.ELLIPSIS)
        assert result.failed == 0, info.name
        attempted += result.attempted
    assert attempted >= 4


def test_place_returns_a_heuristic_that_beats_the_search_and_says_so():
    # one random sample cannot match m-ETF on this graph; place returns m-ETF's own placement
    r = postplace.place(graph30(), "k80x2", strategy="random", budget=1, groups=None)
    c = load_cluster("k80x2")
    etf = Simulator(r.graph, c).evaluate_ops(run_placer("m-etf", r.graph, c)[None]).step_time[0]
    assert r.returned == "m-etf" and r.summary["returned"] == "m-etf"
    assert r.step_time_s == etf == min(k.step_time_s for k in r.candidates if k.feasible)
    assert r.search_best_step_time_s > r.step_time_s  # the search's own best stays reported on its own
    assert r.summary["candidates"]["search"] == r.search_best_step_time_s
    assert "m-etf" in str(r) and "PlaceResult('g30'" in repr(r)


def test_summary_equals_resimulating_the_written_placement(tmp_path):
    # groups (so group_of_op matters) and a CPU-only op: today's summary path indexed ops by groups twice
    g = graph30(cpu_only=(4,))
    r = postplace.place(g, "k80x4", budget=96, groups=6, out=tmp_path / "run")
    s = json.loads((tmp_path / "run" / "summary.json").read_text())
    c = load_cluster("k80x4")
    sched = Simulator(g, c).schedule(load_placement(tmp_path / "run" / "placement.json", g, c))
    assert s["best_step_time_s"] == s["simulated_step_time_s"] == sched.step_time == r.step_time_s
    assert s["peak_memory_bytes"] == dict(zip(c.device_names, sched.peak_memory.tolist(), strict=True))
    assert s["busy_s"] == dict(zip(c.device_names, sched.busy.tolist(), strict=True))
    assert s["bytes_moved"] == sum(x[4] for x in sched.transfers) and s["transfers"] == len(sched.transfers)
    assert s["lower_bound_s"] == Simulator(g, c).lower_bound
    assert s["ratio_to_lower_bound"] == s["best_step_time_s"] / s["lower_bound_s"]
    assert s["figures"]["best_step_time_s"] == "simulated"


def test_pins_and_exclusions_hold_for_every_candidate():
    g = graph30()
    c = load_cluster("k80x4")
    r = postplace.place(
        g, c, strategy="random", budget=24, groups=None, pins=["^op0$=gpu2", "^op1[0-9]$=cpu"], exclude=["gpu0"]
    )
    names = c.device_names
    checked = 0
    for k in r.candidates:
        if k.placement is None:
            continue
        checked += 1
        assert names[k.placement[0]] == "gpu2", k.name
        assert all(names[k.placement[i]] == "cpu" for i in range(10, 20)), k.name
        assert "gpu0" not in {names[d] for d in k.placement}, k.name
    assert checked >= 6  # the search, single and the memory-aware placers all produced one
    single = next(k for k in r.candidates if k.name.startswith("single:"))
    assert single.name != "single:gpu0"  # the fallback never uses an excluded device


def test_warm_start_is_evaluated_exactly_and_respects_pins():
    g = graph30()
    c = load_cluster("k80x2")
    r = postplace.place(g, c, strategy="random", budget=4, groups=3, warm_start="heft", pins=["^op3$=gpu1"])
    warm = next(k for k in r.candidates if k.name == "warm-start:heft")
    heft = run_placer("heft", g, c, allowed=_allowed(g, c, {3: 2}))
    np.testing.assert_array_equal(warm.placement, heft)  # its own op-level placement, not the collapsed one
    assert warm.step_time_s == Simulator(g, c).evaluate_ops(heft[None]).step_time[0]
    assert c.device_names[warm.placement[3]] == "gpu1"
    with pytest.raises(PostplaceError, match="--warm-start single:gpu0 puts op"):
        postplace.place(g, c, budget=4, groups=3, warm_start="single:gpu0", exclude=["gpu0"])


def _allowed(g, c, pins):
    a = np.ones((g.num_ops, c.num_devices), dtype=bool)
    for i, d in pins.items():
        a[i] = False
        a[i, d] = True
    return a


def test_hp_accepts_a_warm_start():
    small = {"num_groups": 4, "grouper_hidden": 8, "placer_hidden": 8, "device_embedding": 4}
    r = postplace.place(graph30(), "k80x2", strategy="hp", budget=9, groups=6, warm_start="m-etf", config=small)
    assert r.search.samples == 9 and r.summary["warm_start"] == "m-etf"
    assert r.summary["config"]["placer_hidden"] == 8


def test_nothing_feasible_is_one_error_and_no_placement(tmp_path):
    g = OpGraph.build(["a", "b"], [(0, 1, 1.0)], persistent_bytes=[1e15, 1e15], memory_mode="static", name="huge")
    with pytest.raises(PostplaceError, match="no feasible placement found"):
        postplace.place(g, "k80x2", budget=8, groups=None, out=tmp_path / "run")
    assert not (tmp_path / "run" / "placement.json").exists()


def test_config_overrides_are_validated_and_recorded(tmp_path):
    g = graph30()
    with pytest.raises(PostplaceError, match="lr"):
        postplace.place(g, "k80x2", budget=8, config={"lr": "nan"})
    with pytest.raises(PostplaceError, match="'nope' is not a field of PostConfig"):
        postplace.place(g, "k80x2", budget=8, config={"nope": 1})
    with pytest.raises(PostplaceError, match="batch_size"):
        postplace.place(g, "k80x2", budget=8, config={"batch_size": "many"})
    with pytest.raises(PostplaceError, match="ce_every must be a multiple"):
        postplace.place(g, "k80x2", budget=8, config={"batch_size": 7})
    postplace.place(g, "k80x2", budget=8, groups=None, config={"lr": "0.05", "eps": "none"}, out=tmp_path / "r")
    run = json.loads((tmp_path / "r" / "run.json").read_text())
    assert run["config"]["lr"] == 0.05 and run["config"]["eps"] is None and run["config"]["batch_size"] == 48


def test_bad_arguments_are_one_line_errors():
    g = graph30()
    for kwargs, fragment in [
        ({"seed": -1}, "seed"),
        ({"groups": 0}, "groups"),
        ({"measure": postplace.Measure(evaluator="gpu")}, "evaluator 'gpu'"),
        ({"strategy": "nope"}, "unknown strategy"),
        ({"budget": "soon"}, "--budget"),
        ({"measure": postplace.Measure(map_all_to="cpu")}, "--map-all-to"),
        ({"precision": "bf16"}, "part of step="),
        ({"ray": "local"}, "part of measure="),
        ({"step": "adamw"}, "takes a postplace.Step"),
    ]:
        with pytest.raises(PostplaceError, match=fragment):
            postplace.place(g, "k80x2", **kwargs)


@CAPTURED_TARGETS  # its loss_fn closes over the labels y: the warning is the expected one
def test_module_target_measured_and_applied(torch_one_thread):
    import torch

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    x, y = torch.randn(4, 8), torch.randn(4, 1)

    def loss_fn(out):
        return torch.nn.functional.mse_loss(out, y)

    r = postplace.place(
        model,
        "k80x2",
        budget=2,
        groups=3,
        strategy="random",
        step=postplace.Step(inputs=(x,), loss_fn=loss_fn),
        measure=postplace.Measure(evaluator="torch", map_all_to="cpu"),
    )
    s = r.summary
    assert s["evaluator"] == "torch" and s["figures"]["best_step_time_s"] == "measured"
    assert s["figures"]["lower_bound_s"] == "simulated" and s["ratio_to_lower_bound"] is None
    assert s["map_all_to"] == "cpu"
    step = postplace.apply(r, model, device_map="cpu")
    losses = [float(step()) for _ in range(3)]
    assert all(np.isfinite(losses)) and losses[-1] < losses[0]  # it trains


def test_opgraph_prints_in_one_line():
    text = repr(graph30())
    assert "\n" not in text and text.startswith("OpGraph('g30': 30 ops") and len(text) < 200


def test_cluster_prints_in_one_line():
    text = repr(load_cluster("k80x2"))
    assert "\n" not in text and text.startswith("Cluster('k80x2': cpu (") and "gpu1 (K80" in text


def test_an_in_memory_graph_run_resumes_from_its_folder(tmp_path):
    from postplace.testing import star_cluster

    c = star_cluster(("cpu", "gpu", "gpu"), bandwidth=1e9)
    postplace.place(graph30(), c, budget=48, groups=None, out=tmp_path / "r")
    assert (tmp_path / "r" / "graph.json").exists()
    with pytest.raises(PostplaceError, match="in-memory cluster; pass cluster="):
        postplace.resume(tmp_path / "r", budget=96)
    with pytest.raises(PostplaceError, match="not the one this run was started with"):
        postplace.resume(tmp_path / "r", budget=96, cluster=star_cluster(("cpu", "gpu"), bandwidth=1e9))
    more = postplace.resume(tmp_path / "r", budget=96, cluster=c)
    assert more.search.samples == 96 and len((tmp_path / "r" / "history.jsonl").read_text().splitlines()) == 96
