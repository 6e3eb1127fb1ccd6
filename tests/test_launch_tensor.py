"""Tensor parallelism (``ddp:tp=2``) on torch.distributed: Megatron-LM's split run by gloo processes, each
holding its part of the split layers, groups as ddp replicas (issue 33; the numerics of issue 31's split)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from postplace.cluster import load_cluster
from postplace.errors import PostplaceError
from postplace.graph.trace_torch import trace
from postplace.placers.practitioner import plan_devices, plan_step
from postplace.plans import parse_plan
from postplace.runtime.launcher import RandomBatches, _one_replica, launch_plan, simulated_plan_bytes
from postplace.runtime.rank_checkpoint import load_into
from postplace.runtime.tensor import tensor_plan, tensor_shard, tensor_unshard
from postplace.runtime.zoo_step import trace_zoo_step
from tests.launchhelp import launched_run_folder, one_process

pytestmark = pytest.mark.usefixtures("torch_one_thread")

K80X4 = load_cluster("k80x4")  # cpu, gpu0..gpu3
PLAN = "ddp:tp=2,dp=1,m=2"


def split_of(traced, plan) -> dict[str, tuple[int, int]]:
    """Parameter name -> (dimension, blocks) of the parameters the ranks hold parts of."""
    names = [n for n, _ in traced.model.named_parameters()]
    return {names[i]: (d, b) for i, d, b in plan.tensor_split if i < len(names)}


def assert_trains_as_one_process(traced, res, steps: int = 3, learns: bool = True):
    losses, params = one_process(traced, steps)
    assert res.losses == pytest.approx(losses, rel=1e-5)  # partial sums add in another order: fp32 rounding
    assert not learns or losses[-1] < losses[0]  # it trains
    assert list(res.parameters) == list(params)
    for name, p in params.items():
        assert torch.allclose(res.parameters[name], p, rtol=1e-4, atol=1e-6), name


def test_a_part_and_its_blocks_join_back():
    x = torch.arange(2 * 12 * 3, dtype=torch.float32).view(2, 12, 3)
    parts = [tensor_shard(x, 1, 3, 2, j) for j in range(2)]
    assert parts[0].shape == (2, 6, 3)
    assert parts[0][0, :, 0].tolist() == [0, 3, 12, 15, 24, 27]  # rows 0-1, 4-5, 8-9: part 0 of each block
    assert torch.equal(tensor_unshard(parts, 1, 3), x)


def test_llama_split_and_recomputed_over_two_processes_trains_as_one_and_moves_what_the_simulator_charges(tmp_path):
    """LLaMA (small, AdamW, 2 micro-batches, blocks recomputed): the attention and MLP layers split
    Megatron-style, the head and the embedding by vocabulary (its cross-entropy all-reduces each token's max,
    sum and target logit, its lookups each token's vector); losses and parameters after 3 steps within fp32
    rounding of the one-process step; every rank all-reduces the bytes the simulated plan's all-reduces carry;
    the per-rank checkpoint joins back into the user's model."""
    traced = trace_zoo_step("llama", "small", microbatches=2, batch=4, optimizer="adamw")
    plan = "ddp+recompute:tp=2,dp=1,m=2"
    res = launch_plan(traced, plan, K80X4, steps=3, batches=RandomBatches(0), checkpoint=tmp_path)
    assert_trains_as_one_process(traced, res)
    split = split_of(traced, res.plan)
    assert {n for n, (d, _) in split.items() if d == 1} == {
        f"blocks.{b}.{w}.weight" for b in (0, 1) for w in ("attn.wo", "mlp.w2")
    }
    assert {n for n, (d, _) in split.items() if d == 0} == {"head.weight", "embed.weight"} | {
        f"blocks.{b}.{w}.weight" for b in (0, 1) for w in ("attn.wq", "attn.wk", "attn.wv", "mlp.w1", "mlp.w3")
    }
    assert [c.kind for c in res.plan.collectives].count("all_reduce_max") == 2  # one per micro-batch
    simulated = simulated_plan_bytes(traced.graph, parse_plan(plan), K80X4, res.plan)
    assert res.bytes_sent == simulated["bytes_sent"] and res.bytes_received == simulated["bytes_received"]
    # per micro-batch: 10 activations (the embedding's vectors, 4 forward, 5 backward), each block's attention
    # output again (the recomputed forward's; the MLP's output is the next unit's input, kept), 3 values per token
    assert res.bytes_sent[0] == 2 * ((10 + 2) * 2 * 16 * 32 + 3 * 2 * 16) * 4
    model = trace_zoo_step("llama", "small", microbatches=2, batch=4, optimizer="adamw").model
    assert load_into(model, tmp_path) == 3
    for name, p in model.named_parameters():
        assert torch.equal(p, res.parameters[name]), name


def test_gpt2_fused_query_key_value_is_split_by_heads_of_each():
    """GPT-2 (small, SGD) computes query, key and value with one matrix: each rank holds its heads of each
    (three blocks), as Megatron-LM lays out a fused projection; the row-split layers' biases are added once,
    after the all-reduce. (AdamW is left out here: the key bias's gradient is zero in exact arithmetic, so
    AdamW's normalisation turns rounding into steps as large as the learning rate.) The table the embedding and
    the output head share is split by vocabulary for both, as Megatron-LM splits a tied embedding."""
    traced = trace_zoo_step("gpt2", "small", microbatches=2, batch=4, optimizer="sgd")
    res = launch_plan(traced, PLAN, K80X4, steps=3, batches=RandomBatches(0))
    assert_trains_as_one_process(traced, res)
    split = split_of(traced, res.plan)
    assert split["blocks.0.qkv.weight"] == split["blocks.0.qkv.bias"] == (0, 3)
    assert split["blocks.0.proj.weight"] == (1, 1) and "blocks.0.proj.bias" not in split
    assert split["wte.weight"] == (0, 1)  # the embedding tied to the head: both split by vocabulary
    simulated = simulated_plan_bytes(traced.graph, parse_plan(PLAN), K80X4, res.plan)
    assert res.bytes_sent == simulated["bytes_sent"]


@pytest.mark.parametrize(
    "plan, split",
    [("zero1:tp=2,dp=2,m=4", (0, 1)), ("zero1:tp=2,pp=2,dp=1,m=4,schedule=gpipe", None)],
)
def test_gpt2s_tied_table_is_split_in_zero_groups_and_whole_in_a_pipeline(plan, split):
    """GPT-2's table shared by the embedding and the head: split by vocabulary in ZeRO-1 groups (each replica's
    owners found on the split step, as the simulated plan's), whole in a pipeline (its last stage sends the
    head's gradient of the table to the first); each trains as one process, bytes = simulated."""
    traced = trace_zoo_step("gpt2", "small", microbatches=4, batch=8, optimizer="sgd")
    res = launch_plan(traced, plan, K80X4, steps=3, batches=RandomBatches(0))
    assert_trains_as_one_process(traced, res)
    assert split_of(traced, res.plan).get("wte.weight") == split
    simulated = simulated_plan_bytes(traced.graph, parse_plan(plan), K80X4, res.plan)
    assert res.bytes_sent == simulated["bytes_sent"] and res.bytes_received == simulated["bytes_received"]


def test_a_pipeline_of_tensor_parallel_groups_runs_1f1b_and_moves_what_the_simulator_charges():
    """LLaMA (small, AdamW, 4 micro-batches) on 4 ranks, ``ddp+recompute:tp=2,pp=2``: two stages of two parts
    each (GPUs j + 2 s); part j of stage 0 sends each micro-batch's activation to part j of stage 1 in 1F1B's
    order, and each recomputed block all-reduces its partial sums again in its backward slot; within fp32
    rounding of one process, each rank's bytes = the simulated plan's."""
    traced = trace_zoo_step("llama", "small", microbatches=4, batch=8, optimizer="adamw")
    plan = "ddp+recompute:tp=2,pp=2,dp=1,m=4,schedule=1f1b"
    res = launch_plan(traced, plan, K80X4, steps=3, batches=RandomBatches(0))
    assert_trains_as_one_process(traced, res)
    assert {(m.src, m.dst) for m in res.plan.messages} == {(0, 2), (1, 3), (2, 0), (3, 1)}  # part j to part j
    simulated = simulated_plan_bytes(traced.graph, parse_plan(plan), K80X4, res.plan)
    assert res.bytes_sent == simulated["bytes_sent"] and res.bytes_received == simulated["bytes_received"]
    assert res.bytes_sent[0] > res.bytes_sent[2]  # the first stage's: its activations, its blocks' partial sums


def test_a_tensor_parallel_pipeline_cut_between_blocks_sends_the_sum_of_the_stream_once():
    """LLaMA small cut one block per stage (``stages=1/1``, as the layered search writes its cuts), tp 2 x pp 2:
    the residual stream at the cut is a sum of the group's partial terms, which the stage sends all-reduced
    (the simulated plan sent the term as well); the attention of the other stage, replayed on scratch made
    from a split parameter, draws as one process does; within fp32 rounding, bytes = simulated."""
    traced = trace_zoo_step("llama", "small", microbatches=4, batch=8, optimizer="adamw")
    plan = "ddp:tp=2,pp=2,dp=1,m=4,schedule=1f1b,stages=1/1"
    res = launch_plan(traced, plan, K80X4, steps=3, batches=RandomBatches(0))
    assert_trains_as_one_process(traced, res)
    simulated = simulated_plan_bytes(traced.graph, parse_plan(plan), K80X4, res.plan)
    assert res.bytes_sent == simulated["bytes_sent"] and res.bytes_received == simulated["bytes_received"]
    stream = 2 * 16 * 32 * 4
    rotary = 16 * 4 * 4  # each of the two rotary tables (cosines, sines) the second stage reads
    assert sum(m.nbytes for m in res.plan.messages if m.src == 0) == 4 * stream + 2 * rotary


def test_the_grids_selective_plan_of_tensor_parallel_stages_trains_as_one_process():
    """What ``best-3d`` may now return where a plan fits only recomputed: ``zero1+selective`` with tp 2 x pp 2
    (torchtitan's selective rule in each block); within fp32 rounding of one process, each rank's bytes the
    simulated plan's."""
    traced = trace_zoo_step("llama", "small", microbatches=4, batch=8, optimizer="adamw")
    plan = "zero1+selective:m=4,dp=1,tp=2,pp=2,schedule=1f1b"
    res = launch_plan(traced, plan, K80X4, steps=2, batches=RandomBatches(0))
    assert_trains_as_one_process(traced, res, steps=2)
    simulated = simulated_plan_bytes(traced.graph, parse_plan(plan), K80X4, res.plan)
    assert res.bytes_sent == simulated["bytes_sent"] and res.bytes_received == simulated["bytes_received"]


def test_a_user_module_splits_where_the_pattern_is_in_two_zero1_groups():
    """A user's MLP (linear, GELU, linear) on 4 ranks, ``zero1:tp=2``: two groups (ranks 0-1, 2-3), each a
    replica of one micro-batch; the first layer split by columns, the second by rows; per group one
    all-reduce of the output (the first layer's input gradient, Megatron's backward all-reduce, is not
    computed: the batch needs none); per part one gradient bucket all-reduced over the replicas (ranks 0
    and 2, 1 and 3): this part's halves of the split layers and a whole copy of the last bias; then each
    replica updates the parameters it owns (the simulated plan's owners: the first weight replica 0, the
    rest replica 1) and the part's parameters are all-gathered from their owners."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 8))
    x, y = torch.randn(8, 16), torch.randn(8, 8)
    traced = trace(model, (x,), nn.functional.mse_loss, "adamw", microbatches=2, targets=(y,))
    res = launch_plan(traced, "zero1:tp=2,m=2", K80X4, steps=3, batches=RandomBatches(0))
    assert_trains_as_one_process(traced, res, learns=False)  # random targets every step: nothing to learn
    assert split_of(traced, res.plan) == {"0.weight": (0, 1), "0.bias": (0, 1), "2.weight": (1, 1)}
    grads = (16 * 32 + 32 + 32 * 8) // 2 * 4 + 8 * 4
    assert [(c.group, c.nbytes) for c in res.plan.collectives] == [
        ((0, 1), 4 * 8 * 4),
        ((2, 3), 4 * 8 * 4),
        ((0, 2), grads),
        ((1, 3), grads),
        ((0, 2), grads),
        ((1, 3), grads),
    ]
    assert res.plan.collectives[-1].owners == (0, 1, 1, 1)  # positions in the group (0 = replica 0)
    simulated = simulated_plan_bytes(traced.graph, parse_plan("zero1:tp=2,m=2"), K80X4, res.plan)
    assert res.bytes_sent == simulated["bytes_sent"] == {r: 4 * 8 * 4 + 2 * grads for r in range(4)}


def test_llama_split_in_fsdp_groups_trains_as_one_process_and_its_checkpoint_joins_back(tmp_path):
    """torchtitan's 2D plan: LLaMA (small, AdamW, 2 micro-batches, blocks recomputed) on 4 ranks,
    ``fsdp+recompute:tp=2``: two groups (ranks 0-1, 2-3), each an FSDP replica of one micro-batch; rank
    j + 2 r holds slice r of part j of every parameter and of its moments, gathers each unit's parts over the
    ranks of its part (0 and 2, 1 and 3) before the forward and again before the backward, and reduce-scatters
    their gradients there. Losses and parameters within fp32 rounding of one process, bytes = the simulated
    plan's, and the checkpoint's slices of parts join back into the user's model."""
    traced = trace_zoo_step("llama", "small", microbatches=2, batch=4, optimizer="adamw")
    plan = "fsdp+recompute:tp=2,m=2"
    res = launch_plan(traced, plan, K80X4, steps=3, batches=RandomBatches(0), checkpoint=tmp_path)
    assert_trains_as_one_process(traced, res)
    assert {c.group for c in res.plan.collectives if c.kind in ("all_gather", "reduce_scatter")} == {(0, 2), (1, 3)}
    wq = next(i for i, (n, _) in enumerate(traced.model.named_parameters()) if n == "blocks.0.attn.wq.weight")
    assert wq in res.plan.sharded and any(i == wq for i, _, _ in res.plan.tensor_split)
    simulated = simulated_plan_bytes(traced.graph, parse_plan(plan), K80X4, res.plan)
    assert res.bytes_sent == simulated["bytes_sent"] and res.bytes_received == simulated["bytes_received"]
    model = trace_zoo_step("llama", "small", microbatches=2, batch=4, optimizer="adamw").model
    assert load_into(model, tmp_path) == 3
    for name, p in model.named_parameters():
        assert torch.equal(p, res.parameters[name]), name


@pytest.mark.parametrize(
    "plan", ["ddp:tp=2,dp=2,m=4,shard=root", "fsdp+recompute:tp=2,sp,dp=2,m=4,shard=root/blocks.1"]
)
def test_a_per_unit_hybrid_of_tensor_parallel_groups_trains_as_one_process(plan):
    """A per-unit hybrid (the named units sharded as FSDP's, the others whole as DDP's, their gradients
    all-reduced in buckets) whose replicas are tp 2 groups (with sequence parallelism, recomputed, in the second):
    LLaMA small on 4 ranks, within fp32 rounding of one process, each rank's bytes the simulated plan's; the
    sharded units' parameters held as slices of parts, the others as parts."""
    traced = trace_zoo_step("llama", "small", microbatches=4, batch=8, optimizer="adamw")
    res = launch_plan(traced, plan, K80X4, steps=3, batches=RandomBatches(0))
    assert_trains_as_one_process(traced, res)
    names = [n for n, _ in traced.model.named_parameters()]
    sliced = {names[i] for i in res.plan.sharded if i < len(names)}
    assert "embed.weight" in sliced and "blocks.0.attn.wq.weight" not in sliced
    assert ("blocks.1.attn.wq.weight" in sliced) == ("blocks.1" in plan)
    simulated = simulated_plan_bytes(traced.graph, parse_plan(plan), K80X4, res.plan)
    assert res.bytes_sent == simulated["bytes_sent"] and res.bytes_received == simulated["bytes_received"]
    with pytest.raises(PostplaceError, match=r"shard= names unit 'blocks\.7', which the step does not have"):
        launch_plan(traced, "ddp:tp=2,dp=2,m=4,shard=blocks.7", K80X4)


def test_a_user_module_splits_in_zero2_groups():
    """The user's MLP on 4 ranks, ``zero2:tp=2,m=4``, Adam with AMSGrad (its running maximum copied into a
    moment's part): each replica's two micro-batches' gradients reduce-scattered to their owners over the
    ranks of each part, summed there, the owners' updates all-gathered; within fp32 rounding of one
    process, the bytes the simulated plan's."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 8))
    x, y = torch.randn(8, 16), torch.randn(8, 8)
    amsgrad = torch.optim.Adam(model.parameters(), lr=1e-2, amsgrad=True)
    traced = trace(model, (x,), nn.functional.mse_loss, amsgrad, microbatches=4, targets=(y,))
    res = launch_plan(traced, "zero2:tp=2,m=4", K80X4, steps=3, batches=RandomBatches(0))
    assert_trains_as_one_process(traced, res, learns=False)
    kinds = [(c.kind, c.group) for c in res.plan.collectives if c.kind != "all_reduce"]
    assert kinds == [("reduce_scatter", g) for _ in range(2) for g in ((0, 2), (1, 3))] + [
        ("all_gather", (0, 2)),
        ("all_gather", (1, 3)),
    ]
    simulated = simulated_plan_bytes(traced.graph, parse_plan("zero2:tp=2,m=4"), K80X4, res.plan)
    assert res.bytes_sent == simulated["bytes_sent"] and res.bytes_received == simulated["bytes_received"]


def test_dropout_between_split_layers_draws_the_one_process_masks():
    """A user's MLP with dropout on its input (whole) and between its split layers (each rank holds part of
    the activation), ``ddp:tp=2,dp=1``: each mask is drawn whole, as one process draws it, and each rank
    multiplies its part by its part of the mask, so both ranks' generators stay in step and the losses are
    the one-process step's (the whole values stay equal on both ranks); the same bytes as the simulated plan."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Dropout(0.1), nn.Linear(16, 32), nn.GELU(), nn.Dropout(0.2), nn.Linear(32, 8))
    x, y = torch.randn(8, 16), torch.randn(8, 8)
    traced = trace(model, (x,), nn.functional.mse_loss, "adamw", microbatches=2, targets=(y,))
    res = launch_plan(traced, "ddp:tp=2,dp=1,m=2", K80X4, steps=3, batches=RandomBatches(0))
    assert_trains_as_one_process(traced, res, learns=False)
    assert res.losses == one_process(traced, 3)[0]  # the same masks: the same losses, not close ones
    simulated = simulated_plan_bytes(traced.graph, parse_plan("ddp:tp=2,dp=1,m=2"), K80X4, res.plan)
    assert res.bytes_sent == simulated["bytes_sent"] == {0: 256, 1: 256}


def test_tensor_plans_launch_does_not_run_are_one_line():
    traced = trace_zoo_step("llama", "small", microbatches=2, batch=4, optimizer="adamw")
    for plan in ("fsdp:tp=2,pp=2,dp=1,m=2", "ddp:tp=2,pp=2,dp=1,m=2,shard=root"):
        with pytest.raises(PostplaceError, match=r"groups that are ddp, zero1, zero2 or fsdp replicas") as e:
            launch_plan(traced, plan, K80X4)
        assert "\n" not in str(e.value)
    one = {p: _one_replica(parse_plan(p), 4).level for p in ("zero2:tp=2,pp=2,dp=1", "fsdp:tp=4", "zero1:pp=2")}
    assert one == {"zero2:tp=2,pp=2,dp=1": "ddp", "fsdp:tp=4": "ddp", "zero1:pp=2": "zero1"}  # dp 1, 1, 2
    assert _one_replica(parse_plan("fsdp:pp=2,dp=1"), 2).level == "fsdp"  # FSDP in a pipeline: refused, not run
    for level in ("zero1", "fsdp"):  # launch_plan runs one such group as ddp's: it shards nothing
        with pytest.raises(PostplaceError, match=f"{level} shards over replicas of the 2-GPU group and the plan has 1"):
            tensor_plan(traced, [1, 2], K80X4.device_names, level=level)
    torch.manual_seed(0)
    mlp = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 8))  # two units: a cut between them
    cut = trace(mlp, (torch.randn(8, 16),), nn.functional.mse_loss, "sgd", microbatches=4, targets=(torch.randn(8, 8),))
    with pytest.raises(PostplaceError, match="the cut falls between the layers of a split pair"):
        launch_plan(cut, "ddp:tp=2,pp=2,dp=1,m=4,schedule=gpipe", K80X4)
    spec = parse_plan("ddp:tp=2,pp=2,dp=1,m=4,schedule=gpipe")  # the simulator refuses it alike: no price
    with pytest.raises(PostplaceError, match=r"falls between the layers of a split pair \(op 'mb0_gelu' on stage 0"):
        plan_step(cut.graph, K80X4, spec, plan_devices(K80X4, spec))
    torch.manual_seed(0)
    x, y = torch.randn(8, 16), torch.randn(8, 4)
    plain = trace(nn.Sequential(nn.Linear(16, 4)), (x,), nn.functional.mse_loss, "sgd", targets=(y,))
    with pytest.raises(PostplaceError, match="no pair of linear layers"):
        tensor_plan(plain, [1, 2], K80X4.device_names)


def test_launch_runs_a_run_folders_tensor_parallel_plan(tmp_path):
    """A run folder whose returned plan splits GPT-2 (small, AdamW) over two K80s, ``fsdp:tp=2,dp=1`` (a grid
    shape: FSDP over one group shards nothing, so it runs as ddp's group, its gathers over one rank moving no
    bytes in either): ``postplace launch`` runs it, the losses the one-process step's within fp32 rounding,
    the bytes the simulated plan's, in launch.json; the same with sequence parallelism."""
    _folder, out, losses = launched_run_folder(tmp_path / "run", "fsdp:m=2,dp=1,tp=2")
    assert out["losses"] == pytest.approx(losses, rel=1e-5)
    assert out["bytes_sent"] == out["simulated_bytes_sent"] and set(out["ranks"].values()) == {"gpu0", "gpu1"}
    assert min(out["bytes_sent"].values()) > 0  # the partial sums' all-reduces
    _folder, with_sp, losses = launched_run_folder(tmp_path / "sp", "fsdp:m=2,dp=1,tp=2,sp")  # the same, sp
    assert with_sp["losses"] == pytest.approx(losses, rel=1e-5)
    assert with_sp["bytes_sent"] == with_sp["simulated_bytes_sent"] and with_sp["bytes_sent"] != out["bytes_sent"]
