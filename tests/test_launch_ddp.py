"""The ``ddp`` and ``zero1`` plans run as one gloo process per replica (issue 33): each rank its
micro-batches and an all-reduce of every gradient (``zero1``: then the update of the parameters it owns
alone, with their optimizer state alone, and an all-gather of the updated parameters), the step's loss and
parameters after 3 steps equal to the one-process step within fp32 rounding (the sums run in another
order), and each rank moving the bytes the simulated plan's collectives hold."""

from __future__ import annotations

import operator

import numpy as np
import pytest
import torch
from torch import nn

from postplace.cluster import load_cluster
from postplace.errors import PostplaceError
from postplace.graph.trace_torch import trace
from postplace.plans import data_parallel
from postplace.runtime.ddp import ddp_plan
from postplace.runtime.launcher import RandomBatches, launch_plan
from tests.launchhelp import launched_run_folder, one_process

pytestmark = pytest.mark.usefixtures("torch_one_thread")

K80X4 = load_cluster("k80x4")  # cpu, gpu0..gpu3


def mlp_step(m: int, optimizer="adamw"):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 4))
    x, y = torch.randn(8, 16), torch.randint(0, 4, (8,))
    return trace(model, (x,), nn.functional.cross_entropy, optimizer, microbatches=m, targets=(y,))


@pytest.mark.parametrize("replicas", [2, 4])
def test_ddp_trains_as_one_process_does(replicas):
    res = launch_plan(mlp_step(4), f"ddp:m=4,dp={replicas}", K80X4, steps=3, batches=RandomBatches(0), seed=0)
    losses, params = one_process(mlp_step(4), 3)
    assert res.losses == pytest.approx(losses, rel=1e-6)
    assert losses[2] < losses[0]  # it trains
    assert list(res.parameters) == list(params)
    for name, p in params.items():
        torch.testing.assert_close(res.parameters[name], p.cpu(), rtol=1e-5, atol=1e-6)
    assert sorted(res.ranks.values()) == [f"gpu{i}" for i in range(replicas)]
    planned = data_parallel(mlp_step(4).graph, replicas, "ddp")
    simulated = sum(c.nbytes for c in planned.graph.collectives if c.kind == "all_reduce")
    grads = (16 * 32 + 32 + 32 * 4 + 4) * 4
    assert simulated == grads
    assert all(b == grads for b in res.bytes_sent.values())  # every rank all-reduces every gradient once


def test_each_replica_runs_its_own_micro_batches():
    plan = ddp_plan(mlp_step(4), [1, 2], K80X4.device_names)
    for r, prog in enumerate(plan.programs):
        names = {n.name for n in prog.gm.graph.nodes if n.op == "call_function"}
        mine = {f"mb{2 * r}_", f"mb{2 * r + 1}_"}
        assert any(n.startswith(tuple(mine)) for n in names)
        assert not any(n.startswith("mb") and not n.startswith(tuple(mine)) for n in names)
    again = ddp_plan(mlp_step(4), [1, 2], K80X4.device_names)
    assert [c.value for c in plan.collectives] == [c.value for c in again.collectives]  # one order, every time
    grads = (16 * 32 + 32 + 32 * 4 + 4) * 4
    assert len(plan.collectives) == 1 and plan.collectives[0].nbytes == grads  # one 25 MB bucket holds them all
    small = ddp_plan(mlp_step(4), [1, 2], K80X4.device_names, bucket_bytes=2100)  # the first layer's weight alone
    assert [c.nbytes for c in small.collectives] == [2048, grads - 2048]  # in the order the gradients are final


def test_plans_launch_does_not_run_are_one_line():
    with pytest.raises(PostplaceError, match=r"ZeRO-2 or a per-unit hybrid in a pipeline is simulated only") as e:
        launch_plan(mlp_step(4), "zero2:m=4,pp=2", K80X4)
    assert "\n" not in str(e.value)
    with pytest.raises(PostplaceError, match="traced as 4"):
        launch_plan(mlp_step(4), "ddp:m=8", K80X4)
    with pytest.raises(PostplaceError, match="micro-batch count they divide"):
        ddp_plan(mlp_step(4), [1, 2, 3], K80X4.device_names)


@pytest.mark.parametrize("plan", ["ddp:m=2,dp=2"])  # zero1, zero2: the same run-folder path (launchable)
def test_launch_runs_a_run_folders_ddp_plan(tmp_path, plan):
    """A run folder whose returned plan is ``ddp:m=2,dp=2`` (GPT-2 small on two K80s): ``postplace launch``
    runs it as two processes, the losses those of the one-process step, the bytes the simulated plan's."""
    from tests.clihelp import run_cli

    folder, out, losses = launched_run_folder(tmp_path / "run", plan)
    assert out["losses"] == pytest.approx(losses, rel=1e-6)
    assert out["bytes_sent"] == out["simulated_bytes_sent"] and set(out["ranks"].values()) == {"gpu0", "gpu1"}
    text = run_cli("launch", folder, "--steps", "1")
    assert "2 processes by torch's elastic launcher, 0 messages and" in text.stdout, text.stdout


def _torch_ddp_rank(rank: int, world: int, store: str, steps, out: str, zero: bool = False) -> None:
    """One rank of torch's own DistributedDataParallel on the MLP: its slice of each batch, AdamW (``zero``:
    torch's ZeroRedundancyOptimizer, each rank the state and update of its own parameters)."""

    import torch.distributed as dist

    torch.set_num_threads(1)
    # a file rendezvous: a free port picked here could be taken by a concurrent launch before the ranks bind it
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    try:
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 4))
        ddp = nn.parallel.DistributedDataParallel(model)
        if zero:
            from torch.distributed.optim import ZeroRedundancyOptimizer

            opt = ZeroRedundancyOptimizer(
                ddp.parameters(), optimizer_class=torch.optim.AdamW, lr=1e-3, weight_decay=0.01
            )
        else:
            opt = torch.optim.AdamW(ddp.parameters(), lr=1e-3, weight_decay=0.01)
        for x, y in steps:
            share = x.shape[0] // world
            sl = slice(rank * share, (rank + 1) * share)
            opt.zero_grad()
            nn.functional.cross_entropy(ddp(x[sl]), y[sl]).backward()  # DDP averages the ranks' gradients
            opt.step()
        if rank == 0:
            torch.save({n: p.detach().clone() for n, p in model.named_parameters()}, out)
        dist.barrier()  # no rank leaves while a peer's last collective is in flight
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("plan", ["ddp", "zero1", "zero2", "fsdp"])
def test_ddp_equals_torchs_distributed_data_parallel(tmp_path, plan):
    """The same model, batches and AdamW under ``torch.nn.parallel.DistributedDataParallel`` (2 gloo
    processes, each its half of every batch; for ``zero1`` and ``zero2`` with torch's
    ``ZeroRedundancyOptimizer``, which splits the parameters among the ranks its own way and reduces the
    gradients as DDP does: the sums are the same, in another order; fsdp against plain DDP, whose sums and
    update it computes on slices): the parameters after 3 steps agree within fp32 rounding."""
    import torch.multiprocessing as mp

    traced = mlp_step(4)
    batches = RandomBatches(0)
    steps = [tuple(batches(traced)) for _ in range(3)]
    ours = launch_plan(mlp_step(4), f"{plan}:m=4,dp=2", K80X4, steps=3, batches=RandomBatches(0), seed=0)
    try:
        mp.spawn(
            _torch_ddp_rank,
            args=(2, str(tmp_path / "rendezvous"), steps, str(tmp_path / "ddp.pt"), plan in ("zero1", "zero2")),
            nprocs=2,
            join=True,
        )
    except mp.ProcessExitedException as exc:
        # torch's own reference rank, under a loaded machine, has aborted in its process group's teardown
        # ("terminate called without an active exception", twice in 2026-12-04's full runs, never alone). Rank
        # 0 saves after every step's collectives, which need both ranks: a saved file means both finished
        # their steps, and the comparison below still holds the numbers; without one, the failure stands.
        if "SIGABRT" not in str(exc) or not (tmp_path / "ddp.pt").exists():
            raise
    theirs = torch.load(tmp_path / "ddp.pt", weights_only=True)
    assert list(theirs) == list(ours.parameters)
    gap = max(float((ours.parameters[n] - p).abs().max()) for n, p in theirs.items())
    assert gap < 1e-6, gap  # measured 4.5e-8
    moved = max(float((ours.parameters[n] - p.detach()).abs().max()) for n, p in mlp_step(4).model.named_parameters())
    assert moved > 1e-3  # 3 AdamW steps at lr 1e-3 moved the weights well beyond the tolerance


@pytest.mark.parametrize(("level", "replicas"), [("zero1", 4), ("zero2", 2), ("fsdp", 2)])
def test_zero_trains_as_one_process_does_and_moves_the_simulated_bytes(level, replicas):
    """Four parameters owned unevenly (the first weight on rank 0, the rest cut by size) or, for fsdp, each
    cut in slices: the losses and parameters of 3 AdamW steps are the one-process step's within fp32
    rounding, and each rank moves the simulated plan's payloads: zero1 all-reduces the gradients once, zero2
    reduce-scatters each of its 2 micro-batches' gradients to their owners, both then all-gather the
    parameters; fsdp gathers the parameters before each micro-batch's forward and backward and
    reduce-scatters its gradients."""
    res = launch_plan(mlp_step(4), f"{level}:m=4,dp={replicas}", K80X4, steps=3, batches=RandomBatches(0), seed=0)
    losses, params = one_process(mlp_step(4), 3)
    assert res.losses == pytest.approx(losses, rel=1e-6)
    for name, p in params.items():
        torch.testing.assert_close(res.parameters[name], p.cpu(), rtol=1e-5, atol=1e-6)
    planned = data_parallel(mlp_step(4).graph, replicas, level)
    payload = sorted((c.kind, c.nbytes) for c in planned.graph.collectives)
    grads = (16 * 32 + 32 + 32 * 4 + 4) * 4  # fp32 parameters: as many bytes as their gradients
    expected = {  # the kinds in the order every rank calls them: one unit (the root), 2 micro-batches a replica
        "zero1": ["all_reduce", "all_gather"],
        "zero2": ["reduce_scatter", "reduce_scatter", "all_gather"],
        "fsdp": ["all_gather", "all_gather", "reduce_scatter"] * 2,  # gathered for the forward and the backward
    }[level]
    assert payload == sorted((kind, grads) for kind in expected)
    assert all(b == len(expected) * grads for b in res.bytes_sent.values())
    assert [c.kind for c in res.plan.collectives] == expected


@pytest.mark.parametrize("level", ["zero1", "zero2"])
def test_zero_ranks_hold_and_update_only_the_parameters_they_own(level):
    """Each rank's program takes every parameter but only its own parameters' optimizer state (AdamW's two
    moments and step), runs only their update, and all-gathers from the owners the simulator names; under
    zero2 it sums only its own parameters' gradients (the reduce-scattered ones), none of the others'."""
    from postplace.plans.data_parallel import zero_owners

    traced = mlp_step(4)
    plan = ddp_plan(traced, [1, 2], K80X4.device_names, level=level)
    owners = zero_owners(traced.graph, 2)
    n_params = len(list(traced.model.parameters()))
    (gather,) = [c for c in plan.collectives if c.kind == "all_gather"]
    assert gather.owners == tuple(owners[p] for p in sorted(owners)) == (0, 1, 1, 1)  # 512 of 676 floats: rank 0
    for r, prog in enumerate(plan.programs):
        held = [i for i in prog.inputs if i < plan.n_persistent]
        mine = [j for j, p in enumerate(sorted(owners)) if owners[p] == r]
        state = [n_params + 3 * j + s for j in mine for s in range(3)]  # step, exp_avg, exp_avg_sq per parameter
        assert held == list(range(n_params)) + state
        updates = [n for n in prog.gm.graph.nodes if n.op == "call_function" and "addcdiv" in str(n.target)]
        assert len(updates) == len(mine)  # AdamW's one addcdiv_ per parameter, for the owned ones only
        sums = [n for n in prog.gm.graph.nodes if n.name.startswith("acc")]
        adds = [n for n in prog.gm.graph.nodes if n.op == "call_function" and n.target is operator.add]
        if level == "zero1":
            assert sums  # the replica sums its two micro-batches' gradients of every parameter, then all-reduces
        else:
            assert not sums and len(adds) == len(mine)  # one sum of two reduced micro-batches per own parameter
    ddp = ddp_plan(traced, [1, 2], K80X4.device_names)
    assert all(prog.inputs[: ddp.n_persistent] == tuple(range(ddp.n_persistent)) for prog in ddp.programs)  # all


def test_fsdp_ranks_hold_slices_of_every_parameter_and_its_moments():
    """Each fsdp rank holds 1/k of every parameter and of AdamW's two moments (flattened, padded), the step
    counts whole; the launcher joins the slices back into the parameters."""
    from postplace.runtime.fsdp import fsdp_plan
    from postplace.runtime.launcher import _rank_state, shard_of, unshard

    traced = mlp_step(4)
    plan = fsdp_plan(traced, [1, 2], K80X4.device_names)
    assert plan.sharded and plan.partial_loss
    shapes = [tuple(p.shape) for p in traced.model.parameters()]
    for r in range(2):
        args, owned = _rank_state(traced, plan, r)
        sizes = [tuple(t.shape) for t in args]
        for j, shape in enumerate(shapes):
            width = -(-int(np.prod(shape)) // 2)
            assert sizes[j] == (width,)  # the parameter's slice
            assert sizes[len(shapes) + 3 * j : len(shapes) + 3 * j + 3] == [(), (width,), (width,)]  # step, moments
    weight = traced.model[0].weight.detach()
    assert torch.equal(unshard([shard_of(weight, q, 3) for q in range(3)], weight.shape), weight)


class Mixed(nn.Module):
    """One unit whose parameters differ in dtype (an fp64 layer before an fp32 one)."""

    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(6, 4).double(), nn.Linear(4, 3)

    def forward(self, x):
        return self.b(self.a(x.double()).float())


def test_fsdp_gathers_a_units_parameters_of_each_dtype_apart():
    """A unit mixing fp64 and fp32 parameters: each dtype gathered and reduce-scattered apart (one buffer of
    the first dtype turned the fp32 weights into fp64 and the step failed), as a ddp bucket holds one dtype."""
    torch.manual_seed(0)
    traced = trace(
        Mixed(), (torch.randn(4, 6),), nn.functional.mse_loss, "adamw", microbatches=2, targets=(torch.randn(4, 3),)
    )
    from postplace.runtime.fsdp import fsdp_plan

    plan = fsdp_plan(traced, [1, 2], K80X4.device_names)
    assert {c.dtype for c in plan.collectives} == {torch.float64, torch.float32}
    res = launch_plan(traced, "fsdp:m=2,dp=2", K80X4, steps=2, batches=RandomBatches(0))
    losses, params = one_process(traced, 2)
    assert res.losses == pytest.approx(losses, rel=1e-6)
    for name, p in params.items():
        assert res.parameters[name].dtype == p.dtype
        torch.testing.assert_close(res.parameters[name], p.cpu(), rtol=1e-5, atol=1e-6)


class Blocks(nn.Module):
    """Two numbered residual blocks (units ``blocks.0``, ``blocks.1``) with dropout inside, and a head."""

    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleList(
            [nn.Sequential(nn.Linear(16, 16), nn.GELU(), nn.Dropout(0.2), nn.Linear(16, 16)) for _ in range(2)]
        )
        self.head = nn.Linear(16, 4)

    def forward(self, x):
        for block in self.blocks:
            x = x + block(x)
        return self.head(x)


def blocks_step():
    torch.manual_seed(0)
    x, y = torch.randn(8, 16), torch.randint(0, 4, (8,))
    return trace(Blocks(), (x,), nn.functional.cross_entropy, "adamw", microbatches=2, targets=(y,))


def test_recomputed_blocks_train_bit_for_bit_as_kept_ones():
    """``ddp+recompute``: each block's forward runs again before its backward (its dropout mask kept, as
    checkpointing replays the generator), so the backward reads no forward value of a block but its inputs
    and kept outputs; losses and parameters after 3 steps are the plain ddp launch's bit for bit."""
    from postplace.plans import unit_of
    from postplace.runtime.recompute import keeps_output, recompute_program

    traced = blocks_step()
    plan = ddp_plan(traced, [1, 2], K80X4.device_names)
    gm = plan.programs[0].gm
    assert recompute_program(gm, traced, {"blocks.0", "blocks.1"}) > 0
    phase, module, op_of = traced.graph.phase, traced.graph.module, traced.op_of_node
    forward, backward = 0, 1  # PHASES
    read = []
    for n in gm.graph.nodes:
        if n.op != "call_function" or op_of.get(n.name, -1) < 0 or phase[op_of[n.name]] != backward:
            continue
        for a in n.all_input_nodes:
            op = op_of.get(a.name, -1)
            if op >= 0 and phase[op] == forward and unit_of(module[op]).startswith("blocks."):
                read.append(a)
    assert read and all(keeps_output(a) for a in read), [str(a.target) for a in read]  # dropout's, kept only
    plain = ddp_plan(traced, [1, 2], K80X4.device_names).programs[0].gm
    before = [
        a
        for n in plain.graph.nodes
        if op_of.get(n.name, -1) >= 0 and phase[op_of[n.name]] == backward
        for a in n.all_input_nodes
        if op_of.get(a.name, -1) >= 0
        and phase[op_of[a.name]] == forward
        and unit_of(module[op_of[a.name]]).startswith("blocks.")
    ]
    assert any(not keeps_output(a) for a in before)  # without recomputation the backward reads the forward's
    again = launch_plan(blocks_step(), "ddp+recompute:m=2,dp=2", K80X4, steps=3, batches=RandomBatches(0), seed=1)
    kept = launch_plan(blocks_step(), "ddp:m=2,dp=2", K80X4, steps=3, batches=RandomBatches(0), seed=1)
    assert again.losses == kept.losses
    for name, p in kept.parameters.items():
        assert torch.equal(again.parameters[name], p), name


def test_a_plan_launches_on_the_gpus_exclude_leaves():
    """``place --exclude gpu0`` simulated ``ddp:m=2,dp=2`` on gpu1 and gpu2; launching it honours the same
    exclusion (``launch_plan(exclude=)``, which a run folder's run.json and --confirm-with launch pass on)."""
    res = launch_plan(mlp_step(2), "ddp:m=2,dp=2", K80X4, steps=1, batches=RandomBatches(0), exclude=("gpu0",))
    assert sorted(res.ranks.values()) == ["gpu1", "gpu2"]
    with pytest.raises(PostplaceError, match="after --exclude"):
        launch_plan(mlp_step(2), "ddp:m=2,dp=4", K80X4, exclude=("gpu0",))
