"""A search's checkpoint (``checkpoint.json`` + npz, :mod:`postplace.search.state_io`): what the runner
saves (the strategy's state, the runner's, the cache, the best-so-far curve), and every check a resume
makes of it before it trusts a byte (each failure one line that says to start a new run).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from postplace.errors import PostplaceError
from postplace.search.history import HISTORY, INT64_MAX, history_digest
from postplace.search.state_io import load_state, save_state
from postplace.search.strategy import check_allowed

CHECKPOINT = "checkpoint.json"

NOT_IN_RUNNER = ("cache", "curve", "origins", "step_times")  # saved apart (the cache, the curve) or not at all


def checked_state(cls, path: Path, snap, allowed: np.ndarray | None):
    """A ``cls`` (the runner's state) from a checkpoint's data, or one error line naming what does not hold."""

    def bad(what: str) -> PostplaceError:
        return PostplaceError(f"{path}: {what} (edited or damaged); start a new run")

    if not isinstance(snap, dict) or not isinstance(snap.get("runner"), dict):
        raise bad("not a search checkpoint (no runner state)")
    runner = snap["runner"]

    def count(key: str, hi: int = INT64_MAX) -> int:
        v = runner.get(key, 0)
        if type(v) is not int or not 0 <= v <= hi:
            raise bad(f"runner '{key}' is {str(v)[:40]}, not an integer in [0, {hi}]")
        return v

    def real(key: str, *, finite: bool, hi: float = np.inf) -> float:
        v = runner.get(key, 0.0)
        ok = isinstance(v, int | float) and not isinstance(v, bool) and not np.isnan(v) and v >= 0
        if not ok or (finite and not np.isfinite(v)) or (np.isfinite(hi) and v > hi):
            raise bad(
                f"runner '{key}' is {str(v)[:40]}, not a {'finite ' if finite else ''}number >= 0"
                + (f" and <= {hi:g}" if np.isfinite(hi) else "")
            )
        return float(v)

    samples = count("samples")
    state = cls(
        samples=samples,
        feasible=count("feasible", samples),
        evaluations=count("evaluations", samples),
        checkpointed=count("checkpointed", samples),
        history_bytes=count("history_bytes"),
        best_step_time=real("best_step_time", finite=False),
        elapsed=real("elapsed", finite=True, hi=1e9),
        last_batch_mean=real("last_batch_mean", finite=False),
    )
    best_sample = runner.get("best_sample", -1)
    if type(best_sample) is not int or not -1 <= best_sample < max(samples, 1):
        raise bad(f"runner 'best_sample' is {str(best_sample)[:40]}, not a sample of the run")
    state.best_sample = best_sample
    # the cache: one row per placement evaluated
    arrays = {k: snap.get(k) for k in ("cache_keys", "cache_step", "cache_oom", "cache_failed", "cache_overflow")}
    if not all(isinstance(a, np.ndarray) for a in arrays.values()):
        raise bad("its cache is not arrays")
    keys = arrays["cache_keys"]
    n = len(keys) if keys.ndim else -1
    kinds = {"cache_keys": "u", "cache_step": "f", "cache_oom": "b", "cache_failed": "b", "cache_overflow": "f"}
    for k, a in arrays.items():
        if a.dtype.kind != kinds[k] or a.shape[:1] != (n,) or a.ndim != (2 if k == "cache_keys" else 1):
            raise bad(f"its {k} has shape {a.shape} and type {a.dtype}; the cache has {max(n, 0)} rows")
    reasons = snap.get("cache_reasons")
    if not isinstance(reasons, list) or len(reasons) != n or not all(r is None or isinstance(r, str) for r in reasons):
        raise bad("its cache_reasons are not one text (or null) per cached placement")
    if n != state.evaluations:
        raise bad(f"its cache holds {n} placements where the runner evaluated {state.evaluations}")
    step, oom, failed = arrays["cache_step"], arrays["cache_oom"], arrays["cache_failed"]
    over = arrays["cache_overflow"]
    if np.isnan(step).any() or (step < 0).any() or np.isnan(over).any() or (over < 0).any():
        raise bad("its cached step times or overflows are negative or NaN")
    ok = ~(oom | failed)
    if not np.isfinite(step[ok]).all():
        raise bad("a feasible cached placement has an infinite step time")
    width = keys.shape[1]
    if width % 8:
        raise bad(f"its cached placements are {width} bytes, not whole int64 device ids")
    placements = np.ascontiguousarray(keys).view(np.int64).reshape(n, width // 8)
    # a checkpoint saved before the first sample (Ctrl-C or an error in the first batch) has an empty cache
    # whose keys have no width: there is no placement to check, and indexing ``allowed`` with a (0, 0)
    # array cannot broadcast
    if allowed is not None and n:
        G, D = allowed.shape
        if placements.shape[1] != G:
            units = placements.shape[1]
            raise PostplaceError(
                f"{path}: its cached placements have {units} units; the search has {G} (edited or "
                "damaged, or written by a postplace that grouped this step otherwise: micro-batched "
                "steps are grouped by layer since 2026-12); start a new run"
            )
        if ((placements < 0) | (placements >= D)).any() or not allowed[np.arange(G)[None, :], placements].all():
            raise bad("a cached placement puts a unit on a device it may not use (its kinds, --pin, --exclude)")
    state.cache = {
        k.tobytes(): (float(t), bool(o), bool(f), r, float(x))
        for k, t, o, f, r, x in zip(keys, step, oom, failed, reasons, over, strict=True)
    }
    # the best so far: the fastest feasible placement of the cache
    best = runner.get("best_placement")
    fastest = float(step[ok].min()) if ok.any() else float("inf")
    if best is None:
        if ok.any() or np.isfinite(state.best_step_time):
            raise bad("its runner has no best placement while the cache holds a feasible one")
    else:
        try:
            best = np.asarray(best)
        except (ValueError, TypeError):
            raise bad("its best placement is not an array of device ids") from None
        if best.dtype.kind not in "iu" or best.ndim != 1 or best.shape[0] != placements.shape[1]:
            raise bad(f"its best placement has shape {best.shape} and type {best.dtype}, not one device id per unit")
        best = best.astype(np.int64)
        entry = state.cache.get(best.tobytes())
        if entry is None or entry[1] or entry[2] or entry[0] != state.best_step_time or entry[0] != fastest:
            raise bad("its best placement and step time are not the fastest feasible placement of its cache")
        state.best_placement = best
    curve = snap.get("curve")
    # never rising, compared pairwise: np.diff warned on the inf - inf of the samples before a feasible one
    if (
        not isinstance(curve, np.ndarray)
        or curve.dtype.kind != "f"
        or curve.shape != (samples,)
        or np.isnan(curve).any()
        or (curve[1:] > curve[:-1]).any()
    ):
        raise bad(f"its curve is not {samples} best-so-far step times")
    if samples and curve[-1] != state.best_step_time:
        raise bad("its curve does not end at its best step time")
    state.curve = [float(x) for x in curve]
    if state.feasible > samples or (state.feasible and best is None):
        raise bad("its feasible sample count disagrees with its cache")
    meta = snap.get("meta", {})
    if not isinstance(meta, dict):
        raise bad("its meta is not an object")
    digest = snap.get("history_digest")
    if digest is not None and not isinstance(digest, str):
        raise bad("its history digest is not text")
    return state


def load_strategy(path: Path, strategy, saved, allowed: np.ndarray | None) -> None:
    """Restore the strategy's state: its structure must be the one this strategy (with this run's
    config, on this search space) writes, and a copy of the restored strategy must ask for valid
    placements; else one error line."""
    import copy

    def bad(what: str) -> PostplaceError:
        return PostplaceError(f"{path}: {what}; resume it with the settings that wrote it, or start a new run")

    fresh = strategy.state_dict()
    why = _unlike(fresh, saved, "strategy")
    if not why and isinstance(fresh, dict) and "name" in fresh and saved.get("name") != fresh["name"]:
        why = f"it is the state of strategy '{str(saved.get('name'))[:30]}', not '{fresh['name']}'"
    if not why and allowed is not None:
        why = _bad_arrays(saved, "strategy", allowed)
    if why:
        raise bad(f"the strategy state does not fit this run ({why})")
    try:
        strategy.load_state_dict(saved)
        space = getattr(strategy, "space", None)
        probe = copy.deepcopy(strategy, {} if space is None else {id(space): space})
        placements = np.atleast_2d(np.asarray(probe.ask(1), dtype=np.int64))
        check_allowed(placements, allowed, "the restored strategy")
    except PostplaceError as exc:
        raise bad(f"the restored strategy does not work ({exc})") from None
    except (
        KeyError,
        TypeError,
        ValueError,
        IndexError,
        AttributeError,
        OverflowError,
        ZeroDivisionError,
        FloatingPointError,
        RuntimeError,
    ) as exc:
        raise bad(f"a checkpoint of another kind of run ({type(exc).__name__}: {str(exc)[:120]})") from None


def _unlike(fresh, saved, where: str) -> str:
    """Why ``saved`` does not have the structure of ``fresh`` (a strategy's state now): '' when it does.
    Dicts need the same keys (a saved one may lack some), arrays the same dtype kind and shape (and
    finite values where the fresh ones are), scalars the same type; the config must be equal (a field
    it lacks, from before the field existed, counts as the run's: a field added later keeps the old
    behaviour at its default); lists are compared item by item when both have the same length."""
    if isinstance(fresh, dict):
        if not isinstance(saved, dict):
            return f"{where} is not an object"
        extra = set(saved) - set(fresh)
        if fresh and extra:  # an empty dict now (an optimizer's state before its first step) is open
            return f"{where} has unknown fields {sorted(map(str, extra))[:3]}"
        if where == "strategy.config" and _plain({**fresh, **saved}) != _plain(fresh):
            return "its config differs from the run's"
        return next((w for k in saved if k in fresh and (w := _unlike(fresh[k], saved[k], f"{where}.{k}"))), "")
    if isinstance(fresh, np.ndarray):
        if (
            not isinstance(saved, np.ndarray)
            or saved.dtype.kind != fresh.dtype.kind
            or (fresh.ndim and saved.shape != fresh.shape)
        ):
            return f"{where} is not a {fresh.dtype} array of shape {fresh.shape}"
        if fresh.dtype.kind == "f" and np.isfinite(fresh).all() and not np.isfinite(saved).all():
            return f"{where} holds NaN or infinite values"
        return ""
    if isinstance(fresh, list | tuple):
        if not isinstance(saved, list | tuple):
            return f"{where} is not a list"
        if len(fresh) == len(saved):
            return next(
                (w for k, (a, b) in enumerate(zip(fresh, saved, strict=True)) if (w := _unlike(a, b, f"{where}.{k}"))),
                "",
            )
        return ""
    if fresh is None:
        return ""
    if isinstance(fresh, bool) or isinstance(fresh, str):
        return "" if type(saved) is type(fresh) else f"{where} is {str(saved)[:30]!r}, not a {type(fresh).__name__}"
    if isinstance(fresh, int):
        ok = type(saved) is int and (saved >= 0 or fresh < 0)
        return "" if ok else f"{where} is {str(saved)[:30]!r}, not a count"
    if isinstance(fresh, float):
        ok = isinstance(saved, int | float) and not isinstance(saved, bool) and not np.isnan(saved)
        return "" if ok else f"{where} is {str(saved)[:30]!r}, not a number"
    return ""


def _bad_arrays(saved, where: str, allowed: np.ndarray) -> str:
    """Why the arrays of a strategy's saved state cannot be its own: '' when they can. Arrays hold
    numbers (no text, no NaN); an integer array of one row per placement over the search's units holds
    device ids each unit may use; parallel lists (a list of lists of arrays, as the batches a strategy
    keeps: placements, scores, feasibility) agree on every batch's length."""
    G, D = allowed.shape
    if isinstance(saved, np.ndarray):
        if saved.dtype.kind not in "biuf":
            return f"{where} holds {saved.dtype} values, not numbers"
        if saved.dtype.kind == "f" and np.isnan(saved).any():
            return f"{where} holds NaN"
        if saved.dtype.kind in "iu" and saved.ndim == 2 and saved.shape[1] == G and saved.size:
            if ((saved < 0) | (saved >= D)).any() or not allowed[np.arange(G)[None, :], saved].all():
                return f"{where} puts a unit on a device it may not use"
        return ""
    if isinstance(saved, dict):
        return next((w for k, v in saved.items() if (w := _bad_arrays(v, f"{where}.{k}", allowed))), "")
    if isinstance(saved, list | tuple):
        why = next((w for k, v in enumerate(saved) if (w := _bad_arrays(v, f"{where}.{k}", allowed))), "")
        if why:
            return why
        rows = [x for x in saved if isinstance(x, list | tuple) and x and all(isinstance(a, np.ndarray) for a in x)]
        if len(rows) >= 2 and len(rows) == len(saved) and len({len(x) for x in rows}) == 1:
            for k in range(len(rows[0])):
                if len({a.shape[0] if a.ndim else -1 for a in (x[k] for x in rows)}) != 1:
                    return f"{where}: the lists' item {k} differ in length"
        return ""
    return ""


def _plain(x):
    if isinstance(x, dict):
        return {k: _plain(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [_plain(v) for v in x]
    return x


def save_checkpoint(out: Path, snapshot: dict, history, meta: dict | None) -> None:
    """Write the checkpoint (the runner's ``snapshot``, the history's digest, ``meta``) atomically."""
    if history:
        history.flush()
    curve, n_curve = snapshot["curve"]
    cache, n_cache = snapshot["cache"]
    entries = list(cache.items())[:n_cache]
    width = len(entries[0][0]) if entries else 0
    keys = np.frombuffer(b"".join(k for k, _ in entries), dtype=np.uint8).reshape(len(entries), width)
    on_disk = {
        "strategy": snapshot["strategy"],
        "runner": snapshot["runner"],
        "curve": np.asarray(curve[:n_curve], dtype=np.float64),
        "cache_keys": keys,
        "cache_step": np.array([v[0] for _, v in entries], dtype=np.float64),
        "cache_oom": np.array([v[1] for _, v in entries], dtype=bool),
        "cache_failed": np.array([v[2] for _, v in entries], dtype=bool),
        "cache_reasons": [v[3] for _, v in entries],
        "cache_overflow": np.array([v[4] for _, v in entries], dtype=np.float64),
        "meta": meta or {},
        "history_digest": history_digest(out / HISTORY, int(snapshot["runner"]["history_bytes"])),
    }
    save_state(out / CHECKPOINT, on_disk)


def checkpoint_samples(out: str | Path) -> int:
    """How many samples the checkpoint in run folder ``out`` covers."""
    path = Path(out) / CHECKPOINT
    snap = load_state(path)
    runner = snap.get("runner") if isinstance(snap, dict) else None
    n = runner.get("samples") if isinstance(runner, dict) else None
    if type(n) is not int or n < 0:
        raise PostplaceError(f"{path}: no sample count (edited or damaged); start a new run")
    return n


def read_meta(out: str | Path) -> dict:
    """The ``meta`` dict a run folder's checkpoint was saved with."""
    path = Path(out) / CHECKPOINT
    snap = load_state(path)
    meta = snap.get("meta", {}) if isinstance(snap, dict) else None
    if not isinstance(meta, dict):
        raise PostplaceError(
            f"{path}: not a search checkpoint (its meta is not an object; edited or damaged); start a new run"
        )
    return meta
