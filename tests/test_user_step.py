"""``place`` and ``apply`` on the step a user trains: their optimizer, precision and labels, recorded in
the run folder (with its report, as the CLI writes it) and honoured on every path that traces the step
again (resume, apply, train, report)."""

import json

import numpy as np
import pytest
import torch
from torch import nn

import postplace
from postplace.errors import PostplaceError
from postplace.report import write_report
from postplace.runtime.cli import cmd_train

pytestmark = pytest.mark.usefixtures("torch_one_thread")


def mlp():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 32), nn.GELU(), nn.Linear(32, 32), nn.GELU(), nn.Linear(32, 4))


def data(seed, b=8):
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(b, 8, generator=gen), torch.randint(0, 4, (b,), generator=gen)


@pytest.fixture(scope="module")
def adamw_bf16_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("run") / "mlp"
    x, y = data(0)
    opt = (torch.optim.AdamW, {"lr": 3e-3, "weight_decay": 0.05})
    result = postplace.place(
        mlp(),
        "dgx8",
        budget=48,
        groups=None,
        microbatches=1,
        out=out,
        step=postplace.Step(inputs=x, loss_fn=nn.functional.cross_entropy, targets=y, optimizer=opt, precision="bf16"),
    )
    return result, out


def test_the_run_folder_records_the_optimizer_and_precision_and_has_its_report(adamw_bf16_run):
    result, out = adamw_bf16_run
    for name in ("run.json", "summary.json"):
        body = json.loads((out / name).read_text())
        spec = body.get("target") or body.get("target_spec")
        assert spec["optimizer"]["name"] == "adamw" and spec["optimizer"]["groups"][0]["weight_decay"] == 0.05
        assert spec["precision"] == "bf16"
    assert result.summary["optimizer"]["groups"][0]["lr"] == 3e-3 and result.summary["precision"] == "bf16"
    assert result.report == out / "report.html" and result.report.is_file()  # written by place, not only the CLI
    # and the folder redraws on its own: graph.json inside it is the module's graph
    assert write_report(out).is_file()


def test_apply_trains_the_placed_users_step_on_new_labels(adamw_bf16_run):
    result, _ = adamw_bf16_run
    step = postplace.apply(result, device_map="cpu")
    first = [step(*data(k)).item() for k in (1, 2, 3)]
    step2 = postplace.apply(result, device_map="cpu")
    assert [step2(*data(k)).item() for k in (1, 2, 3)] == first  # the same start, the same labels
    third = postplace.apply(result, device_map="cpu")
    assert third(*data(9)).item() != first[0]  # new labels give a new loss: they are not baked in
    assert all(t.dtype == torch.float32 for t in step.parameters().values())  # fp32 master weights


def test_apply_with_another_optimizer_or_without_cuda_is_one_line(adamw_bf16_run):
    result, _ = adamw_bf16_run
    with pytest.raises(PostplaceError, match=r"made for adamw \(lr 0.003\), not sgd \(lr 0.1\)"):
        postplace.apply(result, device_map="cpu", optimizer="sgd")
    if not torch.cuda.is_available() and any(d.startswith("gpu") for d in result.mapping().values()):
        with pytest.raises(PostplaceError, match="this machine has no CUDA; .*device_map='cpu'") as err:
            postplace.apply(result)
        assert "\n" not in str(err.value)


def test_resume_refuses_another_optimizer_or_precision(adamw_bf16_run):
    _, out = adamw_bf16_run
    with pytest.raises(PostplaceError, match="was made for adamw .* not adam "):
        postplace.resume(out, optimizer="adam", report=False)
    with pytest.raises(PostplaceError, match="started with precision bf16, not fp32"):
        postplace.resume(out, precision="fp32", report=False)


def test_help_of_place_documents_every_parameter():
    import inspect

    doc = postplace.place.__doc__
    for name, param in inspect.signature(postplace.place).parameters.items():
        stars = "**" if param.kind is param.VAR_KEYWORD else ""
        assert f"\n    {stars}{name}" in doc or f", {name}" in doc, name


def test_zoo_step_with_adamw_holds_adams_state_and_train_reads_it_back(tmp_path):
    out = tmp_path / "gpt2"
    r = postplace.place(
        "gpt2",
        "k80x2",
        size="small",
        budget=48,
        microbatches=1,
        out=out,
        report=False,
        step=postplace.Step(optimizer="adamw", lr=1e-2),
    )
    sgd = postplace.place("gpt2", "k80x2", size="small", budget=48, microbatches=1)
    ratio = _parameter_bytes(r.graph) / _parameter_bytes(sgd.graph)
    assert 1.49 < ratio < 1.51  # parameter + two moments against parameter + momentum
    text = cmd_train("gpt2", str(out / "placement.json"), 2, cluster="k80x2", map_all_to="cpu")
    assert "update: adamw (lr 0.01, weight_decay 0.01); precision fp32" in text
    with pytest.raises(PostplaceError, match="made for the adamw optimizer"):
        cmd_train("gpt2", str(out / "placement.json"), 1, cluster="k80x2", map_all_to="cpu", optimizer="sgd")


def _parameter_bytes(graph) -> float:
    return float(graph.persistent_bytes[np.array([t == "parameter" for t in graph.op_types])].sum())


def test_bf16_on_a_cluster_without_bf16_is_one_line_and_writes_nothing(tmp_path):
    with pytest.raises(PostplaceError, match=r"gpu0 \(K80\) has no bf16 units") as err:
        postplace.place(
            "gpt2", "k80x2", size="small", budget=48, out=tmp_path / "r", step=postplace.Step(precision="bf16")
        )
    assert "\n" not in str(err.value) and not (tmp_path / "r").exists()
