"""METIS at the edges: op times all zero on one kind of device, and edges that carry absurd byte counts.

The METIS placer runs in every ``place``, the search's partition starts and the grouping call METIS
too: each hands pymetis integer weights scaled from floats. Zero times gave a part a target weight of
0 (METIS: "Incorrect tpwgts", an internal error); byte sums that overflow to inf gave NaN weights,
cast to the most negative int64 (METIS: a segmentation fault). Crashing cases run in a subprocess, so
a segfault fails the test instead of killing pytest.
"""

import json
import subprocess
import sys

import numpy as np
import pytest

from postplace.graph import OpGraph
from tests.test_cli import assert_one_error_line


def cli(*args, cwd):
    return subprocess.run(
        [sys.executable, "-m", "postplace.cli", *args], capture_output=True, text=True, cwd=cwd, timeout=600
    )


def workload(n: int = 12, *, fpga: float, cpu: float, edge_size: float = 1e6) -> dict:
    """A dnn-partitioning workload: a chain of ``n`` nodes with the given latencies (ms)."""
    nodes = [
        {
            "name": f"n{i}",
            "id": i,
            "supportedOnFpga": True,
            "cpuLatency": cpu,
            "fpgaLatency": fpga,
            "isBackwardNode": False,
            "colorClass": i,
            "size": 1e6,
        }
        for i in range(n)
    ]
    edges = [{"sourceId": i, "destId": i + 1, "cost": 1.0, "size": edge_size} for i in range(n - 1)]
    return {"maxSizePerFPGA": 1e9, "maxFPGAs": 2, "maxCPUs": 1, "nodes": nodes, "edges": edges}


def zero_time_graph(zero_kind: str) -> OpGraph:
    from postplace.graph.dnn_partitioning import import_workload

    times = {"fpga": 0.0, "cpu": 1.0} if zero_kind == "gpu" else {"fpga": 1.0, "cpu": 0.0}
    return import_workload(workload(**times), source="zero")


@pytest.mark.parametrize("zero_kind", ["gpu", "cpu"])
def test_the_metis_placer_takes_op_times_all_zero_on_one_kind(zero_kind):
    from postplace.cluster import load_cluster
    from postplace.placers import place

    g = zero_time_graph(zero_kind)
    c = load_cluster("k80x2")
    dev = place("metis", g, c)
    assert dev.shape == (g.num_ops,) and ((dev >= 0) & (dev < c.num_devices)).all()


def test_place_on_a_workload_with_zero_gpu_times_is_no_internal_error(tmp_path):
    (tmp_path / "w.json").write_text(json.dumps(workload(fpga=0.0, cpu=1.0)))
    r = cli("place", "w.json", "-c", "k80x2", "--budget", "24", "--json", "--no-report", "--out", "run", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    s = json.loads(r.stdout)
    assert "metis" in s["candidates"] and s["best_step_time_s"] is not None


def huge_edge_graph_file(path, n: int = 300) -> None:
    """A graph file of a DAG of ``n`` ops whose every edge carries 1e308 bytes, twice between each pair
    (two output slots): every summed edge weight overflows to inf. It crashed METIS (SIGSEGV)."""
    rng = np.random.default_rng(0)
    pairs = {(i, i + 1) for i in range(n - 1)}
    for i, j in rng.integers(0, n, size=(n, 2)):
        if i != j:
            pairs.add((int(min(i, j)), int(max(i, j))))
    edges = [(i, j, 1.0, s) for i, j in sorted(pairs) for s in (0, 1)]
    d = OpGraph.build(
        [f"op{i}" for i in range(n)],
        edges,
        flops=[1e9] * n,
        bytes_accessed=[1e6] * n,
        output_bytes=[1e6] * n,
        name="huge",
    ).to_dict()
    d["edges"]["bytes"] = [1e308] * len(d["edges"]["bytes"])
    path.write_text(json.dumps(d))


def test_edges_of_1e308_bytes_are_one_clear_error_not_a_crash(tmp_path):
    from postplace.validate import MAX_BYTES

    huge_edge_graph_file(tmp_path / "huge.json")
    r = cli("place", "huge.json", "-c", "k80x4", "--budget", "24", "--no-report", "--out", "run", cwd=tmp_path)
    assert r.returncode == 2, f"exit {r.returncode} (-11: segmentation fault): {r.stderr[-2000:]}"
    assert_one_error_line(r, "huge.json", "edge op0 -> op1", "edges.bytes", f"{MAX_BYTES:g}")
    assert not (tmp_path / "run" / "placement.json").exists()


def test_a_workload_edge_above_the_bound_is_one_clear_error(tmp_path):
    from postplace.validate import MAX_BYTES

    (tmp_path / "w.json").write_text(json.dumps(workload(fpga=1.0, cpu=1.0, edge_size=1e308)))
    assert_one_error_line(cli("info", "w.json", cwd=tmp_path), "w.json", "edges[0]", "(edge 0 -> 1)", f"{MAX_BYTES:g}")
    ok = workload(fpga=1.0, cpu=1.0, edge_size=MAX_BYTES)  # the bound itself is accepted
    (tmp_path / "ok.json").write_text(json.dumps(ok))
    assert cli("info", "ok.json", cwd=tmp_path).returncode == 0


def test_integer_weights_are_positive_bounded_and_proportional():
    from postplace.graph.metis import int_weights, weight_total_cap

    cap = weight_total_cap()
    for w in (
        [0.0, 0.0, 0.0],
        [],
        [np.inf, 1.0, np.nan, -3.0, 0.0],
        [1e308, 1e308, 1e308],
        [np.inf] * 4,
        [5e-324, 1.0],
        np.full(100_000, 1e300),
    ):
        out = int_weights(np.asarray(w, dtype=float), 1e6)
        assert out.dtype == np.int64 and len(out) == len(w)
        assert (out >= 1).all() and out.sum() <= cap, w
    np.testing.assert_array_equal(int_weights(np.array([1.0, 2.0, 4.0]), 1000), [250, 500, 1000])
    assert int_weights(np.array([np.inf, 1.0, 0.5]), 10).tolist() == [10, 10, 5]  # inf: the heaviest, never NaN
    big = int_weights(np.full(10_000, 7.0), 1e6)  # the total stays within METIS's integer range
    assert big.sum() <= cap and len(set(big.tolist())) == 1


def test_summed_edge_weights_past_float_range_keep_their_proportions():
    from postplace.graph.metis import int_weights, symmetric_csr

    # 0-1 twice (two slots), 1-2 once, a self loop: 2e308 would be inf, a NaN weight after scaling
    xadj, adjncy, summed = symmetric_csr([0, 0, 1, 2], [1, 1, 2, 2], [1e308, 1e308, 1e308, 5.0], 3)
    assert xadj.tolist() == [0, 1, 3, 4] and adjncy.tolist() == [1, 0, 2, 1]
    assert np.isfinite(summed).all()
    assert int_weights(summed, 1000).tolist() == [1000, 1000, 500, 500]
    _, _, plain = symmetric_csr([0, 1], [1, 0], [3.0, 4.0], 2)  # parallel edges either way: summed
    assert plain.tolist() == [7.0, 7.0]


def test_target_part_weights_are_positive_and_sum_to_one():
    from postplace.graph.metis import target_weights

    for x in ([1e300, 1e300, 83.0], [0.0, 0.0], [np.inf, 1.0], [1.0, 2.0, 1.0]):
        t = target_weights(np.asarray(x, dtype=float))
        assert (t > 0).all() and abs(t.sum() - 1.0) < 1e-9 and np.isfinite(t).all(), x
    np.testing.assert_allclose(target_weights(np.array([1.0, 3.0])), [0.25, 0.75])


def test_metis_survives_weights_of_inf_nan_and_zero_in_a_subprocess():
    """The scaler alone (no graph validation in the way): weights that once reached METIS as -2**63
    and crashed it. In a subprocess, so a crash fails this test only."""
    code = """
import numpy as np
from postplace.graph.metis import part_graph, symmetric_csr
n = 300
rng = np.random.default_rng(0)
src = np.concatenate([np.arange(n - 1), rng.integers(0, n, n)])
dst = np.concatenate([np.arange(1, n), rng.integers(0, n, n)])
w = np.where(rng.random(len(src)) < 0.5, np.inf, np.nan)
xadj, adjncy, summed = symmetric_csr(src, dst, w, n)
for vw in (np.zeros(n), np.full(n, np.inf), np.full(n, 1e308)):
    parts = part_graph(4, xadj, adjncy, vweights=vw, eweights=summed, tpwgts=[np.inf, 0.0, 1.0, np.nan])
    assert parts.shape == (n,) and ((parts >= 0) & (parts < 4)).all()
print("ok")
"""
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and r.stdout.strip() == "ok", f"exit {r.returncode}: {r.stderr[-2000:]}"
