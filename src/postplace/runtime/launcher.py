"""Run a placed step as one process per device over torch.distributed (DESIGN.md section 7).

* :func:`run_rank`: what one rank runs: the rank's program of a :class:`~postplace.runtime.ranks.RankPlan`
  with its own parameters, buffers and optimizer state only (those of the ops placed on its device),
  every crossing tensor a ``torch.distributed`` send/recv. It is the per-rank entry point for users who
  start ``torchrun`` themselves (``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``/``MASTER_PORT`` from it);
* :func:`launch`: starts those processes through torch's own launcher, the elastic agent behind
  ``torchrun`` (:func:`torch.distributed.launcher.api.elastic_launch`, one node, ``--nproc-per-node``
  = the devices the placement uses, c10d rendezvous on a free localhost port, no restarts), collects
  every rank's result and turns any failure into one error line;
* :func:`launch_run`: the same for a run folder of ``postplace place`` (``postplace launch RUN_FOLDER``).

Backends: ``gloo`` (default) runs every rank on the CPU, processes standing in for the devices, so any
placement runs and is checked on a CPU-only machine; ``nccl`` runs rank k on its GPU (``gpuK`` ->
``cuda:K``), for placements on GPUs only.

Faults: every rank's process group is made with ``timeout`` seconds, so a receive whose peer died or
never sends fails within it (gloo notices a closed connection at once), a rank that never arrives fails
the others' start within it, and the agent stops every rank as soon as one exits. Each failure becomes
one line naming the rank, its device, the step and the message it waited for.

Collectives: the ``ddp``, ``zero1`` and ``zero2`` plans (:mod:`postplace.runtime.ddp`) all-reduce their
gradients (``zero2``: reduce-scatter each micro-batch's to their owners) and (ZeRO) all-gather their
parameters; ``fsdp`` (:mod:`postplace.runtime.fsdp`) gathers each unit's parameter slices before each
micro-batch's forward and backward and reduce-scatters its gradients; a pipeline of ``ddp`` replicas
(:mod:`postplace.runtime.pipeline`) sends activations and gradients between stages in its schedule's order
and all-reduces each stage's gradients over that stage's ranks (one process group per stage). Checkpoints: with
``checkpoint=DIR`` every rank writes its state after each step and ``resume=True`` starts from the last
step all recorded (:mod:`postplace.runtime.rank_checkpoint`).
Per-unit hybrids (``ddp:shard=U/U``) run as ``fsdp`` for the units named and as ``ddp`` for the others
(:func:`postplace.runtime.fsdp.fsdp_plan` with ``shard``: only those parameters held as slices).
Tensor-parallel groups (``ddp:tp=T``, :mod:`postplace.runtime.tensor`) run Megatron-LM's split: each rank holds
its part of the split parameters and their state and all-reduces partial sums over its group; the groups are
``ddp``, ZeRO or FSDP replicas, each of their collectives over the ranks holding the same parts; a pipeline of
groups (``ddp:tp=T,pp=P``) sends each activation from part j of a stage to part j of the next.
Messages are blocking sends and receives in the plan's one global order, those nothing separates batched
(:func:`~postplace.runtime.ranks.batch_messages`, ``batch_isend_irecv``);
:meth:`~postplace.runtime.ranks.RankPlan.check` proves the order, collectives included, cannot deadlock.
What is not here yet: ZeRO-2 or FSDP inside a pipeline of several replicas, and a per-unit hybrid with tensor
parallelism.
"""

from __future__ import annotations

import dataclasses
import datetime
import functools
import json
import logging
import multiprocessing
import os
import pickle
import re
import shutil
import signal
import tempfile
import time
import uuid
from collections.abc import Callable, Mapping
from pathlib import Path

import numpy as np
import torch

from postplace.errors import PostplaceError
from postplace.runtime.ranks import (
    ALL_REDUCE_MAX,
    BATCH,
    GATHER,
    RECV,
    REDUCE,
    REDUCE_MAX,
    SCATTER,
    SEND,
    RankPlan,
    batch_messages,
    incoming,
    numel_of,
    outgoing,
    rank_plan,
)

__all__ = ["LaunchResult", "RandomBatches", "RankResult", "launch", "launch_plan", "launch_run", "run_rank"]

BACKENDS = ("gloo", "nccl")


@dataclasses.dataclass
class RankResult:
    """What one rank returns: the losses it computed (the rank that holds the loss), its bytes sent and
    received per step (each message's and collective's payload as it passed them to torch.distributed; a
    collective's padding for unequal shares not counted), the seconds of each step and of
    the sends and receives in it, and its parameters and buffers (CPU copies, by name)."""

    rank: int
    device: str
    losses: list[float]
    bytes_sent: int
    bytes_received: int
    step_times_s: list[float]
    comm_times_s: list[float]
    parameters: dict[str, torch.Tensor]
    buffers: dict[str, torch.Tensor]
    digest: str
    start_step: int = 0


@dataclasses.dataclass
class LaunchResult:
    """What :func:`launch` returns.

    Parameters
    ----------
    losses : list of float
        The loss of every step.
    ranks : dict of int to str
        Each rank's logical device.
    bytes_sent, bytes_received : dict of int to int
        Bytes each rank sent and received per step (measured), by rank.
    step_times_s, comm_times_s : dict of int to list of float
        Each rank's measured seconds per step, and the part of it spent in sends and receives.
    parameters, buffers : dict of str to torch.Tensor
        The trained state gathered from the ranks (CPU tensors), by name.
    held : dict of int to list of str
        The parameters and buffers each rank held (its own only: those of the ops placed on its device).
    backend : str
    plan : RankPlan
        The plan the ranks ran (built and checked before they started).
    start_step : int
        Steps run before this launch (a resumed one): ``losses`` are those of the steps after them.
    """

    losses: list[float]
    ranks: dict[int, str]
    bytes_sent: dict[int, int]
    bytes_received: dict[int, int]
    step_times_s: dict[int, list[float]]
    comm_times_s: dict[int, list[float]]
    parameters: dict[str, torch.Tensor]
    buffers: dict[str, torch.Tensor]
    held: dict[int, list[str]]
    backend: str
    plan: RankPlan
    start_step: int = 0

    def copy_to_model(self, model: torch.nn.Module) -> None:
        """Write the trained parameters and buffers into ``model`` (a module with the traced names).

        Parameters
        ----------
        model : torch.nn.Module
        """
        with torch.no_grad():
            for name, t in {**self.parameters, **self.buffers}.items():
                target = model.get_parameter(name) if name in self.parameters else model.get_buffer(name)
                target.copy_(t.to(target.device))

    def to_json(self) -> dict:
        """``{"losses", "bytes_sent", "bytes_received", "ranks", "step_times_s", "comm_times_s", "backend",
        "start_step"}`` (rank keys as strings; bytes per step)."""
        return {
            "losses": self.losses,
            "bytes_sent": {str(r): n for r, n in self.bytes_sent.items()},
            "bytes_received": {str(r): n for r, n in self.bytes_received.items()},
            "ranks": {str(r): d for r, d in self.ranks.items()},
            "step_times_s": {str(r): t for r, t in self.step_times_s.items()},
            "comm_times_s": {str(r): t for r, t in self.comm_times_s.items()},
            "backend": self.backend,
            "start_step": self.start_step,
        }


class RandomBatches:
    """A fresh random batch every step, like the traced one (``postplace train``'s batches: floats from
    a normal distribution, integers below the traced batch's largest + 1), from one seeded generator,
    so every rank and the one-process ``train`` draw the same batches."""

    def __init__(self, seed: int = 0):
        self.seed = seed
        self._gen = None

    def __call__(self, traced) -> list[torch.Tensor]:
        from postplace.runtime.zoo_step import random_like

        if self._gen is None:
            self._gen = torch.Generator().manual_seed(self.seed)
        return [random_like(x, self._gen) for x in traced.batch or traced.inputs]


# ------------------------------------------------------------------------------ one rank
class _PeerError(PostplaceError):
    """A failure seen from one rank that another rank caused (a lost or late message, a group that did
    not form): the launcher names the other rank's own failure first."""


def _short(exc: BaseException) -> str:
    """The first line of a backend's error without its source location (``[.../pair.cc:537] ``) and
    its boilerplate."""
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    text = re.sub(r"^\[[^\]]*\.(cc|cpp|h|hpp):\d+\]\s*", "", text)
    return text.split(". This is typically")[0][:160]


class _Channel:
    """Blocking sends and receives of one rank's messages, counted and timed, each failure one line."""

    def __init__(self, plan: RankPlan, rank: int, device: torch.device, graph_names, step: list[int]):
        import torch.distributed as dist

        self.dist, self.plan, self.rank, self.device = dist, plan, rank, device
        self.graph_names = graph_names
        self.step = step
        self.sent = self.received = 0
        self.seconds = 0.0
        self.tags = device.type == "cpu"  # gloo matches tags; NCCL ignores them
        self.groups = {}  # a collective's group -> its process group, made once, by every rank in one order
        for c in plan.collectives:
            if c.group and c.group not in self.groups:
                self.groups[c.group] = dist.new_group(list(c.group))

    def _fail(self, verb: str, index: int, exc: BaseException, t0: float) -> PostplaceError:
        m = self.plan.messages[index]
        peer = m.dst if verb == "sending" else m.src
        op = f", op {self.graph_names[m.op]}" if m.op >= 0 else ""
        why = _short(exc)
        return _PeerError(
            f"{self.plan.rank_name(self.rank)}, step {self.step[0] + 1}: {verb} '{m.value}' ({m.nbytes:,} bytes{op}; "
            f"message {index + 1} of {len(self.plan.messages)}) {'to' if verb == 'sending' else 'from'} "
            f"{self.plan.rank_name(peer)} failed after {time.perf_counter() - t0:.1f} s: {why}"
        )

    def send(self, index: int, value: torch.Tensor) -> None:
        m = self.plan.messages[index]
        if m.numel == 0:
            return
        t0 = time.perf_counter()
        try:
            self.dist.send(outgoing(m, value), dst=m.dst, tag=index if self.tags else 0)
        except PostplaceError:
            raise
        except Exception as exc:  # noqa: BLE001 - gloo and NCCL raise several kinds: each becomes one line
            raise self._fail("sending", index, exc, t0) from None
        self.seconds += time.perf_counter() - t0
        self.sent += m.nbytes

    def _collective(self, verb: str, index: int, call: Callable[[], object]) -> None:
        """Run collective ``index`` (``call``), timed and counted as its payload sent and received once each;
        a failure is one line naming the rank, the step and the collective."""
        c = self.plan.collectives[index]
        t0 = time.perf_counter()
        try:
            call()
        except Exception as exc:  # noqa: BLE001 - as in send
            raise _PeerError(
                f"{self.plan.rank_name(self.rank)}, step {self.step[0] + 1}: {verb} of '{c.value}' "
                f"({c.nbytes:,} bytes; collective {index + 1} of {len(self.plan.collectives)}) failed "
                f"after {time.perf_counter() - t0:.1f} s: {_short(exc)}"
            ) from None
        self.seconds += time.perf_counter() - t0
        self.sent += c.nbytes
        self.received += c.nbytes

    def all_reduce(self, index: int, value: list[torch.Tensor]) -> list[torch.Tensor]:
        """The tensors of one bucket summed over every rank (collective ``index`` of the step: one flat
        buffer, DDP's bucket), counted as bytes sent and received once each (the payload: a ring moves
        ``2 (k - 1) / k`` of it each way)."""
        parts = list(value)
        t = torch.cat([x.reshape(-1) for x in parts]) if len(parts) > 1 else parts[0].contiguous().reshape(-1)
        c = self.plan.collectives[index]
        group = self.groups.get(c.group)
        op = self.dist.ReduceOp.MAX if c.kind == ALL_REDUCE_MAX else self.dist.ReduceOp.SUM
        self._collective("all-reduce", index, lambda: self.dist.all_reduce(t, op=op, group=group))
        return [piece.view(x.shape) for piece, x in zip(t.split([x.numel() for x in parts]), parts, strict=True)]

    def all_gather(self, index: int, mine: list[torch.Tensor]) -> list[torch.Tensor]:
        """Every tensor of collective ``index`` on every rank: each rank sends those it owns (``mine``, in the
        collective's order) as one flat buffer padded to the largest rank's share, and receives the others';
        counted as the payload sent and received once each, as an all-reduce is."""
        c = self.plan.collectives[index]
        if not c.owners:
            return self._gather_slices(index, mine)
        sizes, width = self._owner_layout(c)
        flat = torch.zeros(width, dtype=c.dtype, device=self.device)
        if mine:
            own = torch.cat([x.reshape(-1) for x in mine])
            flat[: own.numel()] = own
        members = c.members(self.plan.world_size)
        parts = [torch.empty_like(flat) for _ in members]
        group = self.groups.get(c.group)
        self._collective("all-gather", index, lambda: self.dist.all_gather(parts, flat, group=group))
        offset = [0] * len(members)
        out = []
        for n, o, shape in zip(sizes, c.owners, c.shapes, strict=True):
            out.append(parts[o][offset[o] : offset[o] + n].view(shape))
            offset[o] += n
        return out

    def reduce_scatter(self, index: int, values: list[torch.Tensor]) -> list[torch.Tensor]:
        """Collective ``index``'s tensors (every one, in its order) summed over every rank, each sum landing on
        the rank that owns it: one flat buffer of one padded chunk per rank (its owned tensors), reduce-scattered;
        returns this rank's sums in the collective's order. Counted as the payload sent and received once."""
        c = self.plan.collectives[index]
        if not c.owners:
            return self._scatter_slices(index, values)
        sizes, width = self._owner_layout(c)
        members = c.members(self.plan.world_size)
        me = members.index(self.rank)
        flat = torch.zeros(len(members) * width, dtype=c.dtype, device=self.device)
        offset = [q * width for q in range(len(members))]
        mine = []
        for x, n, o in zip(values, sizes, c.owners, strict=True):
            flat[offset[o] : offset[o] + n] = x.reshape(-1)
            if o == me:
                mine.append((offset[o] - o * width, n, x.shape))
            offset[o] += n
        out = torch.empty(width, dtype=c.dtype, device=self.device)
        group = self.groups.get(c.group)
        self._collective("reduce-scatter", index, lambda: self.dist.reduce_scatter_tensor(out, flat, group=group))
        return [out[a : a + n].view(shape) for a, n, shape in mine]

    def _owner_layout(self, c) -> tuple[list[int], int]:
        """Each tensor's elements, and the padded chunk every rank sends: the largest owner's share (owners
        are positions in the collective's group)."""
        sizes = [numel_of(shape) for shape in c.shapes]
        members = c.members(self.plan.world_size)
        share = [sum(n for n, o in zip(sizes, c.owners, strict=True) if o == q) for q in range(len(members))]
        return sizes, max(share, default=0)

    def _gather_slices(self, index: int, slices: list[torch.Tensor]) -> list[torch.Tensor]:
        """FSDP's all-gather: every rank sends its slice of each tensor (:func:`shard_of`) in one buffer;
        returns the whole tensors."""
        c = self.plan.collectives[index]
        world = len(c.members(self.plan.world_size))  # a tensor-parallel plan's slices: over its part's ranks
        widths = [slice_width(numel_of(shape), world) for shape in c.shapes]
        flat = torch.cat([x.reshape(-1) for x in slices]).to(c.dtype)
        parts = [torch.empty_like(flat) for _ in range(world)]
        group = self.groups.get(c.group)
        self._collective("all-gather", index, lambda: self.dist.all_gather(parts, flat, group=group))
        out, at = [], 0
        for w, shape in zip(widths, c.shapes, strict=True):
            out.append(unshard([part[at : at + w] for part in parts], shape))
            at += w
        return out

    def _scatter_slices(self, index: int, values: list[torch.Tensor]) -> list[torch.Tensor]:
        """FSDP's reduce-scatter: the whole tensors summed over every rank, each rank keeping its slice of each."""
        c = self.plan.collectives[index]
        world = len(c.members(self.plan.world_size))
        widths = [slice_width(numel_of(shape), world) for shape in c.shapes]
        chunks = [[shard_of(v, q, world) for v in values] for q in range(world)]
        flat = torch.cat([x for chunk in chunks for x in chunk]).to(c.dtype)
        out = torch.empty(sum(widths), dtype=c.dtype, device=self.device)
        group = self.groups.get(c.group)
        self._collective("reduce-scatter", index, lambda: self.dist.reduce_scatter_tensor(out, flat, group=group))
        return list(out.split(widths))

    def batch(self, ops) -> list[torch.Tensor]:
        """Several sends and receives posted at once (``batch_isend_irecv``) and waited for together:
        ``ops`` are ``(kind, message index, value or None)``; returns the received tensors in order."""
        dist = self.dist
        p2p, received, t0 = [], [], time.perf_counter()
        for kind, index, value in ops:
            m = self.plan.messages[index]
            if m.numel == 0:
                if kind == "recv":
                    received.append(incoming(m, self.device)[0])
                continue
            tag = index if self.tags else 0
            if kind == "send":
                p2p.append(dist.P2POp(dist.isend, outgoing(m, value), m.dst, tag=tag))
                self.sent += m.nbytes
            else:
                t, flat = incoming(m, self.device)
                received.append(t)
                p2p.append(dist.P2POp(dist.irecv, flat, m.src, tag=tag))
                self.received += m.nbytes
        if p2p:
            try:
                for request in dist.batch_isend_irecv(p2p):
                    request.wait()
            except PostplaceError:
                raise
            except Exception as exc:  # noqa: BLE001 - as in send
                first = ops[0]
                raise self._fail("sending" if first[0] == "send" else "receiving", first[1], exc, t0) from None
        self.seconds += time.perf_counter() - t0
        return received

    def recv(self, index: int) -> torch.Tensor:
        m = self.plan.messages[index]
        t, flat = incoming(m, self.device)
        if m.numel == 0:
            return t
        t0 = time.perf_counter()
        try:
            self.dist.recv(flat, src=m.src, tag=index if self.tags else 0)
        except Exception as exc:  # noqa: BLE001 - as in send
            raise self._fail("receiving", index, exc, t0) from None
        self.seconds += time.perf_counter() - t0
        self.received += m.nbytes
        return t


def resume_step(folder: Path, plan: RankPlan, steps: int) -> int:
    """The step a resumed launch starts after: the last every rank of ``plan`` recorded in ``folder``; one
    line when none is left to run."""
    from postplace.runtime import rank_checkpoint

    start = rank_checkpoint.common_step(folder, plan.world_size)
    if start >= steps:
        raise PostplaceError(
            f"--checkpoint {folder} holds step {start} of every rank and --steps is {steps}: nothing is left to "
            "run; give more --steps"
        )
    return start


def _ckpt(folder) -> Path | None:
    """A checkpoint folder as given (None: no checkpoints), refused in one line where it is a file."""
    if folder is None:
        return None
    path = Path(folder)
    if path.exists() and not path.is_dir():
        raise PostplaceError(f"--checkpoint {folder}: a file, not a folder; give a folder for the ranks' checkpoints")
    return path


def _op_devices(traced, placement, devices) -> tuple[np.ndarray, list[str]]:
    """(op-level device ids, device names) from a placement file, a mapping or an array."""
    from postplace.runtime.placed import device_names_of, op_devices

    cluster = devices
    if isinstance(devices, str | Path):
        from postplace.cluster import load_cluster

        cluster = load_cluster(devices)
    if isinstance(placement, str | Path):
        from postplace.cluster.placement import load_placement

        if not hasattr(cluster, "device_names"):
            raise PostplaceError(f"{placement}: reading a placement file needs its cluster (a preset, file or Cluster)")
        if not Path(placement).is_file():
            raise PostplaceError(f"{placement}: no such placement file")
        return load_placement(placement, traced.graph, cluster), list(cluster.device_names)
    if isinstance(placement, Mapping) and hasattr(cluster, "device_names"):
        from postplace.cluster.placement import from_mapping

        return from_mapping(traced.graph, cluster, dict(placement)), list(cluster.device_names)
    names = device_names_of(cluster, placement, traced.graph.num_ops)
    return op_devices(traced.graph, placement, names), names


def _rank_device(backend: str, plan: RankPlan, rank: int) -> torch.device:
    if backend == "gloo":
        return torch.device("cpu")
    name = plan.device_names[plan.ranks[rank]]
    from postplace.runtime.placed import default_device_map

    return torch.device(default_device_map([name])[name])


def _check_backend(backend: str, op_device, names) -> None:
    """One line for a backend the placement's devices cannot use here."""
    if backend not in BACKENDS:
        raise PostplaceError(f"--backend '{backend}': use gloo (every rank on the CPU) or nccl (ranks on their GPUs)")
    if backend == "nccl":
        used = [names[d] for d in sorted({int(d) for d in np.unique(op_device)})]
        cpu = [n for n in used if not (n.startswith("gpu") and n[3:].isdigit())]
        if cpu:
            raise PostplaceError(
                f"--backend nccl: the placement uses {cpu[0]}, which is not a GPU (gpuK); NCCL sends "
                "between GPUs only: use --backend gloo"
            )
        have = torch.cuda.device_count() if torch.cuda.is_available() else 0
        need = max(int(n[3:]) for n in used) + 1
        if have < need:
            raise PostplaceError(
                f"--backend nccl: the placement uses {', '.join(used)}, and this machine has {have} "
                f"CUDA device(s); run it where the GPUs are, or use --backend gloo"
            )


def _check_steps(steps: int) -> None:
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise PostplaceError(f"--steps {steps}: give at least 1 step")


def _check_timeout(timeout: float) -> None:
    if not (isinstance(timeout, int | float) and np.isfinite(timeout) and timeout > 0):
        raise PostplaceError(f"--timeout {timeout}: give the seconds a rank waits for a peer (more than 0)")


def run_rank(
    traced,
    placement,
    devices=None,
    *,
    steps: int = 1,
    batches: Callable | None = None,
    seed: int = 0,
    timeout: float = 60.0,
    backend: str = "gloo",
    threads: int | None = 1,
    checkpoint: str | Path | None = None,
    resume: bool = False,
) -> RankResult:
    """Run this process's rank of a placed step for ``steps`` training steps (under ``torchrun``).

    The per-rank entry point for users who start ``torchrun`` themselves. Every rank calls it with the
    same arguments; it joins the default process group (made here from the environment ``torchrun``
    sets when none exists, with ``timeout``), builds the :class:`~postplace.runtime.ranks.RankPlan`,
    checks it (:meth:`~postplace.runtime.ranks.RankPlan.check`) and that every rank built the same one,
    copies the rank's own parameters, buffers and optimizer state (the traced model itself stays whole
    in every process; :func:`launch` sends each rank its own state only), and runs its program. A
    script for ``torchrun --nproc-per-node 2 script.py``::

        from postplace.runtime.launcher import run_rank
        from postplace.runtime.zoo_step import trace_zoo_step

        result = run_rank(trace_zoo_step("gpt2", "small"), "run/placement.json", "k80x2", steps=3)
        print(result.rank, result.losses, result.bytes_sent)

    Parameters
    ----------
    traced : postplace.graph.trace_torch.Traced
        The traced step; its model's current weights are where the ranks start (each copies only its own).
    placement : path, mapping or array of int
        A ``placement.json`` (with ``devices`` a cluster), ``{op name: device name}``, or device ids per op.
    devices : Cluster, str or list of str, optional
        The placement's cluster (a preset or file) or its device names.
    steps : int
        Training steps.
    batches : callable, optional
        ``batches(traced) -> tensors``: the full batch of the next step (inputs, then targets), called
        once per step on every rank alike; default: the traced batch every step.
    seed : int
        Every rank seeds torch's generator with it before the first step (random ops draw alike).
    timeout : float
        Seconds any rank waits for a peer (process group start, every receive).
    backend : {"gloo", "nccl"}
    threads : int, optional
        torch CPU threads per rank (default 1; None leaves them).
    checkpoint : path, optional
        A folder every rank can read: after each step each rank writes its parameters, buffers,
        optimizer state and generator state there (:mod:`postplace.runtime.rank_checkpoint`).
    resume : bool
        Start every rank from the last step all ranks recorded in ``checkpoint`` (the batches of the steps
        before it drawn and dropped, so the run goes on as if never stopped); ``steps`` counts from the
        first step.

    Returns
    -------
    RankResult

    Raises
    ------
    PostplaceError
        One line: a world size that is not the number of devices the placement uses, ranks that built
        different plans, a peer that died, failed or did not answer within ``timeout``.
    """
    import torch.distributed as dist

    _check_steps(steps)
    _check_timeout(timeout)
    if threads is not None:
        torch.set_num_threads(threads)
    op_device, names = _op_devices(traced, placement, devices)
    _check_backend(backend, op_device, names)
    plan = batch_messages(rank_plan(traced, op_device, names, "cpu" if backend == "gloo" else "cuda"))
    plan.check()
    created = not dist.is_initialized()
    if created:
        _join(backend, timeout, os.environ.get("RANK", "?"))
    try:
        rank = _agree(plan)
        device = _rank_device(backend, plan, rank)
        args, owned = _rank_state(traced, plan, rank)
        op_names = {m.op: traced.graph.names[m.op] for m in plan.messages if m.op >= 0}
        from postplace.runtime.rank_checkpoint import launch_key

        key = launch_key(plan, traced.graph, seed, batches)
        return _execute(
            plan,
            rank,
            device,
            args,
            owned,
            traced,
            batches,
            steps,
            seed,
            op_names,
            None,
            _ckpt(checkpoint),
            resume,
            None,
            key,
        )
    finally:
        if created:
            dist.destroy_process_group()


def _agree(plan: RankPlan) -> int:
    """This process's rank, once the world is one process per device of ``plan`` and every rank built
    the same plan (digests compared through the process group's store, not its messages)."""
    import torch.distributed as dist

    rank, world = dist.get_rank(), dist.get_world_size()
    names = plan.device_names
    if world != plan.world_size:
        used = ", ".join(names[d] for d in plan.ranks)
        raise PostplaceError(
            f"rank {rank}: the world has {world} processes, but the placement uses "
            f"{plan.world_size} devices ({used}); start one process per device"
        )
    digest = plan.digest()
    store = dist.distributed_c10d._get_default_store()
    store.set(f"postplace/plan/{rank}", digest)
    for r in range(world):
        other = store.get(f"postplace/plan/{r}").decode()
        if other != digest:
            raise PostplaceError(
                f"{plan.rank_name(rank)} and {plan.rank_name(r)} built different plans (digests "
                f"{digest} and {other}): every rank must run one placement of one step"
            )
    return rank


def _execute(
    plan: RankPlan,
    rank: int,
    device: torch.device,
    args: list,
    owned: dict,
    inputs,
    batches,
    steps: int,
    seed: int,
    op_names: dict,
    progress: Path | None,
    checkpoint: Path | None = None,
    resume: bool = False,
    resume_at: int | None = None,
    key: str = "",
) -> RankResult:
    """Run rank ``rank``'s program ``steps`` times on ``device`` with its state ``args`` (``owned``:
    position in ``args`` -> ``(kind, name)`` of its parameters and buffers), writing its checkpoint after
    each step into ``checkpoint``; with ``resume``, from step ``resume_at`` (the launcher found it once for
    every rank) or, under torchrun, the last step every rank recorded there; ``key``: the launch's
    (:func:`postplace.runtime.rank_checkpoint.launch_key`), which its checkpoints carry."""
    from postplace.runtime import rank_checkpoint

    if device.type == "cuda":
        torch.cuda.set_device(device)
    prog = plan.programs[rank]
    gm = prog.gm.to(device)
    args = [t.to(device) for t in args]
    step_no = [0]
    channel = _Channel(plan, rank, device, op_names, step_no)
    for name in (
        SEND,
        RECV,
        BATCH,
        REDUCE,
        REDUCE_MAX,
        GATHER,
        SCATTER,
    ):  # a program that sends or receives nothing has none
        if hasattr(gm, name):
            getattr(gm, name).channel = channel
    losses, times, comm = [], [], []
    per_step = (0, 0)
    held = [i for i in prog.inputs if i < plan.n_persistent]  # the placeholders of args, in order
    start, rng = 0, {}
    if checkpoint is not None and resume:
        start = resume_at if resume_at is not None else resume_step(checkpoint, plan, steps)
        if start:
            tensors, rng = rank_checkpoint.read(checkpoint, key, rank, start, held)
            args = [t.to(device) for t in tensors]
    torch.manual_seed(seed)
    for _ in range(start):  # the batches of the steps already run: drawn and dropped, as the first launch drew them
        if batches is not None:
            batches(inputs)
    if "rng" in rng:
        torch.set_rng_state(rng["rng"])
    if "cuda_rng" in rng and device.type == "cuda":
        torch.cuda.set_rng_state(rng["cuda_rng"], device)
    for k in range(start, steps):
        step_no[0] = k
        if progress is not None:
            progress.write_text(str(k + 1))
        full = batches(inputs) if batches is not None else ()
        xs = inputs.split_batch(tuple(full))
        batch = [xs[i - plan.n_persistent].to(device, copy=True) for i in prog.inputs if i >= plan.n_persistent]
        sent, received, seconds = channel.sent, channel.received, channel.seconds
        t0 = time.perf_counter()
        with torch.no_grad():
            out = gm(*args, *batch)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        if 0 in prog.outputs:
            losses.append(float(out[prog.outputs.index(0)]))
        times.append(time.perf_counter() - t0)
        comm.append(channel.seconds - seconds)
        per_step = (channel.sent - sent, channel.received - received)
        if checkpoint is not None:
            rank_checkpoint.write(
                checkpoint,
                key,
                rank,
                k + 1,
                list(zip(held, args, strict=True)),
                device,
                plan.tensor_split,
                plan.tensor_degree,
            )
    params = {name: args[i].detach().cpu() for i, (kind, name) in owned.items() if kind == "parameter"}
    bufs = {name: args[i].detach().cpu() for i, (kind, name) in owned.items() if kind == "buffer"}
    return RankResult(
        rank,
        plan.device_names[plan.ranks[rank]],
        losses,
        per_step[0],
        per_step[1],
        times,
        comm,
        params,
        bufs,
        plan.digest(),
        start,
    )


def _rank_state(traced, plan: RankPlan, rank: int) -> tuple[list[torch.Tensor], dict[int, tuple[str, str]]]:
    """The persistent placeholders of one rank (its parameters, buffers, optimizer state), as CPU copies
    of the model's and zeros; and which of them are parameters or buffers: position -> (kind, name)."""
    pnames = [n for n, _ in traced.model.named_parameters()]
    bnames = [n for n, _ in traced.model.named_buffers()]
    params = [p.detach() for p in traced.model.parameters()]
    bufs = [b.detach() for b in traced.model.buffers()]
    state = [t for i, p in enumerate(params) for t in traced.optimizer.initial_state(i, p, device="meta")]
    if len(params) + len(bufs) + len(state) != plan.n_persistent:
        raise PostplaceError("the traced step's parameters, buffers and optimizer state do not match its placeholders")
    state_name = [name for i in range(len(params)) for name in traced.optimizer.state_names(i)]
    state_of = [i for i in range(len(params)) for _ in traced.optimizer.state_names(i)]  # its parameter
    split = {}  # tensor parallelism: placeholder -> this rank's part of it
    if plan.tensor_split:
        from postplace.runtime.tensor import tensor_shard

        for i, dim, blocks in plan.tensor_split:
            t = plan.tensor_degree
            split[i] = functools.partial(tensor_shard, dim=dim, groups=blocks, degree=t, j=rank % t)
    # FSDP's slices: of each part, over the ranks holding that part (rank j + T r is slice r of part j)
    slot, slices = rank // plan.tensor_degree, plan.world_size // plan.tensor_degree
    args, owned = [], {}
    for i in plan.programs[rank].inputs:
        if i >= plan.n_persistent:
            break
        if i < len(params):
            owned[len(args)] = ("parameter", pnames[i])
            t = split.get(i, lambda x: x)(params[i].to("cpu", copy=True))
            args.append(shard_of(t, slot, slices) if i in plan.sharded else t)
        elif i < len(params) + len(bufs):
            owned[len(args)] = ("buffer", bnames[i - len(params)])
            args.append(bufs[i - len(params)].to("cpu", copy=True))
        else:
            j = i - len(params) - len(bufs)
            t = split.get(i, lambda x: x)(torch.zeros_like(state[j], device="cpu"))
            if state_of[j] in plan.sharded and state_name[j] != "step":  # the moments: sliced alike; the count whole
                t = shard_of(t, slot, slices)
            args.append(t)
    return args, owned


def shard_of(t: torch.Tensor, rank: int, world: int) -> torch.Tensor:
    """Rank ``rank``'s slice of ``t`` flattened and padded with zeros to a multiple of ``world`` (FSDP's)."""
    width = slice_width(t.numel(), world)
    flat = torch.zeros(width * world, dtype=t.dtype, device=t.device)
    flat[: t.numel()] = t.reshape(-1)
    return flat[rank * width : (rank + 1) * width].clone()


def slice_width(numel: int, world: int) -> int:
    """The elements of each rank's slice of a tensor of ``numel`` elements (the last one padded)."""
    return -(-numel // world)


def unshard(shards: list[torch.Tensor], shape) -> torch.Tensor:
    """The tensor of ``shape`` the ranks' slices (:func:`shard_of`, in rank order) hold."""
    n = numel_of(tuple(shape))
    return torch.cat([x.reshape(-1) for x in shards])[:n].view(tuple(shape))


def joined(held: list[torch.Tensor], shape, degree: int = 1, split: tuple[int, int] | None = None):
    """The tensor of ``shape`` that every rank's copy (``held``, in rank order) holds a piece of, or None when
    they are not its pieces: FSDP's slices (rank j + ``degree`` r holding slice r of part j), or with ``split``
    (dimension, blocks) tensor-parallel parts (the first group's, :func:`postplace.runtime.tensor.tensor_shard`)."""
    from postplace.runtime.tensor import tensor_unshard

    shape = tuple(shape)
    part = list(shape)
    if split is not None:
        part[split[0]] //= degree
    width = slice_width(numel_of(tuple(part)), len(held) // degree)
    if len(held) % degree == 0 and all(tuple(x.shape) == (width,) for x in held):  # slices: joined per part
        parts = [unshard(held[j::degree], tuple(part)) for j in range(degree)]
    elif split is not None and len(held) >= degree and all(tuple(x.shape) == tuple(part) for x in held[:degree]):
        parts = held[:degree]
    else:
        return None
    return tensor_unshard(parts, *split) if split is not None else parts[0]


# ------------------------------------------------------------------------------ the launcher
@dataclasses.dataclass(frozen=True)
class _Inputs:
    """What a launched rank keeps of the traced step's batch: the traced tensors (the template of
    :class:`RandomBatches`) and how a batch splits into micro-batches (``Traced.split_batch``)."""

    inputs: tuple
    batch: tuple
    microbatches: int

    def split_batch(self, tensors) -> tuple:
        from postplace.graph.trace_torch import Traced

        return Traced.split_batch(self, tensors)


@dataclasses.dataclass(frozen=True)
class _Job:
    """What every worker process reads (``folder/job.pkl``); its state it reads from
    ``folder/state-RANK.pt``, written for it alone."""

    plan: RankPlan
    inputs: _Inputs
    op_names: dict
    steps: int
    batches: Callable | None
    seed: int
    timeout: float
    backend: str
    threads: int | None
    folder: str
    checkpoint: str | None = None
    resume: bool = False
    resume_at: int | None = None
    key: str = ""


def _worker(folder: str) -> RankResult:
    """The entry point of one launched process: read the job (``folder/job.pkl``: a file, so that
    starting a process never waits on a pipe the child reads only after its imports), join the group,
    load this rank's state, run its program; a failure leaves its one line in ``folder`` (``error-RANK``,
    written before the group is left, so a rank's own failure is older than its peers' lost messages)."""
    import torch.distributed as dist

    rank = int(os.environ.get("RANK", "0"))
    folder = Path(folder)
    joined = False
    try:
        job = pickle.loads((folder / "job.pkl").read_bytes())
        if job.threads is not None:
            torch.set_num_threads(job.threads)
        _join(job.backend, job.timeout, rank)
        joined = True
        rank = _agree(job.plan)
        state = torch.load(folder / f"state-{rank}.pt", weights_only=True)
        device = _rank_device(job.backend, job.plan, rank)
        return _execute(
            job.plan,
            rank,
            device,
            state["args"],
            state["owned"],
            job.inputs,
            job.batches,
            job.steps,
            job.seed,
            job.op_names,
            folder / f"step-{rank}",
            _ckpt(job.checkpoint),
            job.resume,
            job.resume_at,
            job.key,
        )
    except BaseException as exc:
        msg = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        if not isinstance(exc, PostplaceError):
            step = folder / f"step-{rank}"
            where = f", step {step.read_text()}" if step.is_file() else ""
            name = job.plan.rank_name(rank) if joined else f"rank {rank}"
            msg = f"{name}{where}: {type(exc).__name__}: {msg[:300]}"
        kind = "peer" if isinstance(exc, _PeerError) else "own"
        (folder / f"error-{rank}").write_text(f"{kind}\n{msg}")
        if kind == "peer":  # the agent reports the first exit it sees: let the peer that caused this one go first
            time.sleep(1.0)
        raise
    finally:
        if joined:
            dist.destroy_process_group()


def _join(backend: str, timeout: float, rank) -> None:
    """The default process group from the environment (``torchrun``'s variables), each failure one line."""
    import torch.distributed as dist

    try:
        dist.init_process_group(backend, timeout=datetime.timedelta(seconds=timeout))
    except Exception as exc:  # noqa: BLE001 - the store's and the backends' errors alike become one line
        raise _PeerError(
            f"rank {rank}: the process group did not form within {timeout:g} s ({_short(exc)}); "
            "start every rank (one per device) and check MASTER_ADDR/MASTER_PORT"
        ) from None


def launch(
    traced,
    placement,
    devices=None,
    *,
    steps: int = 3,
    batches: Callable | None = None,
    seed: int = 0,
    timeout: float = 60.0,
    backend: str = "gloo",
    threads: int | None = 1,
    checkpoint: str | Path | None = None,
    resume: bool = False,
) -> LaunchResult:
    """Run a placed step as one process per device, through torch's elastic launcher (torchrun's agent).

    Everything that can be checked is checked here, before any process starts: the placement against
    the traced step, the per-rank programs (:meth:`~postplace.runtime.ranks.RankPlan.check`), the
    backend against the devices. Each rank's parameters, buffers and optimizer state are written to a
    file of its own; then one process per device the placement uses receives the plan, loads its own
    state only, and runs ``steps`` steps. Nothing is traced again in the ranks.

    Parameters
    ----------
    traced : postplace.graph.trace_torch.Traced
        The traced step (``trace(model, inputs, loss_fn, targets=...)``, or a zoo model's); its model's
        current weights are where the ranks start.
    placement : path, mapping or array of int
        As for :func:`run_rank`.
    devices : Cluster, str or list of str, optional
        The placement's cluster or device names.
    steps, batches, seed, timeout, backend, threads, checkpoint, resume
        As for :func:`run_rank`; ``batches`` must be picklable (a module-level function or class
        instance), each rank calling its own copy as ``batches(inputs)`` where ``inputs`` has the traced
        step's ``inputs``, ``batch`` and ``split_batch``.

    Returns
    -------
    LaunchResult

    Raises
    ------
    PostplaceError
        One line: bad input before any process starts; else the failure of the first rank that failed
        (a rank that died, a peer that did not answer within ``timeout``, ranks that disagree).

    Notes
    -----
    A sketch (the tests run it; the caller's main module must be importable, as for any spawned
    process: guard the script with ``if __name__ == "__main__":``)::

        from postplace.runtime.zoo_step import trace_zoo_step

        result = launch(trace_zoo_step("gpt2", "small"), "run/placement.json", "k80x2", steps=3)
        result.losses, result.bytes_sent
    """
    _check_steps(steps)
    _check_timeout(timeout)
    op_device, names = _op_devices(traced, placement, devices)
    return _launch(
        traced, op_device, names, steps, batches, seed, timeout, backend, threads, checkpoint=checkpoint, resume=resume
    )


def _launch(traced, op_device, names, steps, batches, seed, timeout, backend, threads, **ckpt) -> LaunchResult:
    _check_backend(backend, op_device, names)
    plan = batch_messages(rank_plan(traced, op_device, names, "cpu" if backend == "gloo" else "cuda"))
    plan.check()
    return _run_plan(traced, plan, steps, batches, seed, timeout, backend, threads, **ckpt)


def _run_plan(
    traced, plan: RankPlan, steps, batches, seed, timeout, backend, threads, checkpoint=None, resume=False
) -> LaunchResult:
    """Every rank of ``plan`` in its own process; their results as one."""
    folder = Path(tempfile.mkdtemp(prefix="postplace-launch-"))
    try:
        for r in range(plan.world_size):
            args, owned = _rank_state(traced, plan, r)
            torch.save({"args": args, "owned": owned}, folder / f"state-{r}.pt")
        inputs = _Inputs(tuple(traced.inputs), tuple(traced.batch), traced.microbatches)
        op_names = {m.op: traced.graph.names[m.op] for m in plan.messages if m.op >= 0}
        ckpt = _ckpt(checkpoint)
        resume_at = None
        from postplace.runtime import rank_checkpoint

        if ckpt is not None:  # decided once, here, before any rank starts: every rank starts after the same step
            resume_at = resume_step(ckpt, plan, steps) if resume else rank_checkpoint.check_fresh(ckpt)
        job = _Job(
            plan,
            inputs,
            op_names,
            steps,
            batches,
            seed,
            float(timeout),
            backend,
            threads,
            str(folder),
            None if ckpt is None else str(ckpt.resolve()),
            bool(resume),
            resume_at,
            "" if ckpt is None else rank_checkpoint.launch_key(plan, traced.graph, seed, batches),
        )
        try:
            (folder / "job.pkl").write_bytes(pickle.dumps(job))
        except (pickle.PicklingError, TypeError, AttributeError) as exc:
            raise PostplaceError(
                f"the ranks' job cannot be sent to their processes ({exc}); give batches= a "
                "module-level function or class instance"
            ) from None
        results = _elastic(job, plan)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    if plan.partial_loss:  # data parallelism: each replica's share of every step's loss (its last stage's)
        shares = [r.losses for r in results.values() if 0 in plan.programs[r.rank].outputs]
        ran = min(len(x) for x in shares)
        losses = [float(sum(x[k] for x in shares)) for k in range(ran)]
    else:
        losses = next((r.losses for r in results.values() if r.losses), [])
    params, bufs = {}, {}
    for r in results.values():
        params.update(r.parameters)
        bufs.update(r.buffers)
    ranks_in_order = [results[q] for q in sorted(results)]
    tensor_split = {i: (dim, blocks) for i, dim, blocks in plan.tensor_split}
    for i, (n, p) in enumerate(traced.model.named_parameters()):
        if i in plan.sharded or i in tensor_split:  # every rank returned its slice or part: joined back
            params[n] = joined(
                [res.parameters[n] for res in ranks_in_order if n in res.parameters],
                p.shape,
                plan.tensor_degree,
                tensor_split.get(i),
            )
    order = [n for n, _ in traced.model.named_parameters()]
    border = [n for n, _ in traced.model.named_buffers()]
    ranks = sorted(results)
    return LaunchResult(
        losses=losses,
        ranks={r: results[r].device for r in ranks},
        bytes_sent={r: results[r].bytes_sent for r in ranks},
        bytes_received={r: results[r].bytes_received for r in ranks},
        step_times_s={r: results[r].step_times_s for r in ranks},
        comm_times_s={r: results[r].comm_times_s for r in ranks},
        parameters={n: params[n] for n in order if n in params},
        buffers={n: bufs[n] for n in border if n in bufs},
        held={r: [*results[r].parameters, *results[r].buffers] for r in ranks},
        backend=backend,
        plan=plan,
        start_step=max(r.start_step for r in results.values()),
    )


def _elastic(job: _Job, plan: RankPlan) -> dict[int, RankResult]:
    """The processes, through ``elastic_launch``; the agent's handlers, environment and logging as they were."""
    from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs, Std
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    config = LaunchConfig(
        min_nodes=1,
        max_nodes=1,
        nproc_per_node=plan.world_size,
        run_id=f"postplace-{uuid.uuid4().hex[:12]}",
        rdzv_backend="c10d",
        rdzv_endpoint="localhost:0",
        rdzv_configs={"join_timeout": max(int(job.timeout), 1)},
        max_restarts=0,
        monitor_interval=0.1,
        start_method="forkserver",
        logs_specs=DefaultLogsSpecs(log_dir=job.folder, redirects=Std.ALL),
    )
    handlers = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT)}
    env = dict(os.environ)
    quiet = [
        logging.getLogger(n)
        for n in ("torch.distributed.elastic", "torch.distributed.launcher", "torch.multiprocessing.spawn")
    ]
    levels = [q.level for q in quiet]
    for q in quiet:
        q.setLevel(logging.CRITICAL)
    # A fork server that has imported torch and the runtime once starts every rank of this and later launches
    # in a fraction of a spawn's time (each spawned rank imports them again: seconds on a small machine); its
    # children still import the caller's main module, as spawned ones do.
    multiprocessing.set_forkserver_preload(["postplace.runtime.launcher", "postplace.runtime.tensor"])
    try:
        return elastic_launch(config, _worker)(job.folder)
    except ChildFailedError as exc:
        raise PostplaceError(_failure_line(exc, job, plan)) from None
    finally:
        for q, level in zip(quiet, levels, strict=True):
            q.setLevel(level)
        for s, h in handlers.items():
            if h is not None:
                signal.signal(s, h)
        os.environ.clear()
        os.environ.update(env)


def _failure_line(exc, job: _Job, plan: RankPlan) -> str:
    """One line from the agent's failures and the ranks' own lines: ranks that died first, then ranks
    that failed on their own, then what their peers saw (a lost or late message), oldest first."""
    folder = Path(job.folder)
    died, own, peer = [], [], []
    for r in range(plan.world_size):
        step = folder / f"step-{r}"
        at = f" in step {step.read_text()}" if step.is_file() else " before its first step"
        err = folder / f"error-{r}"
        if err.is_file():
            kind, _, text = err.read_text().partition("\n")
            (peer if kind == "peer" else own).append((err.stat().st_mtime, text.strip()))
        elif r in exc.failures:
            code = exc.failures[r].exitcode
            how = f"was killed by {signal.Signals(-code).name}" if code < 0 else f"exited with status {code}"
            died.append(f"{plan.rank_name(r)} {how}{at}")
    # a rank its peers lost (the agent reports the first failure it sees: under a fork server, often a peer's)
    named = {int(r) for _, t in peer for r in re.findall(r"(?:from|to) rank (\d+)", t)}
    for r in sorted(named):
        if r < plan.world_size and r not in exc.failures and not (folder / f"error-{r}").is_file():
            step = folder / f"step-{r}"
            at = f" in step {step.read_text()}" if step.is_file() else " before its first step"
            died.append(f"{plan.rank_name(r)} stopped{at} without a word (killed, or its process died)")
    parts = died + [t for _, t in sorted(own)] + [t for _, t in sorted(peer)]
    if not parts:
        parts = [f"rank {r} failed (exit code {f.exitcode})" for r, f in sorted(exc.failures.items())]
    return f"launch failed: {'; '.join(parts[:2])[:600]}"


# ------------------------------------------------------------------------------ run folders
def _run_target(folder: Path) -> tuple[dict, dict, Path]:
    """(summary, run settings, placement path) of a run folder, each missing piece one line."""
    if not folder.is_dir():
        raise PostplaceError(f"{folder}: no such run folder (postplace place ... --out FOLDER writes one)")
    placement = folder / "placement.json"
    if not placement.is_file() and (folder / "layered.json").is_file():
        raise PostplaceError(
            f"{folder}: a place --layered folder (layered.json): its plan was priced by the layered estimate and has "
            "no placement of the traced step to launch; run place without --layered for a launchable answer, or "
            "launch the plan with postplace.runtime.launcher.launch_plan on a traced step"
        )
    if not placement.is_file():
        raise PostplaceError(
            f"{folder}: no placement.json; launch a folder that postplace place finished "
            "(it writes placement.json last)"
        )
    out = []
    for name in ("summary.json", "run.json"):
        path = folder / name
        try:
            data = json.loads(path.read_text()) if path.is_file() else {}
        except (OSError, ValueError, UnicodeDecodeError) as exc:
            raise PostplaceError(f"{path}: not readable JSON ({exc}); run postplace place again") from None
        out.append(data if isinstance(data, dict) else {})
    return out[0], out[1], placement


def run_folder(folder: str | Path) -> dict:
    """What a run folder of a zoo model holds to run it again, checked, each missing piece one line:
    ``{"name", "size", "placement" (path), "cluster" (spec), "target" (run.json's target), "microbatches",
    "colocation"}``. What :func:`launch_run` and ``postplace train RUN_FOLDER`` start from."""
    from postplace.graph.opgraph import read_json
    from postplace.runtime.zoo_step import check_placement_microbatches

    folder = Path(folder)
    summary, run, placement = _run_target(folder)
    target = summary.get("target_spec") or run.get("target") or {}
    if not isinstance(target, dict) or target.get("kind") != "zoo":
        kind = target.get("kind", "unknown") if isinstance(target, dict) else "unknown"
        raise PostplaceError(
            f"{folder}: its target is a {kind}, not a zoo model; a run folder keeps no code of a "
            "module: call postplace.runtime.launcher.launch(traced, placement, cluster) with your "
            "traced module"
        )
    plan = summary.get("returned_plan")
    if plan:
        from postplace.plans import parse_plan
        from postplace.runtime.ddp import launchable
        from postplace.runtime.tensor import launchable_tensor

        try:
            p = parse_plan(plan)
        except PostplaceError:
            raise PostplaceError(
                f"{folder}/summary.json: returned_plan {str(plan)[:80]!r} is not a plan's name; "
                "run postplace place again"
            ) from None
        if not (launchable(p) or p.pipeline or launchable_tensor(p)) or not p.microbatches:
            raise PostplaceError(
                f"{folder}: the returned plan is '{plan}'; launch runs op-level placements and "
                "ddp, zero1, zero2 and fsdp plans and their per-unit hybrids (shard=), +recompute, +selective, "
                "tensor-parallel groups as ddp, zero1, zero2 or fsdp replicas (fsdp:tp=T), and pipelines of ddp or "
                "zero1 replicas or groups (zero1:tp=T,pp=P) so far (ZeRO-2 with pp: simulated only)"
            )
    spec = run.get("cluster_spec") or summary.get("cluster")
    if not spec:
        raise PostplaceError(f"{folder}/run.json: no cluster_spec; run postplace place again")
    mapping = read_json(placement)
    if not isinstance(mapping, dict):
        raise PostplaceError(f"{placement}: a placement file is one JSON object {{op name: device name}}")
    return {
        "name": target["name"],
        "size": target.get("size", "full"),
        "placement": placement,
        "cluster": spec,
        "target": target,
        "microbatches": p.microbatches if plan else check_placement_microbatches(mapping, None, str(placement)),
        "colocation": summary.get("microbatch_colocation") or target.get("microbatch_colocation") or "none",
        "plan": plan or None,
        "exclude": _excluded(run, folder),
    }


def _excluded(run: dict, folder: Path) -> tuple[str, ...]:
    """The GPUs the run's ``--exclude`` left out (run.json), which a launched plan must leave out too."""
    exclude = run.get("exclude") or ()
    if not isinstance(exclude, list | tuple) or not all(isinstance(d, str) for d in exclude):
        raise PostplaceError(f"{folder}/run.json: exclude is {exclude!r}, not a list of device names; run place again")
    return tuple(exclude)


def launch_run(
    folder: str | Path,
    *,
    steps: int = 3,
    seed: int = 0,
    timeout: float = 60.0,
    backend: str = "gloo",
    threads: int | None = 1,
    checkpoint: str | Path | None = None,
    resume: bool = False,
) -> tuple[LaunchResult, dict]:
    """``postplace launch RUN_FOLDER``: the folder's placement of its zoo model, one process per device.

    Every step trains on a fresh random batch (:class:`RandomBatches` with ``seed``: the batches
    ``postplace train RUN_FOLDER --seed`` draws), so the losses can be held against the one-process run.

    Parameters
    ----------
    folder : path
        A run folder of ``postplace place`` on a zoo model.
    steps, seed, timeout, backend, threads, checkpoint, resume
        As for :func:`launch` (``checkpoint``: the ranks' checkpoints, e.g. ``RUN_FOLDER/launch``).

    Returns
    -------
    tuple
        ``(LaunchResult, simulated)``: the run, and the simulator's bytes per rank for the same
        placement (``{"bytes_sent": {rank: n}, "bytes_received": {rank: n}}``, per step).

    Raises
    ------
    PostplaceError
        One line before any process starts: a missing folder or placement.json, a target that is not
        a zoo model, a returned plan launch does not run (tensor parallelism, ZeRO/FSDP in a pipeline), a
        placement naming devices the run's cluster lacks; else as :func:`launch`.
    """
    from postplace.cluster import load_cluster
    from postplace.cluster.placement import load_placement
    from postplace.graph.optimizers import recorded_step
    from postplace.runtime.zoo_step import trace_zoo_step

    _check_steps(steps)
    _check_timeout(timeout)
    run = run_folder(folder)
    cluster = load_cluster(run["cluster"])
    traced = trace_zoo_step(
        run["name"],
        run["size"],
        microbatches=run["microbatches"],
        colocation=run["colocation"],
        **recorded_step(run["target"]),
    )
    if run["plan"]:
        result = launch_plan(
            traced,
            run["plan"],
            cluster,
            steps=steps,
            batches=RandomBatches(seed),
            seed=seed,
            timeout=timeout,
            backend=backend,
            threads=threads,
            checkpoint=checkpoint,
            resume=resume,
            exclude=run["exclude"],
        )
        from postplace.plans import data_parallel, parse_plan

        spec = parse_plan(run["plan"])
        if spec.pipeline or spec.tensor:
            simulated = simulated_plan_bytes(traced.graph, spec, cluster, result.plan, run["exclude"])
        else:
            shard = None if spec.shard is None else frozenset(spec.shard)  # a hybrid's units: fsdp's collectives
            planned = data_parallel(traced.graph, result.plan.world_size, spec.level, shard=shard)
            payload = int(
                sum(
                    c.nbytes
                    for c in planned.graph.collectives
                    if c.kind in ("all_reduce", "reduce_scatter", "all_gather")
                )
            )
            every = dict.fromkeys(range(result.plan.world_size), payload)
            simulated = {"bytes_sent": every, "bytes_received": dict(every)}
        _record_launch(Path(folder), result, simulated, steps=steps, seed=seed)
        return result, simulated
    op_device = load_placement(run["placement"], traced.graph, cluster)
    result = _launch(
        traced,
        op_device,
        list(cluster.device_names),
        steps,
        RandomBatches(seed),
        seed,
        timeout,
        backend,
        threads,
        checkpoint=checkpoint,
        resume=resume,
    )
    simulated = simulated_bytes(traced.graph, cluster, op_device, result.plan)
    _record_launch(Path(folder), result, simulated, steps=steps, seed=seed)
    return result, simulated


LAUNCH_RECORD = "launch.json"


def measured_on(backend: str) -> str:
    """What a launch's measured figures were measured on, in words."""
    if backend == "gloo":
        return "CPU processes (gloo) standing in for the devices"
    return "one process per GPU (nccl)"


def _record_launch(folder: Path, result: LaunchResult, simulated: dict, *, steps: int, seed: int) -> None:
    """``RUN_FOLDER/launch.json``: the last launch's measured figures per rank beside the simulated ones, each
    figure labelled (``figures``), what they were measured on said in words."""
    from postplace.graph.opgraph import read_json

    try:
        summary = read_json(folder / "summary.json")
    except (OSError, ValueError, PostplaceError):
        summary = {}
    record = {
        "format": "postplace-launch",
        **result.to_json(),
        "steps": steps,
        "seed": seed,
        "measured_on": measured_on(result.backend),
        "simulated_bytes_sent": {str(r): n for r, n in simulated["bytes_sent"].items()},
        "simulated_bytes_received": {str(r): n for r, n in simulated["bytes_received"].items()},
        "simulated_step_time_s": summary.get("simulated_step_time_s") if isinstance(summary, dict) else None,
        "figures": {
            "losses": "measured",
            "step_times_s": "measured",
            "comm_times_s": "measured",
            "bytes_sent": "measured",
            "bytes_received": "measured",
            "simulated_bytes_sent": "simulated",
            "simulated_bytes_received": "simulated",
            "simulated_step_time_s": "simulated",
        },
    }
    tmp = folder / (LAUNCH_RECORD + ".tmp")
    tmp.write_text(json.dumps(record, indent=1))
    tmp.replace(folder / LAUNCH_RECORD)


def simulated_bytes(graph, cluster, op_device, plan: RankPlan) -> dict:
    """The simulator's bytes sent and received per step by each rank of ``plan``, for ``op_device``."""
    from postplace.cost import priced_on
    from postplace.sim import Simulator

    used = np.asarray(op_device).tolist()
    schedule = Simulator(graph, cluster, cost_model=priced_on(None, cluster, used)).schedule(np.asarray(op_device))
    rank_of = {d: r for r, d in enumerate(plan.ranks)}
    sent = dict.fromkeys(range(plan.world_size), 0)
    received = dict.fromkeys(range(plan.world_size), 0)
    for _op, _slot, a, b, nbytes, *_ in schedule.transfers:
        sent[rank_of[int(a)]] += int(nbytes)
        received[rank_of[int(b)]] += int(nbytes)
    return {"bytes_sent": sent, "bytes_received": received}


def simulated_plan_bytes(graph, spec, cluster, plan: RankPlan, exclude=()) -> dict:
    """The simulator's bytes sent and received per step by each rank of ``plan``, the launch of the
    practitioner plan ``spec`` of ``graph``: the transfers of the simulated plan
    (:func:`postplace.placers.practitioner.plan_step`) from and to the rank's device, and the payload of each
    collective it is a member of, counted once each way as the launch counts it."""
    from postplace.placers.practitioner import plan_devices, plan_step

    simulated = plan_step(graph, cluster, spec, plan_devices(cluster, spec, exclude))
    out = simulated_bytes(simulated.graph, cluster, simulated.placement, plan)
    rank_of = {d: r for r, d in enumerate(plan.ranks)}
    g = simulated.graph
    for k, c in enumerate(g.collectives):
        members = {int(simulated.placement[i]) for i in np.flatnonzero(g.collective == k)}
        if len(members) > 1:
            for d in members:
                out["bytes_sent"][rank_of[d]] += int(c.nbytes)
                out["bytes_received"][rank_of[d]] += int(c.nbytes)
    return out


def _one_replica(spec, gpus: int):
    """``spec`` as launched: a ZeRO plan, or FSDP without a pipeline, over one tensor-parallel group or one
    pipeline (dp = 1) shards nothing and runs as ``ddp``'s program (the simulated plan's collectives over
    one rank move no bytes either). FSDP with a pipeline stays as it is: the simulator refuses it, so does
    launch."""
    one_replica = bool(spec.tensor or spec.pipeline) and gpus == (spec.tensor or 1) * (spec.pipeline or 1)
    sharding = spec.level in ("zero1", "zero2") or (spec.level == "fsdp" and not spec.pipeline)
    return dataclasses.replace(spec, level="ddp") if one_replica and sharding and spec.shard is None else spec


def _check_tensor(plan: str, spec) -> None:
    """Tensor parallelism launches in groups that are ddp, ZeRO or FSDP replicas (or a per-unit hybrid's), and in
    pipelines of ddp or zero1 groups, nothing else (so far)."""
    from postplace.runtime.tensor import launchable_tensor

    if not launchable_tensor(spec):
        raise PostplaceError(
            f"plan '{plan}': launch runs tensor parallelism in groups that are ddp, zero1, zero2 or fsdp replicas "
            "(recomputed or not, per-unit hybrids of ddp and fsdp too) and in pipelines of ddp or zero1 groups "
            "(ddp:tp=T,pp=P) so far; the rest of tensor parallelism is not launched (zero2 groups or per-unit "
            "hybrids in a pipeline are simulated only; fsdp in a pipeline is neither simulated nor launched)"
        )


def launch_plan(
    traced,
    plan: str,
    cluster,
    *,
    steps: int = 3,
    batches=None,
    seed: int = 0,
    timeout: float = 60.0,
    backend: str = "gloo",
    threads: int | None = 1,
    checkpoint: str | Path | None = None,
    resume: bool = False,
    exclude=(),
):
    """Run the practitioner plan ``plan`` of ``traced`` as one process per GPU (torchrun's elastic agent).

    Only ``ddp``, ``zero1``, ``zero2`` and ``fsdp`` (``ddp:m=M,dp=K``: the step's micro-batch count M, K
    replicas, default every GPU of ``cluster``; :func:`postplace.runtime.ddp.ddp_plan`,
    :func:`postplace.runtime.fsdp.fsdp_plan`), each with or without ``+recompute``, ``recompute=U/U`` or
    ``+selective``, and pipelines of ``ddp`` or ``zero1`` replicas (``ddp:pp=P,m=M,dp=K,schedule=S``,
    recomputed or not: :func:`postplace.runtime.pipeline.pipeline_plan`) run so far, the hybrids per unit
    (``ddp:shard=U/U``: those units sharded as ``fsdp`` shards them, the others replicated as ``ddp``;
    ``fsdp_plan(shard=)``), and tensor-parallel groups as ``ddp``, ``zero1``, ``zero2`` or ``fsdp`` replicas
    (``ddp:tp=T``, ``fsdp:tp=T``, with sequence parallelism ``,sp`` or not, and their per-unit hybrids
    ``ddp:tp=T,shard=U/U``: :func:`postplace.runtime.tensor.tensor_plan`) or in a pipeline (``ddp:tp=T,pp=P``,
    ``zero1:tp=T,sp,pp=P``). A ZeRO plan, or FSDP without a pipeline, over one group or one pipeline (dp = 1)
    shards nothing and runs as ``ddp``'s. ZeRO-2 inside a pipeline of several replicas (simulated only), FSDP
    inside a pipeline (neither simulated nor launched), and a per-unit hybrid in a pipeline or over one tensor
    group are refused in one line.

    Parameters
    ----------
    traced : postplace.graph.trace_torch.Traced
        The step traced as M micro-batches.
    plan : str
        The plan as ``place`` returns it (``summary.json``'s ``returned_plan``).
    cluster : Cluster or str
        The plan's cluster (a preset or file).
    steps, batches, seed, timeout, backend, threads, checkpoint, resume
        As for :func:`launch`.
    exclude : sequence of str
        GPUs the plan may not use (``place --exclude``): it runs on the others, as the simulated plan did.

    Returns
    -------
    postplace.runtime.launcher.LaunchResult
        ``losses`` the step's whole loss (the ranks' shares summed), ``bytes_sent`` each rank's
        all-reduced bytes.
    """
    from postplace.cluster import load_cluster
    from postplace.placers.practitioner import plan_devices
    from postplace.plans import parse_plan
    from postplace.runtime.ddp import ddp_plan, launchable

    _check_steps(steps)
    _check_timeout(timeout)
    spec = parse_plan(plan)
    if spec.micro_sizes is not None:
        raise PostplaceError(
            f"plan '{plan}': mbs= (a micro-batch size per GPU model) is simulated only (op by op or by the layered "
            "estimate); launch runs one micro-batch size for every rank: drop mbs"
        )
    cluster = load_cluster(cluster) if isinstance(cluster, str) else cluster
    gpus = plan_devices(cluster, spec, exclude)
    spec = _one_replica(spec, len(gpus))
    if spec.tensor:
        _check_tensor(plan, spec)
    elif not spec.pipeline and not launchable(spec):
        raise PostplaceError(
            f"plan '{plan}': launch runs ddp, zero1, zero2 and fsdp plans and their per-unit hybrids (shard=), "
            "with +recompute or +selective or not, pipelines of ddp or zero1 replicas, tensor-parallel groups "
            "(ddp:tp=T, fsdp:tp=T) and op-level placements so far"
        )
    if spec.microbatches is not None and spec.microbatches != traced.microbatches:
        raise PostplaceError(
            f"plan '{plan}' is for {spec.microbatches} micro-batches and the step was traced as "
            f"{traced.microbatches}; trace it at m={spec.microbatches}"
        )
    _check_backend(backend, gpus, list(cluster.device_names))
    recompute, selective = (), False
    if spec.recompute:
        from postplace.runtime.recompute import recomputed_units, selective_of

        recompute, selective = recomputed_units(spec, traced), selective_of(spec)
    if spec.tensor and not spec.pipeline:
        from postplace.runtime.tensor import tensor_plan

        sequence = None
        if spec.sequence:  # the ops the simulated plan splits by tokens, split alike
            from postplace.runtime.tensor import sequence_split_of

            sequence = sequence_split_of(traced, spec)
        rank_programs = tensor_plan(
            traced,
            gpus,
            list(cluster.device_names),
            tp=spec.tensor,
            recompute=recompute,
            selective=selective,
            level=spec.level,
            sequence=sequence,
            shard=None if spec.shard is None else frozenset(spec.shard),
        )
    elif spec.pipeline:
        from postplace.runtime.pipeline import pipeline_plan

        rank_programs = pipeline_plan(traced, spec, cluster, gpus, device="cpu" if backend == "gloo" else "cuda")
    elif spec.level == "fsdp" or spec.shard is not None:  # a hybrid: fsdp's units, the others as ddp's
        from postplace.runtime.fsdp import fsdp_plan

        shard = None if spec.shard is None else frozenset(spec.shard)
        rank_programs = fsdp_plan(
            traced, gpus, list(cluster.device_names), recompute=recompute, selective=selective, shard=shard
        )
    else:
        rank_programs = ddp_plan(
            traced, gpus, list(cluster.device_names), level=spec.level, recompute=recompute, selective=selective
        )
    rank_programs.check()
    return _run_plan(
        traced, rank_programs, steps, batches, seed, timeout, backend, threads, checkpoint=checkpoint, resume=resume
    )
