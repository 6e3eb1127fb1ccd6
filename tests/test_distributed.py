"""RayEvaluator on a real local Ray cluster (2 CPUs, no dashboard): the in-process answers, the same
search, and no sample lost or counted twice when actors die."""

import os
import sys

import numpy as np
import pytest

from postplace.errors import PostplaceError
from postplace.search import Budget, make_strategy, run
from postplace.search.checkpoint import CHECKPOINT
from postplace.search.history import HISTORY
from tests.test_runner import problem

ray = pytest.importorskip("ray", reason="ray is not installed (pip install 'postplace[ray]')")

from postplace.distributed import EvaluatorLost, RayEvaluator, SimulatorFactory  # noqa: E402
from postplace.testing.faulty import DyingFactory  # noqa: E402


@pytest.fixture(scope="module")
def ray_cluster():
    """One local Ray instance for the whole module, shut down after."""
    from postplace.distributed.ray_evaluator import WORKER_NICENESS

    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    os.environ.setdefault(WORKER_NICENESS, "0")  # as init_ray does: at Ray's nice 15 a loaded machine starves them
    started = not ray.is_initialized()
    if started:
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield ray
    if started:
        ray.shutdown()


def factory(p):
    sim = p.simulator
    return SimulatorFactory(p.graph, p.cluster, group_of_op=sim.group_of_op, cost_model=sim.problem.cost_model)


def random_rows(p, n, seed=0):
    rng = np.random.default_rng(seed)
    return rng.integers(0, p.cluster.num_devices, (n, p.space.num_units))


def test_results_equal_the_in_process_simulator_in_order(ray_cluster):
    p = problem(memory=40.0)  # small memory: some placements are OOM
    rows = random_rows(p, 37)
    rows[5, :] = 99  # no such device: failed, with its reason
    want = p.simulator.evaluate(rows)
    with RayEvaluator(factory(p), actors=2, chunks_per_actor=3) as ev:
        assert ev.num_actors == 2 and ev.name == "simulator" and len(set(ev.pids)) == 2
        assert ev.failure_step_time == p.simulator.failure_step_time
        got = ev.evaluate(rows)
        assert ev.stats["chunks"] == 6 and ev.stats["actors_lost"] == 0
        one = ev.evaluate(rows[:1])  # fewer placements than actors
    assert want.oom.any() and want.failed[5] and (~want.oom & ~want.failed).any()
    for attr in ("step_time", "peak_mem", "oom", "failed", "busy", "bytes_moved"):
        np.testing.assert_array_equal(getattr(got, attr), getattr(want, attr))
    assert got.reasons == want.reasons and got.evaluator == "simulator"
    np.testing.assert_array_equal(one.step_time, want.step_time[:1])


def test_a_search_on_ray_has_the_same_history_and_best(ray_cluster, tmp_path):
    p = problem()
    local = run(make_strategy("post", p.space, seed=4), p.simulator, Budget(samples=200), out_dir=tmp_path / "a")
    with RayEvaluator(factory(p), actors=2) as ev:
        remote = run(make_strategy("post", p.space, seed=4), ev, Budget(samples=200), out_dir=tmp_path / "b")
    assert (tmp_path / "a" / HISTORY).read_text() == (tmp_path / "b" / HISTORY).read_text()
    assert remote.best_step_time == local.best_step_time and remote.evaluations == local.evaluations
    assert np.array_equal(remote.best_placement, local.best_placement) and remote.evaluator == "simulator"


def test_an_actor_killed_mid_batch_loses_no_sample_and_counts_none_twice(ray_cluster, tmp_path):
    p = problem(memory=40.0)
    log = tmp_path / "calls.log"
    # call 1 (the second chunk handed out) kills its actor's process while it holds the chunk
    with RayEvaluator(DyingFactory(factory(p), str(log), die_at=(1,)), actors=2) as ev:
        rows = random_rows(p, 40, seed=1)
        got = ev.evaluate(rows)
        assert ev.stats["actors_lost"] == 1 and ev.stats["retried_chunks"] == 1 and ev.stats["actors_replaced"] == 1
        # a kill from outside between batches: the next batch finds the actor dead and retries its chunk
        ev.kill_actor(0)
        again = ev.evaluate(rows)
        assert ev.stats["actors_lost"] == 2 and ev.num_actors == 2
        res = run(make_strategy("post", p.space, seed=2), ev, Budget(samples=150), out_dir=tmp_path / "ray")
    want = p.simulator.evaluate(rows)
    for r in (got, again):
        np.testing.assert_array_equal(r.step_time, want.step_time)
        np.testing.assert_array_equal(r.peak_mem, want.peak_mem)
        assert r.reasons == want.reasons
    calls = [line.split() for line in log.read_text().splitlines()]
    died = [c for c in calls if c[0] == "1"]
    assert len(died) == 1  # exactly one call died; every row was answered once, by a call that returned
    local = run(make_strategy("post", p.space, seed=2), p.simulator, Budget(samples=150), out_dir=tmp_path / "local")
    assert (tmp_path / "ray" / HISTORY).read_text() == (tmp_path / "local" / HISTORY).read_text()
    assert res.samples == local.samples == 150 and res.evaluations == local.evaluations


def test_when_every_actor_dies_the_run_stops_with_a_clear_error_and_resumes(ray_cluster, tmp_path):
    p = problem()
    log = tmp_path / "calls.log"
    # two batches of two chunks succeed, then every call dies; one replacement allowed
    dying = DyingFactory(factory(p), str(log), die_from=4)
    ev = RayEvaluator(dying, actors=2, max_replacements=1)
    out = tmp_path / "run"
    with pytest.raises(EvaluatorLost, match="resume") as err:
        run(make_strategy("post", p.space, seed=7), ev, Budget(samples=300), out_dir=out, checkpoint_every=1)
    ev.shutdown()
    assert isinstance(err.value, PostplaceError) and "\n" not in str(err.value)
    assert ev.stats["actors_lost"] == 3 and ev.stats["actors_replaced"] == 1
    assert (out / CHECKPOINT).exists()
    done = len((out / HISTORY).read_text().splitlines())
    assert 0 < done < 300  # the completed batches are on disk
    resumed = run(make_strategy("post", p.space, seed=99), p.simulator, Budget(samples=300), out_dir=out, resume=True)
    clean = run(make_strategy("post", p.space, seed=7), p.simulator, Budget(samples=300), out_dir=tmp_path / "clean")
    assert (out / HISTORY).read_text() == (tmp_path / "clean" / HISTORY).read_text()
    assert resumed.best_step_time == clean.best_step_time


def test_an_impossible_pool_is_one_clear_error(ray_cluster):
    p = problem()
    with pytest.raises(PostplaceError, match="need 3 CPUs"):
        RayEvaluator(factory(p), actors=3)
    with pytest.raises(PostplaceError, match="GPU"):
        RayEvaluator(factory(p), actors=1, num_gpus=1)


def test_without_ray_the_message_says_how_to_install(monkeypatch):
    from postplace.distributed import require_ray

    monkeypatch.setitem(sys.modules, "ray", None)
    with pytest.raises(PostplaceError, match=r"pip install 'postplace\[ray\]'"):
        require_ray()


def test_confirm_measures_on_ray_actors(ray_cluster, tmp_path):
    from postplace.cluster import load_cluster
    from postplace.confirm import candidates_from_run, confirm
    from postplace.distributed import TorchZooFactory
    from postplace.search import make_problem
    from postplace.zoo import cached_graph

    graph, c = cached_graph("gpt2", "small"), load_cluster("k80x2")
    prob = make_problem(graph, c, groups=6, seed=0)
    run(make_strategy("random", prob.space, seed=1), prob.simulator, Budget(samples=30), out_dir=tmp_path)
    cands = candidates_from_run(tmp_path, prob.simulator, 3)
    fac = TorchZooFactory("gpt2", "small", "k80x2", device_map="cpu", options={"steps": 4, "discard": 2, "threads": 1})
    assert fac.num_gpus == 0.0 and TorchZooFactory("gpt2", "small", "k80x2").num_gpus == 2.0  # gpu0, gpu1
    with RayEvaluator(fac, actors=2) as ev:
        assert ev.name == "torch"
        res = confirm(prob.simulator, ev, cands)
    assert res.evaluator == "torch" and len(res.rows) >= 3 and all(r.status == "ok" for r in res.rows)
    assert res.best.measured_s == min(r.measured_s for r in res.rows)


def test_place_with_ray_local_gives_the_in_process_answer_and_history(ray_cluster, tmp_path):
    """``postplace.place(..., ray="local")`` (the CLI's ``--ray local``): the same returned placement,
    search best and history as the in-process run with the same seed."""
    import postplace

    p = problem(memory=40.0)
    kw = dict(budget=96, seed=3, groups=None)
    local = postplace.place(p.graph, p.cluster, out=tmp_path / "local", **kw)
    on_ray = postplace.place(p.graph, p.cluster, out=tmp_path / "ray", **kw, measure=postplace.Measure(ray="local"))
    assert (tmp_path / "ray" / HISTORY).read_text() == (tmp_path / "local" / HISTORY).read_text()
    assert on_ray.returned == local.returned and on_ray.step_time_s == local.step_time_s
    np.testing.assert_array_equal(on_ray.placement, local.placement)
    assert ray.is_initialized()  # it joined the running instance and left it running


def test_ray_over_every_micro_batch_count_gives_the_in_process_answer(ray_cluster, tmp_path):
    """``--ray`` at every count (the one answer path): each count's history and the answer equal the
    in-process run's."""
    import postplace

    kw = dict(size="small", budget=16, groups=6, microbatches="auto", report=False)
    local = postplace.place("gpt2", "k80x2", out=tmp_path / "local", **kw)
    on_ray = postplace.place("gpt2", "k80x2", out=tmp_path / "ray", **kw, measure=postplace.Measure(ray="local"))
    assert on_ray.summary["microbatch_counts"] == [1, 2]
    for m in (1, 2):
        ray_history, local_history = (tmp_path / run / f"m{m}" / HISTORY for run in ("ray", "local"))
        assert ray_history.read_text() == local_history.read_text()
    assert on_ray.returned == local.returned and on_ray.step_time_s == local.step_time_s
