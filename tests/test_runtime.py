"""A placed training step computes what the unplaced model computes, and moves every crossing tensor."""

import numpy as np
import pytest
import torch
from torch import nn

from postplace.cluster.placement import colocation_representative
from postplace.errors import PostplaceError
from postplace.graph.trace_torch import trace
from postplace.runtime import apply, resolve_device_map
from postplace.testing.eager import eager_sgd_losses as eager_reference
from postplace.zoo import MODELS, build, trace_model
from tests.tracehelp import CAPTURED_TARGETS

DEVICES = ["cpu", "gpu0", "gpu1"]


pytestmark = pytest.mark.usefixtures("torch_one_thread")


def random_placement(graph, seed, devices=3):
    """Random devices per colocation set (a legal placement)."""
    rep = colocation_representative(graph)
    return np.random.default_rng(seed).integers(0, devices, graph.num_ops)[rep]


def assert_same_state(step, model):
    for name, p in model.named_parameters():
        torch.testing.assert_close(step.parameters()[name], p.detach(), rtol=1e-4, atol=1e-5, msg=name)
    for name, b in model.named_buffers():
        torch.testing.assert_close(step.buffers()[name], b, rtol=1e-4, atol=1e-5, msg=name)


def run_two_steps(step):
    """Step 1 compiled, step 2 node by node under the logical-device check."""
    torch.manual_seed(123)
    first = step().item()
    torch.manual_seed(123)
    second, violations = step.run_checked()
    return [first, second.item()], violations


@pytest.mark.parametrize("colocated", [True, False], ids=["colocated", "any-op-level"])
@pytest.mark.parametrize("name", list(MODELS))
def test_placed_zoo_step_matches_eager_training(name, colocated):
    """Random placements: by colocation set (what a search samples), and op by op with no rule at all
    (an update apart from its parameter, batch norm apart from its running statistics)."""
    tr = trace_model(name, "small")
    if colocated:
        placement = random_placement(tr.graph, seed=len(name))
    else:
        placement = np.random.default_rng(len(name)).integers(0, 3, tr.graph.num_ops)
    step = apply(tr.model, tr, placement, DEVICES, device_map="cpu")
    assert step.summary["transfers"] > 0  # the placement really crosses devices
    losses, violations = run_two_steps(step)
    assert violations == []
    model, inputs, loss_fn = build(name, "small")
    np.testing.assert_allclose(losses, eager_reference(model, inputs, loss_fn, 2), rtol=1e-4)
    assert_same_state(step, model)


class Toy(nn.Module):
    """Shared layer (used twice: gradients accumulate), in-place ReLU, batch norm buffers, a residual."""

    def __init__(self):
        super().__init__()
        self.inp = nn.Linear(6, 8)
        self.shared = nn.Linear(8, 8)
        self.bn = nn.BatchNorm1d(8)
        self.act = nn.ReLU(inplace=True)
        self.head = nn.Linear(8, 3)

    def forward(self, x):
        h = self.act(self.bn(self.inp(x)))
        h = h + self.shared(self.act(self.shared(h)))
        return self.head(h)


def toy():
    torch.manual_seed(0)
    x, y = torch.randn(5, 6), torch.randint(0, 3, (5,))
    return Toy().train(), (x,), lambda out: nn.functional.cross_entropy(out, y)


@CAPTURED_TARGETS  # the toy's loss_fn closes over its labels: the warning is the expected one
@pytest.mark.parametrize("seed", range(4))
def test_placed_hand_written_module_matches_eager_training(seed):
    model, inputs, loss_fn = toy()
    tr = trace(model, inputs, loss_fn)
    step = apply(model, tr, random_placement(tr.graph, seed, 2), ["cpu", "gpu0"], device_map="cpu")
    losses, violations = run_two_steps(step)
    assert violations == []
    ref, ref_inputs, ref_loss = toy()
    np.testing.assert_allclose(losses, eager_reference(ref, ref_inputs, ref_loss, 2), rtol=1e-5)
    assert_same_state(step, ref)
    # the traced model itself is untouched until copied back
    untouched, _, _ = toy()
    torch.testing.assert_close(model.inp.weight, untouched.inp.weight)
    step.copy_to_model()
    torch.testing.assert_close(model.inp.weight, ref.inp.weight, rtol=1e-4, atol=1e-5)


@CAPTURED_TARGETS  # the toy's loss_fn closes over its labels: the warning is the expected one
def test_adam_placed_step_matches_the_unplaced_traced_step():
    model, inputs, loss_fn = toy()
    tr = trace(model, inputs, loss_fn, "adam")
    placed = apply(model, tr, random_placement(tr.graph, 7, 2), ["cpu", "gpu0"], device_map="cpu")
    single = apply(model, tr, np.zeros(tr.graph.num_ops, dtype=int), ["cpu"])
    assert single.summary["transfers"] == 0
    for _ in range(3):
        torch.testing.assert_close(placed(), single())
    for name, p in single.parameters().items():
        torch.testing.assert_close(placed.parameters()[name], p)


def test_logical_device_check_catches_a_missing_transfer():
    tr = trace_model("resnet50", "small")
    step = apply(tr.model, tr, random_placement(tr.graph, 1, 2), ["cpu", "gpu0"], device_map="cpu")
    gm = step.gm
    crossing = [n for n in gm.graph.nodes if "postplace_transfer" in n.meta]
    assert crossing
    victim = crossing[len(crossing) // 2]
    victim.replace_all_uses_with(victim.args[0])
    gm.graph.erase_node(victim)
    gm.recompile()
    _, violations = step.run_checked()
    assert violations and "read a tensor of device" in violations[0]


def test_single_device_placement_has_no_transfers_and_one_device_in_the_report():
    tr = trace_model("gpt2", "small")
    step = apply(tr.model, tr, np.ones(tr.graph.num_ops, dtype=int), ["cpu", "gpu0"], device_map="cpu")
    assert step.summary["transfers"] == 0
    rows = step.module_report()
    assert all(r["devices"] == {"gpu0": r["devices"]["gpu0"]} for r in rows)
    assert sum(sum(r["devices"].values()) for r in rows) == tr.graph.num_ops
    text = step.format_module_report(depth=2)
    assert "blocks.0" in text or "layers.0" in text or "h.0" in text


@CAPTURED_TARGETS  # the toy's loss_fn closes over its labels: the warning is the expected one
def test_module_report_follows_the_placement_of_a_module():
    model, inputs, loss_fn = toy()
    tr = trace(model, inputs, loss_fn)
    from postplace.runtime.placed import op_modules

    mods = op_modules(tr)
    head = np.array([m == "head" for m in mods])
    assert head.any()
    # every backward and update op of the head is attributed to it
    phases = {int(p) for p in tr.graph.phase[head]}
    assert {0, 1, 2} <= phases
    dev = np.where(head, 1, 0)
    dev = dev[colocation_representative(tr.graph)]  # keep colocation sets whole
    step = apply(model, tr, dev, ["cpu", "gpu0"], device_map="cpu")
    rows = {(r["module"], r["phase"]): r["devices"] for r in step.module_report()}
    for phase in ("forward", "backward", "update"):
        assert set(rows[("head", phase)]) == {"gpu0"}
        assert set(rows[("inp", phase)]) == {"cpu"}


@CAPTURED_TARGETS  # the toy's loss_fn closes over its labels: the warning is the expected one
def test_device_maps_and_bad_input():
    assert [str(d) for d in resolve_device_map(["cpu", "gpu0", "gpu1"], None)] == ["cpu", "cuda:0", "cuda:1"]
    assert [str(d) for d in resolve_device_map(["cpu", "gpu0"], "cpu")] == ["cpu", "cpu"]
    assert [str(d) for d in resolve_device_map(["cpu", "gpu0"], {"gpu0": "cpu"})] == ["cpu", "cpu"]
    with pytest.raises(PostplaceError, match="not a device"):
        resolve_device_map(["cpu"], {"gpu3": "cpu"})
    model, inputs, loss_fn = toy()
    tr = trace(model, inputs, loss_fn)
    with pytest.raises(PostplaceError, match="entries"):
        apply(model, tr, [0, 1], ["cpu", "gpu0"])
    with pytest.raises(PostplaceError, match="traced step"):
        apply(model, tr.graph, np.zeros(tr.graph.num_ops, dtype=int))
    mapping = {name: "cpu" for name in tr.graph.names}
    step = apply(model, tr, mapping)
    assert step.device_names == ("cpu",) and np.isfinite(step().item())


class ViewWrite(nn.Module):
    """Writes in place through a view, then reads the base: the placed step must copy the write back."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 6)
        self.out = nn.Linear(6, 2)

    def forward(self, x):
        h = self.lin(x)
        h.view(-1).mul_(2)
        return self.out(h)


def view_write():
    torch.manual_seed(0)
    x, y = torch.randn(3, 4), torch.randint(0, 2, (3,))
    return ViewWrite(), (x,), lambda out: nn.functional.cross_entropy(out, y)


@CAPTURED_TARGETS  # the toy's loss_fn closes over its labels: the warning is the expected one
def test_a_write_through_a_view_on_another_device_reaches_the_base():
    model, inputs, loss_fn = view_write()
    tr = trace(model, inputs, loss_fn)
    ref, ref_inputs, ref_loss = view_write()
    expected = eager_reference(ref, ref_inputs, ref_loss, 1)
    write_backs = 0
    for seed in range(12):
        step = apply(model, tr, random_placement(tr.graph, seed, 2), ["cpu", "gpu0"], device_map="cpu")
        write_backs += step.summary["write_backs"]
        loss, violations = step.run_checked()
        assert violations == []
        assert loss.item() == pytest.approx(expected[0], rel=1e-5)
        assert_same_state(step, ref)
    assert write_backs > 0  # some placements put the write apart from the tensor it writes


@CAPTURED_TARGETS  # the toy's loss_fn closes over its labels: the warning is the expected one
@pytest.mark.parametrize("seed", range(3))
def test_any_op_level_placement_trains_like_eager_even_splitting_colocation(seed):
    """Colocation is a search rule, not a runtime one: an update away from its parameter still lands."""
    model, inputs, loss_fn = toy()
    tr = trace(model, inputs, loss_fn)
    placement = np.random.default_rng(seed).integers(0, 3, tr.graph.num_ops)
    step = apply(model, tr, placement, DEVICES, device_map="cpu")
    assert step.summary["write_backs"] > 0
    losses, violations = run_two_steps(step)
    assert violations == []
    ref, ref_inputs, ref_loss = toy()
    np.testing.assert_allclose(losses, eager_reference(ref, ref_inputs, ref_loss, 2), rtol=1e-5)
    assert_same_state(step, ref)
