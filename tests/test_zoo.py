"""The benchmark zoo at small size: every model traces to a sound graph; names, caching, profiling."""

import math

import numpy as np
import pytest

from postplace import zoo
from postplace.errors import PostplaceError
from postplace.graph import PHASES, OpGraph
from tests.tracehelp import assert_backward_colocated_with_forward

FWD, BWD, UPD = (PHASES.index(p) for p in ("forward", "backward", "update"))
SOURCES = ("parameter", "buffer", "input", "constant")
_traced = {}


def traced(name):
    """Each small model is built and traced once per test session (a few seconds in all)."""
    if name not in _traced:
        model, inputs, loss_fn = zoo.build(name, "small")
        from postplace.graph.trace_torch import trace

        _traced[name] = (model, trace(model, inputs, loss_fn, name=name))
    return _traced[name]


def conv_textbook(node):
    """2 * N * C_out * H_out * W_out * (C_in / groups) * k_h * k_w, with H_out from the size formula."""
    x, w = node.args[0].meta["val"], node.args[1].meta["val"]
    stride, pad, dil, _, _, groups = node.args[3:9]
    n, cin, h, wd = x.shape
    cout, _, kh, kw = w.shape
    hout = (h + 2 * pad[0] - dil[0] * (kh - 1) - 1) // stride[0] + 1
    wout = (wd + 2 * pad[1] - dil[1] * (kw - 1) - 1) // stride[1] + 1
    return 2 * n * cout * hout * wout * (cin // groups) * kh * kw


def matmul_textbook(op_type, node):
    """2 * M * K * N per product (a batch of them for bmm); addmm's bias add is not counted."""
    a, b = (node.args[1], node.args[2]) if op_type == "addmm" else node.args[:2]
    a, b = a.meta["val"].shape, b.meta["val"].shape
    batch = a[0] if op_type == "bmm" else 1
    return 2 * batch * a[-2] * a[-1] * b[-1]


@pytest.mark.parametrize("name", list(zoo.MODELS))
def test_zoo_model_traces_to_a_sound_training_graph(name):
    model, tr = traced(name)
    g = tr.graph
    nodes = {n.name: n for n in tr.gm.graph.nodes}
    # a DAG in program order (validate() ran on construction; check the order here too)
    assert g.num_ops > 50 and np.all(g.edge_src < g.edge_dst)
    # textbook FLOPs for every convolution and matrix product
    convs = [i for i, t in enumerate(g.op_types) if t == "convolution"]
    mms = [i for i, t in enumerate(g.op_types) if t in ("mm", "addmm", "bmm")]
    assert mms, "every zoo model has a matrix product"
    assert convs or name not in ("inception_v3", "resnet50")
    for i in convs:
        assert g.flops[i] == conv_textbook(nodes[g.names[i]]), g.names[i]
    for i in mms:
        assert g.flops[i] == matmul_textbook(g.op_types[i], nodes[g.names[i]]), g.names[i]
    # forward + backward is 2x to 4x the forward
    fwd, bwd = g.flops[g.phase == FWD].sum(), g.flops[g.phase == BWD].sum()
    assert 2.0 <= (fwd + bwd) / fwd <= 4.0
    # persistent bytes: parameters x (1 + momentum) x 4 bytes, plus the buffers
    params = sum(p.numel() for p in model.parameters())
    buffers = sum(b.numel() * b.element_size() for b in model.buffers())
    is_param = np.array([t == "parameter" for t in g.op_types])
    assert g.persistent_bytes[is_param].sum() == params * (1 + 1) * 4
    assert math.isclose(g.persistent_bytes.sum(), params * 2 * 4 + buffers)


@pytest.mark.parametrize("name", list(zoo.MODELS))
def test_zoo_model_colocation(name):
    model, tr = traced(name)
    g, gm = tr.graph, tr.gm
    assert_backward_colocated_with_forward(tr)
    nodes = {n.name: n for n in gm.graph.nodes}
    pnames = [n for n, _ in model.named_parameters()]
    updated = set()
    for i in np.flatnonzero(g.phase == UPD):
        k = nodes[g.names[i]].meta["custom"]["param"]
        assert g.colocation[i] == g.colocation[g.index(f"param:{pnames[k]}")] != -1
        updated.add(k)
    assert updated == set(range(len(pnames)))  # every parameter is updated
    assert g.metadata["colocation"]["coverage"] >= 0.9


def test_models_list_names_sources_and_both_sizes():
    assert set(zoo.MODELS) == {"inception_v3", "resnet50", "rnnlm", "nmt2", "nmt4", "gpt2", "llama"}
    for spec in zoo.MODELS.values():
        assert spec.description and spec.source
        assert spec.config("small") != spec.config("full")
    assert zoo.MODELS["resnet50"].config("full")["batch"] == 32
    assert zoo.MODELS["inception_v3"].config("full")["image"] == 299
    assert zoo.MODELS["rnnlm"].config("full")["layers"] == 4


def test_unknown_model_or_size_lists_what_exists():
    with pytest.raises(PostplaceError) as err:
        zoo.build("vgg16")
    assert "vgg16" in str(err.value) and all(n in str(err.value) for n in zoo.MODELS)
    with pytest.raises(PostplaceError, match="small"):
        zoo.cached_graph("gpt2", size="huge")


def test_cached_graph_traces_once_then_reads_the_file(tmp_path, monkeypatch):
    monkeypatch.setenv("POSTPLACE_CACHE", str(tmp_path))
    g1 = zoo.cached_graph("gpt2", "small")
    files = list(tmp_path.glob("gpt2-small-sgd-*.json"))
    assert len(files) == 1

    def no_trace(*a, **k):
        raise AssertionError("traced again despite the cache")

    monkeypatch.setattr(zoo, "trace_model", no_trace)
    g2 = zoo.cached_graph("gpt2", "small")
    assert isinstance(g2, OpGraph) and g2.names == g1.names
    assert np.array_equal(g2.flops, g1.flops) and g2.metadata["zoo"]["name"] == "gpt2"
    # a different optimizer is a different graph (Adam keeps two state tensors per parameter)
    monkeypatch.undo()
    monkeypatch.setenv("POSTPLACE_CACHE", str(tmp_path))
    g3 = zoo.cached_graph("gpt2", "small", optimizer="adam")
    assert g3.persistent_bytes.sum() > g1.persistent_bytes.sum()
    assert len(list(tmp_path.glob("gpt2-small-*.json"))) == 2


def test_a_damaged_cache_file_is_traced_again(tmp_path, monkeypatch):
    monkeypatch.setenv("POSTPLACE_CACHE", str(tmp_path))
    g1 = zoo.cached_graph("rnnlm", "small")
    (path,) = tmp_path.glob("rnnlm-small-*.json")
    path.write_text("{ truncated")
    assert zoo.cached_graph("rnnlm", "small").names == g1.names


def test_cli_functions_show_models_and_write_graphs(tmp_path, monkeypatch):
    from postplace.zoo.cli import cmd_graph, cmd_models

    text = cmd_models()
    assert all(name in text for name in zoo.MODELS) and "Szegedy" in text
    monkeypatch.setenv("POSTPLACE_CACHE", str(tmp_path / "cache"))
    out = tmp_path / "g.json"
    summary = cmd_graph("resnet50", "small", out)
    g = OpGraph.load(out)
    assert f"{g.num_ops} ops" in summary and f"{g.num_edges} edges" in summary
