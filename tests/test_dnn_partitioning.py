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
    return {"id": i, "name": f"n{i}", "fpgaLatency": fpga, "cpuLatency": cpu if cpu is not None else 10 * fpga,
            "size": kw.pop("size", 1.0), "isBackwardNode": kw.pop("bw", 0), **kw}


def write(tmp_path, d, name="w.json"):
    p = tmp_path / name
    p.write_text(json.dumps(d))
    return p


def test_ids_from_one_units_slots_and_extra_keys(tmp_path):
    d = workload(
        [node(1, 2.0, layerId=7), node(2, 1.0, supportedOnFpga=0), node(3, 0.5, colorClass=4),
         node(4, 0.5, colorClass=4, bw=True)],
        [{"sourceId": 1, "destId": 2, "size": 100.0, "cost": 99},
         {"sourceId": 1, "destId": 3, "size": 100.0, "cost": 0},
         {"sourceId": 1, "destId": 4, "size": 7.0, "cost": 0}],
    )  # fmt: skip
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
    d = workload([node(0, 1.0, colorClass=1), node(1, 1.0, colorClass=2),
                  node(2, 1.0, colorClass=2, bw=1), node(3, 1.0, colorClass=1, bw=1)],
                 [{"sourceId": 0, "destId": 1, "size": 1.0}, {"sourceId": 2, "destId": 3, "size": 1.0}])  # fmt: skip
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
