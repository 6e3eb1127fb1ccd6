"""Micro-batched tracing: the step of m micro-batches, its structure, colocation modes and the file format."""

import numpy as np
import pytest
import torch
from torch import nn

from postplace.errors import PostplaceError
from postplace.graph import PHASES, GraphError, OpGraph
from postplace.graph.trace_torch import trace

pytestmark = pytest.mark.usefixtures("torch_one_thread")

FWD, BWD, UPD = (PHASES.index(p) for p in ("forward", "backward", "update"))


def two_layer():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3)).train()
    x, y = torch.randn(6, 4), torch.randint(0, 3, (6,))
    return model, x, y


def ce(out, y):
    return nn.functional.cross_entropy(out, y)


@pytest.mark.parametrize("m", [2, 3])
def test_every_micro_batch_gets_a_copy_of_forward_and_backward_and_the_update_runs_once(m):
    model, x, y = two_layer()
    one = trace(model, (x[: 6 // m],), ce, targets=(y[: 6 // m],)).graph
    g = trace(model, (x,), ce, targets=(y,), microbatches=m).graph
    per_mb = (one.phase == FWD) | (one.phase == BWD)
    one_types = [t for t, keep in zip(one.op_types, per_mb, strict=True) if keep]
    for k in range(m):  # the same ops for every micro-batch: one's, plus the loss scaling by 1/m and its backward
        types = [t for t, mb in zip(g.op_types, g.microbatch, strict=True) if mb == k]
        assert types.count("div") == one_types.count("div") + 2
        assert [t for t in types if t != "div"] == [t for t in one_types if t != "div"]
    acc = [i for i in range(g.num_ops) if g.names[i].startswith("acc")]
    assert len(acc) == (m - 1) * 4  # one sum per trained parameter per extra micro-batch
    assert all(g.phase[i] == BWD and g.microbatch[i] == -1 for i in acc)
    assert (g.phase == UPD).sum() == (one.phase == UPD).sum()  # one update
    assert g.metadata["microbatches"] == m
    # the update of each parameter reads the last gradient sum, never a micro-batch's own gradient
    upd = set(np.flatnonzero(g.phase == UPD))
    for e in range(g.num_edges):
        if g.edge_dst[e] in upd and g.microbatch[g.edge_src[e]] >= 0:
            pytest.fail(f"update {g.names[g.edge_dst[e]]} reads {g.names[g.edge_src[e]]} of one micro-batch")
    # FLOPs: every micro-batch does the work of one micro-batch-sized step
    mm, one_mm = (np.isin(h.op_types, ["addmm", "mm"]) for h in (g, one))
    assert g.flops[(g.microbatch >= 0) & mm].sum() == pytest.approx(m * one.flops[per_mb & one_mm].sum())


def test_colocation_none_keeps_micro_batches_apart_and_module_joins_them():
    model, x, y = two_layer()
    none = trace(model, (x,), ce, targets=(y,), microbatches=2, microbatch_colocation="none").graph
    mod = trace(model, (x,), ce, targets=(y,), microbatches=2, microbatch_colocation="module").graph
    for members in none.colocation_sets:
        assert len({int(none.microbatch[i]) for i in members} - {-1}) <= 1
    spans = [{int(mod.microbatch[i]) for i in members} - {-1} for members in mod.colocation_sets]
    assert {0, 1} in spans
    for i in range(mod.num_ops):  # mb0's op and its mb1 copy share a set
        if mod.names[i].startswith("mb0_") and mod.op_types[i] != "input":
            j = mod.index("mb1_" + mod.names[i][4:])
            assert mod.colocation[i] == mod.colocation[j] != -1, mod.names[i]
    # modules are recorded per op: a linear layer's forward and backward ops name it
    i, j = none.index("mb1_addmm"), none.index("mb1_addmm_1")
    assert (none.module[i], none.module[j]) == ("0", "2")


def test_bad_micro_batch_requests_are_one_line_errors():
    model, x, y = two_layer()
    with pytest.raises(PostplaceError, match="pick m dividing 6"):
        trace(model, (x,), ce, targets=(y,), microbatches=4)
    with pytest.raises(PostplaceError, match="give the targets"):
        trace(model, (x,), lambda out: ce(out, y), microbatches=2)
    with pytest.raises(PostplaceError, match="share one batch"):
        trace(model, (x,), ce, targets=(y[:4],), microbatches=2)
    with pytest.raises(PostplaceError, match="colocation"):
        trace(model, (x,), ce, targets=(y,), microbatches=2, microbatch_colocation="layer")
    with pytest.raises(PostplaceError, match="whole number"):
        trace(model, (x,), ce, targets=(y,), microbatches=0)


def test_graph_files_keep_micro_batch_and_module_and_old_files_still_load(tmp_path):
    model, x, y = two_layer()
    g = trace(model, (x,), ce, targets=(y,), microbatches=2).graph
    g.save(tmp_path / "g.json")
    back = OpGraph.load(tmp_path / "g.json")
    assert back.microbatch.tolist() == g.microbatch.tolist() and back.module == g.module
    d = g.to_dict()
    del d["ops"]["microbatch"], d["ops"]["module"]  # a file written before these fields existed
    old = OpGraph.from_dict(d)
    assert old.microbatch.tolist() == [-1] * g.num_ops and old.module == ("",) * g.num_ops
    with pytest.raises(GraphError, match="'microbatch'"):
        OpGraph.build(["a"], microbatch=[-2])
    with pytest.raises(GraphError, match="'module' has 2 entries"):
        OpGraph.build(["a"], module=["x", "y"])
