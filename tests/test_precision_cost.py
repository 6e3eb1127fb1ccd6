"""Ops priced by the precision they compute in: the OpGraph field, the device peaks, the presets, the cost model."""

import dataclasses
import json

import numpy as np
import pytest

from postplace.cluster import Cluster, load_cluster
from postplace.cluster.cluster import Device
from postplace.cost import RooflineCostModel
from postplace.errors import PostplaceError
from postplace.graph import GraphError, Measurement, OpGraph, load_graph
from postplace.graph.opgraph import PRECISIONS

TOML = """
name = "prec"
[[device]]
name = "cpu"
kind = "cpu"
model = "C"
peak_flops = 1e12
peak_flops_bf16 = 4e12
peak_flops_fp16 = 2e12
memory_bandwidth = 1e11
memory = 1e10
launch_overhead = 1e-5
[[device]]
name = "gpu0"
kind = "gpu"
model = "G"
peak_flops = 1e13
peak_flops_bf16 = 8e13
peak_flops_fp16 = 1.6e14
memory_bandwidth = 1e12
memory = 1e10
launch_overhead = 2e-6
[[link]]
a = "cpu"
b = "gpu0"
bandwidth = 1e10
"""


def three_ops(**kw):
    """fp32, bf16, fp16: each 4e12 FLOPs; the fp16 op reads and writes 3e11 bytes, the others 1e10."""
    return OpGraph.build(
        ["a", "b", "c"],
        [(0, 1, 8.0), (1, 2, 8.0)],
        flops=[4e12, 4e12, 4e12],
        bytes_accessed=[1e10, 1e10, 3e11],
        precision=["fp32", "bf16", "fp16"],
        **kw,
    )


def one_op(precision, flops=1e15, nbytes=1e6):
    return OpGraph.build(["mm"], flops=[flops], bytes_accessed=[nbytes], precision=[precision], name="one")


def toml_cluster(tmp_path, text=TOML):
    path = tmp_path / "c.toml"
    path.write_text(text)
    return Cluster.from_toml(path)


def one_line_error(exc_info) -> str:
    msg = str(exc_info.value)
    assert "\n" not in msg
    return msg


# ------------------------------------------------------------------------------------ the cost model
def test_each_op_is_priced_at_the_peak_of_its_precision(tmp_path):
    t = RooflineCostModel().op_times(three_ops(), toml_cluster(tmp_path))
    # cpu: max(FLOPs / peak, bytes / 1e11) + 1e-5
    #   fp32 4e12/1e12 = 4 (bytes 0.1); bf16 4e12/4e12 = 1 (bytes 0.1); fp16 4e12/2e12 = 2 < bytes 3e11/1e11 = 3
    # gpu0: max(FLOPs / peak, bytes / 1e12) + 2e-6
    #   fp32 4e12/1e13 = 0.4 (bytes 0.01); bf16 4e12/8e13 = 0.05 (bytes 0.01); fp16 4e12/1.6e14 = 0.025 < 0.3
    want = np.array([[4.0 + 1e-5, 0.4 + 2e-6], [1.0 + 1e-5, 0.05 + 2e-6], [3.0 + 1e-5, 0.3 + 2e-6]])
    np.testing.assert_allclose(t.table, want, rtol=1e-12)
    assert not t.measured.any()
    assert (
        t.sources[1] == "gpu0 (G): 3 roofline estimates (fp32 at 10 TFLOP/s, bf16 at 80 TFLOP/s, fp16 at 160 TFLOP/s) "
        "(datasheet rates: no kernel rates known for G)"
    )


def test_an_all_fp32_graph_is_priced_and_described_as_before(tmp_path):
    g = three_ops()
    fp32 = dataclasses.replace(g, precision=np.zeros(3, dtype=np.int8))
    t = RooflineCostModel().op_times(fp32, toml_cluster(tmp_path))
    np.testing.assert_allclose(t.table[:, 0], [4.0 + 1e-5, 4.0 + 1e-5, 4.0 + 1e-5], rtol=1e-12)
    assert t.sources[1] == "gpu0 (G): 3 roofline estimates (datasheet rates: no kernel rates known for G)"


def test_bf16_on_k80_is_one_error_naming_the_model_and_precision():
    with pytest.raises(PostplaceError) as e:
        RooflineCostModel().op_times(one_op("bf16"), load_cluster("k80x4"))
    msg = one_line_error(e)
    assert "K80" in msg and "bf16" in msg and "peak_flops_bf16" in msg and "k80x4" in msg


def test_fp16_on_k80_is_priced_at_the_fp32_rate():
    k80 = load_cluster("k80x4")
    t16 = RooflineCostModel().op_times(one_op("fp16", flops=2.8e12), k80).table
    t32 = RooflineCostModel().op_times(one_op("fp32", flops=2.8e12), k80).table
    gpu0 = k80.device_index("gpu0")
    assert t16[0, gpu0] == pytest.approx(2.8e12 / 2.8e12 + 1e-5, rel=1e-12)
    np.testing.assert_array_equal(t16, t32)


def test_dgx8_prices_a_compute_bound_bf16_op_14_8x_faster_than_fp32():
    dgx = load_cluster("dgx8")
    gpu0 = dgx.device_index("gpu0")
    overhead = dgx.devices[gpu0].launch_overhead
    bf16 = RooflineCostModel().op_times(one_op("bf16"), dgx).table[0, gpu0] - overhead
    fp32 = RooflineCostModel().op_times(one_op("fp32"), dgx).table[0, gpu0] - overhead
    assert fp32 == pytest.approx(1e15 / 6.7e13, rel=1e-12)
    assert bf16 == pytest.approx(1e15 / 9.894e14, rel=1e-12)
    assert fp32 / bf16 == pytest.approx(14.8, abs=0.05)


def test_measured_times_are_unchanged_and_need_no_peak():
    k80 = load_cluster("k80x4")
    g = dataclasses.replace(one_op("bf16"), measured=(Measurement("K80", "gpu", np.array([0.25]), "test"),))
    t = RooflineCostModel().op_times(g, k80)
    assert t.table[0, k80.device_index("gpu0")] == 0.25
    assert t.measured[0, k80.device_index("gpu0")]


def test_an_op_that_computes_nothing_needs_no_units():
    k80 = load_cluster("k80x4")
    t = RooflineCostModel().op_times(one_op("bf16", flops=0.0, nbytes=2.4e11), k80)  # a bf16 copy
    assert t.table[0, k80.device_index("gpu0")] == pytest.approx(1.0 + 1e-5)


def test_an_op_not_allowed_on_the_device_needs_no_units(tmp_path):
    no_bf16 = TOML.replace("peak_flops_bf16 = 8e13\n", "")
    g = OpGraph.build(["x"], flops=[1e12], precision=["bf16"], allowed_kinds=["cpu"])
    t = RooflineCostModel().op_times(g, toml_cluster(tmp_path, no_bf16))
    assert t.table[0].tolist() == [1e12 / 4e12 + 1e-5, np.inf]
    with pytest.raises(PostplaceError) as e:
        RooflineCostModel().op_times(one_op("bf16"), toml_cluster(tmp_path, no_bf16))
    assert "gpu0 (G) has no bf16 units" in one_line_error(e)


# ------------------------------------------------------------------------------------ devices and presets
def test_device_peak_for():
    d = Device("gpu0", "gpu", "G", 1e13, 1e12, 1e10, 0.0, peak_flops_bf16=8e13)
    assert [d.peak_for(p) for p in PRECISIONS] == [1e13, 8e13, None]
    with pytest.raises(PostplaceError):
        d.peak_for("fp8")


def test_presets_carry_the_spec_sheet_peaks():
    def peaks(preset, model):
        dev = next(d for d in load_cluster(preset).devices if d.model == model)
        return dev.peak_flops, dev.peak_flops_bf16, dev.peak_flops_fp16

    for preset in ("dgx8", "dgx8x2", "h100"):
        assert peaks(preset, "H100") == (6.7e13, 9.894e14, 9.894e14)
        fp32 = peaks(preset, "Xeon-8480")[0]
        assert peaks(preset, "Xeon-8480") == (fp32, fp32, fp32)
    for preset in ("k80x2", "k80x4"):
        assert peaks(preset, "K80") == (2.8e12, None, 2.8e12)
        assert peaks(preset, "Xeon-E5-2699v4") == (5.63e11, 5.63e11, 5.63e11)
    assert peaks("mixed", "A100-40GB") == (1.95e13, 3.12e14, 3.12e14)
    assert peaks("mixed", "V100-16GB") == (1.57e13, None, 1.25e14)
    assert peaks("mixed", "EPYC-7742") == (4.608e12, 4.608e12, 4.608e12)


@pytest.mark.parametrize(
    "value, says",
    [
        ('"fast"', "must be a number"),
        ("nan", "must be finite"),
        ("0.0", "must be positive"),
        ("-1e12", "must be positive"),
        ("true", "must be a number"),
    ],
)
def test_a_bad_precision_peak_in_a_cluster_file_is_one_line(tmp_path, value, says):
    text = TOML.replace("peak_flops_bf16 = 8e13", f"peak_flops_bf16 = {value}")
    with pytest.raises(PostplaceError) as e:
        toml_cluster(tmp_path, text)
    msg = one_line_error(e)
    assert "c.toml" in msg and "device[1]" in msg and "'peak_flops_bf16'" in msg and says in msg


def test_a_bad_precision_peak_on_a_device_built_in_code_is_one_line():
    bad = Device("gpu0", "gpu", "G", 1e13, 1e12, 1e10, 0.0, peak_flops_fp16=float("inf"))
    with pytest.raises(PostplaceError) as e:
        Cluster("c", (bad,), (), ())
    assert "device 'gpu0' field 'peak_flops_fp16' is inf" in one_line_error(e)


# ------------------------------------------------------------------------------------ the graph field
def test_precision_defaults_to_fp32_and_accepts_names_or_indices():
    g = OpGraph.build(["a", "b"])
    assert g.precision.dtype == np.int8 and g.precision.tolist() == [0, 0]
    assert g.precisions_used == ("fp32",)
    assert OpGraph.build([]).precisions_used == ()
    assert OpGraph.build(["a", "b"], precision=[2, "bf16"]).precision.tolist() == [2, 1]
    assert three_ops().precisions_used == PRECISIONS
    assert not three_ops().precision.flags.writeable


def test_replace_carries_precision():
    g = dataclasses.replace(three_ops(), measured=(Measurement("G", "gpu", np.array([1.0, 2.0, 3.0]), "t"),))
    assert g.precision.tolist() == [0, 1, 2]


@pytest.mark.parametrize(
    "precision, says",
    [
        ([0, 3, 0], "field 'precision' is 3"),
        ([0, -1, 0], "is -1"),
        ([0, 0], "field 'precision' has 2 entries for 3 ops"),
        (["fp32", "fp8", "fp32"], "op 'b' field 'precision' is 'fp8'"),
    ],
)
def test_bad_precision_values_are_one_line(precision, says):
    with pytest.raises(GraphError) as e:
        OpGraph.build(["a", "b", "c"], precision=precision)
    assert says in one_line_error(e)


def test_save_load_round_trip_keeps_precision(tmp_path):
    g = three_ops(name="p")
    g.save(tmp_path / "g.json")
    assert json.loads((tmp_path / "g.json").read_text())["ops"]["precision"] == ["fp32", "bf16", "fp16"]
    for back in (OpGraph.load(tmp_path / "g.json"), load_graph(tmp_path / "g.json")):
        assert back.precision.dtype == np.int8
        assert back.precision.tolist() == [0, 1, 2]
        assert back.to_dict() == g.to_dict()


def test_an_all_fp32_graph_file_has_no_precision_key(tmp_path):
    for g in (OpGraph.build(["a", "b"], [(0, 1)]), OpGraph.build(["a", "b"], [(0, 1)], precision=["fp32"] * 2)):
        g.save(tmp_path / "g.json")
        assert "precision" not in json.loads((tmp_path / "g.json").read_text())["ops"]
        assert OpGraph.load(tmp_path / "g.json").precision.tolist() == [0, 0]


@pytest.mark.parametrize(
    "value, says",
    [
        (["fp32", "fp8", "bf16"], "'ops.precision[1]' is 'fp8'; use one of"),
        (["fp32", 1, "bf16"], "'ops.precision[1]' must be a string"),
        (["fp32"], "'ops.precision' must be a list of 3 entries"),
    ],
)
def test_a_bad_precision_in_a_graph_file_is_one_line(tmp_path, value, says):
    d = three_ops().to_dict()
    d["ops"]["precision"] = value
    path = tmp_path / "g.json"
    path.write_text(json.dumps(d))
    with pytest.raises(GraphError) as e:
        OpGraph.load(path)
    msg = one_line_error(e)
    assert msg.startswith(str(path)) and says in msg
