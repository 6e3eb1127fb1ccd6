"""Pipeline schedules as program order: the bubble and the activations a stage holds, simulated on a
uniform stack and held to their formulas (issue 31 item 2)."""

from __future__ import annotations

import numpy as np
import pytest

from postplace.plans.schedule import pipeline_schedule, slot_order
from postplace.sim import Simulator
from postplace.testing import star_cluster

ACT = 1e6  # bytes each layer's forward output holds until its backward


def uniform_stack(layers: int, m: int):
    """``layers`` identical layers, each 1 s forward and 2 s backward on the test devices (1e12 FLOP/s),
    as m micro-batches; communication is free."""
    names, flops, phase, mb, out_bytes, edges = [], [], [], [], [], []

    def op(name, f, ph, k, nbytes):
        names.append(name), flops.append(f), phase.append(ph), mb.append(k), out_bytes.append(nbytes)
        return len(names) - 1

    for k in range(m):
        fwd = [op(f"mb{k}_f{l}", 1e12, "forward", k, ACT) for l in range(layers)]
        bwd = [op(f"mb{k}_b{l}", 2e12, "backward", k, 0.0) for l in reversed(range(layers))][::-1]
        edges += [(fwd[l], fwd[l + 1]) for l in range(layers - 1)] + [(fwd[-1], bwd[-1])]
        edges += [(bwd[l + 1], bwd[l]) for l in range(layers - 1)] + [(fwd[l], bwd[l]) for l in range(layers)]
    from postplace.graph import OpGraph

    return OpGraph.build(
        names, edges, flops=flops, phase=phase, microbatch=mb, output_bytes=out_bytes, name=f"stack{layers}-mb{m}"
    )


@pytest.mark.parametrize(("layers", "p", "m"), [(4, 2, 4), (6, 3, 6), (8, 4, 2)])
@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
def test_bubble_and_activations_match_their_formulas(layers, p, m, schedule):
    g = uniform_stack(layers, m)
    per = layers // p
    stage = np.array([int(n.split("_")[1][1:]) // per for n in g.names])
    planned = pipeline_schedule(g, stage, schedule)
    assert sorted(planned.names) == sorted(g.names)
    placement = np.array([int(n.split("_")[1][1:]) // per for n in planned.names])
    sched = Simulator(planned, star_cluster(("gpu",) * p)).schedule(placement)
    tf, tb = per * 1.0, per * 2.0  # a stage's forward and backward of one micro-batch
    assert sched.step_time == pytest.approx((m + p - 1) * (tf + tb))
    busy = m * (tf + tb)
    assert 1 - busy / sched.step_time == pytest.approx((p - 1) / (m + p - 1))  # the bubble
    for s in range(p):  # micro-batches in flight on stage s: all m under GPipe, p - s under 1F1B
        held = m if schedule == "gpipe" else min(p - s, m)
        assert sched.peak_memory[s] == pytest.approx(held * per * ACT)


def test_without_a_schedule_the_first_stage_holds_more_than_1f1b():
    g = uniform_stack(4, 8)
    stage = np.array([int(n.split("_")[1][1:]) // 2 for n in g.names])
    greedy = Simulator(g, star_cluster(("gpu",) * 2)).schedule(stage)
    ordered = pipeline_schedule(g, stage, "1f1b")
    place = np.array([int(n.split("_")[1][1:]) // 2 for n in ordered.names])
    one = Simulator(ordered, star_cluster(("gpu",) * 2)).schedule(place)
    assert one.peak_memory[0] == pytest.approx(2 * 2 * ACT)
    assert greedy.peak_memory[0] == pytest.approx(2 * one.peak_memory[0])  # greedy runs 4 forwards ahead


def test_1f1b_slots_run_each_microbatch_once_forward_before_backward():
    for p, m in [(1, 1), (4, 2), (4, 8), (2, 5)]:
        for s in range(p):
            seq = [x[:2] for x in slot_order("1f1b", s, p, m)]
            assert sorted(seq) == sorted([("F", k) for k in range(m)] + [("B", k) for k in range(m)])
            assert all(seq.index(("F", k)) < seq.index(("B", k)) for k in range(m))
            in_flight = max(
                sum(1 for x in seq[: j + 1] if x[0] == "F") - sum(1 for x in seq[: j + 1] if x[0] == "B")
                for j in range(len(seq))
            )
            assert in_flight == min(p - s, m)


@pytest.mark.parametrize(("p", "v", "m"), [(2, 2, 4), (4, 2, 4), (2, 3, 2)])
def test_interleaved_shrinks_the_bubble_v_fold(p, v, m):
    layers = 2 * p * v  # two layers per chunk
    g = uniform_stack(layers, m)
    chunk = np.array([int(n.split("_")[1][1:]) // 2 for n in g.names])
    planned = pipeline_schedule(g, chunk, f"interleaved-{v}")
    gpu = np.array([(int(n.split("_")[1][1:]) // 2) % p for n in planned.names])
    sched = Simulator(planned, star_cluster(("gpu",) * p)).schedule(gpu)
    tc = 2 * (1.0 + 2.0)  # a chunk's forward and backward of one micro-batch
    assert sched.step_time == pytest.approx((v * m + p - 1) * tc)
    assert 1 - (v * m * tc) / sched.step_time == pytest.approx((p - 1) / (v * m + p - 1))
    flat = pipeline_schedule(g, chunk // v, "1f1b")  # the same layers as p plain stages
    one = Simulator(flat, star_cluster(("gpu",) * p)).schedule(
        np.array([int(n.split("_")[1][1:]) // (2 * v) for n in flat.names])
    )
    assert sched.step_time < one.step_time


def test_an_unknown_schedule_is_one_line():
    from postplace.errors import PostplaceError

    with pytest.raises(PostplaceError, match="unknown pipeline schedule 'zb'"):
        slot_order("zb", 0, 2, 2)
    with pytest.raises(PostplaceError, match="multiple of 4"):
        slot_order("interleaved-2", 0, 4, 6)


def _mlp_step(m: int):
    import torch
    from torch import nn

    from postplace.graph import from_torch

    torch.manual_seed(0)
    model = nn.Sequential(*[nn.Sequential(nn.Linear(64, 64), nn.ReLU()) for _ in range(4)]).train()
    x, y = torch.randn(2048, 64), torch.randn(2048, 64)  # activations outweigh the parameters
    return from_torch(model, (x,), lambda o, t: ((o - t) ** 2).mean(), targets=(y,), microbatches=m)


def test_a_pipelined_data_parallel_plan_keeps_each_stage_on_its_gpus():
    """ddp:pp=2 over 4 GPUs: two pipelines of two stages; each replica's stage s on GPU replica + 2 s; the
    all-reduces join the two replicas of one stage; 1F1B holds fewer activations than GPipe."""
    from postplace.placers.practitioner import plan_devices, plan_step
    from postplace.plans import parse_plan

    g, cluster = _mlp_step(8), star_cluster(("gpu",) * 4)
    runs = {}
    for schedule in ("gpipe", "1f1b"):
        spec = parse_plan(f"ddp:pp=2,m=8,schedule={schedule}")
        devices = plan_devices(cluster, spec)
        assert devices == [0, 1, 2, 3]
        r = runs[schedule] = plan_step(g, cluster, spec, devices)
        words = "GPipe" if schedule == "gpipe" else "1F1B"
        assert r.describe().startswith(f"ddp over 4 GPUs (gpu0..gpu3), pp 2 x dp 2, {words}")
        G = r.graph
        for j, name in enumerate(G.names):  # a replica's op sits on GPU replica + 2 x stage
            if name.startswith(("r0/", "r1/")) and "0.0" in G.module[j]:
                assert r.placement[j] == int(name[1])  # block 0 is in stage 0
            if name.startswith(("r0/", "r1/")) and "3.0" in G.module[j]:
                assert r.placement[j] == int(name[1]) + 2
        members = {}
        for j, c in enumerate(G.collective.tolist()):
            if c >= 0:
                members.setdefault(c, set()).add(int(r.placement[j]))
        assert members and all(
            len(s) == 2 and len({d % 2 for d in s}) == 2 and len({d // 2 for d in s}) == 1 for s in members.values()
        )
    assert set(runs["gpipe"].graph.names) == set(runs["1f1b"].graph.names)
    assert runs["1f1b"].peak_memory_bytes[0] < runs["gpipe"].peak_memory_bytes[0]


def test_pipeline_plan_words_and_bad_input():
    from postplace.errors import PostplaceError
    from postplace.plans import parse_plan

    assert str(parse_plan("ddp:pp=2,m=8")) == "ddp:m=8,pp=2,schedule=1f1b"
    with pytest.raises(PostplaceError, match="give pp=P with P >= 2"):
        parse_plan("ddp:schedule=1f1b")
    with pytest.raises(PostplaceError, match="pp=8 needs 8 GPUs"):
        from postplace.placers.practitioner import plan_devices

        plan_devices(star_cluster(("gpu",) * 4), parse_plan("ddp:pp=8"))


def test_read_only_buffers_do_not_tie_every_layer_together():
    """LLaMA's rotary tables are read by every block: they join no block's colocation set, so its stages
    form a chain and 1F1B orders them; batch norm's running statistics, written by the step, still join
    their users."""
    from postplace.api.plans import simulate_plan
    from postplace.api.target import load_target

    g = load_target("llama", size="small").graph
    for b in ("buffer:cos", "buffer:sin"):
        assert g.colocation[g.index(b)] == -1
    r = simulate_plan("llama", "k80x4", "ddp:pp=2,m=2", size="small")
    assert "pp 2 x dp 2, 1F1B" in r.describe() and not r.oom
    bn = load_target("resnet50", size="small").graph
    written = [i for i, t in enumerate(bn.op_types) if t == "buffer" and "running_mean" in bn.names[i]]
    assert written and all(bn.colocation[i] >= 0 for i in written)


def test_interleaved_plans_put_chunks_round_robin_and_shrink_the_bubble():
    """``schedule=interleaved-2`` over pp 2: eight equal blocks in four chunks, chunk c on GPU c mod 2
    (blocks 0-1 and 4-5 on gpu0, 2-3 and 6-7 on gpu1); with free communication the step is shorter than
    1F1B's (the bubble shrinks V-fold); a model with fewer blocks than chunks is refused in one line."""
    from postplace.errors import PostplaceError
    from postplace.placers.practitioner import plan_step
    from postplace.plans import parse_plan
    from tests.test_plans import step

    g = step(4, layers=8, optimizer="sgd")
    c = star_cluster(("gpu",) * 2, bandwidth=1e15)
    inter = plan_step(g, c, parse_plan("ddp:pp=2,m=4,schedule=interleaved-2"), [0, 1])
    plain = plan_step(g, c, parse_plan("ddp:pp=2,m=4,schedule=1f1b"), [0, 1])
    for k in range(8):
        (i,) = [j for j, n in enumerate(inter.graph.names) if n == f"param:blocks.{k}.0.weight"]
        assert inter.placement[i] == (k // 2) % 2, k
    assert inter.step_time_s < plain.step_time_s
    with pytest.raises(PostplaceError, match="4 chunks, and .* has 2 blocks"):
        plan_step(step(4, layers=2, optimizer="sgd"), c, parse_plan("ddp:pp=2,m=4,schedule=interleaved-2"), [0, 1])
