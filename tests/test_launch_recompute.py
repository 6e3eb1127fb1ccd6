"""``fsdp+recompute`` and ``+selective`` in the per-rank programs (issue 33): FSDP's recomputed forward runs
from the unit's backward all-gather, and selective recomputation keeps the ops the simulated pass keeps."""

from __future__ import annotations

import functools

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from postplace.errors import PostplaceError
from postplace.graph import PHASES
from postplace.graph.trace_torch import trace
from postplace.plans import apply_plan, parse_plan, recompute, unit_of
from postplace.plans.recompute import selective_saves
from postplace.runtime.ddp import ddp_plan, launchable
from postplace.runtime.fsdp import fsdp_plan
from postplace.runtime.launcher import RandomBatches, launch_plan
from postplace.runtime.ranks import GATHER
from postplace.runtime.recompute import keeps_output, recompute_program
from tests.test_launch_ddp import K80X4

pytestmark = pytest.mark.usefixtures("torch_one_thread")

BLOCKS = {"blocks.0", "blocks.1"}
FORWARD, BACKWARD = PHASES.index("forward"), PHASES.index("backward")


class Block(nn.Module):
    """Attention and an MLP side by side (no bias: each projection is one ``mm``), dropout after the
    attention's projection; the residual sum is the root's, so a block's values are its own."""

    def __init__(self, d: int = 16, heads: int = 2):
        super().__init__()
        self.qkv, self.proj = nn.Linear(d, 3 * d, bias=False), nn.Linear(d, d, bias=False)
        self.fc, self.out = nn.Linear(d, 2 * d, bias=False), nn.Linear(2 * d, d, bias=False)
        self.drop, self.heads = nn.Dropout(0.2), heads

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, t, d)
        return self.drop(self.proj(a)) + self.out(F.gelu(self.fc(x)))


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleList([Block() for _ in range(2)])
        self.head = nn.Linear(16, 4)

    def forward(self, x):
        for block in self.blocks:
            x = x + block(x)
        return self.head(x.mean(1))


def attn_step():
    torch.manual_seed(0)
    x, y = torch.randn(8, 6, 16), torch.randint(0, 4, (8,))
    return trace(Net(), (x,), F.cross_entropy, "adamw", microbatches=2, targets=(y,))


@functools.cache
def launched(plan: str):
    """3 steps of ``plan`` on two ranks, the same batches and dropout for every plan."""
    return launch_plan(attn_step(), plan, K80X4, steps=3, batches=RandomBatches(0), seed=1)


def test_fsdp_recompute_trains_bit_for_bit_as_fsdp_and_moves_its_bytes():
    """``fsdp+recompute`` (dropout inside each block): 3 steps' losses and parameters are plain fsdp's bit for
    bit, every rank calls the same collectives in the same order and moves the same bytes: the backward
    gather the recomputation reads exists anyway. The simulated plans' payloads agree."""
    again, plain = launched("fsdp+recompute:m=2,dp=2"), launched("fsdp:m=2,dp=2")
    assert again.losses == plain.losses
    moved = 0.0
    for name, p in plain.parameters.items():
        assert torch.equal(again.parameters[name], p), name
        moved = max(moved, float((p - dict(attn_step().model.named_parameters())[name].detach()).abs().max()))
    assert moved > 1e-3  # 3 AdamW steps moved the weights
    assert again.bytes_sent == plain.bytes_sent and again.bytes_received == plain.bytes_received
    assert [(c.kind, c.value) for c in again.plan.collectives] == [(c.kind, c.value) for c in plain.plan.collectives]
    graph = attn_step().graph
    simulated = {
        plan: sorted((c.kind, c.nbytes) for c in apply_plan(graph, parse_plan(plan), 2).graph.collectives)
        for plan in ("fsdp+recompute:m=2", "fsdp:m=2")
    }
    payload = sorted((c.kind, c.nbytes) for c in again.plan.collectives)
    assert simulated["fsdp+recompute:m=2"] == simulated["fsdp:m=2"] == payload


def _gathers(plan, gm, traced):
    """The program's all-gather nodes: ``{node: (unit, phase)}``, from the collective each calls."""
    out = {}
    for n in gm.graph.nodes:
        if n.op == "call_module" and n.target == GATHER:
            c = plan.collectives[n.args[0]]
            first = c.value.split("+")[0].split("@")[0]
            out[n] = (unit_of(traced.graph.module[traced.op_of_node[first]]), c.value.rsplit(":", 1)[1])
    return out


def _made_from(gather: torch.fx.Node) -> set[torch.fx.Node]:
    """The values a gather makes: the gathered tuple, its parameters and their views (nodes all of whose
    inputs are such values)."""
    made, todo = {gather}, [gather]
    while todo:
        for u in todo.pop().users:
            if u not in made and u.op == "call_function" and all(a in made for a in u.all_input_nodes):
                made.add(u)
                todo.append(u)
    return made


def _computed_from(values: set[torch.fx.Node], unit: str) -> set[torch.fx.Node]:
    """``values`` and the forward values of ``unit`` computed from them (not recomputed copies)."""
    out, todo = set(values), list(values)
    while todo:
        for u in todo.pop().users:
            custom = u.meta.get("custom", {})
            if (
                u not in out
                and "recompute" not in u.meta
                and custom.get("phase") == "forward"
                and unit_of(custom.get("module", "")) == unit
            ):
                out.add(u)
                todo.append(u)
    return out


def _segment(traced, name: str) -> tuple[str, int]:
    op = traced.op_of_node[name]
    return unit_of(traced.graph.module[op]), int(traced.graph.microbatch[op])


def _later(n: torch.fx.Node) -> bool:
    """A backward op or a recomputed copy."""
    return "recompute" in n.meta or n.meta.get("custom", {}).get("phase") == "backward"


def test_fsdp_recomputed_ops_read_the_backward_gather_only():
    """In each rank's ``fsdp+recompute`` program the forward all-gather of a block makes values only the
    forward reads; the block's backward all-gather comes before its recomputed ops, which read their
    parameters (and ``t(weight)``) from it. Of the values the forward computed from a block's gathered
    parameters the backward reads only what recomputation keeps (dropout's mask); plain fsdp's backward
    reads others (the activations), and recomputing plain fsdp's program after the fact reads the forward
    gather's parameters."""
    traced = attn_step()
    plan = fsdp_plan(traced, [1, 2], K80X4.device_names, recompute=BLOCKS)
    plain = fsdp_plan(traced, [1, 2], K80X4.device_names)
    for prog in plan.programs:
        gm = prog.gm
        order = {n: i for i, n in enumerate(gm.graph.nodes)}
        gathers = _gathers(plan, gm, traced)
        copies = [n for n in gm.graph.nodes if "recompute" in n.meta]
        assert copies
        for g, (unit, phase) in gathers.items():
            if unit not in BLOCKS:
                continue
            made = _made_from(g)
            readers = {u for x in made for u in x.users if u not in made}
            if phase == "forward":
                assert readers and not any(_later(u) for u in readers)
                kept = {a for a in _computed_from(made, unit) for u in a.users if _later(u)}
                assert kept and all(keeps_output(a) for a in kept), kept
            else:
                assert any("recompute" in u.meta for u in readers)  # the recomputed addmm read its weight
                mb = prog.rank * (traced.microbatches // 2) + int(plan.collectives[g.args[0]].value.split("@mb")[1][0])
                mine = [c for c in copies if _segment(traced, c.meta["recompute"]) == (unit, mb)]
                assert mine and all(order[g] < order[c] for c in mine)  # the gather comes first
        for c in copies:  # every recomputed op reading a gathered value reads a backward gather's
            for a in c.all_input_nodes:
                src = [g for g in gathers if a in _made_from(g)]
                assert all(gathers[g][1] == "backward" for g in src), (c, a)
    gm = plain.programs[0].gm
    gathers = _gathers(plain, gm, traced)
    fwd = [g for g, (unit, phase) in gathers.items() if unit == "blocks.0" and phase == "forward"]
    kept = {a for a in _computed_from(_made_from(fwd[0]), "blocks.0") for u in a.users if _later(u)}
    assert any(not keeps_output(a) for a in kept)  # the plain backward reads the forward's activations
    assert recompute_program(gm, traced, BLOCKS) > 0  # recomputed after the fact, from the forward gather
    assert any(_later(u) for x in _made_from(fwd[0]) for u in x.users)


@pytest.fixture(scope="module")
def llama():
    from postplace.runtime.zoo_step import trace_zoo_step

    return trace_zoo_step("llama", "small", microbatches=2, optimizer="adamw")


def _simulated(graph, selective: bool):
    """The simulated pass's recomputed ops and the forward ops of recomputed units whose outputs their own
    backward (or a recomputed op) reads as the forward left them, as traced op indices."""
    from postplace.plans._step import numbered_units

    which = set(numbered_units(graph))
    step = recompute(graph, selective=selective)
    index = {name: i for i, name in enumerate(graph.names)}
    unit, phase, mb = [unit_of(m) for m in step.module], step.phase.tolist(), step.microbatch.tolist()
    again = {index[name[3:]] for name in step.names if name.startswith("rc:")}
    read = set()
    for s, d in zip(step.edge_src.tolist(), step.edge_dst.tolist(), strict=True):
        if step.names[s].startswith("rc:") or phase[s] != FORWARD or unit[s] not in which:
            continue
        if phase[d] == BACKWARD and (unit[d], mb[d]) == (unit[s], mb[s]):
            read.add(index[step.names[s]])
    return again, read


def _launched(traced, programs):
    """The same two sets from the rank programs, and the ops kept because random or in place."""
    op_of, graph = traced.op_of_node, traced.graph
    again, read, drawn = set(), set(), set()
    for prog in programs:
        for n in prog.gm.graph.nodes:
            if "recompute" in n.meta:
                again.add(op_of[n.meta["recompute"]])
            src = n.meta.get("recompute", n.name)
            if n.op != "call_function" or src not in op_of or not _later(n):
                continue
            for a in n.all_input_nodes:
                op = op_of.get(a.name, -1)
                if op < 0 or a.op != "call_function" or graph.phase[op] != FORWARD or "recompute" in a.meta:
                    continue
                if _segment(traced, a.name)[0] in BLOCKS and _segment(traced, a.name) == _segment(traced, src):
                    read.add(op)
                    if keeps_output(a):
                        drawn.add(op)
    return again, read, drawn


def test_selective_keeps_the_ops_the_simulated_pass_keeps(llama):
    """``+selective`` on Llama (attention and seven matrix products per block): the launched ranks make
    again exactly the ops the simulated pass copies and read as the forward left them exactly the ops it
    keeps, which are the selective rule's (attention, the odd ``mm``) that the backward reads; full
    recomputation makes more again. ddp and fsdp programs recompute the same ops."""
    graph, names = llama.graph, K80X4.device_names
    saved = selective_saves(graph)
    kinds = [graph.op_types[i] for i in saved]
    assert kinds.count("mm") == 2 * 2 * 4 and sum("scaled_dot_product" in k for k in kinds) == 2 * 2  # 2 mb
    units = sorted(BLOCKS)
    sel = ddp_plan(llama, [1, 2], names, recompute=units, selective=True).programs
    again, read, drawn = _launched(llama, sel)
    sim_again, sim_read = _simulated(graph, selective=True)
    assert again == sim_again and read == sim_read
    assert read - drawn <= saved and {graph.op_types[i] for i in read} >= {"mm"}
    assert any("scaled_dot_product" in graph.op_types[i] for i in read)
    full_again, _, _ = _launched(llama, ddp_plan(llama, [1, 2], names, recompute=units).programs)
    assert again < full_again and not again & saved
    sharded = fsdp_plan(llama, [1, 2], names, recompute=units, selective=True).programs
    assert {n.meta["recompute"] for p in sharded for n in p.gm.graph.nodes if "recompute" in n.meta} == {
        n.meta["recompute"] for p in sel for n in p.gm.graph.nodes if "recompute" in n.meta
    }


@pytest.mark.parametrize("level", ["ddp", "fsdp"])
def test_selective_trains_bit_for_bit_as_the_plain_plan(level):
    """``ddp+selective`` and ``fsdp+selective`` (attention and every other ``mm`` kept, dropout's mask
    kept): 3 steps' losses and parameters are the plain plan's bit for bit, with the same bytes."""
    sel, plain = launched(f"{level}+selective:m=2,dp=2"), launched(f"{level}:m=2,dp=2")
    assert sel.losses == plain.losses
    for name, p in plain.parameters.items():
        assert torch.equal(sel.parameters[name], p), name
    assert sel.bytes_sent == plain.bytes_sent


def test_recomputed_plans_launch_and_a_unit_the_step_lacks_is_one_line():
    for plan in ("fsdp+recompute:m=2", "fsdp+selective:m=2", "zero2+selective:m=2", "fsdp:m=2,recompute=blocks.1"):
        assert launchable(parse_plan(plan)), plan
    with pytest.raises(PostplaceError, match="selective= names unit 'blocks.7', which the step does not have") as e:
        launch_plan(attn_step(), "fsdp:m=2,dp=2,recompute=blocks.7", K80X4)
    assert "\n" not in str(e.value)
    with pytest.raises(PostplaceError, match="names unit 'blocks.7'"):
        launch_plan(attn_step(), "ddp:m=2,dp=2,recompute=blocks.1/blocks.7", K80X4)


def test_a_mix_of_whole_and_selective_recomputation_trains_bit_for_bit(llama):
    """``recompute=blocks.0,selective=blocks.1`` (what ``place --layered`` answers): the launched ranks make again
    exactly what the simulated passes make (block 0 whole, then block 1 by the selective rule), which is the
    union of each rule alone on its block; and the plan trains as the plain plan does, bit for bit."""
    mixed, plain = launched("ddp:m=2,dp=2,recompute=blocks.0,selective=blocks.1"), launched("ddp:m=2,dp=2")
    assert mixed.losses == plain.losses
    for name, p in plain.parameters.items():
        assert torch.equal(mixed.parameters[name], p), name
    graph, names = llama.graph, K80X4.device_names
    units = ["blocks.0", "blocks.1"]
    mix = ddp_plan(llama, [1, 2], names, recompute=units, selective=frozenset({"blocks.1"})).programs
    again, _, _ = _launched(llama, mix)
    whole, _, _ = _launched(llama, ddp_plan(llama, [1, 2], names, recompute=["blocks.0"]).programs)
    sel, _, _ = _launched(llama, ddp_plan(llama, [1, 2], names, recompute=["blocks.1"], selective=True).programs)
    assert again == whole | sel and whole and sel
    step = recompute(recompute(graph, ["blocks.0"]), ["blocks.1"], selective=True)
    index = {name: i for i, name in enumerate(graph.names)}
    assert again == {index[name[3:]] for name in step.names if name.startswith("rc:")}
    assert step.metadata["recompute_rule"] == "mixed" and step.metadata["recompute"] == units


def test_the_root_recomputed_makes_again_what_the_ranks_make_again(llama):
    """``recompute=root`` (the embedding and the head): the simulated pass copies exactly the ops the launched
    ranks make again; a step's data inputs are fed, not made again, by either."""
    graph, names = llama.graph, K80X4.device_names
    again, _, _ = _launched(llama, ddp_plan(llama, [1, 2], names, recompute=[""]).programs)
    step = recompute(graph, [""])
    index = {name: i for i, name in enumerate(graph.names)}
    simulated = {index[name[3:]] for name in step.names if name.startswith("rc:")}
    assert again and again == simulated
    assert not any(graph.op_types[i] == "input" for i in simulated)
    root, plain = launched("ddp:m=2,dp=2,recompute=root"), launched("ddp:m=2,dp=2")
    assert root.losses == plain.losses
