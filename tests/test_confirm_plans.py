"""``--confirm K --confirm-with launch`` measures the practitioner plans too (issue 33): ddp, zero, fsdp
(recomputed or not), the hybrid and ``best-3d`` join the top-K pool by simulated time, each launched as
``launch_plan`` runs it on the step traced at its count; a plan the launcher refuses is a failed row
with its reason; a plan that wins is returned with its own step (``returned_plan``, placement.json)."""

import json
import types

import numpy as np
import pytest

import postplace
from postplace.api.plans import simulate_plan
from postplace.api.result import Candidate
from postplace.cluster.placement import load_placement
from postplace.confirm import confirm_plans
from postplace.errors import PostplaceError
from postplace.report import write_report
from postplace.runtime.launch_measure import LaunchEvaluator

pytestmark = pytest.mark.usefixtures("torch_one_thread")

SIZE = "small@4"  # a batch of 4: m = 2 runs the plans over both GPUs of k80x2
TP = "ddp:tp=2,m=2,dp=1,shard=root"  # a per-unit hybrid over one tensor group: it shards nothing, launch refuses it


def _place(out, k, **kw):
    return postplace.place(
        "gpt2",
        "k80x2",
        size=SIZE,
        budget=kw.pop("budget", 8),
        groups=6,
        strategy="random",
        out=out,
        exclude=["cpu"],
        report=False,
        measure=postplace.Measure(confirm=k, **kw.pop("measure", {"confirm_with": "launch"})),
        **kw,
    )


def _forced_tp(monkeypatch):
    """``best-3d`` replaced by the tensor-parallel plan, simulated as it is, but placed first in the pool."""
    tp = simulate_plan("gpt2", "k80x2", TP, size=SIZE, exclude=["cpu"])

    def grid(problem, plans, **kw):
        return [Candidate("best-3d", tp.placement, 1e-9, True, "forced into the pool", tp.graph, TP)]

    monkeypatch.setattr("postplace.api.run.grid_candidate", grid)


def test_plans_are_launched_beside_the_placements_and_a_refused_plan_is_a_failed_row(tmp_path, monkeypatch):
    """K = 2 at m = 2: the forced tp plan (refused in one line before any process starts) and the
    simulator's best plan (fsdp, launched over gpu0 and gpu1), then the best single device."""
    _forced_tp(monkeypatch)
    r = _place(tmp_path / "run", 2, microbatches=2)
    rows = {x["label"]: x for x in r.summary["confirm"]["candidates"]}
    assert list(rows) == ["best-3d", "fsdp", "single:gpu0"], list(rows)
    tp = rows["best-3d"]
    assert tp["plan"] == TP and tp["status"] == "failed" and tp["measured_s"] is None and "launch" not in tp
    assert "shards over replicas of the 2-GPU group" in tp["reason"] and "\n" not in tp["reason"]
    fsdp = rows["fsdp"]
    assert fsdp["plan"] == "fsdp:m=2,dp=2" and fsdp["status"] == "ok" and fsdp["measured_s"] > 0
    assert fsdp["launch"]["ranks"] == {"0": "gpu0", "1": "gpu1"}  # one process per GPU of the plan
    assert set(fsdp["launch"]["rank_step_s"]) == {"gpu0", "gpu1"}
    assert fsdp["measured_s"] >= max(fsdp["launch"]["rank_step_s"].values()) - 1e-12  # the slowest rank's
    assert fsdp["simulated_s"] == r.summary["candidates"]["fsdp"]  # the plan's simulated time, as listed
    assert "plan" not in rows["single:gpu0"]
    # the plans are candidates of the run, as without --confirm (their figures simulated)
    assert {"ddp", "zero2", "fsdp+recompute"} <= set(r.summary["candidates"])
    assert r.summary["figures"]["candidates"] == "simulated"
    fastest = min((x for x in rows.values() if x["status"] == "ok"), key=lambda x: x["measured_s"])
    assert r.returned == "confirmed:" + fastest["label"] and r.step_time_s == fastest["measured_s"]
    assert r.summary["returned_plan"] == fastest.get("plan")


class FakeLaunches:
    """``launch`` and ``launch_plan`` without processes: every op-level placement takes 1 s a step, plan
    ``fast`` 1 ms (its second rank the slower), every other plan 2 ms."""

    def __init__(self, fast):
        self.fast, self.plans = fast, []

    def launch(self, traced, dev, names, **kw):
        return types.SimpleNamespace(step_times_s={0: [1.0] * kw["steps"]}, ranks={0: names[int(dev[0])]})

    def launch_plan(self, traced, plan, cluster, **kw):
        self.plans.append(plan)
        t = 1e-3 if plan == self.fast else 2e-3
        steps = kw["steps"]
        return types.SimpleNamespace(
            step_times_s={0: [0.5 * t] * steps, 1: [5.0] + [t] * (steps - 1)}, ranks={0: "gpu0", 1: "gpu1"}
        )


def test_a_plan_that_measures_fastest_is_returned_with_its_own_step(tmp_path, monkeypatch):
    """Over m = 1, 2 and 4: ddp at m = 2 measures fastest (launches faked), so the run returns it:
    ``returned_plan`` names it and placement.json, the plan line and every simulated figure are the
    plan's step's, as ``simulate --plan`` times it."""
    fake = FakeLaunches("ddp:m=2,dp=2")
    monkeypatch.setattr("postplace.runtime.launcher.launch", fake.launch)
    monkeypatch.setattr("postplace.runtime.launcher.launch_plan", fake.launch_plan)
    out = tmp_path / "run"
    r = _place(out, 20, microbatches="auto", budget=9)
    assert r.summary["microbatch_counts"] == [1, 2, 4]
    rows = r.summary["confirm"]["candidates"]
    labels = [x["label"] for x in rows]
    assert "ddp @m2" in labels and "single:gpu0 @m1" in labels, labels
    assert len(fake.plans) == len(set(fake.plans)) >= 2  # one launch per distinct plan
    assert all(x["launch"] and x["status"] == "ok" for x in rows)
    assert r.returned == "confirmed:ddp @m2" and r.step_time_s == 1e-3  # the slowest rank's median
    assert r.evaluator == "launch" and r.summary["figures"]["best_step_time_s"] == "measured"
    ref = simulate_plan("gpt2", "k80x2", "ddp:m=2,dp=2", size=SIZE, exclude=["cpu"])
    saved = json.loads((out / "summary.json").read_text())
    assert r.summary["returned_plan"] == saved["returned_plan"] == "ddp:m=2,dp=2"
    assert saved["microbatches"] == 2 and saved["graph"] == ref.graph.name
    assert r.graph.num_ops == ref.graph.num_ops > 2 * 200  # the plan's step, not the traced one
    assert len(json.loads((out / "placement.json").read_text())) == ref.graph.num_ops
    np.testing.assert_array_equal(load_placement(out / "placement.json", r.graph, r.cluster), ref.placement)
    assert saved["simulated_step_time_s"] == ref.step_time_s
    assert saved["plan"] == "ddp over 2 GPUs (gpu0, gpu1), 2 micro-batches"
    assert write_report(out).exists()  # the report re-applies the plan to the step and reads placement.json


def test_confirmed_in_process_leaves_the_plans_out(tmp_path):
    """``--confirm-with process`` (the default): one process cannot run a plan's replicas, so the plans
    are neither candidates nor measured rows, as before."""
    r = _place(tmp_path / "run", 1, microbatches=2, measure={"map_all_to": "cpu"})
    assert not set(r.summary["candidates"]) & {"ddp", "zero2", "fsdp", "best-3d", "hybrid"}
    assert all("plan" not in x for x in r.summary["confirm"]["candidates"])
    assert r.summary["returned_plan"] is None


def test_a_plan_the_launcher_cannot_run_is_a_failed_row_never_an_exception():
    ev = LaunchEvaluator.for_zoo("gpt2", SIZE, "k80x2", microbatches=2)
    res = ev.evaluate_plans([TP, "ddp:m=4,dp=2", "ddp:pp=2,zero"])
    assert res.failed.all() and not np.isfinite(res.step_time).any()
    tp, other_m, bad = res.reasons
    assert "shards over replicas of the 2-GPU group" in tp
    assert "for 4 micro-batches" in other_m and "traced as 2" in other_m
    assert bad.startswith("--plan 'ddp:pp=2,zero'")
    assert res.extra["launch"] == [None, None, None]
    names_only = LaunchEvaluator(ev.traced, ["cpu", "gpu0", "gpu1"])
    assert names_only.evaluate_plans(["ddp:m=2,dp=2"]).reasons == [
        "plan 'ddp:m=2,dp=2': launching a plan needs the Cluster, not only its device names"
    ]
    plan = Candidate("ddp", np.zeros(3, dtype=np.int64), 1.0, True, "", None, "ddp:m=2,dp=2")
    with pytest.raises(PostplaceError, match="measures op-level placements only.*--confirm-with launch"):
        confirm_plans(types.SimpleNamespace(name="torch"), [("ddp", plan)])
    (row,) = confirm_plans(ev, [("tp", Candidate("tp", np.zeros(3, dtype=np.int64), 1.0, True, "", None, TP))])
    assert row.status == "failed" and row.plan == TP and row.to_dict()["plan"] == TP


def test_a_plan_placed_off_the_gpus_launch_would_use_is_a_failed_row_not_launched():
    """``--exclude gpu0`` on k80x4: ``ddp:m=2,dp=2`` is placed on gpu1 and gpu2, but launch_plan runs a
    plan on the cluster's first GPUs (gpu0, gpu1): measuring it there would time the excluded GPU."""
    from postplace.cluster import load_cluster

    cluster = load_cluster("k80x4")
    launched = []

    def evaluate_plans(plans):
        launched.extend(plans)
        n = len(plans)
        return types.SimpleNamespace(
            failed=np.zeros(n, bool), oom=np.zeros(n, bool), step_time=np.ones(n), reasons=[None] * n, extra=None
        )

    measurer = types.SimpleNamespace(name="launch", cluster=cluster, evaluate_plans=evaluate_plans)
    off = Candidate("ddp", np.array([2, 3, 2]), 1.0, True, "", None, "ddp:m=2,dp=2")
    on = Candidate("zero2", np.array([1, 2, 1]), 2.0, True, "", None, "zero2:m=2,dp=2")
    (a, b) = confirm_plans(measurer, [("ddp", off), ("zero2", on)])
    assert launched == ["zero2:m=2,dp=2"]
    assert a.status == "failed" and "gpu0" in a.reason and "\n" not in a.reason and a.plan == "ddp:m=2,dp=2"
    assert b.status == "ok" and b.measured_s == 1.0
    # a measurer told what --exclude left out (LaunchEvaluator(exclude=), as confirm makes it) launches the plan
    # on the GPUs it was placed on: nothing is refused
    launched.clear()
    measurer.exclude = ("gpu0",)
    (a,) = confirm_plans(measurer, [("ddp", off)])
    assert launched == ["ddp:m=2,dp=2"] and a.status == "ok"
