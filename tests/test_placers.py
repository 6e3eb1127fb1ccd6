"""The one-shot placers (issue 5): valid placements everywhere, schedules computed on paper, memory promises.

Hand-made clusters come from ``star_cluster`` with bandwidth 1 byte/s and zero latency unless said
otherwise, so a transfer of k bytes takes k seconds; op times come from a table (one row per op, one
column per device). Expected times are written as the sums that give them.
"""

import json
from functools import lru_cache

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from postplace.cluster import Cluster, Device, Link, load_cluster
from postplace.cluster.placement import invalid_reason
from postplace.cost import RooflineCostModel
from postplace.errors import PostplaceError
from postplace.graph import OpGraph, load_graph
from postplace.placers import (
    PLACERS,
    NoSingleDeviceFits,
    PlacementError,
    data_parallel_step_time,
    memory_account,
    place,
    place_expert,
)
from postplace.placers.baechi import list_schedule, sct_favorites
from postplace.placers.heft import heft_schedule
from postplace.sim import Simulator
from postplace.testing import ConstantCostModel, TableCostModel, star_cluster

WORKLOADS = ("resnet50_training", "bert_l-3_training", "gnmt_training")
MEMORY_AWARE = ("single", "m-topo", "m-etf", "m-sct")
GPU2 = ("gpu", "gpu")


@lru_cache
def workload(path: str):
    return load_graph(path)


@lru_cache
def simulator(path: str, cluster_name: str):
    return Simulator(workload(path), load_cluster(cluster_name))


# --------------------------------------------------------------------------- every placer, every workload
@pytest.mark.parametrize("name", sorted(PLACERS))
@pytest.mark.parametrize("wl", WORKLOADS)
def test_placer_is_valid_on_shared_workloads(shared_data, wl, name):
    path = str(shared_data / f"{wl}.json")
    graph, cluster = workload(path), load_cluster("k80x4")
    dev = place(name, graph, cluster)
    assert dev.dtype == np.int64 and dev.shape == (graph.num_ops,)
    assert invalid_reason(graph, cluster, dev) is None
    res = simulator(path, "k80x4").evaluate(dev[None])
    assert not res.failed[0]
    assert res.step_time[0] >= simulator(path, "k80x4").lower_bound * (1 - 1e-9)
    if name in MEMORY_AWARE:
        assert not res.oom[0]
        assert np.all(memory_account(graph, cluster, dev) <= cluster.capacity)
    np.testing.assert_array_equal(place(name, graph, cluster), dev)  # deterministic


def test_expert_split_file_is_folded_onto_fewer_gpus(shared_data):
    graph, cluster = workload(str(shared_data / "gnmt_training.json")), load_cluster("k80x4")
    dev = place_expert(graph, cluster, split=shared_data / "gnmt_training_expert.json")
    assert invalid_reason(graph, cluster, dev) is None
    # the file's 6 accelerators go to GPU floor(k * 4 / 6): 0, 0, 1, 2, 2, 3 (device ids 1..4 on k80x4)
    split = json.loads((shared_data / "gnmt_training_expert.json").read_text())
    want = [1, 1, 2, 3, 3, 4]
    for k, acc in enumerate(split["fpgas"]):
        node = acc["nodes"][0]
        i = graph.metadata["original_ids"].index(node)
        assert dev[i] == want[k], (k, graph.names[i])


# --------------------------------------------------------------------------- small hand-made graphs
def cpu_only_graph(memory_mode="live"):
    # a -> b -> c -> d, b -> e; c may only run on a CPU; a and d are colocated (a "gradient" pair)
    return OpGraph.build(
        list("abcde"),
        [(0, 1, 2.0), (1, 2, 2.0), (2, 3, 2.0), (1, 4, 1.0, 1), (3, 4, 1.0)],
        allowed_kinds=[["cpu", "gpu"], ["cpu", "gpu"], ["cpu"], ["cpu", "gpu"], ["cpu", "gpu"]],
        colocation=[0, -1, -1, 0, -1],
        persistent_bytes=[3, 1, 1, 2, 1],
        output_bytes=[2, 2, 2, 1, 1],
        memory_mode=memory_mode,
    )


@pytest.mark.parametrize("name", sorted(PLACERS))
@pytest.mark.parametrize("mode", ["live", "static"])
def test_placer_respects_colocation_and_cpu_only_ops(name, mode):
    g = cpu_only_graph(mode)
    cluster = star_cluster(("cpu", "gpu", "gpu"))
    cost = TableCostModel([[5, 1, 1], [5, 1, 2], [5, 1, 1], [5, 2, 1], [5, 1, 1]])
    dev = place(name, g, cluster, cost_model=cost)
    assert invalid_reason(g, cluster, dev) is None
    assert dev[2] == 0  # the CPU-only op is on the CPU
    assert dev[0] == dev[3]  # the colocated pair is together
    assert not Simulator(g, cluster, cost_model=cost).evaluate(dev[None]).failed[0]


def test_unknown_placer_is_a_one_line_error():
    with pytest.raises(PostplaceError, match="unknown placer 'nope'"):
        place("nope", cpu_only_graph(), star_cluster())


def test_cpu_placer_needs_a_cpu():
    with pytest.raises(PlacementError, match="no CPU"):
        place("cpu", OpGraph.build(["a"]), star_cluster(GPU2))


# --------------------------------------------------------------------------- HEFT on paper
def test_heft_diamond_with_an_insertion():
    # a -> b, a -> c, b -> d, c -> d (1 byte each: 1 s across devices); e is independent.
    g = OpGraph.build(list("abcde"), [(0, 1, 1.0), (0, 2, 1.0), (1, 3, 1.0), (2, 3, 1.0)])
    cost = TableCostModel([[2, 3], [3, 2], [4, 4], [1, 2], [5, 2]])
    dev, start, finish = heft_schedule(g, star_cluster(GPU2), cost_model=cost)
    # mean times: a 2.5, b 2.5, c 4, d 1.5, e 3.5; mean transfer of 1 byte: 1
    # rank_u: d 1.5; b 2.5 + 1 + 1.5 = 5; c 4 + 1 + 1.5 = 6.5; a 2.5 + (1 + 6.5) = 10; e 3.5
    # order a, c, b, e, d. a: EFT gpu0 2 < gpu1 3. c: gpu0 2 + 4 = 6 < gpu1 (2 + 1) + 4 = 7.
    # b: gpu0 6 + 3 = 9 > gpu1 (2 + 1) + 2 = 5. e: gpu0 6 + 5 = 11 > gpu1 in the gap before b: 0 + 2 = 2.
    # d: gpu0 max(5 + 1, 6) + 1 = 7 < gpu1 max(5, 6 + 1) + 2 = 9.
    assert dev.tolist() == [0, 1, 0, 0, 1]
    assert start.tolist() == [0, 2 + 1, 2, 5 + 1, 0]
    assert finish.tolist() == [2, 2 + 1 + 2, 2 + 4, 5 + 1 + 1, 0 + 2]


def test_heft_keeps_fast_ops_on_the_fast_device():
    # x -> z, y -> z (1 byte each); x, y take 1 s on gpu0 and 10 s on gpu1
    g = OpGraph.build(list("xyz"), [(0, 2, 1.0), (1, 2, 1.0)])
    dev, start, finish = heft_schedule(g, star_cluster(GPU2), cost_model=TableCostModel([[1, 10], [1, 10], [1, 1]]))
    # x: gpu0 [0, 1]; y: gpu0 [1, 1 + 1] (finish 2 < 10 on gpu1); z: gpu0 [2, 2 + 1]
    assert dev.tolist() == [0, 0, 0]
    assert finish.tolist() == [1, 1 + 1, 1 + 1 + 1]


# --------------------------------------------------------------------------- m-ETF / m-SCT on paper
def test_m_etf_diamond_breaks_start_ties_by_static_level():
    g = OpGraph.build(list("abcd"), [(0, 1, 1.0), (0, 2, 1.0), (1, 3, 1.0), (2, 3, 1.0)])
    cost = TableCostModel([[2, 3], [3, 2], [4, 4], [1, 2]])
    dev, start, finish = list_schedule(g, star_cluster(GPU2), cost_model=cost)
    # static levels (mean times): d 1.5, b 2.5 + 1.5 = 4, c 4 + 1.5 = 5.5, a 2.5 + 5.5 = 8
    # a: start 0 on both, earlier finish on gpu0: [0, 2].
    # b, c: earliest start 2 on gpu0 for both (gpu1: 2 + 1 = 3); c has the larger level: gpu0 [2, 2 + 4].
    # b: gpu0 starts at 6, gpu1 at 2 + 1 = 3: gpu1 [3, 3 + 2].
    # d: gpu0 at max(6, 5 + 1) = 6, gpu1 at max(5, 6 + 1) = 7: gpu0 [6, 6 + 1].
    assert dev.tolist() == [0, 1, 0, 0]
    assert start.tolist() == [0, 2 + 1, 2, 6]
    assert finish.tolist() == [2, 2 + 1 + 2, 2 + 4, 6 + 1]


def test_m_etf_takes_the_earliest_start_even_on_a_slow_device():
    g = OpGraph.build(list("xyz"), [(0, 2, 1.0), (1, 2, 1.0)])
    dev, start, finish = list_schedule(g, star_cluster(GPU2), cost_model=TableCostModel([[1, 10], [1, 10], [1, 1]]))
    # x: gpu0 [0, 1] (start ties, earlier finish); y: gpu1 starts at 0 < 1 on gpu0: [0, 10]
    # z: gpu0 at max(1, 10 + 1) = 11, gpu1 at max(10, 1 + 1) = 10: gpu1 [10, 10 + 1]
    assert dev.tolist() == [0, 1, 1]
    assert start.tolist() == [0, 0, 10]
    assert finish.tolist() == [1, 10, 10 + 1]


def test_m_etf_skips_a_device_without_memory():
    # x -> y (1 byte), 1 s each anywhere, 6 bytes each (static footprints)
    g = OpGraph.build(list("xy"), [(0, 1, 1.0)], persistent_bytes=[6, 6], memory_mode="static")
    dev, start, finish = list_schedule(g, star_cluster(GPU2, memory=12), cost_model=ConstantCostModel(1.0))
    assert dev.tolist() == [0, 0] and finish.tolist() == [1, 1 + 1]  # y starts at 1 on gpu0, 1 + 1 on gpu1
    dev, start, finish = list_schedule(g, star_cluster(GPU2, memory=10), cost_model=ConstantCostModel(1.0))
    # 6 + 6 > 10: y may not join x on gpu0, so it waits for the transfer and runs on gpu1
    assert dev.tolist() == [0, 1] and finish.tolist() == [1, 1 + 1 + 1]


def test_m_etf_raises_when_nothing_fits():
    g = OpGraph.build(list("xyz"), [(0, 2, 1.0), (1, 2, 1.0)], persistent_bytes=[6, 6, 5], memory_mode="static")
    with pytest.raises(PlacementError, match="fits on no device"):
        list_schedule(g, star_cluster(GPU2, memory=10), cost_model=ConstantCostModel(1.0))


def test_sct_favourite_child_is_the_heavy_edge():
    # a -> b (10 bytes), a -> c (1 byte), every op 1 s: the LP keeps a -> b local (w = 1 + 1 + 1 = 3)
    g = OpGraph.build(list("abc"), [(0, 1, 10.0, 0), (0, 2, 1.0, 1)])
    fav = sct_favorites(g, star_cluster(GPU2), cost_model=ConstantCostModel(1.0))
    assert fav.tolist() == [1, -1, -1]
    dev, start, finish = list_schedule(g, star_cluster(GPU2), cost_model=ConstantCostModel(1.0), favorites=fav)
    # a gpu0 [0, 1]; b (favourite) right after on gpu0 [1, 1 + 1]; c starts at 2 on gpu0 (after b) and
    # at 1 + 1 = 2 on gpu1 (after the transfer): equal starts and finishes, so the lower id: gpu0 [2, 2 + 1]
    assert dev.tolist() == [0, 0, 0]
    assert finish.tolist() == [1, 1 + 1, 1 + 1 + 1]


# --------------------------------------------------------------------------- a graph that needs two GPUs
def too_big(memory_mode):
    # a chain of 6 ops of 30 persistent bytes each: 180 bytes, devices hold 100
    return OpGraph.build(
        [f"op{i}" for i in range(6)],
        [(i, i + 1, 1.0) for i in range(5)],
        persistent_bytes=[30] * 6,
        output_bytes=[1] * 6,
        memory_mode=memory_mode,
    )


@pytest.mark.parametrize("mode", ["live", "static"])
def test_single_reports_that_no_device_fits(mode):
    with pytest.raises(NoSingleDeviceFits, match="no single device fits"):
        place("single", too_big(mode), star_cluster(("cpu", "gpu", "gpu"), memory=100), cost_model=ConstantCostModel(1))


@pytest.mark.parametrize("name", ["m-topo", "m-etf", "m-sct", "metis"])
@pytest.mark.parametrize("mode", ["live", "static"])
def test_memory_aware_placers_split_a_graph_too_big_for_one_gpu(name, mode):
    g, cluster, cost = too_big(mode), star_cluster(("cpu", "gpu", "gpu"), memory=100), ConstantCostModel(1.0)
    dev = place(name, g, cluster, cost_model=cost)
    res = Simulator(g, cluster, cost_model=cost).evaluate(dev[None])
    assert not res.oom[0] and not res.failed[0]
    assert len(set(dev.tolist())) >= 2


def test_m_topo_fills_devices_in_order_up_to_an_equal_share():
    dev = place("m-topo", too_big("static"), star_cluster(("cpu", "gpu", "gpu"), memory=100))
    # share = 6 * 30 / 2 GPUs = 90: three ops per GPU
    assert dev.tolist() == [1, 1, 1, 2, 2, 2]


# --------------------------------------------------------------------------- the memory account
@st.composite
def instances(draw):
    n = draw(st.integers(1, 12))
    edges, size = [], {}
    for j in range(1, n):
        for i in draw(st.lists(st.integers(0, j - 1), max_size=3, unique=True)):
            slot = draw(st.integers(0, 1))
            edges.append((i, j, size.setdefault((i, slot), float(draw(st.integers(0, 6)))), slot))
    cpu_only = draw(st.lists(st.sampled_from([False, False, False, True]), min_size=n, max_size=n))
    coloc = draw(st.lists(st.integers(-1, 2), min_size=n, max_size=n))
    graph = OpGraph.build(
        [f"op{i}" for i in range(n)],
        edges,
        output_bytes=[float(draw(st.integers(0, 5))) for _ in range(n)],
        persistent_bytes=[float(draw(st.integers(0, 8))) for _ in range(n)],
        inplace=draw(st.lists(st.booleans(), min_size=n, max_size=n)),
        allowed_kinds=[["cpu"] if c else ["cpu", "gpu"] for c in cpu_only],
        colocation=coloc,
        memory_mode=draw(st.sampled_from(["live", "static"])),
    )
    memory = float(draw(st.integers(10, 60)))
    table = [[draw(st.sampled_from([0.0, 0.5, 1.0, 2.0])) for _ in range(3)] for _ in range(n)]
    return graph, star_cluster(("cpu", "gpu", "gpu"), memory=memory), TableCostModel(table)


def unit_bytes(graph):
    """Per colocation unit: (the most the placers' memory account can charge for it on any device, its
    persistent bytes, whether it may use a GPU). The most: its persistent bytes, in live mode plus its
    outputs (in-place ones excepted) and every distinct tensor it reads from outside the unit."""
    from postplace.cluster.placement import colocation_representative

    rep = colocation_representative(graph)
    gpu_ok = (graph.allowed_kinds & 2) != 0
    out = []
    for r in np.unique(rep):
        members = np.flatnonzero(rep == r)
        charge = persistent = float(graph.persistent_bytes[members].sum())
        if graph.memory_mode == "live":
            charge += float(np.where(graph.inplace, 0.0, graph.output_bytes)[members].sum())
            read = {
                (int(graph.edge_src[e]), int(graph.edge_slot[e])): float(graph.edge_bytes[e])
                for e in range(graph.num_edges)
                if rep[graph.edge_dst[e]] == r and rep[graph.edge_src[e]] != r
            }
            charge += sum(read.values())
        out.append((charge, persistent, bool(gpu_ok[members].all())))
    return out


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(instances(), st.sampled_from(["m-topo", "m-etf", "m-sct"]), st.sampled_from(["checked", "conservative"]))
def test_memory_aware_placements_are_feasible_in_the_simulator(inst, name, memory):
    """Two capacities per instance where the answer is known beforehand. (1) The least with which a
    placement under the guaranteed account cannot get stuck: CPU-only units all fit the CPU, and the GPU
    units (which these placers put on the two GPUs only) total T with the largest c, T + c <= 2 x capacity
    (a unit that fits neither GPU would leave both above capacity - c, so T - c > 2 (capacity - c)): the
    placer must return a placement, and it must fit. (2) Below the largest unit's persistent bytes (what
    it holds on any device, whatever is freed): the placer must raise."""
    graph, _, cost = inst
    units = unit_bytes(graph)
    gpu = [c for c, _, ok in units if ok]
    need = max(sum(c for c, _, ok in units if not ok), (sum(gpu) + max(gpu, default=0.0)) / 2, 1.0)
    cluster = star_cluster(("cpu", "gpu", "gpu"), memory=need)
    dev = place(name, graph, cluster, cost_model=cost, memory=memory)
    assert invalid_reason(graph, cluster, dev) is None
    res = Simulator(graph, cluster, cost_model=cost).evaluate(dev[None])
    assert not res.oom[0]
    assert np.all(res.peak_mem[0] <= memory_account(graph, cluster, dev) + 1e-9)
    if memory == "conservative":  # the guaranteed account itself fits
        assert np.all(memory_account(graph, cluster, dev) <= cluster.capacity)
    largest = max(p for _, p, _ in units)
    if largest > 0:
        with pytest.raises(PlacementError, match="fits on no device"):
            place(name, graph, star_cluster(("cpu", "gpu", "gpu"), memory=largest / 2), cost_model=cost, memory=memory)


@pytest.mark.parametrize("name", ["m-topo", "m-etf", "m-sct"])
def test_checked_memory_places_a_long_live_graph_the_guarantee_cannot(name):
    # a chain of 10 ops with 30-byte outputs: at most two are live at once (60 <= 100 bytes), but the
    # guaranteed account (every output kept) needs 10 * 30 = 300 > 2 GPUs * 100
    g = OpGraph.build([f"op{i}" for i in range(10)], [(i, i + 1, 30.0) for i in range(9)], output_bytes=[30] * 10)
    cluster, cost = star_cluster(GPU2, memory=100), ConstantCostModel(1.0)
    with pytest.raises(PlacementError, match="does not fit"):
        place(name, g, cluster, cost_model=cost, memory="conservative")
    dev = place(name, g, cluster, cost_model=cost)
    assert not Simulator(g, cluster, cost_model=cost).evaluate(dev[None]).oom[0]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(instances(), st.integers(0, 2**31))
def test_memory_account_never_under_counts_the_simulator(inst, seed):
    graph, cluster, cost = inst
    rng = np.random.default_rng(seed)
    dev = place("cpu", graph, cluster)
    gpu_ok = (graph.allowed_kinds & 2) != 0
    for members in [np.array([i]) for i in range(graph.num_ops) if graph.colocation[i] < 0] + graph.colocation_sets:
        if gpu_ok[members].all():
            dev[members] = rng.integers(0, 3)
    res = Simulator(graph, cluster, cost_model=cost).evaluate(dev[None])
    account = memory_account(graph, cluster, dev)
    assert np.all(res.peak_mem[0] <= account + 1e-9)
    if graph.memory_mode == "static":
        np.testing.assert_allclose(res.peak_mem[0], account)


# --------------------------------------------------------------------------- data parallelism
def test_data_parallel_step_time_is_the_formula():
    # f -> b -> u; u is the update op holding 100 bytes of parameters; 2 GPUs, no CPU
    g = OpGraph.build(
        list("fbu"),
        [(0, 1, 4.0), (1, 2, 4.0)],
        phase=["forward", "backward", "update"],
        persistent_bytes=[0, 0, 100],
        output_bytes=[4, 4, 0],
    )
    cluster = star_cluster(GPU2, bandwidth=10.0, latency=0.5)
    r = data_parallel_step_time(g, cluster, cost_model=TableCostModel([[1, 1], [2, 2], [3, 3]]))
    assert r.compute_time == (1 + 2 + 3) / 2
    # ring gpu0 -> gpu1 -> gpu0; each hop crosses 2 links (0.5 s latency each) and moves 100 / 2 bytes
    # at 10 bytes/s; 2 (k - 1) = 2 steps
    assert r.allreduce_time == pytest.approx(2 * (2 - 1) * ((0.5 + 0.5) + (100 / 2) / 10))
    assert r.step_time == pytest.approx(r.compute_time + r.allreduce_time)
    assert r.gradient_bytes == 100 and r.gradient_source == "update-phase ops"
    # memory: parameters replicated whole, the single-device activation peak halved
    assert r.peak_mem.tolist() == pytest.approx([100 + (100 + 4 + 4 - 100) / 2] * 2)
    assert not r.oom and r.gpus == ("gpu0", "gpu1")


def test_data_parallel_does_not_scale_the_launch_overhead():
    gpu = Device("gpu0", "gpu", "G", peak_flops=1e3, memory_bandwidth=1e12, memory=1e9, launch_overhead=0.25)
    devices = (
        gpu,
        Device(
            "gpu1",
            *[
                getattr(gpu, f)
                for f in ("kind", "model", "peak_flops", "memory_bandwidth", "memory", "launch_overhead")
            ],
        ),
    )
    cluster = Cluster("t", devices, ("hub",), (Link("gpu0", "hub", 1e3, 0.0), Link("gpu1", "hub", 1e3, 0.0)))
    g = OpGraph.build(["a", "b"], [(0, 1)], flops=[1e3, 2e3], phase=["forward", "update"], persistent_bytes=[0, 1e3])
    r = data_parallel_step_time(g, cluster, cost_model=RooflineCostModel(update="traced"))
    # roofline, the update as traced: a 1 s, b 2 s of work + 0.25 s launch each; the work halves, the launch does not
    assert r.compute_time == pytest.approx((1 / 2 + 0.25) + (2 / 2 + 0.25))
    assert r.allreduce_time == pytest.approx(2 * (2 - 1) * (1e3 / 2) / 1e3)


def test_data_parallel_reports_oom_and_needs_a_gpu():
    g = OpGraph.build(["a"], persistent_bytes=[500], phase=["update"])
    assert data_parallel_step_time(g, star_cluster(GPU2, memory=100), cost_model=ConstantCostModel(1.0)).oom
    with pytest.raises(PlacementError, match="no GPU"):
        data_parallel_step_time(g, star_cluster(("cpu",)), cost_model=ConstantCostModel(1.0))


# --------------------------------------------------------------------------- expert, by names and by work
def test_expert_more_layers_than_gpus_share_consecutively():
    # 4 LSTM layers on 2 GPUs: layers 0, 1 on gpu0 and 2, 3 on gpu1; embedding and softmax follow the ends
    names = ["embedding", "lstm_0", "lstm_1", "lstm_2", "lstm_3", "softmax"]
    g = OpGraph.build(names, [(i, i + 1) for i in range(5)])
    dev = place_expert(g, star_cluster(("cpu", "gpu", "gpu")), cost_model=ConstantCostModel(1.0))
    assert dev.tolist() == [1, 1, 1, 2, 2, 2]


def test_expert_splits_unnamed_layers_evenly_by_work_and_backward_follows_forward():
    # forward f0..f3 (1 s each), backward b3..b0 colocated with their forward op; 2 GPUs
    names = ["f0", "f1", "f2", "f3", "b3", "b2", "b1", "b0"]
    g = OpGraph.build(
        names,
        [(i, i + 1) for i in range(7)],
        phase=["forward"] * 4 + ["backward"] * 4,
        colocation=[0, 1, 2, 3, 3, 2, 1, 0],
    )
    dev = place_expert(g, star_cluster(GPU2), cost_model=ConstantCostModel(1.0))
    # unit work 2 s each (forward + backward); middles at 1, 3, 5, 7 of 8: shares 0, 0, 1, 1
    assert dev.tolist() == [0, 0, 1, 1, 1, 1, 0, 0]


def test_placers_accept_empty_and_one_op_graphs():
    for n in (0, 1):
        g = OpGraph.build([f"op{i}" for i in range(n)])
        for name in PLACERS:
            dev = place(name, g, star_cluster(), cost_model=ConstantCostModel(1.0))
            assert dev.shape == (n,) and invalid_reason(g, star_cluster(), dev) is None


@pytest.mark.parametrize("module", ["__init__", "single", "heft", "baechi", "metis", "expert", "data_parallel"])
def test_docstring_examples(module):
    import doctest
    import importlib

    mod = importlib.import_module("postplace.placers" + ("" if module == "__init__" else f".{module}"))
    result = doctest.testmod(mod)
    assert result.attempted > 0 and result.failed == 0


def test_unit_bytes_measure_the_peak_on_the_fastest_device_that_runs_every_shared_op():
    """A CPU-only op and a GPU-only op beside ops both kinds run: the peak that scales the units' bytes is
    taken on the device fastest at the shared ops (a K80 die here), not on one an op of one kind rules out;
    and a GPU priced at inf for the shared ops (no units for their precision) is never that device."""
    import numpy as np

    from postplace.cluster import load_cluster
    from postplace.graph import OpGraph
    from postplace.search.problem import _unit_bytes

    g = OpGraph.build(
        ["host", "a", "b", "dev"],
        [(0, 1, 1e6), (1, 2, 1e6), (2, 3, 1e6)],
        flops=[1e6, 5e10, 5e10, 1e9],
        allowed_kinds=["cpu", ["cpu", "gpu"], ["cpu", "gpu"], "gpu"],
    )
    c = load_cluster("k80x2")  # cpu, gpu0, gpu1

    class Sim:
        def evaluate_ops(self, placements):
            self.dev = placements[0]
            return type("R", (), {"peak_mem": np.ones((1, c.num_devices))})()

    kinds = np.asarray(g.allowed_kinds, dtype=np.int64)
    times = np.array([[1e-3, np.inf, np.inf], [1.0, 0.02, 0.02], [1.0, 0.02, 0.02], [np.inf, 0.01, 0.01]])
    sim = Sim()
    _unit_bytes(g, c, sim, times, kinds, np.arange(4), 4)
    assert sim.dev.tolist() == [0, 1, 1, 1]  # gpu0 for every op a GPU may run, the host op on the CPU
    times[1:3, 1] = np.inf  # gpu0 cannot compute the shared ops: gpu1 is the fastest that can
    _unit_bytes(g, c, sim, times, kinds, np.arange(4), 4)
    assert sim.dev.tolist() == [0, 2, 2, 2]
