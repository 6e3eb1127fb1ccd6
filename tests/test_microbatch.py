"""Micro-batched tracing: the step of m micro-batches, its structure, colocation modes and the file format."""

import numpy as np
import pytest
import torch
from torch import nn

from postplace.errors import PostplaceError
from postplace.graph import PHASES, GraphError, OpGraph
from postplace.graph.trace_torch import trace
from postplace.zoo import trace_model

pytestmark = pytest.mark.usefixtures("torch_one_thread")

FWD, BWD, UPD = (PHASES.index(p) for p in ("forward", "backward", "update"))


def two_layer():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3)).train()
    x, y = torch.randn(6, 4), torch.randint(0, 3, (6,))
    return model, x, y


def ce(out, y):
    return nn.functional.cross_entropy(out, y)


@pytest.mark.parametrize("m", [2, 3])
def test_every_micro_batch_gets_a_copy_of_forward_and_backward_and_the_update_runs_once(m):
    model, x, y = two_layer()
    one = trace(model, (x[: 6 // m],), ce, targets=(y[: 6 // m],)).graph
    g = trace(model, (x,), ce, targets=(y,), microbatches=m).graph
    per_mb = (one.phase == FWD) | (one.phase == BWD)
    one_types = [t for t, keep in zip(one.op_types, per_mb, strict=True) if keep]
    for k in range(m):  # the same ops for every micro-batch: one's, plus the loss scaling by 1/m and its backward
        types = [t for t, mb in zip(g.op_types, g.microbatch, strict=True) if mb == k]
        assert types.count("div") == one_types.count("div") + 2
        assert [t for t in types if t != "div"] == [t for t in one_types if t != "div"]
    acc = [i for i in range(g.num_ops) if g.names[i].startswith("acc")]
    assert len(acc) == (m - 1) * 4  # one sum per trained parameter per extra micro-batch
    assert all(g.phase[i] == BWD and g.microbatch[i] == -1 for i in acc)
    assert (g.phase == UPD).sum() == (one.phase == UPD).sum()  # one update
    assert g.metadata["microbatches"] == m
    # the update of each parameter reads the last gradient sum, never a micro-batch's own gradient
    upd = set(np.flatnonzero(g.phase == UPD))
    for e in range(g.num_edges):
        if g.edge_dst[e] in upd and g.microbatch[g.edge_src[e]] >= 0:
            pytest.fail(f"update {g.names[g.edge_dst[e]]} reads {g.names[g.edge_src[e]]} of one micro-batch")
    # FLOPs: every micro-batch does the work of one micro-batch-sized step
    mm, one_mm = (np.isin(h.op_types, ["addmm", "mm"]) for h in (g, one))
    assert g.flops[(g.microbatch >= 0) & mm].sum() == pytest.approx(m * one.flops[per_mb & one_mm].sum())


def test_colocation_none_keeps_micro_batches_apart_and_module_joins_them():
    model, x, y = two_layer()
    none = trace(model, (x,), ce, targets=(y,), microbatches=2, microbatch_colocation="none").graph
    mod = trace(model, (x,), ce, targets=(y,), microbatches=2, microbatch_colocation="module").graph
    for members in none.colocation_sets:
        assert len({int(none.microbatch[i]) for i in members} - {-1}) <= 1
    # also with a buffer that every micro-batch reads (GPT-2's causal mask) and tied weights
    gpt = trace_model("gpt2", "small", microbatches=2).graph
    for members in gpt.colocation_sets:
        assert len({int(gpt.microbatch[i]) for i in members} - {-1}) <= 1, gpt.names[members[0]]
    spans = [{int(mod.microbatch[i]) for i in members} - {-1} for members in mod.colocation_sets]
    assert {0, 1} in spans
    for i in range(mod.num_ops):  # mb0's op and its mb1 copy share a set
        if mod.names[i].startswith("mb0_") and mod.op_types[i] != "input":
            j = mod.index("mb1_" + mod.names[i][4:])
            assert mod.colocation[i] == mod.colocation[j] != -1, mod.names[i]
    # modules are recorded per op: a linear layer's forward and backward ops name it
    i, j = none.index("mb1_addmm"), none.index("mb1_addmm_1")
    assert (none.module[i], none.module[j]) == ("0", "2")


def test_bad_micro_batch_requests_are_one_line_errors():
    model, x, y = two_layer()
    with pytest.raises(PostplaceError, match="pick m dividing 6"):
        trace(model, (x,), ce, targets=(y,), microbatches=4)
    with pytest.raises(PostplaceError, match="give the targets"):
        trace(model, (x,), lambda out: ce(out, y), microbatches=2)
    with pytest.raises(PostplaceError, match="share one batch"):
        trace(model, (x,), ce, targets=(y[:4],), microbatches=2)
    with pytest.raises(PostplaceError, match="colocation"):
        trace(model, (x,), ce, targets=(y,), microbatches=2, microbatch_colocation="layer")
    with pytest.raises(PostplaceError, match="whole number"):
        trace(model, (x,), ce, targets=(y,), microbatches=0)


def test_graph_files_keep_micro_batch_and_module_and_old_files_still_load(tmp_path):
    model, x, y = two_layer()
    g = trace(model, (x,), ce, targets=(y,), microbatches=2).graph
    g.save(tmp_path / "g.json")
    back = OpGraph.load(tmp_path / "g.json")
    assert back.microbatch.tolist() == g.microbatch.tolist() and back.module == g.module
    d = g.to_dict()
    del d["ops"]["microbatch"], d["ops"]["module"]  # a file written before these fields existed
    old = OpGraph.from_dict(d)
    assert old.microbatch.tolist() == [-1] * g.num_ops and old.module == ("",) * g.num_ops
    with pytest.raises(GraphError, match="'microbatch'"):
        OpGraph.build(["a"], microbatch=[-2])
    with pytest.raises(GraphError, match="'module' has 2 entries"):
        OpGraph.build(["a"], module=["x", "y"])


# ------------------------------------------------------------------------------ real execution
def eager_accumulation(model, inputs, loss_fn, targets, m, steps):
    """Eager gradient accumulation: per step, m backward passes of loss / m, then torch.optim.SGD."""
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    b = inputs[0].shape[0] // m
    losses = []
    for _ in range(steps):
        torch.manual_seed(123)  # dropout draws the same masks, micro-batch by micro-batch
        opt.zero_grad()
        total = 0.0
        for k in range(m):
            part = slice(k * b, (k + 1) * b)
            loss = loss_fn(model(*(x[part] for x in inputs)), *(t[part] for t in targets)) / m
            loss.backward()
            total += loss.item()
        opt.step()
        losses.append(total)
    return losses


# Every zoo model's placed micro-batched step against eager gradient accumulation: tests/test_runtime_microbatch.py
# (the same models at m = 2, CNNs at a batch of 4, plus m = 4, to tighter tolerances; this file's copy of
# that test, at rtol 1e-4, was removed as a duplicate).


def test_train_command_runs_a_micro_batched_step(tmp_path):
    from postplace.runtime.cli import cmd_train

    text = cmd_train("gpt2", "single:cpu", 2, size="small", microbatches=2, threads=1)
    assert "gpt2-small-mb2-none" in text and "measured step time" in text
    with pytest.raises(PostplaceError, match="equal micro-batches"):
        cmd_train("gpt2", "single:cpu", 1, size="small", microbatches=3)


# ------------------------------------------------------------------------------ memory
def deep_mlp():
    """Four Linear(128, 128) + ReLU blocks, a batch of 256, an MSE loss: its step holds about 1.5-1.8 MB
    on one device (parameters, momentum, the live activations), depending on m."""
    torch.manual_seed(0)
    h, b = 128, 256
    model = nn.Sequential(*[nn.Sequential(nn.Linear(h, h), nn.ReLU()) for _ in range(4)]).train()
    return model, torch.randn(b, h), torch.randn(b, h)


def mse(out, t):
    return ((out - t) ** 2).mean()


def test_a_two_stage_pipeline_holds_less_than_one_device_and_more_micro_batches_in_flight_hold_more():
    """The simulator's memory of a hand-made two-stage pipeline of the MLP (stages split by
    ``OpGraph.module``: blocks 0-1 and the inputs on gpu0, blocks 2-3 and the loss on gpu1): a capacity
    exists that no single device meets at any m, nor the pipeline at m = 1 (each stage holds its half of
    the whole batch's activations), but the pipeline at m = 4 does (a quarter of the batch per
    micro-batch); m = 8 holds more again (more micro-batches in flight), and m = 4 overlaps the stages."""
    from postplace.sim import Simulator
    from postplace.testing import star_cluster

    model, x, y = deep_mlp()
    big = star_cluster(("gpu", "gpu"), bandwidth=1e10)
    peaks, times = {}, {}
    for m in (1, 2, 4, 8):
        g = trace(model, (x,), mse, targets=(y,), microbatches=m).graph
        stage = np.array([1 if mod.split(".")[0] in ("2", "3", "(loss)") else 0 for mod in g.module])
        sim = Simulator(g, big)
        r = sim.evaluate_ops(np.stack([np.zeros(g.num_ops, dtype=int), stage]))
        peaks[m] = (r.peak_mem[0].max(), r.peak_mem[1].max())  # (one device, worst pipeline stage)
        times[m] = r.step_time[1]
    capacity = (peaks[4][1] + min(peaks[1][1], *(one for one, _ in peaks.values()))) / 2
    assert peaks[4][1] < capacity < peaks[1][1]
    assert all(one > capacity for one, _ in peaks.values())  # no m makes it fit one device
    assert peaks[8][1] > peaks[4][1]  # the pipelining trade-off: more in flight, more held
    assert times[4] < times[1]  # and the micro-batches overlap across the stages
    small = star_cluster(("gpu", "gpu"), bandwidth=1e10, memory=capacity)
    for m, want in ((1, [True, True]), (4, [True, False])):
        g = trace(model, (x,), mse, targets=(y,), microbatches=m).graph
        stage = np.array([1 if mod.split(".")[0] in ("2", "3", "(loss)") else 0 for mod in g.module])
        r = Simulator(g, small).evaluate_ops(np.stack([np.zeros(g.num_ops, dtype=int), stage]))
        assert r.oom.tolist() == want, m


def test_place_spreads_a_step_that_no_single_device_holds_and_fits_every_device(tmp_path):
    """``postplace.place`` on two GPUs (a cluster file) each of 3/4 of the least the MLP's step needs on
    one device at any micro-batch count: the single device is reported infeasible, and the answer is a
    placement over both GPUs whose simulated peak fits each of them."""
    import postplace
    from postplace.sim import Simulator
    from postplace.testing import star_cluster

    model, x, y = deep_mlp()
    counts = (1, 2, 4, 8)  # what place tries: powers of two dividing the batch of 256, up to max(8, 2 GPUs)
    graphs = {m: trace(model, (x,), mse, targets=(y,), microbatches=m).graph for m in counts}
    roomy = star_cluster(("gpu",))
    need = min(
        Simulator(g, roomy).evaluate_ops(np.zeros((1, g.num_ops), dtype=int)).peak_mem[0, 0] for g in graphs.values()
    )
    capacity = 0.75 * float(need)
    (tmp_path / "two.toml").write_text(f"""name = "two-small-gpus"
[[device]]
names = ["gpu0", "gpu1"]
kind = "gpu"
peak_flops = 1e13
memory_bandwidth = 1e12
memory = {capacity!r}
launch_overhead = 1e-5
[[switch]]
name = "hub"
[[link]]
a = "gpu0"
b = "hub"
bandwidth = 1e10
[[link]]
a = "gpu1"
b = "hub"
bandwidth = 1e10
""")
    r = postplace.place(
        model, tmp_path / "two.toml", budget=48, groups=16, step=postplace.Step(inputs=(x,), loss_fn=mse, targets=(y,))
    )
    s = r.summary
    assert s["microbatch_counts"] == list(counts)
    assert s["single_device"] is None and s["single_device_step_time_s"] is None
    singles = {k: v for k, v in s["candidates"].items() if k.startswith("single")}
    assert singles and all(v is None for v in singles.values())  # OOM at every m
    assert any(k.startswith(("param-server @m", "param-server (sharded state) @m")) for k in s["candidates"])
    assert s["best_step_time_s"] == min(v for v in s["candidates"].values() if v is not None)
    assert set(r.mapping().values()) == {"gpu0", "gpu1"}
    g = graphs[s["microbatches"]]
    if s.get("returned_plan"):  # a practitioner plan answers with its rewrite of the step at m
        assert r.graph.name.startswith(g.name + "+") and r.graph.num_ops > g.num_ops
    else:
        assert r.graph.num_ops == g.num_ops
    again = Simulator(r.graph, r.cluster).evaluate_ops(r.placement[None])
    assert not again.oom[0] and np.all(again.peak_mem[0] <= capacity)
    assert again.step_time[0] == pytest.approx(r.step_time_s)
    assert sorted(s["peak_memory_bytes"].values()) == sorted(again.peak_mem[0].tolist())


# ------------------------------------------------------------------------------ search over m
def test_place_over_m_on_a_module_with_targets_splits_the_budget_by_halving_and_returns_the_best():
    import postplace
    from postplace.testing import star_cluster

    torch.manual_seed(0)
    model = nn.Sequential(*[nn.Sequential(nn.Linear(64, 64), nn.ReLU()) for _ in range(4)]).train()
    x, y = torch.randn(64, 64), torch.randn(64, 64)
    r = postplace.place(
        model,
        star_cluster(("gpu", "gpu")),
        budget=4 * 96,
        strategy="random",
        groups=16,
        step=postplace.Step(inputs=(x,), loss_fn=lambda o, t: ((o - t) ** 2).mean(), targets=(y,)),
    )
    s = r.summary
    assert s["microbatch_counts"] == [1, 2, 4, 8]  # batch 64, 2 GPUs: up to max(8, 2)
    # rounds of 4, 2, 1 counts, 384 / 3 = 128 samples a round: 32 each, then 64, then 128
    assert sorted(s["samples_per_microbatches"].values()) == [32, 32, 32 + 64, 32 + 64 + 128]
    assert s["halving_rounds"][0] == [1, 2, 4, 8] and len(s["halving_rounds"][1]) == 2
    feasible = [v for v in s["candidates"].values() if v is not None]
    assert r.step_time_s == min(feasible)
    assert r.graph.metadata.get("microbatches", 1) == s["microbatches"]
    assert s["best_step_time_s"] >= s["lower_bound_s"]
    assert set(r.mapping().values()) <= {"gpu0", "gpu1"} and len(r.mapping()) == r.graph.num_ops


def test_grouping_keeps_micro_batches_apart_under_none_and_sets_whole_under_module():
    from postplace.graph.grouping import group_ops

    model, x, y = two_layer()
    for mode in ("none", "module"):
        g = trace(model, (x,), ce, targets=(y,), microbatches=3, microbatch_colocation=mode).graph
        gr = group_ops(g, 4)
        for members in g.colocation_sets:  # a colocation set is never split
            assert len(set(gr.group_of_op[members].tolist())) == 1
        spans = [set(g.microbatch[gr.members(k)].tolist()) - {-1} for k in range(gr.num_groups)]
        if mode == "none":
            assert all(len(s) <= 1 for s in spans)  # micro-batch i can go to device i
        else:
            assert any(s == {0, 1, 2} for s in spans)


def test_data_parallel_placement_puts_micro_batch_k_on_gpu_k_and_shards_the_parameters():
    from postplace.placers.data_parallel import data_parallel_placement
    from postplace.sim import Simulator
    from postplace.testing import star_cluster

    model, x, y = two_layer()
    g = trace(model, (x,), ce, targets=(y,), microbatches=2).graph
    cluster = star_cluster(("cpu", "gpu", "gpu"))
    dev = data_parallel_placement(g, cluster)
    for k in (0, 1):
        assert set(dev[g.microbatch == k].tolist()) == {1 + k}
    params = [i for i, t in enumerate(g.op_types) if t == "parameter"]
    assert set(dev[params].tolist()) == {1, 2}  # both GPUs hold parameters
    r = Simulator(g, cluster).evaluate_ops(dev[None])
    assert not r.failed[0]  # colocation respected


def test_place_searches_a_micro_batched_step_and_auto_returns_the_best_m(tmp_path):
    """``place(..., microbatches=2)`` places the two-micro-batch graph (its summary says m, and its
    placement re-simulates to the returned time); ``microbatches="auto"`` runs every m dividing the
    batch, each search in its own subfolder of the run, and returns the fastest, with every m's best."""
    import postplace
    from postplace.cluster.placement import load_placement
    from postplace.errors import PostplaceError
    from postplace.sim import Simulator

    r2 = postplace.place("gpt2", "k80x2", size="small", budget=48, out=tmp_path / "m2", microbatches=2)
    assert r2.summary["microbatches"] == 2 and r2.summary["microbatch_colocation"] == "none"
    assert set(r2.graph.microbatch.tolist()) >= {0, 1}
    ops = load_placement(tmp_path / "m2" / "placement.json", r2.graph, r2.cluster)
    assert Simulator(r2.graph, r2.cluster).evaluate_ops(ops[None]).step_time[0] == pytest.approx(r2.step_time_s)

    auto = postplace.place("gpt2", "k80x2", size="small", budget=96, out=tmp_path / "auto", microbatches="auto")
    best = auto.summary["best_per_microbatches"]
    assert set(best) == {"1", "2"}  # the small config's batch of 2 allows m = 1 and 2
    assert auto.step_time_s == min(best.values())
    assert best[str(auto.summary["microbatches"])] == auto.step_time_s
    assert (tmp_path / "auto" / "m1" / "history.jsonl").exists() and (tmp_path / "auto" / "summary.json").exists()
    with pytest.raises(PostplaceError, match="--microbatches"):
        postplace.place("gpt2", "k80x2", size="small", budget=8, microbatches=0)
