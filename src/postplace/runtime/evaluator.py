"""TorchEvaluator: the Evaluator that measures real step times of placed training steps.

The protocol is the hierarchical planner's (Mirhoseini et al., ICLR 2018): run ``steps`` training steps
(default 10), discard the first ``discard`` (default 5) as warm-up, report the median of the rest.
Every placement starts from the same parameters and zero optimizer state (each gets its own
:class:`~postplace.runtime.placed.PlacedStep`), so results do not depend on the order of evaluation.
A step traced as m micro-batches (``for_zoo(..., microbatches=m)``) is measured whole: one timed step
is the m micro-batches' forward and backward passes and the one update (``extra["microbatches"]``).

Failures never stop a batch:

* a placement that breaks a rule (splits a colocation set, uses a device kind an op may not use) is
  ``failed`` with the rule's reason, without running;
* out of memory (``torch.OutOfMemoryError``, or the CPU allocator's "can't allocate memory") marks it
  ``oom`` (step time inf);
* a placement still running after ``timeout`` seconds (building included) is ``failed`` with reason
  ``timeout``. In the main thread the timeout interrupts the step between two aten calls (``SIGALRM``);
  elsewhere it is checked between steps;
* any other exception marks it ``failed`` with ``Type: first line of the message``.

``peak_mem[n, D]`` is ``torch.cuda.max_memory_allocated`` for a logical device that has a CUDA device
to itself; elsewhere (the CPU, or several logical devices on one torch device) it is 0 and
``extra["peak_mem_measured"][d]`` is False.
"""

from __future__ import annotations

import gc
import signal
import threading
import time
from collections.abc import Mapping

import numpy as np
import torch

from postplace.errors import PostplaceError
from postplace.runtime.placed import apply, resolve_device_map, time_steps
from postplace.sim.simulate import EvalResult, expand_placements

__all__ = ["TorchEvaluator"]


class _Timeout(Exception):
    pass


class TorchEvaluator:
    """Evaluates placements of a traced step by running them (see module docstring).

    An :class:`~postplace.sim.Evaluator` (``name`` ``"torch"``); :meth:`for_zoo` traces a zoo model
    and makes one.

    Parameters
    ----------
    traced : postplace.graph.trace_torch.Traced
        The traced step.
    cluster : Cluster or list of str
        A :class:`~postplace.cluster.Cluster` (placements are checked against its rules) or a list of
        logical device names.
    group_of_op : numpy.ndarray, optional
        Int array over ops; placements are then over groups (as the Simulator takes them).
    device_map : str or mapping, optional
        Logical name -> torch device, or ``"cpu"`` for everything on the CPU.
    steps, discard : int
        Steps per placement (default 10) and how many of the first are not timed (default 5).
    timeout : float
        Seconds per placement.
    threads : int, optional
        Torch's CPU threads while measuring (default: as they are).

    Raises
    ------
    PostplaceError
        When ``steps`` does not exceed ``discard`` >= 0, or the device map is bad.
    """

    name = "torch"

    def __init__(
        self,
        traced,
        cluster,
        *,
        group_of_op: np.ndarray | None = None,
        device_map: str | Mapping[str, str] | None = None,
        steps: int = 10,
        discard: int = 5,
        timeout: float = 120.0,
        threads: int | None = None,
    ):
        if steps <= discard or discard < 0:
            raise PostplaceError(f"TorchEvaluator: steps ({steps}) must exceed discard ({discard}) >= 0")
        self.traced = traced
        self.graph = traced.graph
        self.cluster = cluster if hasattr(cluster, "device_names") else None
        self.device_names = tuple(cluster.device_names if self.cluster else cluster)
        self.torch_devices = resolve_device_map(self.device_names, device_map)
        self.device_map = device_map
        self.group_of_op = None if group_of_op is None else np.asarray(group_of_op, dtype=np.int64)
        self.steps, self.discard, self.timeout = steps, discard, float(timeout)
        self.threads = threads

    @classmethod
    def for_zoo(
        cls,
        name: str,
        size: str,
        cluster,
        *,
        group_of_op: np.ndarray | None = None,
        device_map: str | Mapping[str, str] | None = None,
        optimizer=None,
        precision: str | None = None,
        graph=None,
        microbatches: int | None = None,
        colocation: str | None = None,
        **kwargs,
    ) -> TorchEvaluator:
        """Trace zoo model ``name`` at ``size`` and evaluate on ``cluster``.

        Parameters
        ----------
        name, size : str
            The zoo model and its size.
        cluster : Cluster, str or path
            A Cluster, preset name or cluster file.
        group_of_op, device_map
            As the constructor takes them.
        optimizer, precision : optional
            Default as ``graph`` records them, else SGD and fp32.
        graph : OpGraph, optional
            The OpGraph the search places; it must be the one traced now (same op names, same
            micro-batch count).
        microbatches, colocation : optional
            Trace the step as that many micro-batches (gradient accumulation; a measured step is the
            whole accumulated step: m micro-batches and one update); default: as ``graph`` records
            them, else 1 and ``"none"``.
        **kwargs
            The constructor's other arguments (``steps``, ``discard``, ``timeout``, ``threads``).

        Returns
        -------
        TorchEvaluator

        Raises
        ------
        PostplaceError
            When ``microbatches`` or ``colocation`` differ from what ``graph`` records, or ``graph``
            is not the step traced now.
        """
        from postplace.cluster import load_cluster
        from postplace.runtime.zoo_step import trace_zoo_step

        meta = dict(getattr(graph, "metadata", None) or {}) if graph is not None else {}
        recorded = meta.get("microbatches")
        if graph is not None and recorded is None:
            from postplace.graph.microbatch_names import placement_microbatches

            recorded = placement_microbatches(graph.names)
        if microbatches is None:
            microbatches = int(recorded) if recorded is not None else 1
        elif recorded is not None and int(recorded) != microbatches:
            raise PostplaceError(
                f"graph '{graph.name}' is a step of {recorded} micro-batch(es), but microbatches={microbatches} "
                "was asked for; give the graph's micro-batch count"
            )
        rec_mode = meta.get("microbatch_colocation") if microbatches > 1 else None
        if colocation is None:
            colocation = str(rec_mode or "none") if microbatches > 1 else "none"
        elif rec_mode is not None and colocation != rec_mode:
            raise PostplaceError(
                f"graph '{graph.name}' was traced with micro-batch colocation '{rec_mode}', but colocation="
                f"'{colocation}' was asked for; give the graph's mode"
            )
        if optimizer is None:
            from postplace.graph.optimizers import optimizer_from_record

            optimizer = optimizer_from_record(meta.get("optimizer", "sgd"))
        precision = precision or meta.get("precision", "fp32")
        traced = trace_zoo_step(
            name, size, microbatches=microbatches, colocation=colocation, optimizer=optimizer, precision=precision
        )
        if graph is not None and tuple(graph.names) != tuple(traced.graph.names):
            mb = f" as {microbatches} micro-batches" if microbatches > 1 else ""
            raise PostplaceError(
                f"graph '{graph.name}' does not match zoo model '{name}' ({size}) as traced now{mb}; "
                "re-create it with `postplace graph`"
            )
        if isinstance(cluster, str):
            cluster = load_cluster(cluster)
        return cls(traced, cluster, group_of_op=group_of_op, device_map=device_map, **kwargs)

    @property
    def microbatches(self) -> int:
        """How many micro-batches one measured step runs (before its one update)."""
        return int(getattr(self.traced, "microbatches", 1))

    @property
    def failure_step_time(self) -> float:
        """A score above every feasible measured step time: a step that ran past the timeout failed.
        (A strategy's failing score must exceed it; the simulator's bound is for simulated times.)"""
        return self.timeout

    # ------------------------------------------------------------------------------ evaluation
    def expand(self, placements: np.ndarray) -> np.ndarray:
        """Op-level device ids ``[n, num_ops]`` from group-level (or op-level) placements."""
        return expand_placements(placements, self.group_of_op, self.graph.num_ops)

    def evaluate(self, placements: np.ndarray) -> EvalResult:
        """Run placements over groups (or over ops when there is no grouping), one after another.

        Parameters
        ----------
        placements : numpy.ndarray
            ``int[units]`` or ``int[n, units]``.

        Returns
        -------
        EvalResult
            Measured step times (the median of the timed steps); OOM, failures and timeouts marked,
            never raised.
        """
        saved = torch.get_num_threads()
        if self.threads is not None:
            torch.set_num_threads(self.threads)
        try:
            return self._evaluate(placements)
        finally:
            torch.set_num_threads(saved)

    def evaluate_ops(self, op_placements: np.ndarray) -> EvalResult:
        """Run op-level placements ``[n, num_ops]``, whatever the grouping (as the Simulator's)."""
        saved, self.group_of_op = self.group_of_op, None
        try:
            return self.evaluate(op_placements)
        finally:
            self.group_of_op = saved

    def _evaluate(self, placements: np.ndarray) -> EvalResult:
        ops = self.expand(placements)
        n, D = ops.shape[0], len(self.device_names)
        step = np.full(n, np.inf)
        peak = np.zeros((n, D))
        oom = np.zeros(n, dtype=bool)
        failed = np.zeros(n, dtype=bool)
        reasons: list[str | None] = [None] * n
        all_times: list[list[float]] = [[] for _ in range(n)]
        for r in range(n):
            reason = self._invalid(ops[r])
            if reason:
                failed[r], reasons[r] = True, reason
                continue
            try:
                times = self._measure(ops[r])
                all_times[r] = times
                step[r] = float(np.median(times[self.discard :]))
                peak[r] = self._peaks()
            except _Timeout:
                failed[r], reasons[r] = True, f"timeout: still running after {self.timeout:g} s"
            except Exception as exc:  # noqa: BLE001 - any failure of one placement is its result
                if _is_oom(exc):
                    oom[r] = True
                    reasons[r] = f"out of memory: {first_line(exc)}"
                else:
                    failed[r], reasons[r] = True, f"{type(exc).__name__}: {first_line(exc)}"
            finally:
                gc.collect()
                if torch.cuda.is_available():
                    torch.cuda.empty_cache()
        extra = {
            "step_times": all_times,
            "peak_mem_measured": self._peak_measured(),
            "devices": self._devices(),
            "microbatches": self.microbatches,
        }
        return EvalResult(step, peak, oom, failed, reasons, self.name, extra=extra)

    def _devices(self) -> dict[str, str]:
        return {n: str(d) for n, d in zip(self.device_names, self.torch_devices, strict=True)}

    def _invalid(self, dev: np.ndarray) -> str | None:
        return invalid_placement(self.graph, self.cluster, self.device_names, dev)

    def _make_step(self, dev: np.ndarray):
        """The placed step of one op-level placement (a separate method so tests can wrap it)."""
        return apply(self.traced.model, self.traced, dev, self.device_names, device_map=self.device_map)

    def _measure(self, dev: np.ndarray) -> list[float]:
        deadline = time.perf_counter() + self.timeout
        with _alarm(self.timeout):
            for d, ok in zip(self.torch_devices, self._peak_measured(), strict=True):
                if ok:
                    torch.cuda.reset_peak_memory_stats(d)
            placed = self._make_step(dev)
            times = time_steps(placed, self.steps, deadline=deadline)
            del placed
        if len(times) < self.steps:
            raise _Timeout
        return times

    def _peak_measured(self) -> list[bool]:
        devs = self.torch_devices
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        # a cuda:K this machine lacks has no allocator to read: its placements fail with their own reason
        return [d.type == "cuda" and (d.index or 0) < count and sum(1 for e in devs if e == d) == 1 for d in devs]

    def _peaks(self) -> np.ndarray:
        return np.array(
            [
                float(torch.cuda.max_memory_allocated(d)) if ok else 0.0
                for d, ok in zip(self.torch_devices, self._peak_measured(), strict=True)
            ]
        )


class _alarm:
    """Raise :class:`_Timeout` after ``seconds`` (main thread only; a no-op elsewhere)."""

    def __init__(self, seconds: float):
        self.seconds = seconds
        self.active = threading.current_thread() is threading.main_thread() and hasattr(signal, "setitimer")

    def __enter__(self):
        if self.active:

            def fire(signum, frame):
                raise _Timeout

            self.old = signal.signal(signal.SIGALRM, fire)
            signal.setitimer(signal.ITIMER_REAL, self.seconds)
        return self

    def __exit__(self, *exc):
        if self.active:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, self.old)
        return False


def _is_oom(exc: BaseException) -> bool:
    if isinstance(exc, torch.OutOfMemoryError | MemoryError):
        return True
    msg = str(exc)
    return isinstance(exc, RuntimeError) and ("out of memory" in msg or "can't allocate memory" in msg)


def invalid_placement(graph, cluster, device_names, dev: np.ndarray) -> str | None:
    """Why op-level placement ``dev`` cannot be run (a device id out of range, or against the cluster's
    rules when there is one), or None: what every measuring evaluator checks before it runs one."""
    if np.any((dev < 0) | (dev >= len(device_names))):
        return f"device ids must be 0..{len(device_names) - 1}"
    if cluster is not None:
        from postplace.cluster.placement import invalid_reason

        return invalid_reason(graph, cluster, dev)
    return None


def first_line(exc: BaseException, limit: int = 300) -> str:
    """An exception's first line (its type's name when it says nothing), at most ``limit`` characters."""
    text = str(exc).strip()
    return (text.splitlines()[0] if text else type(exc).__name__)[:limit]
