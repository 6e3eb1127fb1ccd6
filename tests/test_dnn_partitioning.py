import json
import math

import numpy as np
import pytest

from postplace.cluster import load_cluster
from postplace.cluster.placement import single_device
from postplace.errors import PostplaceError
from postplace.graph import load_graph
from postplace.graph.dnn_partitioning import import_expert_split
from postplace.sim import Simulator


def workload(nodes, edges, **extra):
    return {"maxSizePerFPGA": 1e9, "maxFPGAs": 2, "maxCPUs": 1, "nodes": nodes, "edges": edges, **extra}


def node(i, fpga, cpu=None, **kw):
    return {
        "id": i,
        "name": f"n{i}",
        "fpgaLatency": fpga,
        "cpuLatency": cpu if cpu is not None else 10 * fpga,
        "size": kw.pop("size", 1.0),
        "isBackwardNode": kw.pop("bw", 0),
        **kw,
    }


def write(tmp_path, d, name="w.json"):
    p = tmp_path / name
    p.write_text(json.dumps(d))
    return p


def test_ids_from_one_units_slots_and_extra_keys(tmp_path):
    d = workload(
        [
            node(1, 2.0, layerId=7),
            node(2, 1.0, supportedOnFpga=0),
            node(3, 0.5, colorClass=4),
            node(4, 0.5, colorClass=4, bw=True),
        ],
        [
            {"sourceId": 1, "destId": 2, "size": 100.0, "cost": 99},
            {"sourceId": 1, "destId": 3, "size": 100.0, "cost": 0},
            {"sourceId": 1, "destId": 4, "size": 7.0, "cost": 0},
        ],
    )
    g = load_graph(write(tmp_path, d))
    assert g.names == ("n1", "n2", "n3", "n4") and g.memory_mode == "static"
    gpu, cpu = g.measured
    assert (gpu.key, cpu.key) == ("gpu", "cpu")
    np.testing.assert_allclose(gpu.times, [2e-3, 1e-3, 0.5e-3, 0.5e-3])
    assert "synthetic: exactly 10x" in cpu.provenance
    assert g.allowed_kinds.tolist() == [3, 1, 3, 3]  # supportedOnFpga 0 -> cpu only
    assert g.colocation[2] == g.colocation[3] >= 0 and g.colocation[0] == -1
    assert g.edge_slot.tolist() == [0, 0, 1]  # two distinct output sizes -> two slots
    assert g.output_bytes[0] == 100.0 + 7.0
    assert g.phase.tolist() == [0, 0, 0, 1]
    assert g.metadata["added_dependencies"] == 0  # it has a forward -> backward edge already


def test_layer_graphs_get_forward_to_backward_dependencies(tmp_path):
    d = workload(
        [
            node(0, 1.0, colorClass=1),
            node(1, 1.0, colorClass=2),
            node(2, 1.0, colorClass=2, bw=1),
            node(3, 1.0, colorClass=1, bw=1),
        ],
        [{"sourceId": 0, "destId": 1, "size": 1.0}, {"sourceId": 2, "destId": 3, "size": 1.0}],
    )
    g = load_graph(write(tmp_path, d))
    assert g.metadata["added_dependencies"] == 2
    c = load_cluster("k80x2")
    s = Simulator(g, c).schedule(single_device(g, c, "gpu0"))
    # backward n2 cannot start before forward n1 (same colorClass) ends
    assert s.op_start[g.index("n2")] >= s.op_end[g.index("n1")]


def test_cpu_only_op_runs_on_the_cpu_in_single_gpu_placement(tmp_path):
    d = workload([node(0, 1.0), node(1, 1.0, supportedOnFpga=False)], [{"sourceId": 0, "destId": 1, "size": 8.0}])
    g = load_graph(write(tmp_path, d))
    c = load_cluster("k80x2")
    assert single_device(g, c, "gpu1").tolist() == [2, 0]


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda d: d["nodes"][0].pop("fpgaLatency"), r"nodes\[0\] has no field 'fpgaLatency'"),
        (lambda d: d["nodes"][0].update(cpuLatency=-1), r"nodes\[0\] field 'cpuLatency' is -1"),
        (lambda d: d["edges"][0].update(destId=77), r"edges\[0\] field 'destId' is 77, which no node has"),
        (lambda d: d["nodes"][1].update(id=0), "repeats id 0"),
        (lambda d: d["edges"].append({"sourceId": 1, "destId": 0, "size": 1.0}), "cycle: n0 -> n1 -> n0"),
    ],
)
def test_bad_workloads_get_one_line_errors(tmp_path, mutate, message):
    d = workload([node(0, 1.0), node(1, 1.0)], [{"sourceId": 0, "destId": 1, "size": 8.0}])
    mutate(d)
    with pytest.raises(PostplaceError, match=message):
        load_graph(write(tmp_path, d))


@pytest.mark.parametrize("name", ["resnet50_training", "bert_l-3_training", "gnmt_training"])
def test_single_device_step_times_on_the_shared_workloads_equal_the_files_sums(shared_data, name):
    raw = json.loads((shared_data / f"{name}.json").read_text())
    g = load_graph(shared_data / f"{name}.json")
    assert g.num_ops == len(raw["nodes"])
    c = load_cluster("k80x4")
    sim = Simulator(g, c)
    r = sim.evaluate(np.stack([single_device(g, c, "gpu0"), single_device(g, c, "cpu")]))
    assert r.step_time[0] == pytest.approx(math.fsum(n["fpgaLatency"] for n in raw["nodes"]) * 1e-3, rel=1e-12)
    assert r.step_time[1] == pytest.approx(math.fsum(n["cpuLatency"] for n in raw["nodes"]) * 1e-3, rel=1e-12)
    assert r.peak_mem[0, 1] == pytest.approx(math.fsum(n["size"] for n in raw["nodes"]))
    assert not r.oom.any()
    assert sim.lower_bound <= r.step_time.min()


def test_gnmt_expert_split_reads_and_respects_colocation(shared_data):
    from postplace.cluster.placement import from_mapping

    g = load_graph(shared_data / "gnmt_training.json")
    split = import_expert_split(json.loads((shared_data / "gnmt_training_expert.json").read_text()), g)
    assert set(split.values()) <= {"cpu", *(f"gpu{k}" for k in range(6))}
    c = load_cluster("dgx8")
    dev = from_mapping(g, c, split)
    assert len(set(dev.tolist())) == 6
    assert np.isfinite(Simulator(g, c).evaluate(dev[None]).step_time[0])


# ---------------------------------------------------------------- backward orientation (issue 15)
def two_layer(backward_edge=(4, 3)):
    """x -> y forward (1, 2 ms), their gradients yg (3 ms) and xg (4 ms); the file writes xg -> yg (mirrored)."""
    nodes = [
        node(1, 1.0, colorClass=1),
        node(2, 2.0, colorClass=2),
        node(3, 3.0, colorClass=2, bw=True),
        node(4, 4.0, colorClass=1, bw=1),
    ]
    for n, name in zip(nodes, ("x", "y", "yg", "xg"), strict=True):
        n["name"] = name
    s, t = backward_edge
    return workload(nodes, [{"sourceId": 1, "destId": 2, "size": 8.0}, {"sourceId": s, "destId": t, "size": 8.0}])


def edge_set(g):
    return {(g.names[s], g.names[t], b) for s, t, b in zip(g.edge_src, g.edge_dst, g.edge_bytes, strict=True)}


def test_golden_two_layer_mirrored_graph_is_imported_backward_first(tmp_path):
    from postplace.sim.bounds import critical_path

    g = load_graph(write(tmp_path, two_layer()))
    # the file's xg -> yg is reversed; each backward node depends on its colour class's forward node
    assert edge_set(g) == {("x", "y", 8.0), ("yg", "xg", 8.0), ("x", "xg", 0.0), ("y", "yg", 0.0)}
    meta = g.metadata
    assert (meta["backward_edges"], meta["reversed_edges"], meta["added_dependencies"]) == ("reversed", 1, 2)
    c = load_cluster("k80x4")
    sim = Simulator(g, c)
    ms = 1e-3
    assert critical_path(sim.problem) == pytest.approx((1 + 2 + 3 + 4) * ms)  # x, y, yg, xg in sequence
    assert sim.lower_bound == pytest.approx((1 + 2 + 3 + 4) * ms)
    one = sim.evaluate(single_device(g, c, "gpu0")[None]).step_time[0]
    assert one == pytest.approx((1 + 2 + 3 + 4) * ms)
    # layer 1 on gpu0, layer 2 on gpu1 (one K80 board): two 8-byte hops gpu -> board -> gpu (5 us + 5 us
    # latency, 15.75 GB/s), x -> y after x, yg -> xg after yg; nothing overlaps
    c2 = load_cluster("k80x2")
    split = np.array([1 if n in ("x", "xg") else 2 for n in g.names])
    hop = 5e-6 + 5e-6 + 8 / 1.575e10
    step = Simulator(g, c2).evaluate(split[None]).step_time[0]
    assert step == pytest.approx((1 + 2 + 3 + 4) * ms + 2 * hop, rel=1e-12)


def test_a_layer_graph_written_the_right_way_round_is_kept_and_imports_the_same(tmp_path):
    mirrored = load_graph(write(tmp_path, two_layer(), "m.json"))
    oriented = load_graph(write(tmp_path, two_layer(backward_edge=(3, 4)), "o.json"))
    assert oriented.metadata["backward_edges"] == "as given" and oriented.metadata["reversed_edges"] == 0
    assert edge_set(oriented) == edge_set(mirrored)


def three_layer(backward_edges):
    """x -> y -> z forward (ids 1-3, classes 1-3) and their gradients (ids 11-13, same classes)."""
    nodes = [node(i, 1.0, colorClass=i) for i in (1, 2, 3)] + [node(10 + i, 1.0, colorClass=i, bw=1) for i in (1, 2, 3)]
    edges = [{"sourceId": 1, "destId": 2, "size": 1.0}, {"sourceId": 2, "destId": 3, "size": 1.0}]
    return workload(nodes, edges + [{"sourceId": s, "destId": t, "size": 1.0} for s, t in backward_edges])


@pytest.mark.parametrize(
    ("backward_edges", "message"),
    [
        ([(11, 12), (13, 12)], r"n11 -> n12 mirrors a forward edge but n13 -> n12 runs against the forward edges"),
        ([(11, 12), (12, 13), (11, 13)], r"n11 -> n13 mirrors no forward edge between its colour classes"),
    ],
)
def test_a_backward_pass_neither_mirrored_nor_oriented_is_refused(tmp_path, backward_edges, message):
    with pytest.raises(PostplaceError, match=r"neither mirrored nor consistently oriented: .*" + message):
        load_graph(write(tmp_path, three_layer(backward_edges)))


def test_mirrored_three_layer_chain_is_reversed_and_oriented_one_kept(tmp_path):
    g = load_graph(write(tmp_path, three_layer([(11, 12), (12, 13)]), "m.json"))
    assert {(s, t) for s, t, b in edge_set(g) if b} == {("n1", "n2"), ("n2", "n3"), ("n13", "n12"), ("n12", "n11")}
    kept = load_graph(write(tmp_path, three_layer([(13, 12), (12, 11)]), "o.json"))
    assert kept.metadata["backward_edges"] == "as given" and edge_set(kept) == edge_set(g)


def test_backward_to_forward_edge_without_forward_to_backward_edges_is_refused(tmp_path):
    d = three_layer([(12, 11)])
    d["edges"].append({"sourceId": 13, "destId": 3, "size": 1.0})
    with pytest.raises(PostplaceError, match="n13 -> n3 goes from a backward node to a forward one"):
        load_graph(write(tmp_path, d))


def file_edges(raw):
    return sorted((e["sourceId"], e["destId"], e["size"]) for e in raw["edges"])


def graph_edges(g, zero_bytes=True):
    ids = g.metadata["original_ids"]
    return sorted(
        (ids[s], ids[t], b) for s, t, b in zip(g.edge_src, g.edge_dst, g.edge_bytes, strict=True) if zero_bytes or b
    )


def test_shared_gnmt_is_reversed_and_has_almost_no_room_for_model_parallelism(shared_data):
    raw = json.loads((shared_data / "gnmt_training.json").read_text())
    g = load_graph(shared_data / "gnmt_training.json")
    assert (g.metadata["backward_edges"], g.metadata["reversed_edges"], g.metadata["added_dependencies"]) == (
        "reversed",
        122,
        96,
    )
    bw = {n["id"] for n in raw["nodes"] if n["isBackwardNode"]}
    expected = [(t, s, b) if s in bw else (s, t, b) for s, t, b in file_edges(raw)]
    color = {n["id"]: n["colorClass"] for n in raw["nodes"]}
    expected += [(f, b, 0.0) for f in color if f not in bw for b in bw if color[b] == color[f]]
    assert graph_edges(g) == sorted(expected)
    c = load_cluster("k80x4")
    sim = Simulator(g, c)
    one = sim.evaluate(single_device(g, c, "gpu0")[None]).step_time[0]
    assert sim.lower_bound >= 0.99 * one
    assert sim.lower_bound <= one


def test_gnmt_variants_follow_the_rule(shared_data, tmp_path):
    raw = json.loads((shared_data / "gnmt_training.json").read_text())
    bw = {n["id"] for n in raw["nodes"] if n["isBackwardNode"]}
    mirrored = load_graph(shared_data / "gnmt_training.json")
    # written the right way round: kept, and the same graph
    oriented = json.loads(json.dumps(raw))
    for e in oriented["edges"]:
        if e["sourceId"] in bw:
            e["sourceId"], e["destId"] = e["destId"], e["sourceId"]
    g = load_graph(write(tmp_path, oriented, "oriented.json"))
    assert g.metadata["backward_edges"] == "as given" and graph_edges(g) == graph_edges(mirrored)
    # one backward edge flipped: neither mirrored nor oriented
    k = next(k for k, e in enumerate(raw["edges"]) if e["sourceId"] in bw and e["size"] > 0)
    mixed = json.loads(json.dumps(raw))
    mixed["edges"][k]["sourceId"], mixed["edges"][k]["destId"] = raw["edges"][k]["destId"], raw["edges"][k]["sourceId"]
    with pytest.raises(PostplaceError, match="neither mirrored nor consistently oriented"):
        load_graph(write(tmp_path, mixed, "mixed.json"))
    # its forward half alone (an inference graph): nothing to orient, edges as in the file
    fwd = dict(
        raw,
        nodes=[n for n in raw["nodes"] if n["id"] not in bw],
        edges=[e for e in raw["edges"] if e["sourceId"] not in bw],
    )
    g = load_graph(write(tmp_path, fwd, "inference.json"))
    assert g.metadata["backward_edges"] == "none" and graph_edges(g) == file_edges(fwd)


@pytest.mark.parametrize("name", ["resnet50_training", "bert_l-3_training"])
def test_operator_graphs_are_imported_exactly_as_written(shared_data, name):
    raw = json.loads((shared_data / f"{name}.json").read_text())
    g = load_graph(shared_data / f"{name}.json")
    assert g.metadata["backward_edges"] == "explicit" and g.metadata["added_dependencies"] == 0
    assert graph_edges(g) == file_edges(raw)


def test_the_files_own_machine_is_kept(shared_data):
    g = load_graph(shared_data / "gnmt_training.json")
    m = g.metadata
    assert (m["max_size_per_accelerator"], m["max_accelerators"], m["max_cpus"]) == (17185374208.0, 6, 1)


# ---------------------------------------------------------------- malformed fields (issue 10 item 9)
@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (
            lambda d: d["nodes"][1].update(isBackwardNode="false"),
            r"nodes\[1\] field 'isBackwardNode' is 'false' \(node 'n1', id 1\); it must be true, false, 0 or 1",
        ),
        (lambda d: d["nodes"][0].update(isBackwardNode=2), r"nodes\[0\] field 'isBackwardNode' is 2"),
        (lambda d: d["nodes"][0].update(supportedOnFpga="yes"), r"nodes\[0\] field 'supportedOnFpga' is 'yes'"),
        (
            lambda d: d["nodes"][0].update(fpgaLatency=float("nan")),
            r"nodes\[0\] field 'fpgaLatency' is nan \(node 'n0', id 0\); it must be a finite non-negative",
        ),
        (lambda d: d["nodes"][1].update(size=float("inf")), r"nodes\[1\] field 'size' is inf"),
        (lambda d: d["nodes"][1].update(size=-4.0), r"nodes\[1\] field 'size' is -4.0"),
        (lambda d: d["nodes"][1].update(cpuLatency="3"), r"nodes\[1\] field 'cpuLatency' is '3' .*must be a number"),
        (lambda d: d["nodes"][1].pop("id"), r"nodes\[1\] has no field 'id'"),
        (lambda d: d["nodes"][1].update(id=float("nan")), r"nodes\[1\] field 'id' is nan"),
        (lambda d: d["nodes"][1].update(id=1.5), r"nodes\[1\] field 'id' is 1.5; it must be an integer"),
        (lambda d: d["nodes"][1].update(id=-1), r"nodes\[1\] field 'id' is -1"),
        (lambda d: d["nodes"][1].update(name=7), r"nodes\[1\] \(id 1\) field 'name' is 7"),
        (lambda d: d["nodes"][1].update(colorClass="a"), r"nodes\[1\] field 'colorClass' is 'a'"),
        (lambda d: d["edges"][0].update(size=float("nan")), r"edges\[0\] field 'size' is nan \(edge 0 -> 1\)"),
        (lambda d: d["edges"][0].update(size=-1), r"edges\[0\] field 'size' is -1 \(edge 0 -> 1\)"),
        (lambda d: d["edges"][0].pop("sourceId"), r"edges\[0\] has no field 'sourceId'"),
        (lambda d: d["edges"][0].update(sourceId=True), r"edges\[0\] field 'sourceId' is True"),
        (lambda d: d["edges"][0].update(sourceId=9), r"edges\[0\] field 'sourceId' is 9, which no node has"),
        (lambda d: d.update(maxFPGAs="6"), r"field 'maxFPGAs' is '6'"),
        (lambda d: d.update(maxSizePerFPGA=0), r"field 'maxSizePerFPGA' is 0"),
    ],
)
def test_malformed_fields_are_one_error_naming_node_or_edge_and_field(mutate, message):
    from postplace.graph.dnn_partitioning import import_workload

    d = workload([node(0, 1.0), node(1, 1.0)], [{"sourceId": 0, "destId": 1, "size": 8.0}])
    mutate(d)
    with pytest.raises(PostplaceError, match=message):
        import_workload(d, source="w.json")


def test_booleans_accept_true_false_0_1(tmp_path):
    d = workload(
        [
            node(0, 1.0, supportedOnFpga=True, colorClass=1),
            node(1, 1.0, supportedOnFpga=0, bw=False),
            node(2, 1.0, bw=1, colorClass=1),
        ],
        [{"sourceId": 0, "destId": 1, "size": 8.0}],
    )
    g = load_graph(write(tmp_path, d))
    assert g.phase.tolist() == [0, 0, 1] and g.allowed_kinds.tolist() == [3, 1, 3]
