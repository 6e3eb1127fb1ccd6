"""A strategy over a 3D plan's per-block choices (postplace.placers.layered_search), blocks per stage as a plan
option (stages=), and place --layered (postplace.api.layered)."""

from __future__ import annotations

import itertools
import json
from dataclasses import replace

import numpy as np
import pytest

from postplace.cluster import load_cluster
from postplace.errors import PostplaceError
from postplace.placers.layered import estimate_plan
from postplace.placers.layered_grid import fewest_recomputed
from postplace.placers.layered_search import layered_space, search_plan
from postplace.plans import parse_plan
from tests.test_layered import uniform

GIB = 2**30


def gpus(cluster, k: int) -> list[int]:
    return [d for d, dev in enumerate(cluster.devices) if dev.kind == "gpu"][:k]


def stack(blocks: int = 8):
    """Blocks of equal times whose activations (15 GiB a micro-batch) do not all fit a stage that holds two
    micro-batches of four; recomputing a block keeps 1 GiB of it and runs its forward again."""
    plain = uniform(blocks, 1e-3, 2e-3, 15 * GIB)
    full = replace(
        plain,
        backward_s=plain.backward_s + plain.forward_s,
        activation_bytes=np.where(plain.activation_bytes > 0, 1.0 * GIB, 0.0),
        recompute=True,
    )
    return plain, full


def test_the_space_holds_the_base_and_only_plans_that_cut_every_stage():
    cluster = load_cluster("dgx8")
    plain, full = stack()
    devices = gpus(cluster, 2)
    spec = parse_plan("ddp:pp=2,m=4,schedule=1f1b")
    oom = estimate_plan(plain, cluster, spec, devices)
    assert oom.oom  # two micro-batches of four blocks on the first stage: 120 GiB
    base = estimate_plan(full, cluster, replace(spec, recompute=True), devices)
    space = layered_space(base, replace(spec, recompute=True), plain, full, devices)
    assert space.reach == 3 and space.space.num_units == 8 + 1  # a block's recomputation each, one boundary
    zero = space.decode(np.zeros(space.space.num_units, dtype=np.int64))
    assert zero.recompute and zero.recompute_units is None and zero.stage_blocks == (4, 4)
    again = estimate_plan(space.costs_of(zero), cluster, zero, devices)
    assert again.step_time_s == base.step_time_s and again.peak_bytes == base.peak_bytes
    # every row: a plan whose text parses back to itself, every stage a block, priced as its text says
    seen = set()
    for flips in itertools.product((0, 1), repeat=3):
        for move in range(space.space.allowed[-1].sum()):
            row = np.array([*flips, 0, 0, 0, 0, 0, move])
            plan = space.decode(row)
            assert parse_plan(str(plan)) == plan
            assert sum(plan.stage_blocks) == 8 and min(plan.stage_blocks) >= 1
            seen.add(plan.stage_blocks)
    assert seen == {(4 + k, 4 - k) for k in range(-3, 4)}


def test_the_space_reaches_below_the_grids_uniform_recomputation():
    """Brute force over every plan of a small space: its best fits and is faster than Megatron-LM's
    first-k-blocks-of-every-stage rule the grid uses (which the space holds): the first stage holds two
    micro-batches and needs a block recomputed, the last holds one and needs none. A search finds a plan that
    fits, at or below the base."""
    cluster = load_cluster("dgx8")
    plain, full = stack(6)
    devices = gpus(cluster, 2)
    spec = replace(parse_plan("ddp:pp=2,m=4,schedule=1f1b"), recompute=True)
    base = estimate_plan(full, cluster, spec, devices)
    grid, _ = fewest_recomputed(plain, full, cluster, spec, devices, base.stage_units)
    assert grid is not None and not grid.oom
    space = layered_space(base, spec, plain, full, devices)
    rows = [
        np.array([*flips, move])
        for flips in itertools.product((0, 1), repeat=6)
        for move in range(space.space.allowed[-1].sum())
    ]
    priced = [estimate_plan(space.costs_of(p), cluster, p, devices) for p in map(space.decode, rows)]
    best = min((r for r in priced if not r.oom), key=lambda r: r.step_time_s)
    assert best.step_time_s < grid.step_time_s  # one block recomputed on the first stage, none on the last
    assert any(r.plan == str(replace(parse_plan(grid.plan), stage_blocks=(3, 3))) for r in priced)
    found = search_plan(space, cluster, strategy="post", samples=96, seed=0)
    assert found.result is not None and not found.result.oom
    assert found.result.step_time_s <= base.step_time_s
    assert found.result.step_time_s >= best.step_time_s * (1 - 1e-12)
    assert found.search.origins[0] == "warm"  # the base, told first


def test_ctrl_c_in_the_search_stops_it(monkeypatch):
    """Ctrl-C in a batch of the search over per-block choices propagates (place --layered stops), instead of
    the runner's interrupted result being taken for an answer."""
    from postplace.search import runner

    cluster = load_cluster("dgx8")
    plain, full = stack(6)
    devices = gpus(cluster, 2)
    spec = replace(parse_plan("ddp:pp=2,m=4,schedule=1f1b"), recompute=True)
    space = layered_space(estimate_plan(full, cluster, spec, devices), spec, plain, full, devices)
    one_batch, calls = runner._one_batch, []

    def interrupted(*args):
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return one_batch(*args)

    monkeypatch.setattr(runner, "_one_batch", interrupted)
    with pytest.raises(KeyboardInterrupt):
        search_plan(space, cluster, strategy="post", samples=96, seed=0)


def test_blocks_per_stage_as_a_plan_option():
    from postplace.placers.practitioner import plan_words

    spec = parse_plan("ddp:pp=4,m=32,stages=9/10/10/11")
    assert spec.stage_blocks == (9, 10, 10, 11) and parse_plan(str(spec)) == spec
    assert "1F1B with 9/10/10/11 blocks per stage" in plan_words(spec, [f"gpu{k}" for k in range(8)], 32)
    runs = parse_plan("fsdp:m=8,recompute=blocks.0-3/blocks.7")
    assert runs.recompute_units == ("blocks.0", "blocks.1", "blocks.2", "blocks.3", "blocks.7")
    assert str(runs) == "fsdp:m=8,recompute=blocks.0-3/blocks.7"
    for text, match in [
        ("ddp:stages=3/4", "give pp=P with P >= 2"),
        ("ddp:pp=2,stages=7", "give 2 counts"),
        ("ddp:pp=2,stages=0/7", "at least one each"),
        ("ddp:pp=2,schedule=interleaved-2,stages=3/4", "cuts the blocks evenly"),
        ("fsdp:recompute=blocks.5-2", "ends before it starts"),
        ("fsdp:recompute=a-b", "neither a unit nor a run"),
    ]:
        with pytest.raises(PostplaceError, match=match) as e:
            parse_plan(text)
        assert "\n" not in str(e.value)


def test_the_op_level_and_the_layered_estimate_cut_as_stages_says():
    from postplace.placers.layered import measure_units, plan_costs
    from postplace.placers.practitioner import pipeline_stages, plan_devices, plan_step
    from postplace.plans._step import units
    from postplace.zoo import trace_model

    cluster = load_cluster("dgx8")
    measured = trace_model("llama", "small@2", "adamw", precision="bf16", microbatches=2, layers=4).graph
    whole = trace_model("llama", "small@4", "adamw", precision="bf16", microbatches=4, layers=4).graph
    spec = parse_plan("zero1:pp=2,m=4,stages=1/3")
    devices = plan_devices(cluster, spec)
    stage = pipeline_stages(whole, cluster, spec, [devices[0], devices[len(devices) // 2]])
    of_unit = {u: int(s) for u, s in zip(units(whole), stage.tolist(), strict=True) if u}
    assert sorted(of_unit.items()) == [("blocks.0", 0), ("blocks.1", 1), ("blocks.2", 1), ("blocks.3", 1)]
    costs = plan_costs(spec, lambda r: measure_units(measured, cluster, devices, recompute=r))
    est = estimate_plan(costs, cluster, spec, devices)
    assert [[u for u in c if u.startswith("blocks.")] for c in est.stage_units] == [
        ["blocks.0"],
        ["blocks.1", "blocks.2", "blocks.3"],
    ]
    ref = plan_step(whole, cluster, spec, devices)  # the same cut priced op by op
    assert est.step_time_s == pytest.approx(ref.step_time_s, rel=0.10)
    with pytest.raises(PostplaceError, match="add up to 4"):
        pipeline_stages(whole, cluster, parse_plan("zero1:pp=2,m=4,stages=2/1"), [devices[0], devices[4]])
    with pytest.raises(PostplaceError, match="the model has 4 blocks"):
        estimate_plan(costs, cluster, parse_plan("zero1:pp=2,m=4,stages=2/1"), devices)


@pytest.fixture(scope="module")
def answered():
    from postplace.api.layered import place_layered

    return place_layered(
        "llama", "dgx8", size="small@16", optimizer="adamw", precision="bf16", samples=48, bases=2, seed=0
    )


def test_place_layered_answers_with_the_fastest_plan_that_fits(answered):
    """The answer fits, is at or below best-3d and every family row, and its --plan text prices to the same
    number when the layered estimate prices it again from scratch."""
    from postplace.api.plans import estimate_plan_layered

    r = answered
    names = [c.name for c in r.candidates]
    assert names[:2] == ["search", "best-3d"] and r.returned in names
    fitting = [c for c in r.candidates if c.fits]
    assert r.step_time_s == min(c.step_time_s for c in fitting)
    assert r.peak_bytes <= 80e9
    m = parse_plan(r.plan).microbatches
    again, _, _ = estimate_plan_layered("llama", "dgx8", r.plan, size="small@16", optimizer="adamw", precision="bf16")
    assert again.step_time_s == pytest.approx(r.step_time_s, rel=1e-9) and m in (8, 16)
    # two bases of 24 plans each: 12 around each, then the other 24 around the better one, from its best
    assert [s["round"] for s in r.searches] == [1, 1, 2] and sum(s["samples"] for s in r.searches) == 48
    summary = json.loads(json.dumps(r.summary))
    assert summary["evaluator"].startswith("layered estimate") and summary["plan"] == r.plan


def test_place_layered_cli_prints_the_library_answer(tmp_path):
    from tests.clihelp import run_cli

    args = ["llama", "--size", "small", "--batch", "16", "--cluster", "dgx8", "--optimizer", "adamw"]
    args += ["--precision", "bf16", "--layered", "--budget", "48", "--json", "--out", str(tmp_path / "run")]
    done = run_cli("place", *args)
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert out["returned"] in [c["name"] for c in out["candidates"]]
    assert json.loads((tmp_path / "run" / "layered.json").read_text())["plan"] == out["plan"]


@pytest.mark.parametrize(
    ("argv", "match"),
    [
        (["llama", "--size", "small", "--cluster", "dgx8", "--layered", "--pin", "x=gpu0"], "--layered with --pin"),
        (["llama", "--size", "small", "--cluster", "dgx8", "--layered", "--budget", "60s"], "number of plans"),
        (["resnet50", "--cluster", "dgx8", "--layered"], "made of blocks"),
        (["llama", "--size", "small", "--cluster", "dgx8", "--layered", "--microbatches", "3"], "divides the batch"),
        (
            ["llama", "--size", "small", "--batch", "16", "--cluster", "mixed", "--layered", "--precision", "bf16"],
            "gpu4 (V100-16GB) has no bf16 units",
        ),
        (["nmt2", "--size", "small", "--cluster", "dgx8", "--layered"], "nmt2 has several (dec, enc)"),
        (["llama", "--size", "small", "--cluster", "dgx8", "--layered", "--seed", "-1"], "give an integer >= 0"),
        (["llama", "--size", "small", "--cluster", "dgx8", "--layered", "-s", "bogus"], "unknown strategy"),
    ],
)
def test_place_layered_bad_input_is_one_line(argv, match, capsys):
    from tests.clihelp import cli_error

    assert match in cli_error(["place", *argv], capsys)


@pytest.mark.parametrize(
    ("argv", "match"),
    [
        (["llama", "--size", "small", "--layered", "--strategies", "post,bogus"], "unknown strategy 'bogus'"),
        (["llama", "--size", "small", "--layered", "--expert-split", "x.json"], "--layered with --expert-split"),
        (["llama", "--size", "small", "--layered", "--seeds", "0"], "seeds=0"),
    ],
)
def test_compare_layered_bad_input_is_one_line(argv, match, capsys):
    from tests.clihelp import cli_error

    assert match in cli_error(["compare", *argv, "--cluster", "dgx8"], capsys)


def test_a_block_recomputed_by_the_selective_rule_beats_both_uniform_rules():
    """Four blocks of 20 GiB activations do not fit one GPU (73.6 GiB); one recomputed whole (1 GiB kept, its
    forward again) fits, one by the selective rule (6 GiB kept, 40% of its forward again) fits for less. The
    brute-force best of the space is that one, below the grid's fewest-whole rule and the selective rule on
    every block; its text parses back and prices the same."""
    cluster = load_cluster("dgx8")
    devices = gpus(cluster, 1)
    plain = uniform(4, 1e-3, 2e-3, 20 * GIB)
    act = np.where(plain.activation_bytes > 0, 1.0, 0.0)
    full = replace(plain, backward_s=plain.backward_s + plain.forward_s, activation_bytes=act * GIB, recompute=True)
    sel = replace(
        full, backward_s=plain.backward_s + 0.4 * plain.forward_s, activation_bytes=act * 6 * GIB, selective=True
    )
    spec = parse_plan("ddp+recompute:m=1")
    base = estimate_plan(full, cluster, spec, devices)
    grid, _ = fewest_recomputed(plain, full, cluster, spec, devices, base.stage_units)
    every_sel = estimate_plan(sel, cluster, replace(spec, selective=True), devices)
    space = layered_space(base, spec, plain, full, devices, selective=sel, sharding=False)  # the rules alone
    assert space.space.num_units == 4 and space.space.allowed.all()  # 3 rules a block, no stage to cut
    plans = [space.decode(np.array(row)) for row in itertools.product(range(3), repeat=4)]
    priced = [(estimate_plan(space.costs_of(p), cluster, p, devices), p) for p in plans]
    best, plan = min(((r, p) for r, p in priced if not r.oom), key=lambda x: x[0].step_time_s)
    assert sorted(plan.recompute_rules(space.blocks).values()) == ["", "", "", "selective"]
    assert best.step_time_s < min(grid.step_time_s, every_sel.step_time_s)
    assert parse_plan(str(plan)) == plan and str(plan) == "ddp+selective:m=1,recompute=blocks.3"
    found = search_plan(space, cluster, strategy="post", samples=48, seed=0)
    assert found.result is not None and found.result.step_time_s <= base.step_time_s


def test_tidied_puts_each_stages_rules_in_megatrons_order():
    from postplace.placers.layered_search import tidied

    cluster = load_cluster("dgx8")
    plain, full = stack()
    sel = replace(full, selective=True)
    devices = gpus(cluster, 2)
    spec = replace(parse_plan("ddp:pp=2,m=4,schedule=1f1b"), recompute=True)
    space = layered_space(estimate_plan(full, cluster, spec, devices), spec, plain, full, devices, selective=sel)
    scattered = parse_plan("ddp:pp=2,m=4,stages=3/5,recompute=blocks.2/blocks.7,selective=blocks.1/blocks.4")
    tidy = tidied(space, scattered)
    assert tidy.stage_blocks == (3, 5) and tidy.recompute_units == ("blocks.0", "blocks.3")
    assert tidy.selective_units == ("blocks.1", "blocks.4")


def test_what_the_review_found_stays_fixed():
    """The grid's partial recomputation in a pipeline names its cut (its text prices as the grid priced it); one
    rule over some blocks is +selective (which launch runs); a run of units is bounded; a unit past the model's
    blocks is one line; an interleaved base has no boundary decisions."""
    from postplace.placers.layered import plan_costs

    cluster = load_cluster("dgx8")
    plain, full = stack(6)
    devices = gpus(cluster, 2)
    spec = replace(parse_plan("ddp:pp=2,m=4,schedule=1f1b"), recompute=True)
    base = estimate_plan(full, cluster, spec, devices)
    grid, _ = fewest_recomputed(plain, full, cluster, spec, devices, base.stage_units)
    text = parse_plan(grid.plan)
    assert text.stage_blocks == (3, 3)
    measured = {False: plain, True: full}
    again = estimate_plan(plan_costs(text, lambda r, selective=False: measured[r]), cluster, text, devices)
    assert again.step_time_s == grid.step_time_s and again.peak_bytes == grid.peak_bytes
    one_rule = parse_plan("ddp:m=2,selective=blocks.0")
    assert one_rule.selective and one_rule.recompute_units == ("blocks.0",) and one_rule.selective_units is None
    with pytest.raises(PostplaceError, match="mixes with recompute_units"):
        replace(one_rule, selective_units=("blocks.1",))
    with pytest.raises(PostplaceError, match="at most 4096"):
        parse_plan("fsdp:m=8,recompute=blocks.0-999999999")
    with pytest.raises(PostplaceError, match="'blocks.6' is not a block of the model"):
        plan_costs(parse_plan("ddp:m=4,recompute=blocks.0-9"), lambda r, selective=False: measured[r])
    interleaved = replace(spec, schedule="interleaved-1")
    space = layered_space(estimate_plan(full, cluster, interleaved, devices), interleaved, plain, full, devices)
    assert len(space.base_edges) == 0 and space.space.num_units == 6


def test_compare_layered_cli_gives_each_strategy_the_same_spaces():
    from tests.clihelp import run_cli

    args = ["llama", "--size", "small", "--batch", "16", "--cluster", "dgx8", "--layered", "--budget", "24"]
    done = run_cli("compare", *args, "--seeds", "2", "--strategies", "post,random", "--json")
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert [r["strategy"] for r in out["rows"]] == ["post", "random"]
    for r in out["rows"]:  # every run starts at best-3d: no strategy's own best is slower
        assert len(r["step_time_s"]) == 2 and r["median_s"] <= out["best_3d"]["step_time_s"]
    assert out["evaluator"].startswith("layered estimate")


def test_sharding_only_the_blocks_memory_needs_beats_ddp_and_fsdp():
    """Four blocks of 5 GiB parameters and 10 GiB optimizer state on 8 GPUs, 8 micro-batches each: DDP holds
    84 GiB (over the 73.6 of an H100), FSDP fits but gathers every block twice per micro-batch. The space around
    FSDP holds every sharding of the blocks and the root; its brute-force best shards one block (DDP's one
    all-reduce for the rest), fits, and costs well under half of FSDP's step, as does the plan Post's search
    from FSDP returns; every plan's text parses back to itself."""
    cluster = load_cluster("dgx8")
    devices = gpus(cluster, 8)
    inner = np.array([0.0, 1, 1, 1, 1, 0.0])
    plain = replace(uniform(4, 1e-3, 2e-3, 1 * GIB), param_bytes=5 * GIB * inner, state_bytes=10 * GIB * inner)
    assert estimate_plan(plain, cluster, parse_plan("ddp:m=64"), devices).oom
    spec = parse_plan("fsdp:m=64")
    base = estimate_plan(plain, cluster, spec, devices)
    space = layered_space(base, spec, plain, None, devices)
    assert space.space.num_units == 5 and space.space.allowed.all()  # shard or not: each block, then the root
    assert space.decode(np.zeros(5, dtype=np.int64)) == spec
    assert str(space.decode(np.array([1, 1, 1, 1, 1]))) == "ddp:m=64"
    priced = []
    for row in itertools.product((0, 1), repeat=5):
        plan = space.decode(np.array(row))
        assert parse_plan(str(plan)) == plan
        priced.append((estimate_plan(space.costs_of(plan), cluster, plan, devices), plan))
    best, plan = min(((r, p) for r, p in priced if not r.oom), key=lambda x: x[0].step_time_s)
    assert len([u for u in plan.shard or () if u]) == 1 and best.step_time_s < 0.5 * base.step_time_s
    found = search_plan(space, cluster, strategy="post", samples=48, seed=0)
    assert not found.result.oom and found.result.step_time_s < 0.5 * base.step_time_s
    one = gpus(cluster, 2)  # a tensor group of 2 is one replica: nothing to shard, no decision
    tp2 = parse_plan("ddp:tp=2,m=2")
    alone = layered_space(
        estimate_plan(replace(plain, tensor=2), cluster, tp2, one),
        tp2,
        replace(plain, tensor=2),
        replace(plain, tensor=2, recompute=True),
        one,
    )
    assert not alone.base_sharded and alone.space.num_units == 4
    from postplace.placers.layered_search import tidied

    # tidy: as many blocks sharded, the last ones (the first block's gather would open every forward unhidden)
    assert str(tidied(space, parse_plan("fsdp:m=64,shard=root/blocks.0/blocks.2"))) == (
        "fsdp:m=64,shard=root/blocks.2/blocks.3"
    )
