"""Measure op-level placements by launching them: one process per device over torch.distributed.

:class:`LaunchEvaluator` is the measurer of ``--confirm K --confirm-with launch``
(:func:`postplace.confirm.confirm` takes it where it takes the in-process
:class:`~postplace.runtime.evaluator.TorchEvaluator`): each placement runs as
:func:`postplace.runtime.launcher.launch` runs it, one process per device the placement uses, every
tensor that crosses devices a ``torch.distributed`` message, for ``steps`` steps from the traced
model's weights (every placement starts from the same weights: the ranks train copies).

Its step time: for each step after the first ``discard`` (the warm-up: the first step's allocations
and first messages), the slowest rank's seconds of that step (a rank that waits on a peer's message
counts its wait), and the median of those over the timed steps. Each rank's own median beside it
(:attr:`EvalResult.extra` ``["launch"]``: per placement ``{"ranks": {rank: device}, "rank_step_s":
{device: seconds}, "steps", "timed_steps"}``).

What it ran on is said in words (:attr:`LaunchEvaluator.measured_on`,
:func:`postplace.runtime.launcher.measured_on`): with ``backend="gloo"`` (the default) every rank is a
CPU process standing in for its device, so the figures are CPU seconds of the placement's split and
messages, not the devices' own.

A placement that cannot be launched is a failed row with its reason, never an exception: devices
outside the cluster or against its rules (checked before any process starts), a plan the launcher
refuses (a value that is not a tensor crossing devices), a rank that failed or a peer that did not
answer within ``timeout`` (the launcher's one line). Peak memory is not measured (zeros).

:meth:`LaunchEvaluator.evaluate_plans` measures practitioner plans of the same step the same way
(those :func:`postplace.runtime.launcher.launch_plan` runs: ``ddp``, ``zero1``, ``zero2``, ``fsdp``,
recomputed or not, pipelines of ``ddp`` replicas; each as it runs them, one process per GPU of the
plan): the same step time, the same per-rank figures, and a plan the launcher refuses (tensor
parallelism, ZeRO or FSDP inside a pipeline...) or one for another micro-batch count a failed row with
the launcher's one line.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import numpy as np

from postplace.errors import PostplaceError
from postplace.runtime.evaluator import first_line, invalid_placement

__all__ = ["LaunchEvaluator", "launched_step_time"]


def launched_step_time(step_times_s: Mapping[int, list[float]], discard: int) -> float:
    """A launch's step time from its ranks' seconds per step (``LaunchResult.step_times_s``): the median,
    over the steps after the first ``discard``, of the slowest rank's seconds of each step.

    Examples
    --------
    >>> launched_step_time({0: [9.0, 1.0, 2.0, 3.0], 1: [9.0, 2.0, 1.0, 1.0]}, discard=1)
    2.0
    """
    per_step = np.max(np.array([list(t) for t in step_times_s.values()], dtype=float), axis=0)[discard:]
    if not len(per_step):
        raise PostplaceError(f"launched_step_time: no step after the first {discard} to time")
    return float(np.median(per_step))


class LaunchEvaluator:
    """Evaluates op-level placements and practitioner plans of a traced step by launching them (module
    docstring).

    Parameters
    ----------
    traced : postplace.graph.trace_torch.Traced
        The traced step; its model's current weights are where every launch starts.
    cluster : Cluster or list of str
        The placements' cluster (they are checked against its rules) or its device names.
    steps, discard : int
        Steps per launch (default 5) and how many of the first are not timed (default 2).
    backend : {"gloo", "nccl"}
        ``gloo``: every rank a CPU process; ``nccl``: rank k on its GPU (placements on GPUs only).
    timeout : float
        Seconds a rank waits for a peer (the process group's start, every message).
    threads : int, optional
        Torch CPU threads per rank (default 1).
    seed : int
        Every rank's generator seed.
    batches : callable, optional
        As :func:`postplace.runtime.launcher.launch` takes it (picklable); default: the traced batch
        every step.

    Raises
    ------
    PostplaceError
        When ``steps`` does not exceed ``discard`` >= 0, or ``backend`` is neither gloo nor nccl.
    """

    name = "launch"

    def __init__(
        self,
        traced,
        cluster,
        *,
        steps: int = 5,
        discard: int = 2,
        backend: str = "gloo",
        timeout: float = 60.0,
        threads: int | None = 1,
        seed: int = 0,
        batches: Callable | None = None,
        exclude: Sequence[str] = (),
    ):
        from postplace.runtime.launcher import BACKENDS, measured_on

        if isinstance(steps, bool) or not isinstance(steps, int) or isinstance(discard, bool):
            raise PostplaceError(f"LaunchEvaluator: steps ({steps!r}) and discard ({discard!r}) must be integers")
        if steps <= discard or discard < 0:
            raise PostplaceError(f"LaunchEvaluator: steps ({steps}) must exceed discard ({discard}) >= 0")
        if backend not in BACKENDS:
            raise PostplaceError(f"LaunchEvaluator: backend '{backend}': use {' or '.join(BACKENDS)}")
        self.traced = traced
        self.graph = traced.graph
        self.cluster = cluster if hasattr(cluster, "device_names") else None
        self.device_names = tuple(cluster.device_names if self.cluster else cluster)
        self.steps, self.discard = steps, discard
        self.backend, self.timeout, self.threads = backend, float(timeout), threads
        self.seed, self.batches = seed, batches
        self.exclude = tuple(exclude)  # the GPUs a plan may not use (place's --exclude), as the simulated plan left out
        self.measured_on = measured_on(backend)

    @classmethod
    def for_zoo(cls, name: str, size: str, cluster, *, graph=None, microbatches=None, colocation=None, **kwargs):
        """Trace zoo model ``name`` at ``size`` (its optimizer and precision as ``graph`` records them, the
        same checks as :meth:`TorchEvaluator.for_zoo <postplace.runtime.evaluator.TorchEvaluator.for_zoo>`:
        ``graph`` must be the step traced now) and launch its placements on ``cluster``; ``kwargs``: the
        constructor's."""
        from postplace.runtime.evaluator import TorchEvaluator

        traced = TorchEvaluator.for_zoo(
            name, size, cluster, device_map="cpu", graph=graph, microbatches=microbatches, colocation=colocation
        ).traced
        if isinstance(cluster, str):
            from postplace.cluster import load_cluster

            cluster = load_cluster(cluster)
        return cls(traced, cluster, **kwargs)

    @property
    def microbatches(self) -> int:
        """How many micro-batches one measured step runs (before its one update)."""
        return int(getattr(self.traced, "microbatches", 1))

    @property
    def failure_step_time(self) -> float:
        """A score above every step time a launch can measure: a rank waits at most ``timeout`` for a peer."""
        return self.timeout * self.steps

    def evaluate(self, placements: np.ndarray):
        """Launch op-level placements ``[n, num_ops]`` one after another.

        Returns
        -------
        postplace.sim.EvalResult
            Step times (module docstring); failed placements marked with their reason, never raised.
        """
        ops = np.atleast_2d(np.asarray(placements, dtype=np.int64))
        if ops.shape[1] != self.graph.num_ops:
            raise PostplaceError(
                f"LaunchEvaluator: placements have {ops.shape[1]} columns, the graph has {self.graph.num_ops} ops"
            )
        return self._each(list(ops), self._launch, self._invalid)

    def evaluate_plans(self, plans: Sequence[str]):
        """Launch practitioner plans of this step one after another, each as
        :func:`postplace.runtime.launcher.launch_plan` runs it (one process per GPU of the plan).

        Parameters
        ----------
        plans : sequence of str
            Plans as ``place`` names them (``summary.json``'s ``returned_plan``, a
            :class:`~postplace.api.result.Candidate`'s ``plan``: ``ddp:m=2,dp=2``,
            ``fsdp+recompute:m=8,dp=8``, ``ddp:pp=2,m=4,dp=1,schedule=1f1b``), each for this step's
            micro-batch count.

        Returns
        -------
        postplace.sim.EvalResult
            One row per plan, timed as :meth:`evaluate` times a placement (module docstring); a plan the
            launcher refuses, one for another micro-batch count, or one that fails: a failed row with its
            one line, never raised. Evaluated without a cluster (device names only): every plan fails
            (a plan picks its GPUs by the cluster's kinds).
        """

        def invalid(plan) -> str | None:
            if not isinstance(plan, str) or not plan:
                return f"plan {plan!r}: give a plan's name (ddp:m=M,dp=K...)"
            if self.cluster is None:
                return f"plan '{plan}': launching a plan needs the Cluster, not only its device names"
            return None

        return self._each(list(plans), self._launch_plan, invalid)

    def _each(self, todo: list, run: Callable, invalid: Callable):
        """Run ``run(x)`` for each ``x`` of ``todo`` (``invalid(x)``: a reason not to, or None); an exception
        is that row's failure (its first line), never raised."""
        from postplace.sim import EvalResult

        n, D = len(todo), len(self.device_names)
        step = np.full(n, np.inf)
        oom = np.zeros(n, dtype=bool)
        failed = np.zeros(n, dtype=bool)
        reasons: list[str | None] = [None] * n
        details: list[dict | None] = [None] * n
        all_times: list[dict] = [{} for _ in range(n)]
        for r, x in enumerate(todo):
            reason = invalid(x)
            if reason is None:
                try:
                    step[r], details[r], all_times[r] = run(x)
                    continue
                except PostplaceError as exc:
                    reason = first_line(exc, 600)
                except Exception as exc:  # noqa: BLE001 - any failure of one placement is its result
                    reason = f"{type(exc).__name__}: {first_line(exc, 600)}"
            if "out of memory" in reason.lower():
                oom[r] = True
            else:
                failed[r] = True
            reasons[r] = reason
        extra = {
            "launch": details,
            "step_times": all_times,
            "measured_on": self.measured_on,
            "backend": self.backend,
            "microbatches": self.microbatches,
        }
        return EvalResult(step, np.zeros((n, D)), oom, failed, reasons, self.name, extra=extra)

    def evaluate_ops(self, op_placements: np.ndarray):
        """:meth:`evaluate`: every placement here is op-level."""
        return self.evaluate(op_placements)

    def expand(self, placements: np.ndarray) -> np.ndarray:
        """Op-level placements as they are (no grouping)."""
        return np.atleast_2d(np.asarray(placements, dtype=np.int64))

    def _launch(self, dev: np.ndarray) -> tuple[float, dict, dict]:
        from postplace.runtime.launcher import launch

        return self._timed(launch(self.traced, dev, list(self.device_names), **self._how()))

    def _launch_plan(self, plan: str) -> tuple[float, dict, dict]:
        from postplace.runtime.launcher import launch_plan

        return self._timed(launch_plan(self.traced, plan, self.cluster, exclude=self.exclude, **self._how()))

    def _how(self) -> dict:
        """The launch's settings, for a placement and a plan alike."""
        return {
            "steps": self.steps,
            "batches": self.batches,
            "seed": self.seed,
            "timeout": self.timeout,
            "backend": self.backend,
            "threads": self.threads,
        }

    def _timed(self, result) -> tuple[float, dict, dict]:
        """A launch's step time (:func:`launched_step_time`), its ranks and each rank's median, its seconds."""
        times = {r: list(t) for r, t in result.step_times_s.items()}
        detail = {
            "ranks": {str(r): d for r, d in result.ranks.items()},
            "rank_step_s": {result.ranks[r]: float(np.median(t[self.discard :])) for r, t in times.items()},
            "steps": self.steps,
            "timed_steps": self.steps - self.discard,
        }
        return launched_step_time(times, self.discard), detail, times

    def _invalid(self, dev: np.ndarray) -> str | None:
        return invalid_placement(self.graph, self.cluster, self.device_names, dev)
