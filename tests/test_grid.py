"""The practitioner's 3D grid (issue 31 item 3): the shapes a practitioner would try, pruned by hand-checkable
rules, and its best plan where no plain plan fits; the ``best-3d`` row in ``place`` and ``compare``."""

from __future__ import annotations

import pytest

from postplace import zoo
from postplace.cluster import load_cluster
from postplace.placers.grid import best_3d, grid_specs, node_size
from postplace.placers.practitioner import plan_step
from postplace.plans import parse_plan
from postplace.testing import star_cluster

PLAIN = ("ddp", "zero2", "fsdp", "ddp+recompute", "zero2+recompute", "fsdp+recompute")


def gpus(cluster):
    return [d for d, dev in enumerate(cluster.devices) if dev.kind == "gpu"]


def test_a_tensor_group_stays_within_a_node():
    assert node_size(load_cluster("dgx8x2"), gpus(load_cluster("dgx8x2"))) == 8
    assert node_size(load_cluster("dgx8"), gpus(load_cluster("dgx8"))) == 8
    assert node_size(load_cluster("k80x4"), gpus(load_cluster("k80x4"))) == 4


def test_the_grid_is_what_a_practitioner_would_try():
    """LLaMA small has 4 heads in 2 key/value groups (tp at most 2) and 2 blocks (pp at most 2); at m = 8 on
    8 GPUs every shape but tp 1 x pp 1 (the plain plans) is tried, FSDP without a pipeline only, then each tp
    with sequence parallelism."""
    g = zoo.cached_graph("llama", "small", "adamw", microbatches=2)
    c = load_cluster("dgx8")
    specs, notes = grid_specs(g, c, gpus(c), 8)
    assert [str(s) for s in specs] == [
        "zero1:m=8,dp=4,tp=2",
        "fsdp:m=8,dp=4,tp=2",
        "zero1:m=8,dp=4,pp=2,schedule=1f1b",
        "zero1:m=8,dp=2,tp=2,pp=2,schedule=1f1b",
        "zero1:m=8,dp=4,tp=2,sp",
        "fsdp:m=8,dp=4,tp=2,sp",
        "zero1:m=8,dp=2,tp=2,sp,pp=2,schedule=1f1b",
    ]
    specs, notes = grid_specs(g, c, gpus(c), 2)  # dp must divide m, and each pipeline needs pp micro-batches
    assert [str(s) for s in specs] == [] and any("m/dp >= pp" in n for n in notes)
    convs = zoo.cached_graph("resnet50", "small", "sgd")
    specs, notes = grid_specs(convs, load_cluster("k80x4"), gpus(load_cluster("k80x4")), 4)
    assert all(s.tensor is None for s in specs) and "tp: no linear layers to split" in notes


def test_the_grid_finds_a_plan_that_fits_where_no_plain_plan_does():
    g = zoo.cached_graph("llama", "small", "adamw", microbatches=2)
    c = star_cluster(("gpu",) * 4, bandwidth=1e11, memory=2.5e5)
    for name in PLAIN:  # each holds the whole model's activations of a micro-batch, or all its parameters
        assert plan_step(g, c, parse_plan(f"{name}:m=2,dp=2"), [0, 1]).oom, name
    grid = best_3d(g, c, [0, 1, 2, 3])
    assert grid.best is not None and not grid.best.oom
    assert parse_plan(grid.best.plan).tensor == 2
    assert max(grid.best.peak_memory_bytes) <= 2.5e5
    assert grid.best.step_time_s == min(t for _, t in grid.tried if t is not None)
    # on links this fast, normalising half of the tokens beats gathering them again in the backward
    assert grid.best.describe().startswith(
        "fsdp over 4 GPUs (gpu0..gpu3), tp 2 with sequence parallelism x dp 2, 2 micro-batches"
    )


def test_where_a_plan_fits_by_selective_recomputation_the_grid_does_not_recompute_every_op():
    """LLaMA small at tp 2 on GPUs of 160 kB: FSDP holds 183 kB without recomputation, 158 kB recomputing by
    torchtitan's selective rule, 153 kB recomputing every block; the selective plan is the faster of the two
    that fit, so the grid tries it before full recomputation (as the layered grid does), and stops there."""
    g = zoo.cached_graph("llama", "small", "adamw", microbatches=2)
    c = star_cluster(("gpu",) * 4, bandwidth=1e11, memory=1.6e5)
    grid = best_3d(g, c, [0, 1, 2, 3])
    tried = dict(grid.tried)
    assert tried["fsdp:m=2,dp=2,tp=2"] is None  # out of memory
    selective = tried["fsdp+selective:m=2,dp=2,tp=2"]
    assert selective is not None and "fsdp+recompute:m=2,dp=2,tp=2" not in tried
    full = plan_step(g, c, parse_plan("fsdp+recompute:m=2,dp=2,tp=2"), [0, 1, 2, 3])
    assert not full.oom and selective < full.step_time_s
    assert grid.best.step_time_s == min(t for t in tried.values() if t is not None)


def test_compare_and_place_have_the_best_3d_row(tmp_path):
    import postplace

    rep = postplace.compare(
        "llama",
        "k80x4",
        size="small",
        strategies="fsdp,best-3d",
        budget=8,
        seeds=1,
        out=tmp_path / "c",
        step=postplace.Step(optimizer="adamw"),
    )
    rows = {r["strategy"]: r for r in rep["rows"]}
    assert rows["best-3d"]["best_step_time_s"] <= rows["fsdp"]["best_step_time_s"]
    assert "grid plans" in rows["best-3d"]["note"]
    r = postplace.place(
        "llama",
        "k80x4",
        size="small",
        budget=16,
        microbatches=2,
        out=tmp_path / "p",
        report=False,
        step=postplace.Step(optimizer="adamw"),
    )
    cands = r.summary["candidates"]
    best = cands.get("best-3d @m2", cands.get("best-3d"))
    plain = [v for k, v in cands.items() if k.split(" @")[0] in PLAIN and v is not None]
    assert best is not None and best == pytest.approx(min([best, *plain])), cands


def test_a_global_batch_is_part_of_the_size(capsys):
    """``--batch N`` (``SIZE@N``) traces the zoo model at that batch: GPT-2 small at 8 sequences splits into
    8 micro-batches (its own batch of 2 cannot), moving the tokens of 8 sequences; bad batches are one line."""
    import json

    from tests.clihelp import cli_error, run_cli

    own = zoo.cached_graph("gpt2", "small", "adamw")
    big = zoo.cached_graph("gpt2", "small@8", "adamw", microbatches=8)
    assert big.metadata["zoo"]["config"]["batch"] == 8
    embed = lambda g: sum(g.output_bytes[i] for i, n in enumerate(g.names) if n.endswith("embedding"))  # noqa: E731
    assert embed(big) == pytest.approx(4 * embed(own))
    res = run_cli(
        "simulate",
        "gpt2",
        "--size",
        "small",
        "--batch",
        "8",
        "--cluster",
        "k80x4",
        "--plan",
        "ddp:m=8",
        "--optimizer",
        "adamw",
        "--json",
    )
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout)["step_time_s"] > 0
    assert "whole number from 1 to 1048576" in cli_error(
        ["simulate", "gpt2", "--size", "small@0", "--cluster", "k80x4", "--plan", "ddp"], capsys
    )
    assert "give the batch once" in cli_error(
        ["simulate", "gpt2", "--size", "small@4", "--batch", "4", "--cluster", "k80x4", "--plan", "ddp"], capsys
    )


def test_after_an_exclusion_no_tensor_group_straddles_two_nodes():
    from postplace.placers.grid import groups_within_nodes

    c = load_cluster("dgx8x2")
    every = gpus(c)
    assert groups_within_nodes(c, every, 8) and not groups_within_nodes(c, every, 16)
    left = [g for g in every if c.device_names[g] not in ("gpu0", "gpu8")]  # 7 GPUs per node left
    assert not groups_within_nodes(c, left, 2)  # (gpu7, gpu9) would cross the 50 GB/s link
    specs, _ = grid_specs(zoo.cached_graph("llama", "small", "adamw", microbatches=2), c, left, 14)
    assert all(s.tensor is None for s in specs)


def test_a_run_at_a_batch_is_trained_and_reported_at_that_batch(tmp_path, capsys):
    import json

    from postplace.runtime.cli import _size_for
    from postplace.zoo import known_size
    from tests.clihelp import cli_error

    assert known_size("gpt2", "small@8") and not known_size("gpt2", "small@x") and not known_size("gpt2", "tiny")
    (tmp_path / "summary.json").write_text(
        json.dumps({"target_spec": {"kind": "zoo", "name": "gpt2", "size": "small@8"}})
    )
    (tmp_path / "placement.json").write_text("{}")
    assert _size_for("gpt2", str(tmp_path / "placement.json"), None) == "small@8"
    line = cli_error(["place", "--resume", str(tmp_path), "--batch", "8"], capsys)
    assert "drop --batch" in line


def test_the_grid_tries_no_selective_plan_where_the_rule_saves_nothing():
    """GPT-2's projections are addmm and its attention bmm: the selective rule keeps nothing there, so it
    would be full recomputation under another name and another simulation."""
    g = zoo.cached_graph("gpt2", "small", "adamw", microbatches=2)
    c = star_cluster(("gpu",) * 4, bandwidth=1e11, memory=1.9e5)
    grid = best_3d(g, c, [0, 1, 2, 3])
    assert not any("+selective" in plan for plan, _ in grid.tried)
    assert any("+recompute" in plan for plan, _ in grid.tried)
