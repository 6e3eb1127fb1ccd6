"""Issue 34 item 5: the plan line (``summary["plan"]``, the CLI's ``plan:``) names every device the plan uses,
and a plan whose replicas cannot each hold the whole state is not called plain data parallelism."""

from __future__ import annotations

import re

import numpy as np
import pytest

import postplace
from postplace.api.summary import describe_plan
from postplace.cluster import load_cluster
from postplace.graph import OpGraph
from tests.clihelp import run_cli

GB = 1e9


def _named(words: str, cluster) -> set[str]:
    """The device names the words mention (``gpu0..gpu3`` read as the run it stands for)."""
    names = set()
    for a, b in re.findall(r"gpu(\d+)\.\.gpu(\d+)", words):
        names |= {f"gpu{k}" for k in range(int(a), int(b) + 1)}
    return names | {d for d in cluster.device_names if re.search(rf"\b{d}\b", words)}


def _used(result) -> set[str]:
    return {result.cluster.device_names[d] for d in set(result.placement.tolist())}


def test_a_placement_with_a_few_ops_on_the_cpu_and_another_gpu_names_them(tmp_path):
    # three heavy ops and two tiny ones pinned to the cpu and gpu3: every candidate keeps the pins, so whatever
    # is returned runs ops on cpu and gpu3, each under 5% of the time (the words named only gpu0)
    g = OpGraph.build(
        ["a", "b", "c", "tiny_cpu", "tiny_g3"], [(0, 1, 1e6), (1, 2, 1e6)], flops=[1e9, 4e9, 1e9, 1e3, 1e3], name="five"
    )
    r = postplace.place(g, "k80x4", budget=48, groups=None, pins=["tiny_cpu=cpu", "tiny_g3=gpu3"], report=False)
    plan = r.summary["plan"]
    assert {"cpu", "gpu3"} <= _used(r) and _used(r) <= _named(plan, r.cluster), plan
    assert "1 op on cpu" in plan and "1 on gpu3" in plan and "under 1% of the work" in plan, plan
    # the CLI's plan line is the summary's
    path = tmp_path / "five.json"
    g.save(path)
    done = run_cli(
        "place",
        path,
        "--cluster",
        "k80x4",
        "--budget",
        "48",
        "--groups",
        "none",
        "--pin",
        "tiny_cpu=cpu",
        "--pin",
        "tiny_g3=gpu3",
        "--out",
        tmp_path / "run",
    )
    assert done.returncode == 0, done.stderr
    line = next(x for x in done.stdout.splitlines() if x.startswith("plan: "))
    assert {"cpu", "gpu3"} <= _named(line, r.cluster), line


def test_model_parallel_words_name_the_devices_under_five_percent():
    # the shipped 3 GB workload's answer in small: three GPUs do the work, 24 ops sit on the cpu and 24 on gpu3
    c = load_cluster("k80x4")
    n = 3 * 100 + 48
    g = OpGraph.build([f"op{k}" for k in range(n)], flops=[1e9] * n)
    where = np.array(
        [c.device_index(f"gpu{k % 3}") for k in range(300)]
        + [c.device_index("cpu")] * 24
        + [c.device_index("gpu3")] * 24
    )
    times = np.r_[np.full(300, 1.0), np.full(48, 1e-3)]
    words = describe_plan(g, c, where, times)
    assert words == (
        "model parallel over 3 devices (gpu0, gpu1, gpu2); also 24 ops on cpu, 24 on gpu3 (under 1% of the work)"
    )
    assert describe_plan(g, c, np.full(n, c.device_index("gpu0")), times) == "one device (gpu0)"


def _replicas_with_sharded_state(state_bytes: float):
    """Two micro-batches, each on its own GPU, two parameters (with their updates) each on one of them, and a
    logging op on the cpu: data parallelism's shape, the state split between the GPUs."""
    names = ["p0", "p1", "f0_mb0", "f1_mb0", "f0_mb1", "f1_mb1", "u0", "u1", "log"]
    edges = [
        (0, 2, GB),
        (0, 4, GB),
        (1, 3, GB),
        (1, 5, GB),
        (2, 3, GB),
        (4, 5, GB),
        (3, 6, 1e6),
        (5, 6, 1e6),
        (3, 7, 1e6),
        (5, 7, 1e6),
        (6, 8, 8),
        (7, 8, 8),
    ]
    g = OpGraph.build(
        names,
        edges,
        flops=[0, 0, 1e12, 1e12, 1e12, 1e12, 1e9, 1e9, 1e3],
        output_bytes=[GB, GB, GB, GB, GB, GB, 0, 0, 0],
        persistent_bytes=[state_bytes, state_bytes, 0, 0, 0, 0, 0, 0, 0],
        colocation=[0, 1, -1, -1, -1, -1, 0, 1, -1],
        microbatch=[-1, -1, 0, 0, 1, 1, -1, -1, -1],
        name="replicas",
    )
    pins = ["p0=gpu0", "f._mb0=gpu0", "p1=gpu1", "f._mb1=gpu1", "log=cpu"]
    return g, pins


@pytest.mark.parametrize(("state_gb", "sharded"), [(5.0, True), (1.0, False)])
def test_replicas_that_cannot_each_hold_the_state_are_sharded_data_parallelism(state_gb, sharded):
    g, pins = _replicas_with_sharded_state(state_gb * GB)
    r = postplace.place(g, "k80x2", budget=8, groups=None, pins=pins, report=False)
    plan = r.summary["plan"]
    assert r.placement.tolist() == [1, 2, 1, 1, 2, 2, 1, 2, 0]  # every op pinned: one placement whatever wins
    # each GPU holds its 5 GB share; holding both shares besides its activations would pass the 11.5 GB a K80 die
    # has (with 1 GB each, both fit, and the plan is plain data parallelism)
    peak = r.schedule.peak_memory
    assert all((peak[d] + state_gb * GB > 11.5 * GB) == sharded for d in (1, 2))
    assert plan.startswith("sharded data-parallel 2 (gpu0, gpu1)" if sharded else "data-parallel 2 (gpu0, gpu1)")
    assert ("each replica holds its share" in plan) == sharded
    assert plan.endswith("; also 1 op on cpu (under 1% of the work)"), plan


def test_a_practitioner_plan_names_a_cpu_its_step_uses():
    from postplace.api.result import Candidate
    from postplace.api.summary import plan_candidate_words

    c = load_cluster("k80x2")
    g = OpGraph.build(
        ["a", "b", "host"], [(0, 1, 1e6), (1, 2, 8)], flops=[1e9, 1e9, 1e3], allowed_kinds=[3, 3, 1], name="plan"
    )
    cand = Candidate("ddp", np.array([1, 2, 0]), 1.0, True, "", g, "ddp:m=2,dp=2")
    assert plan_candidate_words(cand, c) == "ddp over 2 GPUs (gpu0, gpu1), 2 micro-batches; also 1 op on cpu"
