"""The step users train: their optimizer (SGD, Adam, AdamW with their hyperparameters), their labels
given each step, and mixed precision; placed, run on the CPU, and compared with eager PyTorch.

Tolerances (measured, torch 2.13, CPU, one thread): SGD is bit-identical to eager ``torch.optim.SGD``.
Adam and AdamW are bit-identical to eager torch.optim in its capturable form (what is traced), and
close to its default form, which computes bias corrections from a Python float64 step where the
capturable form uses a float32 tensor (measured: losses within 9e-8 relative, parameters within
1.2e-7 absolute after 3 steps); we assert ``rtol=1e-5, atol=1e-7``. Under bf16 CPU autocast the placed
step replays the ops eager autocast runs: we assert ``rtol=1e-3`` (bf16 keeps 8 bits of mantissa);
measured, the losses are equal and the parameters within 4e-5 relative, the AdamW difference above.
"""

import numpy as np
import pytest
import torch
from torch import nn

from postplace.cluster import load_cluster
from postplace.errors import PostplaceError
from postplace.graph.opgraph import PRECISIONS
from postplace.graph.optimizers import resolve_optimizer
from postplace.graph.trace_torch import CapturedTensorWarning, from_torch, trace
from postplace.runtime.placed import apply
from tests.test_runtime_microbatch import random_legal_placement

pytestmark = pytest.mark.usefixtures("torch_one_thread")

OPTIMIZERS = {
    "sgd": (torch.optim.SGD, {"lr": 0.05, "momentum": 0.8, "weight_decay": 1e-3, "nesterov": True}),
    "adam": (torch.optim.Adam, {"lr": 3e-3, "betas": (0.8, 0.95), "eps": 1e-6, "weight_decay": 1e-2}),
    "adamw": (torch.optim.AdamW, {"lr": 2e-3, "weight_decay": 0.1, "amsgrad": True}),
}


def net():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 16), nn.GELU(), nn.LayerNorm(16), nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 4))


def batches(n, b=8):
    gen = torch.Generator().manual_seed(1)
    return [(torch.randn(b, 6, generator=gen), torch.randint(0, 4, (b,), generator=gen)) for _ in range(n)]


def placed(model, optimizer, x, y, *, precision="fp32", seed=3, microbatches=1):
    tr = trace(
        model, x, nn.functional.cross_entropy, optimizer, targets=y, precision=precision, microbatches=microbatches
    )
    c = load_cluster("k80x2")
    dev = random_legal_placement(tr.graph, c, seed)
    step = apply(model, tr, dev, c, device_map="cpu")
    assert len(step.summary["ops_per_device"]) > 1  # the step really is split over devices
    return tr, step


def eager(model, opt, data, precision="fp32"):
    losses = []
    for x, y in data:
        opt.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16"):
            loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def state_of(opt, model):
    """Eager optimizer state in the traced step's placeholder order."""
    out = []
    for p in model.parameters():
        st = opt.state[p]
        for k in ("momentum_buffer", "step", "exp_avg", "exp_avg_sq", "max_exp_avg_sq"):
            if k in st:
                out.append(st[k])
    return out


@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_placed_step_trains_like_eager_torch_optim_for_three_steps(name):
    cls, kw = OPTIMIZERS[name]
    data = batches(3)
    model, reference = net(), net()
    tr, step = placed(model, (cls, kw), *data[0])
    got = [step(x, y).item() for x, y in data]  # new labels every step: step(inputs, targets)
    opt = cls(reference.parameters(), **kw)
    want = eager(reference, opt, data)
    exact = name == "sgd"
    tol = {"rtol": 0, "atol": 0} if exact else {"rtol": 1e-5, "atol": 1e-7}
    np.testing.assert_allclose(got, want, **tol)
    n_p = len(list(model.parameters()))
    for a, b in zip(step.args[:n_p], reference.parameters(), strict=True):
        torch.testing.assert_close(a, b.detach(), **tol)
    ours = step.args[n_p : step.n_persistent]
    theirs = state_of(opt, reference)
    assert len(ours) == len(theirs) == n_p * {"sgd": 1, "adam": 3, "adamw": 4}[name]
    for a, b in zip(ours, theirs, strict=True):
        torch.testing.assert_close(a, b.to(a.dtype), **tol)
    assert tr.graph.metadata["optimizer"]["name"] == name
    assert tr.graph.metadata["optimizer"]["groups"][0]["lr"] == kw["lr"]


def test_adam_is_torch_optims_own_capturable_step_bit_for_bit():
    """The traced update is torch.optim's: eager Adam in the same (capturable) form agrees exactly."""
    from postplace.graph.optimizers import _capturable_on_any_device

    cls, kw = OPTIMIZERS["adamw"]
    data = batches(3)
    model, reference = net(), net()
    _, step = placed(model, (cls, kw), *data[0])
    got = [step(x, y).item() for x, y in data]
    opt = cls(reference.parameters(), **kw, capturable=True, foreach=False)
    with _capturable_on_any_device():
        want = eager(reference, opt, data)
    assert got == want
    for a, b in zip(step.args, reference.parameters(), strict=False):
        assert torch.equal(a, b.detach())


def test_factory_with_param_groups_keeps_each_groups_hyperparameters():
    def factory(params):
        decay = [p for p in params if p.dim() > 1]
        rest = [p for p in params if p.dim() <= 1]
        return torch.optim.AdamW(
            [{"params": decay, "weight_decay": 0.2}, {"params": rest, "weight_decay": 0.0}], lr=5e-3
        )

    data = batches(3)
    model, reference = net(), net()
    tr, step = placed(model, factory, *data[0], seed=5)
    got = [step(x, y).item() for x, y in data]
    want = eager(reference, factory(list(reference.parameters())), data)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-7)
    for a, b in zip(step.args, reference.parameters(), strict=False):
        torch.testing.assert_close(a, b.detach(), rtol=1e-5, atol=1e-7)
    assert [g["weight_decay"] for g in tr.graph.metadata["optimizer"]["groups"]] == [0.2, 0.0]


def test_adamw_holds_one_parameter_size_more_state_than_sgd_momentum():
    model = nn.Sequential(nn.Linear(6, 256), nn.ReLU(), nn.Linear(256, 4))  # Adam's step counts are 4 bytes each
    x, y = batches(1)[0]
    pbytes = sum(p.numel() * p.element_size() for p in model.parameters())
    sgd = from_torch(model, x, nn.functional.cross_entropy, "sgd", targets=y)
    adamw = from_torch(model, x, nn.functional.cross_entropy, "adamw", targets=y)
    extra = adamw.persistent_bytes.sum() - sgd.persistent_bytes.sum()
    assert abs(extra - pbytes) <= 0.01 * pbytes


def test_lr_and_names():
    model = net()
    params = list(model.parameters())
    assert resolve_optimizer("AdamW", params, lr=0.5).groups[0]["lr"] == 0.5
    sgd = {"lr": 0.1, "momentum": 0.9, "dampening": 0, "weight_decay": 0, "nesterov": False, "maximize": False}
    assert resolve_optimizer("sgd", params).groups[0] == sgd
    assert str(resolve_optimizer("adamw", params)).startswith("adamw (lr 0.001, weight_decay 0.01")


@pytest.mark.parametrize(
    ("optimizer", "lr", "says"),
    [
        ("lion", None, "unknown optimizer 'lion'"),
        (torch.optim.RMSprop, None, "torch.optim.rmsprop.RMSprop cannot be traced"),
        ((torch.optim.SGD, {"lr": 0.1, "momentum": 0.9, "dampening": 0.5}), None, "dampening=0.5"),
        ((torch.optim.Adam, {"lr": -1.0}), None, "cannot build Adam(lr=-1.0)"),
        ((torch.optim.Adam, {"betas": (0.9, 0.99), "lr": 1e-3, "differentiable": True}), None, "differentiable"),
        ("adam", float("nan"), "lr must be a finite number"),
        (lambda ps: 3, None, "returned a int"),
        (lambda ps: 1 / 0, None, "factory failed on the model's parameters: ZeroDivisionError"),
        (42, None, "not a int"),
    ],
)
def test_bad_optimizers_are_one_line(optimizer, lr, says):
    x, y = batches(1)[0]
    with pytest.raises(PostplaceError, match=None) as err:
        trace(net(), x, nn.functional.cross_entropy, optimizer, lr=lr, targets=y)
    assert says in str(err.value) and "\n" not in str(err.value)


def test_a_loss_that_captured_its_labels_is_warned_about():
    x, y = batches(1)[0]
    with pytest.warns(CapturedTensorWarning, match="targets=") as rec:
        trace(net(), x, lambda out: nn.functional.cross_entropy(out, y))
    assert len(rec) == 1
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        trace(net(), x, nn.functional.cross_entropy, targets=y)  # labels as inputs: no warning


def test_bf16_step_is_priced_in_bf16_and_runs_like_eager_autocast():
    data = batches(3)
    model, reference = net(), net()
    # a weight decay large enough that a traced update without it misses by far more than the tolerance
    # (lr 1e-2, weight decay 0.5: 3.8 relative on the parameters after 3 steps; issue 34 item 6)
    adamw = (torch.optim.AdamW, {"lr": 1e-2, "weight_decay": 0.5})
    tr, step = placed(model, adamw, *data[0], precision="bf16")
    g = tr.graph
    assert g.metadata["precision"] == "bf16"
    mm = [i for i, t in enumerate(g.op_types) if t in ("addmm", "mm")]
    assert mm and all(PRECISIONS[g.precision[i]] == "bf16" for i in mm)
    assert g.precisions_used == ("fp32", "bf16")
    params = np.array([t == "parameter" for t in g.op_types])
    # master weights and AdamW state stay fp32: parameter, two moments and a step per parameter
    pbytes = sum(p.numel() * 4 for p in model.parameters())
    assert g.persistent_bytes[params].sum() == 3 * pbytes + 4 * len(list(model.parameters()))
    got = [step(x, y).item() for x, y in data]
    want = eager(reference, torch.optim.AdamW(reference.parameters(), **adamw[1]), data, precision="bf16")
    np.testing.assert_allclose(got, want, rtol=1e-3)
    for a, b in zip(step.args, reference.parameters(), strict=False):
        assert a.dtype == torch.float32
        torch.testing.assert_close(a, b.detach(), rtol=1e-3, atol=1e-5)


def test_bf16_activations_take_half_the_bytes():
    x, y = batches(1)[0]
    fp32 = from_torch(net(), x, nn.functional.cross_entropy, targets=y)
    bf16 = from_torch(net(), x, nn.functional.cross_entropy, targets=y, precision="bf16")
    i32 = [i for i, t in enumerate(fp32.op_types) if t == "addmm"]
    i16 = [i for i, t in enumerate(bf16.op_types) if t == "addmm"]
    assert len(i32) == len(i16) == 3
    assert (bf16.output_bytes[i16] * 2 == fp32.output_bytes[i32]).all()


def test_unknown_precision_is_one_line():
    x, y = batches(1)[0]
    with pytest.raises(PostplaceError, match="unknown precision 'fp8'; use one of fp32, bf16, fp16"):
        trace(net(), x, nn.functional.cross_entropy, targets=y, precision="fp8")


def test_fp16_ops_are_marked_fp16():
    x, y = batches(1)[0]
    g = from_torch(net(), x, nn.functional.cross_entropy, targets=y, precision="fp16")
    mm = [i for i, t in enumerate(g.op_types) if t == "addmm"]
    assert mm and {PRECISIONS[g.precision[i]] for i in mm} == {"fp16"}
    assert g.metadata["precision"] == "fp16"


def test_adamw_against_eagers_default_form_is_close_not_equal():
    """Issue 34 item 6: the README's stated gap to eager's default (non-capturable) AdamW, which computes the
    bias corrections in float64 on the host: after 3 steps of a 2-layer, 256-wide MLP, at most 1e-5 of the
    largest parameter (measured 4.3e-6), and not zero (the forms really differ)."""

    def mlp():
        torch.manual_seed(0)
        return nn.Sequential(nn.Linear(6, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 4))

    data = batches(3, b=64)
    model, reference = mlp(), mlp()
    _, step = placed(model, "adamw", *data[0])
    for x, y in data:
        step(x, y)
    eager(reference, torch.optim.AdamW(reference.parameters()), data)
    gaps = [
        float((a - b.detach()).abs().max() / b.detach().abs().max())
        for a, b in zip(step.args, reference.parameters(), strict=False)
    ]
    assert 0 < max(gaps) < 1e-5
