"""The layered estimate (postplace.placers.layered): schedules against their formulas, and the estimate held
against the op-level simulation of the same plans where both run."""

from __future__ import annotations

import numpy as np
import pytest

from postplace.cluster import load_cluster
from postplace.errors import PostplaceError
from postplace.placers.layered import (
    POST,
    PRE,
    UnitCosts,
    estimate_plan,
    measure_units,
    mix_recompute,
    op_level_cut,
    plan_costs,
    repeat_blocks,
)
from postplace.placers.layered_grid import layered_grid
from postplace.placers.practitioner import plan_devices, plan_step
from postplace.plans import parse_plan


def uniform(blocks: int, forward: float, backward: float, activation: float) -> UnitCosts:
    """Blocks of equal times and activations, the root's sides free, no parameters, nothing sent."""
    n = blocks + 2
    per = np.array([0.0] + [1.0] * blocks + [0.0])
    zero = np.zeros(n)
    return UnitCosts(
        names=(PRE, *(f"blocks.{k}" for k in range(blocks)), POST),
        forward_s=forward * per,
        backward_s=backward * per,
        accumulate_s=zero,
        update_s=zero,
        param_bytes=zero,
        param_sizes=((),) * n,
        state_bytes=zero,
        activation_bytes=activation * per,
        boundary_bytes=zero,
        transient_bytes=0.0,
        single_bytes=0.0,
        gather_dtype_bytes=2.0,
        tensor=1,
        recompute=False,
        step_time_s=0.0,
    )


@pytest.mark.parametrize(("blocks", "pp", "m"), [(4, 2, 4), (6, 3, 6), (8, 4, 2)])
def test_pipeline_steps_and_held_activations_follow_their_formulas(blocks, pp, m):
    cluster = load_cluster("dgx8")
    gpus = [d for d, dev in enumerate(cluster.devices) if dev.kind == "gpu"][:pp]
    f, b, a = 1e-3, 2e-3, 1e9
    costs = uniform(blocks, f, b, a)
    hop = cluster.transfer_time(0.0, gpus[0], gpus[1])  # a send of nothing: the route's latency
    stage_f, stage_b, stage_a = f * blocks / pp, b * blocks / pp, a * blocks / pp
    for schedule, held in (("gpipe", m), ("1f1b", min(pp, m))):
        spec = parse_plan(f"ddp:pp={pp},m={m},schedule={schedule}")
        r = estimate_plan(costs, cluster, spec, gpus)
        # (m + p - 1) slot times, plus the point-to-point latency: one hop per stage boundary each way under
        # GPipe; 1F1B's alternation waits for a few more round trips
        slots = (m + pp - 1) * (stage_f + stage_b)
        if schedule == "gpipe":
            assert r.step_time_s == pytest.approx(slots + 2 * (pp - 1) * hop, rel=1e-12)
        else:
            assert slots + 2 * (pp - 1) * hop - 1e-12 <= r.step_time_s <= slots + 2 * (m + pp - 1) * hop
        assert r.peak_bytes == pytest.approx(held * stage_a, rel=1e-12)  # stage 0 holds the most
        assert r.peak_stage == 0
        assert all(len(c) == blocks // pp + (c[0] == PRE) + (c[-1] == POST) for c in r.stage_units)


def test_interleaving_shrinks_the_bubble():
    cluster = load_cluster("dgx8")
    gpus = [d for d, dev in enumerate(cluster.devices) if dev.kind == "gpu"][:2]
    costs = uniform(8, 1e-3, 2e-3, 1e9)
    plain = estimate_plan(costs, cluster, parse_plan("ddp:pp=2,m=4,schedule=1f1b"), gpus).step_time_s
    inter = estimate_plan(costs, cluster, parse_plan("ddp:pp=2,m=4,schedule=interleaved-2"), gpus).step_time_s
    work = 4 * 8 * 3e-3 / 2  # each GPU's share of the compute: no schedule beats it
    chunk = 2 * 3e-3  # one chunk's forward and backward: interleaved-2's bubble is (p - 1) of them
    assert work < inter < plain
    assert inter == pytest.approx(work + chunk, rel=0.01)


@pytest.fixture(scope="module")
def small():
    from postplace.zoo import trace_model

    measured = trace_model("llama", "small@2", "adamw", precision="bf16", microbatches=2).graph
    whole = trace_model("llama", "small@16", "adamw", precision="bf16", microbatches=16).graph
    return measured, whole, load_cluster("dgx8")


PLANS = [
    "ddp:m=16",
    "zero1:m=16",
    "zero2:m=16",
    "fsdp:m=16",
    "fsdp+recompute:m=16",
    "ddp:tp=2,m=16",
    "zero1:pp=2,m=16",
    "ddp:pp=2,m=16,schedule=gpipe",
    "zero1:tp=2,pp=2,m=16",
    "ddp:tp=2,sp,m=16",
    "zero1:tp=2,sp,pp=2,m=16",
    "fsdp:m=16,recompute=blocks.0",
    "zero1:pp=2,m=16,recompute=blocks.1",
    "fsdp+selective:m=16",
    "ddp:m=16,recompute=blocks.0,selective=blocks.1",
]


def test_the_estimate_agrees_with_the_op_level_simulation(small):
    """Step times within 10% of the op-level simulation on every plan kind (pipelines on the op level's cut);
    the peak exactly where no part of
    the memory is estimated (DDP and ZeRO-1 without a pipeline: states, gradient sums, one micro-batch's
    activations and the measured transient)."""
    measured, whole, cluster = small
    costs = {}
    for text in PLANS:
        spec = parse_plan(text)
        devices = plan_devices(cluster, spec)

        def at(recompute, selective=False, tp=spec.tensor or 1, sp=spec.sequence, devices=devices):
            key = (tp, sp, recompute, selective)
            if key not in costs:
                costs[key] = measure_units(
                    measured, cluster, devices, tensor=tp, recompute=recompute, selective=selective, sequence=sp
                )
            return costs[key]

        unit_costs = plan_costs(spec, at)
        cut = op_level_cut(whole, cluster, spec, devices, unit_costs.names) if spec.pipeline else None
        est = estimate_plan(unit_costs, cluster, spec, devices, cut=cut)
        ref = plan_step(whole, cluster, spec, devices)
        assert est.step_time_s == pytest.approx(ref.step_time_s, rel=0.10), text
        if spec.level in ("ddp", "zero1") and not spec.pipeline and not spec.recompute:
            assert est.peak_bytes == pytest.approx(float(ref.peak_memory_bytes.max()), rel=0.02), text


HYBRIDS = [
    "fsdp:m=16",
    "ddp:m=16,shard=root",
    "ddp:m=16,shard=blocks.0",
    "fsdp:m=16,shard=root/blocks.1",
    "ddp+recompute:m=16,shard=blocks.1",
    "ddp:tp=2,m=16,shard=root",
]


def test_per_unit_sharding_agrees_with_the_op_level_simulation(small):
    """FSDP for some units and DDP for the others (``shard=``): the step within 10% of the op-level simulation,
    the peak within 5% (a sharded unit keeps a shard of its parameters, state and gradient sums, and no cast
    of its parameters for the backward: FSDP casts the second gather again)."""
    measured, whole, cluster = small
    costs = {}
    for text in HYBRIDS:
        spec = parse_plan(text)
        devices = plan_devices(cluster, spec)

        def at(recompute, selective=False, tp=spec.tensor or 1, devices=devices):
            if (tp, recompute) not in costs:
                costs[tp, recompute] = measure_units(measured, cluster, devices, tensor=tp, recompute=recompute)
            return costs[tp, recompute]

        est = estimate_plan(plan_costs(spec, at), cluster, spec, devices)
        ref = plan_step(whole, cluster, spec, devices)
        assert est.step_time_s == pytest.approx(ref.step_time_s, rel=0.10), text
        assert est.peak_bytes == pytest.approx(float(ref.peak_memory_bytes.max()), rel=0.05), text


def test_a_hybrid_of_no_unit_or_every_unit_prices_as_its_level(small):
    """``shard=none`` is DDP's program and ``shard=`` every unit FSDP's, whichever level names them."""
    measured, _, cluster = small
    gpus = plan_devices(cluster, parse_plan("ddp"))
    costs = measure_units(measured, cluster, gpus)
    for hybrid, plain in (("fsdp:m=16,shard=none", "ddp:m=16"), ("ddp:m=16,shard=root/blocks.0-1", "fsdp:m=16")):
        a = estimate_plan(costs, cluster, parse_plan(hybrid), gpus)
        b = estimate_plan(costs, cluster, parse_plan(plain), gpus)
        assert (a.step_time_s, a.peak_bytes) == (b.step_time_s, b.peak_bytes), hybrid


def test_a_hybrid_times_ddps_buckets_as_ddp_does(small):
    """A hybrid whose one sharded unit holds nothing runs DDP's buckets, its gradient sums inside each unit's
    backward on both paths: it prices as DDP within the empty collectives' latency (not below it by the sums'
    time), and ZeRO's levels take no shard= (they shard by their own rule)."""
    from dataclasses import replace

    measured, _, cluster = small
    gpus = plan_devices(cluster, parse_plan("ddp"))
    inner = np.array([0.0] + [1.0] * 8 + [0.0])
    costs = replace(
        uniform(8, 1e-3, 2e-3, 1e8), param_bytes=2 * 2**30 * inner, accumulate_s=5e-4 * inner, param_sizes=((),) * 10
    )
    ddp = estimate_plan(costs, cluster, parse_plan("ddp:m=16"), gpus).step_time_s
    hybrid = estimate_plan(costs, cluster, parse_plan("ddp:m=16,shard=root"), gpus).step_time_s
    assert ddp - 2e-4 <= hybrid <= ddp + 2e-4
    with pytest.raises(PostplaceError, match="zero1 shards by its own rule"):
        estimate_plan(
            measure_units(measured, cluster, gpus), cluster, replace(parse_plan("zero1:m=16"), shard=("",)), gpus
        )


def test_repeated_blocks_price_as_the_whole_depth():
    """Measured on 2 blocks and repeated to 6, a plan is priced as when measured on all 6."""
    from postplace.zoo import trace_model

    cluster = load_cluster("dgx8")
    few = trace_model("llama", "small@2", "adamw", precision="bf16", microbatches=2, layers=2).graph
    all6 = trace_model("llama", "small@2", "adamw", precision="bf16", microbatches=2, layers=6).graph
    for text in ("ddp:m=16", "fsdp:m=16", "zero1:pp=2,m=16"):
        spec = parse_plan(text)
        devices = plan_devices(cluster, spec)
        whole = estimate_plan(measure_units(all6, cluster, devices), cluster, spec, devices)
        grown = estimate_plan(repeat_blocks(measure_units(few, cluster, devices), 6), cluster, spec, devices)
        assert grown.step_time_s == pytest.approx(whole.step_time_s, rel=0.02), text
        assert grown.peak_bytes == pytest.approx(whole.peak_bytes, rel=0.05), text


def test_the_grid_finds_a_plan_that_fits(small):
    measured, _, cluster = small
    gpus = [d for d, dev in enumerate(cluster.devices) if dev.kind == "gpu"]
    grid = layered_grid(measured, cluster, gpus, 16)
    assert grid.best is not None and not grid.best.oom
    assert grid.best.step_time_s == min(r.step_time_s for r in grid.tried if not r.oom)
    assert {"ddp:m=16", "fsdp:m=16"} <= {r.plan for r in grid.tried}
    assert any("tp=2" in r.plan for r in grid.tried) and any("pp=2" in r.plan for r in grid.tried)


def test_a_tied_embedding_runs_the_grids_pipelines_as_gpipe():
    """GPT-2 ties its embedding to its head, so 1F1B's stages do not chain (the layered estimate refuses it, as
    the op level does): the grid runs its pipelines by GPipe and says so, instead of trying none."""
    from postplace.zoo import trace_model

    cluster = load_cluster("dgx8")
    gpus = [d for d, dev in enumerate(cluster.devices) if dev.kind == "gpu"]
    pair = trace_model("gpt2", "small@2", "adamw", precision="bf16", microbatches=2).graph
    grid = layered_grid(pair, cluster, gpus, 8)
    piped = [r.plan for r in grid.tried if "pp=" in r.plan]
    assert piped and all("schedule=gpipe" in p for p in piped), piped
    assert any("pipelines run GPipe" in n for n in grid.notes)


def test_bad_input_is_one_line(small):
    measured, whole, cluster = small
    gpus = [d for d, dev in enumerate(cluster.devices) if dev.kind == "gpu"]
    with pytest.raises(PostplaceError, match="two micro-batches") as e:
        measure_units(whole, cluster, gpus)
    assert "\n" not in str(e.value)
    costs = measure_units(measured, cluster, gpus)
    for text, match in (
        ("ddp:tp=2,m=16", "measured at tp=1"),
        ("fsdp:pp=2,m=16", "FSDP inside a pipeline"),
        ("ddp:pp=2,m=16,shard=blocks.0", "shard=\\) inside a pipeline"),
        ("ddp:m=16,shard=blocks.7", "'blocks.7', which is not a block"),
        ("fsdp:pp=2,m=16,shard=none", "FSDP inside a pipeline"),
        ("ddp:pp=4,m=16,schedule=interleaved-2", "needs as many blocks"),
    ):
        spec = parse_plan(text)
        with pytest.raises(PostplaceError, match=match) as e:
            estimate_plan(costs, cluster, spec, plan_devices(cluster, spec))
        assert "\n" not in str(e.value)


def test_simulate_layered_prints_the_estimate_the_library_gives():
    import json

    from postplace.api.plans import estimate_plan_layered
    from tests.clihelp import run_cli

    args = ["llama", "--size", "small", "--batch", "16", "--cluster", "dgx8", "--optimizer", "adamw"]
    args += ["--precision", "bf16", "--plan", "zero1:pp=2,m=16", "--layered", "--json"]
    done = run_cli("simulate", *args)
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    r, _, devices = estimate_plan_layered(
        "llama", "dgx8", "zero1:pp=2,m=16", size="small@16", optimizer="adamw", precision="bf16"
    )
    assert out["step_time_s"] == r.step_time_s and out["evaluator"].startswith("layered estimate")
    assert max(out["peak_memory_bytes"].values()) == pytest.approx(r.peak_bytes)
    assert len(out["peak_memory_bytes"]) == len(devices) == 8
    assert "pp 2 x dp 4, 1F1B, 16 micro-batches" in out["plan_words"]


@pytest.mark.parametrize(
    ("argv", "match"),
    [
        (["resnet50", "--cluster", "dgx8", "--plan", "ddp:m=8", "--layered"], "made of blocks"),
        (["llama", "--size", "small", "--cluster", "dgx8", "--plan", "ddp:m=3", "--layered"], "m=3 must be"),
        (["llama", "--size", "small", "--cluster", "dgx8", "--placement", "single:gpu0", "--layered"], "--layered"),
    ],
)
def test_simulate_layered_bad_input_is_one_line(argv, match, capsys):
    from tests.clihelp import cli_error

    assert match in cli_error(["simulate", *argv], capsys)


def test_recomputing_the_fewest_blocks_that_fit(small):
    """Megatron-LM's recompute-num-layers as the grid uses it: the smallest k (first k blocks of each stage)
    that fits, found by halving, fits where k - 1 does not, and is faster than recomputing every block."""
    from dataclasses import replace

    from postplace.placers.layered_grid import fewest_recomputed

    measured, _, cluster = small
    spec = parse_plan("ddp:m=16")
    devices = plan_devices(cluster, spec)
    plain, full = (repeat_blocks(measure_units(measured, cluster, devices, recompute=rc), 8) for rc in (False, True))
    every = estimate_plan(full, cluster, replace(spec, recompute=True), devices)
    none = estimate_plan(plain, cluster, spec, devices)
    room = none.peak_bytes - (none.peak_bytes - every.peak_bytes) * 0.6  # fits with about 5 of 8 blocks recomputed
    tight = _with_gpu_memory("dgx8", room)
    found, _ = fewest_recomputed(plain, full, tight, spec, devices, every.stage_units)
    assert found is not None and not found.oom
    k = len(parse_plan(found.plan).recompute_units)
    fewer = tuple(f"blocks.{j}" for j in range(k - 1))
    r = estimate_plan(
        mix_recompute(plain, full, fewer), tight, replace(spec, recompute=True, recompute_units=fewer), devices
    )
    assert 1 < k < 8 and r.oom
    assert found.step_time_s < estimate_plan(full, tight, replace(spec, recompute=True), devices).step_time_s


def _with_gpu_memory(preset: str, usable: float):
    """The preset with every GPU's usable memory ``usable`` bytes."""
    import re
    from pathlib import Path

    import postplace.cluster as clusters
    from postplace.cluster import Cluster

    text = (Path(clusters.__file__).parent / "presets" / f"{preset}.toml").read_text()
    head, sep, gpus = text.partition('kind = "gpu"')
    gpus = re.sub(r"(?m)^memory = .*$", f"memory = {usable + 1e9:.6e}", gpus, count=1)
    return Cluster.from_toml_text(head + sep + gpus)


def test_a_cut_sends_each_value_once(small):
    """The bytes a cut sends are one micro-batch's values read across it, each once: after the embedding,
    LLaMA small sends its embedded tokens (batch x seq x d fp32) and nothing else its later units read twice."""
    measured, _, cluster = small
    costs = measure_units(measured, cluster, [d for d, dev in enumerate(cluster.devices) if dev.kind == "gpu"])
    from postplace.zoo import spec as zoo_spec

    cfg = zoo_spec("llama").config("small")
    assert costs.boundary_bytes[0] == 1 * cfg["seq"] * cfg["d"] * 4  # one sequence per micro-batch here


def test_what_the_layered_estimate_refuses(small):
    """Refused in one line each: two kinds of block, units not measured on the plan's GPU models, ZeRO-2 or FSDP
    in a pipeline, a cut out of order."""
    from postplace.zoo import trace_model

    measured, _, cluster = small
    gpus = [d for d, dev in enumerate(cluster.devices) if dev.kind == "gpu"]
    nmt = trace_model("nmt2", "small@4", "adam", microbatches=2).graph
    with pytest.raises(PostplaceError, match="one kind of block"):
        repeat_blocks(measure_units(nmt, cluster, gpus), 8)
    mixed = load_cluster("mixed")
    spec = parse_plan("ddp:m=8")
    with pytest.raises(PostplaceError, match="measured on H100 GPUs, not on A100-40GB"):
        estimate_plan(measure_units(measured, cluster, gpus), mixed, spec, plan_devices(mixed, spec))
    costs = measure_units(measured, cluster, gpus)
    for text, match in (("zero2:pp=2,m=16", "ZeRO-2 inside a pipeline"), ("ddp:pp=2,m=16", "in order")):
        spec = parse_plan(text)
        cut = [[POST], [PRE, "blocks.0", "blocks.1"]] if "ddp" in text else None
        with pytest.raises(PostplaceError, match=match) as e:
            estimate_plan(costs, cluster, spec, plan_devices(cluster, spec), cut=cut)
        assert "\n" not in str(e.value)
