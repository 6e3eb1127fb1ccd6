"""The hierarchical planner: the strategy contract, determinism, resumption, and that it learns."""

import copy

import numpy as np
import pytest
import torch

from postplace.graph import OpGraph
from postplace.search.hierarchical import HierarchicalConfig, HierarchicalPlanner, default_features
from postplace.search.strategy import SearchSpace
from postplace.sim import Simulator
from postplace.testing import TableCostModel, star_cluster

pytestmark = pytest.mark.usefixtures("torch_one_thread")


SMALL = HierarchicalConfig(num_groups=8, grouper_hidden=16, placer_hidden=32, device_embedding=8)
"""Test sizes; every other setting (lr 0.1, clip 1.0, C = 5, T = 10, m = 1, k = 4) stays the paper's."""


def chain_problem(n=16, cpu_only=()):
    """``n`` ops in a chain with skip edges; each takes 10 s on the cpu, 1 s on gpu0, 4 s on gpu1.

    Every op waits for its predecessor, so the optimum is all on gpu0: 16 x 1 s = 16 s for n = 16.
    """
    names = [f"op{i}" for i in range(n)]
    edges = [(i, i + 1, 1.0) for i in range(n - 1)] + [(i, i + 2, 1.0) for i in range(0, n - 2, 3)]
    kinds = ["cpu" if i in cpu_only else ["cpu", "gpu"] for i in range(n)]
    g = OpGraph.build(names, edges, allowed_kinds=kinds)
    cluster = star_cluster(("cpu", "gpu", "gpu"), bandwidth=2.0, latency=0.2)
    sim = Simulator(g, cluster, cost_model=TableCostModel([[10.0, 1.0, 4.0]] * n), group_of_op=np.arange(n))
    space = SearchSpace(
        np.isfinite(sim.problem.op_time),
        sim.failure_step_time,
        unit_time=sim.problem.op_time,
        device_names=cluster.device_names,
        edges=(g.edge_src, g.edge_dst, g.edge_bytes),
    )
    return sim, space


def drive(planner, sim, updates, max_n=16, feasible_if=None):
    """The runner's loop in miniature. Returns the placements and the per-batch step times."""
    seen, batches = [], []
    for _ in range(updates):
        p = planner.ask(max_n)
        r = sim.evaluate(p)
        feasible = r.feasible if feasible_if is None else r.feasible & feasible_if(p)
        planner.tell(p, r.step_time, feasible)
        seen.append(p)
        batches.append(np.where(feasible, r.step_time, np.inf))
    return np.concatenate(seen), batches


# ---------------------------------------------------------------------------------- contract
def test_contract_shapes_allowed_and_seeded():
    sim, space = chain_problem(cpu_only=(0, 7))
    a, b = HierarchicalPlanner(space, seed=5, config=SMALL), HierarchicalPlanner(space, seed=5, config=SMALL)
    pa, _ = drive(a, sim, 12)
    pb, _ = drive(b, sim, 12)
    assert pa.dtype == np.int64 and pa.shape == (12 * 4, space.num_units)
    assert np.all((pa >= 0) & (pa < space.num_devices))
    assert np.all(space.allowed[np.arange(space.num_units), pa])  # cpu-only ops stay on the cpu
    np.testing.assert_array_equal(pa, pb)
    for pa_, pb_ in zip(a.model.parameters(), b.model.parameters(), strict=True):
        torch.testing.assert_close(pa_, pb_, rtol=0, atol=0)
    pc, _ = drive(HierarchicalPlanner(space, seed=6, config=SMALL), sim, 12)
    assert not np.array_equal(pa, pc)


def test_batch_size_is_its_own_and_max_n_caps_it():
    sim, space = chain_problem()
    s = HierarchicalPlanner(space, seed=0, config=SMALL)
    assert s.ask(100).shape[0] == 4  # m * k = 1 * 4, whatever the evaluator could take
    s2 = HierarchicalPlanner(space, seed=0, config=SMALL)
    p = s2.ask(1)
    assert p.shape == (1, space.num_units)
    r = sim.evaluate(p)
    s2.tell(p, r.step_time, r.feasible)
    assert s2.updates == 1


@pytest.mark.parametrize("mid_ask", [False, True])
def test_state_dict_round_trip_continues_identically(mid_ask):
    sim, space = chain_problem(cpu_only=(3,))
    a = HierarchicalPlanner(space, seed=2, config=SMALL)
    drive(a, sim, 5)
    if mid_ask:  # a checkpoint between ask and tell resumes the pending batch
        p = a.ask(16)
    state = copy.deepcopy(a.state_dict())
    b = HierarchicalPlanner(space, seed=77, config=SMALL)
    b.load_state_dict(state)
    if mid_ask:
        r = sim.evaluate(p)
        a.tell(p, r.step_time, r.feasible)
        b.tell(p, r.step_time, r.feasible)
    pa, ta = drive(a, sim, 8)
    pb, tb = drive(b, sim, 8)
    np.testing.assert_array_equal(pa, pb)
    np.testing.assert_array_equal(np.concatenate(ta), np.concatenate(tb))
    assert a.baseline == b.baseline and a.updates == b.updates


def test_load_rebuilds_networks_of_another_size():
    sim, space = chain_problem()
    a = HierarchicalPlanner(space, seed=1, config=SMALL)
    drive(a, sim, 2)
    b = HierarchicalPlanner(space, seed=1, config=HierarchicalConfig(num_groups=4, placer_hidden=16))
    b.load_state_dict(a.state_dict())
    assert b.config == SMALL
    np.testing.assert_array_equal(drive(a, sim, 3)[0], drive(b, sim, 3)[0])


@pytest.mark.parametrize("m", [1, 2])
def test_teacher_forced_replay_matches_sampling(m):
    """The log-likelihood tell() differentiates equals the one of the step-by-step sampling in ask()."""
    sim, space = chain_problem(cpu_only=(0, 5))
    cfg = HierarchicalConfig(num_groups=6, grouper_hidden=16, placer_hidden=32, groupings_per_ask=m)
    s = HierarchicalPlanner(space, seed=4, config=cfg)
    drive(s, sim, 3)
    s.ask(16)
    p = s._pending
    logp_group, logp_dev = s._log_probs(p)
    np.testing.assert_allclose(logp_group.detach().numpy(), p["logp_group"], rtol=1e-5, atol=1e-4)
    np.testing.assert_allclose(logp_dev.detach().numpy(), p["logp_devices"], rtol=1e-5, atol=1e-4)
    assert p["devices"].shape == (m * 4, 6) and p["groups"].shape == (m, space.num_units)


def test_tell_rejects_foreign_placements():
    _, space = chain_problem()
    s = HierarchicalPlanner(space, seed=0, config=SMALL)
    p = s.ask(4)
    with pytest.raises(ValueError, match="last ask"):
        s.tell(np.zeros_like(p), np.ones(len(p)), np.ones(len(p), dtype=bool))


def test_default_features_and_paper_config():
    _, space = chain_problem(cpu_only=(2,))
    f = default_features(space)
    assert f.shape == (space.num_units, 2 * space.num_devices + 6) and np.all(np.isfinite(f))
    assert f[2, 1 + 1] == 5.0  # gpu0 is not allowed for op2: the "very slow" cap
    bare = SearchSpace(space.allowed, space.failure_step_time)  # no times, no edges
    assert np.all(np.isfinite(default_features(bare)))
    # every number Mirhoseini et al. (ICLR 2018) report, written here from the paper, field by field
    paper = HierarchicalConfig.paper()
    from_the_paper = {
        "lr": 0.1,  # Adam, fixed learning rate 0.1
        "grad_clip": 1.0,  # gradient clipping of norm 1.0
        "tanh_constant": 5.0,  # C = 5.0
        "temperature": 10.0,  # T = 10.0
        "groupings_per_ask": 1,  # m = 1 Grouper samples (its Eq. 4)
        "placements_per_grouping": 4,  # k = 4 Placer samples (its Eq. 6)
        "num_groups": 256,  # the best of the group counts it tried
        "grouper_hidden": 64,  # the Grouper's feed-forward hidden size
        "placer_hidden": 256,  # the Placer's LSTM size
    }
    assert {k: getattr(paper, k) for k in from_the_paper} == from_the_paper
    s = HierarchicalPlanner(space, seed=0)  # the paper's sizes, with fewer units than groups
    assert s.num_groups == space.num_units
    assert s.ask(8).shape == (4, space.num_units)


# ---------------------------------------------------------------------------------- learning
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_learns_the_fast_device(seed):
    """From near-uniform samples (median ~4x the optimum) to the optimum, 16 s, within 60 updates."""
    sim, space = chain_problem()
    s = HierarchicalPlanner(space, seed=seed, config=SMALL)
    _, batches = drive(s, sim, 60)
    first, last = np.median(batches[0]), np.median(np.concatenate(batches[-5:]))
    assert first > 40.0
    assert last <= 0.5 * first
    assert last <= 1.1 * 16.0
    assert s.best_score == 16.0


def test_infeasible_scored_as_failing():
    """Pretend gpu0 runs out of memory whenever it gets an op: the planner settles on gpu1 (4 s per op)."""
    sim, space = chain_problem()
    s = HierarchicalPlanner(space, seed=0, config=SMALL)
    _, batches = drive(s, sim, 80, feasible_if=lambda p: ~np.any(p == 1, axis=1))
    late = np.concatenate(batches[-5:])
    assert np.all(np.isfinite(late)) and np.median(late) <= 1.1 * 16 * 4.0
    assert s.best is not None and not np.any(s.best == 1)
