"""Hand-computed schedules on tiny graphs. Every expected time is written as the sum that gives it.

Clusters come from ``star_cluster`` with bandwidth 1 byte/s and zero latency unless said otherwise, so
a transfer of k bytes takes k seconds. Op times come from a table (one row per op, one column per device).
"""

import numpy as np
import pytest

from postplace.graph import OpGraph
from postplace.testing import TableCostModel, star_cluster
from tests.simhelp import schedule_both

GPU2 = ("gpu", "gpu")


def rows(sched):
    return [(name, dev, start, end) for name, dev, start, end in sched.rows()]


def test_chain_on_one_device_runs_back_to_back():
    g = OpGraph.build(["a", "b", "c"], [(0, 1, 5.0), (1, 2, 5.0)])
    cost = TableCostModel([[1, 9], [2, 9], [3, 9]])
    _, s = schedule_both(g, star_cluster(GPU2), cost, [0, 0, 0])
    assert rows(s) == [("a", "gpu0", 0, 1), ("b", "gpu0", 1, 1 + 2), ("c", "gpu0", 1 + 2, 1 + 2 + 3)]
    assert s.transfers == []
    assert s.step_time == 1 + 2 + 3


def test_chain_across_devices_pays_each_transfer():
    g = OpGraph.build(["a", "b", "c"], [(0, 1, 4.0), (1, 2, 2.0)])
    cost = TableCostModel([[1, 1], [2, 2], [3, 3]])
    _, s = schedule_both(g, star_cluster(GPU2), cost, [0, 1, 0])
    assert rows(s) == [
        ("a", "gpu0", 0, 1),
        ("b", "gpu1", 1 + 4, 1 + 4 + 2),
        ("c", "gpu0", 1 + 4 + 2 + 2, 1 + 4 + 2 + 2 + 3),
    ]
    assert s.transfers == [(0, 0, 0, 1, 4.0, 1, 1 + 4), (1, 0, 1, 0, 2.0, 7, 7 + 2)]
    assert s.step_time == 12


@pytest.fixture
def diamond():
    # a -> b, a -> c, b -> d, c -> d ; one byte on every edge
    return OpGraph.build(["a", "b", "c", "d"], [(0, 1, 1.0), (0, 2, 1.0), (1, 3, 1.0), (2, 3, 1.0)])


def test_diamond_on_one_device_follows_program_order(diamond):
    cost = TableCostModel([[1, 1], [2, 2], [3, 3], [4, 4]])
    _, s = schedule_both(diamond, star_cluster(GPU2), cost, [0, 0, 0, 0])
    assert rows(s) == [("a", "gpu0", 0, 1), ("b", "gpu0", 1, 3), ("c", "gpu0", 3, 6), ("d", "gpu0", 6, 10)]
    assert s.step_time == 1 + 2 + 3 + 4


def test_diamond_split_overlaps_the_branches(diamond):
    cost = TableCostModel([[1, 1], [2, 2], [3, 3], [4, 4]])
    _, s = schedule_both(diamond, star_cluster(GPU2), cost, [0, 1, 0, 0])
    assert rows(s) == [
        ("a", "gpu0", 0, 1),
        ("b", "gpu1", 1 + 1, 1 + 1 + 2),  # waits for a's byte
        ("c", "gpu0", 1, 1 + 3),  # runs meanwhile on gpu0
        ("d", "gpu0", 1 + 1 + 2 + 1, 1 + 1 + 2 + 1 + 4),  # waits for b's byte to come back
    ]
    assert s.step_time == 9


def test_fork_join_transfers_queue_on_the_senders_egress_port():
    # a (gpu0) feeds b (gpu1) and c (gpu2) with the same 2-byte tensor; d (gpu0) joins b and c.
    g = OpGraph.build(["a", "b", "c", "d"], [(0, 1, 2.0), (0, 2, 2.0), (1, 3, 1.0), (2, 3, 1.0)])
    cost = TableCostModel(np.ones((4, 3)))
    _, s = schedule_both(g, star_cluster(("gpu",) * 3), cost, [0, 1, 2, 0])
    assert s.transfers == [
        (0, 0, 0, 1, 2.0, 1, 1 + 2),  # a -> gpu1 first (out-edge order)
        (0, 0, 0, 2, 2.0, 1 + 2, 1 + 2 + 2),  # a -> gpu2 waits for gpu0's egress
        (1, 0, 1, 0, 1.0, 3 + 1, 3 + 1 + 1),
        (2, 0, 2, 0, 1.0, 5 + 1, 5 + 1 + 1),
    ]
    assert rows(s) == [("a", "gpu0", 0, 1), ("b", "gpu1", 3, 3 + 1), ("c", "gpu2", 5, 5 + 1), ("d", "gpu0", 7, 7 + 1)]
    assert s.step_time == 1 + 2 + 2 + 1 + 1 + 1


def two_sends_graph():
    # a (gpu0) -> c (gpu2) and b (gpu1) -> d (gpu3), 3 bytes each: no port in common.
    return OpGraph.build(["a", "b", "c", "d"], [(0, 2, 3.0), (1, 3, 3.0)])


def test_transfers_contend_for_a_shared_pcie_switch_uplink():
    cluster = star_cluster(("gpu",) * 4, shared={"sw": ["gpu0", "gpu1"]})
    _, s = schedule_both(two_sends_graph(), cluster, TableCostModel(np.ones((4, 4))), [0, 1, 2, 3])
    assert s.transfers == [(0, 0, 0, 2, 3.0, 1, 1 + 3), (1, 0, 1, 3, 3.0, 1 + 3, 1 + 3 + 3)]
    assert rows(s)[2:] == [("c", "gpu2", 4, 4 + 1), ("d", "gpu3", 7, 7 + 1)]
    assert s.step_time == 1 + 3 + 3 + 1


def test_without_the_shared_switch_the_same_transfers_overlap():
    cluster = star_cluster(("gpu",) * 4)
    _, s = schedule_both(two_sends_graph(), cluster, TableCostModel(np.ones((4, 4))), [0, 1, 2, 3])
    assert [x[5:] for x in s.transfers] == [(1, 1 + 3), (1, 1 + 3)]
    assert s.step_time == 1 + 3 + 1


def test_latency_adds_per_link_on_the_route():
    g = OpGraph.build(["a", "b"], [(0, 1, 2.0)])
    cluster = star_cluster(GPU2, latency=0.25)  # gpu0 -> hub -> gpu1: two links
    _, s = schedule_both(g, cluster, TableCostModel(np.ones((2, 2))), [0, 1])
    assert s.transfers == [(0, 0, 0, 1, 2.0, 1, 1 + (0.25 + 0.25) + 2)]


def test_a_tensor_read_twice_on_one_remote_device_is_sent_once():
    g = OpGraph.build(["a", "b", "c"], [(0, 1, 2.0), (0, 2, 2.0)])
    _, s = schedule_both(g, star_cluster(GPU2), TableCostModel(np.ones((3, 2))), [0, 1, 1])
    assert s.transfers == [(0, 0, 0, 1, 2.0, 1, 1 + 2)]
    assert rows(s) == [("a", "gpu0", 0, 1), ("b", "gpu1", 3, 3 + 1), ("c", "gpu1", 4, 4 + 1)]


def test_two_outputs_of_one_op_are_two_transfers():
    g = OpGraph.build(["a", "b", "c"], [(0, 1, 2.0, 0), (0, 2, 2.0, 1)])
    _, s = schedule_both(g, star_cluster(GPU2), TableCostModel(np.ones((3, 2))), [0, 1, 1])
    assert s.transfers == [(0, 0, 0, 1, 2.0, 1, 1 + 2), (0, 1, 0, 1, 2.0, 3, 3 + 2)]
    assert rows(s)[1:] == [("b", "gpu1", 3, 3 + 1), ("c", "gpu1", 5, 5 + 1)]


def test_live_memory_frees_an_output_after_its_last_consumer():
    # chain a -> b -> c -> d with outputs 4, 2, 1, 8 bytes and 10 persistent bytes on a
    g = OpGraph.build(
        ["a", "b", "c", "d"],
        [(0, 1, 4.0), (1, 2, 2.0), (2, 3, 1.0)],
        output_bytes=[4, 2, 1, 8],
        persistent_bytes=[10, 0, 0, 0],
    )
    _, s = schedule_both(g, star_cluster(GPU2), TableCostModel(np.ones((4, 2))), [0, 0, 0, 0])
    # while b runs: a's 4 + b's 2; while d runs: c's 1 + d's 8 (a and b are freed by then)
    assert s.peak_memory[0] == 10 + max(4, 4 + 2, 2 + 1, 1 + 8)
    assert s.peak_memory[1] == 0


def test_live_memory_counts_sent_tensors_on_both_sides():
    g = OpGraph.build(["a", "b"], [(0, 1, 4.0)], output_bytes=[4, 2])
    _, s = schedule_both(g, star_cluster(GPU2), TableCostModel(np.ones((2, 2))), [0, 1])
    assert s.peak_memory[0] == 4  # kept by the sender until the send ends at 1 + 4
    assert s.peak_memory[1] == 4 + 2  # the received copy is live while b writes its output


def test_inplace_ops_allocate_nothing():
    g = OpGraph.build(["a", "b"], [(0, 1, 4.0)], output_bytes=[4, 4], inplace=[False, True])
    _, s = schedule_both(g, star_cluster(GPU2), TableCostModel(np.ones((2, 2))), [0, 0])
    assert s.peak_memory[0] == 4


def test_a_tensor_written_in_place_lives_until_the_in_place_ops_readers_finish():
    # a (4 bytes) -> b (in place: writes a's tensor) -> c (4 bytes); all on gpu0, one second each.
    # While c runs, a's tensor is still read through b: a's 4 + c's 4 (the old rule freed it when b ended).
    g = OpGraph.build(["a", "b", "c"], [(0, 1, 4.0), (1, 2, 4.0)], output_bytes=[4, 4, 4], inplace=[False, True, False])
    _, s = schedule_both(g, star_cluster(GPU2), TableCostModel(np.ones((3, 2))), [0, 0, 0])
    assert s.peak_memory[0] == 4 + 4


def test_in_place_chain_holds_the_base_to_the_end_of_the_chain():
    # a (4) -> b (in place on a) -> c (in place on b) -> d (2); e (1) reads a's tensor after d.
    # a's 4 bytes stay while d runs (d reads it through c and b): 4 + 2; then freed when e ends.
    g = OpGraph.build(
        ["a", "b", "c", "d", "e"],
        [(0, 1, 4.0), (1, 2, 4.0), (2, 3, 4.0), (3, 4, 2.0)],
        output_bytes=[4, 4, 4, 2, 1],
        inplace=[False, True, True, False, False],
    )
    _, s = schedule_both(g, star_cluster(GPU2), TableCostModel(np.ones((5, 2))), [0, 0, 0, 0, 0])
    # while d runs: a 4 + d 2; while e runs: d 2 + e 1 (a freed when d, its last reader via c, ended)
    assert s.peak_memory[0] == max(4, 4 + 2, 2 + 1)


def test_only_the_written_input_of_an_in_place_op_is_held():
    # a (8) and b (2) feed c = a.add_(b) (base a); d (1) reads c. b is freed when c ends, a only when d ends.
    g = OpGraph.build(
        ["a", "b", "c", "d"],
        [(0, 2, 8.0), (1, 2, 2.0), (2, 3, 8.0)],
        output_bytes=[8, 2, 8, 1],
        inplace=[False, False, True, False],
        inplace_base=[-1, -1, 0, -1],
    )
    cost = TableCostModel(np.ones((4, 2)))
    _, s = schedule_both(g, star_cluster(GPU2), cost, [0, 0, 0, 0])
    assert s.peak_memory[0] == max(8 + 2, 8 + 1)  # during b: a + b; during d: a + d (b already freed)
    # with the base not known, every input is held: during d, a 8 + b 2 + d 1
    unknown = OpGraph.build(
        ["a", "b", "c", "d"],
        [(0, 2, 8.0), (1, 2, 2.0), (2, 3, 8.0)],
        output_bytes=[8, 2, 8, 1],
        inplace=[False, False, True, False],
    )
    assert unknown.inplace_base.tolist() == [-1, -1, -1, -1]
    _, s = schedule_both(unknown, star_cluster(GPU2), cost, [0, 0, 0, 0])
    assert s.peak_memory[0] == 8 + 2 + 1


def test_a_received_tensor_written_in_place_stays_until_the_in_place_ops_readers_finish():
    # a (gpu0, 4 bytes) -> b (gpu1, in place on the received copy) -> c (gpu1, 2 bytes)
    g = OpGraph.build(["a", "b", "c"], [(0, 1, 4.0), (1, 2, 4.0)], output_bytes=[4, 4, 2], inplace=[False, True, False])
    _, s = schedule_both(g, star_cluster(GPU2), TableCostModel(np.ones((3, 2))), [0, 1, 1])
    assert s.peak_memory[0] == 4  # until the send ends at 1 + 4
    assert s.peak_memory[1] == 4 + 2  # the received copy, written by b, is live while c runs


def test_static_memory_is_the_sum_of_footprints_per_device():
    g = OpGraph.build(
        ["a", "b", "c"],
        [(0, 1, 4.0), (1, 2, 4.0)],
        output_bytes=[100, 100, 100],
        persistent_bytes=[3, 5, 7],
        memory_mode="static",
    )
    _, s = schedule_both(g, star_cluster(GPU2), TableCostModel(np.ones((3, 2))), [0, 1, 0])
    assert s.peak_memory.tolist() == [3 + 7, 5]


def test_oom_is_flagged_but_the_step_time_is_still_reported():
    from postplace.sim import Simulator

    g = OpGraph.build(["a", "b"], [(0, 1, 1.0)], output_bytes=[1, 1], persistent_bytes=[5, 5])
    cluster = star_cluster(GPU2, memory=8.0)
    sim = Simulator(g, cluster, cost_model=TableCostModel(np.ones((2, 2))))
    r = sim.evaluate(np.array([[0, 0], [0, 1]]))
    # together: 5 + 5 + 1 + 1 = 12 > 8; apart: gpu0 5 + 1 = 6, gpu1 5 + 1 (received) + 1 = 7
    assert r.oom.tolist() == [True, False]
    assert r.peak_mem.tolist() == [[12, 0], [6, 7]]
    assert r.step_time.tolist() == [1 + 1, 1 + 1 + 1]
    assert r.evaluator == "simulator"
    assert not r.failed.any()


def test_cpu_only_op_on_a_gpu_fails_with_its_reason():
    from postplace.sim import Simulator

    g = OpGraph.build(["a", "b"], [(0, 1, 1.0)], allowed_kinds=["cpu", ["cpu", "gpu"]])
    sim = Simulator(g, star_cluster(("cpu", "gpu")), cost_model=TableCostModel(np.ones((2, 2))))
    r = sim.evaluate(np.array([[1, 1], [0, 1]]))
    assert r.failed.tolist() == [True, False]
    assert "may only run on cpu" in r.reasons[0]
    assert np.isinf(r.step_time[0]) and np.isfinite(r.step_time[1])
