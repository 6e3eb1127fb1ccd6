"""TorchEvaluator: real step times; a placement that raises, runs out of memory or times out loses
nothing else of its batch."""

import time

import numpy as np
import pytest
import torch

from postplace.cluster import load_cluster
from postplace.cluster.placement import colocation_representative, single_device
from postplace.graph.trace_torch import trace
from postplace.runtime import TorchEvaluator
from postplace.runtime.placed import PlacedStep
from tests.test_runtime import toy
from tests.tracehelp import CAPTURED_TARGETS


class Misbehaving:
    """Wraps a placed step: ``mode`` "raise", "oom" or "slow" on its first call. A slow call records
    that it began its 30 s sleep and, if it ever ends it, that it did."""

    def __init__(self, step: PlacedStep, mode: str):
        self.step, self.mode = step, mode
        self.slept = []  # "begun", then "ended" if the sleep was waited out

    def __call__(self, *inputs):
        if self.mode == "raise":
            raise ValueError("boom in a placed op\nsecond line")
        if self.mode == "oom":
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        if self.mode == "slow":
            self.slept.append("begun")
            time.sleep(30)
            self.slept.append("ended")
        return self.step(*inputs)

    def synchronize(self):
        self.step.synchronize()


class Faulty(TorchEvaluator):
    """Placement rows whose first op sits on device ``k`` misbehave as ``faults[k]``."""

    faults: dict = {}

    def _make_step(self, dev):
        step = super()._make_step(dev)
        mode = self.faults.get(int(dev[0]))
        if not mode:
            return step
        self.made = [*getattr(self, "made", []), Misbehaving(step, mode)]
        return self.made[-1]


@CAPTURED_TARGETS  # the toy's loss_fn closes over its labels: the warning is the expected one
def test_failures_oom_and_timeout_keep_the_rest_of_the_batch():
    model, inputs, loss_fn = toy()
    tr = trace(model, inputs, loss_fn)
    names = ["cpu", "gpu0", "gpu1", "gpu2", "gpu3"]
    ev = Faulty(tr, names, device_map="cpu", steps=4, discard=2, timeout=1.0)
    ev.faults = {1: "raise", 2: "oom", 3: "slow"}
    rows = np.stack([np.full(tr.graph.num_ops, d) for d in (0, 1, 2, 3, 4, 0)])
    res = ev.evaluate(rows)
    slow = next(m for m in ev.made if m.mode == "slow")
    assert slow.slept == ["begun"]  # the slow step was cut off inside its sleep, not waited for
    assert res.evaluator == "torch"
    ok = [0, 4, 5]
    assert np.all(np.isfinite(res.step_time[ok])) and np.all(res.step_time[ok] > 0)
    assert not res.failed[ok].any() and not res.oom[ok].any()
    assert res.failed[1] and res.reasons[1] == "ValueError: boom in a placed op"
    assert res.oom[2] and not res.failed[2] and "out of memory" in res.reasons[2]
    assert res.failed[3] and res.reasons[3].startswith("timeout")
    assert not res.feasible[[1, 2, 3]].any()
    assert np.all(res.step_time[ok] < ev.failure_step_time)
    assert all(len(res.extra["step_times"][r]) == 4 for r in ok)
    # median of the timed steps (the first `discard` are warm-up)
    r0 = res.extra["step_times"][0]
    assert res.step_time[0] == pytest.approx(float(np.median(r0[2:])))


@CAPTURED_TARGETS  # the toy's loss_fn closes over its labels: the warning is the expected one
def test_a_placement_on_a_gpu_this_machine_lacks_fails_with_its_reason():
    """On a machine without CUDA, gpu0 (default map: cuda:0) is missing; on a machine with k CUDA
    devices, gpuk (cuda:k) is. The row that uses it fails with a reason naming it; the CPU row runs."""
    model, inputs, loss_fn = toy()
    tr = trace(model, inputs, loss_fn)
    k = torch.cuda.device_count() if torch.cuda.is_available() else 0  # the first CUDA index not present
    ev = TorchEvaluator(tr, ["cpu", f"gpu{k}"], steps=2, discard=1)
    rows = np.stack([np.zeros(tr.graph.num_ops, dtype=int), np.ones(tr.graph.num_ops, dtype=int)])
    res = ev.evaluate(rows)
    assert np.isfinite(res.step_time[0]) and not res.failed[0]
    assert res.failed[1] and not res.oom[1]
    if torch.cuda.is_available():
        assert f"gpu{k} -> cuda:{k}, but this machine has {k} CUDA device(s)" in res.reasons[1]
    else:
        assert "gpu0 (cuda), and this machine has no CUDA" in res.reasons[1]


@CAPTURED_TARGETS  # the toy's loss_fn closes over its labels: the warning is the expected one
def test_groups_and_cluster_rules():
    model, inputs, loss_fn = toy()
    tr = trace(model, inputs, loss_fn)
    cluster = load_cluster("k80x2")
    g = tr.graph
    rep = colocation_representative(g)
    split = single_device(g, cluster, "cpu")
    member = next(i for i in range(g.num_ops) if rep[i] != i)
    split[member] = 1  # splits its colocation set
    ev = TorchEvaluator(tr, cluster, device_map="cpu", steps=2, discard=1)
    res = ev.evaluate(np.stack([single_device(g, cluster, "gpu1"), split]))
    assert not res.failed[0] and np.isfinite(res.step_time[0])
    assert res.failed[1] and "colocation" in res.reasons[1]
    assert res.peak_mem.shape == (2, cluster.num_devices) and not any(res.extra["peak_mem_measured"])
    # over groups: two groups, each op's group by parity of its colocation representative
    groups = rep % 2
    ev2 = TorchEvaluator(tr, cluster, group_of_op=groups, device_map="cpu", steps=2, discard=1)
    res2 = ev2.evaluate(np.array([[0, 1], [2, 2]]))
    assert res2.feasible.all()


def test_for_zoo_builds_an_evaluator_on_a_preset():
    ev = TorchEvaluator.for_zoo("gpt2", "small", "k80x2", device_map="cpu", steps=2, discard=1)
    assert ev.device_names == ("cpu", "gpu0", "gpu1")
    from postplace.zoo import cached_graph

    g = cached_graph("gpt2", "small")
    assert tuple(g.names) == tuple(ev.graph.names)
    res = ev.evaluate(single_device(g, ev.cluster, "gpu0")[None])
    assert res.feasible.all()


def test_the_runner_drives_a_search_with_measured_step_times(tmp_path):
    from postplace.search import Budget, make_problem, make_strategy, run
    from postplace.zoo import cached_graph

    g, c = cached_graph("gpt2", "small"), load_cluster("k80x2")
    problem = make_problem(g, c, groups=8, pins=[], exclude=[], seed=0)
    ev = TorchEvaluator.for_zoo(
        "gpt2", "small", c, group_of_op=problem.grouping.group_of_op, device_map="cpu", graph=g, steps=3, discard=1
    )
    res = run(make_strategy("random", problem.space, seed=0), ev, Budget.parse("4"), out_dir=tmp_path, progress=False)
    assert res.evaluator == "torch" and res.samples == 4 and res.feasible_samples == 4
    assert 0 < res.best_step_time < 10
