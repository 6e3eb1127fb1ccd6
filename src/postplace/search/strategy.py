"""The ask/tell contract every search strategy follows (as Optuna separates samplers from trials).

A strategy proposes placements (``ask``) and learns from their results (``tell``). It never calls an
evaluator, never reads files and never looks at the clock: the runner drives it. It owns a seeded
``numpy.random.Generator`` and can save and restore its whole state, so a run resumes exactly.

Placements are int arrays ``[k, G]`` over the G placement units (groups) of a :class:`SearchSpace`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

import numpy as np

from postplace.errors import PostplaceError

if TYPE_CHECKING:
    from postplace.search.layers import LayerSpace


@dataclass(frozen=True, eq=False)
class SearchSpace:
    """What a strategy may know about the problem: units, devices, and what is allowed where.

    :func:`postplace.search.make_problem` builds one (``problem.space``); a strategy is made over it.
    The memory fields (all optional) serve strategies that start from a memory-aware prior.

    Parameters
    ----------
    allowed : numpy.ndarray
        ``bool[G, D]``: unit g may go on device d (kinds, pins and exclusions already applied; every
        row has at least one True).
    failure_step_time : float
        The score an OOM or failed placement gets, proven above every feasible step time.
    unit_time : numpy.ndarray, optional
        ``float[G, D]``: summed op time of unit g on device d (inf where not allowed), for strategies
        that start from device-aware priors.
    device_names, device_kinds : tuple of str
        Per device, its name and kind.
    features : numpy.ndarray, optional
        Per-unit feature rows (op-type counts, sizes) for learned placers such as the hierarchical planner.
    edges : tuple of numpy.ndarray, optional
        ``(src unit, dst unit, bytes)`` arrays of the unit graph.
    unit_bytes : numpy.ndarray, optional
        ``[G]``: the bytes unit g adds to the device it runs on (persistent bytes plus its share of the
        activations live at the peak, estimated by :func:`postplace.search.problem.make_problem`).
    capacity : numpy.ndarray, optional
        ``[D]``: device d's usable memory.
    unit_position : numpy.ndarray, optional
        ``[G]``: where unit g sits in program order (0 = first, 1 = last; the position of its first
        op), so a prior can fill devices in program order.
    layers : postplace.search.layers.LayerSpace, optional
        On a micro-batched step: the units' layers and the stripes a layer may take, so a strategy
        can place a layer's micro-batches with one decision (:mod:`postplace.search.layers`).
    extra : dict
        Anything else a strategy may use.

    Examples
    --------
    >>> import numpy as np
    >>> from postplace.search import SearchSpace
    >>> space = SearchSpace(np.array([[True, False], [True, True]]), failure_step_time=1.0)
    >>> space.num_units, space.num_devices, space.overflow_scale
    (2, 2, 1000000000.0)
    """

    allowed: np.ndarray
    failure_step_time: float
    unit_time: np.ndarray | None = None
    device_names: tuple[str, ...] = ()
    device_kinds: tuple[str, ...] = ()
    features: np.ndarray | None = None
    edges: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None
    unit_bytes: np.ndarray | None = None
    capacity: np.ndarray | None = None
    unit_position: np.ndarray | None = None
    layers: LayerSpace | None = None
    extra: dict = field(default_factory=dict)

    @property
    def num_units(self) -> int:
        """G, the number of placement units (groups)."""
        return self.allowed.shape[0]

    @property
    def num_devices(self) -> int:
        """D, the number of devices."""
        return self.allowed.shape[1]

    @property
    def overflow_scale(self) -> float:
        """Bytes that double an infeasible sample's score in :func:`scores` (half the way to a failed
        one): the total capacity when known, else 1 GB."""
        return float(np.sum(self.capacity)) if self.capacity is not None else 1e9


class Wrapper:
    """A strategy around another, ``inner``: its ``name`` and every attribute it does not define itself
    (``config``, ``policy``, ``start_name``...) are the inner strategy's."""

    inner: object

    @property
    def name(self) -> str:
        return self.inner.name

    @name.setter
    def name(self, value: str) -> None:
        self.inner.name = value

    def __getattr__(self, key: str):
        if key.startswith("__") or key == "inner":  # copy and pickle look for hooks before __dict__ is filled
            raise AttributeError(key)
        return getattr(self.inner, key)


class Strategy(Protocol):
    """The ask/tell contract of a search strategy: propose placements, learn from their results.

    ``ask(max_n)`` returns between 1 and ``max_n`` placements, as many as the strategy wants next
    (so results never depend on how an evaluator batches); ``tell`` gets exactly those placements back
    with their results, in the same order. :func:`postplace.search.make_strategy` makes one by name,
    and :func:`postplace.search.run` drives it.

    Attributes
    ----------
    name : str
        The strategy's name, recorded in run folders.
    last_origins : list of str, optional
        Set by ``ask``: where each placement it returned came from (:data:`ORIGINS`; a probe start as
        ``"probe:<name>"``). A strategy without it draws every placement from its policy
        (:func:`asked_origins`).
    """

    name: str

    def ask(self, max_n: int) -> np.ndarray:
        """The placements the strategy wants evaluated next.

        Parameters
        ----------
        max_n : int
            At most this many (>= 1).

        Returns
        -------
        numpy.ndarray
            ``int[k, G]`` with ``1 <= k <= max_n``: a device id per unit.
        """
        ...

    def tell(
        self, placements: np.ndarray, step_time: np.ndarray, feasible: np.ndarray, overflow: np.ndarray | None = None
    ) -> None:
        """Learn from the results of the placements the last :meth:`ask` returned, in the same order.

        Parameters
        ----------
        placements : numpy.ndarray
            ``int[k, G]``, as asked.
        step_time : numpy.ndarray
            ``float[k]``: each one's step time.
        feasible : numpy.ndarray
            ``bool[k]``: neither OOM nor failed.
        overflow : numpy.ndarray, optional
            ``float[k]``: how far each sample overflows memory, the bytes above capacity summed over
            devices (0 for a sample that fits, inf for one that failed for another reason). The runner
            computes it from the evaluator's peak memory and the cluster's capacity; a strategy that
            gets None knows only feasible or not.
        """
        ...

    def state_dict(self) -> dict:
        """The strategy's whole state (its random generator included), for a run to resume exactly.

        Returns
        -------
        dict
        """
        ...

    def load_state_dict(self, state: dict) -> None:
        """Restore a state :meth:`state_dict` returned.

        Parameters
        ----------
        state : dict
        """
        ...


ORIGINS = ("probe", "policy", "local", "warm", "candidate")
"""Where a sample came from, as ``history.jsonl`` records it: a probe start (``"probe:<name>"``, e.g.
``probe:fastest``), a sample of the strategy's policy (or of its own rule: annealing's proposals, random
search's draws), a local move of the incumbent (:mod:`postplace.search.local`), the warm start the runner
evaluates first, or a candidate of ``place`` (a one-shot placer or a plan; never in the search's own
history, counted in ``summary.json`` when it beats the search)."""


def asked_origins(strategy, n: int) -> list[str]:
    """The origin of each of the ``n`` placements ``strategy``'s last ask returned: its ``last_origins``
    when it set them for that many, else ``"policy"`` for each."""
    got = getattr(strategy, "last_origins", None)
    return [str(o) for o in got] if got is not None and len(got) == n else ["policy"] * n


def scores(
    step_time: np.ndarray,
    feasible: np.ndarray,
    failure_step_time: float,
    overflow: np.ndarray | None = None,
    overflow_scale: float = 1e9,
) -> np.ndarray:
    """Step times with every infeasible (OOM or failed) sample replaced by a failing score.

    Without ``overflow`` every infeasible sample scores ``failure_step_time`` (proven above every
    feasible step time). With it, an infeasible sample scores
    ``failure_step_time * (1 + x / (x + overflow_scale))`` where ``x`` is its overflow in bytes: still
    above every feasible one, and among themselves ordered by how far they overflow, so a strategy
    learns to move towards placements that fit. A failed sample (``x`` = inf) scores twice the
    failing time, the worst there is.

    Parameters
    ----------
    step_time : numpy.ndarray
        ``float[k]``: the samples' step times.
    feasible : numpy.ndarray
        ``bool[k]``.
    failure_step_time : float
        The space's :attr:`SearchSpace.failure_step_time`.
    overflow : numpy.ndarray, optional
        ``float[k]``: bytes above capacity summed over devices (inf for a failed sample).
    overflow_scale : float
        The overflow in bytes that scores ``1.5 * failure_step_time``, halfway to a failed sample's
        score (:attr:`SearchSpace.overflow_scale`).

    Returns
    -------
    numpy.ndarray
        ``float[k]``: lower is better.

    Examples
    --------
    >>> from postplace.search import scores
    >>> scores([1.0, 2.0, 3.0, 4.0], [True, False, False, False], 10.0, [0.0, 0.0, 1e9, float("inf")]).tolist()
    [1.0, 10.0, 15.0, 20.0]
    """
    feasible = np.asarray(feasible, dtype=bool)
    fail = np.full(np.shape(feasible), float(failure_step_time))
    if overflow is not None:
        x = np.asarray(overflow, dtype=np.float64)
        with np.errstate(invalid="ignore"):
            rel = np.where(np.isfinite(x), np.maximum(x, 0.0) / (np.maximum(x, 0.0) + overflow_scale), 1.0)
        fail = fail * (1.0 + np.nan_to_num(rel, nan=1.0))
    return np.where(feasible, step_time, fail)


def overflow_bytes(peak_mem: np.ndarray, capacity: np.ndarray, failed: np.ndarray | None = None) -> np.ndarray:
    """Per sample: bytes above capacity summed over devices (``peak_mem[n, D]`` against ``capacity[D]``);
    inf where the evaluation ``failed``."""
    peak = np.atleast_2d(np.asarray(peak_mem, dtype=np.float64))
    over = np.maximum(peak - np.asarray(capacity, dtype=np.float64)[None, :], 0.0).sum(axis=1)
    if failed is not None:
        over = np.where(np.asarray(failed, dtype=bool), np.inf, over)
    return over


def rng_state(rng: np.random.Generator) -> dict:
    return rng.bit_generator.state


def rng_from_state(state: dict) -> np.random.Generator:
    rng = np.random.default_rng()
    rng.bit_generator.state = state
    return rng


def check_allowed(placements: np.ndarray, allowed: np.ndarray | None, who: str) -> None:
    """Every placement of ``placements`` (``[k, units]``) puts each unit on a device ``allowed[unit, d]``
    permits (None: any); else one error line naming ``who``, the unit and the device."""
    if allowed is None:
        return
    G, D = allowed.shape
    if placements.ndim != 2 or placements.shape[1] != G:
        raise PostplaceError(f"{who} gave placements of shape {placements.shape}; the search has {G} units")
    bad = (placements < 0) | (placements >= D)
    if not bad.any():
        bad = ~allowed[np.arange(G)[None, :], placements]
    if bad.any():
        r, g = (int(x[0]) for x in np.nonzero(bad))
        raise PostplaceError(
            f"{who} put unit {g} on device id {int(placements[r, g])}, which it may not use "
            "(its kinds, --pin and --exclude)"
        )
