"""The runner: budgets, the cache, OOM handling, history, and resuming a run killed at any moment."""

import json
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from postplace.errors import PostplaceError
from postplace.graph import OpGraph
from postplace.search import Budget, make_problem, make_strategy, run
from postplace.search.checkpoint import CHECKPOINT
from postplace.search.history import HISTORY, TIMING
from postplace.testing import TableCostModel, star_cluster


def problem(memory=1e12):
    rng = np.random.default_rng(0)
    n = 24
    out = rng.integers(1, 4, n).astype(float)
    edges = [(i, j, out[i]) for j in range(1, n) for i in range(max(0, j - 3), j) if rng.random() < 0.5]
    g = OpGraph.build(
        [f"op{i}" for i in range(n)], edges, output_bytes=out, persistent_bytes=rng.integers(0, 5, n).astype(float)
    )
    table = np.stack([rng.uniform(4, 8, n), rng.uniform(1, 2, n), rng.uniform(1, 2, n)], axis=1)
    return make_problem(
        g,
        star_cluster(("cpu", "gpu", "gpu"), bandwidth=4.0, memory=memory),
        groups=None,
        cost_model=TableCostModel(table),
    )


def test_budget_parsing():
    assert Budget.parse("2400") == Budget(samples=2400)
    assert Budget.parse("60s") == Budget(seconds=60.0) and Budget.parse("2m") == Budget(seconds=120.0)
    with pytest.raises(PostplaceError, match="--budget"):
        Budget.parse("lots")


def test_sample_budget_is_exact_and_results_are_reproducible():
    p = problem()
    a = run(make_strategy("post", p.space, seed=1), p.simulator, Budget(samples=250))
    b = run(make_strategy("post", p.space, seed=1), p.simulator, Budget(samples=250))
    assert a.samples == 250 and len(a.curve) == 250
    assert a.best_step_time == b.best_step_time and np.array_equal(a.best_placement, b.best_placement)
    assert a.best_step_time == p.simulator.evaluate(a.best_placement[None]).step_time[0]
    assert all(x >= y for x, y in zip(a.curve, a.curve[1:], strict=False))  # best-so-far never rises


def test_identical_placements_are_evaluated_once():
    p = problem()
    counting = _Counting(p.simulator)
    r = run(make_strategy("post", p.space, seed=0), counting, Budget(samples=1500))
    assert counting.evaluated == r.evaluations < r.samples  # the policy converges and repeats itself


def test_oom_placements_are_never_best():
    p = problem(memory=31.0)  # about half of random placements exceed it
    counting = _Counting(p.simulator)
    r = run(make_strategy("random", p.space, seed=0), counting, Budget(samples=200))
    assert counting.ooms > 0
    res = p.simulator.evaluate(r.best_placement[None])
    assert res.feasible[0] and r.best_step_time == res.step_time[0]


def test_an_existing_run_folder_is_not_overwritten(tmp_path):
    p = problem()
    run(make_strategy("random", p.space, seed=0), p.simulator, Budget(samples=30), out_dir=tmp_path)
    with pytest.raises(PostplaceError, match="--resume"):
        run(make_strategy("random", p.space, seed=0), p.simulator, Budget(samples=30), out_dir=tmp_path)


KILLER = textwrap.dedent("""
    import os, signal, sys
    sys.path.insert(0, {root!r})
    from tests.test_runner import problem
    from postplace.search import Budget, make_strategy, run
    p = problem()
    calls = 0
    class Killer:
        name = "simulator"
        def evaluate(self, placements):
            global calls
            calls += 1
            if calls == {kill_at}:
                os.kill(os.getpid(), signal.SIGKILL)  # no finally, no flush: a real crash
            return p.simulator.evaluate(placements)
    run(make_strategy({strategy!r}, p.space, seed=5), Killer(), Budget(samples=1200), out_dir={out!r},
        checkpoint_every=100)
""")


@pytest.mark.parametrize(("strategy", "kill_at"), [("post", 5), ("post", 11), ("reinforce", 9)])
def test_resume_after_kill_9_gives_the_uninterrupted_result(tmp_path, strategy, kill_at):
    from pathlib import Path

    root = str(Path(__file__).resolve().parents[1])
    killed = tmp_path / "killed"
    script = KILLER.format(root=root, kill_at=kill_at, strategy=strategy, out=str(killed))
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert proc.returncode == -9, proc.stderr
    assert (killed / CHECKPOINT).exists()
    p = problem()
    resumed = run(
        make_strategy(strategy, p.space, seed=123), p.simulator, Budget(samples=1200), out_dir=killed, resume=True
    )
    clean_dir = tmp_path / "clean"
    clean = run(make_strategy(strategy, p.space, seed=5), p.simulator, Budget(samples=1200), out_dir=clean_dir)
    assert resumed.samples == clean.samples == 1200
    assert resumed.best_step_time == clean.best_step_time
    assert np.array_equal(resumed.best_placement, clean.best_placement)
    assert (killed / HISTORY).read_text() == (clean_dir / HISTORY).read_text()
    lines = [json.loads(x) for x in (clean_dir / HISTORY).read_text().splitlines()]
    assert [x["sample"] for x in lines] == list(range(1200))
    # the timing record: one line per batch, the same batches as the clean run, the clock never running back
    timed = [json.loads(x) for x in (killed / TIMING).read_text().splitlines()]
    clean_timed = [json.loads(x) for x in (clean_dir / TIMING).read_text().splitlines()]
    assert [t["samples"] for t in timed] == [t["samples"] for t in clean_timed]
    assert timed[-1]["samples"] == 1200
    assert all(a["time_s"] <= b["time_s"] for a, b in zip(timed, timed[1:], strict=False))


class _Counting:
    name = "simulator"

    def __init__(self, sim):
        self.sim, self.evaluated, self.ooms = sim, 0, 0

    def evaluate(self, placements):
        self.evaluated += len(placements)
        r = self.sim.evaluate(placements)
        self.ooms += int(r.oom.sum())
        return r


@pytest.mark.parametrize("stop_at", [3, 8])
def test_ctrl_c_inside_a_batch_resumes_to_the_uninterrupted_result(tmp_path, stop_at):
    """Ctrl-C after a batch was evaluated and cached but before the strategy learned from it."""
    p = problem()

    class StopInTell:
        def __init__(self, inner):
            self.inner, self.calls, self.name = inner, 0, inner.name

        def ask(self, n):
            return self.inner.ask(n)

        @property
        def last_origins(self):  # where its asks came from, as the strategy says (the history records them)
            return self.inner.last_origins

        def tell(self, *args):
            self.calls += 1
            if self.calls == stop_at:
                raise KeyboardInterrupt
            self.inner.tell(*args)

        def state_dict(self):
            return self.inner.state_dict()

        def load_state_dict(self, s):
            self.inner.load_state_dict(s)

    stopped_dir, clean_dir = tmp_path / "stopped", tmp_path / "clean"
    first = run(
        StopInTell(make_strategy("post", p.space, seed=2)),
        p.simulator,
        Budget(samples=1000),
        out_dir=stopped_dir,
        checkpoint_every=10_000,
    )
    assert first.interrupted and first.samples < 1000
    resumed = run(
        make_strategy("post", p.space, seed=0), p.simulator, Budget(samples=1000), out_dir=stopped_dir, resume=True
    )
    clean = run(make_strategy("post", p.space, seed=2), p.simulator, Budget(samples=1000), out_dir=clean_dir)
    assert resumed.best_step_time == clean.best_step_time and resumed.curve == clean.curve
    assert (stopped_dir / HISTORY).read_text() == (clean_dir / HISTORY).read_text()


def test_placements_outside_the_space_are_rejected_never_evaluated():
    p = problem()
    allowed = p.space.allowed.copy()
    allowed[0] = [False, True, False]  # unit 0 may only use gpu0 (as a pin would say)
    from dataclasses import replace

    space = replace(p.space, allowed=allowed)

    class Rogue:
        name = "rogue"

        def ask(self, n):
            return np.zeros((1, space.num_units), dtype=np.int64)  # unit 0 on the cpu

        def tell(self, *a):
            raise AssertionError("told a placement that should have been rejected")

    counting = _Counting(p.simulator)
    with pytest.raises(PostplaceError, match="rogue.*unit 0 on device id 0"):
        run(Rogue(), counting, Budget(samples=5), space=space)
    with pytest.raises(PostplaceError, match="the warm start"):
        run(make_strategy("random", space), counting, Budget(samples=5), warm_start=np.zeros(space.num_units, int))
    assert counting.evaluated == 0
