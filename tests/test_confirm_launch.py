"""``--confirm K --confirm-with launch`` (issue 33 item 3): the simulator's best few placements measured
by launching each as one process per device (gloo: CPU processes standing in for the devices), the
fastest measured one returned; a placement that cannot be launched is a failed row with its reason."""

import json
import os

import numpy as np
import pytest
import torch
from torch import nn

import postplace
from postplace.cluster import load_cluster
from postplace.cluster.placement import colocation_representative, load_placement
from postplace.confirm import confirm
from postplace.errors import PostplaceError
from postplace.graph.trace_torch import trace
from postplace.runtime.launch_measure import LaunchEvaluator, launched_step_time
from postplace.search import make_problem
from tests.clihelp import cli_error

pytestmark = pytest.mark.usefixtures("torch_one_thread")

ON_CPU = "CPU processes (gloo) standing in for the devices"


def test_place_confirm_with_launch_measures_each_candidate_in_launched_processes(tmp_path):
    """Each row ran as one process per device it uses: its ranks are those devices, its step time the
    slowest rank's (never below a rank's own median); the fastest measured is returned and written."""
    out = tmp_path / "run"
    r = postplace.place(
        "gpt2",
        "k80x2",
        size="small",
        budget=24,
        groups=6,
        strategy="random",
        out=out,
        exclude=["cpu"],
        report=False,
        measure=postplace.Measure(confirm=2, confirm_with="launch"),
    )
    c = r.summary["confirm"]
    assert c["evaluator"] == "launch" and c["measured_on"] == ON_CPU
    rows = c["candidates"]
    assert len(rows) == 3  # the two best candidates and the best single device
    ran = [x for x in rows if x["status"] == "ok"]
    assert ran, rows
    for x in ran:
        launched = x["launch"]
        assert x["measured_s"] > 0 and launched["steps"] > launched["timed_steps"] >= 1
        assert set(launched["rank_step_s"]) == set(launched["ranks"].values()) <= {"gpu0", "gpu1"}
        assert all(t > 0 for t in launched["rank_step_s"].values())
        assert x["measured_s"] >= max(launched["rank_step_s"].values()) - 1e-12  # the slowest rank's
    single = next(x for x in rows if "single:" in x["label"])
    assert len(single["launch"]["ranks"]) == 1  # one device: one process
    fastest = min(ran, key=lambda x: x["measured_s"])
    assert r.returned == "confirmed:" + fastest["label"] and r.step_time_s == fastest["measured_s"]
    assert r.evaluator == "launch" and r.summary["evaluator"] == "launch"
    assert r.summary["figures"]["best_step_time_s"] == "measured"
    np.testing.assert_array_equal(load_placement(out / "placement.json", r.graph, r.cluster), r.placement)
    assert json.loads((out / "summary.json").read_text())["confirm"]["measured_on"] == ON_CPU


class Tiny(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(6, 16), nn.Linear(16, 3)

    def forward(self, x):
        return self.b(torch.relu(self.a(x)))


class FailTwoRanks:
    """The traced batch every step, except in a world of two processes, where rank 1 fails at once."""

    def __call__(self, inputs):
        if os.environ.get("WORLD_SIZE") == "2" and os.environ.get("RANK") == "1":
            raise RuntimeError("rank 1 cannot read its batch")
        return list(inputs.batch or inputs.inputs)


def test_a_placement_that_cannot_launch_is_a_failed_row_with_its_reason():
    torch.manual_seed(0)
    tr = trace(Tiny(), (torch.randn(8, 6),), nn.functional.mse_loss, targets=(torch.randn(8, 3),))
    c = load_cluster("k80x2")  # cpu, gpu0, gpu1
    n = tr.graph.num_ops
    split = np.random.default_rng(0).integers(1, 3, n)[colocation_representative(tr.graph)]
    assert set(split.tolist()) == {1, 2}
    measurer = LaunchEvaluator(tr, c, steps=3, discard=1, batches=FailTwoRanks(), timeout=20)
    res = confirm(
        make_problem(tr.graph, c, groups=None).simulator, measurer, np.stack([split, np.full(n, 1)]), single=False
    )
    bad, good = res.rows
    assert bad.status == "failed" and not np.isfinite(bad.measured_s) and bad.launch is None
    assert bad.reason.startswith("launch failed:") and "rank 1 cannot read its batch" in bad.reason
    assert good.status == "ok" and good.measured_s > 0 and good.launch["ranks"] == {"0": "gpu0"}
    assert res.best is good and res.measured_on == ON_CPU and res.evaluator == "launch"
    text = res.format()
    assert f"measured on: {ON_CPU}" in text and "failed (launch failed:" in text
    d = res.to_dict()
    assert d["candidates"][0]["measured_s"] is None and "launch" not in d["candidates"][0]
    # refused before any process starts: devices the cluster lacks
    out = measurer.evaluate_ops(np.full((1, n), 7))
    assert out.failed[0] and out.reasons[0] == "device ids must be 0..2"


def test_the_step_time_is_the_median_of_the_slowest_ranks_steps_after_the_warm_up():
    times = {0: [5.0, 1.0, 4.0, 1.0, 1.0], 1: [6.0, 2.0, 1.0, 3.0, 1.0]}
    assert launched_step_time(times, 2) == 3.0  # steps 2..4: max 4, 3, 1
    assert launched_step_time(times, 0) == 3.0  # max 6, 2, 4, 3, 1
    assert launched_step_time({0: [2.0]}, 0) == 2.0
    with pytest.raises(PostplaceError, match="no step after the first 1"):
        launched_step_time({0: [2.0]}, 1)
    tr = trace(Tiny(), (torch.randn(4, 6),), nn.functional.mse_loss, targets=(torch.randn(4, 3),))
    with pytest.raises(PostplaceError, match=r"steps \(2\) must exceed discard \(2\)"):
        LaunchEvaluator(tr, load_cluster("k80x2"), steps=2, discard=2)
    with pytest.raises(PostplaceError, match="backend 'mpi'"):
        LaunchEvaluator(tr, load_cluster("k80x2"), backend="mpi")


@pytest.mark.parametrize(
    ("kw", "match"),
    [
        ({"confirm": 2, "confirm_with": "processes"}, r"--confirm-with 'processes': use process .* or launch"),
        ({"confirm_with": "launch"}, "give --confirm K too"),
        ({"confirm": 2, "confirm_with": "launch", "ray": "local"}, "--ray does not apply"),
        ({"confirm": 2, "confirm_with": "launch", "map_all_to": "cuda:0"}, "--map-all-to cuda:0 does not apply"),
    ],
)
def test_a_bad_confirm_with_is_one_line(kw, match):
    with pytest.raises(PostplaceError, match=match):
        postplace.Measure(**kw)


def test_the_cli_refuses_a_bad_confirm_with_in_one_line_before_tracing(capsys, tmp_path):
    line = cli_error(["place", "gpt2", "--size", "small", "--confirm", "1", "--confirm-with", "lanch"], capsys)
    assert "--confirm-with 'lanch'" in line and "process" in line and "launch" in line
    line = cli_error(["place", "gpt2", "--confirm", "1", "--confirm-with", "launch", "--ray", "local"], capsys)
    assert "--ray does not apply" in line
    with pytest.raises(PostplaceError, match="confirm_with is part of measure="):
        postplace.place("gpt2", "k80x2", size="small", out=tmp_path / "r", confirm_with="launch")


def test_a_run_folder_from_before_resumes_confirmed_by_launch(tmp_path):
    """run.json does not record how a run is confirmed (as it does not record --confirm K): a folder
    written without it resumes with --confirm-with launch, and its settings stay as they were."""
    out = tmp_path / "run"
    postplace.place(
        "gpt2", "k80x2", size="small", budget=8, groups=6, strategy="random", out=out, exclude=["cpu"], report=False
    )
    before = json.loads((out / "run.json").read_text())
    assert not any("confirm" in k for k in before)
    r = postplace.resume(out, budget=16, report=False, measure=postplace.Measure(confirm=1, confirm_with="launch"))
    assert r.summary["samples"] == 16
    c = r.summary["confirm"]
    assert c["evaluator"] == "launch" and c["measured_on"] == ON_CPU
    assert all(x["launch"]["rank_step_s"] for x in c["candidates"] if x["status"] == "ok")
    after = json.loads((out / "run.json").read_text())
    assert {k: v for k, v in after.items() if k not in ("budget", "budgets_before", "checksum")} == {
        k: v for k, v in before.items() if k not in ("budget", "budgets_before", "checksum")
    }
