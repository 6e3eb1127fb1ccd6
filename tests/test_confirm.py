"""confirm: the simulator's best few placements measured for real, the fastest measured one returned."""

import json

import numpy as np
import pytest

from postplace.confirm import candidates_from_cache, candidates_from_run, confirm
from postplace.errors import PostplaceError
from postplace.search import Budget, make_problem, make_strategy, run
from postplace.sim import EvalResult
from tests.test_runner import problem


class Scripted:
    """A 'measurement' that is a chosen function of the simulated time (and OOM where told)."""

    name = "scripted"

    def __init__(self, sim, fn, oom_rows=()):
        self.sim, self.fn, self.oom_rows, self.seen = sim, fn, set(oom_rows), []

    def evaluate(self, placements):
        self.seen.append(np.array(placements))
        t = self.fn(self.sim.evaluate_ops(placements).step_time)
        n = len(t)
        oom = np.array([i in self.oom_rows for i in range(n)])
        return EvalResult(
            np.where(oom, np.inf, t),
            np.zeros((n, 3)),
            oom,
            np.zeros(n, bool),
            ["out of memory: test" if o else None for o in oom],
            self.name,
        )


def finished_run(tmp_path, p):
    run(make_strategy("random", p.space, seed=0), p.simulator, Budget(samples=60), out_dir=tmp_path)
    return tmp_path


def test_candidates_are_the_k_best_distinct_feasible_in_simulated_order(tmp_path):
    p = problem()
    out = finished_run(tmp_path, p)
    cands = candidates_from_run(out, p.simulator, 4)
    assert cands.shape == (4, p.graph.num_ops) and len({c.tobytes() for c in cands}) == 4
    sim = p.simulator.evaluate_ops(cands).step_time
    assert np.all(np.diff(sim) >= 0)
    hist = [json.loads(x) for x in (out / "history.jsonl").read_text().splitlines()]
    feasible = sorted({h["step_time_s"] for h in hist if not h["oom"] and not h["failed"]})
    np.testing.assert_allclose(sim, feasible[:4])  # brute force over the history: the 4 best times
    cache = {b"\x00" * 8 * p.space.num_units: (0.5, True, False, None)}  # OOM: never a candidate
    assert candidates_from_cache(cache, p.simulator, 3).shape == (0, p.graph.num_ops)
    with pytest.raises(PostplaceError, match="--confirm 0"):
        candidates_from_cache(cache, p.simulator, 0)


def test_the_fastest_measured_wins_even_against_the_simulator(tmp_path):
    p = problem()
    cands = candidates_from_run(finished_run(tmp_path, p), p.simulator, 4)
    # measured = 1 / simulated: the simulator's order reversed exactly; row 0 (simulated best) also OOM
    meas = Scripted(p.simulator, lambda t: 1.0 / t, oom_rows={0})
    res = confirm(p.simulator, meas, cands)
    assert len(meas.seen) == 1 and len(res.rows) in (4, 5)  # one batch; the single device unless a duplicate
    ran = [r for r in res.rows if r.status == "ok"]
    assert res.best.measured_s == min(r.measured_s for r in ran)
    assert res.best.simulated_s == max(r.simulated_s for r in ran)  # the simulator's worst of those that ran
    assert res.rows[0].status == "oom" and res.rows[0] is not res.best
    assert res.spearman == pytest.approx(-1.0)
    assert any(r.label.startswith("single:") or "= single:" in r.label for r in res.rows)
    d = res.to_dict()
    assert d["returned"] == res.best.label and d["candidates"][0]["measured_s"] is None
    assert "Spearman" in res.format() and "<- returned" in res.format()


def test_nothing_ran_is_one_clear_error(tmp_path):
    p = problem()
    cands = candidates_from_run(finished_run(tmp_path, p), p.simulator, 2)
    meas = Scripted(p.simulator, lambda t: t, oom_rows={0, 1, 2})
    with pytest.raises(PostplaceError, match="none of the 3 placements ran"):
        confirm(p.simulator, meas, cands)


def test_confirm_with_torch_on_cpu_mapped_devices(tmp_path, torch_one_thread):
    from postplace.cluster import load_cluster
    from postplace.runtime.evaluator import TorchEvaluator
    from postplace.zoo import trace_model

    traced = trace_model("gpt2", "small")
    c = load_cluster("k80x2")
    prob = make_problem(traced.graph, c, groups=6, seed=0)
    run(make_strategy("random", prob.space, seed=1), prob.simulator, Budget(samples=40), out_dir=tmp_path)
    cands = candidates_from_run(tmp_path, prob.simulator, 3)
    measurer = TorchEvaluator(traced, c, device_map="cpu", steps=4, discard=2)
    res = confirm(prob.simulator, measurer, cands)
    assert res.evaluator == "torch" and res.simulator == "simulator"
    assert len(res.rows) >= 3 and all(r.status == "ok" for r in res.rows)
    assert all(np.isfinite(r.simulated_s) and r.simulated_s > 0 and r.measured_s > 0 for r in res.rows)
    assert res.best.measured_s == min(r.measured_s for r in res.rows)
    assert -1.0 <= res.spearman <= 1.0 or np.isnan(res.spearman)
    assert all(x["simulated_s"] > 0 and x["measured_s"] > 0 for x in res.to_dict()["candidates"])


def test_place_confirm_returns_the_fastest_measured_and_labels_every_figure(tmp_path, torch_one_thread):
    """``place(..., confirm=K)`` (the CLI's ``--confirm K``): the returned placement is the fastest of the
    measured rows, its time is labelled measured, the search's own figures stay simulated, and the run
    folder's placement.json is that placement; a pin holds on the single-device row too."""
    import postplace
    from postplace.cluster.placement import load_placement

    out = tmp_path / "run"
    r = postplace.place(
        "gpt2",
        "k80x2",
        size="small",
        budget=48,
        groups=6,
        out=out,
        exclude=["cpu"],
        measure=postplace.Measure(confirm=2, map_all_to="cpu"),
    )
    s = r.summary
    rows = s["confirm"]["candidates"]
    ran = [x for x in rows if x["measured_s"] is not None]
    assert len(rows) == 3 and ran  # the two best candidates of the answer and the best single device
    fastest = min(ran, key=lambda x: x["measured_s"])
    assert r.returned == "confirmed:" + fastest["label"] and r.step_time_s == fastest["measured_s"]
    assert s["figures"]["best_step_time_s"] == "measured" and s["figures"]["search_best_step_time_s"] == "simulated"
    assert s["ratio_to_lower_bound"] is None and s["ratio_to_single_device"] is None
    assert all(x["simulated_s"] > 0 for x in rows)
    assert not any(x["label"] == "single:cpu" for x in rows)  # --exclude cpu holds for the single device
    np.testing.assert_array_equal(load_placement(out / "placement.json", r.graph, r.cluster), r.placement)


def test_confirm_needs_code_to_run(tmp_path):
    import postplace
    from postplace.graph import OpGraph

    g = OpGraph.load(next(iter(_tiny_graph_files(tmp_path))))
    with pytest.raises(PostplaceError, match="--confirm runs placements for real"):
        postplace.place(g, "k80x2", budget=8, out=tmp_path / "r", measure=postplace.Measure(confirm=1))
    with pytest.raises(PostplaceError, match="--confirm"):
        postplace.place(
            "gpt2", "k80x2", size="small", budget=8, out=tmp_path / "r2", measure=postplace.Measure(confirm=-1)
        )


def _tiny_graph_files(tmp_path):
    from tests.test_runner import problem as tiny

    path = tmp_path / "g.json"
    tiny().graph.save(path)
    yield path


def test_confirm_measures_the_best_candidates_of_the_answer_placers_included(tmp_path, torch_one_thread):
    """Where one-shot placers beat the search in simulation, "confirm the simulator's best" measures them."""
    import postplace

    r = postplace.place(
        "gpt2",
        "k80x2",
        size="small",
        budget=8,
        strategy="random",
        groups=6,
        out=tmp_path / "run",
        exclude=["cpu"],
        measure=postplace.Measure(confirm=2, map_all_to="cpu"),
    )
    s = r.summary
    measured = [x for x in s["confirm"]["candidates"] if not x["label"].startswith("single:")]
    pool = sorted(v for k, v in s["candidates"].items() if v is not None and not k.startswith("single:"))
    # the two measured are the two best of the answer's candidates by simulated time (the search's best
    # among them; its second-best sample can only be at or above its best)
    assert sorted(x["simulated_s"] for x in measured)[0] == pytest.approx(pool[0])
    assert max(x["simulated_s"] for x in measured) <= pool[1] + 1e-12
    placers = [x["label"] for x in measured if not x["label"].startswith("search")]
    if pool[0] < s["search_best_step_time_s"]:  # a placer beat the search: it is among those measured
        assert placers and placers[0] in s["candidates"]
