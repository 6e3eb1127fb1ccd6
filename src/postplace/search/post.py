"""Post: cross-entropy minimization interleaved with proximal policy optimization.

Gao, Chen, Li. "Post: Device Placement with Cross-Entropy Minimization and Proximal Policy
Optimization". NeurIPS 2018. The policy is one softmax over the D devices per unit (a product of
categoricals). Placements are sampled ``batch_size`` (K) at a time; after each batch:

* at every multiple of ``ce_every`` (N) samples: the cross-entropy step. The elite is the best
  ``elite_fraction`` of the *feasible* samples since the last CE step (at least one); each unit's
  distribution becomes the elite's device frequencies, mixed with uniform over its allowed devices by
  ``eps``. Adam's moments are reset, since the logits just jumped. When no sample of the window is
  feasible, the elite is the ``elite_fraction`` of the window that overflows memory least (so the
  distribution moves towards placements that fit); when nothing tells them apart (no overflow was
  told, or all overflow equally) the step is skipped;
* otherwise: PPO. ``ppo_epochs`` Adam steps of gradient ascent on the clipped surrogate over the batch,
  with the log-probabilities recorded when the batch was sampled.

Reward ``-sqrt(score)`` (the hierarchical planner's), advantage = reward minus the batch mean over
the batch std (zero when the std is zero). A feasible sample's score is its step time. An infeasible
one scores above every feasible one (:func:`postplace.search.strategy.scores`: the failing step time,
times ``1 + x / (x + S)`` for ``x`` bytes over capacity summed over devices and ``S`` the cluster's
total capacity), so infeasible samples are never elite next to a feasible one, never best, and among
themselves rank by how far they overflow: a batch of OOM samples still teaches PPO which way fits.

Configurations: ``paper`` starts uniform over each unit's allowed devices, as the paper does. The
default (``init="probe"``) spends its first few samples on candidate start placements
(:func:`postplace.search.starts.candidate_homes`: every unit on the fastest device it may use; the
memory fill, which spreads the units in program order over the fewest fastest devices that hold the
step, as m-TOPO fills them; METIS partitions of the unit graph over 2..k comparable devices, by work
and by bytes), then starts from the best of them (feasible first, then least overflow, then fastest)
as every unit's home (the one-device start unless another beats it by ``probe_margin``):
``anchor_weight`` of its probability there (for a partition, enough to draw ``partition_units``
units per sample elsewhere; for a layer stripe, ``stripe_units`` layers), the rest spread by speed;
``start_name`` says which won. Why: a uniform start over one
slow CPU and several identical GPUs spends most of the budget undoing random spreads; a start on one
GPU where the step does not fit it never samples a feasible placement; and independent per-unit
sampling from a one-GPU start rarely discovers a layer-wise split such as RNNLM's four LSTM layers on
four GPUs. The candidates are Post's own (nothing from ``placers/``). The ``ce`` and ``ppo`` ablations
are this file with one half switched off.

Local moves (ours, not the paper's; ``use_local``, :mod:`postplace.search.local`, an add-on every
strategy can take): after the probe, ``local_fraction`` of every batch are the best sample so far
changed by one move (:meth:`postplace.search.local.LocalMoves.moves`), never a placement already told.
From a good start, independent per-unit samples change many units at once and are nearly all worse than
the start, so neither the elite nor PPO sees an improvement of it; a local move changes one thing. Their
results move the incumbent (and the runner's best) only: the cross-entropy elite and PPO's surrogate
stay over the policy's own samples, as in the paper (local moves in the elite pulled the policy onto
the incumbent's neighbourhood: on 40 fresh small instances, 196 of 200 runs reached the optimum that
way, 199 with the elite kept to the policy's own samples, 195 without local moves). On by default
(``post``, ``ce``, ``ppo``); off in the strategies named after the paper (``post-paper``, ``ce-paper``,
``ppo-paper``), which are the paper's algorithm. :class:`LocalStrategy` (``local``) is the moves alone
from the same start.

**Decisions on a micro-batched step.** When the space has layers (``space.layers``, a step traced as m
micro-batches; :mod:`postplace.search.layers`), everything above acts on *layers* and *stripes*
instead of units and devices: the policy is one softmax over the stripes a layer may take per layer
(``[L, A]``), a sample is one stripe per layer, and :meth:`LayerSpace.expand` maps it to the units:
micro-batch j's part of layer l goes to ``stripes[a_l][j]``, the layer's shared ops (parameters,
gradient sums, update) to ``stripes[a_l][c_l]``, its owner column. A stripe is the whole layer on one
device (r = 1, a pipeline stage), micro-batch j on window device ``j mod r`` of an aligned window of
r comparable GPUs (r = all: data parallelism), or micro-batches dealt out by speed over GPUs of
unequal speed. So data parallelism is one stripe repeated over the layers, a pipeline of
data-parallel stages a few windows, and the cross-entropy step (each layer's stripe frequencies in the
elite) and PPO are unchanged. Placements told that were not sampled (the probe's, a warm start) are
read back as the nearest stripes (:meth:`LayerSpace.collapse`). The priors use the same homes, found
with whole layers as units (:func:`postplace.search.layers.device_space`) and put on the r = 1
stripes; the probe adds every layer on the first window of each size (``stripe:gpu0..gpu3``). At
m = 1 there are no layers; and a layer space built at m = 1 has one stripe per device, the device
itself, so it is the per-device policy exactly (``tests/test_layers.py``).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields, replace

import numpy as np

from postplace.search.layers import action_space, device_space, layer_candidates
from postplace.search.local import LocalMoves, LocalSettings
from postplace.search.policy import (
    Adam,
    CategoricalPolicy,
    cross_entropy_update,
    normalized_advantage,
    ppo_gradient,
)
from postplace.search.ranges import ranged
from postplace.search.registry import register_strategy, register_variant
from postplace.search.starts import StartProbe, home_devices
from postplace.search.strategy import SearchSpace, rng_from_state, rng_state, scores


@dataclass(frozen=True)
class PostConfig(LocalSettings):
    """Post's hyperparameters, each with its range; the defaults are the recorded sweep's choice.

    Every field states its range (``ranged``), checked by :func:`postplace.search.config.build_config`
    for ``--set``, ``--config``, a ``config`` dict and a run folder's recorded config; the reason for
    each default and range is in the field's docstring.

    Parameters
    ----------
    batch_size : int
        K, placements sampled per batch; PPO runs after every batch (default 48, >= 1).
    ce_every : int
        N, samples between cross-entropy steps, a multiple of ``batch_size`` (default 480, >= 1).
    elite_fraction : float
        Share of the recent feasible samples kept as the elite (default 0.1, in (0, 1]).
    eps : float or None
        Weight of uniform over the allowed devices mixed in after a cross-entropy step (in [0, 1));
        None (default): ``min(eps_cap, eps_units / G)``.
    eps_units : float
        With ``eps=None``: units per sample redrawn uniformly after a cross-entropy step (default 2, >= 0).
    eps_cap : float
        With ``eps=None``: the largest eps used (default 0.25, in [0, 1)).
    lr : float
        Adam learning rate on the logits in the PPO steps (default 0.1, > 0).
    ppo_epochs : int
        Gradient steps per PPO update (default 10, >= 1).
    clip : float
        PPO clip range of the probability ratio (default 0.1, in (0, 1)).
    init : {"probe", "uniform", "speed", "memory"}
        The policy's start (default ``"probe"``; ``"uniform"`` is the paper's).
    anchor_weight : float
        Prior probability on each unit's home device (default 0.7, in [0, 1]).
    partition_units : float
        With ``init="probe"``, when a METIS partition or a stripe wins the probe: decisions per sample
        drawn away from their home (default 32, >= 0).
    probe_margin : float
        With ``init="probe"``: the step-time ratio another start must beat the one-device start by
        (default 0.9, in [0, 1]).
    fill_fraction : float
        Share of each device's memory the memory fill may use (default 0.8, in (0, 1]).
    stripe_units : float
        With ``init="probe"``, when a layer stripe wins the probe: layers per sample drawn away from it
        (default 2, >= 0).
    elite_local : bool
        The local moves' samples join the cross-entropy window (default False: an ablation).
    ppo_local : bool
        PPO learns from the local moves' samples too, each move against the batch's other moves (default
        False: an ablation).
    use_ce, use_ppo : bool
        Run the cross-entropy steps, the PPO steps (False: the ``ppo``, ``ce`` ablations).
    local_fraction, local_units : float
        The local moves' share of each batch and size (:class:`postplace.search.local.LocalSettings`).
    local_after : int
        Samples before the first local move (default 0: from the first batch after the probe; an ablation).
    local_pick : {"uniform", "policy"}
        Which decisions a local move redraws (default ``"uniform"``; ``"policy"``: an ablation).
    policy_segments : bool
        A fourth local move, a run set to a policy sample (default False: an ablation).
    use_local : bool
        Make local moves (default True; False in ``post-paper`` and :meth:`paper`: the paper's algorithm).

    Examples
    --------
    >>> from postplace.search import PostConfig
    >>> PostConfig().batch_size, PostConfig.paper().init
    (48, 'uniform')
    """

    batch_size: int = ranged(48, "[1, inf)", "placements sampled per batch")
    """K: placements sampled per batch; PPO runs after every batch. The paper does not state K; chosen
    by the recorded sweep (benchmarks/sweep.py on zoo models, then small enumerated instances; see
    benchmarks/RESULTS.md, 'Post's defaults'). At least 1: a batch has a sample."""
    ce_every: int = ranged(480, "[1, inf)", "samples between cross-entropy steps")
    """N: a cross-entropy step replaces PPO at every multiple of N samples (a multiple of K). Sweep.
    At least 1 (the step comes at multiples of N; 0 divides by zero)."""
    elite_fraction: float = ranged(0.1, "(0, 1]", "share of the recent samples kept as the elite")
    """Share of the recent feasible samples kept as the elite: 10%, as in the paper. Infeasible samples
    never enter an elite beside a feasible one; when the window since the last CE step holds no
    feasible sample, the elite is this share of the window that overflows memory least (ours: the
    paper is silent), and the step is skipped when no overflow tells them apart. In (0, 1]: a share of
    the samples (at least one sample is always kept); 1 fits all of them, more is no more."""
    eps: float | None = ranged(None, "[0, 1)", "weight of uniform mixed in after a cross-entropy step")
    """Mixing weight of uniform-over-allowed after a CE step, so no allowed device reaches zero. None:
    ``min(eps_cap, eps_units / G)``, so that about ``eps_units`` units per sample are redrawn
    uniformly whatever the number of units G (a fixed eps redraws many units of a large graph, most of
    them onto a slow CPU). In [0, 1): the step is ``(1 - eps) * elite frequencies + eps * uniform``, a
    distribution only for eps <= 1 (above 1 it weighs the elite negatively, inverting the step);
    eps = 1 throws the elite away, and eps = 0 is the unsmoothed cross-entropy method."""
    eps_units: float = ranged(2.0, "[0, inf)", "units per sample redrawn uniformly after a cross-entropy step")
    """With eps=None: expected number of units per sample redrawn uniformly after a CE step. Sweep.
    At least 0 (an expected count); eps_cap bounds the eps it gives."""
    eps_cap: float = ranged(0.25, "[0, 1)", "the largest eps used when eps is none")
    """With eps=None: the largest eps used (small graphs). Chosen on small enumerated instances.
    In [0, 1), as eps."""
    lr: float = ranged(0.1, "(0, inf)", "Adam learning rate of the PPO steps")
    """Adam learning rate on the logits (PPO steps). Sweep. Above 0: at 0 PPO learns nothing."""
    ppo_epochs: int = ranged(10, "[1, inf)", "gradient steps per PPO update")
    """Gradient steps per PPO update over one batch (the paper: 'several, e.g. 10'). At least 1 (to
    switch PPO off, use_ppo=false)."""
    clip: float = ranged(0.1, "(0, 1)", "PPO clip range of the probability ratio")
    """PPO clip range. 0.1 (Schulman et al. 2017 also use it) rather than 0.2: the same zoo score, and
    100/100 instead of 93/100 optima reached on small enumerated instances (RESULTS.md). In (0, 1): the
    ratio of new to old probability is kept in [1 - clip, 1 + clip]; at 0 nearly every step after the
    first is clipped away, and at 1 or more the lower end is <= 0, which no ratio reaches, so the
    clip on samples with a negative advantage is gone."""
    init: str = ranged("probe", why="start of the policy", choices=("uniform", "speed", "memory", "probe"))
    """'uniform' (the paper), 'speed' (every unit's home is the fastest device it may use, see
    speed_prior), 'memory' (homes fill the fewest fastest devices that hold the step, see
    memory_prior; the same as 'speed' when the step fits the fastest device) or 'probe': the first
    samples are the candidate homes of :func:`postplace.search.starts.candidate_homes` (one device,
    the memory fill, METIS partitions over 2..k comparable devices), and the best of them (feasible
    first, then least overflow, then fastest) becomes every unit's home (``start_name`` says which).
    Until they are told, the prior is 'memory'."""
    anchor_weight: float = ranged(0.7, "[0, 1]", "prior probability on each unit's home device")
    """With init='speed' or 'memory': prior probability mass on each unit's home device. Sweep (0.5,
    0.7, 0.9). In [0, 1]: a probability (the rest goes to the unit's other allowed devices, each of
    which keeps at least 1e-6)."""
    partition_units: float = ranged(32.0, "[0, inf)", "units per sample drawn away from a partition's homes")
    """With init='probe', when a METIS partition wins the probe: the expected number of units per
    sample drawn away from their home, ``min(0.5 G, partition_units)`` (the home's weight is
    ``1 - min(0.5, partition_units / G)``: 0.875 at 256 units, 0.5 up to 64). A partition is already a
    spread-out answer: exploring some units around it finds its improvements, while 30% of hundreds
    of units scattered at once rarely do. Chosen on zoo models (NMT-4 on k80x4: 1,443 ms at 4, 1,381
    at 32, 1,371 at 64; the memory-bound tuning cases: best at 4-32) and small enumerated instances
    (0.5 is needed there: at 0.7 one 8-op instance was trapped next to its partition in 6 of 10 seeds).
    At least 0: an expected count (the home keeps at least half the mass whatever its size)."""
    probe_margin: float = ranged(0.9, "[0, 1]", "step-time ratio another start must beat the one-device start by")
    """With init='probe': another start replaces the one-device start ('fastest') only when the
    one-device placement is infeasible or the other scores below ``probe_margin`` times it. The
    one-device start is the one the sweep tuned; Post improves on it by up to about 10% by itself
    (ResNet-50 0.92x, BERT-3 0.99x of one GPU), so a start only slightly faster than it is no gain.
    In [0, 1]: a ratio of step times; 1 takes any faster start, 0 keeps a feasible one-device start
    always, and above 1 says no more than 1 (the best start is never slower than the one-device one)."""
    fill_fraction: float = ranged(0.8, "(0, 1]", "share of each device's memory the memory fill may use")
    """With init='memory', when the step does not fit the fastest device: the share of each device's
    capacity the fill may use (the rest is room for tensors received from other devices and for the
    prior's spread). Chosen on zoo models at batch sizes that overflow one K80 (RESULTS.md,
    'Memory-bound placement'). In (0, 1]: a share of a capacity; above 1 fills devices past their
    memory, and 0 holds nothing."""
    use_ce: bool = True
    """Run cross-entropy steps (False: the 'ppo' ablation)."""
    use_ppo: bool = True
    """Run PPO steps (False: the 'ce' ablation)."""
    stripe_units: float = ranged(2.0, "[0, inf)", "layers per sample drawn away from a stripe start")
    """With init='probe', when a layer stripe wins the probe (a micro-batched step, e.g. every layer
    data-parallel): the expected number of layers per sample drawn away from their stripe, as
    ``partition_units`` is for a partition (the home's weight ``1 - min(0.5, stripe_units / L)``). 2, not
    ``partition_units``' 32: a stripe start is a sharp optimum (each layer moved off it costs transfers),
    and at 32 a sample redrew half the layers, so without local moves the policy never left its start
    (GPT-2 on dgx8 at m = 8: 43.31 ms, the start, against 40.43 at 2; Inception-V3 and GPT-2 on k80x4 at
    m = 4: 143.87 / 820.82 against 141.77 / 803.48; RESULTS.md, issue 32 item 5). At least 0 (an
    expected count)."""
    elite_local: bool = False
    """Let the local moves' samples into the cross-entropy step's window, beside the policy's own (PPO
    still learns from its own samples only, whose probabilities it recorded; on layers, only the moves
    that are one stripe per layer, not the unit moves): issue 32 item 5's "the elite
    including local-move samples". An ablation, not the default: it pulls the policy onto the incumbent's
    neighbourhood, and on the paper's pairs Post with it is 1.15% behind ``local`` (median; the default
    0.76%), 3.2% on NMT-2 ``k80x4`` (RESULTS.md, issue 32 item 5); on small instances it was measured
    before (the module docstring)."""
    ppo_local: bool = False
    """PPO learns from the local moves' samples too, their advantages normalised among the batch's moves
    alone, so a move is judged against the other moves of the same incumbent and, in the first of PPO's
    epochs, the decisions a move leaves as they are cancel out of the gradient (later epochs clip each move on
    its own ratio): the policy learns which redraws pay, and the moves draw their values from it. An
    ablation, not the default: on the paper's pairs Post with it is 0.87% behind ``local`` (median, 3 seeds;
    the default 0.76%), 1.60% with ``local_pick="policy"`` as well (RESULTS.md, issue 32 item 5)."""
    use_local: bool = True
    """Make local moves (:class:`postplace.search.local.LocalSettings`; the other two fields, share and
    size, are there too). On for Post: the recorded sweep chose its other defaults with them; False is
    the paper's algorithm (``post-paper``, :meth:`paper`)."""

    @classmethod
    def paper(cls) -> PostConfig:
        """The paper's setting: uniform start, no local moves.

        Returns
        -------
        PostConfig
        """
        return cls(init="uniform", use_local=False)


def anchored_prior(space: SearchSpace, home: np.ndarray, anchor_weight: float) -> np.ndarray:
    """Initial logits: ``anchor_weight`` on each unit's home device, the rest over its other allowed
    devices in proportion to their speed on that unit (1 / time). A prior, not an answer: every
    allowed device keeps a non-zero probability."""
    allowed = space.allowed
    G = allowed.shape[0]
    t = np.where(allowed, space.unit_time, np.inf)
    speed = np.where(allowed, 1.0 / np.maximum(t, 1e-12), 0.0)
    speed[np.arange(G), home] = 0.0
    rest = speed / np.maximum(speed.sum(axis=1, keepdims=True), 1e-300)
    others = allowed.sum(axis=1) > 1
    p = np.where(others[:, None], (1 - anchor_weight) * rest, 0.0)
    p[np.arange(G), home] = np.where(others, anchor_weight, 1.0)
    p = np.where(allowed, np.maximum(p, 1e-6), 0.0)
    with np.errstate(divide="ignore"):
        return np.log(p / p.sum(axis=1, keepdims=True))


def speed_prior(space: SearchSpace, anchor_weight: float) -> np.ndarray:
    """The device-aware prior: every unit's home is the most preferred device it may use (so one
    CPU-only unit does not make the CPU every unit's home), weighted as in :func:`anchored_prior`."""
    if space.unit_time is None:
        return np.zeros(space.allowed.shape)
    return anchored_prior(space, home_devices(space), anchor_weight)


def memory_prior(space: SearchSpace, anchor_weight: float, fill_fraction: float) -> np.ndarray:
    """The memory-aware prior: homes from :func:`home_devices` with ``fill_fraction``, weighted as in
    :func:`anchored_prior`; :func:`speed_prior` when the step fits the most preferred device."""
    if space.unit_time is None:
        return np.zeros(space.allowed.shape)
    return anchored_prior(space, home_devices(space, fill_fraction), anchor_weight)


def initial_logits(space: SearchSpace, init: str, anchor_weight: float, fill_fraction: float) -> np.ndarray | None:
    """The start named by ``init`` ('uniform', 'speed' or 'memory'); None means uniform."""
    if init == "uniform":
        return None
    if init == "speed":
        return speed_prior(space, anchor_weight)
    if init in ("memory", "probe"):
        return memory_prior(space, anchor_weight, fill_fraction)
    raise ValueError(f"init must be 'uniform', 'speed', 'memory' or 'probe', not {init!r}")


@register_strategy("post", config=PostConfig, rank=10)
class PostStrategy:
    """Post: cross-entropy steps interleaved with PPO over a per-unit softmax policy; see the module docstring.

    Follows the :class:`postplace.search.Strategy` ask/tell contract; :func:`postplace.search.run`
    drives it.

    Parameters
    ----------
    space : SearchSpace
    seed : int
        Seed of its random generator.
    config : PostConfig, optional
        Default ``PostConfig()``; :meth:`PostConfig.paper` for the paper's uniform start.

    Raises
    ------
    ValueError
        When ``config.ce_every`` is not a multiple of ``config.batch_size``.

    Examples
    --------
    >>> import numpy as np
    >>> from postplace.search import PostConfig, PostStrategy, SearchSpace
    >>> space = SearchSpace(np.ones((3, 2), dtype=bool), failure_step_time=10.0)
    >>> s = PostStrategy(space, seed=0, config=PostConfig(init="uniform", batch_size=4, ce_every=8))
    >>> p = s.ask(100)
    >>> p.shape
    (4, 3)
    >>> s.tell(p, np.array([1.0, 2.0, 3.0, 4.0]), np.ones(4, dtype=bool))
    """

    name = "post"
    makes_local_moves = True
    """Post makes its local moves inside its own batch (:func:`postplace.search.local.with_local`)."""

    def __init__(self, space: SearchSpace, *, seed: int = 0, config: PostConfig | None = None):
        self.space = space
        self.config = config or PostConfig()
        if self.config.ce_every % self.config.batch_size:
            raise ValueError("ce_every must be a multiple of batch_size")
        cfg = self.config
        # the decisions: one device per unit, or on a micro-batched step one stripe per layer
        self.layers = space.layers
        self.local = LocalMoves(space)  # the incumbent, every placement told, and the local moves
        self.decisions = self.local.decisions
        self.policy = CategoricalPolicy(self.decisions.allowed, _start_logits(space, cfg))
        self.adam = Adam(self.decisions.allowed.shape, self.config.lr)
        self.rng = np.random.default_rng(seed)
        # init='probe': candidate homes, asked first, then the best is the start
        self.probe = start_probe(space, cfg.fill_fraction, cfg.probe_margin) if cfg.init == "probe" else None
        self.start_name = {"uniform": "uniform", "speed": "fastest", "memory": "fill"}.get(cfg.init, "fill")
        self.start_step_time: float | None = None  # the probe's chosen start's step time (None: not probed)
        self.samples_seen = 0
        self.recent_placements: list[np.ndarray] = []  # since the last CE step
        self.recent_scores: list[np.ndarray] = []
        self.recent_feasible: list[np.ndarray] = []
        self._pending_log_prob: np.ndarray | None = None
        self._pending_decisions: np.ndarray | None = None
        self._pending_local = 0  # the last ask's local moves, at the end of its batch
        self.own_in_last_ask = 0  # how many of the last ask's placements the policy drew (the rest: local moves)
        self.last_origins: list[str] | None = None  # the last ask's origins (probe, policy, local)

    def _decisions_of(self, placements: np.ndarray) -> np.ndarray:
        """The decisions behind unit placements: themselves, or each layer's stripe (the ones drawn by
        the last ask, else the nearest, :meth:`LayerSpace.collapse`)."""
        if self.layers is None:
            return placements
        pending, self._pending_decisions = self._pending_decisions, None
        if pending is not None and np.array_equal(self.layers.expand(pending), placements):
            return pending
        return self.layers.collapse(placements)

    # ---------------------------------------------------------------------------- ask / tell
    def ask(self, max_n: int) -> np.ndarray:
        """The probe's candidate homes first, then up to ``batch_size`` samples of the policy (:meth:`Strategy.ask`).

        A batch never crosses a cross-entropy boundary.
        """
        if self.probe is not None and (first := self.probe.ask(max_n)) is not None:
            self.own_in_last_ask = len(first)
            self.last_origins = self.probe.last_origins
            return first  # init='probe': the candidate homes first
        # never cross a CE boundary inside one batch
        to_boundary = self.config.ce_every - self.samples_seen % self.config.ce_every
        k = max(1, min(self.config.batch_size, max_n, to_boundary))
        local = None
        if self.config.use_local:
            local = self.local.moves(
                self._local_share(k), self.policy.probs(), self.rng, self.samples_seen, self.config
            )
        n_local = 0 if local is None else len(local)
        decisions = self.policy.sample(self.rng, k - n_local)
        self._pending_local = n_local
        self._pending_decisions = decisions
        self._pending_log_prob = self.policy.log_prob(decisions)  # of the policy's own samples only
        self.own_in_last_ask = k - n_local
        self.last_origins = ["policy"] * (k - n_local) + ["local"] * n_local
        placements = decisions if self.layers is None else self.layers.expand(decisions)
        return np.concatenate([placements, local]) if n_local else placements

    def _local_share(self, k: int) -> int:
        """Local moves wanted in a batch of ``k``: ``local_fraction`` of it, leaving the policy one."""
        if self.samples_seen < self.config.local_after:
            return 0
        return min(k - 1, int(round(self.config.local_fraction * k)))

    def tell(
        self, placements: np.ndarray, step_time: np.ndarray, feasible: np.ndarray, overflow: np.ndarray | None = None
    ) -> None:
        """Learn from a batch: a cross-entropy step at every ``ce_every`` samples, else PPO (:meth:`Strategy.tell`).

        The probe's candidate homes, when told, only choose the start.
        """
        cfg = self.config
        score = scores(
            np.asarray(step_time, dtype=np.float64),
            np.asarray(feasible),
            self.space.failure_step_time,
            overflow,
            self.space.overflow_scale,
        )
        feasible = np.asarray(feasible, dtype=bool)
        raw = np.asarray(placements)
        own = len(raw) - self._pending_local  # the policy's own samples come first, then the local moves
        self.local.tell(raw, score)
        if self.probe is not None and self.probe.tell(raw, score, np.asarray(step_time), feasible):
            self._tell_candidates(self._decisions_of(raw), score, feasible)
            return
        old_log_prob = self._pending_log_prob
        if old_log_prob is None or len(old_log_prob) != own:  # not what the last ask drew: all the policy's
            own = len(raw)
        decisions = self._decisions_of(raw[:own])  # local moves need none: only the incumbent learns from them
        if old_log_prob is None or len(old_log_prob) != own:
            old_log_prob = self.policy.log_prob(decisions)
        self._pending_log_prob, self._pending_local = None, 0
        self.samples_seen += len(raw)
        # the elite and PPO fit the policy's own samples; local moves only move the incumbent
        self.recent_placements.append(decisions)
        self.recent_scores.append(score[:own])
        self.recent_feasible.append(feasible[:own])
        extra = None
        if (cfg.elite_local or cfg.ppo_local) and own < len(raw):
            moved = self._decisions_of(raw[own:])
            # a unit move on layers is no stripe per layer: its score belongs to no decisions, keep it out
            exact = np.ones(len(moved), dtype=bool)
            if self.layers is not None:
                exact = (self.layers.expand(moved) == raw[own:]).all(axis=1)
            moved, moved_score = moved[exact], score[own:][exact]
            if cfg.elite_local:
                self.recent_placements.append(moved)
                self.recent_scores.append(moved_score)
                self.recent_feasible.append(feasible[own:][exact])
            if cfg.ppo_local:
                extra = (moved, normalized_advantage(-np.sqrt(moved_score)), self.policy.log_prob(moved))
        if cfg.use_ce and self.samples_seen % cfg.ce_every == 0:
            self._cross_entropy_step()
        elif cfg.use_ppo:
            self._ppo_step(decisions, score[:own], old_log_prob, extra)
        if not cfg.use_ce and self.samples_seen % cfg.ce_every == 0:
            self._forget_recent()

    def _tell_candidates(self, placements: np.ndarray, score: np.ndarray, feasible: np.ndarray) -> None:
        """The probe's candidates count as samples; once all are told, start from the probe's choice."""
        self.samples_seen += len(placements)  # probes are samples: the CE step still comes every N samples
        self.recent_placements.append(placements)  # they may still be elite in the first CE step
        self.recent_scores.append(score)
        self.recent_feasible.append(feasible)
        if self.probe.done:
            self._start_from_probe()

    def _start_from_probe(self) -> None:
        cfg, probe = self.config, self.probe
        self.start_name, self.start_step_time = probe.name, probe.step_time
        weight = start_weight(
            self.start_name, self.decisions.num_units, cfg.anchor_weight, cfg.partition_units, cfg.stripe_units
        )
        home = probe.home if self.layers is None else self.layers.collapse(probe.home)
        prior = anchored_prior(self.decisions, home, weight)
        self.policy.logits = CategoricalPolicy(self.decisions.allowed, prior).logits

    def _ppo_step(self, placements: np.ndarray, score: np.ndarray, old_log_prob: np.ndarray, extra=None) -> None:
        advantage = normalized_advantage(-np.sqrt(score))
        if extra is not None and len(extra[0]):
            placements = np.concatenate([placements, extra[0]])
            advantage = np.concatenate([advantage, extra[1]])
            old_log_prob = np.concatenate([old_log_prob, extra[2]])
        if not advantage.any():
            return
        for _ in range(self.config.ppo_epochs):
            grad = ppo_gradient(self.policy, placements, old_log_prob, advantage, self.config.clip)
            self.policy.logits = self.adam.step(self.policy.logits, grad)

    def _cross_entropy_step(self) -> None:
        placements = np.concatenate(self.recent_placements)
        score = np.concatenate(self.recent_scores)
        feasible = np.concatenate(self.recent_feasible)
        self._forget_recent()
        ok = np.flatnonzero(feasible)
        if ok.size == 0:
            if np.ptp(score) <= 0:
                return  # nothing feasible, and nothing tells the samples apart: nothing to fit
            ok = np.arange(len(score))  # nothing feasible: the least-overflowing samples are the elite
        n_elite = max(1, int(np.floor(self.config.elite_fraction * ok.size)))
        elite = ok[np.argsort(score[ok], kind="stable")[:n_elite]]
        cross_entropy_update(self.policy, placements[elite], self.eps)
        self.adam.reset(self.policy.logits.shape)

    @property
    def eps(self) -> float:
        """The uniform weight of the cross-entropy step: ``eps``, else ``min(eps_cap, eps_units / G)``."""
        cfg = self.config
        return cfg.eps if cfg.eps is not None else min(cfg.eps_cap, cfg.eps_units / self.decisions.num_units)

    def _forget_recent(self) -> None:
        self.recent_placements, self.recent_scores, self.recent_feasible = [], [], []

    # ---------------------------------------------------------------------------- state
    def state_dict(self) -> dict:
        """The policy's logits, Adam's moments, the random generator and the samples since the last CE step."""
        return {
            "name": self.name,
            "config": asdict(self.config),
            "logits": self.policy.logits.copy(),
            "adam": self.adam.state_dict(),
            "rng": rng_state(self.rng),
            "samples_seen": self.samples_seen,
            **self.local.state_dict(),  # "best": the incumbent, "seen": the placements told
            "start": start_state(self.probe, self.start_name, self.start_step_time),
            "recent": [
                list(map(np.copy, x)) for x in (self.recent_placements, self.recent_scores, self.recent_feasible)
            ],
        }

    def load_state_dict(self, state: dict) -> None:
        """Restore a state :meth:`state_dict` returned."""
        self.config = replace(self.config, **state["config"])
        self.policy.logits = state["logits"].copy()
        self.adam.load_state_dict(state["adam"])
        self.rng = rng_from_state(state["rng"])
        self.samples_seen = int(state["samples_seen"])
        start = state.get("start", {"scores": [], "out": 0, "name": self.start_name})
        cfg = self.config
        if cfg.init == "probe":
            self.probe = self.probe or start_probe(self.space, cfg.fill_fraction, cfg.probe_margin)
            self.probe.load_state_dict(start)
        else:
            self.probe = None
        self.start_name = start["name"]
        self.start_step_time = start.get("step_time")
        self.recent_placements, self.recent_scores, self.recent_feasible = _checked_recent(
            state["recent"], self.policy.allowed
        )
        self._pending_log_prob = None
        self._pending_decisions = None
        self._pending_local = 0
        self.local.load_state_dict(state)
        self.last_origins = None


def start_probe(space: SearchSpace, fill_fraction: float, probe_margin: float) -> StartProbe:
    """The probe of ``init="probe"`` over ``space``: its candidate homes, or on layers the layer starts
    (:func:`postplace.search.layers.layer_candidates`). Every strategy given Post's start uses it."""
    starts = None if space.layers is None else layer_candidates(space, fill_fraction)
    return StartProbe(space, fill_fraction, probe_margin, candidates=starts)


def start_weight(name: str, num_units: int, anchor_weight: float, partition_units: float, stripe_units: float) -> float:
    """The prior probability on each decision's home for the start ``name``: ``anchor_weight``; for a
    METIS partition ``1 - min(0.5, partition_units / G)`` (about ``partition_units`` decisions per sample
    elsewhere); for a layer stripe the same with ``stripe_units``."""
    if name.startswith(("part", "stripe")):
        units = stripe_units if name.startswith("stripe") else partition_units
        return 1 - min(0.5, units / max(num_units, 1))
    return anchor_weight


def start_state(probe: StartProbe | None, name: str | None, step_time: float | None) -> dict:
    """The ``start`` entry of a strategy's state: the probe's scores and step times (none without a
    probe), the start's name and its step time."""
    return {
        **(probe.state_dict() if probe is not None else {"scores": [], "out": 0}),
        "name": name,
        "step_time": step_time,
    }


def _checked_recent(recent, allowed: np.ndarray) -> tuple[list, list, list]:
    """The samples since the last CE step from a saved state, checked: decisions (ints, one per
    decision, each allowed), scores (floats) and feasibility (bools) of the same counts; else ValueError."""
    placements, score, feasible = (list(x) for x in recent)
    if not len(placements) == len(score) == len(feasible):
        raise ValueError("its recent samples, scores and feasibility differ in number")
    G = allowed.shape[0]
    for p, sc, f in zip(placements, score, feasible, strict=True):
        p, sc, f = np.asarray(p), np.asarray(sc), np.asarray(f)
        if p.dtype.kind not in "iu" or p.ndim != 2 or p.shape[1] != G or ((p < 0) | (p >= allowed.shape[1])).any():
            raise ValueError(f"its recent samples are not {G} decision ids each")
        if not allowed[np.arange(G)[None, :], p].all():
            raise ValueError("its recent samples put decisions where they may not go")
        if sc.dtype.kind != "f" or sc.shape != (len(p),) or f.dtype.kind != "b" or f.shape != (len(p),):
            raise ValueError("its recent scores or feasibility do not match its samples")
    return placements, score, feasible


def _start_logits(space: SearchSpace, cfg: PostConfig) -> np.ndarray | None:
    """The policy's first logits (before a probe): :func:`initial_logits`, or on layers the same homes
    found over whole layers on devices (:func:`postplace.search.layers.device_space`), as r = 1 stripes."""
    if space.layers is None:
        return initial_logits(space, cfg.init, cfg.anchor_weight, cfg.fill_fraction)
    if cfg.init == "uniform" or space.unit_time is None:
        return None
    fill = None if cfg.init == "speed" else cfg.fill_fraction
    return anchored_prior(action_space(space), home_devices(device_space(space), fill), cfg.anchor_weight)


@register_strategy("ce", config=PostConfig, rank=20)
def ce_strategy(space: SearchSpace, *, seed: int = 0, config: PostConfig | None = None) -> PostStrategy:
    """The cross-entropy method alone (Post without PPO)."""
    s = PostStrategy(space, seed=seed, config=replace(config or PostConfig(), use_ppo=False))
    s.name = "ce"
    return s


@register_strategy("ppo", config=PostConfig, rank=30)
def ppo_strategy(space: SearchSpace, *, seed: int = 0, config: PostConfig | None = None) -> PostStrategy:
    """PPO alone (Post without cross-entropy steps)."""
    s = PostStrategy(space, seed=seed, config=replace(config or PostConfig(), use_ce=False))
    s.name = "ppo"
    return s


def local_config(config: PostConfig | None = None) -> PostConfig:
    """``config`` (default Post's) as the ``local`` strategy runs it: no cross-entropy, no PPO, local moves on."""
    return replace(config or PostConfig(), use_ce=False, use_ppo=False, use_local=True)


@register_strategy("local", config=local_config, rank=90)
class LocalStrategy(PostStrategy):
    """``local``: local moves alone from Post's start, a rival of its own (issue 32).

    Post's probe and start, then every batch is local moves of the incumbent
    (:meth:`postplace.search.local.LocalMoves.moves`), the values drawn from the start's prior, which
    nothing ever updates (no cross-entropy step, no PPO): the moves Post makes at its start, and none of
    its learning. A slot no new move fills (the incumbent's neighbourhood spent) is a sample of that
    prior (origin ``policy``).

    Parameters
    ----------
    space : SearchSpace
    seed : int
    config : PostConfig, optional
        Its start and move settings; the learning switches are off and ``use_local`` on whatever it says.

    Examples
    --------
    >>> import numpy as np
    >>> from postplace.search import SearchSpace, make_strategy
    >>> space = SearchSpace(np.ones((4, 3), dtype=bool), failure_step_time=10.0)
    >>> s = make_strategy("local", space, seed=0)
    >>> p = s.ask(8); s.tell(p, np.arange(len(p), dtype=float) + 1, np.ones(len(p), dtype=bool))
    >>> s.ask(8).shape, s.last_origins.count("local")
    ((8, 4), 8)
    """

    name = "local"

    def __init__(self, space: SearchSpace, *, seed: int = 0, config: PostConfig | None = None):
        super().__init__(space, seed=seed, config=local_config(config))

    def _local_share(self, k: int) -> int:
        return k


LEARNING = ("use_ce", "use_ppo", "use_local")
"""Post's learning steps, each a boolean of :class:`PostConfig` (those it has): all off in ``post-start``."""


def learning_off(config: PostConfig) -> PostConfig:
    """``config`` with every learning step of :data:`LEARNING` that :class:`PostConfig` has switched off.

    Parameters
    ----------
    config : PostConfig

    Returns
    -------
    PostConfig
        The same start and sampling, no cross-entropy, PPO or local step.
    """
    names = {f.name for f in fields(PostConfig)}
    return replace(config, **{k: False for k in LEARNING if k in names})


@register_strategy("post-start", config=lambda: learning_off(PostConfig()), rank=40)
def post_start_strategy(space: SearchSpace, *, seed: int = 0, config: PostConfig | None = None) -> PostStrategy:
    """Post's start alone (``post-start``): Post with every learning step switched off.

    With ``config`` (default ``PostConfig()``: the probe start) otherwise, so its policy stays the
    start's prior and it samples that prior only: the row that says how much learning adds to the start.

    Parameters
    ----------
    space : SearchSpace
    seed : int
    config : PostConfig, optional
        Its learning switches are turned off whatever they say.

    Returns
    -------
    PostStrategy
        Named ``post-start``.
    """
    s = PostStrategy(space, seed=seed, config=learning_off(config or PostConfig()))
    s.name = "post-start"
    return s


# Named starts (postplace.search.VARIANTS): -paper is the paper's uniform start and algorithm (no local
# moves); -probe Post's probe start (postplace.search.start_prior) without local moves.
register_variant("post-paper", "post", rank=10, init="uniform", use_local=False)
register_variant("ce-paper", "ce", rank=20, init="uniform", use_local=False)
register_variant("ppo-paper", "ppo", rank=30, init="uniform", use_local=False)
register_variant("post-probe", "post", rank=50, use_local=False)
register_variant("ce-probe", "ce", rank=60, use_local=False)
register_variant("ppo-probe", "ppo", rank=70, use_local=False)
