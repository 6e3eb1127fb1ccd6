"""The profiled workload shipped in ``src/postplace/data/`` (README, "Where one GPU is not enough").

It must load, carry measured op times with their provenance, be memory-bound on the shipped cluster (no
single device holds the step, by the simulator), and give a feasible placement in a short ``place``.
"""

from __future__ import annotations

import importlib.resources
import time
from pathlib import Path

import numpy as np
import pytest

from postplace.cluster.cluster import load_cluster
from postplace.cost.model import RooflineCostModel
from postplace.graph.io import load_graph
from postplace.sim.simulate import Simulator

DATA = importlib.resources.files("postplace") / "data"
GRAPH = "resnet50_profiled.json"
CLUSTER = "epyc_k80x4_3gb.toml"
README = Path(__file__).resolve().parents[1] / "README.md"


@pytest.fixture(scope="module")
def graph():
    return load_graph(Path(str(DATA / GRAPH)))


@pytest.fixture(scope="module")
def cluster():
    return load_cluster(Path(str(DATA / CLUSTER)))


def test_files_are_package_data_and_small():
    names = {f.name for f in importlib.resources.files("postplace.data").iterdir()}
    assert {GRAPH, CLUSTER, "SOURCE.md"} <= names
    assert (DATA / GRAPH).is_file() and Path(str(DATA / GRAPH)).stat().st_size < 500_000
    source = (DATA / "SOURCE.md").read_text()
    assert "benchmarks/make_shipped_workload.py" in source and "torch 2." in source


def test_graph_carries_measured_times_with_provenance(graph):
    assert graph.num_ops > 1000
    assert (graph.metadata["zoo"]["name"], graph.metadata["zoo"]["size"]) == ("resnet50", "full")
    (m,) = graph.measured
    assert m.kind == "cpu" and m.key
    assert m.times.shape == (graph.num_ops,) and np.isfinite(m.times).all() and (m.times >= 0).all()
    assert m.times.sum() > 1.0  # a full ResNet-50 step on a CPU takes seconds
    assert "profile_cpu" in m.provenance and "torch" in m.provenance
    shipped = graph.metadata["shipped"]
    assert shipped["measured_device"]["model"] == m.key
    for field in ("command", "machine", "torch_version", "date"):
        assert shipped[field]
    assert shipped["command"].startswith("python benchmarks/make_shipped_workload.py")


def test_cluster_uses_the_measurement_for_its_cpu_only(graph, cluster):
    times = RooflineCostModel().op_times(graph, cluster)
    kinds = [d.kind for d in cluster.devices]
    assert kinds.count("cpu") == 1 and kinds.count("gpu") == 4
    for d, dev in enumerate(cluster.devices):
        if dev.kind == "cpu":
            assert dev.model == graph.measured[0].key
            assert times.measured[:, d].all() and "measured" in times.sources[d]
        else:
            assert not times.measured[:, d].any() and "roofline estimates" in times.sources[d]


def test_no_single_device_holds_the_step(graph, cluster):
    sim = Simulator(graph, cluster)
    D = cluster.num_devices
    res = sim.evaluate_ops(np.repeat(np.arange(D)[:, None], graph.num_ops, axis=1))
    assert not res.failed.any()
    assert res.oom.all(), f"a single device holds the step: peaks {res.peak_mem.max(axis=1)} of {cluster.capacity}"


def test_short_place_returns_a_feasible_spread_placement(graph, cluster):
    import postplace

    t0 = time.perf_counter()
    result = postplace.place(graph, cluster, budget=48, seed=0, report=False)
    wall = time.perf_counter() - t0
    assert wall < 30, f"place(budget=48) took {wall:.1f} s (1.5 s on the 2-core development machine)"
    s = result.summary
    assert not s["oom_devices"] and np.isfinite(result.step_time_s)
    used = {cluster.devices[d].name for d in np.unique(result.placement)}
    assert len(used) >= 2
    assert all(s["peak_memory_bytes"][n] <= s["capacity_bytes"][n] for n in s["capacity_bytes"])
    check = Simulator(graph, cluster).evaluate_ops(result.placement[None, :])
    assert check.feasible[0] and check.step_time[0] == pytest.approx(result.step_time_s)


def test_readme_example_uses_the_shipped_files():
    section = README.read_text().split("## Where one GPU is not enough", 1)[1].split("\n## ", 1)[0]
    assert f"src/postplace/data/{GRAPH}" in section and f"src/postplace/data/{CLUSTER}" in section
    assert "../shared" not in section
