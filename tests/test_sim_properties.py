"""Properties of the simulator on random DAGs, clusters and placements (hypothesis)."""

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from postplace.graph import OpGraph
from postplace.sim import Simulator, lower_bound
from postplace.testing import TableCostModel, star_cluster
from tests.simhelp import schedule_both

SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@st.composite
def instances(draw):
    n = draw(st.integers(1, 18))
    kinds = draw(st.sampled_from([("cpu", "gpu", "gpu"), ("gpu", "gpu"), ("cpu", "gpu", "gpu", "gpu")]))
    D = len(kinds)
    edges = []
    for j in range(1, n):
        preds = draw(st.lists(st.integers(0, j - 1), max_size=3, unique=True))
        for i in preds:
            slot = draw(st.integers(0, 1))
            edges.append((i, j, float(draw(st.integers(0, 6))) + slot * 0.5, slot))
    # edges of one (src, slot) carry one tensor: give them the same bytes
    size = {}
    edges = [(i, j, size.setdefault((i, s), b), s) for i, j, b, s in edges]
    cpu_only = draw(st.lists(st.booleans(), min_size=n, max_size=n)) if kinds[0] == "cpu" else [False] * n
    allowed = [["cpu"] if c else ["cpu", "gpu"] for c in cpu_only]
    live = draw(st.booleans())
    graph = OpGraph.build(
        [f"op{i}" for i in range(n)],
        edges,
        output_bytes=[float(draw(st.integers(0, 5))) for _ in range(n)],
        persistent_bytes=[float(draw(st.integers(0, 3))) for _ in range(n)],
        inplace=draw(st.lists(st.booleans(), min_size=n, max_size=n)),
        allowed_kinds=allowed,
        memory_mode="live" if live else "static",
    )
    table = np.array([[draw(st.sampled_from([0.0, 0.5, 1.0, 1.5, 2.0, 3.0])) for _ in range(D)] for _ in range(n)])
    shared = {"sw": ["gpu0", "gpu1"]} if draw(st.booleans()) else None
    cluster = star_cluster(
        kinds,
        bandwidth=draw(st.sampled_from([0.5, 1.0, 4.0])),
        latency=draw(st.sampled_from([0.0, 0.125])),
        shared=shared,
    )
    gpus = [d for d, k in enumerate(kinds) if k == "gpu"]
    placement = [
        0
        if cpu_only[i]
        else draw(st.sampled_from(gpus if kinds[0] == "cpu" and draw(st.booleans()) else list(range(D))))
        for i in range(n)
    ]
    return graph, cluster, TableCostModel(table), np.array(placement)


@SETTINGS
@given(instances())
def test_numba_kernel_and_reference_agree_exactly(inst):
    schedule_both(*inst)  # asserts equality of every start, end, transfer and peak


@SETTINGS
@given(instances())
def test_step_time_is_at_least_the_lower_bound(inst):
    graph, cluster, cost, placement = inst
    sim, sched = schedule_both(graph, cluster, cost, placement)
    assert sched.step_time >= lower_bound(sim.problem) * (1 - 1e-9)


@SETTINGS
@given(instances())
def test_every_op_starts_after_its_inputs_arrive(inst):
    graph, cluster, cost, placement = inst
    _, s = schedule_both(graph, cluster, cost, placement)
    arrival = {(x[0], x[1], x[3]): x[6] for x in s.transfers}
    for e in range(graph.num_edges):
        i, j = graph.edge_src[e], graph.edge_dst[e]
        ready = s.op_end[i] if placement[i] == placement[j] else arrival[(i, graph.edge_slot[e], placement[j])]
        assert s.op_start[j] >= ready


@SETTINGS
@given(instances())
def test_one_device_gives_the_sum_of_op_times(inst):
    graph, cluster, cost, _ = inst
    d = 0 if cluster.devices[0].kind == "cpu" else 1
    _, s = schedule_both(graph, cluster, cost, np.full(graph.num_ops, d))
    times = cost.op_times(graph, cluster).table[:, d]
    assert s.step_time == sum(times.tolist())
    assert s.transfers == []


@SETTINGS
@given(instances(), st.integers(0, 3))
def test_results_do_not_depend_on_batch_position_or_repetition(inst, pos):
    graph, cluster, cost, placement = inst
    sim = Simulator(graph, cluster, cost_model=cost)
    other = np.full(graph.num_ops, 0)
    batch = np.stack([other] * pos + [placement] + [other])
    a = sim.evaluate(batch)
    b = sim.evaluate(placement[None, :])
    assert a.step_time[pos] == b.step_time[0]
    np.testing.assert_array_equal(a.peak_mem[pos], b.peak_mem[0])
    np.testing.assert_array_equal(a.busy[pos], b.busy[0])


@SETTINGS
@given(instances(), st.integers(0, 2**31 - 1))
def test_compiled_placement_check_agrees_with_the_plain_one(inst, seed):
    from postplace.cluster.placement import invalid_reason

    graph, cluster, cost, _ = inst
    g = OpGraph.build(
        list(graph.names),
        list(zip(graph.edge_src.tolist(), graph.edge_dst.tolist(), strict=True)),
        allowed_kinds=graph.allowed_kinds,
        colocation=[i // 3 for i in range(graph.num_ops)],
    )
    sim = Simulator(g, cluster, cost_model=cost)
    rows = np.random.default_rng(seed).integers(-1, cluster.num_devices + 1, (20, g.num_ops))
    rows[:10] = rows[:10, [i - i % 3 for i in range(g.num_ops)]]  # half the rows keep sets together
    rows[:5] = np.clip(rows[:5], 0, cluster.num_devices - 1)
    expected = [invalid_reason(g, cluster, r) is not None for r in rows]
    assert sim.evaluate_ops(rows).failed.tolist() == expected


def test_the_work_bound_over_device_kinds_is_the_lp_over_devices():
    """Identical GPUs merged into one kind (its load at most count x T) give the optimum of the LP written per
    device (solved here from scratch), on a CPU, two GPU models and three GPUs of one of them."""
    from scipy.optimize import linprog

    from postplace.sim.bounds import work_bound
    from postplace.sim.problem import SimProblem

    rng = np.random.default_rng(7)
    n = 40
    fast, slow = rng.uniform(1, 2, n), rng.uniform(2, 5, n)
    table = np.stack([fast * 6, fast, fast, fast, slow, slow], axis=1)  # cpu, 3 of one GPU, 2 of another
    g = OpGraph.build([f"op{i}" for i in range(n)])
    p = SimProblem.build(g, star_cluster(("cpu",) + ("gpu",) * 5), TableCostModel(table))
    t = p.op_time
    ok = np.isfinite(t)
    ops, devs = np.nonzero(ok)
    nvar, D = len(ops), t.shape[1]
    a_eq = np.zeros((n, nvar + 1))
    a_eq[ops, np.arange(nvar)] = 1
    a_ub = np.zeros((D, nvar + 1))
    a_ub[devs, np.arange(nvar)] = t[ops, devs]
    a_ub[:, -1] = -1
    c = np.zeros(nvar + 1)
    c[-1] = 1
    per_device = linprog(c, A_ub=a_ub, b_ub=np.zeros(D), A_eq=a_eq, b_eq=np.ones(n), bounds=(0, None)).fun
    assert work_bound(p) == pytest.approx(per_device, rel=1e-6)
    assert work_bound(p) > t.min(axis=1).sum() / D  # the LP, not the simple bound
