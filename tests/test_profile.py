"""Real CPU profiling of a traced step."""

import numpy as np
import pytest

from postplace.cost.profile import cpu_model_name, profile_cpu
from postplace.errors import PostplaceError
from postplace.graph import OpGraph
from postplace.zoo import trace_model


def test_profile_stores_per_op_medians_for_this_cpu():
    tr = trace_model("gpt2", "small")
    g, report = profile_cpu(tr, runs=2, warmup=1, peak_flops=1e10, mem_bw=1e10)
    (m,) = g.measured
    assert m.key == cpu_model_name() and m.kind == "cpu"
    assert "median of 2 runs" in m.provenance and "torch" in m.provenance
    assert m.times.shape == (g.num_ops,) and np.all(np.isfinite(m.times)) and np.all(m.times >= 0)
    work = np.array([t not in ("parameter", "buffer", "input", "constant") for t in g.op_types])
    assert np.all(m.times[~work] == 0) and np.all(m.times[work] > 0)
    # the report covers every op type that does work, and its ratios are measured / roofline
    types = {r.op_type for r in report.rows}
    assert types == set(np.array(g.op_types)[work])
    mm = next(r for r in report.rows if r.op_type == "mm")
    assert mm.roofline_s > 0 and mm.median_ratio > 0
    assert "measured ms" in report.format()
    # the graph is otherwise unchanged and still saves
    assert g.names == tr.graph.names and np.array_equal(g.flops, tr.graph.flops)


def test_profiling_a_zoo_graph_file_retraces_it(tmp_path):
    tr = trace_model("resnet50", "small")
    tr.graph.save(tmp_path / "r.json")
    from postplace.zoo.cli import traced_step

    g, _ = profile_cpu(traced_step(OpGraph.load(tmp_path / "r.json")), runs=1, warmup=0, peak_flops=1e10, mem_bw=1e10)
    assert g.measured[0].times.sum() > 0


def test_imported_workload_has_no_code_to_run():
    g = OpGraph.build(["a", "b"], [(0, 1, 8.0)], flops=[1.0, 2.0], name="imported")
    with pytest.raises(PostplaceError) as err:
        profile_cpu(g)
    assert "\n" not in str(err.value) and "imported" in str(err.value) and "no code to run" in str(err.value)
