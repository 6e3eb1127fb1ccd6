"""Start placements ("homes") for the policy-based strategies: one device per unit, before any learning.

A home is what a prior puts most of a unit's probability on (:func:`postplace.search.post.anchored_prior`).
Three kinds, each a plain function of the :class:`SearchSpace`:

* :func:`home_devices` without a fill: every unit on the most preferred device it may use
  (:func:`device_preference`: least total time, then lowest index);
* :func:`home_devices` with a fill: the fewest most preferred devices that hold the step's bytes,
  filled in program order, each up to its share (m-TOPO's rule, Jeon et al. SoCC 2020), for steps that
  do not fit one device;
* :func:`partition_homes`: a METIS k-way partition of the unit graph over the k most preferred
  devices (Karypis and Kumar 1998), balancing work or bytes and cutting transferred bytes: layer-wise
  splits such as the four LSTM layers of RNNLM over four GPUs, which independent per-unit sampling
  from a one-device start rarely finds.

:func:`candidate_homes` lists them all for a space; Post evaluates them in its first batch and starts
from the best (``PostConfig.init = "probe"``).
"""

from __future__ import annotations

import numpy as np

from postplace.graph.metis import part_graph, symmetric_csr
from postplace.search.strategy import SearchSpace

__all__ = [
    "StartProbe",
    "candidate_homes",
    "start_record",
    "comparable_devices",
    "device_preference",
    "distinct",
    "home_devices",
    "partition_homes",
]

COMPARABLE = 2.0  # a device takes part in partitions when its total time is within this factor of the fastest


def device_preference(space: SearchSpace) -> np.ndarray:
    """Devices from most to least preferred: by total time of the units every device may run (all
    units' finite times if there are none), then by index, so identical GPUs stop competing for the
    same role."""
    return np.argsort(_total_times(space), kind="stable")


def home_devices(space: SearchSpace, fill_fraction: float | None = None) -> np.ndarray:
    """Each unit's home device ``int[G]``.

    Without ``fill_fraction`` (or without memory information in the space, or when the whole step fits
    the most preferred device): every unit's home is the most preferred device (:func:`device_preference`)
    that unit may use. Otherwise: the k most preferred devices, k the fewest whose capacities times
    ``fill_fraction`` hold the units' bytes, are filled in program order (``unit_position``), each up to
    its capacity's share of the bytes, m-TOPO's rule (when one of them is much slower, such as the CPU,
    the others are filled to ``fill_fraction`` of their capacity first and it takes the rest); a unit
    that may use none of them goes to the most preferred device it may use.
    """
    allowed = space.allowed
    G, D = allowed.shape
    order = device_preference(space)
    rank = np.empty(D, dtype=np.int64)
    rank[order] = np.arange(D)
    first_allowed = np.argmin(np.where(allowed, rank[None, :], D), axis=1)  # best-ranked allowed device
    home = np.asarray(first_allowed, dtype=np.int64)
    if fill_fraction is None or space.unit_bytes is None or space.capacity is None:
        return home
    need = np.asarray(space.unit_bytes, dtype=np.float64)
    cap = np.asarray(space.capacity, dtype=np.float64)
    top = order[0]
    if need[home == top].sum() <= cap[top]:
        return home
    k = 1
    while k < D:
        k += 1
        kset = order[:k]
        outside = ~allowed[:, kset].any(axis=1)
        if need[~outside].sum() <= fill_fraction * cap[kset].sum():
            break
    kset = order[:k]
    outside = ~allowed[:, kset].any(axis=1)
    demand = need[~outside].sum()
    fast = _comparable(space, kset)
    if fast.all():  # devices alike: balanced shares, by capacity
        target = demand * cap[kset] / max(cap[kset].sum(), 1e-300)
    else:  # a slow device (the CPU) takes only what the fast ones cannot hold
        target = np.where(fast, fill_fraction * cap[kset], 0.0)
        rest = max(demand - target.sum(), 0.0)
        target[~fast] = rest * cap[kset][~fast] / max(cap[kset][~fast].sum(), 1e-300)
    used = np.zeros(k)
    cur = 0
    units = np.argsort(space.unit_position, kind="stable") if space.unit_position is not None else range(G)
    for g in units:
        if outside[g]:
            continue  # keeps its best allowed device
        while cur < k - 1 and used[cur] > 0 and used[cur] + need[g] > target[cur]:
            cur += 1
        ok = np.flatnonzero(allowed[g, kset])
        j = cur if allowed[g, kset[cur]] else int(ok[np.argmin(np.abs(ok - cur))])
        home[g] = kset[j]
        used[j] += need[g]
    return home


def total_times(allowed: np.ndarray, unit_time: np.ndarray) -> np.ndarray:
    """``[D]``: each device's summed time over the units every usable device may run (all units' finite
    times if there are none); inf for a device no unit may use (excluded), which is never the fastest."""
    t = np.where(allowed, unit_time, np.inf)
    usable = allowed.any(axis=0)
    common = np.isfinite(t[:, usable]).all(axis=1)
    rows = t[common] if common.any() else np.where(np.isfinite(t), t, 0.0)
    return np.where(usable, rows.sum(axis=0), np.inf)


def _total_times(space: SearchSpace) -> np.ndarray:
    return total_times(space.allowed, space.unit_time)


def _comparable(space: SearchSpace, devices: np.ndarray) -> np.ndarray:
    """Which of ``devices`` have a total time within ``COMPARABLE`` times the fastest device's."""
    total = _total_times(space)
    return total[devices] <= COMPARABLE * total.min()


def comparable_devices(space: SearchSpace) -> list[int]:
    """The devices stripes spread micro-batches over, in index order: within ``COMPARABLE`` times the
    fastest one's total time, and of one kind, the kind most of those are (a slow CPU beside GPUs is
    not one of them, nor a CPU that comes close on a graph of tiny ops: a window of GPUs must not
    shift by one)."""
    order = np.arange(space.num_devices)
    close = order[_comparable(space, order)]
    kinds = space.device_kinds
    if len(kinds) == space.num_devices and close.size:
        names = [kinds[d] for d in close]
        kind = max(dict.fromkeys(names), key=names.count)  # the most; on a tie, the lowest index's
        close = close[[k == kind for k in names]]
    return [int(d) for d in close]


def _unit_adjacency(space: SearchSpace):
    """Symmetric CSR adjacency of the unit graph with summed bytes per pair (empty without edges)."""
    G = space.num_units
    if space.edges is None or not len(space.edges[0]):
        return np.zeros(G + 1, dtype=np.int64), np.zeros(0, dtype=np.int64), np.zeros(0)
    src, dst, nbytes = space.edges
    return symmetric_csr(src, dst, nbytes, G)


def partition_homes(space: SearchSpace, devices: np.ndarray, weight: np.ndarray, seed: int = 0) -> np.ndarray:
    """Homes from a METIS partition of the unit graph into ``len(devices)`` parts of equal ``weight``
    (per unit), cutting as few bytes as it can; part i goes on ``devices[i]``. A unit that may not use
    its part's device keeps its home from :func:`home_devices`."""
    base = home_devices(space)
    k = len(devices)
    if k < 2 or space.num_units < k:
        return base
    xadj, adjncy, summed = _unit_adjacency(space)
    w = np.asarray(weight, dtype=np.float64)
    w = np.minimum(w, w.sum() / k) + w.sum() / k / max(space.num_units, 1) * 1e-3
    parts = part_graph(k, xadj, adjncy, vweights=w, eweights=summed, scale=1e6, seed=seed)
    home = np.asarray(devices, dtype=np.int64)[parts]
    ok = space.allowed[np.arange(space.num_units), home]
    return np.where(ok, home, base)


def candidate_homes(space: SearchSpace, fill_fraction: float) -> list[tuple[str, np.ndarray]]:
    """Distinct start placements worth one evaluation each: ``[(name, home)]``.

    ``fastest`` (every unit on the most preferred device it may use), ``fill`` (the memory fill of
    :func:`home_devices`, when it differs), and for k = 2 .. the number of devices within
    ``COMPARABLE`` times the fastest one's total time: ``part<k>-work`` (METIS parts of equal work,
    the unit's least time) and ``part<k>-bytes`` (of equal bytes, with ``unit_bytes``)."""
    if space.unit_time is None:
        return []
    out = [("fastest", home_devices(space))]
    out.append(("fill", home_devices(space, fill_fraction)))
    order = device_preference(space)
    t = np.where(space.allowed, space.unit_time, np.inf)
    close = [int(d) for d, ok in zip(order, _comparable(space, order), strict=True) if ok]
    work = np.nan_to_num(np.nanmin(np.where(np.isfinite(t), t, np.nan), axis=1), nan=0.0)
    for k in range(2, len(close) + 1):
        out.append((f"part{k}-work", partition_homes(space, np.array(close[:k]), work)))
        if space.unit_bytes is not None:
            out.append((f"part{k}-bytes", partition_homes(space, np.array(close[:k]), space.unit_bytes)))
    return distinct(out)


def distinct(named: list[tuple[str, np.ndarray]]) -> list[tuple[str, np.ndarray]]:
    """``named`` without the entries whose array equals an earlier one's (the first name is kept)."""
    seen, unique = set(), []
    for name, array in named:
        if (key := array.tobytes()) not in seen:
            seen.add(key)
            unique.append((name, array))
    return unique


class StartProbe:
    """The probe of ``init="probe"``, shared by every strategy that may start from it: the candidate
    homes (:func:`candidate_homes`, or ``candidates``) are asked first, one evaluation each, then the
    best (feasible first, then least overflow, then fastest) is the start, except that the one-device
    start (``fastest``, listed first) stays unless it is infeasible or another scores below
    ``probe_margin`` times it.

    After the probe: ``name`` (the start's name), ``home`` (its unit-level placement ``int[G]``) and
    ``step_time`` (its step time in seconds; None when infeasible). Ask/tell like a strategy, so the
    strategy that owns it hands out its candidates before its own samples.
    """

    def __init__(
        self,
        space: SearchSpace,
        fill_fraction: float = 0.8,
        probe_margin: float = 0.9,
        candidates: list[tuple[str, np.ndarray]] | None = None,
    ):
        self.space = space
        self.probe_margin = probe_margin
        self.candidates = candidate_homes(space, fill_fraction) if candidates is None else list(candidates)
        self.scores: list[float] = []
        self.step_times: list[float | None] = []
        self.out = 0  # handed out by ask, not yet told
        self.name: str | None = None
        self.home: np.ndarray | None = None
        self.step_time: float | None = None
        self.last_origins: list[str] = []  # the last ask's, "probe:<name>" each

    @property
    def done(self) -> bool:
        """Every candidate told (or there were none)."""
        return len(self.scores) >= len(self.candidates)

    def ask(self, max_n: int) -> np.ndarray | None:
        """The next candidates ``[k, G]``, or None once every one has been asked."""
        done = len(self.scores)
        if done >= len(self.candidates):
            return None
        k = max(1, min(max_n, len(self.candidates) - done))
        self.out = k
        self.last_origins = [f"probe:{name}" for name, _ in self.candidates[done : done + k]]
        return np.stack([h for _, h in self.candidates[done : done + k]])

    def tell(self, placements: np.ndarray, score: np.ndarray, step_time: np.ndarray, feasible: np.ndarray) -> bool:
        """Take the results of the candidates last asked; False (nothing taken) for other placements."""
        done, out = len(self.scores), self.out
        self.out = 0
        if not out or not np.array_equal(placements, np.stack([h for _, h in self.candidates[done : done + out]])):
            return False
        self.scores.extend(float(x) for x in score)
        self.step_times.extend(float(t) if ok else None for t, ok in zip(step_time, feasible, strict=True))
        if self.done:
            self._choose()
        return True

    def _choose(self) -> None:
        score = np.array(self.scores)
        best = int(np.argmin(score))
        if self.candidates[0][0] == "fastest" and score[0] < self.space.failure_step_time:
            if score[best] >= self.probe_margin * score[0]:
                best = 0
        self.name, self.home = self.candidates[best]
        self.step_time = self.step_times[best]

    def fastest(self) -> tuple[str, float] | None:
        """The fastest feasible candidate told, ``(name, step time)`` (the first of equals); None when
        none is. The start may be another (the one-device start kept by ``probe_margin``)."""
        told = [(t, i) for i, t in enumerate(self.step_times) if t is not None]
        if not told:
            return None
        t, i = min(told)
        return self.candidates[i][0], t

    def state_dict(self) -> dict:
        """Scores and step times told so far, and the candidates out."""
        return {"scores": list(self.scores), "step_times": list(self.step_times), "out": self.out}

    def load_state_dict(self, state: dict) -> None:
        """Restore :meth:`state_dict`; the start is chosen again from the scores."""
        self.scores = [float(x) for x in state["scores"]]
        self.step_times = [None if t is None else float(t) for t in state.get("step_times", [None] * len(self.scores))]
        self.out = int(state["out"])
        if self.candidates and self.done:
            self._choose()


def start_record(strategy) -> dict:
    """Where a strategy's search started, as run folders and ``compare.json`` record it:
    ``{"name", "step_time_s"}``, and ``"anchor_name"`` beside them when it differs.

    With a probe (a :class:`StartProbe` in ``strategy.probe``, all told): the fastest feasible candidate
    (:meth:`StartProbe.fastest`) and its step time, and the start the policy is anchored on
    (``strategy.start_name``, e.g. the one-device start kept by ``probe_margin``) as ``anchor_name`` when
    that is another. Else the strategy's ``start_name`` and ``start_step_time`` (None where it has
    none): a start's learning gain is always measured from the best the probe saw.
    """
    name, step = getattr(strategy, "start_name", None), getattr(strategy, "start_step_time", None)
    out = {"name": None if name is None else str(name), "step_time_s": None if step is None else float(step)}
    probe = getattr(strategy, "probe", None)
    best = probe.fastest() if isinstance(probe, StartProbe) and probe.done else None
    if best is not None:
        out = {"name": best[0], "step_time_s": float(best[1])}
        if name is not None and name != best[0]:
            out["anchor_name"] = str(name)
    return out
