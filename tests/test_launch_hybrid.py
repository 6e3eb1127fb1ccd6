"""Per-unit hybrids of ddp and fsdp (``ddp:shard=U/U``, ``fsdp:shard=U/U``) run as one gloo process per replica
(issue 33): the units named held as slices, gathered before each micro-batch's forward and backward and
reduce-scattered per micro-batch (fsdp's), the others whole, their gradients summed over the replica's
micro-batches and all-reduced in buckets after the backward (ddp's). The losses of 3 AdamW steps equal the
plain ddp launch's, the parameters within fp32 rounding (a sharded unit's gradients are summed per
micro-batch across the replicas, then over the micro-batches: another order than ddp's), and every rank moves
the simulated hybrid plan's collectives."""

from __future__ import annotations

import functools

import pytest
import torch
from torch import nn

from postplace.errors import PostplaceError
from postplace.graph.trace_torch import trace
from postplace.plans import data_parallel, parse_plan, unit_of
from postplace.runtime.ddp import launchable
from postplace.runtime.fsdp import fsdp_plan
from postplace.runtime.launcher import RandomBatches, _rank_state, launch_plan
from tests.launchhelp import launched_run_folder
from tests.test_launch_ddp import K80X4

pytestmark = pytest.mark.usefixtures("torch_one_thread")

BLOCKS = ("blocks.0", "blocks.1")


class Tiny(nn.Module):
    """An embedding and a head (the root unit) around two numbered residual blocks."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(20, 16)
        self.blocks = nn.ModuleList([nn.Sequential(nn.Linear(16, 16), nn.GELU(), nn.Linear(16, 16)) for _ in BLOCKS])
        self.head = nn.Linear(16, 5)

    def forward(self, x):
        h = self.embed(x)
        for block in self.blocks:
            h = h + block(h)
        return self.head(h.mean(1))


def tiny_step():
    torch.manual_seed(0)
    x, y = torch.randint(0, 20, (8, 6)), torch.randint(0, 5, (8,))
    return trace(Tiny(), (x,), nn.functional.cross_entropy, "adamw", microbatches=4, targets=(y,))


@functools.cache
def launched(plan: str):
    """3 steps of ``plan`` on two ranks (2 micro-batches each), the same batches for every plan."""
    return launch_plan(tiny_step(), plan, K80X4, steps=3, batches=RandomBatches(0), seed=0)


def _label(units) -> str:
    return "/".join(sorted(u or "root" for u in units))


def _units_of(traced, names) -> set[str]:
    return {unit_of(traced.graph.module[traced.op_of_node[n]]) for n in names}


@pytest.mark.parametrize(
    ("plan", "units"),
    [("ddp:m=4,dp=2,shard=root", {""}), ("fsdp+recompute:m=4,dp=2,shard=root/blocks.1", {"", "blocks.1"})],
)
def test_hybrid_trains_as_ddp_and_moves_the_simulated_hybrids_collectives(plan, units):
    """3 AdamW steps (the second plan recomputing both blocks, the sharded one from its backward gather): the
    losses are plain ddp's (bit for bit here), the parameters within fp32 rounding of ddp's (measured 1.5e-8)
    and moved well beyond it.
    Every rank calls, in this order per micro-batch, each sharded unit's forward gather (the root's first: the
    embedding reads it), their backward gathers (the root's first: the head's backward), their reduce-scatters,
    then one all-reduce of the others' gradients (a 25 MB bucket holds them); the collectives and the bytes
    are the simulated hybrid plan's, unit for unit and micro-batch for micro-batch."""
    hybrid, ddp = launched(plan), launched("ddp:m=4,dp=2")
    assert hybrid.losses == ddp.losses and ddp.losses[2] < ddp.losses[0]
    initial = dict(tiny_step().model.named_parameters())
    assert list(hybrid.parameters) == list(initial)
    moved = 0.0
    for name, p in ddp.parameters.items():
        torch.testing.assert_close(hybrid.parameters[name], p, rtol=1e-5, atol=1e-7)
        moved = max(moved, float((p - initial[name].detach()).abs().max()))
    assert moved > 1e-3

    traced = tiny_step()
    ordered = sorted(units)  # the root ("") first
    per_mb = ["all_gather"] * len(units) * 2 + ["reduce_scatter"] * len(units)
    assert [c.kind for c in hybrid.plan.collectives] == per_mb * 2 + ["all_reduce"]
    got = []
    for c in hybrid.plan.collectives:
        names, _, tag = c.value.partition("@")
        got.append((c.kind, _label(_units_of(traced, names.split("+"))), tag, c.nbytes))
    simulated = data_parallel(traced.graph, 2, "ddp", shard=frozenset(units)).graph.collectives
    expected = []
    for c in simulated:
        if c.kind == "all_reduce":  # all_reduce:bucket0: the gradients of every unit not sharded
            expected.append((c.kind, _label({"", *BLOCKS} - units), "", int(c.nbytes)))
        elif c.kind == "reduce_scatter":  # reduce_scatter:unit:NAME:mbJ
            _, _, unit, mb = c.name.split(":")
            expected.append((c.kind, unit, mb, int(c.nbytes)))
        else:  # all_gather:NAME:mbJ:PHASE
            _, unit, mb, phase = c.name.split(":")
            expected.append((c.kind, unit, f"{mb}:{phase}", int(c.nbytes)))
    assert sorted(got, key=str) == sorted(expected, key=str)
    assert [u for k, u, t, _ in got if k == "all_gather" and t == "mb0:forward"] == [_label({u}) for u in ordered]
    total = sum(int(c.nbytes) for c in simulated)
    assert hybrid.bytes_sent == hybrid.bytes_received == {0: total, 1: total}


def test_each_rank_holds_slices_of_the_sharded_units_only():
    """``shard=blocks.1``: each rank holds half of each of that block's parameters and of AdamW's two moments
    (flattened, padded), the step count whole; every other parameter and its state whole."""
    traced = tiny_step()
    plan = fsdp_plan(traced, [1, 2], K80X4.device_names, shard=frozenset({"blocks.1"}))
    names = [n for n, _ in traced.model.named_parameters()]
    assert sorted(plan.sharded) == [i for i, n in enumerate(names) if n.startswith("blocks.1.")]
    shapes = [tuple(p.shape) for p in traced.model.parameters()]
    for r in range(2):
        args, owned = _rank_state(traced, plan, r)
        sizes = [tuple(t.shape) for t in args]
        assert [owned[j] for j in range(len(names))] == [("parameter", n) for n in names]
        for j, (name, shape) in enumerate(zip(names, shapes, strict=True)):
            held = (-(-shape[0] * (shape[1] if len(shape) > 1 else 1) // 2),) if j in plan.sharded else shape
            assert sizes[j] == held, name
            assert sizes[len(shapes) + 3 * j : len(shapes) + 3 * j + 3] == [(), held, held], name  # step, moments
        whole = traced.model.blocks[1][0].weight.detach().reshape(-1)
        assert torch.equal(args[names.index("blocks.1.0.weight")], whole[r * 128 : (r + 1) * 128])
    # the gathers carry the sharded block's parameters alone; the all-reduce the others' gradients
    assert {u for c in plan.collectives if c.kind != "all_reduce" for u in _units_of(traced, _names(c))} == {"blocks.1"}
    (reduce,) = [c for c in plan.collectives if c.kind == "all_reduce"]
    assert _units_of(traced, _names(reduce)) == {"", "blocks.0"}


def _names(c) -> list[str]:
    return c.value.partition("@")[0].split("+")


def test_hybrid_recompute_makes_the_blocks_again_with_the_plain_hybrids_collectives():
    """``+recompute`` on a hybrid: both blocks' forward ops run again before their backward (the whole block
    from its held parameters, the sharded one from its backward gather), and the collectives, their order
    and bytes are the plain hybrid's (the backward gather exists anyway)."""
    traced = tiny_step()
    shard = frozenset({"", "blocks.1"})
    again = fsdp_plan(traced, [1, 2], K80X4.device_names, shard=shard, recompute=set(BLOCKS))
    plain = fsdp_plan(traced, [1, 2], K80X4.device_names, shard=shard)
    assert [(c.kind, c.value, c.nbytes) for c in again.collectives] == [
        (c.kind, c.value, c.nbytes) for c in plain.collectives
    ]
    op_of, module = traced.op_of_node, traced.graph.module
    made = {
        unit_of(module[op_of[n.meta["recompute"]]]) for n in again.programs[0].gm.graph.nodes if "recompute" in n.meta
    }
    assert made == set(BLOCKS)
    assert not any("recompute" in n.meta for n in plain.programs[0].gm.graph.nodes)


def test_hybrids_are_launchable_and_a_unit_the_step_lacks_is_one_line():
    for plan in ("ddp:shard=root", "fsdp:m=4,shard=blocks.0/blocks.1", "ddp+selective:shard=root"):
        assert launchable(parse_plan(plan)), plan
    assert not launchable(parse_plan("ddp:shard=root,tp=2"))
    with pytest.raises(PostplaceError, match="shard= names unit 'blocks.7', which the step does not have") as e:
        launch_plan(tiny_step(), "ddp:m=4,dp=2,shard=root/blocks.7", K80X4)
    assert "\n" not in str(e.value)
    assert str(e.value).endswith(f"(its units: root, {', '.join(BLOCKS)})")  # all of them: no '...'


def test_launch_runs_a_run_folders_hybrid_plan(tmp_path):
    """A run folder whose returned plan is ``ddp:m=2,dp=2,shard=root`` (GPT-2 small on two K80s: the embeddings
    and the tied head sharded, the blocks replicated): ``postplace launch`` runs it, the losses the one-process
    step's, the bytes the simulated hybrid plan's."""
    _folder, out, losses = launched_run_folder(tmp_path / "run", "ddp:m=2,dp=2,shard=root")
    assert out["losses"] == pytest.approx(losses, rel=1e-6)
    assert out["bytes_sent"] == out["simulated_bytes_sent"] and set(out["ranks"].values()) == {"gpu0", "gpu1"}
