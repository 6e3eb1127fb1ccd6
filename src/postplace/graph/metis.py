"""One front end to METIS (pymetis) for its three users: the grouping (:mod:`postplace.graph.grouping`),
the METIS placer (:mod:`postplace.placers.metis`) and the search's partition starts
(:mod:`postplace.search.starts`).

What it guarantees, whatever floats it is given:

* :func:`symmetric_csr`: the undirected CSR adjacency METIS wants (both directions stored, self loops
  dropped, parallel edges summed);
* :func:`int_weights`: integer weights >= 1, the largest at about ``scale``, their total within the
  integer range METIS sums them in (32-bit ``idx_t`` builds included). Zero, negative and NaN weights
  become the least weight (1), +inf the largest finite one; never NaN (a NaN cast to int64 is -2**63:
  METIS crashed the process on such weights);
* :func:`target_weights`: target part weights that are finite, > 0 and sum to 1 (METIS refuses a
  part weight of 0: "Incorrect tpwgts", e.g. when every op takes no time on some devices);
* :func:`part_graph`: calls pymetis with the API of the installed version (``CSRAdjacency`` since
  2025.2, ``xadj``/``adjncy`` before), silences METIS's own prints, and returns the part of each
  vertex as int64.
"""

from __future__ import annotations

import contextlib
import os
import sys

import numpy as np
import pymetis

__all__ = ["int_weights", "part_graph", "quiet_fds", "symmetric_csr", "target_weights", "weight_total_cap"]

MIN_TARGET = 1e-6  # the least target part weight: METIS's real_t may be float32, and 0 is refused


def weight_total_cap() -> int:
    """The most the weights of one kind may sum to: METIS adds them up (and cut weights) in ``idx_t``;
    2**30 where that is 32 bits (or unknown), 2**50 where it is 64 (room left for its sums)."""
    try:
        from pymetis._internal import _idx_type_width

        width = int(_idx_type_width())
    except (ImportError, AttributeError):  # older pymetis: assume the narrow build
        width = 32
    return 2**50 if width == 64 else 2**30


def int_weights(w, scale: float) -> np.ndarray:
    """Positive int64 weights proportional to ``w`` (see the module docstring)."""
    w = np.array(w, dtype=np.float64, copy=True).reshape(-1)
    if not w.size:
        return np.zeros(0, dtype=np.int64)
    w[np.isnan(w) | (w < 0)] = 0.0
    finite = np.isfinite(w)
    top = float(w[finite].max()) if finite.any() else 0.0
    if not finite.all():  # +inf: the heaviest there is
        top = top if top > 0 else 1.0
        w[~finite] = top
    if top <= 0:
        return np.ones(w.size, dtype=np.int64)
    rel = w / top  # in [0, 1]; no overflow however large the weights
    cap = weight_total_cap()
    factor = min(float(scale), max((cap - w.size) / max(float(rel.sum()), 1.0), 1.0))
    return np.maximum(np.rint(rel * factor), 1).astype(np.int64)


def target_weights(x) -> np.ndarray:
    """Target part weights proportional to ``x`` (e.g. device speeds): finite, each at least
    ``MIN_TARGET``, summing to 1. Non-finite or non-positive entries: +inf counts as the largest
    finite entry, the rest as 0 (then raised to the least); all zero: equal parts."""
    x = np.array(x, dtype=np.float64, copy=True).reshape(-1)
    if not x.size:
        return x
    x[np.isnan(x) | (x < 0)] = 0.0
    finite = np.isfinite(x)
    top = float(x[finite].max()) if finite.any() else 0.0
    if not finite.all():
        x[~finite] = top if top > 0 else 1.0
    top = float(x.max())
    if top <= 0:
        return np.full(x.size, 1.0 / x.size)
    total = float(x.sum())
    t = x / total if np.isfinite(total) else (x / top) / float((x / top).sum())
    if t.min() >= MIN_TARGET:
        return t
    t = np.maximum(t, MIN_TARGET)
    return t / t.sum()


def symmetric_csr(src, dst, weight, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(xadj, adjncy, summed)``: the undirected adjacency of ``n`` vertices from directed edges
    ``src -> dst`` with ``weight`` each; self loops dropped, the weights of parallel edges (either
    direction) summed. Where a sum would pass float range, every sum is divided by the largest weight
    instead (the proportions METIS sees stay the same)."""
    src = np.asarray(src, dtype=np.int64).reshape(-1)
    dst = np.asarray(dst, dtype=np.int64).reshape(-1)
    weight = np.asarray(weight, dtype=np.float64).reshape(-1)
    keep = src != dst
    a = np.concatenate([src[keep], dst[keep]])
    b = np.concatenate([dst[keep], src[keep]])
    w = np.concatenate([weight[keep], weight[keep]])
    uniq, inv = np.unique(a * n + b, return_inverse=True)
    with np.errstate(over="ignore"):
        summed = np.bincount(inv, weights=w, minlength=len(uniq))
    top = float(w.max()) if w.size else 0.0
    if not np.isfinite(summed).all() and np.isfinite(top) and top > 0:  # past float range: sum w / top
        summed = np.bincount(inv, weights=w / top, minlength=len(uniq))
    a, b = uniq // n, uniq % n
    xadj = np.concatenate([[0], np.cumsum(np.bincount(a, minlength=n))]).astype(np.int64)
    return xadj, b.astype(np.int64), summed


@contextlib.contextmanager
def quiet_fds():
    """Silence the C stdout/stderr for the duration (METIS prints its complaints straight there)."""
    saved = [os.dup(1), os.dup(2)]
    null = os.open(os.devnull, os.O_WRONLY)
    try:
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(null, 1)
        os.dup2(null, 2)
        yield
    finally:
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        for fd in (*saved, null):
            os.close(fd)


def part_graph(
    nparts: int,
    xadj: np.ndarray,
    adjncy: np.ndarray,
    *,
    vweights=None,
    eweights=None,
    tpwgts=None,
    scale: float = 1e6,
    recursive: bool | None = None,
    seed: int = 0,
) -> np.ndarray:
    """The part (0..nparts-1) of each vertex of the CSR graph, as int64.

    ``vweights`` / ``eweights``: float weights per vertex / per ``adjncy`` entry, made integers with
    :func:`int_weights` (largest about ``scale``); ``tpwgts``: target part weights, made valid with
    :func:`target_weights`; ``recursive``: recursive bisection (pymetis's default when None).
    """
    n = len(xadj) - 1
    if nparts < 2 or n <= 0:
        return np.zeros(max(n, 0), dtype=np.int64)
    xadj = [int(v) for v in np.asarray(xadj, dtype=np.int64)]
    adjncy = [int(v) for v in np.asarray(adjncy, dtype=np.int64)]
    kw: dict = {"options": pymetis.Options(seed=int(seed))}
    if vweights is not None:
        kw["vweights"] = int_weights(vweights, scale).tolist()
    if eweights is not None and len(adjncy):
        kw["eweights"] = int_weights(eweights, scale).tolist()
    if tpwgts is not None:
        kw["tpwgts"] = target_weights(tpwgts).tolist()
    if recursive is not None:
        kw["recursive"] = bool(recursive)
    with quiet_fds():
        if hasattr(pymetis, "CSRAdjacency"):  # pymetis >= 2025.2
            res = pymetis.part_graph(int(nparts), adjacency=pymetis.CSRAdjacency(xadj, adjncy), **kw)
        else:
            res = pymetis.part_graph(int(nparts), xadj=xadj, adjncy=adjncy, **kw)
    parts = res.vertex_part if hasattr(res, "vertex_part") else res[1]
    return np.asarray(parts, dtype=np.int64)
