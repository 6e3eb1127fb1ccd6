"""The layered estimate and its search on GPUs of several models (postplace.placers.layered, layered_search)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from postplace.cluster import load_cluster
from postplace.errors import PostplaceError
from postplace.placers.grid import groups_within_nodes
from postplace.placers.layered import estimate_plan, measure_units, measured_rule, op_level_cut, plan_costs
from postplace.placers.layered_search import SHARES, apportion, layered_space, search_plan
from postplace.placers.practitioner import plan_devices, plan_step
from postplace.plans import parse_plan


@pytest.fixture(scope="module")
def mixed():
    """LLaMA small with 6 blocks in fp16 (V100s have no bf16) on ``mixed``: 4 A100 and 4 V100, the two groups
    joined over PCIe only; the units measured on both models."""
    from postplace.zoo import trace_model

    measured = trace_model("llama", "small@2", "adamw", precision="fp16", microbatches=2, layers=6).graph
    whole = trace_model("llama", "small@8", "adamw", precision="fp16", microbatches=8, layers=6).graph
    cluster = load_cluster("mixed")
    gpus = [d for d, dev in enumerate(cluster.devices) if dev.kind == "gpu"]
    costs = {}

    def at(recompute, selective=False, tp=1):
        rule = "selective" if selective else "full" if recompute else ""
        if (tp, rule) not in costs:
            costs[tp, rule] = measured_rule(measured, cluster, gpus, rule, tensor=tp)
        return costs[tp, rule]

    return whole, cluster, at


@pytest.mark.parametrize(
    "text",
    [
        "ddp:m=8",
        "fsdp:m=8",
        "zero1:pp=2,m=8",
        "ddp:pp=2,m=8,schedule=gpipe",
        "zero1:pp=2,m=8,stages=2/4",
        "ddp:tp=2,pp=2,m=8",
    ],
)
def test_the_estimate_agrees_with_the_op_level_on_two_gpu_models(mixed, text):
    """Each stage runs at its slowest GPU's measured times: within 12% of the op-level simulation, where every
    GPU runs at its own speed and the collectives wait for the slowest (FSDP, the farthest, is 10.2% low: its
    gathers cross the PCIe link between the groups)."""
    whole, cluster, at = mixed
    spec = parse_plan(text)
    devices = plan_devices(cluster, spec)
    costs = plan_costs(spec, lambda recompute, selective=False: at(recompute, selective, spec.tensor or 1))
    cut = op_level_cut(whole, cluster, spec, devices, costs.names) if spec.pipeline and not spec.stage_blocks else None
    est = estimate_plan(costs, cluster, spec, devices, cut=cut)
    ref = plan_step(whole, cluster, spec, devices)
    assert est.step_time_s == pytest.approx(ref.step_time_s, rel=0.12)


def test_a_stage_on_the_faster_gpus_takes_more_blocks(mixed):
    """The A100 stage holding 4 of 6 blocks beats it holding 2, in the estimate and op by op alike."""
    whole, cluster, at = mixed
    times = {}
    for stages in ("4/2", "2/4"):
        spec = parse_plan(f"zero1:pp=2,m=8,stages={stages}")
        devices = plan_devices(cluster, spec)
        est = estimate_plan(at(False), cluster, spec, devices)
        times[stages] = (est.step_time_s, plan_step(whole, cluster, spec, devices).step_time_s)
    assert times["4/2"][0] < 0.9 * times["2/4"][0] and times["4/2"][1] < 0.9 * times["2/4"][1]


def test_units_not_measured_on_a_plan_gpu_model_are_refused(mixed):
    whole, cluster, _ = mixed
    h100 = load_cluster("dgx8")
    from postplace.zoo import trace_model

    measured = trace_model("llama", "small@2", "adamw", precision="fp16", microbatches=2, layers=6).graph
    costs = measure_units(measured, h100, [1, 2])
    spec = parse_plan("ddp:m=8")
    with pytest.raises(PostplaceError, match="measured on H100 GPUs, not on A100-40GB") as e:
        estimate_plan(costs, cluster, spec, plan_devices(cluster, spec))
    assert "\n" not in str(e.value)
    with pytest.raises(PostplaceError, match="tp=8: only 4 of the GPUs are A100-40GBs"):
        measured_rule(measured, cluster, plan_devices(cluster, spec), "", tensor=8)


def test_the_share_space_finds_the_best_cut_and_the_search_reaches_it(mixed):
    """On GPUs of two models each stage's decision is its share of the blocks (and whether they recompute
    whole): every row cuts every stage; the best of all rows (brute force over the stage decisions) gives
    the A100 stage more blocks and beats the grid's even cut; local moves reach it in 96 plans."""
    whole, cluster, at = mixed
    spec = parse_plan("zero1:pp=2,m=8,stages=3/3")
    devices = plan_devices(cluster, spec)
    base = estimate_plan(at(False), cluster, spec, devices)
    space = layered_space(base, spec, at(False), at(True), devices, selective=at(True, True))
    assert space.per_stage and space.space.num_units == 6 + 2
    assert space.space.allowed[-1].sum() == 2 * len(SHARES)
    best = None
    for a, b in itertools.product(range(2 * len(SHARES)), repeat=2):
        row = np.array([0] * 6 + [a, b])
        plan = space.decode(row)
        assert sum(plan.stage_blocks) == 6 and min(plan.stage_blocks) >= 1
        r = estimate_plan(space.costs_of(plan), cluster, plan, devices)
        if not r.oom and (best is None or r.step_time_s < best[1].step_time_s):
            best = (plan, r)
    plan, r = best
    assert plan.stage_blocks[0] > plan.stage_blocks[1] and r.step_time_s < 0.95 * base.step_time_s
    found = search_plan(space, cluster, strategy="local", samples=96, seed=0)
    assert found.result.step_time_s <= r.step_time_s * 1.001


@pytest.mark.parametrize(
    ("weights", "total"), [([1.0, 1.0, 1.0], 7), ([5.0, 1.0, 1.0, 1.0], 4), ([1.5625, 0.41], 80), ([0.3, 9.0], 2)]
)
def test_apportion_shares_every_block_and_leaves_no_stage_empty(weights, total):
    counts = apportion(np.array(weights), total)
    exact = np.array(weights) / sum(weights) * total
    assert counts.sum() == total and counts.min() >= 1
    if exact.min() >= 1:  # no stage lifted to its one block: each within a block of its exact share
        assert np.all(np.abs(counts - exact) < 1)


def test_tensor_groups_stay_within_each_generations_nodes():
    """A node of slower NVLink is still a node: tp=8 on the A100 nodes of mixed8x8, tp=4 within each group of
    mixed, but not tp=8 across mixed's two groups (joined over PCIe)."""
    big, small = load_cluster("mixed8x8"), load_cluster("mixed")
    gpus_big = [d for d, dev in enumerate(big.devices) if dev.kind == "gpu"]
    gpus_small = [d for d, dev in enumerate(small.devices) if dev.kind == "gpu"]
    assert groups_within_nodes(big, gpus_big, 8)
    assert groups_within_nodes(small, gpus_small, 4) and not groups_within_nodes(small, gpus_small, 8)
    # a GPU left alone in its node by --exclude: its fastest link is still its node's, so no group with it holds
    two = load_cluster("dgx8x2")
    gone = {"gpu1", "gpu2", "gpu3", "gpu4", "gpu5", "gpu6", "gpu7", "gpu15"}
    kept = [d for d, dev in enumerate(two.devices) if dev.kind == "gpu" and two.device_names[d] not in gone]
    assert not any(groups_within_nodes(two, kept, t) for t in (2, 4, 8))


def test_place_layered_on_two_gpu_models_searches_a_pipeline_and_reprices_its_answer():
    """On GPUs of several models the fastest pipeline of the grid is searched too (its cut may move toward the
    faster GPUs), and the answer's --plan prices to the same number from scratch."""
    from postplace.api.layered import place_layered
    from postplace.api.plans import estimate_plan_layered

    kw = {"size": "small@16", "optimizer": "adamw", "precision": "fp16"}
    r = place_layered("llama", "mixed", samples=48, bases=2, seed=0, **kw)
    assert any(parse_plan(s["base"]).pipeline for s in r.searches)
    assert sum(s["samples"] for s in r.searches) == 48
    again, _, _ = estimate_plan_layered("llama", "mixed", r.plan, **kw)
    assert again.step_time_s == pytest.approx(r.step_time_s, rel=1e-9)


def test_a_pipeline_without_stages_balances_each_stage_on_its_own_gpus_and_grid_texts_name_their_cut(mixed):
    """Without ``stages=`` the layered estimate balances the stages' times, each on its own GPUs: six blocks
    that take twice as long on the V100 stage are cut 4/2 (4t against 2 x 2t). A grid plan's text names its
    cut (``stages=``), so it prices the same again on either level, whatever each level would cut by itself."""
    from dataclasses import replace

    from postplace.placers.layered_grid import layered_grid
    from postplace.zoo import trace_model
    from tests.test_layered import uniform

    whole, cluster, at = mixed
    fast = replace(uniform(6, 1e-3, 2e-3, 1.0), model="A100-40GB")
    costs = replace(fast, by_model=(("V100-16GB", replace(uniform(6, 2e-3, 4e-3, 1.0), model="V100-16GB")),))
    r = estimate_plan(costs, cluster, parse_plan("ddp:pp=2,dp=1,m=4"), [1, 5])
    assert [sum(u.startswith("blocks.") for u in s) for s in r.stage_units] == [4, 2]
    measured = trace_model("llama", "small@2", "adamw", precision="fp16", microbatches=2, layers=6).graph
    devices = plan_devices(cluster, parse_plan("ddp:m=8"))
    grid = layered_grid(measured, cluster, devices, 8)
    pipes = [r for r in grid.tried if parse_plan(r.plan).pipeline and "interleaved" not in r.plan]
    assert pipes and all("stages=" in r.plan for r in pipes)
    spec = parse_plan(pipes[0].plan)
    tp = spec.tensor or 1
    again = estimate_plan(plan_costs(spec, lambda rc, selective=False: at(rc, selective, tp)), cluster, spec, devices)
    assert again.step_time_s == pipes[0].step_time_s


def test_the_stage_that_overflows_its_own_gpus_is_the_one_named():
    """Stage 0 on an A100 (36 GiB usable) holds 30 GiB and fits; stage 1 on a V100 (14 GiB) holds 15 GiB and does
    not: the plan is out of memory and its peak is stage 1's. Costs that say not which GPU model they were
    measured on are refused on GPUs of two models."""
    from dataclasses import replace

    from tests.test_layered import uniform

    cluster = load_cluster("mixed")
    gib = 2**30
    fast = replace(uniform(4, 1e-3, 2e-3, 7.5 * gib), model="A100-40GB")
    slow = replace(uniform(4, 2e-3, 4e-3, 7.5 * gib), model="V100-16GB")
    costs = replace(fast, by_model=(("V100-16GB", slow),))
    spec = parse_plan("ddp:pp=2,dp=1,m=4,stages=2/2")
    r = estimate_plan(costs, cluster, spec, [1, 5])
    assert r.oom and r.peak_stage == 1 and r.stage_peaks[0] > r.stage_peaks[1]
    assert r.peak_bytes == pytest.approx(15 * gib)
    with pytest.raises(PostplaceError, match="say not which they were measured on"):
        estimate_plan(replace(fast, model=""), cluster, spec, [1, 5])
