import numpy as np
import pytest

from postplace.cluster import Cluster, load_cluster, preset_names
from postplace.cost import RooflineCostModel
from postplace.errors import PostplaceError
from postplace.graph import Measurement, OpGraph

TOML = """
name = "t"
[[device]]
name = "cpu"
kind = "cpu"
model = "X"
peak_flops = 1e9
memory_bandwidth = 1e8
memory = 1e9
reserve = 1e8
launch_overhead = 1e-3
[[device]]
names = ["gpu0", "gpu1"]
kind = "gpu"
model = "G"
peak_flops = 1e10
memory_bandwidth = 1e9
memory = 2e9
[[switch]]
name = "sw"
[[link]]
a = "cpu"
b = "sw"
bandwidth = 4e9
latency = 1e-6
[[link]]
a = "gpu0"
b = "sw"
bandwidth = 1e9
latency = 2e-6
[[link]]
a = "gpu1"
b = "sw"
bandwidth = 2e9
latency = 3e-6
"""


def test_toml_cluster_devices_capacity_and_routes():
    c = Cluster.from_toml_text(TOML)
    assert c.device_names == ("cpu", "gpu0", "gpu1")
    assert c.capacity.tolist() == [1e9 - 1e8, 2e9, 2e9]
    assert c.route(1, 2) == ["gpu0", "sw", "gpu1"]
    assert c.bandwidth[1, 2] == 1e9  # the slower of the two links on the route
    assert c.latency[1, 2] == pytest.approx(2e-6 + 3e-6)
    assert c.transfer_time(1e9, 1, 2) == pytest.approx(5e-6 + 1.0)
    assert c.transfer_time(1e9, 1, 1) == 0.0
    D = 3
    held = c.route_resources[c.route_ptr[1 * D + 2] : c.route_ptr[1 * D + 3]].tolist()
    assert held == [1, D + 2, 2 * D + 2 * 1 + 0, 2 * D + 2 * 2 + 1]  # egress, ingress, link1 up, link2 down


def test_routes_prefer_the_widest_path():
    text = (
        TOML + '[[switch]]\nname = "nv"\n[[link]]\na = "gpu0"\nb = "nv"\nbandwidth = 5e10\n'
        '[[link]]\na = "gpu1"\nb = "nv"\nbandwidth = 5e10\n'
    )
    c = Cluster.from_toml_text(text)
    assert c.route(1, 2) == ["gpu0", "nv", "gpu1"] and c.bandwidth[1, 2] == 5e10


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (TOML.replace('[[link]]\na = "gpu1"', '[[link]]\na = "gpu9"'), "names 'gpu9'"),
        (TOML.replace("peak_flops = 1e10", ""), "has no field 'peak_flops'"),
        (TOML.replace('kind = "cpu"', 'kind = "tpu"'), "kind 'tpu'"),
        (TOML.split("[[link]]")[0], "no route from cpu to gpu0"),
        ("name = [", "not valid TOML"),
    ],
)
def test_bad_cluster_files(text, message):
    with pytest.raises(PostplaceError, match=message):
        Cluster.from_toml_text(text)


def test_presets_load_and_name_devices():
    assert {"k80x2", "k80x4", "dgx8", "h100"} <= set(preset_names())
    k = load_cluster("k80x4")
    assert k.device_names == ("cpu", "gpu0", "gpu1", "gpu2", "gpu3")
    assert k.route(1, 2) == ["gpu0", "board0", "gpu1"]  # same K80 board: through its PCIe switch
    assert k.route(1, 3) == ["gpu0", "board0", "host", "board1", "gpu2"]
    assert k.devices[1].peak_flops == 2.8e12 and k.devices[1].memory_bandwidth == 2.4e11
    with pytest.raises(PostplaceError, match="unknown cluster preset 'nope'"):
        load_cluster("nope")


def test_cost_model_prefers_model_then_kind_measurements_and_never_adds_overhead_to_them():
    c = Cluster.from_toml_text(TOML)
    g = OpGraph.build(
        ["a", "b", "c"],
        flops=[1e9, 1e9, 0.0],
        bytes_accessed=[0.0, 1e9, 0.0],
        measured=[
            Measurement("G", "gpu", np.array([0.5, np.nan, np.nan]), "model G"),
            Measurement("gpu", "gpu", np.array([0.7, 0.8, np.nan]), "any gpu"),
        ],
    )
    t = RooflineCostModel().op_times(g, c)
    assert t.table[0, 1] == 0.5  # exact model first, no overhead
    assert t.table[1, 1] == 0.8  # then the kind-level measurement
    assert t.table[2, 1] == 0.0  # roofline (zero work) + zero overhead
    assert t.table[0, 0] == pytest.approx(max(1e9 / 1e9, 0.0) + 1e-3)  # cpu: roofline + overhead
    assert t.table[1, 0] == pytest.approx(max(1e9 / 1e9, 1e9 / 1e8) + 1e-3)  # memory bound
    assert t.measured[:, 1].tolist() == [True, True, False]
    assert "1 measured (G: model G)" in t.sources[1] and "1 roofline" in t.sources[1]


def test_other_models_are_used_only_when_asked_and_say_so():
    c = Cluster.from_toml_text(TOML)
    g = OpGraph.build(["a"], flops=[1e10], measured=[Measurement("V100", "gpu", np.array([0.25]), "lab")])
    assert RooflineCostModel().op_times(g, c).table[0, 1] == pytest.approx(1.0)
    borrowed = RooflineCostModel(allow_other_models=True).op_times(g, c)
    assert borrowed.table[0, 1] == 0.25 and "borrowed from model V100" in borrowed.sources[1]


def test_ops_not_allowed_on_a_kind_cost_infinity():
    c = Cluster.from_toml_text(TOML)
    g = OpGraph.build(["a"], allowed_kinds=["cpu"])
    assert np.isinf(RooflineCostModel().op_times(g, c).table[0, 1:]).all()
