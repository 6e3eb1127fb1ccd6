import json

import numpy as np
import pytest

from postplace.errors import PostplaceError
from postplace.graph import GraphError, Measurement, OpGraph, load_graph


def small():
    return OpGraph.build(
        ["x", "y", "z"],
        [(0, 1, 8.0), (0, 2, 8.0), (1, 2, 4.0, 1)],
        op_types=["conv", "relu", "add"],
        flops=[10.0, 2.0, 3.0],
        bytes_accessed=[1.0, 2.0, 3.0],
        output_bytes=[8.0, 4.0, 2.0],
        persistent_bytes=[5.0, 0.0, 0.0],
        colocation=[0, 0, -1],
        phase=["forward", "backward", "update"],
        allowed_kinds=[["cpu", "gpu"], ["cpu", "gpu"], "cpu"],
        inplace=[False, True, False],
        measured=[Measurement("K80", "gpu", np.array([1e-3, np.nan, 2e-3]), "test")],
        name="small",
        metadata={"k": 1},
    )


def test_save_load_round_trip_keeps_every_field(tmp_path):
    g = small()
    g.save(tmp_path / "g.json")
    h = OpGraph.load(tmp_path / "g.json")
    assert h.names == g.names and h.op_types == g.op_types and h.memory_mode == g.memory_mode
    for f in (
        "flops",
        "bytes_accessed",
        "output_bytes",
        "persistent_bytes",
        "colocation",
        "phase",
        "allowed_kinds",
        "inplace",
        "edge_src",
        "edge_dst",
        "edge_slot",
        "edge_bytes",
    ):
        np.testing.assert_array_equal(getattr(h, f), getattr(g, f))
    np.testing.assert_array_equal(h.measured[0].times, g.measured[0].times)
    assert h.measured[0].provenance == "test" and h.metadata == {"k": 1}
    assert json.loads((tmp_path / "g.json").read_text())["version"] == 1


def test_csr_views():
    g = small()
    assert g.out_ptr.tolist() == [0, 2, 3, 3]
    assert [g.edge_src[e] for e in g.in_edges[g.in_ptr[2] : g.in_ptr[3]]] == [0, 1]
    assert [s.tolist() for s in g.colocation_sets] == [[0, 1]]


def test_a_cycle_is_named():
    with pytest.raises(GraphError, match=r"cycle: b -> c -> b"):
        OpGraph.build(["a", "b", "c"], [(0, 1), (1, 2), (2, 1)])


def test_edges_against_program_order_are_refused():
    with pytest.raises(GraphError, match="not in topological order"):
        OpGraph.build(["a", "b"], [(1, 0)])


@pytest.mark.parametrize("field", ["flops", "bytes_accessed", "output_bytes", "persistent_bytes"])
@pytest.mark.parametrize("value", [-1.0, float("nan"), float("inf")])
def test_bad_costs_name_the_op_and_field(field, value):
    values = [0.0, value]
    with pytest.raises(GraphError, match=rf"op 'b' field '{field}'"):
        OpGraph.build(["a", "b"], [(0, 1)], **{field: values})


def test_bad_edge_bytes_and_dangling_edges():
    with pytest.raises(GraphError, match="edges.bytes"):
        OpGraph.build(["a", "b"], [(0, 1, -2.0)])
    with pytest.raises(GraphError, match="does not exist"):
        OpGraph.build(["a", "b"], [(0, 5)])


def test_duplicate_names_and_impossible_colocation():
    with pytest.raises(GraphError, match="duplicate op name 'a'"):
        OpGraph.build(["a", "a"])
    with pytest.raises(GraphError, match="no common device kind"):
        OpGraph.build(["a", "b"], colocation=[3, 3], allowed_kinds=["cpu", "gpu"])


def test_a_slot_carries_one_tensor():
    with pytest.raises(GraphError, match="slot 0"):
        OpGraph.build(["a", "b", "c"], [(0, 1, 4.0), (0, 2, 8.0)])


def test_arrays_are_read_only():
    with pytest.raises(ValueError):
        small().flops[0] = 1.0


def test_load_errors_are_one_line(tmp_path):
    p = tmp_path / "t.json"
    small().save(p)
    p.write_text(p.read_text()[:100])
    with pytest.raises(PostplaceError, match="truncated"):
        load_graph(p)
    d = small().to_dict()
    del d["ops"]["flops"]
    p.write_text(json.dumps(d))
    with pytest.raises(PostplaceError, match=r"missing field 'ops.flops'"):
        load_graph(p)
    p.write_text('{"hello": 1}')
    with pytest.raises(PostplaceError, match="not a graph postplace can read"):
        load_graph(p)
