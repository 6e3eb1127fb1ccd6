"""Collective ops: the graph fields, the timing model on the presets, and the simulator's semantics.

Every expected duration is written as the sum that gives it, from the preset's TOML: dgx8 GPUs reach
the NVSwitch over 450 GB/s, 2 us links (4 us GPU to GPU); k80x4 dies sit on 15.75 GB/s PCIe, 5 us to
their board switch and 1 us from it to the host (10 us on one board, 12 us across); dgx8x2 adds a
50 GB/s, 2.5 us NIC link per GPU to the InfiniBand switch (5 us node to node). Device 0 is the CPU.
"""

import json

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from postplace.cluster import Cluster, Device, Link, load_cluster
from postplace.graph import COLLECTIVE_KINDS, Collective, GraphError, OpGraph
from postplace.sim import Simulator, failure_step_time, lower_bound, reference
from postplace.sim.collectives import collective_cost
from postplace.sim.trace import memory_over_time
from postplace.testing import TableCostModel, star_cluster
from tests.simhelp import schedule_both

S = 1.8e9  # bytes: divides evenly by 2, 4, 8 and 16
NV, NV_LAT = 4.5e11, 2e-6 + 2e-6  # dgx8 GPU to GPU over the NVSwitch
PCIE = 1.575e10  # k80x4
BOARD_LAT, CROSS_LAT = 5e-6 + 5e-6, 5e-6 + 1e-6 + 1e-6 + 5e-6  # k80x4: one board, across boards
IB, IB_LAT = 5e10, 2.5e-6 + 2.5e-6  # dgx8x2 node to node


@pytest.fixture(scope="module")
def dgx8():
    return load_cluster("dgx8")


@pytest.fixture(scope="module")
def k80x4():
    return load_cluster("k80x4")


@pytest.fixture(scope="module")
def dgx8x2():
    return load_cluster("dgx8x2")


def seconds(cluster, kind, members, nbytes=S):
    return collective_cost(cluster, kind, nbytes, tuple(members)).seconds


# ----------------------------------------------------------------------------- the timing model
def test_ring_of_four_on_nvswitch(dgx8):
    gpus = (1, 2, 3, 4)
    assert seconds(dgx8, "all_reduce", gpus) == pytest.approx(2 * 3 * (NV_LAT + S / 4 / NV), rel=1e-12)
    assert seconds(dgx8, "reduce_scatter", gpus) == pytest.approx(3 * (NV_LAT + S / 4 / NV), rel=1e-12)
    assert seconds(dgx8, "all_gather", gpus) == pytest.approx(3 * (NV_LAT + S / 4 / NV), rel=1e-12)
    assert seconds(dgx8, "broadcast", gpus) == pytest.approx(3 * NV_LAT + S / NV, rel=1e-12)
    cost = collective_cost(dgx8, "all_reduce", S, gpus)
    assert cost.wire_bytes == pytest.approx(4 * 2 * 3 / 4 * S, rel=1e-12)
    assert collective_cost(dgx8, "reduce_scatter", S, gpus).wire_bytes == pytest.approx(3 * S, rel=1e-12)
    assert collective_cost(dgx8, "broadcast", S, gpus).wire_bytes == pytest.approx(3 * S, rel=1e-12)


def test_resources_are_every_route_of_the_ring(dgx8):
    D = dgx8.num_devices
    ptr, res = dgx8.route_ptr, dgx8.route_resources
    ring = [(1, 2), (2, 3), (3, 1)]
    expected = sorted({int(r) for a, b in ring for r in res[ptr[a * D + b] : ptr[a * D + b + 1]]})
    assert list(collective_cost(dgx8, "all_gather", S, (1, 2, 3)).resources) == expected
    # egress and ingress of every member, and both directions of each member's NVLink
    assert len(expected) == 3 + 3 + 2 * 3


def test_one_member_costs_nothing(dgx8):
    assert collective_cost(dgx8, "all_reduce", S, (3,)) == collective_cost(dgx8, "broadcast", 0.0, (5,))
    assert collective_cost(dgx8, "all_reduce", S, (3,)).seconds == 0.0
    assert collective_cost(dgx8, "all_reduce", S, (3,)).resources == ()


def test_rings_on_pcie_count_shared_link_directions(k80x4):
    # two dies of one board: each direction of each die's link carries one pair
    assert seconds(k80x4, "all_reduce", (1, 2)) == pytest.approx(2 * (BOARD_LAT + S / 2 / PCIE), rel=1e-12)
    # across boards: gpu0 -> gpu2 goes up board0's uplink, gpu2 -> gpu0 down it: still one pair each
    assert seconds(k80x4, "all_reduce", (1, 3)) == pytest.approx(2 * (CROSS_LAT + S / 2 / PCIE), rel=1e-12)
    # gpu0 -> gpu1 -> gpu2 -> gpu3 -> gpu0: each uplink direction carries one pair; steps are set by the
    # cross-board pairs' 12 us
    assert seconds(k80x4, "all_reduce", (1, 2, 3, 4)) == pytest.approx(6 * (CROSS_LAT + S / 4 / PCIE), rel=1e-12)
    assert seconds(k80x4, "reduce_scatter", (1, 2, 3, 4)) == pytest.approx(3 * (CROSS_LAT + S / 4 / PCIE), rel=1e-12)
    # gpu0 -> gpu2 -> gpu1 -> gpu3 -> gpu0: every pair crosses, and each uplink direction carries two pairs
    # (board0 -> host: gpu0 -> gpu2 and gpu1 -> gpu3), so every pair gets half the bandwidth
    assert seconds(k80x4, "all_reduce", (1, 3, 2, 4)) == pytest.approx(6 * (CROSS_LAT + S / 4 / (PCIE / 2)), rel=1e-12)
    assert seconds(k80x4, "all_gather", (1, 3, 2, 4)) == pytest.approx(3 * (CROSS_LAT + S / 4 / (PCIE / 2)), rel=1e-12)
    # the broadcast chain gpu0 -> gpu2 -> gpu1 -> gpu3 has no wrap-around pair, but board0 -> host still
    # carries two of its pairs
    assert seconds(k80x4, "broadcast", (1, 3, 2, 4)) == pytest.approx(3 * CROSS_LAT + S / (PCIE / 2), rel=1e-12)


def test_hierarchical_all_reduce_over_two_nodes(dgx8x2):
    gpus = tuple(range(1, 17))  # node 0: gpu0..gpu7, node 1: gpu8..gpu15
    inside = 7 * (NV_LAT + S / 8 / NV)  # a reduce-scatter (or all-gather) of S in each node at once
    across = 2 * (IB_LAT + S / 8 / 2 / IB)  # 8 rings of 2 all-reduce S / 8, each GPU on its own NIC
    assert seconds(dgx8x2, "all_reduce", gpus) == pytest.approx(inside + across + inside, rel=1e-12)
    assert seconds(dgx8x2, "reduce_scatter", gpus) == pytest.approx(inside + 1 * (IB_LAT + S / 8 / 2 / IB), rel=1e-12)
    assert seconds(dgx8x2, "all_gather", gpus) == pytest.approx(1 * (IB_LAT + S / 8 / 2 / IB) + inside, rel=1e-12)
    # bytes: each node's 8 GPUs send 7 chunks of S / 8 twice (reduce-scatter, all-gather), and the 8 rings
    # across send 2 x 2 steps of S / 16
    wire = 2 * (2 * 8 * 7 * S / 8) + 8 * 2 * 2 * S / 16
    assert collective_cost(dgx8x2, "all_reduce", S, gpus).wire_bytes == pytest.approx(wire, rel=1e-12)
    # a broadcast stays a flat ring: the 15-pair chain, bottlenecked by the NIC of gpu7 -> gpu8
    assert seconds(dgx8x2, "broadcast", gpus) == pytest.approx(15 * IB_LAT + S / IB, rel=1e-12)


def test_hierarchical_ranks_interleaved_across_nodes(dgx8x2):
    # ranks gpu0, gpu8, gpu1, gpu9: islands (gpu0, gpu1) and (gpu8, gpu9); rings across: gpu0-gpu8, gpu1-gpu9
    got = seconds(dgx8x2, "all_reduce", (1, 9, 2, 10))
    inside = 1 * (NV_LAT + S / 2 / NV)
    assert got == pytest.approx(inside + 2 * (IB_LAT + S / 2 / 2 / IB) + inside, rel=1e-12)


def test_unequal_islands_use_a_flat_ring(dgx8x2):
    # gpu0, gpu1, gpu2 in node 0 and gpu8 in node 1: gpu2 -> gpu8 and gpu8 -> gpu0 cross the NICs
    assert seconds(dgx8x2, "all_reduce", (1, 2, 3, 9)) == pytest.approx(6 * (IB_LAT + S / 4 / IB), rel=1e-12)
    # the CPU with GPUs of one node: an island of 1 (the CPU) and one of 2: flat ring over PCIe, where
    # cpu <-> gpu0 goes through gpu0's 63 GB/s PCIe switch link, the slowest on the ring
    pcie_lat = 5e-6 + 1e-6 + 0.0
    assert seconds(dgx8x2, "reduce_scatter", (0, 1, 2)) == pytest.approx(2 * (pcie_lat + S / 3 / 6.3e10), rel=1e-12)


def test_cost_refuses_bad_members(dgx8):
    with pytest.raises(ValueError, match="twice"):
        collective_cost(dgx8, "all_reduce", S, (1, 1))
    with pytest.raises(ValueError, match="not one of"):
        collective_cost(dgx8, "all_to_all", S, (1, 2))


# ----------------------------------------------------------------------------- the simulator
def reduce_graph(k, *, kind="all_reduce", nbytes=S, out=0.0, static=False):
    """k producers -> one collective of k members -> k consumers; rank r's ops are p{r}, m{r}, c{r}."""
    names = [f"p{r}" for r in range(k)] + [f"m{r}" for r in range(k)] + [f"c{r}" for r in range(k)]
    edges = [(r, k + r, nbytes) for r in range(k)] + [(k + r, 2 * k + r, nbytes) for r in range(k)]
    return OpGraph.build(
        names,
        edges,
        output_bytes=[nbytes] * k + [out] * k + [0.0] * k,
        persistent_bytes=[1.0] * 3 * k if static else None,
        memory_mode="static" if static else "live",
        collective=[-1] * k + [0] * k + [-1] * k,
        collectives=[Collective(kind, nbytes, "grads")],
    )


def times(graph, cluster, per_op):
    """A cost table: op i takes per_op[i] seconds on every device."""
    return TableCostModel(np.repeat(np.asarray(per_op, dtype=float)[:, None], cluster.num_devices, axis=1))


def test_step_is_producer_then_collective_then_consumer(dgx8):
    g = reduce_graph(4)
    cost = times(g, dgx8, [1e-3] * 4 + [7.0] * 4 + [2e-3] * 4)  # a member's own time never counts
    sim, s = schedule_both(g, dgx8, cost, [1, 2, 3, 4] * 3)
    coll = 2 * 3 * (NV_LAT + S / 4 / NV)
    assert s.step_time == pytest.approx(1e-3 + coll + 2e-3, rel=1e-12)
    name, kind, start, end, devices, wire = s.collectives[0]
    assert (name, kind, start, devices) == ("grads", "all_reduce", 1e-3, (1, 2, 3, 4))
    assert end == pytest.approx(1e-3 + coll, rel=1e-12)
    assert list(s.op_start[4:8]) == [start] * 4 and list(s.op_end[4:8]) == [end] * 4
    assert list(s.busy[1:5]) == [1e-3 + 2e-3] * 4  # members add nothing to busy time
    r = sim.evaluate(np.array([[1, 2, 3, 4] * 3]))
    assert r.bytes_moved[0] == wire == pytest.approx(2 * 3 * S, rel=1e-12)  # no point-to-point transfer
    assert set(r.extra["collective_bytes"]) == {"all_reduce"}
    assert r.extra["collective_bytes"]["all_reduce"][0] == wire
    trace = s.chrome_trace()["traceEvents"]
    assert sum(1 for e in trace if e.get("cat") == "collective") == 4  # one per member device


def test_a_late_member_delays_the_collective(dgx8):
    g = reduce_graph(4)
    cost = times(g, dgx8, [1e-3, 5e-3, 1e-3, 1e-3] + [0.0] * 4 + [2e-3] * 4)
    _, s = schedule_both(g, dgx8, cost, [1, 2, 3, 4] * 3)
    coll = 2 * 3 * (NV_LAT + S / 4 / NV)
    assert s.collectives[0][2] == 5e-3
    assert s.step_time == pytest.approx(5e-3 + coll + 2e-3, rel=1e-12)


def test_the_collective_waits_for_a_transfer_holding_its_links(dgx8):
    # x on gpu0 sends T bytes to y on gpu1 at time 0, holding gpu0's egress and NVLink up, gpu1's down
    # and ingress until 4 us + T / 450 GB/s, longer than the producers take
    T = 9e9
    k = 4
    base = reduce_graph(k)
    names = ["x", "y", *base.names]
    pairs = zip(base.edge_src, base.edge_dst, base.edge_bytes, strict=True)
    edges = [(0, 1, T)] + [(s + 2, d + 2, b) for s, d, b in pairs]
    g = OpGraph.build(
        names,
        edges,
        output_bytes=[T, 0.0, *base.output_bytes],
        collective=[-1, -1, *base.collective],
        collectives=base.collectives,
    )
    cost = times(g, dgx8, [0.0, 0.0] + [1e-3] * k + [0.0] * k + [2e-3] * k)
    _, s = schedule_both(g, dgx8, cost, [1, 2] + [1, 2, 3, 4] * 3)
    x_end = NV_LAT + T / NV
    assert s.transfers[0][6] == x_end > 1e-3
    coll = 2 * 3 * (NV_LAT + S / 4 / NV)
    assert s.collectives[0][2] == x_end
    assert s.step_time == pytest.approx(x_end + coll + 2e-3, rel=1e-12)


def test_a_ring_of_sends_takes_as_long_as_the_collective(dgx8):
    """The ring all-reduce written out as 2 (k - 1) rounds of point-to-point sends of S / k between
    zero-cost relay ops (each also waits for its own device's previous round) on dgx8's uniform links."""
    k, rounds = 4, 2 * (4 - 1)
    names, edges, dev = [], [], []
    for r in range(rounds + 1):
        for i in range(k):
            names.append(f"r{r}_{i}")
            dev.append(1 + i)
            if r:
                me, left = r * k + i, (r - 1) * k + (i - 1) % k
                edges.append((left, me, S / k, 0))
                edges.append((me - k, me, 0.0, 1))  # the previous round on this device (slot 1: no bytes)
    sends = OpGraph.build(names, edges)
    _, s = schedule_both(sends, dgx8, times(sends, dgx8, [0.0] * len(names)), dev)
    coll = OpGraph.build([f"m{i}" for i in range(k)], collective=[0] * k, collectives=[Collective("all_reduce", S)])
    _, c = schedule_both(coll, dgx8, times(coll, dgx8, [0.0] * k), [1, 2, 3, 4])
    assert len(s.transfers) == rounds * k
    assert c.step_time == pytest.approx(s.step_time, rel=1e-12)
    assert c.step_time == pytest.approx(rounds * (NV_LAT + S / k / NV), rel=1e-12)


def test_a_members_output_lives_from_the_collective_start(dgx8):
    # rank r: p (output P) -> m (output M, an all-reduce member) -> c. x on gpu0 first sends T bytes to y on
    # gpu2, holding gpu0's egress and NVLink up, so the collective over gpu0, gpu1 waits for it
    P, M, T = 1e9, 12e9, 9e9
    names = ["x", "y", "p0", "p1", "m0", "m1", "c0", "c1"]
    edges = [(0, 1, T), (2, 4, P), (3, 5, P), (4, 6, M), (5, 7, M)]
    g = OpGraph.build(
        names,
        edges,
        output_bytes=[T, 0.0, P, P, M, M, 0.0, 0.0],
        collective=[-1] * 4 + [0, 0] + [-1] * 2,
        collectives=[Collective("all_reduce", M)],
    )
    dev = [1, 3, 1, 2, 1, 2, 1, 2]
    sim, s = schedule_both(g, dgx8, times(g, dgx8, [0.0, 0.0, 1e-3, 1e-3, 0.0, 0.0, 1e-3, 1e-3]), dev)
    start, end = s.collectives[0][2], s.collectives[0][3]
    assert start == NV_LAT + T / NV > 1e-3  # the members arrived at 1 ms; x's transfer held the links
    steps = memory_over_time(sim.problem, np.array(dev))

    def at(d, t):  # bytes held on device d from time t on
        when, held = steps[d]
        return held[np.searchsorted(when, t, side="right") - 1]

    assert (at(1, 1e-3), at(2, 1e-3)) == (T + P, P)  # x's tensor until its send ends, p's until m ends
    assert (at(1, start), at(2, start)) == (P + M, P + M)  # x's send ended, then the members allocated
    assert (at(1, end), at(2, end)) == (M, M)  # the members ended: p's outputs freed, m's live until c ends
    assert (at(1, end + 1e-3), at(2, end + 1e-3)) == (0.0, 0.0)
    assert list(s.peak_memory[1:3]) == [P + M, P + M]


def test_static_memory_members_hold_only_their_footprint(dgx8):
    g = reduce_graph(2, static=True)
    _, s = schedule_both(g, dgx8, times(g, dgx8, [1e-3] * 6), [1, 2] * 3)
    assert list(s.peak_memory[1:3]) == [3.0, 3.0]


def test_two_members_on_one_device_fail_with_a_reason(dgx8):
    g = reduce_graph(2)
    sim = Simulator(g, dgx8)
    r = sim.evaluate(np.array([[1, 2, 1, 2, 1, 2], [1, 2, 1, 1, 1, 2]]))
    assert r.failed.tolist() == [False, True]
    assert r.reasons[1] == (
        "collective 'grads' (all_reduce) has members 'm0' and 'm1' both on gpu0; "
        "put each member of a collective on its own device"
    )
    with pytest.raises(ValueError, match="'m0' and 'm1' both on gpu0"):
        sim.schedule(np.array([1, 2, 1, 1, 1, 2]))


def test_bounds_treat_collectives_as_free_and_failure_as_above(dgx8):
    g = reduce_graph(4)
    cost = times(g, dgx8, [1e-3] * 4 + [5.0] * 4 + [2e-3] * 4)
    sim = Simulator(g, dgx8, cost_model=cost)
    assert sim.lower_bound == pytest.approx(1e-3 + 2e-3)
    worst = sim.evaluate(np.array([[0, 0, 0, 0, 0, 1, 5, 8, 0, 0, 0, 0]])).step_time[0]
    assert worst < sim.failure_step_time


# ----------------------------------------------------------------------------- the graph
def test_graph_fields_round_trip_and_stay_read_only(tmp_path):
    g = reduce_graph(3, kind="reduce_scatter")
    g.save(tmp_path / "g.json")
    back = OpGraph.load(tmp_path / "g.json")
    assert back.collective.tolist() == g.collective.tolist()
    assert back.collectives == (Collective("reduce_scatter", S, "grads"),)
    assert not g.collective.flags.writeable
    plain = OpGraph.build(["a", "b"], [(0, 1, 1.0)])
    assert "collectives" not in plain.to_dict() and "collective" not in plain.to_dict()["ops"]
    assert plain.collective.tolist() == [-1, -1] and plain.collectives == ()


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        ({"collective": [0, 2, -1]}, "op 'b' field 'collective' is 2; use -1 for an ordinary op or 0..0"),
        ({"collective": [0, -3, -1]}, "op 'b' field 'collective' is -3"),
        ({"collectives": [Collective("all_to_all", 1.0)]}, "collective 0 has kind 'all_to_all'; use one of"),
        ({"collectives": [Collective("all_reduce", -1.0)]}, "collective 0 field 'nbytes' is -1.0; it must be a finite"),
        ({"collectives": [Collective("all_reduce", float("inf"))]}, "collective 0 field 'nbytes' is inf"),
        ({"collectives": [Collective("all_reduce", 2e18)]}, "above the bound of 1e+18 bytes"),
        (
            {"collectives": [Collective("all_reduce", 1.0), Collective("broadcast", 1.0, "b")]},
            "collective 1 ('b') has no member ops",
        ),
        ({"collective": [0, -1, 0]}, "a collective waits on its own members: b -> collective 0 -> b"),
        ({"collective": [0, 0, -1]}, "collective 0 member 'a' feeds its fellow member 'b'"),
    ],
)
def test_validate_names_the_broken_collective(kw, message):
    args = {"collective": [0, -1, -1], "collectives": [Collective("all_reduce", 1.0)], **kw}
    with pytest.raises(GraphError, match="^graph 'graph': ") as err:
        OpGraph.build(["a", "b", "c"], [(0, 1, 1.0), (1, 2, 1.0)], **args)
    assert message in str(err.value)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda d: d["collectives"][0].update(kind="gossip"), "collectives[0].kind is 'gossip'"),
        (lambda d: d["collectives"][0].update(nbytes="8"), "collectives[0].nbytes must be a number"),
        (lambda d: d["collectives"][0].pop("nbytes"), "missing field 'nbytes'"),
        (lambda d: d.update(collectives={}), "field 'collectives' must be a list"),
        (lambda d: d["ops"]["collective"].__setitem__(0, 0.5), "field 'ops.collective[0]'"),
        (lambda d: d["ops"].update(collective=[0]), "field 'ops.collective' must be a list of 6 entries"),
    ],
)
def test_load_checks_the_collective_fields(tmp_path, change, message):
    d = json.loads(json.dumps(reduce_graph(2).to_dict()))
    change(d)
    (tmp_path / "g.json").write_text(json.dumps(d))
    with pytest.raises(GraphError, match="g.json") as err:
        OpGraph.load(tmp_path / "g.json")
    assert message in str(err.value)
    assert "\n" not in str(err.value)


# ----------------------------------------------------------------------------- properties
def two_nodes(fast, slow):
    """gpu0, gpu1 on switch n0 and gpu2, gpu3 on switch n1 (links of ``fast`` bytes/s), the switches
    joined by one ``slow`` link, and a cpu on n0 over ``slow`` too."""
    kinds = ["cpu", "gpu", "gpu", "gpu", "gpu"]
    names = ["cpu", "gpu0", "gpu1", "gpu2", "gpu3"]
    devices = tuple(Device(n, k, k, 1e12, 1e12, 1e12, 0.0) for n, k in zip(names, kinds, strict=True))
    links = [Link("cpu", "n0", slow, 0.125), Link("n0", "n1", slow, 0.25)]
    links += [Link(g, "n0" if i < 2 else "n1", fast, 0.0) for i, g in enumerate(names[1:])]
    return Cluster("two-nodes", devices, ("n0", "n1"), tuple(links))


@st.composite
def collective_instances(draw):
    cluster = draw(
        st.sampled_from(
            [
                star_cluster(
                    ("cpu", "gpu", "gpu", "gpu"), bandwidth=1.0, latency=0.125, shared={"sw": ["gpu0", "gpu1"]}
                ),
                star_cluster(("gpu", "gpu", "gpu"), bandwidth=4.0),
                two_nodes(4.0, 1.0),
            ]
        )
    )
    D = cluster.num_devices
    n_target = draw(st.integers(2, 16))
    names, edges, coll_of, collectives, placement = [], [], [], [], []
    size = {}
    while len(names) < n_target:
        j0 = len(names)
        k = draw(st.integers(1, min(4, D))) if j0 and draw(st.booleans()) else 0
        block = max(k, 1)
        for j in range(j0, j0 + block):  # a collective's members only read ops before the block
            for i in draw(st.lists(st.integers(0, j0 - 1), max_size=3, unique=True)) if j0 else []:
                slot = draw(st.integers(0, 1))
                b = size.setdefault((i, slot), float(draw(st.integers(0, 6))) + slot * 0.5)
                edges.append((i, j, b, slot))
            names.append(f"op{j}")
        if k:
            coll_of += [len(collectives)] * k
            collectives.append(Collective(draw(st.sampled_from(COLLECTIVE_KINDS)), float(draw(st.integers(0, 8)))))
            placement += draw(st.permutations(range(D)))[:k]
        else:
            coll_of.append(-1)
            placement.append(draw(st.integers(0, D - 1)))
    n = len(names)
    live = draw(st.booleans())
    graph = OpGraph.build(
        names,
        edges,
        output_bytes=[float(draw(st.integers(0, 5))) for _ in range(n)],
        persistent_bytes=[float(draw(st.integers(0, 3))) for _ in range(n)],
        inplace=[draw(st.booleans()) and c < 0 for c in coll_of],
        memory_mode="live" if live else "static",
        collective=coll_of,
        collectives=collectives,
    )
    table = np.array([[draw(st.sampled_from([0.0, 0.5, 1.0, 2.0])) for _ in range(D)] for _ in range(n)])
    return graph, cluster, TableCostModel(table), np.array(placement)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(collective_instances())
def test_kernel_and_reference_agree_and_collectives_respect_their_bounds(inst):
    graph, cluster, cost, placement = inst
    assume(graph.collectives)
    sim, s = schedule_both(graph, cluster, cost, placement)
    ref = reference.simulate(sim.problem, placement)
    assert [(c[2], c[3], c[5]) for c in s.collectives] == [(c[1], c[2], c[3]) for c in ref.collectives]
    r = sim.evaluate(placement[None, :])
    assert r.bytes_moved[0] == ref.bytes_moved == s.bytes_moved
    assert r.step_time[0] == s.step_time
    np.testing.assert_array_equal(r.peak_mem[0], s.peak_memory)
    arrival = {(x[0], x[1], x[3]): x[6] for x in s.transfers}
    fastest = max(link.bandwidth for link in cluster.links)
    for c, coll in enumerate(graph.collectives):
        members = np.flatnonzero(graph.collective == c)
        k = len(members)
        latest = 0.0
        for e in range(graph.num_edges):
            i, j = graph.edge_src[e], graph.edge_dst[e]
            if j in members:
                same = placement[i] == placement[j]
                latest = max(latest, s.op_end[i] if same else arrival[(i, graph.edge_slot[e], placement[j])])
        share = {"all_reduce": 2 * (k - 1) / k, "broadcast": 1.0 if k > 1 else 0.0}.get(coll.kind, (k - 1) / k)
        assert s.collectives[c][3] >= latest + share * coll.nbytes / fastest * (1 - 1e-12)
        assert s.collectives[c][2] >= latest
    assert s.step_time >= lower_bound(sim.problem) * (1 - 1e-9)
    assert s.step_time < failure_step_time(sim.problem)
