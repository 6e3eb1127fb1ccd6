"""The learning curves: the best feasible step time so far against samples (median and min-max band
over the seeds) and against wall time (one line per seed, each sample's time from the run's
``timing.jsonl`` where it covers every sample), kept at most :data:`MAX_POINTS` points each.
"""

from __future__ import annotations

import numpy as np

MAX_POINTS = 600
"""Points kept per curve and per memory line in report.json (the plots need no more)."""


def _grid(n: int) -> np.ndarray:
    """Sample counts (1-based) to keep: every one up to MAX_POINTS, else a geometric-ish spread."""
    if n <= MAX_POINTS:
        return np.arange(1, n + 1)
    return np.unique(np.round(np.linspace(1, n, MAX_POINTS)).astype(int))


NO_FEASIBLE = "no feasible sample: every placement the search tried was OOM or failed"


def _finite(x) -> float | None:
    return float(x) if x is not None and np.isfinite(x) else None


def curve_info(strategy: str, runs: list[dict]) -> dict:
    """One strategy's learning curves. ``runs``: ``{seed, history, wall_time_s, timing}`` per seed.

    Against samples: median, min and max over the seeds that reached each sample count. Against wall
    time: each seed's curve; a sample's time is its batch's line in the run's ``timing.jsonl`` when
    those lines cover every sample, else the run's wall time spread evenly over its samples (a folder
    written before timing was recorded; ``wall_source`` says which).
    """
    from postplace.search.history import best_so_far, sample_times

    per_seed = []
    curves = []
    recorded = True
    for r in runs:
        h = r["history"]
        best = best_so_far(h)
        curves.append(best)
        n = len(best)
        wall = sample_times(r.get("timing") or [], n)
        if wall is None:
            recorded = False
            w = r.get("wall_time_s")
            wall = (np.arange(1, n + 1) * (w / n)) if (n and isinstance(w, int | float)) else np.full(n, np.nan)
        g = _grid(n) if n else np.array([], dtype=int)
        per_seed.append(
            {
                "seed": r["seed"],
                "samples": n,
                "final_best_s": _finite(best[-1]) if n else None,
                "x_samples": g.tolist(),
                "best_s": [_finite(best[k - 1]) for k in g],
                "wall_s": [_finite(wall[k - 1]) for k in g],
            }
        )
    n_max = max((len(c) for c in curves), default=0)
    g = _grid(n_max) if n_max else np.array([], dtype=int)
    med, lo, hi, count = [], [], [], []
    for k in g:
        vals = np.array([c[k - 1] for c in curves if len(c) >= k])
        vals = vals[np.isfinite(vals)]
        count.append(int(vals.size))
        med.append(float(np.median(vals)) if vals.size else None)
        lo.append(float(vals.min()) if vals.size else None)
        hi.append(float(vals.max()) if vals.size else None)
    return {
        "strategy": strategy,
        "seeds": [r["seed"] for r in runs],
        "x_samples": g.tolist(),
        "median_s": med,
        "min_s": lo,
        "max_s": hi,
        "seeds_with_feasible": count,
        "per_seed": per_seed,
        "wall_source": "recorded per sample" if recorded and runs else "estimated: run wall time x sample / samples",
        "note": "" if any(v is not None for v in med) else NO_FEASIBLE,  # a curve the figures cannot draw
    }
