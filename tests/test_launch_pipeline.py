"""Pipeline plans (``ddp:pp=P``) on torch.distributed: each stage of each replica one gloo process, the
schedule's order on every rank, each stage's gradients all-reduced over its own ranks (issue 33)."""

from __future__ import annotations

import json
import re
from collections import Counter

import numpy as np
import pytest
import torch
from torch import nn

from postplace.cluster import load_cluster
from postplace.errors import PostplaceError
from postplace.graph.trace_torch import trace
from postplace.placers.practitioner import plan_devices, plan_step
from postplace.plans import parse_plan
from postplace.plans._step import traced_name
from postplace.runtime.launcher import RandomBatches, launch_plan, simulated_plan_bytes
from postplace.runtime.pipeline import pipeline_plan
from postplace.runtime.placed import apply
from postplace.runtime.ranks import Collective, Message, check_order
from postplace.runtime.zoo_step import trace_zoo_step
from postplace.sim import Simulator
from tests.launchhelp import launched_run_folder, one_process

K80X4 = load_cluster("k80x4")  # cpu, gpu0..gpu3


def llama(m: int = 4):
    return trace_zoo_step("llama", "small", microbatches=m, batch=4, optimizer="adamw")


def slots_of(plan, rank: int) -> str:
    """A stage rank's messages as the slots they belong to: ``s`` a send, ``r`` a receive."""
    acts = [x for act in plan.programs[rank].actions for x in (act[1] if act[0] == "batch" else (act,))]
    return "".join(kind[0] for kind, _ in acts if kind in ("send", "recv"))


def simulated_transfers(traced, spec) -> Counter:
    """The simulated plan's bytes by (traced op, sending device, receiving device)."""
    sim = plan_step(traced.graph, K80X4, spec, plan_devices(K80X4, spec))
    out = Counter()
    for op, _slot, a, b, nbytes, *_ in Simulator(sim.graph, K80X4).schedule(sim.placement).transfers:
        out[(traced_name(sim.graph.names[op]), int(a), int(b))] += int(nbytes)
    return out


def test_a_1f1b_pipeline_trains_bit_for_bit_as_one_process_and_moves_the_simulated_tensors():
    """LLaMA (small) as 4 micro-batches on 2 stages, 1F1B: stage 0 runs F0 F1 B0 F2 B1 F3 B2 B3 (it sends
    each forward's activations and receives each backward's gradient in that order), GPipe all forwards
    first; the launched step equals the one-process step bit for bit, and every message is a transfer of
    the simulated plan, tensor for tensor."""
    spec = parse_plan("ddp:pp=2,m=4,dp=1,schedule=1f1b")
    traced = llama()
    plan = pipeline_plan(traced, spec, K80X4, plan_devices(K80X4, spec))
    assert slots_of(plan, 0) == "ssrsrsrr" and slots_of(plan, 1) == "rrsrsrss"
    gpipe = pipeline_plan(traced, parse_plan("ddp:pp=2,m=4,dp=1,schedule=gpipe"), K80X4, [1, 2])
    assert slots_of(gpipe, 0) == "ssssrrrr"
    mine = Counter()
    for m in plan.messages:
        mine[(traced.graph.names[m.op], plan.ranks[m.src], plan.ranks[m.dst])] += m.nbytes
    assert mine == simulated_transfers(traced, spec) and mine

    res = launch_plan(traced, str(spec), K80X4, steps=3, batches=RandomBatches(0))
    losses, params = one_process(llama(), 3)
    assert res.losses == losses and losses[2] < losses[0]
    assert list(res.parameters) == list(params)
    for name, p in params.items():
        assert torch.equal(res.parameters[name], p.cpu()), name
    assert res.bytes_sent == plan.bytes_sent() == simulated_plan_bytes(traced.graph, spec, K80X4, plan)["bytes_sent"]


class Blocks(nn.Module):
    def __init__(self):
        super().__init__()
        self.inp = nn.Linear(8, 16)
        self.blocks = nn.Sequential(*[nn.Sequential(nn.Linear(16, 16), nn.Tanh()) for _ in range(4)])
        self.out = nn.Linear(16, 3)

    def forward(self, x):
        return self.out(self.blocks(self.inp(x)))


def blocks_step(m: int):
    torch.manual_seed(0)
    x, y = torch.randn(8, 8), torch.randint(0, 3, (8,))
    torch.manual_seed(1)
    return trace(Blocks(), (x,), nn.functional.cross_entropy, "adamw", microbatches=m, targets=(y,))


@pytest.mark.parametrize("level", ["ddp", "zero1+recompute"])
def test_two_pipelines_all_reduce_each_stage_over_its_own_ranks(level):
    """pp=2 x dp=2 on four GPUs (Megatron's order: stage s of replica r on GPU r + 2 s): each stage's
    gradients all-reduced in buckets of their own over that stage's two ranks, as the simulated plan now
    buckets them (zero1: then each replica updates the parameters it owns and each stage's are all-gathered
    over that stage's ranks, the simulated plan's owners; recomputed, `best-3d`'s pipelines where memory is
    short: each block's forward runs again in its micro-batch's backward slot, after the other micro-batch's
    forward, as 1F1B orders them); the losses and parameters are the one-process step's within fp32 rounding
    (the replicas' sums run in another order), every rank's bytes the simulator's."""
    spec = parse_plan(f"{level}:pp=2,m=4,dp=2,schedule=1f1b")
    traced = blocks_step(4)
    plan = pipeline_plan(traced, spec, K80X4, plan_devices(K80X4, spec))
    assert {c.group for c in plan.collectives} == {(0, 1), (2, 3)}
    assert {c.kind for c in plan.collectives} == (
        {"all_reduce", "all_gather"} if spec.level == "zero1" else {"all_reduce"}
    )
    if spec.recompute:
        g, op_of = traced.graph, traced.op_of_node
        for q, prog in enumerate(plan.programs):
            where: dict[tuple[str, int], list[int]] = {}  # (forward or recomputed, micro-batch) -> positions
            for i, n in enumerate(prog.gm.graph.nodes):
                op = op_of.get(n.meta.get("recompute") or n.name, -1)
                if op >= 0 and g.microbatch[op] >= 0 and g.phase[op] == 0:
                    where.setdefault(("R" if n.meta.get("recompute") else "F", int(g.microbatch[op])), []).append(i)
            a, b = sorted({j for _, j in where})
            assert min(where[("R", a)]) > max(where[("F", a)]) and min(where[("R", b)]) > max(where[("F", b)])
            if q < 2:  # the first stage's 1F1B: F a, F b, B a, B b (the last stage's: F a, B a, F b, B b)
                assert min(where[("R", a)]) > max(where[("F", b)])
            else:
                assert max(where[("R", a)]) < max(where[("F", b)])
    sim = plan_step(traced.graph, K80X4, spec, plan_devices(K80X4, spec))
    assert sorted(c.nbytes for c in sim.graph.collectives) == sorted(c.nbytes for c in plan.collectives)
    for q in range(4):  # every rank calls its stage's all-reduces, after its messages
        kinds = [kind for kind, _ in plan.programs[q].actions]
        assert "collective" in kinds and kinds.index("collective") == len(kinds) - kinds.count("collective")

    res = launch_plan(traced, str(spec), K80X4, steps=3, batches=RandomBatches(0))
    losses, params = one_process(blocks_step(4), 3)
    assert res.losses == pytest.approx(losses, rel=1e-6)
    for name, p in params.items():
        torch.testing.assert_close(res.parameters[name], p.cpu(), rtol=1e-5, atol=1e-6)
    simulated = simulated_plan_bytes(traced.graph, spec, K80X4, plan)
    assert res.bytes_sent == simulated["bytes_sent"] and res.bytes_received == simulated["bytes_received"]
    grads = sum(c.nbytes for c in plan.collectives)
    assert sum(res.bytes_sent.values()) == sum(plan.bytes_sent().values()) + 2 * grads


def test_an_interleaved_pipeline_runs_its_chunks_in_order_bit_for_bit():
    """Four blocks in 2 x 2 chunks (chunk c on GPU c mod 2), interleaved-2 over 2 GPUs and 2 micro-batches."""
    spec = parse_plan("ddp:pp=2,m=2,dp=1,schedule=interleaved-2")
    res = launch_plan(blocks_step(2), str(spec), K80X4, steps=3, batches=RandomBatches(2))
    losses, params = one_process(blocks_step(2), 3, seed=2)
    assert res.losses == losses
    for name, p in params.items():
        assert torch.equal(res.parameters[name], p.cpu()), name
    assert sorted(res.ranks.values()) == ["gpu0", "gpu1"]
    assert sum(res.bytes_sent.values()) > 0


class Normed(nn.Module):
    """Blocks with batch norm: each micro-batch's forward updates the running statistics in place, and
    its backward takes them as arguments (and, in training, ignores them)."""

    def __init__(self):
        super().__init__()
        self.inp = nn.Linear(8, 16)
        self.blocks = nn.Sequential(
            *[nn.Sequential(nn.Linear(16, 16), nn.BatchNorm1d(16), nn.Tanh()) for _ in range(2)]
        )
        self.out = nn.Linear(16, 3)

    def forward(self, x):
        return self.out(self.blocks(self.inp(x)))


def normed_step():
    torch.manual_seed(0)
    x, y = torch.randn(16, 8), torch.randint(0, 3, (16,))
    torch.manual_seed(1)
    return trace(Normed(), (x,), nn.functional.cross_entropy, "adamw", microbatches=4, targets=(y,))


def test_batch_norm_pipelines_update_running_statistics_in_micro_batch_order_bit_for_bit():
    """Micro-batch 1's forward writes the running statistics before micro-batch 0's backward (which takes
    them but, training, reads its saved statistics) in both schedules: they order, and the launched
    1F1B step equals the one-process step bit for bit, buffers included."""
    gpipe = pipeline_plan(normed_step(), parse_plan("ddp:pp=2,m=4,dp=1,schedule=gpipe"), K80X4, [1, 2])
    assert slots_of(gpipe, 0) == "ssssrrrr"
    res = launch_plan(normed_step(), "ddp:pp=2,m=4,dp=1,schedule=1f1b", K80X4, steps=2, batches=RandomBatches(0))
    assert slots_of(res.plan, 0) == "ssrsrsrr"
    ref = normed_step()
    step = apply(ref.model, ref, np.zeros(ref.graph.num_ops, dtype=np.int64), K80X4, device_map="cpu")
    batches = RandomBatches(0)
    assert res.losses == [float(step(*batches(ref))) for _ in range(2)]
    for name, p in step.parameters().items():
        assert torch.equal(res.parameters[name], p.cpu()), name
    assert res.buffers and all(torch.equal(b, step.buffers()[name].cpu()) for name, b in res.buffers.items())


def test_order_check_knows_collectives():
    a = Message(0, 0, 1, "x", 0, (2,), (1,), torch.float32)
    reduce01 = Collective(0, "all_reduce", "g", (2,), torch.float32, group=(0, 1))
    check_order([[("send", 0), ("collective", 0)], [("recv", 0), ("collective", 0)]], [a], collectives=[reduce01])
    with pytest.raises(PostplaceError, match=r"can deadlock: rank 0 waits to call collective 0 \(g\) with rank 1"):
        check_order([[("collective", 0), ("send", 0)], [("recv", 0), ("collective", 0)]], [a], collectives=[reduce01])
    with pytest.raises(PostplaceError, match="rank 2 calls collective 0 .*group is ranks \\[0, 1\\]"):
        check_order([[("collective", 0)], [("collective", 0)], [("collective", 0)]], [], collectives=[reduce01])
    with pytest.raises(PostplaceError, match="rank 1 never calls collective 0"):
        check_order([[("collective", 0)], []], [], collectives=[reduce01])


def test_order_check_knows_batches_and_programs_batch_what_nothing_separates():
    """Two ranks that each send first and then receive deadlock with blocking calls, and not as batches
    (``batch_isend_irecv``: posted at once, done when both ends are posted); a rank's receives with only
    copies of what they bring between them become one batch, and the batched programs still check."""
    from postplace.placers.pipeline import place_pipeline
    from postplace.runtime.ranks import batch_messages, rank_plan

    a = Message(0, 0, 1, "x", 0, (2,), (1,), torch.float32)
    b = Message(1, 1, 0, "y", 1, (2,), (1,), torch.float32)
    with pytest.raises(PostplaceError, match="can deadlock"):
        check_order([[("send", 0), ("recv", 1)], [("send", 1), ("recv", 0)]], [a, b])
    check_order([[("batch", (("send", 0), ("recv", 1)))], [("batch", (("send", 1), ("recv", 0)))]], [a, b])
    c = Message(2, 0, 1, "z", 2, (2,), (1,), torch.float32)
    with pytest.raises(PostplaceError, match=r"can deadlock: rank 0 waits to receive message 1 \(y\)"):
        check_order(
            [[("batch", (("send", 0), ("recv", 1))), ("send", 2)], [("recv", 0), ("recv", 2), ("send", 1)]], [a, b, c]
        )

    traced = llama()
    plan = rank_plan(traced, place_pipeline(traced.graph, K80X4, stages=3, devices=[1, 2, 3]), K80X4.device_names)
    batched = batch_messages(plan)
    batched.check()
    assert any(act[0] == "batch" for prog in batched.programs for act in prog.actions)
    for before, after in zip(plan.programs, batched.programs, strict=True):  # the same messages, in the same order
        flat = [x for act in after.actions for x in (act[1] if act[0] == "batch" else (act,))]
        assert flat == list(before.actions)


def test_pipelines_launch_does_not_run_are_one_line():
    with pytest.raises(PostplaceError, match="dp=2 x pp=4 needs 8 GPUs and cluster 'k80x4' has 4"):
        plan_devices(K80X4, parse_plan("ddp:pp=4,m=4,dp=2"))
    gpt2 = trace_zoo_step("gpt2", "small", microbatches=2, optimizer="adamw")
    with pytest.raises(
        PostplaceError, match=r"schedule 1f1b cannot order .* tied embedding and head\); use schedule=gpipe"
    ):
        pipeline_plan(gpt2, parse_plan("ddp:pp=2,m=2,dp=1,schedule=1f1b"), K80X4, [1, 2])
    with pytest.raises(PostplaceError, match="launch runs pipelines of ddp or zero1 replicas"):
        launch_plan(gpt2, "zero2:pp=2,m=2,dp=2", K80X4)  # (one replica would run as ddp's: it shards nothing)
    with pytest.raises(PostplaceError, match="traced as 2"):
        launch_plan(gpt2, "ddp:pp=2,m=4,dp=1", K80X4)
    with pytest.raises(PostplaceError, match="3 GPUs make no whole replicas of 2 stages"):
        pipeline_plan(gpt2, parse_plan("ddp:pp=2,m=2"), K80X4, [1, 2, 3])
    with pytest.raises(PostplaceError, match="its 2 replicas do not divide the 1 micro-batches"):
        pipeline_plan(blocks_step(1), parse_plan("ddp:pp=2,m=1"), K80X4, [1, 2, 3, 4])


def test_launch_runs_a_run_folders_pipeline_plan(tmp_path):
    """A run folder whose returned plan is a GPipe pipeline of GPT-2 (small) over two K80s: ``postplace
    launch`` runs it, the losses the one-process step's, the bytes the simulated plan's, in launch.json."""
    folder, out, losses = launched_run_folder(tmp_path / "run", "ddp:m=2,dp=1,pp=2,schedule=gpipe")
    assert out["losses"] == losses
    assert out["bytes_sent"] == out["simulated_bytes_sent"] and set(out["ranks"].values()) == {"gpu0", "gpu1"}
    record = json.loads((folder / "launch.json").read_text())
    assert record["simulated_bytes_sent"] == {str(r): n for r, n in out["bytes_sent"].items()}


def test_an_uneven_cut_runs_the_blocks_per_stage_it_names_bit_for_bit():
    """``stages=1/3`` (what ``place --layered`` may answer): stage 0 holds one of the four blocks, stage 1 three;
    the launched step equals the one-process step bit for bit."""
    spec = parse_plan("ddp:pp=2,m=2,dp=1,schedule=1f1b,stages=1/3")
    traced = blocks_step(2)
    plan = pipeline_plan(traced, spec, K80X4, plan_devices(K80X4, spec))
    # a block's forward is one tanh per micro-batch: 2 micro-batches x 1 block on stage 0, x 3 on stage 1
    tanhs = [sum(bool(re.fullmatch(r"mb\d_tanh(_\d+)?", n.name)) for n in p.gm.graph.nodes) for p in plan.programs]
    assert tanhs == [2, 6]
    res = launch_plan(traced, str(spec), K80X4, steps=3, batches=RandomBatches(2))
    losses, params = one_process(blocks_step(2), 3, seed=2)
    assert res.losses == losses
    for name, p in params.items():
        assert torch.equal(res.parameters[name], p.cpu()), name
