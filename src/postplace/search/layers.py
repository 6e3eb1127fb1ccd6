"""Parallel plans as a few decisions: each layer of a micro-batched step picks a *stripe*.

On a step traced as m micro-batches, the units of :func:`postplace.graph.grouping.layer_groups` are
(layer, slot) pairs: slot j < m holds micro-batch j's part of the layer, slot m its shared ops
(parameters, gradient sums, update). A strategy that places layers picks one *action* per layer; an
action is a stripe ``S[a] = (d_0, ..., d_{m-1})``, micro-batch j's device, and the layer's units go

* slot j (micro-batch j) -> ``S[a][j]``;
* slot m (the shared ops) -> ``S[a][c_l]``, where the layers' owner columns ``c_l`` are dealt out in
  program order, each to the column holding the fewest shared bytes so far: the owners of the
  parameters spread over the stripe's devices, so every device sums and updates a share of them (a
  sharded parameter server, moving what data parallelism moves in a ring all-reduce).

The stripes (:func:`stripe_table`), in this order, duplicates dropped (the first kept):

* ``r = 1`` on every device d: the whole layer on d, a pipeline stage (``S = (d, ..., d)``);
* ``r > 1``: aligned windows of the devices that are *comparable* (of the fastest device's kind, total
  time within :data:`postplace.search.starts.COMPARABLE` of it; index order, which follows the links: an
  NVLink node is a run of indices): windows of r = 2, 4, 8... devices starting at multiples of r, and
  the window of all of them; micro-batch j on window device ``j mod r``. r = all is data parallelism
  for that layer; smaller windows give pipelines of data-parallel stages, and a layer on r = 1 beside
  layers on r > 1 gives hybrids (one GPU for a large classifier);
* on a window of devices of unequal speed, also a stripe by speed: the m micro-batches dealt out in
  proportion to each device's speed (smooth weighted round robin: each next micro-batch to the
  device furthest below its share), so a fast GPU takes more than a slow one, a plan data
  parallelism cannot express.

Two stripes that put a layer's units alike (a layer of shared ops only uses one column) are one
action for that layer, the first (``allowed``): a uniform policy must not favour a device because
several stripes agree on it.

At m = 1 every stripe is one device and the duplicates go: the actions are the devices in order,
``S[a] = (a,)``, so a policy over actions is exactly the per-device policy.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from postplace.search.starts import candidate_homes, distinct, home_devices, total_times
from postplace.search.strategy import SearchSpace

__all__ = ["LayerSpace", "action_space", "device_space", "layer_candidates", "layer_space", "stripe_table"]


@dataclass(frozen=True, eq=False)
class LayerSpace:
    """Layers, their stripes, and the map between layer actions and unit placements (module docstring).

    Parameters
    ----------
    unit_layer : numpy.ndarray
        ``int[G]``: each unit's layer.
    unit_column : numpy.ndarray
        ``int[G]``: the stripe entry a unit follows: its micro-batch, or its layer's owner column for
        shared ops.
    stripes : numpy.ndarray
        ``int[A, m]``: micro-batch j's device under action a.
    names : tuple of str
        Per action, a short description (``gpu2``, ``gpu0..gpu3``, ``gpu0..gpu7 by speed``).
    allowed : numpy.ndarray
        ``bool[L, A]``: every unit of layer l may go where action a sends it.
    action_time : numpy.ndarray
        ``float[L, A]``: the layer's compute time under action a on its busiest device (inf where not
        allowed), for priors.
    canonical : numpy.ndarray
        ``int[L, A]``: the allowed action that places layer l's units as action a does (a itself, or
        the first stripe that agrees with it on the layer's columns), -1 where a sends a unit where it
        may not go. So "every layer on stripe a" is ``canonical[:, a]`` wherever that is not -1.
    """

    unit_layer: np.ndarray
    unit_column: np.ndarray
    stripes: np.ndarray
    names: tuple[str, ...]
    allowed: np.ndarray
    action_time: np.ndarray
    canonical: np.ndarray

    @property
    def num_layers(self) -> int:
        """L, the number of layers."""
        return self.allowed.shape[0]

    @property
    def num_actions(self) -> int:
        """A, the number of stripes."""
        return self.stripes.shape[0]

    def expand(self, actions: np.ndarray) -> np.ndarray:
        """Unit placements ``[k, G]`` from layer actions ``[k, L]`` (or ``[G]`` from ``[L]``)."""
        a = np.asarray(actions)
        return self.stripes[a[..., self.unit_layer], self.unit_column]

    def collapse(self, placements: np.ndarray) -> np.ndarray:
        """The allowed layer actions ``[k, L]`` nearest unit placements ``[k, G]``: per layer, the action
        that agrees with the most of its units (ties: the first)."""
        p = np.atleast_2d(np.asarray(placements))
        k = p.shape[0]
        L, A = self.allowed.shape
        cell = (np.arange(k)[:, None] * L + self.unit_layer[None, :]).ravel()  # (sample, layer) of each unit
        agree = np.zeros((k, L, A))
        for a in range(A):
            hit = self.stripes[a, self.unit_column][None, :] == p
            agree[:, :, a] = np.bincount(cell, weights=hit.ravel(), minlength=k * L).reshape(k, L)
        agree = np.where(self.allowed[None], agree, -1.0)
        out = np.argmax(agree, axis=2)
        return out if np.ndim(placements) == 2 else out[0]


def _windows(comparable: list[int]) -> list[list[int]]:
    n = len(comparable)
    sizes = [r for r in (2**i for i in range(1, 8)) if r < n] + ([n] if n >= 2 else [])
    return [comparable[s : s + r] for r in sizes for s in range(0, n - r + 1, r)]


def _by_speed(window: list[int], speed: np.ndarray, m: int) -> np.ndarray:
    """Micro-batch j's device, dealt out in proportion to speed: each next micro-batch to the device
    furthest below its share (smooth weighted round robin)."""
    w = speed[window] / speed[window].sum()
    given = np.zeros(len(window))
    out = np.empty(m, dtype=np.int64)
    for j in range(m):
        i = int(np.argmax(w * (j + 1) - given))
        given[i] += 1
        out[j] = window[i]
    return out


def stripe_table(
    num_devices: int, comparable: list[int], speed: np.ndarray, m: int, device_names: tuple[str, ...] = ()
) -> tuple[np.ndarray, tuple[str, ...]]:
    """The stripes ``int[A, m]`` and their names (module docstring).

    ``comparable``: the devices windows are made of, in index order; ``speed``: ``[D]``, relative.

    >>> s, names = stripe_table(3, [1, 2], np.array([0.1, 1.0, 1.0]), 2, ("cpu", "gpu0", "gpu1"))
    >>> s.tolist(), names
    ([[0, 0], [1, 1], [2, 2], [1, 2]], ('cpu', 'gpu0', 'gpu1', 'gpu0..gpu1'))
    >>> stripe_table(3, [1, 2], np.ones(3), 1)[0].tolist()
    [[0], [1], [2]]
    """
    names = device_names or tuple(f"d{d}" for d in range(num_devices))
    rows = [(np.full(m, d, dtype=np.int64), names[d]) for d in range(num_devices)]
    for w in _windows(sorted(comparable)):
        label = f"{names[w[0]]}..{names[w[-1]]}"
        rows.append((np.array([w[j % len(w)] for j in range(m)], dtype=np.int64), label))
        s = speed[w]
        if s.max() > 1.05 * s.min():
            rows.append((_by_speed(w, speed, m), f"{label} by speed"))
    labels, stripes = zip(*distinct([(label, row) for row, label in rows]), strict=True)
    return np.stack(stripes), tuple(labels)


def owner_columns(unit_layer: np.ndarray, unit_slot: np.ndarray, m: int, unit_bytes: np.ndarray | None) -> np.ndarray:
    """``int[L]``: each layer's owner column. The layers that have shared ops are dealt, in layer
    order, to the column with the fewest shared bytes so far, then the fewest layers (without bytes:
    round robin); a layer without shared ops keeps column 0 (it has nothing to own)."""
    L = int(unit_layer.max()) + 1 if unit_layer.size else 0
    has = np.bincount(unit_layer, weights=unit_slot == m, minlength=L) > 0
    weight = np.zeros(unit_layer.size) if unit_bytes is None else np.where(unit_slot == m, unit_bytes, 0.0)
    shared = np.bincount(unit_layer, weights=weight, minlength=L)
    load, count = np.zeros(m), np.zeros(m)
    out = np.zeros(L, dtype=np.int64)
    for layer in np.flatnonzero(has):
        c = int(np.lexsort((count, load))[0])
        out[layer] = c
        load[c] += shared[layer]
        count[c] += 1
    return out


def layer_space(
    unit_layer: np.ndarray,
    unit_slot: np.ndarray,
    m: int,
    allowed: np.ndarray,
    unit_time: np.ndarray,
    comparable: list[int],
    device_names: tuple[str, ...] = (),
    unit_bytes: np.ndarray | None = None,
) -> LayerSpace:
    """The :class:`LayerSpace` of units ``(unit_layer, unit_slot)`` with their ``allowed`` ``[G, D]``
    devices, ``unit_time`` ``[G, D]`` and ``unit_bytes`` ``[G]`` (for the owner columns); windows over
    ``comparable`` devices."""
    G, D = allowed.shape
    L = int(unit_layer.max()) + 1 if G else 0
    speed = 1.0 / np.maximum(total_times(allowed, unit_time), 1e-300)
    stripes, names = stripe_table(D, comparable, speed / speed.max(), m, device_names)
    column = np.where(unit_slot < m, unit_slot, owner_columns(unit_layer, unit_slot, m, unit_bytes)[unit_layer])
    A = len(stripes)
    ok = np.ones((L, A), dtype=bool)
    time = np.zeros((L, A))
    for a in range(A):
        dev = stripes[a, column]
        bad = ~allowed[np.arange(G), dev]
        ok[:, a] = np.bincount(unit_layer, weights=bad, minlength=L) == 0
        t = np.where(bad, 0.0, unit_time[np.arange(G), dev])
        per = np.bincount(unit_layer * D + dev, weights=t, minlength=L * D).reshape(L, D)
        time[:, a] = per.max(axis=1)
    canonical = np.full((L, A), -1, dtype=np.int64)
    for layer in range(L):  # stripes that place this layer's units alike are one action (the first)
        cols = np.unique(column[unit_layer == layer])
        _, first, inverse = np.unique(stripes[:, cols], axis=0, return_index=True, return_inverse=True)
        canonical[layer] = np.where(ok[layer], first[inverse.ravel()], -1)
        ok[layer] &= np.isin(np.arange(A), first)
    empty = np.flatnonzero(~ok.any(axis=1))
    if empty.size:
        raise ValueError(f"layer {empty[0]}: no stripe puts all its units on devices they may use")
    return LayerSpace(
        unit_layer.astype(np.int64), column.astype(np.int64), stripes, names, ok, np.where(ok, time, np.inf), canonical
    )


def device_space(space: SearchSpace) -> SearchSpace:
    """The space of the layers as units and the devices as devices: layer l on device d means action
    d (the r = 1 stripes come first), with the layer's summed times and bytes, its edges and its
    first position; the starts of :mod:`postplace.search.starts` run on it unchanged."""
    lay = space.layers
    L, D = lay.num_layers, space.num_devices
    u = lay.unit_layer
    edges = None
    if space.edges is not None:
        src, dst, nbytes = space.edges
        cross = u[src] != u[dst]
        edges = (u[src][cross], u[dst][cross], np.asarray(nbytes)[cross])
    position = None
    if space.unit_position is not None:
        position = np.full(L, np.inf)
        np.minimum.at(position, u, space.unit_position)
    return SearchSpace(
        allowed=lay.allowed[:, :D].copy(),
        failure_step_time=space.failure_step_time,
        unit_time=np.where(lay.allowed[:, :D], lay.action_time[:, :D], np.inf),
        device_names=space.device_names,
        device_kinds=space.device_kinds,
        edges=edges,
        unit_bytes=None if space.unit_bytes is None else np.bincount(u, weights=space.unit_bytes, minlength=L),
        capacity=space.capacity,
        unit_position=position,
    )


def action_space(space: SearchSpace) -> SearchSpace:
    """The space of the layers as units and the actions as "devices" (allowed ``[L, A]``, times the
    busiest device's), over which a policy on layers is a product of categoricals."""
    lay = space.layers
    return SearchSpace(allowed=lay.allowed, failure_step_time=space.failure_step_time, unit_time=lay.action_time)


def layer_candidates(space: SearchSpace, fill_fraction: float) -> list[tuple[str, np.ndarray]]:
    """Start placements (unit-level) for a strategy over layers: the starts of
    :func:`postplace.search.starts.candidate_homes` on :func:`device_space` (whole layers on devices:
    one device, the memory fill, METIS partitions), then every layer on the first window of each size
    (``stripe:gpu0..gpu3``), and by speed where that differs; a layer that may not take a window
    keeps its one-device home."""
    lay = space.layers
    dev = device_space(space)
    out = [(name, lay.expand(home)) for name, home in candidate_homes(dev, fill_fraction)]
    fallback = home_devices(dev)
    firsts: dict[int, int] = {}
    for a, name in enumerate(lay.names):
        if ".." in name:
            size = len(set(lay.stripes[a].tolist()))
            firsts.setdefault(size * 2 + name.endswith("by speed"), a)
    for a in firsts.values():
        every = lay.canonical[:, a]
        out.append((f"stripe:{lay.names[a]}", lay.expand(np.where(every >= 0, every, fallback))))
    return distinct(out)
