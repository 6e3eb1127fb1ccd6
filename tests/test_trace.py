"""Tracing a training step into an OpGraph: folding, FLOPs, bytes, phases, colocation, errors."""

import logging

import numpy as np
import pytest
import torch
from torch import nn

from postplace.errors import PostplaceError
from postplace.graph import PHASES, OpGraph, from_torch
from postplace.graph.flops import op_flops
from postplace.graph.trace_torch import trace
from tests.tracehelp import assert_backward_colocated_with_forward

FWD, BWD, UPD = (PHASES.index(p) for p in ("forward", "backward", "update"))
VIEW_TYPES = {
    "view",
    "t",
    "transpose",
    "permute",
    "expand",
    "getitem",
    "detach",
    "unsqueeze",
    "squeeze",
    "_unsafe_view",
}


class TinyNet(nn.Module):
    """Not a zoo model: embedding, a shared linear used twice, layer norm, conv1d, a residual."""

    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(20, 8)
        self.lin = nn.Linear(8, 8)
        self.norm = nn.LayerNorm(8)
        self.conv = nn.Conv1d(8, 6, 3, padding=1)
        self.head = nn.Linear(6, 5)

    def forward(self, tokens):
        x = self.emb(tokens)  # [b, t, 8]
        x = x + torch.tanh(self.lin(x))
        x = self.norm(self.lin(x))  # shared weights: gradients accumulate
        x = self.conv(x.transpose(1, 2)).relu().mean(2)
        return self.head(x)


def tiny(optimizer="sgd"):
    torch.manual_seed(0)
    model = TinyNet()
    tokens = torch.randint(0, 20, (3, 7))
    y = torch.randint(0, 5, (3,))
    return model, trace(model, tokens, nn.functional.cross_entropy, optimizer, targets=y)


def test_module_outside_the_zoo_traces_to_a_valid_dag():
    model, tr = tiny()
    g = tr.graph
    assert isinstance(g, OpGraph) and g.memory_mode == "live"
    assert np.all(g.edge_src < g.edge_dst)  # stored in topological (program) order
    assert {PHASES[p] for p in g.phase} >= {"forward", "backward", "update"}
    # program order: all forward work, then backward, then updates
    fwd, bwd, upd = (np.flatnonzero(g.phase == p) for p in (FWD, BWD, UPD))
    assert fwd.max() < bwd.min() and bwd.max() < upd.min()
    # from_torch is the same graph
    assert from_torch(model, torch.randint(0, 20, (3, 7)), lambda o: o.sum()).num_ops > 0


def test_bookkeeping_nodes_are_folded_and_data_edges_kept():
    _, tr = tiny()
    g = tr.graph
    assert not VIEW_TYPES & set(g.op_types)
    assert g.metadata["ops_before_folding"] > g.num_ops - sum(
        t in ("parameter", "buffer", "input", "constant") for t in g.op_types
    )
    # the conv reads the transposed layer-norm output: the edge comes from the layer norm op itself
    conv = g.op_types.index("convolution")
    srcs = {g.op_types[s] for s in g.edge_src[g.edge_dst == conv]}
    assert "native_layer_norm" in srcs
    # every edge carries the bytes of the source's output slot it names
    for s, slot, b in zip(g.edge_src, g.edge_slot, g.edge_bytes, strict=True):
        if slot == 0 and g.op_types[s] not in ("parameter",):
            assert b <= g.output_bytes[s] + 1e-9


def test_flops_of_conv_and_matmul_equal_the_textbook_formula():
    _, tr = tiny()
    g, nodes = tr.graph, {n.name: n for n in tr.gm.graph.nodes}
    (conv,) = [i for i, t in enumerate(g.op_types) if t == "convolution"]
    n = nodes[g.names[conv]]
    x, w = n.args[0].meta["val"], n.args[1].meta["val"]
    (b, cin, length), (cout, _, k) = x.shape, w.shape
    lout = (length + 2 * 1 - (k - 1) - 1) // 1 + 1
    assert g.flops[conv] == 2 * b * cout * lout * cin * k
    mms = [i for i, t in enumerate(g.op_types) if t in ("mm", "addmm")]
    assert mms
    for i in mms:
        n = nodes[g.names[i]]
        a, bmat = (n.args[1], n.args[2]) if g.op_types[i] == "addmm" else n.args[:2]
        (m, kk), (_, ncol) = a.meta["val"].shape, bmat.meta["val"].shape
        assert g.flops[i] == 2 * m * kk * ncol


def test_our_flop_formulas_for_ops_torch_counts_as_zero():
    x = torch.empty(4, 5)
    assert op_flops(torch.ops.aten.add.Tensor, (x, x), {}, x) == 20
    assert op_flops(torch.ops.aten.sum.default, (x,), {}, torch.empty(())) == 20
    assert op_flops(torch.ops.aten._softmax.default, (x, 1, False), {}, x) == 5 * 20
    img = torch.empty(2, 3, 8, 8)
    pooled = torch.empty(2, 3, 4, 4)
    assert op_flops(torch.ops.aten.avg_pool2d.default, (img, [2, 2]), {}, pooled) == 2 * 3 * 4 * 4 * 4
    assert op_flops(torch.ops.aten.clone.default, (x,), {}, x) == 0


def test_bytes_and_inplace_updates():
    model, tr = tiny()
    g = tr.graph
    upd = np.flatnonzero(g.phase == UPD)
    assert g.inplace[upd].all()  # SGD: mul_, add_, add_ all write their first argument
    assert not g.inplace[g.phase == FWD].any() or all(
        g.op_types[i].endswith("_") for i in np.flatnonzero(g.inplace & (g.phase == FWD))
    )
    real = np.flatnonzero(~np.isin(g.op_types, ["parameter", "buffer", "input", "constant"]))
    assert (g.bytes_accessed[real] >= g.output_bytes[real]).all()
    assert (g.bytes_accessed[real] > 0).all()


@pytest.mark.parametrize("optimizer,slots,step_bytes", [("sgd", 1, 0), ("adam", 2, 4), ("adamw", 2, 4)])
def test_persistent_bytes_are_parameters_and_optimizer_state(optimizer, slots, step_bytes):
    model, tr = tiny(optimizer)
    g = tr.graph
    pbytes = sum(p.numel() * p.element_size() for p in model.parameters())
    params = np.array([t == "parameter" for t in g.op_types])
    # Adam's moments are two parameter-sized tensors, and its step count a float32 scalar per parameter
    assert g.persistent_bytes[params].sum() == pbytes * (1 + slots) + step_bytes * len(list(model.parameters()))
    assert g.persistent_bytes[~params].sum() == 0  # TinyNet has no buffers; gradients are activations
    assert g.metadata["optimizer_slots"] == slots


def test_forward_backward_colocation_through_autograd_sequence_numbers():
    _, tr = tiny()
    assert_backward_colocated_with_forward(tr)
    g = tr.graph
    assert g.metadata["colocation"]["coverage"] >= 0.9


def test_every_update_op_is_colocated_with_its_parameter():
    model, tr = tiny("adam")
    g = tr.graph
    nodes = {n.name: n for n in tr.gm.graph.nodes}
    pnames = [n for n, _ in model.named_parameters()]
    seen = set()
    for i in np.flatnonzero(g.phase == UPD):
        k = nodes[g.names[i]].meta["custom"]["param"]
        p = g.index(f"param:{pnames[k]}")
        assert g.colocation[i] == g.colocation[p] != -1
        seen.add(k)
    assert seen == set(range(len(pnames)))


class Branchy(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x):
        if x.sum() > 0:  # depends on the data, not the shape
            return self.lin(x)
        return -self.lin(x)


def test_data_dependent_control_flow_gives_one_clear_line():
    with pytest.raises(PostplaceError) as err:
        from_torch(Branchy(), torch.randn(2, 4), lambda o: o.sum())
    msg = str(err.value)
    assert "\n" not in msg
    assert "Branchy" in msg and "tensor values" in msg and "torch.where" in msg
    assert "test_trace.py" in msg  # points at the line in the user's code


def test_bad_loss_and_optimizer_are_one_line_errors():
    with pytest.raises(PostplaceError, match="scalar"):
        from_torch(nn.Linear(3, 2), torch.randn(4, 3), lambda o: o)
    with pytest.raises(PostplaceError, match="unknown optimizer"):
        from_torch(nn.Linear(3, 2), torch.randn(4, 3), lambda o: o.sum(), optimizer="lamb")


def test_graph_round_trips_through_a_file(tmp_path):
    _, tr = tiny()
    tr.graph.save(tmp_path / "g.json")
    back = OpGraph.load(tmp_path / "g.json")
    assert back.names == tr.graph.names and np.array_equal(back.colocation, tr.graph.colocation)
    assert back.metadata["colocation"] == tr.graph.metadata["colocation"]


class Attention(nn.Module):
    def __init__(self):
        super().__init__()
        self.qkv = nn.Linear(16, 48)

    def forward(self, x):  # x: [batch 2, seq 8, 16] -> 2 heads of 8
        q, k, v = self.qkv(x).view(2, 8, 3, 2, 8).permute(2, 0, 3, 1, 4)
        return nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)


def test_fused_cpu_attention_is_counted_as_its_two_matrix_products():
    g = from_torch(Attention(), torch.randn(2, 8, 16), lambda o: o.sum())
    (fwd,) = [i for i, t in enumerate(g.op_types) if t.startswith("_scaled_dot_product") and g.phase[i] == FWD]
    b, h, s, d = 2, 2, 8, 8
    # Q K^T and P V; torch's formula counts the whole score matrix, and a causal kernel computes half of it
    assert g.flops[fwd] == 2 * (2 * b * h * s * s * d) / 2


def test_a_model_with_nothing_to_train_is_a_one_line_error():
    frozen = nn.Linear(3, 2).requires_grad_(False)
    with pytest.raises(PostplaceError, match="requires grad"):
        from_torch(frozen, torch.randn(4, 3), lambda o: o.sum())


class WrongShapes(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(3, 3)

    def forward(self, x):
        return self.lin(x) @ torch.ones(5, 5)


def test_an_op_that_fails_on_fake_tensors_is_one_line_and_no_log_traceback():
    records = []
    handler = logging.Handler()
    handler.emit = records.append
    log = logging.getLogger("torch._subclasses.fake_tensor")
    log.addHandler(handler)
    try:
        with pytest.raises(PostplaceError) as err:
            from_torch(WrongShapes(), torch.randn(2, 3), lambda o: o.sum())
    finally:
        log.removeHandler(handler)
    assert "\n" not in str(err.value) and "WrongShapes" in str(err.value) and "reduction dim" in str(err.value)
    assert not records  # torch would log the failing op's traceback at ERROR level


def test_frozen_parameters_have_no_optimizer_state_and_no_update():
    model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 2))
    model[0].requires_grad_(False)
    g = from_torch(model, torch.randn(3, 4), lambda o: o.sum(), optimizer="adam")
    frozen, trained = g.index("param:0.weight"), g.index("param:1.weight")
    assert g.persistent_bytes[frozen] == 4 * 4 * 4 and g.persistent_bytes[trained] == 2 * 4 * 4 * 3 + 4  # + step
    assert g.colocation[frozen] == -1 or not np.any((g.colocation == g.colocation[frozen]) & (g.phase == UPD))


def test_inputs_must_be_tensors():
    with pytest.raises(PostplaceError, match="inputs must be tensors"):
        from_torch(nn.Linear(3, 2), (torch.randn(4, 3), "x"), lambda o: o.sum())


def test_module_outside_the_zoo_simulates_on_a_preset():
    from postplace.cluster import load_cluster
    from postplace.cluster.placement import single_device
    from postplace.sim import Simulator

    _, tr = tiny()
    g, c = tr.graph, load_cluster("k80x2")
    sim = Simulator(g, c)
    res = sim.evaluate_ops(np.stack([single_device(g, c, d) for d in c.device_names]))
    assert not res.failed.any() and not res.oom.any()
    # one device runs every op back to back: its step time is the sum of its op times
    np.testing.assert_allclose(res.step_time, sim.problem.op_time.sum(axis=0), rtol=1e-12)
    assert (res.step_time >= sim.lower_bound).all()
    # persistent bytes (parameters + momentum) live on the one device, activations on top
    assert (res.peak_mem.max(axis=1) > g.persistent_bytes.sum()).all()
