"""RayEvaluator: any Evaluator, run by a pool of Ray actors, with the in-process evaluator's answers.

Each actor builds its own evaluator once, from a picklable factory (:mod:`postplace.distributed.factories`),
and keeps it (a compiled simulator, a traced model) for every batch. A batch of ``n`` placements is
cut into contiguous chunks, at most ``chunks_per_actor`` per live actor; an idle actor takes the next
chunk; the chunks' results are put back together in the order of the placements. Since every
evaluator evaluates each placement on its own (the simulator is deterministic, TorchEvaluator gives
each placement fresh parameters), the strategy sees what the in-process evaluator would have given.

Fault tolerance. An actor that dies while it holds a chunk (its process killed, a node lost) is
dropped; its chunk goes back to the head of the queue and is given to the next idle actor, and a fresh
actor replaces the dead one (at most ``max_replacements`` over the evaluator's life, default twice the
pool). A chunk is tried at most ``1 + max_retries`` times. Only a chunk that came back is stored, and
each chunk is stored once, so no placement is lost or counted twice. When no actor is left, or a chunk
has used its tries, :class:`EvaluatorLost` (a :class:`~postplace.errors.PostplaceError`) is raised.
Under :func:`postplace.search.run` that error leaves the run folder at its last checkpoint (the
runner writes the state of the last completed batch on the way out, whatever stopped it), and
``--resume`` continues from there, with Ray or without it.

An exception raised by the wrapped evaluator itself (not an actor's death) is its answer, as it would be
in process: it propagates unchanged.

Ray is optional (``pip install 'postplace[ray]'``); without it, constructing a RayEvaluator is one
clear error saying how to install it. On a cluster of several machines every node must be able to
import postplace (install it there, or start Ray with a ``runtime_env``); a local cluster's workers
inherit this process's environment.
"""

from __future__ import annotations

import os
import time
from collections import deque

import numpy as np

from postplace.errors import PostplaceError
from postplace.sim.simulate import EvalResult

__all__ = ["EvaluatorLost", "RayEvaluator", "init_ray", "require_ray"]

INSTALL_HINT = "Ray is not installed; install it with: pip install 'postplace[ray]' (or pip install ray)"


class EvaluatorLost(PostplaceError):
    """Every Ray actor died (or one batch kept killing them): the run stops at its last checkpoint."""


def require_ray():
    """The ``ray`` module, or one clear error saying how to install it.

    Returns
    -------
    module
        ``ray``, imported.

    Raises
    ------
    PostplaceError
        When Ray is not installed (the line says how to install it).
    """
    try:
        import ray
    except ImportError:
        raise PostplaceError(INSTALL_HINT) from None
    return ray


def init_ray(address: str | None = "local", *, num_cpus: int | None = None, num_gpus: int | None = None) -> bool:
    """Start or join Ray unless it is running already; True when this call started it.

    Parameters
    ----------
    address : str or None
        ``"local"`` (or None) starts a one-machine cluster with ``num_cpus`` and no dashboard; anything
        else is the address of a running cluster (``ray start --head`` prints it; ``"auto"`` finds one
        on this machine).
    num_cpus : int, optional
        CPUs of a local cluster (default: the cores this process may use).
    num_gpus : int, optional
        GPUs of a local cluster (default: Ray's detection).

    Returns
    -------
    bool
        True when this call started (or joined) Ray, False when it was running already.

    Raises
    ------
    PostplaceError
        When Ray is not installed, the address is malformed or nothing answers there, or Ray fails to
        start or join.
    """
    ray = require_ray()
    if ray.is_initialized():
        return False
    if address not in (None, "local", "auto"):
        check_address(address)
    try:
        if address in (None, "local"):
            os.environ.setdefault(WORKER_NICENESS, "0")  # read by the raylet this starts
            ray.init(num_cpus=num_cpus or _cores(), num_gpus=num_gpus, include_dashboard=False)
        else:
            ray.init(address=address)
    except (ConnectionError, RuntimeError, ValueError) as exc:
        where = "a local Ray cluster" if address in (None, "local") else f"the Ray cluster at '{address}'"
        raise PostplaceError(f"--ray: could not start or join {where}: {_first_line(exc)}") from None
    return True


WORKER_NICENESS = "RAY_worker_niceness"
"""Ray starts its workers at nice 15 (so that they never starve its own daemons). Here the workers are
the search's evaluations, the whole work of the run: on a machine busy with other jobs, nice 15 ran
them up to 14 times slower (the distributed tests beside two busy processes on 2 cores). A local
cluster started by :func:`init_ray` runs them at the user's priority, unless the variable is set."""

CONNECT_TIMEOUT_S = 3.0
"""How long :func:`check_address` waits for a Ray cluster's port to answer: joining an address nothing
listens at would otherwise retry for minutes."""


def parse_address(address) -> tuple[str, int]:
    """``(host, port)`` of a Ray address (``HOST:PORT``, ``ray://HOST:PORT``, ``[IPv6]:PORT``), or one
    error line saying what a valid one looks like."""
    hint = "give 'local', 'auto' or a running cluster's HOST:PORT (ray start --head prints it)"
    if not isinstance(address, str) or not address.strip():
        raise PostplaceError(f"--ray {address!r}: empty address; {hint}")
    text = address.strip()
    for scheme in ("ray://", "http://", "https://"):
        if text.startswith(scheme):
            text = text[len(scheme) :]
            break
    host, sep, port = text.rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if (
        not sep
        or not host
        or not port.isdigit()
        or not 0 < int(port) < 65536
        or any(c.isspace() for c in host)
        or (":" in host and not address.strip().split("//")[-1].startswith("["))
    ):
        raise PostplaceError(f"--ray '{address}': not an address of the form HOST:PORT (port 1-65535); {hint}")
    return host, int(port)


def check_address(address, timeout: float = CONNECT_TIMEOUT_S) -> None:
    """One error line, in seconds, when nothing accepts connections at the Ray address ``address``."""
    import socket

    host, port = parse_address(address)
    try:
        with socket.create_connection((host, port), timeout=timeout):
            pass
    except OSError as exc:
        why = "timed out" if isinstance(exc, TimeoutError | socket.timeout) else (exc.strerror or str(exc))
        raise PostplaceError(
            f"--ray '{address}': no Ray cluster answers at {host}:{port} ({why}); start one with "
            "ray start --head, or use --ray local"
        ) from None


class _Worker:
    """The actor: one evaluator, built once."""

    def __init__(self, factory):
        self.evaluator = factory()

    def describe(self) -> dict:
        ev = self.evaluator
        return {
            "name": ev.name,
            "failure_step_time": getattr(ev, "failure_step_time", None),
            "cluster": getattr(ev, "cluster", None),  # the runner reads its capacity to rank OOM samples
            "pid": os.getpid(),
        }

    def evaluate(self, placements: np.ndarray) -> EvalResult:
        return self.evaluator.evaluate(placements)


class RayEvaluator:
    """An Evaluator whose placements are evaluated by Ray actors (see the module docstring).

    Use it as a context manager, or call :meth:`shutdown`, to free the actors.

    Parameters
    ----------
    factory : callable
        Zero-argument picklable callable building the evaluator in each actor
        (:class:`~postplace.distributed.SimulatorFactory`, :class:`~postplace.distributed.TorchZooFactory`).
    actors : int, optional
        Pool size (default: as many as the cluster's CPUs, or GPUs when each actor needs one).
    address : str or None
        ``"local"`` or a cluster address, used when Ray is not running yet (:func:`init_ray`).
    num_cpus : float
        CPUs each actor reserves (default 1).
    num_gpus : float, optional
        GPUs each actor reserves (default: the factory's ``num_gpus``, else 0).
    max_retries : int
        Further tries of a chunk whose actor died.
    max_replacements : int, optional
        Fresh actors started in place of dead ones, over the evaluator's life (default: twice the pool).
    chunks_per_actor : int
        Chunks per live actor per batch (more: finer balance, more overhead).

    Raises
    ------
    PostplaceError
        When Ray is not installed or cannot start, ``actors`` is below 1, or the Ray cluster has too
        few CPUs or GPUs for the pool. :class:`EvaluatorLost` (from :meth:`evaluate`) when every actor died.
    """

    def __init__(
        self,
        factory,
        *,
        actors: int | None = None,
        address: str | None = "local",
        num_cpus: float = 1.0,
        num_gpus: float | None = None,
        max_retries: int = 3,
        max_replacements: int | None = None,
        chunks_per_actor: int = 1,
    ):
        ray = require_ray()
        self._ray = ray
        self._started = init_ray(address)
        self.factory = factory
        self.num_cpus = float(num_cpus)
        self.num_gpus = float(num_gpus if num_gpus is not None else getattr(factory, "num_gpus", 0.0))
        have = ray.cluster_resources()
        if actors is None:
            if self.num_gpus > 0:
                actors = int(have.get("GPU", 0) // self.num_gpus)
            else:
                actors = int(have.get("CPU", 1) // max(self.num_cpus, 1e-9))
            actors = max(actors, 1)
        if actors < 1:
            raise PostplaceError(f"RayEvaluator: actors must be at least 1, got {actors}")
        for res, each in (("CPU", self.num_cpus), ("GPU", self.num_gpus)):
            if each > 0 and have.get(res, 0) + 1e-9 < each * actors:
                raise PostplaceError(
                    f"RayEvaluator: {actors} actors x {each:g} {res} need {each * actors:g} {res}s, the Ray cluster "
                    f"has {have.get(res, 0):g}; ask for fewer actors or join a larger cluster"
                )
        self.max_retries = int(max_retries)
        self.max_replacements = 2 * actors if max_replacements is None else int(max_replacements)
        self.chunks_per_actor = max(int(chunks_per_actor), 1)
        self._remote = ray.remote(_Worker).options(num_cpus=self.num_cpus, num_gpus=self.num_gpus, max_restarts=0)
        self.stats = {"batches": 0, "chunks": 0, "retried_chunks": 0, "actors_lost": 0, "actors_replaced": 0}
        self._actors = [self._remote.remote(factory) for _ in range(actors)]
        infos = self._describe(self._actors)
        self.name = infos[0]["name"]
        self.failure_step_time = infos[0]["failure_step_time"]
        self.cluster = infos[0]["cluster"]
        self.pids = [i["pid"] for i in infos]

    # ------------------------------------------------------------------------------ actors
    def _describe(self, actors) -> list[dict]:
        ray = self._ray
        try:
            return ray.get([a.describe.remote() for a in actors])
        except ray.exceptions.RayActorError as exc:
            self.shutdown()
            raise PostplaceError(f"a Ray actor could not build its evaluator: {_cause_line(exc)}") from None

    @property
    def num_actors(self) -> int:
        """Actors in the pool now."""
        return len(self._actors)

    def _lose(self, actor) -> None:
        self._actors = [a for a in self._actors if a is not actor]
        self.stats["actors_lost"] += 1
        try:
            self._ray.kill(actor, no_restart=True)
        except Exception:  # noqa: BLE001 - it is already gone
            pass

    def _replace(self):
        if self.stats["actors_replaced"] >= self.max_replacements:
            return None
        self.stats["actors_replaced"] += 1
        actor = self._remote.remote(self.factory)
        self._actors.append(actor)
        return actor

    def kill_actor(self, k: int = 0, timeout: float = 120.0) -> None:
        """Kill actor ``k``'s process now (for tests and drills): the next batch finds it dead.

        ``ray.kill`` only asks for the kill; on a loaded machine a call sent just after it was still
        answered by the actor. This waits (up to ``timeout`` seconds) until a call to it fails."""
        actor = self._actors[k]
        self._ray.kill(actor, no_restart=True)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                self._ray.get(actor.describe.remote(), timeout=max(deadline - time.monotonic(), 0.1))
            except self._ray.exceptions.RayActorError:
                return
            except self._ray.exceptions.GetTimeoutError:
                break
            time.sleep(0.05)
        raise PostplaceError(f"actor {k} still answers {timeout:g} s after it was killed")

    # ------------------------------------------------------------------------------ evaluation
    def evaluate(self, placements: np.ndarray) -> EvalResult:
        """Evaluate ``placements`` on the actors; the result is in the placements' order.

        Parameters
        ----------
        placements : numpy.ndarray
            ``int[units]`` or ``int[n, units]``, as the factory's evaluator takes them.

        Returns
        -------
        EvalResult

        Raises
        ------
        EvaluatorLost
            When every actor is gone, or one chunk's actors died more than ``max_retries`` times.
        """
        ray = self._ray
        placements = np.ascontiguousarray(np.atleast_2d(np.asarray(placements, dtype=np.int64)))
        n = len(placements)
        k = max(1, min(n, self.chunks_per_actor * max(len(self._actors), 1)))
        cuts = np.linspace(0, n, k + 1).round().astype(int)
        pending = deque(range(k))
        tries = [0] * k
        results: list[EvalResult | None] = [None] * k
        idle = list(self._actors)
        inflight: dict = {}
        last_death = "no actor was left"
        self.stats["batches"] += 1
        while pending or inflight:
            while pending and idle:
                c = pending.popleft()
                actor = idle.pop(0)
                tries[c] += 1
                inflight[actor.evaluate.remote(placements[cuts[c] : cuts[c + 1]])] = (c, actor)
            if not inflight:
                raise EvaluatorLost(
                    f"all Ray actors are gone ({self.stats['actors_lost']} lost, {self.stats['actors_replaced']} "
                    f"replaced, the limit); last: {last_death}. The run keeps its last checkpoint: resume it "
                    "with --resume DIR"
                )
            (ref,), _ = ray.wait(list(inflight), num_returns=1)
            c, actor = inflight.pop(ref)
            try:
                results[c] = ray.get(ref)
            except ray.exceptions.RayActorError as exc:
                last_death = _cause_line(exc)
                self._lose(actor)
                idle = [a for a in idle if a is not actor]
                if tries[c] > self.max_retries:
                    raise EvaluatorLost(
                        f"placements {cuts[c]}..{cuts[c + 1] - 1} of the batch were tried {tries[c]} times and every "
                        f"Ray actor running them died (last: {last_death}). The run keeps its last checkpoint: "
                        "resume it with --resume DIR"
                    ) from None
                self.stats["retried_chunks"] += 1
                pending.appendleft(c)
                fresh = self._replace()
                if fresh is not None:
                    idle.append(fresh)
                continue
            idle.append(actor)
        self.stats["chunks"] += k
        return merge_results(results, n)

    # ------------------------------------------------------------------------------ lifetime
    def shutdown(self) -> None:
        """Kill the actors; stop Ray too if this evaluator started it."""
        for a in self._actors:
            try:
                self._ray.kill(a, no_restart=True)
            except Exception:  # noqa: BLE001
                pass
        self._actors = []
        if self._started and self._ray.is_initialized():
            self._ray.shutdown()
            self._started = False

    def __enter__(self) -> RayEvaluator:
        return self

    def __exit__(self, *exc) -> None:
        self.shutdown()


def merge_results(parts: list[EvalResult], n: int) -> EvalResult:
    """One EvalResult from consecutive parts: arrays concatenated, in order.

    In ``extra``, a list with one entry per row is concatenated; anything else is taken from the
    first part.

    Parameters
    ----------
    parts : list of EvalResult
        The results of consecutive chunks of one batch.
    n : int
        The batch's number of placements.

    Returns
    -------
    EvalResult

    Raises
    ------
    AssertionError
        When a part is missing or the parts do not hold ``n`` rows.

    Examples
    --------
    >>> import numpy as np
    >>> from postplace.distributed import merge_results
    >>> from postplace.sim import EvalResult
    >>> def part(t):
    ...     k = len(t)
    ...     return EvalResult(np.array(t), np.zeros((k, 2)), np.zeros(k, bool), np.zeros(k, bool), [None] * k, "x")
    >>> merge_results([part([1.0, 2.0]), part([3.0])], 3).step_time.tolist()
    [1.0, 2.0, 3.0]
    """
    assert all(p is not None for p in parts)
    rows = [len(p.step_time) for p in parts]
    if sum(rows) != n:
        raise AssertionError(f"gathered {sum(rows)} results for {n} placements")

    def cat(attr):
        vals = [getattr(p, attr) for p in parts]
        return None if any(v is None for v in vals) else np.concatenate(vals)

    extra = {}
    for key, first in parts[0].extra.items():
        vals = [p.extra.get(key) for p in parts]
        if all(isinstance(v, list) and len(v) == r for v, r in zip(vals, rows, strict=True)):
            extra[key] = [x for v in vals for x in v]
        else:
            extra[key] = first
    return EvalResult(
        step_time=np.concatenate([p.step_time for p in parts]),
        peak_mem=np.concatenate([p.peak_mem for p in parts]),
        oom=np.concatenate([p.oom for p in parts]),
        failed=np.concatenate([p.failed for p in parts]),
        reasons=[r for p in parts for r in p.reasons],
        evaluator=parts[0].evaluator,
        busy=cat("busy"),
        bytes_moved=cat("bytes_moved"),
        extra=extra,
    )


def _cores() -> int:
    """The cores this process may run on (its affinity), else all of the machine's."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return (text.splitlines()[0] if text else type(exc).__name__)[:300]


def _cause_line(exc: BaseException) -> str:
    """The first useful line of a Ray actor error (its creation error's message when there is one)."""
    cause = getattr(exc, "cause", None) or getattr(exc, "creation_task_error", None)
    if cause is not None and cause is not exc:
        inner = getattr(cause, "cause", None) or cause
        return f"{type(inner).__name__}: {_first_line(inner)}"
    return _first_line(exc)
