"""Local moves: the incumbent changed in one or a few decisions, an add-on every strategy can take.

Ours, not the paper's (DESIGN.md section 4: *local moves are not Post*). After the probe,
``local_fraction`` of every batch are the best placement told so far (the *incumbent*) changed by one
move, the kinds taking turns (:meth:`LocalMoves.moves`): one or a few decisions redrawn; a run of
consecutive decisions set to one value; on a micro-batched step (layers of several units) one or a few
units moved to another device. A move never repeats a placement already told. Their results move the
incumbent only: a strategy's own learning (Post's cross-entropy elite and PPO, REINFORCE's gradient,
annealing's chain) sees its own samples alone.

Every strategy's config has the fields of :class:`LocalSettings` (``use_local``, ``local_fraction``,
``local_units``, and the ablations ``local_pick`` and ``policy_segments``), local moves on by default
for ``post``, ``ce`` and ``ppo`` (their recorded sweep was run with them) and off for every other
strategy and for the strategies named after the paper (``post-paper``, ``ce-paper``, ``ppo-paper``,
``reinforce-paper``). Post makes its moves inside its own
batch of ``batch_size`` (:class:`postplace.search.post.PostStrategy`); any other strategy takes them
through :class:`WithLocalMoves`, which :func:`postplace.search.make_strategy` puts around it when its
config says ``use_local``: the strategy's own batch, plus as many local moves as make them
``local_fraction`` of the whole. The values a move draws come from the strategy's policy where it has
one over the same decisions (Post, REINFORCE on a step without layers), else uniformly from the allowed
ones. The ``local`` strategy is the moves alone from Post's start
(:class:`postplace.search.post.LocalStrategy`).

Each placement an ask returns has an *origin* (``last_origins``, written to ``history.jsonl``): a move's
is ``"local"``.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import numpy as np

from postplace.search.layers import action_space
from postplace.search.ranges import ranged
from postplace.search.strategy import SearchSpace, Wrapper, asked_origins, scores


@dataclass(frozen=True)
class LocalSettings:
    """The local-move add-on's settings, shared by every strategy's config (its base class).

    Parameters
    ----------
    local_fraction : float
        Share of each batch that are local moves of the incumbent (default 0.5, in [0, 1)).
    local_units : float
        Decisions redrawn per single local move, on average (default 1.5, >= 1).
    local_after : int
        Samples before the first local move (default 0; an ablation).
    use_local : bool
        Make local moves (default False; True for ``post``, ``ce`` and ``ppo``).
    """

    local_fraction: float = ranged(0.5, "[0, 1)", "share of each batch that are local moves of the best sample")
    """Share of each batch (after the probe) that are *local moves*: the best sample so far changed by
    one move (a few decisions redrawn, a run of decisions set to one value, on layers a few units
    moved; :meth:`LocalMoves.moves`). Ours (the paper has none): from a good start, independent
    per-unit samples change many units at once and are nearly all worse than it, so neither Post's elite
    nor PPO ever sees an improvement of it; a local move changes one or two. 0.5 rather than 0.25 for
    Post: from the uniform start on zoo models at m = 4 (ResNet-50 / GPT-2 on k80x4, 2,400 samples,
    2 seeds) 113 / 845 ms against 154 / 1,141 ms, and the same from the probe (108 / 801 against 109 /
    801). In [0, 1): a share; at 1 the strategy itself would never be sampled (the ``local`` strategy
    is that)."""
    local_after: int = ranged(0, "[0, inf)", "samples before the first local move")
    """Samples (the probe's included) before the first local move: the strategy alone explores first, the moves
    refine what it found after (issue 32 item 5's schedule: coarse first, fine later). 0 (default): from the
    first batch after the probe; the ``local`` strategy, moves alone, ignores it. An ablation, not the
    default: on the paper's ten pairs (3 seeds, 2,400 samples) Post with 1,200 is 0.20% ahead of ``local``
    (median; ahead on 5 of 10, worst -1.6%), where the default is 0.76% behind and Post without moves 0.02%
    ahead: about Post without moves, plus a little (RESULTS.md, issue 32 item 5)."""
    local_units: float = ranged(1.5, "[1, inf)", "decisions redrawn per local move, on average")
    """Decisions redrawn per local move, on average: 1 + a Poisson count of mean ``local_units - 1``
    (mostly single changes, sometimes a few together, which a pair of layers that only pays off moved
    together needs). At least 1: a move changes something."""
    local_pick: str = ranged(
        "uniform", why="how a local move picks the decisions it redraws", choices=("uniform", "policy")
    )
    """Which decisions a move that redraws a few picks: ``"uniform"`` (any decision with another allowed
    value), or ``"policy"``: in proportion to ``1 - p(incumbent's value)``, so the moves go where the
    learned policy disagrees with the incumbent (issue 32 item 5's "the policy choosing which decisions a
    local move redraws"). An ablation, not the default: on the paper's ten pairs (5 seeds, 2,400 samples)
    Post with it is 0.26% behind ``local`` (median; Post's default 0.76%), ahead of it on 2 of 10 pairs as
    the default is (RESULTS.md, issue 32 item 5)."""
    policy_segments: bool = False
    """Add a fourth kind of move, taking its turn with the others: a run of consecutive decisions (as a
    segment move's) set to one sample of the policy's, so a learned pattern over a stretch of the model is
    tried on the incumbent. An ablation, not the default: Post with it is 0.53% behind ``local`` on the
    paper's pairs (median), ahead on 1 of 10 (RESULTS.md, issue 32 item 5)."""
    use_local: bool = False
    """Make local moves (the add-on of :mod:`postplace.search.local`). Off for every strategy but
    ``post``, ``ce`` and ``ppo``, and always off for those named after the paper."""


class LocalMoves:
    """The incumbent, every placement told, and the local moves of the incumbent.

    A part of a strategy, not a strategy: the owner tells it every placement it was told
    (:meth:`tell`) and asks it for moves (:meth:`moves`), passing its own random generator, so a
    strategy's samples come from one stream.

    Parameters
    ----------
    space : SearchSpace
        The units' space; on a micro-batched step (``space.layers``) the moves act on layers and
        stripes (:func:`postplace.search.layers.action_space`), as Post's decisions do.
    """

    def __init__(self, space: SearchSpace):
        self.space = space
        self.layers = space.layers
        self.decisions = space if self.layers is None else action_space(space)
        """The decisions a move changes: the units, or on layers one stripe per layer."""
        self.best_placement: np.ndarray | None = None  # the incumbent (units)
        self.best_score = np.inf
        self._seen: set[int] = set()  # digests of every placement told: a local move never repeats one
        self._seen_order: list[int] = []  # the same, in the order first seen (the state keeps this list)

    @property
    def base_kinds(self) -> int:
        """The kinds of move every owner makes (:meth:`moves`): redraws and segment moves, and on fine layers
        unit moves; a policy segment, when asked for, is the kind after them."""
        return 3 if self.fine_layers else 2

    @property
    def fine_layers(self) -> bool:
        """Layers of several units each (a micro-batched step), where unit moves are finer than stripes."""
        return self.layers is not None and self.layers.num_layers < self.space.num_units

    def tell(self, placements: np.ndarray, score: np.ndarray) -> None:
        """Remember ``placements`` (unit-level) as told, and take the best as the incumbent when it
        scores below it (``score`` as :func:`postplace.search.strategy.scores` gives it)."""
        for row in placements:
            self._remember(row)
        i = int(np.argmin(score))
        if score[i] < self.best_score:
            self.best_score, self.best_placement = float(score[i]), np.array(placements[i])

    def moves(
        self,
        n: int,
        probs: np.ndarray,
        rng: np.random.Generator,
        turn: int,
        settings: LocalSettings,
    ) -> np.ndarray | None:
        """Up to ``n`` copies of the incumbent, each changed by one move, the kinds taking turns
        (``turn``: the kind of the first, e.g. the samples told so far):

        * redraw 1 + Poisson(``local_units`` - 1) decisions, each from ``probs`` (never to its value),
          picked uniformly or, with ``local_pick="policy"``, where ``probs`` disagrees with the incumbent;
        * a *segment move*: a run of consecutive decisions (numbered in program order, so a run is a
          stretch of the model; it starts anywhere and its length is uniform up to the end of the
          model: log-uniform lengths, mostly short, were slower to reach whole-model structure from
          the uniform start, e.g. Inception-V3 on k80x4 at m = 4, 224 against 146 ms in 2,400
          samples, NMT-2 1,101 against 832) all set to one value, drawn from ``probs`` of the run's
          first decision (a decision that may not take it keeps its own): what turns a stretch of
          layers into one pipeline stage or one data-parallel block, which single changes reach one
          at a time;
        * on layers (where some layer has several units), a *unit move*: 1 + Poisson(``local_units`` - 1)
          units (one micro-batch's part of a layer, or its shared ops) each to another device, drawn
          half from ``probs``' marginal of that unit's device and half uniformly (a device no
          stripe favours, such as the CPU for small updates): finer than any stripe (a parameter's
          owner, one micro-batch on a less busy GPU), so the answer is not limited to stripes (the
          runner keeps the best placement as told);
        * with ``policy_segments``, a *policy segment*: a run of consecutive decisions (as a segment
          move's) set to one sample of ``probs``.

        A move onto a placement already told is drawn again (up to ``_TRIES`` times, then that slot
        is left to the strategy): on 8-op instances 75-84% of local moves repeated a placement already
        evaluated, samples the strategy needed.

        Parameters
        ----------
        n : int
            Moves wanted.
        probs : numpy.ndarray
            ``[decisions, values]``: the distribution moves draw values from (a policy's
            probabilities, or uniform over the allowed values).
        rng : numpy.random.Generator
            The owner's generator.
        turn : int
            Which kind the first move is.
        settings : LocalSettings
            The owner's config: ``local_units``, ``local_pick``, ``policy_segments``.

        Returns
        -------
        numpy.ndarray or None
            ``int[k, G]`` unit placements with ``k <= n``; None when no incumbent, no move or no new
            placement is left.
        """
        if self.best_placement is None or n <= 0:
            return None
        allowed, lay = self.decisions.allowed, self.layers
        movable = np.flatnonzero(allowed.sum(axis=1) > 1)
        free = np.flatnonzero(self.space.allowed.sum(axis=1) > 1)
        if movable.size == 0 and free.size == 0:
            return None
        current = self.best_placement if lay is None else lay.collapse(self.best_placement)
        kinds = self.base_kinds + int(settings.policy_segments)
        marginal = self._unit_marginals(probs) if self.fine_layers else None
        fresh = []
        for i in range(n):
            for _ in range(_TRIES):  # a move onto a placement already told is a wasted sample: try another
                move = self.best_placement.copy()
                self._move(move, (i + turn) % kinds, probs, marginal, movable, free, current, rng, settings)
                if self._remember(move):
                    fresh.append(move)
                    break
        return np.stack(fresh) if fresh else None

    def uniform(self) -> np.ndarray:
        """``[decisions, values]``: uniform over each decision's allowed values, for an owner without a
        policy over the decisions."""
        allowed = self.decisions.allowed
        return allowed / allowed.sum(axis=1, keepdims=True)

    def _remember(self, placement: np.ndarray) -> bool:
        """Record a placement as told; False when it already was."""
        if (key := _digest(placement)) in self._seen:
            return False
        self._seen.add(key)
        self._seen_order.append(key)
        return True

    def _move(
        self,
        row: np.ndarray,
        kind: int,
        p: np.ndarray,
        marginal: np.ndarray | None,
        movable: np.ndarray,
        free: np.ndarray,
        current: np.ndarray,
        rng: np.random.Generator,
        settings: LocalSettings,
    ) -> None:
        """Change ``row`` (a unit placement) in place by one local move of ``kind`` (:meth:`moves`)."""
        allowed, lay = self.decisions.allowed, self.layers
        count = 1 + int(rng.poisson(settings.local_units - 1))

        def draw(q: np.ndarray, ok: np.ndarray, old: int) -> int:
            q = np.where(ok, np.maximum(q, 1e-12), 0.0)
            q[old] = 0.0
            return int(rng.choice(q.size, p=q / q.sum())) if q.sum() > 0 else old

        def put(decisions: np.ndarray, value: int) -> None:
            if lay is None:
                row[decisions[allowed[decisions, value]]] = value
            else:  # each layer takes the stripe that places it as ``value`` does, where it may
                units_ = np.isin(lay.unit_layer, decisions[lay.canonical[decisions, value] >= 0])
                row[units_] = lay.stripes[value, lay.unit_column[units_]]

        if settings.policy_segments and kind == self.base_kinds:  # a policy segment
            cdf = np.cumsum(np.where(allowed, p, 0.0), axis=1)
            sample = np.minimum((cdf < rng.random((len(p), 1)) * cdf[:, -1:]).sum(axis=1), p.shape[1] - 1)
            start = int(rng.integers(0, allowed.shape[0]))
            run = np.arange(start, start + int(rng.integers(1, allowed.shape[0] - start + 1)))
            for value in np.unique(sample[run]):  # the run's decisions are disjoint: one put per value
                put(run[sample[run] == value], int(value))
            return
        if kind == 2 or movable.size == 0:  # unit moves (on layers)
            ok = self.space.allowed
            q = 0.5 * marginal + 0.5 * ok / ok.sum(axis=1, keepdims=True) if marginal is not None else ok * 1.0
            for u in rng.choice(free, size=min(free.size, count), replace=False):
                row[u] = draw(q[u], ok[u], int(row[u]))
        elif kind == 0:
            weight = None
            if settings.local_pick == "policy":  # where the policy disagrees with the incumbent
                weight = np.maximum(1.0 - p[movable, current[movable]], 1e-9)
                weight /= weight.sum()
            for u in rng.choice(movable, size=min(movable.size, count), replace=False, p=weight):
                put(np.array([u]), draw(p[u], allowed[u], int(current[u])))
        else:
            # start on a decision that may take every value its neighbours may (on layers: not a layer of
            # shared ops only, whose few distinct stripes would never start a data-parallel run)
            n_allowed = allowed[movable].sum(axis=1)
            rich = movable[n_allowed == n_allowed.max()] if self.fine_layers else movable
            start = int(rng.choice(rich))
            value = draw(p[start], allowed[start], int(current[start]))
            put(np.arange(start, start + int(rng.integers(1, allowed.shape[0] - start + 1))), value)

    def _unit_marginals(self, p: np.ndarray) -> np.ndarray:
        """``[G_units, D]``: the probability ``p`` puts each unit on each device (summed over the
        stripes of its layer that send it there)."""
        lay = self.layers
        G, D = self.space.allowed.shape
        out = np.zeros((G, D))
        rows = np.arange(G)
        for a in range(lay.num_actions):
            np.add.at(out, (rows, lay.stripes[a, lay.unit_column]), p[lay.unit_layer, a])
        return out

    def state_dict(self) -> dict:
        """``{"best": {"placement", "score"} or None, "seen": [digests]}``."""
        best = (
            None if self.best_placement is None else {"placement": self.best_placement.copy(), "score": self.best_score}
        )
        return {"best": best, "seen": list(self._seen_order)}  # a list: the run folder's check compares shapes

    def load_state_dict(self, state: dict) -> None:
        """Restore :meth:`state_dict`'s entries (absent ones: none)."""
        best = state.get("best")
        self.best_placement = None if best is None else np.asarray(best["placement"]).copy()
        self.best_score = np.inf if best is None else float(best["score"])
        self._seen_order = [int(x) for x in state.get("seen", [])]
        self._seen = set(self._seen_order)


_TRIES = 8  # local moves tried per slot before it is left to the strategy (the incumbent's neighbourhood is spent)


def _digest(placement: np.ndarray) -> int:
    """63 bits of a placement's hash: a JSON-safe integer, and a collision (a move wrongly taken for one
    already told) costs nothing but that move."""
    data = np.ascontiguousarray(placement, dtype=np.int64).tobytes()
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "little") >> 1


class WithLocalMoves(Wrapper):
    """A strategy with the local-move add-on: its own batch, plus local moves of the incumbent.

    Each ask (once a placement was told, and never beside the probe's candidates) asks the strategy
    for its own batch, then adds ``round(k f / (1 - f))`` local moves (k its batch, f
    ``local_fraction``), so the moves are ``f`` of the whole, as in Post's batch. ``tell`` gives the
    strategy its own placements only; every placement moves the incumbent. Everything else (``name``,
    ``config``, ``space``, ``start_name``...) is the strategy's, and its random generator draws the
    moves too. :func:`postplace.search.make_strategy` puts it around a strategy whose config says
    ``use_local`` and that does not make the moves itself.

    Parameters
    ----------
    inner : Strategy
        The strategy; its config's :class:`LocalSettings` fields say the share and the move size.
    """

    def __init__(self, inner):
        self.inner = inner
        self.local = LocalMoves(inner.space)
        self.told = 0  # placements told so far: whose turn the first move's kind is
        self.last_origins: list[str] | None = None
        self.own_in_last_ask = 0

    def ask(self, max_n: int) -> np.ndarray:
        """The strategy's own batch, then the local moves (:class:`WithLocalMoves`)."""
        cfg = self.inner.config
        f = cfg.local_fraction
        ready = self.local.best_placement is not None and self.told >= cfg.local_after
        own = np.atleast_2d(np.asarray(self.inner.ask(max(1, int((1 - f) * max_n)) if ready else max_n)))
        origins = asked_origins(self.inner, len(own))
        self.own_in_last_ask = len(own)
        n = 0 if any(o.startswith("probe") for o in origins) else min(max_n - len(own), round(len(own) * f / (1 - f)))
        moves = self.local.moves(n, self._probs(), self.inner.rng, self.told, cfg) if ready else None
        self.last_origins = origins + ["local"] * (0 if moves is None else len(moves))
        return own if moves is None else np.concatenate([own, moves])

    def tell(
        self, placements: np.ndarray, step_time: np.ndarray, feasible: np.ndarray, overflow: np.ndarray | None = None
    ) -> None:
        """The strategy learns from its own placements; every placement moves the incumbent."""
        placements = np.atleast_2d(np.asarray(placements))
        k = (
            self.own_in_last_ask
            if self.last_origins is not None and len(self.last_origins) == len(placements)
            else len(placements)
        )
        self.last_origins = None
        over = None if overflow is None else np.asarray(overflow)[:k]
        self.inner.tell(placements[:k], np.asarray(step_time)[:k], np.asarray(feasible)[:k], over)
        space = self.inner.space
        self.local.tell(
            placements,
            scores(
                np.asarray(step_time, dtype=np.float64),
                np.asarray(feasible),
                space.failure_step_time,
                overflow,
                space.overflow_scale,
            ),
        )
        self.told += len(placements)

    def _probs(self) -> np.ndarray:
        policy = getattr(self.inner, "policy", None)
        if getattr(policy, "allowed", np.empty(0)).shape == self.local.decisions.allowed.shape:
            return policy.probs()
        return self.local.uniform()

    def state_dict(self) -> dict:
        """The strategy's state (its generator draws the moves too), with the add-on's: the incumbent,
        the placements told."""
        return {**self.inner.state_dict(), "local_moves": {**self.local.state_dict(), "told": self.told}}

    def load_state_dict(self, state: dict) -> None:
        """Restore :meth:`state_dict`."""
        own = dict(state)
        local = own.pop("local_moves")
        self.inner.load_state_dict(own)
        self.local.load_state_dict(local)
        self.told = int(local["told"])


def with_local(strategy):
    """``strategy`` with the local-move add-on when its config says ``use_local`` and it does not make
    the moves itself (Post does, :attr:`PostStrategy.makes_local_moves`); else ``strategy``."""
    cfg = getattr(strategy, "config", None)
    if not getattr(cfg, "use_local", False) or getattr(strategy, "makes_local_moves", False):
        return strategy
    return WithLocalMoves(strategy)


__all__ = ["LocalMoves", "LocalSettings", "WithLocalMoves", "with_local"]
