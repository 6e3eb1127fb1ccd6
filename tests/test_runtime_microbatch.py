"""Placements of a step traced as m micro-batches, run and measured for real: ``apply_zoo``, ``train`` on
an m-graph's placement file, ``TorchEvaluator.for_zoo(..., microbatches=m)``, its Ray recipe, ``confirm``.

Numerics: each placed step (every logical device mapped to the CPU, one torch thread) is compared with
eager gradient accumulation (m backward passes of loss / m, one ``torch.optim.SGD`` momentum step):
losses to ``rtol=1e-6``, parameters and buffers to ``rtol=1e-5, atol=1e-6``. Measured (torch 2.13, CPU,
one thread): parameters and buffers bit-identical after 2 steps, losses within 5e-8 relative (the eager
reference adds the m micro-batch losses in Python floats, the traced step in float32).
"""

import json
import pickle

import numpy as np
import pytest
import torch

from postplace.cluster import load_cluster
from postplace.cluster.placement import (
    colocation_representative,
    effective_kinds,
    invalid_reason,
    save_placement,
    to_mapping,
)
from postplace.errors import PostplaceError
from postplace.runtime import TorchEvaluator, apply_zoo
from postplace.runtime.zoo_step import check_placement_microbatches, placement_microbatches
from postplace.zoo import MODELS, build, cached_graph, spec, trace_model
from tests.clihelp import run_cli
from tests.test_microbatch import eager_accumulation

pytestmark = pytest.mark.usefixtures("torch_one_thread")

CNNS = ("inception_v3", "resnet50")


def cases():
    """(model, m, batch): m = 2 at the small config's batch of 2 (the m-graph ``place`` searches), except
    the CNNs, whose batch norm needs more than one value per channel at the 1x1 end of the network (a
    micro-batch of 1 cannot be traced), so they take a batch of 4; m = 4 (batch of 4) for the cheap
    sequence models (the NMTs' m = 4 graphs take seconds more each and add no new case)."""
    out = [(name, 2, 4 if name in CNNS else None) for name in MODELS]
    return out + [(name, 4, 4) for name in ("rnnlm", "gpt2")]


def random_legal_placement(graph, cluster, seed):
    """A random device per colocation set, among the device kinds the set may use (a legal placement)."""
    ok = (effective_kinds(graph)[:, None] & cluster.kind_bits[None, :]) != 0
    scores = np.random.default_rng(seed).random(ok.shape)
    dev = np.argmax(np.where(ok, scores, -1.0), axis=1)[colocation_representative(graph)]
    assert invalid_reason(graph, cluster, dev) is None
    return dev


def _placement_for(name, m, batch, cluster, seed):
    if batch is None:  # the graph `place` searches (cached on disk)
        g = cached_graph(name, "small", microbatches=m)
    else:
        g = trace_model(name, "small", microbatches=m, batch=batch, init=False).graph
    return g, random_legal_placement(g, cluster, seed)


@pytest.mark.parametrize(("name", "m", "batch"), cases(), ids=lambda v: str(v))
def test_placed_micro_batched_step_trains_like_eager_gradient_accumulation(name, m, batch):
    """A random legal placement over k80x2 (cpu, gpu0, gpu1, all mapped to the CPU), given as op ids or as
    ``{op name: device name}`` (what placement.json holds), trains 2 steps as eager accumulation does."""
    c = load_cluster("k80x2")
    g, dev = _placement_for(name, m, batch, c, seed=len(name) + m)
    assert placement_microbatches(g.names) == m
    placement = to_mapping(g, c, dev) if (len(name) + m) % 2 else dev
    step = apply_zoo(name, "small", placement, c, microbatches=m, device_map="cpu", batch=batch)
    assert tuple(step.traced.graph.names) == tuple(g.names) and step.traced.microbatches == m
    np.testing.assert_array_equal(step.op_device, dev)
    assert step.summary["transfers"] > 0 and len(step.summary["ops_per_device"]) > 1
    torch.manual_seed(123)
    first = step().item()
    torch.manual_seed(123)
    second, violations = step.run_checked()  # node by node under the logical-device check
    assert violations == []
    model, inputs, loss_fn = build(name, "small", batch=batch)
    ref = eager_accumulation(model, inputs, loss_fn.fn, loss_fn.targets, m, 2)
    np.testing.assert_allclose([first, second.item()], ref, rtol=1e-6)
    for pname, p in model.named_parameters():
        torch.testing.assert_close(step.parameters()[pname], p.detach(), rtol=1e-5, atol=1e-6, msg=pname)
    for bname, b in model.named_buffers():
        torch.testing.assert_close(step.buffers()[bname], b, rtol=1e-5, atol=1e-6, msg=bname)


def test_apply_zoo_starts_from_a_given_model_and_refuses_another_m():
    c = load_cluster("k80x2")
    g = cached_graph("gpt2", "small", microbatches=2)
    dev = random_legal_placement(g, c, 0)
    model, _, _ = build("gpt2", "small", seed=5)
    step = apply_zoo("gpt2", "small", dev, "k80x2", microbatches=2, model=model, device_map="cpu")
    torch.testing.assert_close(step.parameters()["wte.weight"], model.wte.weight.detach())
    assert np.isfinite(step().item())
    with pytest.raises(PostplaceError, match="2 micro-batches.*microbatches 1 was asked for"):
        apply_zoo("gpt2", "small", to_mapping(g, c, dev), c, device_map="cpu")
    with pytest.raises(PostplaceError, match=f"{g.num_ops} entries.*4 micro-batches has"):
        apply_zoo("gpt2", "small", dev, c, microbatches=4, device_map="cpu", batch=4)
    one = cached_graph("gpt2", "small")
    with pytest.raises(PostplaceError, match="one micro-batch.*microbatches 2"):
        apply_zoo("gpt2", "small", to_mapping(one, c, np.zeros(one.num_ops, dtype=int)), c, microbatches=2)


def test_micro_batch_count_from_op_names():
    assert placement_microbatches(["param:w", "addmm"]) == 1
    assert placement_microbatches(["param:w", "mb0_addmm", "mb3_addmm", "mb1_x"]) == 4
    assert check_placement_microbatches({"mb0_a": "cpu", "mb1_a": "cpu"}, None, "f.json") == 2
    with pytest.raises(PostplaceError, match="f.json is a placement of a step traced as 2 micro-batches"):
        check_placement_microbatches({"mb0_a": "cpu", "mb1_a": "cpu"}, 4, "f.json")
    for name in MODELS:  # no op of a one-micro-batch zoo graph looks like a micro-batch copy
        assert placement_microbatches(cached_graph(name, "small").names) == 1


# ------------------------------------------------------------------------------ train
def test_train_reads_the_micro_batch_count_from_the_placement_file_and_checks_a_given_one(tmp_path):
    from postplace.runtime.cli import cmd_train

    c = load_cluster("k80x2")
    g = cached_graph("gpt2", "small", microbatches=2)
    path = tmp_path / "placement.json"
    save_placement(path, g, c, random_legal_placement(g, c, 1))
    text = cmd_train("gpt2", str(path), 2, size="small", map_all_to="cpu", threads=1)  # m read from the op names
    assert "gpt2-small-mb2-none" in text and "2 micro-batches (read from the placement's op names)" in text
    text = cmd_train("gpt2", str(path), 1, size="small", cluster="k80x2", map_all_to="cpu", microbatches=2, threads=1)
    assert "gpt2-small-mb2-none" in text and "simulated step time on" in text
    for wrong in (1, 4):
        with pytest.raises(PostplaceError) as err:
            cmd_train("gpt2", str(path), 1, size="small", map_all_to="cpu", microbatches=wrong)
        msg = str(err.value)
        assert "\n" not in msg and "2 micro-batches" in msg and f"--microbatches {wrong} was asked for" in msg
    one = tmp_path / "one.json"
    save_placement(one, cached_graph("gpt2", "small"), c, np.zeros(cached_graph("gpt2", "small").num_ops, int))
    with pytest.raises(PostplaceError, match="one micro-batch .*--microbatches 2 was asked for"):
        cmd_train("gpt2", str(one), 1, size="small", map_all_to="cpu", microbatches=2)
    assert "gpt2-small:" in cmd_train("gpt2", str(one), 1, size="small", map_all_to="cpu", threads=1)


def test_train_cli_names_a_micro_batch_mismatch_in_one_line(tmp_path):
    c = load_cluster("k80x2")
    g = cached_graph("gpt2", "small", microbatches=2)
    path = tmp_path / "placement.json"
    save_placement(path, g, c, np.zeros(g.num_ops, dtype=int))
    r = run_cli(
        "train", "gpt2", "--size", "small", "--placement", str(path), "--map-all-to", "cpu", "--microbatches", "4"
    )
    assert r.returncode != 0
    err = r.stderr.strip()
    assert "Traceback" not in err and len(err.splitlines()) == 1, err
    assert "2 micro-batches" in err and "--microbatches 4" in err


# ------------------------------------------------------------------------------ measuring
def test_torch_evaluator_measures_the_whole_accumulated_step():
    g = cached_graph("gpt2", "small", microbatches=2)
    ev = TorchEvaluator.for_zoo("gpt2", "small", "k80x2", device_map="cpu", graph=g, steps=3, discard=1)
    assert ev.microbatches == 2 and tuple(ev.graph.names) == tuple(g.names)  # m read from the graph
    ev2 = TorchEvaluator.for_zoo("gpt2", "small", "k80x2", device_map="cpu", microbatches=2, steps=3, discard=1)
    assert tuple(ev2.graph.names) == tuple(g.names)
    rows = np.stack([random_legal_placement(g, ev.cluster, s) for s in (2, 3)])
    res = ev.evaluate(rows)
    assert res.feasible.all() and np.all(np.isfinite(res.step_time)) and np.all(res.step_time > 0)
    assert res.extra["microbatches"] == 2
    with pytest.raises(PostplaceError, match="2 micro-batch.*microbatches=1"):
        TorchEvaluator.for_zoo("gpt2", "small", "k80x2", graph=g, microbatches=1)
    with pytest.raises(PostplaceError, match="colocation 'none'.*'module'"):
        TorchEvaluator.for_zoo("gpt2", "small", "k80x2", graph=g, colocation="module")


def test_torch_zoo_factory_carries_the_micro_batch_count():
    from postplace.distributed import TorchZooFactory

    fac = TorchZooFactory(
        "gpt2",
        "small",
        "k80x2",
        device_map="cpu",
        options={"steps": 2, "discard": 1},
        microbatches=2,
        colocation="module",
    )
    fac = pickle.loads(pickle.dumps(fac))
    ev = fac()
    assert ev.microbatches == 2 and ev.graph.metadata["microbatch_colocation"] == "module"
    g = cached_graph("gpt2", "small", microbatches=2, colocation="module")
    assert tuple(ev.graph.names) == tuple(g.names)
    assert ev.evaluate(random_legal_placement(g, ev.cluster, 4)[None]).feasible.all()
    assert fac.num_gpus == 0.0


def test_confirm_measures_micro_batched_candidates(tmp_path):
    from postplace.confirm import candidates_from_run, confirm
    from postplace.search import Budget, make_problem, make_strategy, run

    g, c = cached_graph("gpt2", "small", microbatches=2), load_cluster("k80x2")
    prob = make_problem(g, c, groups=6, seed=0)
    run(
        make_strategy("random", prob.space, seed=1),
        prob.simulator,
        Budget(samples=16),
        out_dir=tmp_path,
        progress=False,
    )
    cands = candidates_from_run(tmp_path, prob.simulator, 2)
    assert cands.shape[1] == g.num_ops
    measurer = TorchEvaluator.for_zoo("gpt2", "small", c, device_map="cpu", graph=g, steps=3, discard=1)
    res = confirm(prob.simulator, measurer, cands)
    assert res.evaluator == "torch" and len(res.rows) >= 2 and all(r.status == "ok" for r in res.rows)
    assert np.isfinite(res.best.measured_s) and res.best.measured_s == min(r.measured_s for r in res.rows)
    json.dumps(res.to_dict())
    one = TorchEvaluator.for_zoo("gpt2", "small", c, device_map="cpu", steps=2, discard=1)
    with pytest.raises(PostplaceError, match="1 micro-batch.*2 micro-batch"):
        confirm(prob.simulator, one, cands)


def test_small_cnns_cannot_be_traced_as_micro_batches_of_one():
    """Why the CNN cases above take a batch of 4: at the small config's batch of 2, m = 2 leaves one
    sample per micro-batch, and batch norm cannot train on one value per channel (a one-line error)."""
    assert spec("resnet50").config("small")["batch"] == 2
    with pytest.raises(PostplaceError, match="batch norm layer .* needs 2 or more samples"):
        apply_zoo("resnet50", "small", np.zeros(10, dtype=int), "k80x2", microbatches=2)


def test_train_takes_the_size_and_model_the_placement_was_made_for(tmp_path, capsys):
    """`place rnnlm` (full) then `train rnnlm --placement .../placement.json` trained the small model
    and failed on op names; the run's summary.json says what the placement was made for."""
    import json

    import postplace
    from postplace.runtime.cli import _size_for
    from tests.clihelp import cli_error

    out = tmp_path / "run"
    postplace.place("gpt2", "k80x2", size="small", budget=8, strategy="random", groups=4, microbatches=1, out=out)
    placement = str(out / "placement.json")
    assert _size_for("gpt2", placement, None) == "small"
    doc = json.loads((out / "summary.json").read_text())
    doc["target_spec"]["size"] = "full"  # as a full-size run writes it
    (out / "summary.json").write_text(json.dumps(doc))
    assert _size_for("gpt2", placement, None) == "full"  # no --size: the run's
    err = cli_error(["train", "gpt2", "--placement", placement, "--steps", "1", "--size", "small"], capsys)
    assert "made for gpt2 at --size full" in err and "drop --size or give --size full" in err
    err = cli_error(["train", "rnnlm", "--placement", placement, "--steps", "1"], capsys)
    assert "made for zoo model 'gpt2'" in err
    assert _size_for("gpt2", "single:cpu", None) == "full"  # no run to read it from: full, as every command
