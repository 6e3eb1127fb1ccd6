"""A micro-batch size per GPU model (``mbs=``): the plan text, the layered estimate, the search's size decision."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest

from postplace.cluster import load_cluster
from postplace.errors import PostplaceError
from postplace.placers.layered import estimate_plan, measured_rule, measured_sizes
from postplace.placers.layered_search import layered_space, search_plan, size_options
from postplace.placers.practitioner import plan_devices, plan_step, plan_words, sized_graph
from postplace.plans import PlanSpec, apply_plan, parse_plan, sized_step
from postplace.plans.sizes import SIZES_KEY

A100, V100 = "A100-40GB", "V100-16GB"


@pytest.fixture(scope="module")
def mixed():
    """LLaMA-1B cut to 2 blocks, in fp16, on ``mixed`` (4 A100 40 GB and 4 V100 16 GB): the step traced as two
    micro-batches of n sequences, and the units measured at each size on each model, memoised."""
    from postplace.zoo import trace_model

    cluster = load_cluster("mixed")
    gpus = [d for d, dev in enumerate(cluster.devices) if dev.kind == "gpu"]
    graphs, costs = {}, {}

    def graph_at(n):
        if n not in graphs:
            graphs[n] = trace_model(
                "llama", f"1b@{2 * n}", "adamw", precision="fp16", microbatches=2, layers=2, init=False
            ).graph
        return graphs[n]

    def sized(sizes, rule=""):
        if (sizes, rule) not in costs:
            costs[sizes, rule] = measured_sizes(graph_at, cluster, gpus, rule, sizes)
        return costs[sizes, rule]

    return cluster, gpus, graph_at, sized


def _tracer(size: str, m: int, layers: int, optimizer: str):
    """``at(n)``: LLaMA ``size`` with ``layers`` blocks in fp16, its whole step as ``m`` micro-batches of n sequences
    (the op level's), memoised."""
    from postplace.zoo import trace_model

    graphs = {}

    def at(n):
        if n not in graphs:
            graphs[n] = trace_model(
                "llama", f"{size}@{m * n}", optimizer, precision="fp16", microbatches=m, layers=layers, init=False
            ).graph
        return graphs[n]

    return at


@pytest.fixture(scope="module")
def whole_at():
    """The same model's whole step (2 blocks) as 8 micro-batches of n sequences."""
    return _tracer("1b", 8, 2, "adamw")


def test_the_plan_text_round_trips_and_says_it_in_words():
    spec = parse_plan(f"fsdp+recompute:tp=2,sp,m=64,mbs=H100:6/{A100}:2")
    assert spec.micro_sizes == (("H100", 6), (A100, 2))
    assert parse_plan(str(spec)) == spec
    words = plan_words(spec, [f"gpu{k}" for k in range(64)], 64)
    assert "64 micro-batches of 6 sequences on the H100s, 2 sequences on the A100-40GBs" in words


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("fsdp:mbs=H100:0", "give 1 to 4096"),
        ("fsdp:mbs=H100:1/H100:2", "names GPU model H100 twice"),
        ("ddp:pp=2,m=4,mbs=H100:1", "drop pp or mbs"),
        ("fsdp:mbs=H100", "mbs=GPU:N/GPU:N"),
    ],
)
def test_bad_sizes_are_one_line(text, says):
    with pytest.raises(PostplaceError, match=says) as info:
        parse_plan(text)
    assert "\n" not in str(info.value)


def test_a_sized_step_takes_each_micro_batch_from_its_own_trace(whole_at):
    """Micro-batches 0-5 of 3 sequences, 6-7 of 1: each micro-batch's ops and the bytes they send are its own
    trace's, the shared ops (parameters, gradient sums, the update) every trace's; the batch is 20."""
    three, one = whole_at(3), whole_at(1)
    sizes = [3] * 6 + [1] * 2
    step = sized_step({3: three, 1: one}, sizes)
    mb = np.asarray(step.microbatch)
    late, shared = mb >= 6, mb < 0
    assert np.array_equal(step.flops[late], one.flops[late]) and np.array_equal(step.flops[~late], three.flops[~late])
    assert np.array_equal(step.output_bytes[late], one.output_bytes[late])
    assert np.array_equal(three.flops[shared], one.flops[shared])
    sent = late[step.edge_src]
    assert np.array_equal(step.edge_bytes[sent], one.edge_bytes[sent])
    assert np.array_equal(step.edge_bytes[~sent], three.edge_bytes[~sent])
    assert step.flops[late].sum() < three.flops[late].sum()  # a third of the work, and not nothing
    assert step.metadata[SIZES_KEY] == sizes and step.metadata["zoo"]["config"]["batch"] == 20


def test_a_step_of_other_ops_or_no_stamp_is_refused_in_one_line(mixed, whole_at):
    from postplace.zoo import trace_model

    cluster, gpus, _, _ = mixed
    deeper = trace_model("llama", "1b@8", "adamw", precision="fp16", microbatches=8, layers=3, init=False).graph
    spec = parse_plan(f"ddp:m=8,mbs={A100}:2/{V100}:1")
    for call, says in (
        (lambda: sized_step({2: whole_at(2), 1: deeper}, [2, 1] * 4), "has other ops than at 2"),
        (lambda: sized_step({2: whole_at(2)}, [2, 1] * 4), "no trace at 1 sequences"),
        (lambda: apply_plan(whole_at(2), spec, 8), "needs the step traced at each size and joined"),
        (
            lambda: plan_step(sized_step({2: whole_at(2), 1: whole_at(1)}, [1, 2] * 4), cluster, spec, gpus),
            "not of the sizes",
        ),
    ):
        with pytest.raises(PostplaceError, match=says) as info:
            call()
        assert "\n" not in str(info.value)


def test_each_replica_runs_its_own_micro_batches_at_its_models_size():
    """16 micro-batches over 8 replicas (2 each), 3 sequences on the A100s, 1 on the V100s: micro-batches 0-7 are
    the A100 replicas' (as data_parallel deals them, r*2 and r*2 + 1) and of 3, so each A100 computes 3 times
    what a V100 does, op by op."""
    cluster = load_cluster("mixed")
    gpus = [d for d, dev in enumerate(cluster.devices) if dev.kind == "gpu"]
    spec = parse_plan(f"ddp:m=16,mbs={A100}:3/{V100}:1")
    step = sized_graph(_tracer("small", 16, 1, "sgd"), cluster, spec, gpus)
    assert step.metadata[SIZES_KEY] == [3] * 8 + [1] * 8 and step.metadata["zoo"]["size"] == "small@32"
    r = plan_step(step, cluster, spec, gpus)
    mb = np.asarray(r.graph.microbatch)
    work = {d: float(r.graph.flops[(r.placement == d) & (mb >= 0)].sum()) for d in gpus}
    a100 = [work[d] for d in gpus if cluster.devices[d].model == A100]
    v100 = [work[d] for d in gpus if cluster.devices[d].model == V100]
    assert len(set(a100)) == 1 and len(set(v100)) == 1
    assert a100[0] / v100[0] == pytest.approx(3.0, rel=0.02)


def test_sizes_that_do_not_match_the_plan_are_one_line(mixed, whole_at):
    """A model the plan's GPUs are not, a sized step priced as a plain plan, a stamp of another count."""
    from postplace.api.plans import simulate_plan

    cluster, gpus, _, _ = mixed
    sized = sized_graph(whole_at, cluster, parse_plan(f"ddp:m=8,mbs={A100}:3/{V100}:1"), gpus)
    for call, says in (
        (
            lambda: simulate_plan(
                "llama", "mixed", f"ddp:m=8,mbs={A100}:3/{V100}:1/H100:2", size="small@16", precision="fp16"
            ),
            "names H100, which none of its GPUs is",
        ),
        (lambda: plan_step(sized, cluster, parse_plan("ddp:m=8"), gpus), "a plan without mbs= runs the step"),
        (lambda: apply_plan(sized, parse_plan("ddp:m=8"), 8), "give the plan its mbs="),
        (
            lambda: apply_plan(
                replace(sized, metadata={**sized.metadata, SIZES_KEY: [3, 3, 1, 1]}),
                parse_plan(f"ddp:m=8,mbs={A100}:3/{V100}:1"),
                8,
            ),
            "names 4 micro-batches and the step has 8",
        ),
    ):
        with pytest.raises(PostplaceError, match=says) as info:
            call()
        assert "\n" not in str(info.value)


def test_an_even_split_is_the_plain_plan_op_by_op(mixed, whole_at):
    """Both models at 2 sequences, joined from one trace: the plain plan's step and peaks to the last bit."""
    cluster, gpus, _, _ = mixed
    for level in ("ddp", "fsdp"):
        spec = parse_plan(f"{level}:m=8,mbs={A100}:2/{V100}:2")
        even = plan_step(sized_graph(whole_at, cluster, spec, gpus), cluster, spec, gpus)
        plain = plan_step(whole_at(2), cluster, parse_plan(f"{level}:m=8"), gpus)
        assert even.step_time_s == plain.step_time_s
        assert np.array_equal(even.peak_memory_bytes, plain.peak_memory_bytes)


def test_op_by_op_the_fast_gpus_taking_more_shorten_the_step_and_the_estimate_agrees(mixed, whole_at):
    """The op level, where every GPU runs at its own speed: 3 sequences on each A100 and 1 on each V100 is
    shorter than 2 on each, the V100s taking 3 longer; the layered estimate within 12% of each (as on plain
    plans over two GPU models), and the V100s' peak, their own micro-batches', below the A100s'."""
    cluster, gpus, _, sized = mixed

    def both(a, v):
        spec = parse_plan(f"ddp:m=8,mbs={A100}:{a}/{V100}:{v}")
        op = plan_step(sized_graph(whole_at, cluster, spec, gpus), cluster, spec, gpus)
        est = estimate_plan(sized(spec.micro_sizes), cluster, spec, gpus)
        assert est.step_time_s == pytest.approx(op.step_time_s, rel=0.12), (a, v)
        return op

    fast, even, slow = both(3, 1), both(2, 2), both(1, 3)
    assert fast.step_time_s < even.step_time_s < slow.step_time_s
    peaks = fast.peak_memory_bytes[gpus]
    v100 = [k for k, d in enumerate(gpus) if cluster.devices[d].model == V100]
    a100 = [k for k, d in enumerate(gpus) if cluster.devices[d].model == A100]
    assert max(peaks[v100]) < min(peaks[a100])


def test_an_even_split_written_as_sizes_prices_as_the_plain_plan(mixed):
    """Both models at 2 sequences: the same units, the same tasks, the same step and peak to the last bit."""
    cluster, gpus, graph_at, sized = mixed
    plain = estimate_plan(measured_rule(graph_at(2), cluster, gpus, ""), cluster, parse_plan("ddp:m=8"), gpus)
    sizes = parse_plan(f"ddp:m=8,mbs={A100}:2/{V100}:2")
    even = estimate_plan(sized(sizes.micro_sizes), cluster, sizes, gpus)
    assert (even.step_time_s, even.peak_bytes) == (plain.step_time_s, plain.peak_bytes)


def test_the_fast_gpus_taking_more_shorten_a_step_the_slow_ones_bound(mixed):
    """DDP waits for its slowest replica: 3 sequences per micro-batch on each A100 and 1 on each V100 is shorter
    than 2 on each, and giving the V100s the 3 is longer than both."""
    cluster, gpus, _, sized = mixed

    def step(a, v):
        spec = parse_plan(f"ddp:m=8,mbs={A100}:{a}/{V100}:{v}")
        return estimate_plan(sized(spec.micro_sizes), cluster, spec, gpus).step_time_s

    assert step(3, 1) < step(2, 2) < step(1, 3)


def test_each_model_holds_its_own_micro_batches(mixed):
    """Each model's peak is held against its own memory: 3 sequences per micro-batch overflow a 16 GB V100 and
    fit a 40 GB A100, and the V100s, the fullest, report a peak that grows with their own size."""
    cluster, gpus, _, sized = mixed

    def priced(a, v):
        spec = parse_plan(f"zero1:m=8,mbs={A100}:{a}/{V100}:{v}")
        return estimate_plan(sized(spec.micro_sizes), cluster, spec, gpus)

    assert priced(1, 3).oom and not priced(3, 1).oom
    assert priced(1, 3).peak_bytes > priced(2, 2).peak_bytes > priced(3, 1).peak_bytes


def test_units_measured_at_another_size_are_refused(mixed):
    cluster, gpus, graph_at, sized = mixed
    spec = parse_plan(f"ddp:m=8,mbs={A100}:3/{V100}:1")
    with pytest.raises(PostplaceError, match="measured at 2 sequences per micro-batch, not 3"):
        estimate_plan(sized(((A100, 2), (V100, 1))), cluster, spec, gpus)
    with pytest.raises(PostplaceError, match="measured at the plan-wide sequences"):
        estimate_plan(measured_rule(graph_at(2), cluster, gpus, ""), cluster, spec, gpus)
    with pytest.raises(PostplaceError, match=f"no micro-batch size to its {V100} GPUs"):
        estimate_plan(sized(spec.micro_sizes), cluster, parse_plan(f"ddp:m=8,mbs={A100}:3"), gpus)


def test_the_size_columns_counted_by_hand():
    """64 GPUs, 32 of each model, a batch of 256 from m=128: per replica 1 micro-batch of a + b = 8 sequences
    over the two models (a != b, each 1..8: 6 ways) or 2 of a + b = 4 (1/3, 3/1); 4 of 1 + 1 is the even split."""
    cluster = load_cluster("mixed8x8")
    spec = parse_plan("fsdp:m=128")
    devices = plan_devices(cluster, spec)
    options = size_options(spec, 256, cluster, devices)
    assert options[0] == (128, None)
    pairs = sorted((m, dict(s)["H100"], dict(s)["A100-80GB"]) for m, s in options[1:])
    assert pairs == [(64, a, 8 - a) for a in (1, 2, 3, 5, 6, 7)] + [(128, 1, 3), (128, 3, 1)]
    assert size_options(spec, 256, load_cluster("dgx8x8"), plan_devices(load_cluster("dgx8x8"), spec)) == ()


def test_the_search_decides_the_sizes_and_prices_what_it_decodes(mixed):
    """The size decision is the space's last row: column 0 the base, the others the uneven splits; what the
    search returns is a plan ``estimate_plan`` prices again to the same number, never slower than the base."""
    cluster, gpus, graph_at, sized = mixed
    base_spec = parse_plan("zero1:m=8")
    measured = {r: measured_rule(graph_at(2), cluster, gpus, r) for r in ("", "full")}
    base = estimate_plan(measured[""], cluster, base_spec, gpus)
    options = size_options(base_spec, 16, cluster, gpus)
    space = layered_space(
        base, base_spec, measured[""], measured["full"], gpus, sizes=options, measure_sized=lambda s, r: sized(s, r)
    )
    row = [0] * space.space.num_units
    assert space.decode(row) == base_spec
    row[-1] = next(j for j, (_, s) in enumerate(options) if s == ((A100, 3), (V100, 1)))
    assert space.decode(row).micro_sizes == ((A100, 3), (V100, 1))
    assert not space.decode(row).recompute
    row[-1] += len(options)  # the same split, every block recomputed whole: the memory it needs
    assert space.decode(row).recompute and space.decode(row).recompute_units is None
    assert space.space.allowed[-1].sum() == 2 * len(options)
    found = search_plan(space, cluster, strategy="local", samples=24, seed=0)
    again = estimate_plan(space.costs_of(found.best), cluster, found.best, gpus)
    assert again.step_time_s == pytest.approx(found.result.step_time_s, rel=1e-12)
    assert found.result.step_time_s < base.step_time_s
    assert (
        found.best.micro_sizes is not None and dict(found.best.micro_sizes)[A100] > dict(found.best.micro_sizes)[V100]
    )


def test_simulate_prices_it_layered_and_op_by_op(capsys):
    from tests.clihelp import cli_error, run_cli

    base = ["simulate", "llama", "--size", "small@16", "--cluster", "mixed", "--precision", "fp16"]
    ok = run_cli(*base, "--plan", f"ddp:m=8,mbs={A100}:3/{V100}:1", "--layered")
    assert ok.returncode == 0, ok.stderr
    assert "layered estimate" in ok.stdout and "3 sequences on the A100-40GBs" in ok.stdout
    wrong = cli_error([*base, "--plan", f"ddp:m=8,mbs={A100}:3/{V100}:3", "--layered"], capsys)
    assert "make 24 sequences, not the batch of 16" in wrong
    op = run_cli(*base, "--plan", f"ddp:m=8,mbs={A100}:3/{V100}:1", "--json")
    assert op.returncode == 0, op.stderr
    assert json.loads(op.stdout)["plan"] == f"ddp:m=8,mbs={A100}:3/{V100}:1"
    wrong = cli_error([*base, "--plan", f"ddp:m=8,mbs={A100}:3/{V100}:3"], capsys)
    assert "make 24 sequences, not the batch of 16" in wrong
    assert PlanSpec("ddp").micro_sizes is None


def test_launch_refuses_it_in_one_line():
    from postplace.runtime.launcher import launch_plan

    with pytest.raises(PostplaceError, match="simulated only") as info:
        launch_plan(None, f"ddp:m=8,mbs={A100}:3/{V100}:1", load_cluster("mixed"), steps=1)
    assert "\n" not in str(info.value)


def test_a_tensor_group_of_two_models_is_refused(mixed):
    """Without its first A100 the mixed preset's tensor groups of 2 pair the last A100 with the first V100: that
    group would run one size, whichever model its first GPU is; the estimate and the batch check say so."""
    cluster, gpus, _, sized = mixed
    spec = parse_plan(f"fsdp:tp=2,m=3,mbs={A100}:4/{V100}:1")
    devices = gpus[1:7]
    with pytest.raises(PostplaceError, match="a tensor group of A100-40GB and V100-16GB GPUs runs one micro-batch"):
        estimate_plan(sized(spec.micro_sizes), cluster, spec, devices)
    assert size_options(parse_plan("fsdp:tp=2,m=3"), 9, cluster, devices) == ()


def test_every_gpu_reports_its_own_models_peak(mixed):
    """The A100s hold 3 sequences, the V100s 1: each GPU's peak is its own model's, as the same plan priced with
    both models at the A100s' size gives the A100s."""
    cluster, gpus, _, sized = mixed
    spec = parse_plan(f"zero1:m=8,mbs={A100}:3/{V100}:1")
    r = estimate_plan(sized(spec.micro_sizes), cluster, spec, gpus)
    both = parse_plan(f"zero1:m=8,mbs={A100}:3/{V100}:3")
    at_three = estimate_plan(sized(both.micro_sizes), cluster, both, gpus)
    a100 = [k for k, d in enumerate(gpus) if cluster.devices[d].model == A100]
    v100 = [k for k, d in enumerate(gpus) if cluster.devices[d].model == V100]
    assert {r.gpu_peaks[k] for k in a100} == {at_three.gpu_peaks[a100[0]]}
    assert max(r.gpu_peaks[k] for k in v100) < min(r.gpu_peaks[k] for k in a100)


def test_place_layered_names_the_micro_batch_count_its_answer_runs():
    """The size decision moves m (the reviewer's find: the words kept the base's count)."""
    from postplace.api.layered import place_layered

    r = place_layered("llama", "mixed", size="small@64", optimizer="adamw", precision="fp16", samples=48, bases=1)
    spec = parse_plan(r.plan)
    assert spec.micro_sizes is not None  # on this seed the search's answer splits unevenly
    assert f"{spec.microbatches} micro-batches of " in r.words
