"""Sequence parallelism (``ddp:tp=2,sp``) on torch.distributed: the ops the simulated plan splits by tokens run
on each rank's tokens, each partial sum they read reduce-scattered, what the split layers read of them
all-gathered (issue 31 item 1's option, its numerics)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from postplace.cluster import load_cluster
from postplace.errors import PostplaceError
from postplace.graph.trace_torch import trace
from postplace.plans import parse_plan
from postplace.runtime.launcher import RandomBatches, launch_plan, simulated_plan_bytes
from postplace.runtime.tensor import part_of, tokens_back, tokens_front
from postplace.runtime.zoo_step import trace_zoo_step
from tests.launchhelp import one_process

pytestmark = pytest.mark.usefixtures("torch_one_thread")

K80X4 = load_cluster("k80x4")  # cpu, gpu0..gpu3


def assert_trains_as_one_process(traced, res, steps: int = 3):
    losses, params = one_process(traced, steps)
    assert res.losses == pytest.approx(losses, rel=1e-5)  # partial sums add in another order: fp32 rounding
    for name, p in params.items():
        assert torch.allclose(res.parameters[name], p, rtol=1e-4, atol=1e-6), name


def assert_moves_what_the_simulator_charges(traced, plan: str, res):
    simulated = simulated_plan_bytes(traced.graph, parse_plan(plan), K80X4, res.plan)
    assert res.bytes_sent == simulated["bytes_sent"] and res.bytes_received == simulated["bytes_received"]


def test_a_part_by_tokens_is_a_flat_chunk_of_the_front_layout_and_joins_back():
    x = torch.arange(2 * 8 * 3, dtype=torch.float32).view(16, 3)  # (2 sequences x 8 tokens, features)
    front = tokens_front(x, 0, 2, 2, [16, 3])  # by blocks of the first dimension: one per sequence
    for j in range(2):
        assert torch.equal(front[j].reshape(8, 3), part_of(x, 0, 16, 2, 2, j))  # tokens 4j..4j+3 of each
    assert torch.equal(tokens_back(front.reshape(-1), 0, 2, 2, [16, 3]), x)


def test_llama_with_sp_trains_as_one_process_and_moves_the_bytes_counted_by_hand():
    """LLaMA (small: 2 blocks, width 32, 2 sequences of 16 tokens per micro-batch, AdamW), ``ddp:tp=2,sp``:
    within fp32 rounding of one process. Per micro-batch each rank moves, in fp32 activations of 2 x 16 x 32:
    10 reduce-scatters (the embedding's lookups and the 4 row-split products' sums in the forward, the 5 norms'
    input gradients in the backward), 15 all-gathers (the 5 norm outputs in the forward, again in the backward,
    and the 5 gradients the row-split layers read), and all-reduces of the 5 norm weights' gradients (32
    values each) and of the cross-entropy's 3 values per token: the simulated plan's bytes."""
    traced = trace_zoo_step("llama", "small", microbatches=2, batch=4, optimizer="adamw")
    plan = "ddp:tp=2,sp,dp=1,m=2"
    res = launch_plan(traced, plan, K80X4, steps=3, batches=RandomBatches(0))
    assert_trains_as_one_process(traced, res)
    kinds = [c.kind for c in res.plan.collectives]
    assert (kinds.count("reduce_scatter"), kinds.count("all_gather")) == (2 * 10, 2 * 15)
    activation = 2 * 16 * 32 * 4
    per_microbatch = (10 + 15) * activation + 5 * 32 * 4 + 3 * 2 * 16 * 4
    assert res.bytes_sent == {0: 2 * per_microbatch, 1: 2 * per_microbatch}
    assert_moves_what_the_simulator_charges(traced, plan, res)


def test_sp_in_fsdp_groups_recomputed_trains_as_one_process():
    """torchtitan's 2D plan with sequence parallelism, LLaMA on 4 ranks, ``fsdp+recompute:tp=2,sp``: the
    recomputed blocks reduce-scatter their sums again in the backward, the norms' weight gradients are
    all-reduced over the group before FSDP reduce-scatters them over the replicas; the bytes the simulated
    plan's."""
    traced = trace_zoo_step("llama", "small", microbatches=4, batch=8, optimizer="adamw")
    plan = "fsdp+recompute:tp=2,sp,dp=2,m=4"
    res = launch_plan(traced, plan, K80X4, steps=3, batches=RandomBatches(0))
    assert_trains_as_one_process(traced, res)
    assert_moves_what_the_simulator_charges(traced, plan, res)


def test_gpt2s_layer_norms_and_tied_head_with_sp_in_zero1_groups():
    """GPT-2 (small, SGD): layer norms on each rank's tokens (their weight and bias gradients partial sums,
    all-reduced), the fused query/key/value split by heads, the table tied to the head split by vocabulary;
    two ZeRO-1 groups on 4 ranks, within fp32 rounding of one process, the simulated plan's bytes."""
    traced = trace_zoo_step("gpt2", "small", microbatches=4, batch=8, optimizer="sgd")
    plan = "zero1:tp=2,sp,dp=2,m=4"
    res = launch_plan(traced, plan, K80X4, steps=3, batches=RandomBatches(0))
    assert_trains_as_one_process(traced, res)
    assert_moves_what_the_simulator_charges(traced, plan, res)


class _Block(nn.Module):
    def __init__(self, width: int):
        super().__init__()
        self.norm, self.up, self.down = nn.LayerNorm(width), nn.Linear(width, 2 * width), nn.Linear(2 * width, width)
        self.drop = nn.Dropout(0.1)

    def forward(self, x):
        return x + self.drop(self.down(nn.functional.gelu(self.up(self.norm(x)))))


def test_a_users_blocks_with_dropout_under_sp_draw_the_one_process_masks():
    """A user's pre-norm blocks over (sequences, tokens, width) with dropout on the residual branch: the mask
    is drawn whole (so the generators of both ranks stay in step) and each rank multiplies its tokens by its
    part; the first block's norm runs whole (it reads the batch) and its backward on each rank's tokens, with
    the statistics cut to them: within fp32 rounding of one process, the simulated plan's bytes."""
    torch.manual_seed(0)
    model = nn.Sequential(_Block(16), _Block(16))
    x, y = torch.randn(4, 8, 16), torch.randn(4, 8, 16)
    traced = trace(model, (x,), nn.functional.mse_loss, "sgd", microbatches=2, targets=(y,))
    plan = "ddp:tp=2,sp,dp=1,m=2"
    res = launch_plan(traced, plan, K80X4, steps=3, batches=RandomBatches(0))
    assert_trains_as_one_process(traced, res)
    assert_moves_what_the_simulator_charges(traced, plan, res)


def test_a_pipeline_of_groups_with_sp_sends_each_parts_tokens_and_moves_what_the_simulator_charges():
    """LLaMA (small, AdamW, 4 micro-batches) on 4 ranks, ``ddp+recompute:tp=2,sp,pp=2`` under 1F1B: part j of a
    stage sends part j of the next its tokens of the stream (half the activation), the received gradient is
    gathered once per phase however many views the receiving stage rebuilds of it; within fp32 rounding of
    one process, each rank's bytes the simulated plan's."""
    traced = trace_zoo_step("llama", "small", microbatches=4, batch=8, optimizer="adamw")
    plan = "ddp+recompute:tp=2,sp,pp=2,dp=1,m=4,schedule=1f1b"
    res = launch_plan(traced, plan, K80X4, steps=3, batches=RandomBatches(0))
    assert_trains_as_one_process(traced, res)
    assert {(m.src, m.dst) for m in res.plan.messages} == {(0, 2), (1, 3), (2, 0), (3, 1)}  # part j to part j
    assert {m.nbytes for m in res.plan.messages} == {2 * 16 * 32 * 4 // 2}  # each part's tokens, both ways
    assert_moves_what_the_simulator_charges(traced, plan, res)


class _Stack(nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleList([_Block(16), _Block(16)])

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        return x


@pytest.mark.parametrize(
    "model, plan",
    [
        # blocks named: both on the first stage, the loss (reading every token) on the second, which gathers
        ("stack", "ddp:tp=2,sp,pp=2,dp=1,m=2,schedule=1f1b"),
        # no named blocks: the cut falls between a norm and its split linear; the second stage sends the first
        # the linear's input gradient (a partial sum) as its tokens, reduce-scattered
        ("sequential", "ddp:tp=2,sp,pp=2,dp=1,m=2,schedule=1f1b"),
        ("sequential", "ddp:tp=2,pp=2,dp=1,m=2,schedule=1f1b"),  # without sp: the sum all-reduced where it is made
    ],
)
def test_a_users_pipeline_of_groups_runs_each_collective_on_the_stage_the_simulator_charges(model, plan):
    """A tensor group's collective at a stage boundary runs on the stage the launch runs it on: an all-reduce or
    reduce-scatter where the partial sum is, an all-gather where the tokens are read; within fp32 rounding of
    one process (no dropout: one replica draws no masks here), each rank's bytes the simulated plan's."""
    torch.manual_seed(0)
    net = _Stack() if model == "stack" else nn.Sequential(_Block(16), _Block(16))
    for block in net.modules():
        if isinstance(block, _Block):
            block.drop.p = 0.0
    x, y = torch.randn(4, 8, 16), torch.randn(4, 8, 16)
    traced = trace(net, (x,), nn.functional.mse_loss, "sgd", microbatches=2, targets=(y,))
    res = launch_plan(traced, plan, K80X4, steps=3, batches=RandomBatches(0))
    assert_trains_as_one_process(traced, res)
    assert_moves_what_the_simulator_charges(traced, plan, res)


class _Pooled(nn.Module):
    """Two blocks, then ``pool`` over the tokens and a head; with ``inside``, each block's output goes through it."""

    def __init__(self, pool, inside: bool = False):
        super().__init__()
        self.blocks = nn.ModuleList([_Block(16), _Block(16)])
        self.head = nn.Linear(16, 16)
        self.pool, self.inside = pool, inside

    def forward(self, x):
        for block in self.blocks:
            x = self.pool(block(x)) if self.inside else block(x)
        return self.head(x if self.inside else self.pool(x))


@pytest.mark.parametrize(
    "pool, inside",
    [
        (lambda x: x.mean(dim=1), False),  # pooled before the head
        (lambda x: x.var(dim=1), False),  # its backward: a mean over the tokens too
        (lambda x: x - x.mean(dim=1, keepdim=True), True),  # in every block: its backward sums over the tokens
    ],
    ids=["mean", "var", "centred-blocks"],
)
def test_a_reduction_over_the_tokens_reads_them_all(pool, inside):
    """A user's blocks with a reduction over the tokens (not the features): it is not per token, forward or
    backward (before, the plan split the pooling by tokens and launch refused the step, and a backward's sum over
    the tokens was split and all-reduced without the simulator charging it), so the plan gathers what it reads;
    the launch trains as one process with the simulated plan's bytes, the norms stay split by tokens."""
    from postplace.graph.opgraph import REDUCES_ACROSS
    from postplace.runtime.tensor import sequence_split_of

    torch.manual_seed(0)
    net = _Pooled(pool, inside)
    for block in net.blocks:
        block.drop.p = 0.0
    x = torch.randn(4, 8, 16)
    y = torch.randn(4, 8, 16) if inside else torch.randn(4, 16)
    traced = trace(net, (x,), nn.functional.mse_loss, "sgd", microbatches=2, targets=(y,))
    across = set(traced.graph.metadata[REDUCES_ACROSS])
    plan = "ddp:tp=2,sp,dp=1,m=2"
    split = sequence_split_of(traced, parse_plan(plan)).ops
    assert across and any("layer_norm" in n for n in split)
    res = launch_plan(traced, plan, K80X4, steps=3, batches=RandomBatches(0))
    assert_trains_as_one_process(traced, res)
    assert_moves_what_the_simulator_charges(traced, plan, res)


def test_a_split_made_by_hand_after_the_programs_were_copied_is_one_line():
    """tensor_ranks finds the split ops by the names sequence_split_of stamps on the traced nodes: a SequenceSplit
    made otherwise, on a step never stamped, would silently drop sequence parallelism; it is refused."""
    from postplace.runtime.tensor import SequenceSplit, tensor_ranks

    x, y = torch.randn(2, 8, 16), torch.randn(2, 8, 16)
    traced = trace(nn.Sequential(_Block(16), _Block(16)), (x,), nn.functional.mse_loss, "sgd", targets=(y,))
    with pytest.raises(PostplaceError, match="make the SequenceSplit with sequence_split_of"):
        tensor_ranks(None, traced, 2, [1, 2], sequence=SequenceSplit(frozenset({"native_layer_norm"})))


def test_sp_on_a_step_without_tokens_is_one_line():
    """A user's blocks over (rows, features): nothing says which dimension holds tokens, so launch refuses sp
    in one line (the plan without ',sp' runs)."""
    from postplace.runtime.tensor import sequence_split_of, tensor_plan

    torch.manual_seed(0)
    x, y = torch.randn(8, 16), torch.randn(8, 16)
    traced = trace(nn.Sequential(_Block(16), _Block(16)), (x,), nn.functional.mse_loss, "sgd", targets=(y,))
    sequence = sequence_split_of(traced, parse_plan("ddp:tp=2,sp"))
    with pytest.raises(PostplaceError, match=r"no input of \(sequences, tokens\).*launch the plan without ',sp'") as e:
        tensor_plan(traced, [1, 2], K80X4.device_names, tp=2, sequence=sequence)
    assert "\n" not in str(e.value)
