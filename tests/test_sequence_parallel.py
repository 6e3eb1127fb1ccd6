"""Sequence parallelism (issue 31 item 1's option): the norms and residual adds between the blocks split by
tokens over the tensor group, held to hand-counted collectives (a reduce-scatter and an all-gather where
plain tp all-reduces, one more gather per split pair in the backward), to Korthikanti et al.'s claim that
with it every activation a block keeps is 1/t of one GPU's, and to one error line where it cannot go."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from postplace import zoo
from postplace.errors import PostplaceError
from postplace.placers.layered import measure_units
from postplace.placers.practitioner import plan_words
from postplace.plans import apply_plan, parse_plan
from postplace.plans.tensor import tensor_parallel
from postplace.testing import star_cluster

# llama small: batch 2, seq 16, d 32, 2 blocks, 4 heads (2 kv heads), ffn 64; fp32
ACTIVATION = 2 * 16 * 32 * 4  # one block's output, bytes
NORM = 32 * 4  # an RMSNorm's weight (and its gradient), bytes


def tp_collectives(text: str):
    """Each tensor-group collective of the planned step (LLaMA small, one micro-batch): (kind, bytes, phase)."""
    planned = apply_plan(zoo.cached_graph("llama", "small", "adamw"), parse_plan(text), 1)
    g = planned.graph
    out = []
    for c, coll in enumerate(g.collectives):
        if coll.name.startswith("tp:"):
            first = int(np.flatnonzero(g.collective == c)[0])
            out.append((coll.kind, coll.nbytes, int(g.phase[first])))
    return out


def bus(kind: str, nbytes: float, k: int = 2) -> float:
    """Bytes each GPU sends in a ring (DESIGN section 3)."""
    return (2 if kind == "all_reduce" else 1) * (k - 1) / k * nbytes


def test_each_block_reduce_scatters_and_gathers_where_plain_tp_all_reduces():
    """Per block and micro-batch: forward, 2 reduce-scatters of the block's two products' partial sums and 2
    gathers of the norms' outputs; backward, 2 gathers of the gradients the row-split layers read, 2 gathers
    of the norms' outputs again (for the column-split weights' gradients; not kept whole from the forward)
    and 2 reduce-scatters of the column-split inputs' gradients. Around the blocks: the embedding's partial
    vectors reduce-scattered and their gradient gathered for the table's backward; the head's input gathered
    (forward and backward) and its gradient reduce-scattered; the five norms' weight gradients (summed over
    each GPU's tokens) all-reduced; the vocabulary cross-entropy's 3 values per token as before."""
    colls = tp_collectives("ddp:tp=2,sp")
    count = lambda kind, phase: sum(1 for k, b, p in colls if k == kind and p == phase and b == ACTIVATION)  # noqa: E731
    assert count("reduce_scatter", 0) == 2 * 2 + 1
    assert count("all_gather", 0) == 2 * 2 + 1
    assert count("all_gather", 1) == 2 * 4 + 1 + 1
    assert count("reduce_scatter", 1) == 2 * 2 + 1
    rest = sorted((k, b, p) for k, b, p in colls if b != ACTIVATION)
    assert rest == [("all_reduce", NORM, 1)] * 5 + [("all_reduce", 3 * 32 * 4, 0)]
    # the forward moves what plain tp's all-reduces move; the backward's gathers again are the price
    plain = tp_collectives("ddp:tp=2")
    forward = lambda cs: sum(bus(k, b) for k, b, p in cs if p == 0)  # noqa: E731
    assert forward(colls) == pytest.approx(forward(plain))
    backward = lambda cs: sum(bus(k, b) for k, b, p in cs if p == 1 and b == ACTIVATION)  # noqa: E731
    assert backward(colls) == pytest.approx(backward(plain) + bus("all_gather", ACTIVATION) * (2 * 2 + 1))


@pytest.mark.parametrize("model, precision", [("llama", "fp32"), ("llama", "bf16"), ("gpt2", "bf16")])
def test_a_block_keeps_one_t_th_of_its_activations(model, precision):
    """Korthikanti et al. (2022), Sec. 4.2.2: with tensor and sequence parallelism every activation a block
    keeps for its backward is split over the t GPUs; plain tp keeps the norms' and residual's whole. The
    stream between two blocks (what a pipeline stage sends) is 1/t of it too. Under autocast the norm's
    output is gathered after its cast (bf16), again in the backward, never kept whole."""
    from postplace.cluster import load_cluster

    g = zoo.cached_graph(model, "small", "adamw", microbatches=2, precision=precision)
    cluster = load_cluster("dgx8")
    one = measure_units(g, cluster, [0], tensor=1)
    plain = measure_units(g, cluster, [0, 1], tensor=2)
    sp = measure_units(g, cluster, [0, 1], tensor=2, sequence=True)
    blocks = slice(1, -1)
    assert np.array_equal(sp.activation_bytes[blocks], one.activation_bytes[blocks] / 2)
    assert np.all(plain.activation_bytes[blocks] > one.activation_bytes[blocks] / 2)
    if model == "llama":  # GPT-2's cut also carries a value besides the stream, which sp does not split
        assert np.array_equal(sp.boundary_bytes[blocks], one.boundary_bytes[blocks] / 2)


def test_recomputation_reduce_scatters_the_recomputed_stream_and_gathers_nothing_more():
    """A recomputed block's residual adds are reduce-scattered again (as plain tp all-reduces them again), and
    the gathers are the same as without recomputation: the recomputed stream is split by tokens, as the
    forward's."""

    def kinds(text):
        g = zoo.cached_graph("llama", "small", "adamw")
        planned = apply_plan(g, parse_plan(text), 1).graph
        out: dict[str, float] = {}
        for c in planned.collectives:
            if c.name.startswith("tp:"):
                out[c.kind] = out.get(c.kind, 0.0) + c.nbytes
        return out

    plain, again = kinds("ddp:tp=2,sp"), kinds("ddp+recompute:tp=2,sp")
    assert again["all_gather"] == plain["all_gather"]
    # each block's attention output again; its MLP's output is the next block's input, kept
    assert again["reduce_scatter"] == plain["reduce_scatter"] + 2 * ACTIVATION


def test_the_norms_run_once_per_group_and_gathering_costs_time_on_slow_links():
    """On links of no cost, sp is faster than plain tp (each GPU normalises half of the tokens); on slow
    links slower (it moves a quarter more: the backward's gathers again)."""
    from postplace.sim import Simulator

    g = zoo.cached_graph("llama", "small", "adamw")

    def step(text, bandwidth):
        planned = apply_plan(g, parse_plan(text), 1)
        res = Simulator(planned.graph, star_cluster(("gpu",) * 2, bandwidth=bandwidth)).evaluate_ops(
            planned.placement([0, 1])
        )
        return float(res.step_time[0])

    assert step("ddp:tp=2,sp", 1e15) < step("ddp:tp=2", 1e15)
    assert step("ddp:tp=2,sp", 1e6) > step("ddp:tp=2", 1e6)


def test_sp_reads_and_writes_as_users_write_it():
    spec = parse_plan("fsdp:tp=2,sp,pp=2,m=8")
    assert spec.sequence and str(spec) == "fsdp:m=8,tp=2,sp,pp=2,schedule=1f1b"
    assert parse_plan(str(spec)) == spec
    words = plan_words(parse_plan("zero1:tp=2,sp,m=8"), [f"gpu{i}" for i in range(8)], 8)
    assert words == "zero1 over 8 GPUs (gpu0..gpu7), tp 2 with sequence parallelism x dp 4, 8 micro-batches"


@pytest.mark.parametrize(
    "text, match",
    [
        ("ddp:sp", "give tp=T with T >= 2"),
        ("ddp:tp=1,sp", "give tp=T with T >= 2"),
        ("ddp:tp=2,sp,sp", "sp is given twice"),
    ],
)
def test_sp_without_a_tensor_group_is_one_line(text, match):
    with pytest.raises(PostplaceError, match=match) as e:
        parse_plan(text)
    assert "\n" not in str(e.value)


def test_a_sequence_the_group_does_not_divide_is_one_line():
    g = zoo.cached_graph("llama", "small", "adamw")
    zoo_meta = g.metadata["zoo"]
    odd = dataclasses.replace(
        g, metadata={**g.metadata, "zoo": {**zoo_meta, "config": {**zoo_meta["config"], "seq": 15}}}
    )
    with pytest.raises(PostplaceError, match="tp=2 does not divide the sequence of 15 tokens") as e:
        tensor_parallel(odd, 2, sequence=True)
    assert "\n" not in str(e.value)
    tensor_parallel(odd, 2)  # plain tp splits heads, not tokens


def test_simulate_layered_prices_sp_as_measured_with_it():
    """``simulate --plan ... --layered`` measures the units with sequence parallelism when the plan says sp:
    the same plan holds less than without it."""
    from postplace.api.plans import estimate_plan_layered

    kw = dict(size="small@16", optimizer="adamw", precision="bf16")
    sp, _, _ = estimate_plan_layered("llama", "dgx8", "ddp:tp=2,sp,m=16", **kw)
    plain, _, _ = estimate_plan_layered("llama", "dgx8", "ddp:tp=2,m=16", **kw)
    assert sp.plan.endswith(",sp") or ",sp," in sp.plan
    assert sp.peak_bytes < plain.peak_bytes


def test_a_loss_averaged_over_every_token_is_not_split_by_tokens():
    """A user's blocks (a hand-written RMS norm, a linear pair) whose loss is ``((out - y) ** 2).mean()``: the
    mean of a scalar runs over every token, so it is left whole (its input gathered), where the per-token
    allow-list alone would split it and the plan could not be built."""
    import torch
    from torch import nn

    from postplace.graph.trace_torch import trace
    from postplace.plans.tensor import sequence_split_ops

    class Norm(nn.Module):
        def __init__(self, width):
            super().__init__()
            self.weight = nn.Parameter(torch.ones(width))

        def forward(self, x):
            return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * self.weight

    class Block(nn.Module):
        def __init__(self, width):
            super().__init__()
            self.norm, self.up, self.down = Norm(width), nn.Linear(width, 2 * width), nn.Linear(2 * width, width)

        def forward(self, x):
            return x + self.down(nn.functional.silu(self.up(self.norm(x))))

    torch.manual_seed(0)
    x, y = torch.randn(4, 8, 16), torch.randn(4, 8, 16)
    traced = trace(nn.Sequential(Block(16), Block(16)), (x,), lambda o, t: ((o - t) ** 2).mean(), "sgd", targets=(y,))
    g = traced.graph
    split = sequence_split_ops(g)
    means = [g.names[i] for i in range(g.num_ops) if g.op_types[i] == "mean"]
    scalar = [m for m in means if g.output_bytes[g.names.index(m)] <= 8]
    assert len(scalar) == 1 and scalar[0] not in split  # the loss
    first, second = [m for m in means if m not in scalar]  # each norm's mean over its token's features
    assert first not in split and second in split  # the first norm reads the batch (whole); the second is split
    split_step = tensor_parallel(g, 2, sequence=True)
    loss = split_step.names.index(scalar[0])
    gathers = [i for i in range(split_step.num_ops) if split_step.op_types[i] == "tp_all_gather"]
    assert any(loss in split_step.edge_dst[split_step.edge_src == i] for i in gathers)  # it reads every token
