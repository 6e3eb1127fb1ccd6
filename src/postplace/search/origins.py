"""Where a search's bests came from: new bests per origin after the probe, and the gap each closed.

Every sample of a run has an origin (:data:`postplace.search.strategy.ORIGINS`, recorded in
``history.jsonl``). A claim that a strategy *learns* is read off which origins improved the best,
never off the final time alone (DESIGN.md section 4): :func:`origin_stats` counts, per origin, the
samples after the probe that beat every earlier one (a *new best*), and the share of the gap from the
start to the lower bound each closed. ``summary.json`` (``search_origins``) and ``compare.json`` (per
seed, ``origins``) record it.
"""

from __future__ import annotations

import math

from postplace.search.strategy import ORIGINS

__all__ = ["history_origin_stats", "new_bests", "origin_stats", "with_candidate"]

COUNTED = tuple(o for o in ORIGINS if o != "probe")
"""The origins whose new bests are counted after the probe (each present in every record, 0 or more)."""


def origin_stats(origins: list[str], step_times: list[float], lower_bound: float | None) -> dict:
    """New bests per origin after the probe, and the share of the gap each closed.

    The *start* is the probe's fastest feasible candidate (the samples whose origin is ``probe:<name>``).
    Every other sample, in order, that is feasible and faster than the start and every earlier such sample
    is a new best of its origin (``probe:...`` samples never count); its gain over the best before it,
    over the gap from the start to the lower bound, is the share it closed. Without a feasible probe
    sample (a strategy without a probe, or a probe of which nothing fits) the gains are measured from the
    run's first feasible sample (``gap_from_step_time_s``), which is not itself counted.

    Parameters
    ----------
    origins : list of str
        Per sample, in order (``SearchResult.origins``, or ``history.jsonl``'s ``origin``).
    step_times : list of float
        Per sample, inf where it was OOM or failed.
    lower_bound : float or None
        The simulator's lower bound on the step time.

    Returns
    -------
    dict
        ``start_name`` and ``start_step_time_s`` (the probe's fastest feasible candidate; None without
        one), ``gap_from_step_time_s`` (what the shares are measured from), ``final_step_time_s`` (the
        fastest feasible sample; None without one), ``lower_bound_s``, ``new_bests`` (per origin of
        :data:`COUNTED`, and any other origin that produced one, such as ``unknown``) and
        ``gap_closed`` (the same keys; None where the gap is not positive). The counts add up to the
        new bests after the probe, and the shares to ``(gap_from - final) / (gap_from - lower bound)``.

    Examples
    --------
    >>> s = origin_stats(["probe:fastest", "probe:fill", "policy", "local", "local", "policy"],
    ...                  [4.0, 5.0, 4.5, 3.0, 3.5, 2.0], 1.0)
    >>> s["start_name"], s["start_step_time_s"], s["final_step_time_s"]
    ('fastest', 4.0, 2.0)
    >>> s["new_bests"]["local"], s["new_bests"]["policy"], s["gap_closed"]["local"], s["gap_closed"]["policy"]
    (1, 1, 0.3333333333333333, 0.3333333333333333)
    """
    times = [float(t) if t is not None and math.isfinite(t) else math.inf for t in step_times]
    kinds = [str(o).split(":", 1)[0] for o in origins]
    probe = [i for i, k in enumerate(kinds) if k == "probe" and math.isfinite(times[i])]
    start = min(probe, key=lambda i: times[i]) if probe else None
    first = next((i for i, t in enumerate(times) if math.isfinite(t) and kinds[i] != "probe"), None)
    ref = start if start is not None else first
    new_bests = dict.fromkeys(COUNTED, 0)
    gains = dict.fromkeys(COUNTED, 0.0)
    best = times[ref] if ref is not None else math.inf
    for i, (kind, t) in enumerate(zip(kinds, times, strict=True)):
        if kind == "probe" or (start is None and (ref is None or i <= ref)) or not t < best:
            continue
        new_bests[kind] = new_bests.get(kind, 0) + 1
        gains[kind] = gains.get(kind, 0.0) + (best - t)
        best = t
    gap = None if ref is None or lower_bound is None else times[ref] - lower_bound
    feasible = [t for t in times if math.isfinite(t)]
    return {
        "start_name": origins[start].split(":", 1)[1] if start is not None else None,
        "start_step_time_s": times[start] if start is not None else None,
        "gap_from_step_time_s": times[ref] if ref is not None else None,
        "final_step_time_s": min(feasible) if feasible else None,
        "lower_bound_s": lower_bound,
        "new_bests": new_bests,
        "gap_closed": {k: (g / gap if gap is not None and gap > 0 else None) for k, g in gains.items()},
    }


def new_bests(origins: list[str], step_times: list[float]) -> dict[str, int]:
    """How many samples of each origin beat every earlier one (:func:`origin_stats`; with no probe the first
    feasible sample, a warm start, counts none), the origins with any."""
    return {k: n for k, n in origin_stats(origins, step_times, None)["new_bests"].items() if n}


def history_origin_stats(rows: list[dict], lower_bound: float | None) -> dict:
    """:func:`origin_stats` of a run folder's history (:func:`postplace.search.runner.read_history`'s
    rows; a line without an origin, from before they were recorded, counts as ``unknown``)."""
    origins = [r["origin"] if isinstance(r.get("origin"), str) else "unknown" for r in rows]
    times = [math.inf if r.get("oom") or r.get("failed") else float(r["step_time_s"]) for r in rows]
    return origin_stats(origins, times, lower_bound)


def with_candidate(stats: dict, returned: str, step_time: float | None) -> dict:
    """``stats`` (:func:`origin_stats` of a ``place`` run's search) with a ``candidate`` new best when
    the answer ``returned`` is a candidate (a placer, a plan: a name that is not ``search...``) faster
    than the search's best, and the share of the gap it closed; ``step_time`` None (a measured answer,
    not comparable with simulated times) leaves ``stats`` as they are."""
    final, start, lb = stats["final_step_time_s"], stats["gap_from_step_time_s"], stats["lower_bound_s"]
    if step_time is None or returned.startswith("search") or (final is not None and step_time >= final):
        return stats
    stats["new_bests"]["candidate"] = 1
    ok = final is not None and start is not None and lb is not None and start > lb
    stats["gap_closed"]["candidate"] = (final - step_time) / (start - lb) if ok else None
    return stats
