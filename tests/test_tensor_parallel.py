"""Tensor parallelism as a graph pass (issue 31 item 1): Megatron-LM's column/row split found by data flow,
held to hand-computed numbers: four all-reduces of one block's activation per block and micro-batch, each
GPU holding and computing half of a block's linear layers at t = 2, FSDP gathering half of them, the
all-reduces on the forward's critical path, and refusals where the pattern is absent."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from postplace import zoo
from postplace.errors import PostplaceError
from postplace.graph import from_torch
from postplace.placers.practitioner import plan_words
from postplace.plans import apply_plan, parse_plan
from postplace.plans.tensor import split_linears, tensor_parallel
from postplace.sim import Simulator
from postplace.testing import star_cluster

# llama small: batch 2, seq 16, d 32, 2 blocks, 4 heads (2 kv heads), ffn 64; fp32
ACTIVATION = 2 * 16 * 32 * 4  # one block's output, bytes


def traced(m: int):
    return zoo.cached_graph("llama", "small", "adamw", microbatches=m)


def roles(g):
    role, whole = split_linears(g)
    return {g.names[p].removeprefix("param:"): r for p, r in role.items()}, sorted(g.module[i] for i in whole)


def test_the_zoo_blocks_split_as_megatron_splits_them():
    role, whole = roles(zoo.cached_graph("llama", "small", "adamw"))
    for b in range(2):
        for w in ("attn.wq", "attn.wk", "attn.wv", "mlp.w1", "mlp.w3"):
            assert role.pop(f"blocks.{b}.{w}.weight") == "column"
        for w in ("attn.wo", "mlp.w2"):
            assert role.pop(f"blocks.{b}.{w}.weight") == "row"
    # the output head split by vocabulary, and the input embedding of the same vocabulary with it
    assert role == {"head.weight": "vocab", "embed.weight": "embedding"} and whole == []
    role, whole = roles(zoo.cached_graph("gpt2", "small", "adamw"))
    for b in range(2):  # column layers' biases split with them; a row layer's bias stays whole
        for w in ("qkv.weight", "qkv.bias", "fc.weight", "fc.bias"):
            assert role.pop(f"blocks.{b}.{w}") == "column"
        for w in ("proj.weight", "fc2.weight"):
            assert role.pop(f"blocks.{b}.{w}") == "row"
    assert role == {"wte.weight": "vocab"} and whole == []  # the head and the embedding share one table


def test_a_users_mlp_is_split_and_a_norm_between_the_layers_is_not():
    x, y = torch.randn(8, 16), torch.randn(8, 16)
    mlp = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.GELU(), torch.nn.Linear(64, 16))
    role, _ = roles(from_torch(mlp, (x,), torch.nn.functional.mse_loss, targets=(y,)))
    assert role == {"0.weight": "column", "0.bias": "column", "2.weight": "row"}
    normed = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.LayerNorm(64), torch.nn.Linear(64, 16))
    g = from_torch(normed, (x,), torch.nn.functional.mse_loss, targets=(y,))
    assert roles(g)[0] == {}
    with pytest.raises(PostplaceError, match="no pair of linear layers"):
        tensor_parallel(g, 2)


def test_tp_must_divide_the_heads():
    with pytest.raises(PostplaceError, match="tp=3 does not divide the 4 heads"):
        apply_plan(zoo.cached_graph("llama", "small", "adamw"), parse_plan("ddp:tp=3"), 1)


def test_one_block_makes_four_all_reduces_of_its_activation_per_micro_batch():
    """Per micro-batch: 4 all-reduces of one block's activation per block, one of the head's input gradient,
    one of the embedding's vectors (each rank looks up its rows), and the vocabulary-parallel cross-entropy's
    one (each token's max, sum and target logit: 3 x 32 tokens x 4 bytes)."""
    g = zoo.cached_graph("llama", "small", "adamw")
    planned = apply_plan(g, parse_plan("ddp:tp=2"), 1)
    assert planned.replicas == 2 and sorted(set(planned.replica.tolist())) == [0, 1]
    tp = [c for c, coll in enumerate(planned.graph.collectives) if coll.name.startswith("tp:")]
    member_of = planned.graph.collective
    for c in tp:
        assert planned.graph.collectives[c].kind == "all_reduce"
        assert sorted(planned.replica[member_of == c].tolist()) == [0, 1]  # one member per GPU of the group
    sizes = sorted(planned.graph.collectives[c].nbytes for c in tp)
    assert sizes == [3 * 32 * 4] + [ACTIVATION] * (4 * 2 + 1 + 1)
    fwd = [c for c in tp if planned.graph.phase[np.flatnonzero(member_of == c)[0]] == 0]
    assert len(fwd) == 4 + 1 + 1


def test_each_gpu_holds_and_computes_half_of_the_split_layers():
    g = zoo.cached_graph("llama", "small", "adamw")
    planned = apply_plan(g, parse_plan("ddp:tp=2"), 1)
    h = planned.graph
    rank0 = planned.replica == 0
    split = ("attn.w", "mlp.w", "head", "embed")

    def total(graph, field, keep, where):
        mods = np.array([any(s in m for s in split) for m in graph.module])
        sel = where & (mods if keep else ~mods)
        return float(getattr(graph, field)[sel].sum())

    fwd_mm = lambda graph: (graph.phase == 0) & np.array([t == "mm" for t in graph.op_types])  # noqa: E731
    params = lambda graph: np.array([n.split("/")[-1].startswith("param:") for n in graph.names])  # noqa: E731
    assert total(h, "flops", True, fwd_mm(h) & rank0) == pytest.approx(total(g, "flops", True, fwd_mm(g)) / 2)
    assert total(g, "flops", False, fwd_mm(g)) == 0  # every linear layer of the model is split
    assert total(h, "persistent_bytes", True, params(h) & rank0) == pytest.approx(
        total(g, "persistent_bytes", True, params(g)) / 2
    )
    assert total(h, "persistent_bytes", False, params(h) & rank0) == pytest.approx(
        total(g, "persistent_bytes", False, params(g))
    )


def test_fsdp_gathers_half_of_a_split_block():
    g = zoo.cached_graph("llama", "small", "adamw")
    whole = apply_plan(g, parse_plan("fsdp"), 1).graph
    split = apply_plan(g, parse_plan("fsdp:tp=2"), 1).graph
    block = [i for i, n in enumerate(g.names) if n.startswith("param:blocks.0.")]
    norms = sum(g.output_bytes[i] for i in block if "norm" in g.names[i])
    linears = sum(g.output_bytes[i] for i in block if "norm" not in g.names[i])
    gather = lambda graph: [c.nbytes for c in graph.collectives if c.name.startswith("all_gather:blocks.0:mb0:forward")]  # noqa: E731
    assert gather(whole) == [pytest.approx(norms + linears)]
    assert gather(split) == [pytest.approx(norms + linears / 2)] * 2  # one gather per GPU of the group


def test_the_forward_all_reduces_are_on_the_critical_path():
    g = zoo.cached_graph("llama", "small", "adamw")
    planned = apply_plan(g, parse_plan("ddp:tp=2"), 1)

    def step(bandwidth):
        cluster = star_cluster(("gpu", "gpu"), bandwidth=bandwidth)
        res = Simulator(planned.graph, cluster).evaluate_ops(planned.placement([0, 1]))
        assert not res.failed[0]
        return float(res.step_time[0])

    slow, fast = 1e6, 1e15
    ring = ACTIVATION / slow  # a ring all-reduce over 2 GPUs moves 2 (k - 1) / k = 1 activation per GPU
    vocab = 3 * 32 * 4 / slow  # the cross-entropy's max, sum and target logit per token
    delta = step(slow) - step(fast)
    # the forward's 4 block all-reduces, the embedding's and the vocabulary's wait; at most the backward's 5 more
    assert (5 * ring + vocab) * 0.999 <= delta <= (10 * ring + vocab) * 1.001
    single = Simulator(g, star_cluster(("gpu",))).evaluate_ops(np.zeros(g.num_ops, dtype=np.int64))
    assert step(fast) < float(single.step_time[0])  # half the block's work on each GPU


def test_plans_name_and_place_their_tensor_groups():
    spec = parse_plan("fsdp:tp=2,pp=2,m=8")
    assert str(spec) == "fsdp:m=8,tp=2,pp=2,schedule=1f1b" and spec.replicas_over(8) == 2
    words = plan_words(spec, [f"gpu{i}" for i in range(8)], 8)
    assert words == "fsdp over 8 GPUs (gpu0..gpu7), tp 2 x pp 2 x dp 2, 1F1B, 8 micro-batches"
    assert str(parse_plan("ddp:tp=1")) == "ddp"


def test_a_pipeline_of_tensor_groups_keeps_each_group_on_its_stage():
    from postplace.placers.practitioner import plan_step

    g = traced(2)
    cluster = star_cluster(("gpu",) * 8)
    res = plan_step(g, cluster, parse_plan("ddp:tp=2,pp=2,m=2"), list(range(8)))
    h = res.graph
    for c, coll in enumerate(h.collectives):
        if coll.name.startswith("tp:"):
            devs = sorted(res.placement[h.collective == c].tolist())
            assert len(devs) == 2 and devs[0] // 2 == devs[1] // 2  # the group's two neighbouring GPUs
    stage = {i: d // 4 for i, d in enumerate(res.placement.tolist())}
    first = [i for i, n in enumerate(h.names) if n.endswith("/param:blocks.0.attn.wq.weight")]
    last = [i for i, n in enumerate(h.names) if n.endswith("/param:head.weight")]
    assert {stage[i] for i in first} == {0} and {stage[i] for i in last} == {1}
    assert not res.oom and res.step_time_s > 0
