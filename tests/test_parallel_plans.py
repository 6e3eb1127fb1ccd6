"""The product's answer over micro-batch counts: candidates at every m, successive halving, one
resumable run folder, the plan in words, and bad input refused before any search."""

from __future__ import annotations

import json

import numpy as np
import pytest

import postplace
from postplace.api.over_m import halving_rounds, microbatch_counts
from postplace.api.summary import describe_plan
from postplace.cluster import load_cluster
from postplace.errors import PostplaceError
from postplace.graph import OpGraph
from postplace.placers.data_parallel import data_parallel_placement, simulate_data_parallel
from postplace.sim import Simulator
from postplace.zoo import cached_graph
from tests.clihelp import cli_error

MODEL, CLUSTER = "gpt2", "k80x2"  # small size: batch 2, so m in {1, 2}


def test_counts_are_powers_of_two_dividing_the_batch_up_to_the_gpus_or_8():
    assert microbatch_counts(32, 4) == [1, 2, 4, 8]
    assert microbatch_counts(32, 8) == [1, 2, 4, 8]
    assert microbatch_counts(128, 16) == [1, 2, 4, 8, 16]
    assert microbatch_counts(20, 4) == [1, 2, 4]
    assert microbatch_counts(2, 4) == [1, 2]
    assert microbatch_counts(7, 2) == [1]


def test_halving_keeps_half_each_round_until_one():
    assert halving_rounds(1) == [1]
    assert halving_rounds(4) == [4, 2, 1]
    assert halving_rounds(5) == [5, 3, 2, 1]


def test_plan_words_for_data_parallelism_a_pipeline_and_a_hybrid():
    # 4 micro-batches, each with two layers (a, b) on 4 GPUs; ops weigh the same
    names, mb = [], []
    for k in range(4):
        names += [f"mb{k}_a", f"mb{k}_b"]
        mb += [k, k]
    g = OpGraph.build(names, [], microbatch=mb)
    c = load_cluster("k80x4")
    gpu = [c.device_index(f"gpu{i}") for i in range(4)]
    dp = np.array([gpu[k] for k in range(4) for _ in "ab"])
    pipe = np.array([gpu[j] for _ in range(4) for j in (0, 1)])
    hybrid = np.array([gpu[2 * (k % 2) + j] for k in range(4) for j in (0, 1)])
    assert describe_plan(g, c, dp) == "data-parallel 4 (gpu0..gpu3), 4 micro-batches"
    assert describe_plan(g, c, pipe) == "pipeline of 2 stages (gpu0, gpu1), 4 micro-batches"
    assert describe_plan(g, c, hybrid) == "2 stages x data-parallel 2 (replicas: gpu0+gpu1, gpu2+gpu3), 4 micro-batches"
    # ResNet-50 on k80x4's answer: micro-batch 0 also runs a tenth of its time on the CPU. It was called
    # "2 stages x data-parallel 4", which reads as 8 GPUs on a 4-GPU machine.
    uneven = dp.copy()
    uneven[1] = c.device_index("cpu")
    assert describe_plan(g, c, uneven) == (
        "data-parallel 4 over 5 devices (replicas: cpu+gpu0, gpu1, gpu2, gpu3), 4 micro-batches"
    )


@pytest.fixture(scope="module")
def answer(tmp_path_factory):
    out = tmp_path_factory.mktemp("overm") / "run"
    return postplace.place(MODEL, CLUSTER, size="small", budget=96, groups=32, out=out), out


def test_default_place_answers_over_m_with_every_candidate_at_every_m(answer):
    r, out = answer
    s = r.summary
    assert s["microbatch_counts"] == [1, 2]
    names = set(s["candidates"])
    for m in (1, 2):
        assert {f"search @m{m}", f"pipeline @m{m}", f"metis @m{m}"} <= names
    assert "param-server @m2" in names
    feasible = [v for v in s["candidates"].values() if v is not None]
    assert s["best_step_time_s"] == min(feasible)
    # the data-parallel candidate is data parallelism simulated on the m = 2 graph, computed apart here
    g2 = cached_graph(MODEL, "small", microbatches=2)
    c = load_cluster(CLUSTER)
    dp = simulate_data_parallel(g2, c)
    assert not dp.oom
    want = float(Simulator(g2, c).evaluate_ops(data_parallel_placement(g2, c)[None]).step_time[0])
    assert s["candidates"]["param-server @m2"] == pytest.approx(want, rel=1e-12)
    # every figure is the simulator's on placement.json, on the graph of the returned m
    g = cached_graph(MODEL, "small", microbatches=s["microbatches"])
    from postplace.cluster.placement import load_placement

    ops = load_placement(out / "placement.json", g, c)
    assert float(Simulator(g, c).evaluate_ops(ops[None]).step_time[0]) == pytest.approx(s["best_step_time_s"])
    assert s["plan"] and s["returned"].endswith(f"@m{s['microbatches']}")
    # the budget was split by halving: m's searches sum to the budget, and one count got more
    per = s["samples_per_microbatches"]
    assert sum(per.values()) == 96 and max(per.values()) > min(per.values())
    assert json.loads((out / "plans.json").read_text())["rounds"][0] == [1, 2]


def test_an_interrupted_run_resumes_to_the_same_answer(answer, tmp_path, monkeypatch):
    r, _ = answer
    import postplace.search as search

    real, calls = search.run, []

    def stop_on_third(*a, **k):  # the third search call (round 2) is interrupted before it starts
        calls.append(1)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return real(*a, **k)

    monkeypatch.setattr(search, "run", stop_on_third)
    out = tmp_path / "run"
    with pytest.raises(KeyboardInterrupt):
        postplace.place(MODEL, CLUSTER, size="small", budget=96, groups=32, out=out)
    monkeypatch.setattr(search, "run", real)
    again = postplace.resume(out)
    assert again.summary["best_step_time_s"] == r.summary["best_step_time_s"]
    assert again.summary["samples_per_microbatches"] == r.summary["samples_per_microbatches"]
    assert np.array_equal(again.placement, r.placement)
    with pytest.raises(PostplaceError, match="started with microbatches 'auto', not 2"):
        postplace.resume(out, microbatches=2)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"microbatches": 3, "size": "full"}, "--microbatches 3 does not divide the batch of 8"),
        ({"microbatches": 2, "pins": ["nothing_is_called_this=gpu0"]}, "no op name matches"),
        ({"pins": ["nothing_is_called_this=gpu0"]}, "at 1 micro-batch: --pin"),
        ({"exclude": ["gpu9"]}, "at 1 micro-batch: .*no device 'gpu9'"),
        ({"budget": 3}, "needs at least 4 samples"),
        ({"warm_start": "WARM"}, "at 1 micro-batch: .*m1.json: placement splits a colocation set"),
    ],
)
def test_bad_input_is_one_line_before_any_search(kwargs, message, tmp_path, monkeypatch):
    import postplace.search as search

    def no_search(*a, **k):
        raise AssertionError("a search ran")

    monkeypatch.setattr(search, "run", no_search)
    if kwargs.get("warm_start") == "WARM":  # an m = 1 placement that is invalid: refused before any search
        g1 = cached_graph(MODEL, "small")
        doc = dict.fromkeys(g1.names, "gpu0")
        doc[g1.names[-1]] = "gpu1"  # the last update op away from its parameter: a split colocation set
        path = tmp_path / "m1.json"
        path.write_text(json.dumps(doc))
        kwargs = {**kwargs, "warm_start": str(path)}
    kwargs = {"size": "small", "budget": 48, **kwargs}
    out = tmp_path / "run"
    with pytest.raises(PostplaceError, match=message):
        postplace.place(MODEL, CLUSTER, groups=32, out=out, **kwargs)
    assert not out.exists()  # a bad flag writes nothing: the same command, corrected, starts afresh


def test_microbatches_on_a_graph_file_is_refused(tmp_path):
    g = OpGraph.build(["a", "b"], [(0, 1, 1e6)], flops=[1e9, 1e9], name="two")
    with pytest.raises(PostplaceError, match="a graph file is one traced step"):
        postplace.place(g, "k80x2", budget=8, microbatches=2)
    with pytest.raises(PostplaceError, match="traces the step again"):
        postplace.place(g, "k80x2", budget=8, microbatches="auto")


def test_a_run_over_m_refuses_another_m_an_edited_plans_file_and_a_smaller_budget_in_one_line(answer, tmp_path, capsys):
    import shutil

    _, out = answer
    copy = tmp_path / "copy"
    shutil.copytree(out, copy)
    assert "started with microbatches 'auto', not 2" in cli_error(
        ["place", "--resume", str(copy), "--microbatches", "2"], capsys
    )
    assert "give at least that much" in cli_error(["place", "--resume", str(copy), "--budget", "50"], capsys)
    plans = json.loads((copy / "plans.json").read_text())
    plans["rounds"][1] = [1, 2]  # two counts kept where halving keeps one
    (copy / "plans.json").write_text(json.dumps(plans))
    assert "not the rounds of this run" in cli_error(["place", "--resume", str(copy)], capsys)
    (copy / "plans.json").write_bytes(b"\xff\xfe")
    assert "plans.json: damaged" in cli_error(["place", "--resume", str(copy)], capsys)


def test_compare_on_a_zoo_model_simulates_data_parallelism_and_the_pipeline_over_m(tmp_path):
    rep = postplace.compare(
        MODEL,
        CLUSTER,
        strategies="data-parallel,pipeline,single",
        budget=8,
        seeds=1,
        size="small",
        out=tmp_path / "cmp",
    )
    rows = {r["strategy"]: r for r in rep["rows"]}
    g2, c = cached_graph(MODEL, "small", microbatches=2), load_cluster(CLUSTER)
    assert rows["data-parallel"]["kind"] == "data-parallel (simulated)"
    assert rows["data-parallel"]["best_step_time_s"] == pytest.approx(simulate_data_parallel(g2, c).step_time)
    assert "m=2" in rows["data-parallel"]["note"]
    from postplace.placers import place_pipeline

    pipes = [
        float(Simulator(g, c).evaluate_ops(place_pipeline(g, c)[None]).step_time[0])
        for g in (cached_graph(MODEL, "small"), g2)
    ]
    assert rows["pipeline"]["best_step_time_s"] == pytest.approx(min(pipes))


def test_compare_and_place_folders_record_their_target_so_report_needs_no_flags(tmp_path):
    from postplace.report import write_report

    g = OpGraph.build(["a", "b", "c"], [(0, 1, 1e6), (1, 2, 1e6)], flops=[1e9, 4e9, 1e9], name="tiny")
    g.save(tmp_path / "tiny.json")
    postplace.compare(
        str(tmp_path / "tiny.json"), "k80x2", strategies="single,random", budget=8, seeds=1, out=tmp_path / "cmp"
    )
    postplace.place(g, "k80x2", budget=8, groups=None, out=tmp_path / "py")  # written from Python
    postplace.compare(
        MODEL,
        CLUSTER,
        strategies="single,pipeline",
        budget=8,
        seeds=1,
        size="small",
        microbatches=2,
        out=tmp_path / "cmp2",
    )
    for folder in ("cmp", "py", "cmp2"):
        assert write_report(tmp_path / folder).exists()
    rep = json.loads((tmp_path / "cmp2" / "compare.json").read_text())
    assert rep["graph"].endswith("mb2-none") and rep["target_spec"]["microbatches"] == 2


def test_a_warm_start_made_at_m_1_is_mapped_to_every_micro_batch_copy(tmp_path):
    g1 = cached_graph(MODEL, "small")
    path = tmp_path / "m1.json"
    path.write_text(json.dumps(dict.fromkeys(g1.names, "gpu1")))
    r = postplace.place(MODEL, CLUSTER, size="small", budget=48, groups=32, warm_start=str(path))
    g2, c = cached_graph(MODEL, "small", microbatches=2), load_cluster(CLUSTER)
    on_gpu1 = np.full(g2.num_ops, c.device_index("gpu1"))
    want = float(Simulator(g2, c).evaluate_ops(on_gpu1[None]).step_time[0])
    assert r.summary["candidates"][f"warm-start:{path} @m2"] == pytest.approx(want)


def test_data_parallelism_is_no_candidate_without_two_micro_batches_and_two_gpus():
    r = postplace.place(MODEL, CLUSTER, size="small", budget=48, groups=32, exclude=["gpu1"])
    names = r.summary["candidates"]
    assert "param-server @m1" not in names and names["param-server @m2"] is None
    assert "fewer than 2 GPUs" in r.summary["candidate_notes"]["param-server @m2"]


def test_stale_searches_in_a_new_folder_are_refused(answer, tmp_path, capsys):
    import shutil

    _, out = answer
    stale = tmp_path / "stale"
    shutil.copytree(out, stale)
    (stale / "run.json").unlink()
    (stale / "plans.json").unlink()
    assert "already holds a run" in cli_error(
        [
            "place",
            MODEL,
            "--size",
            "small",
            "--cluster",
            CLUSTER,
            "--budget",
            "96",
            "--groups",
            "32",
            "--out",
            str(stale),
        ],
        capsys,
    )


def test_simulate_reads_the_micro_batch_count_from_the_placement_file(tmp_path, capsys):
    from postplace.cli import main

    r = postplace.place(MODEL, CLUSTER, size="small", budget=16, groups=32, microbatches=2, out=tmp_path / "m2")
    argv = [
        "postplace",
        "simulate",
        MODEL,
        "--size",
        "small",
        "--cluster",
        CLUSTER,
        "--placement",
        str(tmp_path / "m2" / "placement.json"),
        "--json",
    ]
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr("sys.argv", argv)
        try:
            main()
        except SystemExit as ex:
            assert ex.code in (0, None)
    got = json.loads(capsys.readouterr().out)
    assert got["graph"].endswith("mb2-none")
    assert got["step_time_s"] == pytest.approx(r.summary["best_step_time_s"])


def test_the_counts_reach_the_first_m_whose_micro_batch_fits_beside_the_replicated_state():
    from postplace.api.over_m import fitting_count
    from postplace.testing import star_cluster

    # a -> b: 'a' holds 10 bytes of state and makes a 100-byte activation that 'b' reads
    g = OpGraph.build(
        ["a", "b"], [(0, 1, 100.0)], flops=[1.0, 1.0], output_bytes=[100.0, 0.0], persistent_bytes=[10.0, 0.0]
    )
    for memory, want in ((200.0, 1), (60.0, 2), (40.0, 4), (25.0, 8), (9.0, 1 << 20)):
        # room = memory - 10 of state; the 100-byte activation over m must fit it
        assert fitting_count(g, star_cluster(("gpu", "gpu"), memory=memory)) == want, memory
    assert microbatch_counts(64, 4, fits_at=16) == [1, 2, 4, 8, 16]


def test_a_warm_start_at_the_same_m_with_an_unknown_op_is_refused_not_mapped(tmp_path):
    g1 = cached_graph(MODEL, "small")
    doc = dict.fromkeys(g1.names, "gpu0")
    doc["no_such_op"] = "gpu1"  # a typo, not a copy made at another count
    path = tmp_path / "m1.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(PostplaceError, match="'no_such_op' is not in graph"):
        postplace.place(MODEL, CLUSTER, size="small", budget=8, groups=32, microbatches=1, warm_start=str(path))


def test_a_plan_returned_at_a_pinned_count_names_its_own_step_in_the_summary(tmp_path):
    """At one pinned count the summary's ``graph`` is the step placement.json places: a plan's rewrite
    (``...+zero24``) when a plan answers, as over several counts (it named the traced step)."""
    import postplace

    r = postplace.place(
        "gpt2", "k80x4", size="small@8", microbatches=8, budget=16, out=tmp_path / "run", step=postplace.Step()
    )
    saved = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert saved["graph"] == r.summary["graph"] == r.graph.name
    if r.summary["returned_plan"]:  # today zero2 answers here
        assert r.graph.name.startswith("gpt2-small@8-mb8-none+")
