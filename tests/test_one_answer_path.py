"""One answer path (issue 34 item 15): the features once limited to a pinned micro-batch count (the torch
evaluator, ``--confirm``) work over every count, through the same code as one count."""

from __future__ import annotations

import math

import numpy as np

import postplace
from postplace.cluster.placement import load_placement

SMALL = dict(size="small", groups=6, exclude=["cpu"])  # gpt2 small: batch 2, m in {1, 2}


def _count(label: str) -> int:
    return int(label.rsplit(" @m", 1)[1])


def test_confirm_over_every_count_measures_the_runs_best_each_at_its_own_count(tmp_path, torch_one_thread):
    out = tmp_path / "run"
    r = postplace.place(
        "gpt2",
        "k80x2",
        budget=16,
        out=out,
        microbatches="auto",
        report=False,
        **SMALL,
        measure=postplace.Measure(confirm=3, map_all_to="cpu"),
    )
    s = r.summary
    assert s["microbatch_counts"] == [1, 2]
    rows = s["confirm"]["candidates"]
    assert all(" @m" in x["label"] for x in rows)
    single = [x for x in rows if x["label"].startswith("single:")]
    assert len(single) == 1 and _count(single[0]["label"]) == 1  # the single device, at one micro-batch
    measured = sorted(x["simulated_s"] for x in rows if not x["label"].startswith("single:"))
    assert len(measured) == 3
    pool = sorted({v for k, v in s["candidates"].items() if v is not None and not k.startswith("single:")})
    assert measured[-1] <= pool[2] * (1 + 1e-12)  # the 3 best of the whole run, whichever count they are at
    ran = [x for x in rows if x["measured_s"] is not None]
    fastest = min(ran, key=lambda x: x["measured_s"])
    assert r.returned == "confirmed:" + fastest["label"] and r.step_time_s == fastest["measured_s"]
    m = _count(fastest["label"])
    assert s["microbatches"] == m and len(r.placement) == r.graph.num_ops
    assert int(np.max(r.graph.microbatch)) + 1 == m  # the returned step is traced at that row's count
    assert s["figures"]["best_step_time_s"] == "measured" and s["ratio_to_lower_bound"] is None
    np.testing.assert_array_equal(load_placement(out / "placement.json", r.graph, r.cluster), r.placement)


def test_the_torch_evaluator_searches_and_judges_every_count(tmp_path, torch_one_thread):
    r = postplace.place(
        "gpt2",
        "k80x2",
        budget=8,
        microbatches="auto",
        report=False,
        out=tmp_path / "run",
        **SMALL,
        measure=postplace.Measure(evaluator="torch", map_all_to="cpu"),
    )
    s = r.summary
    assert s["evaluator"] == "torch" and s["figures"]["best_step_time_s"] == "measured"
    assert s["microbatch_counts"] == [1, 2] and all(s["samples_per_microbatches"][m] > 0 for m in ("1", "2"))
    assert all(math.isfinite(v) for v in s["best_per_microbatches"].values())
    # the practitioner plans are priced by the simulator only: never beside measured times
    assert not any(k.split(" @m")[0] in ("ddp", "fsdp", "best-3d") for k in s["candidates"])
    assert r.step_time_s == min(v for v in s["candidates"].values() if v is not None)
    assert (tmp_path / "run" / "m2" / "history.jsonl").exists()


def test_confirm_knows_each_candidates_count_whatever_its_name(tmp_path, torch_one_thread):
    """A warm start whose path holds " @m" (the suffix of a candidate's count) was parsed as a count: a
    ValueError from int('/placement.json')."""
    from postplace.cluster import load_cluster
    from postplace.cluster.placement import save_placement, single_device
    from postplace.zoo import cached_graph

    g, c = cached_graph("gpt2", "small", microbatches=2), load_cluster("k80x2")
    (tmp_path / "w @m").mkdir()
    save_placement(tmp_path / "w @m" / "placement.json", g, c, single_device(g, c, "gpu1"))
    r = postplace.place(
        "gpt2",
        "k80x2",
        budget=8,
        microbatches=2,
        out=tmp_path / "run",
        report=False,
        warm_start=str(tmp_path / "w @m" / "placement.json"),
        **SMALL,
        measure=postplace.Measure(confirm=2, map_all_to="cpu"),
    )
    assert r.returned.startswith("confirmed:") and r.summary["microbatches"] == 2
    assert (
        any(x["label"].startswith("warm-start:") for x in r.summary["confirm"]["candidates"])
        or r.summary["candidates"][f"warm-start:{tmp_path / 'w @m' / 'placement.json'}"] is not None
    )


def test_a_module_run_measured_for_real_cannot_be_continued_without_its_code(tmp_path, torch_one_thread):
    """Resuming it reached TorchEvaluator.for_zoo with a module's record: KeyError 'name' (a traceback)."""
    import pytest
    import torch

    from postplace.errors import PostplaceError

    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    x, y = torch.randn(4, 8), torch.randn(4, 1)
    postplace.place(
        model,
        "k80x2",
        budget=2,
        groups=3,
        strategy="random",
        out=tmp_path / "run",
        report=False,
        step=postplace.Step(inputs=(x,), targets=(y,), loss_fn=torch.nn.functional.mse_loss),
        measure=postplace.Measure(evaluator="torch", map_all_to="cpu"),
    )
    with pytest.raises(PostplaceError, match="a module's run folder keeps its graph, not the module"):
        postplace.resume(tmp_path / "run", budget=4, report=False)
