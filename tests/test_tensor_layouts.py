"""The tensor-parallel rewrite's layout rules on small steps, without processes: the ranks' programs run in
threads whose all-reduces meet in memory (the arithmetic gloo does), against the one-process step.
The launch itself, with real processes, is tests/test_launch_tensor.py."""

from __future__ import annotations

import threading

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from postplace import zoo
from postplace.cluster import load_cluster
from postplace.errors import PostplaceError
from postplace.graph.trace_torch import trace
from postplace.plans import apply_plan, parse_plan
from postplace.plans.tensor import split_linears
from postplace.runtime.launcher import RandomBatches, _rank_state
from postplace.runtime.placed import apply
from postplace.runtime.ranks import ALL_REDUCE_MAX, REDUCE, REDUCE_MAX
from postplace.runtime.tensor import tensor_plan

pytestmark = pytest.mark.usefixtures("torch_one_thread")

K80X4 = load_cluster("k80x4")


class _Meeting:
    """The all-reduces of T threads: each posts its tensor, all wait, each takes the sum (or maximum)."""

    def __init__(self, plan, rank: int, board: dict, barrier: threading.Barrier):
        self.plan, self.rank, self.board, self.barrier = plan, rank, board, barrier

    def all_reduce(self, index, value):
        (x,) = value
        self.board[(index, self.rank)] = x.clone()
        self.barrier.wait()
        parts = torch.stack([self.board[(index, r)] for r in range(self.plan.world_size)])
        out = parts.amax(0) if self.plan.collectives[index].kind == ALL_REDUCE_MAX else parts.sum(0)
        self.barrier.wait()
        return [out]


def threaded_losses(traced, plan, steps: int = 2) -> list[float]:
    """The plan's ranks run as threads on the same batches as :func:`one_process`; rank 0's losses."""
    states = [_rank_state(traced, plan, r)[0] for r in range(plan.world_size)]
    board, barrier = {}, threading.Barrier(plan.world_size)
    batches, losses, errors = RandomBatches(0), [], []
    for _ in range(steps):
        xs = traced.split_batch(batches(traced))

        def run(r, xs=xs):
            gm = plan.programs[r].gm
            for name in (REDUCE, REDUCE_MAX):
                if hasattr(gm, name):
                    getattr(gm, name).channel = _Meeting(plan, r, board, barrier)
            try:
                with torch.no_grad():
                    out = gm(*states[r], *xs)
            except Exception as exc:  # noqa: BLE001 - reported below, the barrier broken for the others
                errors.append(exc)
                barrier.abort()
                return
            if r == 0:
                losses.append(float(out[0] if isinstance(out, (tuple, list)) else out))

        threads = [threading.Thread(target=run, args=(r,)) for r in range(plan.world_size)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if errors:
            raise errors[0]
    return losses


def one_process(traced, steps: int = 2) -> list[float]:
    step = apply(traced.model, traced, np.zeros(traced.graph.num_ops, dtype=np.int64), K80X4, device_map="cpu")
    batches = RandomBatches(0)
    return [float(step(*batches(traced))) for _ in range(steps)]


def step_of(model, x, y, loss=F.mse_loss, m: int = 2):
    torch.manual_seed(0)
    return trace(model, (x,), loss, "sgd", microbatches=m, targets=(y,))


class _Scalar(nn.Module):
    """A number added to the row-split layer's output: to the sum, once, not to each rank's term."""

    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(16, 32), nn.Linear(32, 8, bias=False)

    def forward(self, x):
        return self.fc2(F.gelu(self.fc1(x))) + 1.5


class _TwoViews(nn.Module):
    """The row-split output read through a view and directly: reducing the view must not sum the other."""

    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(16, 32), nn.Linear(32, 8, bias=False)

    def forward(self, x):
        h = self.fc2(F.gelu(self.fc1(x)))
        return torch.relu(h.view(-1, 4)).view(h.shape) + torch.tanh(h)


@pytest.mark.parametrize("module", [_Scalar, _TwoViews])
def test_partial_sums_are_summed_once(module):
    torch.manual_seed(0)
    traced = step_of(module(), torch.randn(8, 16), torch.randn(8, 8))
    plan = tensor_plan(traced, [1, 2], K80X4.device_names)
    assert threaded_losses(traced, plan) == pytest.approx(one_process(traced), rel=1e-5)


def test_a_squeeze_keeps_a_split_dimension_whose_part_has_size_one():
    """The columns of a 2-wide layer over 2 GPUs: each rank holds 1; ``squeeze()`` drops only what the whole
    tensor has of size 1."""

    class Narrow(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc1, self.fc2 = nn.Linear(16, 2), nn.Linear(2, 8)

        def forward(self, x):
            h = self.fc1(x).unsqueeze(1)  # (b, 1, 2): split along its last dimension
            return self.fc2(F.gelu(h.squeeze()))

    torch.manual_seed(0)
    traced = step_of(Narrow(), torch.randn(8, 16), torch.randn(8, 8))
    plan = tensor_plan(traced, [1, 2], K80X4.device_names)
    assert threaded_losses(traced, plan) == pytest.approx(one_process(traced), rel=1e-5)


def test_what_the_split_cannot_run_is_one_line_before_any_rank_starts():
    class HeadMask(nn.Module):  # attention with a mask per head: each rank would need its heads' part
        def __init__(self):
            super().__init__()
            self.q, self.k, self.v, self.o = (nn.Linear(16, 16, bias=False) for _ in range(4))

        def forward(self, x):
            b, t, d = x.shape
            q, k, v = (m(x).view(b, t, 4, 4).transpose(1, 2) for m in (self.q, self.k, self.v))
            mask = torch.arange(4 * t * t, dtype=torch.float32).view(1, 4, t, t) * -0.01
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
            return x + self.o(y.transpose(1, 2).reshape(b, t, d))

    torch.manual_seed(0)
    traced = step_of(HeadMask(), torch.randn(4, 6, 16), torch.randn(4, 6, 16))
    with pytest.raises(PostplaceError, match="tensor parallelism: op .* reads") as e:
        tensor_plan(traced, [1, 2], K80X4.device_names)
    assert "\n" not in str(e.value)
    from postplace.runtime.zoo_step import trace_zoo_step

    llama = trace_zoo_step("llama", "small", microbatches=1, batch=2, optimizer="sgd")
    with pytest.raises(PostplaceError, match="tp=4 does not divide the 2 kv heads"):
        tensor_plan(llama, [1, 2, 3, 4], K80X4.device_names)


def test_a_regression_head_is_not_split_by_vocabulary():
    """Only logits that reach a softmax are a vocabulary (Megatron-LM's cross-entropy); a regression head
    after a split pair stays whole, in the simulated plan and the launched one alike."""
    model = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 16), nn.Linear(16, 4))
    traced = step_of(model, torch.randn(8, 16), torch.randn(8, 4))
    role, whole = split_linears(traced.graph)
    assert "vocab" not in role.values() and len(whole) == 1
    plan = tensor_plan(traced, [1, 2], K80X4.device_names)
    assert threaded_losses(traced, plan) == pytest.approx(one_process(traced), rel=1e-5)


def test_the_vocabulary_reduction_counts_tokens_through_a_layer_norm():
    """GPT-2 with an untied head after its final LayerNorm: three fp32 values per token, 2 x 16 tokens per
    micro-batch (the norm's op also makes its statistics; the head reads only its output)."""
    g = zoo.cached_graph("gpt2", "small", "adamw")
    planned = apply_plan(g, parse_plan("ddp:tp=2"), 1).graph
    tied = [c.nbytes for c in planned.collectives if "softmax" in c.name]  # GPT-2's head, tied: split too
    assert tied == [3 * 4.0 * 2 * 16]  # each token's maximum, sum and target logit
    lm = step_of(_LM(), torch.randint(0, 16, (4, 6)), torch.randint(0, 16, (4, 6)), loss=_lm_loss)
    sizes = [c.nbytes for c in apply_plan(lm.graph, parse_plan("ddp:tp=2"), 1).graph.collectives if "softmax" in c.name]
    assert sizes and set(sizes) == {3 * 4.0 * 2 * 6}


class _LM(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb, self.fc1, self.fc2 = nn.Embedding(16, 8), nn.Linear(8, 32), nn.Linear(32, 8)
        self.ln, self.head = nn.LayerNorm(8), nn.Linear(8, 16)

    def forward(self, tok):
        h = self.emb(tok)
        h = h + self.fc2(F.gelu(self.fc1(h)))
        return self.head(self.ln(h))


def _lm_loss(logits, targets):
    return F.cross_entropy(logits.reshape(-1, 16), targets.reshape(-1))


def test_a_group_out_of_rank_order_is_refused_before_launch():
    """torch orders a process group's ranks; an all-gather's owners are positions in the group as written."""
    from postplace.runtime.ranks import Collective, RankPlan, RankProgram

    gm = torch.fx.GraphModule(nn.Module(), torch.fx.Graph())
    programs = tuple(RankProgram(r, r, gm, (), (), (("collective", 0),)) for r in range(2))
    plan = RankPlan(
        ("a", "b"), (0, 1), (), programs, 0, (Collective(0, "all_reduce", "x", (1,), torch.float32, group=(1, 0)),)
    )
    with pytest.raises(PostplaceError, match=r"names its group \[1, 0\] out of rank order"):
        plan.check()
