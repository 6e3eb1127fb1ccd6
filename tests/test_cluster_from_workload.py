"""A cluster built from a workload file's own machine (``--cluster workload:PRESET``, issue 15)."""

import json

import numpy as np
import pytest

from postplace.cluster import load_cluster
from postplace.cluster.from_workload import cluster_from_workload, describe_machine, resolve_cluster
from postplace.cluster.placement import single_device
from postplace.errors import PostplaceError
from postplace.graph import OpGraph, load_graph
from postplace.sim import Simulator
from tests.clihelp import run_cli


def workload_file(tmp_path, **machine):
    d = {
        **machine,
        "nodes": [{"id": 0, "name": "a", "fpgaLatency": 2.0, "cpuLatency": 20.0, "size": 1e9, "isBackwardNode": 0}],
        "edges": [],
    }
    p = tmp_path / "w.json"
    p.write_text(json.dumps(d))
    return load_graph(p)


def test_three_accelerators_from_k80x2_get_a_second_board(tmp_path):
    g = workload_file(tmp_path, maxSizePerFPGA=5e9, maxFPGAs=3, maxCPUs=1)
    c = resolve_cluster("workload:k80x2", g)
    base = load_cluster("k80x2")
    assert c.device_names == ("cpu", "gpu0", "gpu1", "gpu2") and c.name == "workload:k80x2"
    assert [d.memory for d in c.devices] == [base.devices[0].memory, 5e9, 5e9, 5e9]  # the file's size, no reserve
    assert {d.model for d in c.devices[1:]} == {"K80"}
    # gpu0 - gpu1 as on the preset's board: 5 us + 5 us; gpu2 sits on a copy of the board behind the host bridge
    assert c.route(1, 2) == ["gpu0", "board0", "gpu1"] and c.latency[1, 2] == pytest.approx(5e-6 + 5e-6)
    assert c.route(1, 3) == ["gpu0", "board0", "host", "board0-copy1", "gpu2"]
    assert c.latency[1, 3] == pytest.approx(5e-6 + 1e-6 + 1e-6 + 5e-6)
    assert c.bandwidth[1, 3] == 1.575e10


def test_fewer_accelerators_than_the_preset_drop_the_unused_board(tmp_path):
    c = cluster_from_workload(workload_file(tmp_path, maxFPGAs=1, maxCPUs=1), load_cluster("k80x4"))
    assert c.device_names == ("cpu", "gpu0") and c.switches == ("host", "board0")
    assert c.devices[1].memory == load_cluster("k80x4").devices[1].memory  # no maxSizePerFPGA: the preset's


def test_the_built_cluster_simulates_with_the_files_latencies(tmp_path):
    g = workload_file(tmp_path, maxSizePerFPGA=5e8, maxFPGAs=6, maxCPUs=1)
    c = resolve_cluster("workload:dgx8", g)
    assert c.num_devices == 7 and c.route(1, 6) == ["gpu0", "nvswitch", "gpu5"]
    r = Simulator(g, c).evaluate(np.stack([single_device(g, c, "gpu5"), single_device(g, c, "cpu")]))
    assert r.step_time.tolist() == pytest.approx([2e-3, 20e-3])
    assert r.oom.tolist() == [True, False]  # 1 GB footprint > the file's 0.5 GB per accelerator


def test_info_lines_say_where_the_cluster_differs_from_the_file(shared_data):
    g = load_graph(shared_data / "gnmt_training.json")
    lines = describe_machine(g, load_cluster("k80x4"))
    assert lines[0].startswith("the file's own machine: 6 accelerators of 17.19 GB, 1 CPU")
    assert lines[1] == "cluster k80x4: 4 GPUs of 11.50 GB, 1 CPU"
    assert "GPU memory and accelerator count differ" in lines[2]
    assert len(describe_machine(g, resolve_cluster("workload:k80x4", g))) == 2  # the same machine: no difference


def test_a_graph_without_a_machine_is_refused():
    g = OpGraph.build(["a"], [], flops=[1.0], bytes_accessed=[1.0], output_bytes=[1.0], name="plain")
    with pytest.raises(PostplaceError, match="says nothing about its machine"):
        resolve_cluster("workload:k80x4", g)
    with pytest.raises(PostplaceError, match="unknown cluster preset 'nope'"):
        resolve_cluster("workload:nope", g)


def test_cli_info_on_gnmt_prints_orientation_and_the_files_machine(shared_data):
    path = str(shared_data / "gnmt_training.json")
    r = run_cli("info", path, "--cluster", "workload:k80x4")
    assert r.returncode == 0, r.stderr
    assert "backward edges reversed: layer graph" in r.stdout
    assert "the file's own machine: 6 accelerators of 17.19 GB, 1 CPU" in r.stdout
    assert "cluster workload:k80x4: 6 GPUs of 17.19 GB, 1 CPU" in r.stdout
