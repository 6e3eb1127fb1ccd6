"""The parallel yardsticks: data parallelism simulated as a placement, and a GPipe-style pipeline.

The golden graph is a two-layer step traced as two micro-batches, written out by hand (one op per
layer and pass, as ``from_torch(..., microbatches=2)`` would make it): for each micro-batch k,
``f1_k -> f2_k -> b2_k -> b1_k``; then one gradient sum per layer (``a1 = g1_0 + g1_1``) and the
updates. Parameter ``p1`` with its sum ``a1`` and update ``u1`` is one colocation set (module ``a``),
``p2``, ``a2``, ``u2`` another (module ``b``), as the tracer colocates them.

Bandwidth 10 bytes/s, no latency: an activation (10 bytes) moves in 1 s, a parameter or a gradient
(20 bytes) in 2 s. Op times: f1 1 s, f2 2 s, b2 2 s, b1 2 s, a sum 1 s, an update 1 s, parameters 0.
Every expected time is written as the sum that gives it.
"""

import numpy as np
import pytest

from postplace.graph import OpGraph
from postplace.placers import (
    PlacementError,
    data_parallel_placement,
    place_pipeline,
    simulate_data_parallel,
)
from postplace.placers.data_parallel import gradient_bytes
from postplace.sim import Simulator
from postplace.testing import TableCostModel, star_cluster
from tests.goldengraph import NAMES, PARAM, layer_of, op, two_layer_two_microbatches


def two_layers(columns=2):
    g, table = two_layer_two_microbatches(parameter_sets=True, columns=columns)
    return g, TableCostModel(table)


def on(dev, *names):
    return {int(dev[op(n)]) for n in names}


# --------------------------------------------------------------------------- golden schedules
def test_data_parallel_golden_step_time():
    g, cost = two_layers()
    cluster = star_cluster(("gpu", "gpu"), bandwidth=10.0)
    plan = simulate_data_parallel(g, cluster, cost_model=cost)
    # micro-batch k on gpu k; p1's set dealt to gpu0 (both hold 0 parameter bytes), p2's to gpu1 (0 < 20)
    assert on(plan.placement, "p1", "a1", "u1", "f1_0", "f2_0", "b2_0", "b1_0") == {0}
    assert on(plan.placement, "p2", "a2", "u2", "f1_1", "f2_1", "b2_1", "b1_1") == {1}
    # gpu0: f1_0 0-1, f2_0 2-4 (p2 arrives from gpu1 at 0 + 2), b2_0 4-6, b1_0 6-8
    # gpu1: f1_1 2-3 (p1 arrives at 0 + 2), f2_1 3-5, b2_1 5-7, b1_1 7-9; b2_0's gradient arrives 6 + 2 = 8,
    #       a2 9-10 (after b1_1, earlier in program order), u2 10-11
    # gpu0: b1_1's gradient arrives 9 + 2 = 11, a1 11-12, u1 12-13
    data_parallel = 2 + 1 + 2 + 2 + 2 + 2 + 1 + 1  # p1 send, f1_1, f2_1, b2_1, b1_1, g1 send, a1, u1
    assert plan.step_time == plan.step_time_if_it_fit == data_parallel == 13
    assert plan.gpus == ("gpu0", "gpu1") and plan.microbatches == 2 and not plan.oom


def test_pipeline_golden_step_time():
    g, cost = two_layers()
    cluster = star_cluster(("gpu", "gpu"), bandwidth=10.0)
    dev = place_pipeline(g, cluster, cost_model=cost)
    # layer a: 2 (1 + 2) + 1 + 1 = 8 s, layer b: 2 (2 + 2) + 1 + 1 = 10 s; cut a | b: max(8, 10) = 10 < 18
    assert on(dev, *[n for n in NAMES if layer_of(n) == "a"]) == {0}
    assert on(dev, *[n for n in NAMES if layer_of(n) == "b"]) == {1}
    step = Simulator(g, cluster, cost_model=cost).evaluate_ops(dev[None]).step_time[0]
    # f1_0 0-1, send 1-2, f2_0 2-4, b2_0 4-6 (before f2_1: program order), f2_1 6-8, b2_1 8-10,
    # b2_1's activation gradient 10-11, b1_1 11-13, a1 13-14, u1 14-15
    pipelined = 1 + 1 + 2 + 2 + 2 + 2 + 1 + 2 + 1 + 1
    assert step == pipelined == 15


# --------------------------------------------------------------------------- data-parallel memory
def test_data_parallel_is_oom_where_the_replicated_state_does_not_fit_but_the_shards_do():
    g, cost = two_layers()
    cluster = star_cluster(("gpu", "gpu"), bandwidth=10.0, memory=50.0)
    plan = simulate_data_parallel(g, cluster, cost_model=cost)
    # sharded: gpu0 holds p1 (20) + the copy of p2 it receives (20) = 40 <= 50; gpu1 likewise
    assert plan.sharded_peak_mem.tolist() == [PARAM + PARAM] * 2
    assert Simulator(g, cluster, cost_model=cost).evaluate_ops(plan.placement[None]).feasible[0]
    # replicated: + the other GPU's own parameter state (20): 40 + 20 = 60 > 50
    assert plan.peak_mem.tolist() == [PARAM + PARAM + PARAM] * 2
    assert plan.capacity.tolist() == [50.0, 50.0]
    assert plan.oom and plan.step_time == float("inf") and plan.step_time_if_it_fit == 13
    roomy = simulate_data_parallel(g, star_cluster(("gpu", "gpu"), bandwidth=10.0, memory=60.0), cost_model=cost)
    assert not roomy.oom and roomy.step_time == 13


def test_data_parallel_needs_micro_batches_and_a_gpu():
    g, cost = two_layers()
    with pytest.raises(PlacementError, match="no GPU"):
        data_parallel_placement(g, star_cluster(("cpu",)))
    flat = OpGraph.build(["a", "b"], [(0, 1)])
    with pytest.raises(PlacementError, match="no micro-batches"):
        simulate_data_parallel(flat, star_cluster(("gpu", "gpu")))
    tied = OpGraph.build(["f0", "f1"], microbatch=[0, 1], colocation=[0, 0])  # colocation mode "module"
    with pytest.raises(PlacementError, match="colocates micro-batches 0 and 1"):
        simulate_data_parallel(tied, star_cluster(("gpu", "gpu")))


# --------------------------------------------------------------------------- pins and exclusions
def test_data_parallel_placement_respects_an_exclusion_and_a_pin():
    g, _ = two_layers()
    cluster = star_cluster(("gpu", "gpu", "gpu"))
    allowed = np.ones((g.num_ops, 3), dtype=bool)
    allowed[:, 1] = False  # gpu1 excluded for every op
    allowed[[op("p1"), op("a1"), op("u1")], :] = [False, False, True]  # p1 (with its set) pinned to gpu2
    dev = data_parallel_placement(g, cluster, allowed=allowed)
    assert 1 not in dev.tolist()
    assert on(dev, "f1_0", "f2_0", "b2_0", "b1_0") == {0}  # replicas: gpu0, gpu2
    assert on(dev, "f1_1", "f2_1", "b2_1", "b1_1") == {2}
    assert on(dev, "p1", "a1", "u1") == {2}  # the pin holds (its data-parallel device was gpu0)
    assert on(dev, "p2", "a2", "u2") == {0}  # dealt to the GPU with fewer parameter bytes: 0 < 20
    unconstrained = data_parallel_placement(g, cluster)
    assert on(unconstrained, "p1") == {0} and on(unconstrained, "f1_1") == {1}


def test_pipeline_respects_an_exclusion_and_a_pin():
    g, cost = two_layers(columns=3)
    cluster = star_cluster(("gpu", "gpu", "gpu"), bandwidth=10.0)
    allowed = np.ones((g.num_ops, 3), dtype=bool)
    allowed[:, 1] = False
    dev = place_pipeline(g, cluster, cost_model=cost, allowed=allowed)
    assert on(dev, *[n for n in NAMES if layer_of(n) == "a"]) == {0}  # stages on gpu0 and gpu2
    assert on(dev, *[n for n in NAMES if layer_of(n) == "b"]) == {2}
    allowed[[op("p2"), op("a2"), op("u2")], :] = [True, False, False]  # layer b's parameter set pinned to gpu0
    dev = place_pipeline(g, cluster, cost_model=cost, allowed=allowed)
    assert on(dev, "p2", "a2", "u2") == {0} and on(dev, "f2_0", "b2_1") == {2}


# --------------------------------------------------------------------------- heterogeneous stages
def test_pipeline_gives_the_faster_gpu_more_layers():
    # 8 one-op layers in a chain; every op takes 3 s on gpu0 and 1 s on gpu1 (3x faster)
    names = [f"l{i}" for i in range(8)]
    g = OpGraph.build(names, [(i, i + 1) for i in range(7)], module=names)
    cluster = star_cluster(("gpu", "gpu"))
    dev = place_pipeline(g, cluster, cost_model=TableCostModel([[3.0, 1.0]] * 8))
    # gpu0 takes the first k layers: max(3 k, 8 - k) is smallest at k = 2 (6 s each)
    assert dev.tolist() == [0, 0] + [1] * 6
    even = place_pipeline(g, cluster, cost_model=TableCostModel([[1.0, 1.0]] * 8))
    assert even.tolist() == [0] * 4 + [1] * 4


def test_pipeline_cut_moves_where_the_time_balanced_one_does_not_fit():
    # 4 one-op layers, 1 s each on either GPU; footprints (static memory) 5, 5, 1, 1 bytes; 8 bytes per GPU
    names = [f"l{i}" for i in range(4)]
    g = OpGraph.build(
        names, [(i, i + 1) for i in range(3)], module=names, persistent_bytes=[5, 5, 1, 1], memory_mode="static"
    )
    cost = TableCostModel([[1.0, 1.0]] * 4)
    assert place_pipeline(g, star_cluster(("gpu", "gpu")), cost_model=cost).tolist() == [0, 0, 1, 1]
    # 2 | 2 needs 5 + 5 = 10 > 8 on gpu0; 1 | 3 needs 5 and 5 + 1 + 1 = 7
    small = star_cluster(("gpu", "gpu"), memory=8.0)
    dev = place_pipeline(g, small, cost_model=cost)
    assert dev.tolist() == [0, 1, 1, 1]
    assert Simulator(g, small, cost_model=cost).evaluate_ops(dev[None]).feasible[0]
    # nothing fits in 4 bytes: the time-balanced cut, OOM
    tiny = star_cluster(("gpu", "gpu"), memory=4.0)
    assert place_pipeline(g, tiny, cost_model=cost).tolist() == [0, 0, 1, 1]


def test_pipeline_on_a_traced_step_keeps_layers_in_order_and_the_loss_last():
    from postplace.cluster import load_cluster
    from postplace.placers.pipeline import pipeline_layers
    from postplace.zoo import cached_graph

    g = cached_graph("resnet50", size="small")
    cluster = load_cluster("k80x4")
    dev = place_pipeline(g, cluster)
    layer, names = pipeline_layers(g)
    assert names[0] == "(inputs)" and names[-1] == "(loss)"  # the targets are fed first; the loss is last
    stage_of_layer = np.full(len(names), -1)
    for i in range(g.num_ops):
        if dev[i] != 0:  # CPU-only ops aside
            stage_of_layer[layer[i]] = dev[i]
    seen = stage_of_layer[stage_of_layer >= 0]
    assert np.all(np.diff(seen) >= 0) and len(set(seen.tolist())) == 4  # contiguous stages on the 4 GPUs
    assert not Simulator(g, cluster).evaluate_ops(dev[None]).failed[0]


# --------------------------------------------------------------------------- the analytic estimate's gradient
def test_gradient_bytes_are_the_parameters_not_their_optimizer_state():
    from postplace.cluster import load_cluster
    from postplace.zoo import cached_graph

    cluster = load_cluster("k80x4")
    small = cached_graph("resnet50", size="small")
    grad, source = gradient_bytes(small, cluster)
    assert grad == small.metadata["param_bytes"] and source.startswith("parameter ops")
    full = cached_graph("resnet50")  # SGD momentum: persistent bytes = 2 x parameters + buffers
    grad, _ = gradient_bytes(full, cluster)
    assert grad == full.metadata["param_bytes"] == pytest.approx(102.2e6, rel=1e-3)
    assert grad < full.persistent_bytes.sum() / 2


def test_pipeline_docstring_example():
    import doctest

    import postplace.placers.pipeline as mod

    result = doctest.testmod(mod)
    assert result.attempted > 0 and result.failed == 0
