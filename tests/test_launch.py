"""A placed step as one process per device (issue 33, op-level placements): per-rank programs with
torch.distributed send/recv, checked before launching, run through torch's elastic launcher (gloo on
the CPU), computing the one-process placed step bit for bit and sending what the simulator charged.

The in-process tests run the rank programs in threads over queues (a stand-in for torch.distributed:
same programs, same message buffers); the launched ones start real processes (2-3 gloo ranks).
"""

import json
import os
import queue
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from postplace.cluster import load_cluster
from postplace.cluster.placement import colocation_representative, save_placement
from postplace.errors import PostplaceError
from postplace.graph.trace_torch import trace
from postplace.placers.pipeline import place_pipeline
from postplace.runtime.launcher import RandomBatches, launch
from postplace.runtime.placed import apply
from postplace.runtime.ranks import RECV, SEND, Message, check_order, incoming, outgoing, rank_plan
from postplace.runtime.zoo_step import trace_zoo_step
from postplace.sim import Simulator
from tests.clihelp import run_cli

pytestmark = pytest.mark.usefixtures("torch_one_thread")

K80X2 = load_cluster("k80x2")  # cpu, gpu0, gpu1


def colocated_random(graph, seed, devices=3):
    """Random devices per colocation set: the op-level placements a search samples."""
    return np.random.default_rng(seed).integers(0, devices, graph.num_ops)[colocation_representative(graph)]


def one_process(traced, placement, steps, batches=None, seed=0):
    """The reference: the one-process placed step's losses and final parameters and buffers."""
    step = apply(traced.model, traced, placement, K80X2, device_map="cpu")
    torch.manual_seed(seed)
    losses = [float(step(*(batches(traced) if batches else ()))) for _ in range(steps)]
    return losses, step.parameters(), step.buffers()


def assert_bitwise(result_state, reference):
    assert list(result_state) == list(reference)
    for name, t in reference.items():
        assert torch.equal(result_state[name], t.cpu()), name


# ------------------------------------------------------------------------------ the order check
M = [
    Message(k, src, dst, name, k, (2,), (1,), torch.float32)
    for k, (src, dst, name) in enumerate([(0, 1, "a"), (1, 0, "b"), (1, 2, "c"), (2, 0, "d")])
]


def test_check_order_passes_one_global_order():
    check_order(
        [[("send", 0), ("recv", 1), ("recv", 3)], [("recv", 0), ("send", 1), ("send", 2)], [("recv", 2), ("send", 3)]],
        M,
    )


def test_check_order_finds_a_deadlock_and_names_the_waits():
    # rank 0 receives d before it sends a; rank 1 waits for a, rank 2 for c: a cycle 0 -> 1 -> 2 -> 0
    with pytest.raises(PostplaceError, match=r"can deadlock: rank 0 waits to receive message 3 \(d\) from rank 2") as e:
        check_order(
            [
                [("recv", 3), ("send", 0), ("recv", 1)],
                [("recv", 0), ("send", 1), ("send", 2)],
                [("recv", 2), ("send", 3)],
            ],
            M,
        )
    assert "\n" not in str(e.value)


def test_check_order_finds_two_messages_in_opposite_orders():
    a = Message(0, 0, 1, "x", 0, (1,), (1,), torch.float32)
    b = Message(1, 0, 1, "y", 1, (1,), (1,), torch.float32)
    with pytest.raises(PostplaceError, match="can deadlock"):
        check_order([[("send", 0), ("send", 1)], [("recv", 1), ("recv", 0)]], [a, b])


@pytest.mark.parametrize(
    ("actions", "match"),
    [
        ([[("send", 0)], []], r"rank 1 never posts the recv of message 0"),
        ([[("send", 0)], [("send", 0)]], r"rank 1 posts send of message 0 \(x\), which belongs to rank 0"),
        ([[("send", 0), ("send", 0)], [("recv", 0)]], "posts it twice"),
    ],
)
def test_check_order_refuses_inconsistent_programs(actions, match):
    with pytest.raises(PostplaceError, match=match):
        check_order(actions, [Message(0, 0, 1, "x", 0, (1,), (1,), torch.float32)])


def test_a_built_plan_passes_its_check_and_lists_each_message_once():
    tr = trace_zoo_step("gpt2", "small")
    plan = rank_plan(tr, colocated_random(tr.graph, 3), K80X2.device_names)
    plan.check()
    assert plan.world_size == 3 and len(plan.messages) > 50
    for p in plan.programs:
        posted = [k for _, k in p.actions]
        assert posted == sorted(posted)  # every rank posts in the one global order
    assert (
        sum(plan.bytes_sent().values()) == sum(plan.bytes_received().values()) == sum(m.nbytes for m in plan.messages)
    )


# ------------------------------------------------------------------------------ programs in threads
class ThreadChannel:
    """torch.distributed's send/recv between threads: one FIFO per (sender, receiver) pair."""

    def __init__(self, plan, queues):
        self.plan, self.queues = plan, queues

    def send(self, index, value):
        m = self.plan.messages[index]
        self.queues[m.src, m.dst].put((index, outgoing(m, value).clone()))

    def recv(self, index):
        m = self.plan.messages[index]
        got, flat = self.queues[m.src, m.dst].get(timeout=30)
        assert got == index, f"rank {m.dst} expected message {index}, got {got}"
        t, memory = incoming(m, torch.device("cpu"))
        memory.copy_(flat)
        return t


def run_in_threads(traced, placement, steps, batches=None):
    """Every rank's program in a thread of its own: (losses, parameters by name, the plan)."""
    plan = rank_plan(traced, placement, K80X2.device_names)
    plan.check()
    queues = {(a, b): queue.Queue() for a in range(plan.world_size) for b in range(plan.world_size)}
    params = [p.detach().clone() for p in traced.model.parameters()]
    bufs = [b.detach().clone() for b in traced.model.buffers()]
    state = [
        torch.zeros_like(t, device="cpu")
        for i, p in enumerate(params)
        for t in traced.optimizer.initial_state(i, p, device="meta")
    ]
    persistent = params + bufs + state
    inputs = [batches(traced) if batches else () for _ in range(steps)]
    losses, errors = [None] * steps, []

    def rank(r):
        try:
            prog = plan.programs[r]
            for name in (SEND, RECV):
                if hasattr(prog.gm, name):
                    getattr(prog.gm, name).channel = ThreadChannel(plan, queues)
            own = [persistent[i] for i in prog.inputs if i < plan.n_persistent]
            for k in range(steps):
                xs = traced.split_batch(inputs[k])
                batch = [xs[i - plan.n_persistent].clone() for i in prog.inputs if i >= plan.n_persistent]
                with torch.no_grad():
                    out = prog.gm(*own, *batch)
                if 0 in prog.outputs:
                    losses[k] = float(out[prog.outputs.index(0)])
        except Exception as exc:  # noqa: BLE001 - reported by the test
            errors.append(exc)

    threads = [threading.Thread(target=rank, args=(r,)) for r in range(plan.world_size)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    names = [n for n, _ in traced.model.named_parameters()]
    return losses, dict(zip(names, params, strict=True)), plan


@pytest.mark.parametrize(
    ("model", "m", "kind"),
    [
        ("gpt2", 2, "pipeline"),
        ("gpt2", 1, "any-op"),
        ("resnet50", 1, "colocated"),
        ("rnnlm", 2, "colocated"),
        ("nmt2", 1, "any-op"),
        ("gpt2", 1, "one-device"),
    ],
)
def test_rank_programs_compute_the_one_process_step_bit_for_bit(model, m, kind):
    """Every zoo model without random ops, a pipeline, random placements by colocation set and op by op
    (updates apart from their parameters, batch norm apart from its statistics, LSTM gates split)."""
    tr = trace_zoo_step(model, "small", microbatches=m)
    if kind == "pipeline":
        placement = place_pipeline(tr.graph, K80X2, stages=2)
    elif kind == "colocated":
        placement = colocated_random(tr.graph, 1)
    elif kind == "one-device":  # one rank, nothing to send: a program without send or receive
        placement = np.ones(tr.graph.num_ops, dtype=np.int64)
    else:
        placement = np.random.default_rng(1).integers(0, 3, tr.graph.num_ops)
    batches = [RandomBatches(0)(tr) for _ in range(2)]
    feed = iter(batches)
    losses, params, plan = run_in_threads(tr, placement, 2, lambda _: next(feed))
    feed = iter(batches)
    ref_losses, ref_params, _ = one_process(tr, placement, 2, lambda _: next(feed))
    assert losses == ref_losses
    assert_bitwise(params, ref_params)
    assert bool(plan.messages) == (kind != "one-device")


# ------------------------------------------------------------------------------ bytes
def simulated_by_tensor(graph, placement):
    sim = Counter()
    for op, _slot, a, b, nbytes, *_ in Simulator(graph, K80X2).schedule(placement).transfers:
        sim[op, a, b] += int(nbytes)
    return dict(sim)


@pytest.mark.parametrize(
    ("model", "m", "kind"),
    [
        ("gpt2", 2, "pipeline"),
        ("gpt2", 1, "colocated"),
        ("resnet50", 1, "pipeline"),
        ("rnnlm", 2, "pipeline"),
        ("nmt2", 1, "pipeline"),
    ],
)
def test_messages_are_the_simulators_transfers_tensor_by_tensor(model, m, kind):
    """One message per (op output, receiving device), views rebuilt on the receiver: the bytes of every
    crossing tensor are what the simulator charges for it."""
    tr = trace_zoo_step(model, "small", microbatches=m)
    placement = place_pipeline(tr.graph, K80X2, stages=2) if kind == "pipeline" else colocated_random(tr.graph, 1)
    plan = rank_plan(tr, placement, K80X2.device_names)
    assert plan.bytes_by_tensor() == simulated_by_tensor(tr.graph, placement)


def test_where_the_bytes_differ_from_the_simulator_it_is_state_written_away_from_home():
    """Known differences, recorded: a buffer written in place on another device (batch norm's running
    statistics) goes back home (op -1: a write-back) and is sent again when read there after; the
    simulator charges one transfer for it. A constant the tracer read twice (two fx attributes, one
    op) is two messages of 16 bytes, one transfer in the simulator. Every other tensor is charged alike."""
    tr = trace_zoo_step("resnet50", "small")
    placement = colocated_random(tr.graph, 1)
    mine, sim = rank_plan(tr, placement, K80X2.device_names).bytes_by_tensor(), simulated_by_tensor(tr.graph, placement)
    differ = {k for k in set(mine) | set(sim) if mine.get(k) != sim.get(k)}
    assert differ
    assert all(k[0] == -1 or tr.graph.op_types[k[0]] in ("buffer", "constant") for k in differ)


# ------------------------------------------------------------------------------ launched processes
class Dropper(nn.Module):
    """A user's module with dropout (random ops replayed on every rank) and batch norm (buffers)."""

    def __init__(self):
        super().__init__()
        self.a, self.bn, self.drop, self.b = nn.Linear(6, 16), nn.BatchNorm1d(16), nn.Dropout(0.3), nn.Linear(16, 3)

    def forward(self, x):
        return self.b(self.drop(torch.relu(self.bn(self.a(x)))))


def test_launch_a_pipeline_matches_the_one_process_step_and_the_simulator():
    """gpt2 as 2 micro-batches on a 2-stage pipeline (gpu0, gpu1): 2 gloo processes, 3 steps."""
    tr = trace_zoo_step("gpt2", "small", microbatches=2)
    placement = place_pipeline(tr.graph, K80X2, stages=2)
    result = launch(tr, placement, K80X2, steps=3, batches=RandomBatches(5))
    ref_losses, ref_params, _ = one_process(tr, placement, 3, RandomBatches(5))
    assert result.losses == ref_losses and len(result.losses) == 3
    assert_bitwise(result.parameters, ref_params)
    assert result.ranks == {0: "gpu0", 1: "gpu1"}
    # measured bytes = the plan's = the simulator's, per rank
    sim_sent = Counter()
    for _op, _slot, a, _b, nbytes, *_ in Simulator(tr.graph, K80X2).schedule(placement).transfers:
        sim_sent[a] += int(nbytes)
    assert result.bytes_sent == result.plan.bytes_sent() == {0: sim_sent[1], 1: sim_sent[2]}
    assert result.bytes_received == result.plan.bytes_received()
    # each rank held only the parameters and buffers placed on its device
    for r, d in enumerate(result.plan.ranks):
        mine = {
            tr.graph.names[i].split(":", 1)[1]
            for i in range(tr.graph.num_ops)
            if tr.graph.op_types[i] in ("parameter", "buffer") and placement[i] == d
        }
        assert set(result.held[r]) == mine and mine


def test_launch_a_random_placement_of_a_user_module_over_three_processes():
    """A user's nn.Module with dropout and batch norm, placed op by op at random over cpu, gpu0, gpu1:
    3 processes compute what one process computes, random draws included."""
    torch.manual_seed(0)
    model = Dropper()
    x, y = torch.randn(8, 6), torch.randn(8, 3)
    tr = trace(model, (x,), nn.functional.mse_loss, targets=(y,))
    placement = np.random.default_rng(4).integers(0, 3, tr.graph.num_ops)
    result = launch(tr, placement, K80X2, steps=3, seed=11)
    ref_losses, ref_params, ref_bufs = one_process(tr, placement, 3, seed=11)
    assert result.losses == ref_losses
    assert_bitwise(result.parameters, ref_params)
    assert_bitwise(result.buffers, ref_bufs)
    assert sorted(result.ranks) == [0, 1, 2]
    fresh = Dropper()
    result.copy_to_model(fresh)
    assert torch.equal(fresh.a.weight, ref_params["a.weight"])


class TwoDrops(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b, self.c = nn.Linear(6, 16), nn.Linear(16, 16), nn.Linear(16, 3)
        self.d1, self.d2 = nn.Dropout(0.3), nn.Dropout(0.5)

    def forward(self, x):
        return self.c(self.d2(torch.relu(self.b(self.d1(torch.relu(self.a(x)))))))


def test_random_draws_replayed_on_other_ranks_survive_the_trip_to_their_processes():
    """Each rank's program reaches its process pickled, and unpickling a GraphModule traces its code again:
    a replay made of constants alone would run then and vanish, and the ranks' generators drift apart (two
    dropouts on two ranks drew other masks than one process). The replays are made from a node of the
    program, so they survive, and the launch draws the one process's masks."""
    import pickle

    from postplace.runtime.ranks import rank_plan

    torch.manual_seed(0)
    tr = trace(TwoDrops(), (torch.randn(8, 6),), nn.functional.mse_loss, targets=(torch.randn(8, 3),))
    placement = np.random.default_rng(7).integers(1, 3, tr.graph.num_ops)  # gpu0 and gpu1, op by op
    plan = rank_plan(tr, placement, K80X2.device_names)

    def draws(gm):
        return sum(1 for n in gm.graph.nodes if torch.Tag.nondeterministic_seeded in getattr(n.target, "tags", ()))

    for prog in plan.programs:
        assert draws(prog.gm) == draws(pickle.loads(pickle.dumps(prog.gm))) >= 2
    result = launch(tr, placement, K80X2, steps=2, seed=5)
    ref_losses, ref_params, _ = one_process(tr, placement, 2, seed=5)
    assert result.losses == ref_losses
    assert_bitwise(result.parameters, ref_params)


class Fault(RandomBatches):
    """Batches that make rank ``rank`` die (SIGKILL) or hang at step ``step``."""

    def __init__(self, rank, step, how):
        super().__init__(0)
        self.rank, self.step, self.how, self.calls = rank, step, how, 0

    def __call__(self, inputs):
        self.calls += 1
        if int(os.environ.get("RANK", "-1")) == self.rank and self.calls == self.step:
            if self.how == "kill":
                os.kill(os.getpid(), signal.SIGKILL)
            time.sleep(600)
        return super().__call__(inputs)


@pytest.fixture(scope="module")
def gpt2_pipeline():
    tr = trace_zoo_step("gpt2", "small")
    return tr, place_pipeline(tr.graph, K80X2, stages=2)


def test_a_killed_rank_stops_every_rank_with_one_clear_line(gpt2_pipeline):
    tr, placement = gpt2_pipeline
    t0 = time.perf_counter()
    with pytest.raises(PostplaceError) as e:
        launch(tr, placement, K80X2, steps=3, batches=Fault(1, 2, "kill"), timeout=20)
    assert time.perf_counter() - t0 < 60
    assert str(e.value).startswith("launch failed: rank 1 (gpu1) was killed by SIGKILL in step 2")
    assert "\n" not in str(e.value)


def test_a_rank_its_peers_lost_is_named_first_when_the_agent_saw_a_peer_fail_first(tmp_path):
    """The agent reports the first exit it sees; when that is a peer's (a lost connection), the rank the
    peer lost, which left no line of its own, is named first all the same."""
    from types import SimpleNamespace

    from postplace.runtime.launcher import _failure_line

    for r in (0, 1):
        (tmp_path / f"step-{r}").write_text("3")
    (tmp_path / "error-0").write_text(
        "peer\nrank 0 (gpu0), step 3: receiving 'addmm' (512 bytes, op addmm; message 1 of 85) from rank 1 (gpu1) "
        "failed after 0.0 s: Connection closed by peer"
    )
    plan = SimpleNamespace(world_size=2, rank_name=lambda r: f"rank {r} (gpu{r})")
    line = _failure_line(
        SimpleNamespace(failures={0: SimpleNamespace(exitcode=1)}), SimpleNamespace(folder=tmp_path), plan
    )
    assert line.startswith(
        "launch failed: rank 1 (gpu1) stopped in step 3 without a word (killed, or its process died); "
    )
    assert "rank 0 (gpu0), step 3: receiving 'addmm'" in line


def test_a_peer_that_stops_answering_fails_the_others_within_the_timeout(gpt2_pipeline):
    tr, placement = gpt2_pipeline
    with pytest.raises(
        PostplaceError,
        match=r"rank 0 \(gpu0\), step 2: sending .* to rank 1 \(gpu1\) failed after "
        r"[45]\.\d s: Timed out",
    ):
        launch(tr, placement, K80X2, steps=3, batches=Fault(1, 2, "hang"), timeout=4)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


NEVER = """
import torch
from torch import nn
from postplace.errors import PostplaceError
from postplace.graph.trace_torch import trace
from postplace.runtime.launcher import run_rank
torch.manual_seed(0)
tr = trace(nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2)), (torch.randn(4, 4),),
           nn.functional.mse_loss, targets=(torch.randn(4, 2),))
try:
    run_rank(tr, [0, 1] * (tr.graph.num_ops // 2) + [0] * (tr.graph.num_ops % 2), ["cpu", "gpu0"], timeout=3)
except PostplaceError as exc:
    print(exc)
"""


def _rank_alone(world: int) -> str:
    """What the script above prints as rank 0 of a world of ``world`` started alone (as torchrun would)."""
    env = {
        **os.environ,
        "RANK": "0",
        "WORLD_SIZE": str(world),
        "LOCAL_RANK": "0",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(_free_port()),
        "OMP_NUM_THREADS": "1",
    }
    out = subprocess.run([sys.executable, "-c", NEVER], env=env, capture_output=True, text=True, timeout=120)
    return out.stdout.strip()


def test_under_torchrun_a_peer_that_never_arrives_is_one_line_within_the_timeout():
    """The per-rank entry point as torchrun starts it (RANK, WORLD_SIZE, MASTER_ADDR/PORT), rank 0 alone."""
    t0 = time.perf_counter()
    assert _rank_alone(2).startswith("rank 0: the process group did not form within 3 s")
    assert time.perf_counter() - t0 < 60


def test_under_torchrun_a_world_that_is_not_the_placements_devices_is_one_line():
    assert _rank_alone(1) == (
        "rank 0: the world has 1 processes, but the placement uses 2 devices (cpu, gpu0); start one process per device"
    )


# ------------------------------------------------------------------------------ the command line
@pytest.fixture(scope="module")
def run_folder(tmp_path_factory):
    """A run folder as `postplace place` writes it for gpt2 (small) on k80x2, with a pipeline placement."""
    import postplace

    out = tmp_path_factory.mktemp("run")
    postplace.place("gpt2", "k80x2", size="small", budget=16, microbatches=1, out=out, report=False)
    tr = trace_zoo_step("gpt2", "small")
    save_placement(out / "placement.json", tr.graph, K80X2, place_pipeline(tr.graph, K80X2, stages=2))
    return out


def test_launch_and_train_print_the_same_losses(run_folder):
    """`launch RUN --json` and `train RUN --json` (one process, every device on the CPU) print the same
    losses: the same batches (seed 0), the same ops in the same order."""
    launched = run_cli("launch", run_folder, "--steps", "2", "--json")
    assert launched.returncode == 0, launched.stderr
    got = json.loads(launched.stdout)
    trained = run_cli("train", run_folder, "--steps", "2", "--json", "--map-all-to", "cpu", "--threads", "1")
    assert trained.returncode == 0, trained.stderr
    assert got["losses"] == json.loads(trained.stdout)["losses"] and len(got["losses"]) == 2
    assert got["bytes_sent"] == got["simulated_bytes_sent"] and set(got["ranks"].values()) == {"gpu0", "gpu1"}
    assert got["bytes_received"] == got["simulated_bytes_received"]
    record = json.loads((Path(run_folder) / "launch.json").read_text())  # the run folder keeps the launch
    assert record["losses"] == got["losses"] and record["step_times_s"] == got["step_times_s"]
    assert record["figures"]["step_times_s"] == "measured" and record["figures"]["simulated_step_time_s"] == "simulated"
    assert (
        record["simulated_step_time_s"]
        == json.loads((Path(run_folder) / "summary.json").read_text())["simulated_step_time_s"]
    )
    assert record["measured_on"] == "CPU processes (gloo) standing in for the devices"
    text = run_cli("launch", run_folder, "--steps", "1", "--seed", "3")
    assert text.returncode == 0, text.stderr
    assert "CPU processes (gloo) standing in for the devices" in text.stdout
    assert f"{got['losses'][0]:12.6f}" not in text.stdout  # another seed, other batches


def _bad(*args) -> str:
    r = run_cli(*args)
    assert r.returncode == 2 and r.stdout == "", (r.stdout, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), lines
    return lines[0]


def test_bad_input_is_one_line_before_any_process_starts(run_folder, tmp_path, monkeypatch):
    import postplace.runtime.launcher as launching

    def never(*_a, **_k):
        raise AssertionError("a process was started")

    monkeypatch.setattr(launching, "_elastic", never)
    assert "no placement.json" in _bad("launch", tmp_path)
    assert "no such run folder" in _bad("launch", tmp_path / "nowhere")
    folder = tmp_path / "run"
    folder.mkdir()
    for name in ("run.json", "summary.json"):
        (folder / name).write_text((Path(run_folder) / name).read_text())
    mapping = json.loads((Path(run_folder) / "placement.json").read_text())
    (folder / "placement.json").write_text(json.dumps({**mapping, next(iter(mapping)): "gpu7"}))
    assert "gpu7" in _bad("launch", folder)
    (folder / "placement.json").write_text((Path(run_folder) / "placement.json").read_text())
    summary = json.loads((folder / "summary.json").read_text())
    (folder / "summary.json").write_text(json.dumps({**summary, "returned_plan": "fsdp:m=2,dp=1,pp=2"}))
    assert "simulated only" in _bad("launch", folder)
    for bad in ("bogus", 5, ["ddp"]):  # a damaged summary names the file and the field, not a --plan flag
        (folder / "summary.json").write_text(json.dumps({**summary, "returned_plan": bad}))
        line = _bad("launch", folder)
        assert "summary.json: returned_plan" in line and "--plan" not in line, line
    layered = tmp_path / "layered"
    layered.mkdir()
    (layered / "layered.json").write_text("{}")
    assert "place --layered folder" in _bad("launch", layered)
    (folder / "summary.json").write_text(json.dumps({**summary, "target_spec": {"kind": "module"}}))
    assert "not a zoo model" in _bad("launch", folder)
    assert "--steps 0" in _bad("launch", run_folder, "--steps", "0")
    assert "--timeout 0" in _bad("launch", run_folder, "--timeout", "0")
    if not torch.cuda.is_available():
        assert "CUDA device(s)" in _bad("launch", run_folder, "--backend", "nccl")
    assert "--backend 'mpi'" in _bad("launch", run_folder, "--backend", "mpi")
