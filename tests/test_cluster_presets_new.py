"""The dgx8x2 (two H100 nodes over InfiniBand) and mixed (A100 + V100 on one host) presets."""

import pytest

from postplace.cluster import load_cluster, preset_names
from postplace.cost import RooflineCostModel
from postplace.graph import OpGraph


def _idx(c, name):
    return c.device_index(name)


def test_new_presets_are_listed_and_load():
    assert {"dgx8x2", "mixed"} <= set(preset_names())
    for name in ("dgx8x2", "mixed"):
        assert load_cluster(name).name == name


def test_dgx8x2_devices_and_capacities():
    c = load_cluster("dgx8x2")
    assert c.device_names == ("cpu",) + tuple(f"gpu{i}" for i in range(16))
    assert [d.kind for d in c.devices] == ["cpu"] + ["gpu"] * 16
    assert {d.model for d in c.devices[1:]} == {"H100"}
    assert c.capacity[0] == pytest.approx(2.048e12 - 8e9)  # 2 TB minus the OS reserve
    assert c.capacity[1:].tolist() == [80e9 - 1e9] * 16  # 80 GB HBM3 minus the CUDA reserve
    assert all(d.peak_flops == 6.7e13 and d.memory_bandwidth == 3.35e12 for d in c.devices[1:])


def test_dgx8x2_routes_nvswitch_inside_a_node_and_infiniband_between():
    c = load_cluster("dgx8x2")
    g0, g1, g7, g8, g15 = (_idx(c, f"gpu{i}") for i in (0, 1, 7, 8, 15))
    assert c.route(g0, g1) == ["gpu0", "nvswitch0", "gpu1"]
    assert c.route(g8, g15) == ["gpu8", "nvswitch1", "gpu15"]
    assert c.route(g0, g8) == ["gpu0", "ib", "gpu8"]
    assert c.route(g15, g7) == ["gpu15", "ib", "gpu7"]
    # by hand from the file: NVLink 2 x 2 us + 1 GB / 450 GB/s; InfiniBand 2 x 2.5 us + 1 GB / 50 GB/s
    nv = 2 * 2e-6 + 1e9 / 4.5e11
    ib = 2 * 2.5e-6 + 1e9 / 5e10
    assert c.transfer_time(1e9, g0, g1) == pytest.approx(nv)
    assert c.transfer_time(1e9, g0, g8) == pytest.approx(ib)
    assert c.transfer_time(1e9, g0, g8) >= 5 * c.transfer_time(1e9, g0, g1)
    # every cross-node pair is capped by the 50 GB/s NIC, every same-node pair gets NVSwitch's 450 GB/s
    gpus = range(1, 17)
    for a in gpus:
        for b in gpus:
            if a != b:
                same = (a - 1) // 8 == (b - 1) // 8
                assert c.bandwidth[a, b] == (4.5e11 if same else 5e10)
    # the one CPU reaches each node's GPUs over that node's own PCIe, never over InfiniBand
    assert c.route(0, g8) == ["cpu", "host1", "pcie4", "gpu8"]
    assert c.route(g0, 0) == ["gpu0", "pcie0", "host0", "cpu"]


def test_mixed_devices_and_capacities():
    c = load_cluster("mixed")
    assert c.device_names == ("cpu",) + tuple(f"gpu{i}" for i in range(8))
    assert [d.model for d in c.devices] == ["EPYC-7742"] + ["A100-40GB"] * 4 + ["V100-16GB"] * 4
    assert c.devices[0].peak_flops == pytest.approx(64 * 2.25e9 * 32)
    assert c.devices[0].memory_bandwidth == pytest.approx(8 * 25.6e9)
    assert c.capacity.tolist() == pytest.approx([512e9 - 8e9] + [40e9 - 1e9] * 4 + [16e9 - 1e9] * 4)


def test_mixed_a100_beats_v100_by_the_ratio_of_peaks_on_a_compute_bound_op():
    c = load_cluster("mixed")
    g = OpGraph.build(["matmul", "add"], [(0, 1, 4e6)], flops=[1e12, 1e6], bytes_accessed=[1e6, 8e6])
    t = RooflineCostModel(kernels="datasheet").op_times(g, c).table  # the datasheets' ratio
    a100, v100 = _idx(c, "gpu0"), _idx(c, "gpu4")
    over = 5e-6  # launch overhead of both
    assert t[0, a100] == pytest.approx(1e12 / 1.95e13 + over)
    assert t[0, v100] == pytest.approx(1e12 / 1.57e13 + over)
    assert (t[0, v100] - over) / (t[0, a100] - over) == pytest.approx(1.95e13 / 1.57e13)
    assert t[1, a100] == pytest.approx(8e6 / 1.555e12 + over)  # memory bound: HBM bandwidth decides


def test_mixed_a100_to_v100_goes_over_pcie():
    c = load_cluster("mixed")
    a0, a1, v4, v5 = (_idx(c, f"gpu{i}") for i in (0, 1, 4, 5))
    assert c.route(a0, a1) == ["gpu0", "nvlink_a100", "gpu1"]
    assert c.route(v4, v5) == ["gpu4", "nvlink_v100", "gpu5"]
    assert c.route(a0, v4) == ["gpu0", "host", "gpu4"]
    assert c.route(v5, a1) == ["gpu5", "host", "gpu1"]
    assert c.bandwidth[a0, v4] == 1.575e10  # the V100's PCIe 3.0 x16 is the bottleneck
    assert c.bandwidth[a0, a1] == 3e11 and c.bandwidth[v4, v5] == 1.5e11
    assert c.transfer_time(1e9, a0, v4) == pytest.approx(2 * 5e-6 + 1e9 / 1.575e10)
    assert c.transfer_time(1e9, a0, v4) > 10 * c.transfer_time(1e9, a0, a1)
