"""The Hierarchical Planner: a grouper and a seq2seq placer trained jointly with REINFORCE.

Source: Mirhoseini, Goldie, Pham, Steiner, Le, Dean, "A Hierarchical Model for Device Placement",
ICLR 2018. The baseline Post is measured against (DESIGN.md section 5).

The model, as the paper describes it:

- **Grouper**: a feed-forward network over per-op features with a softmax over groups; each op (here:
  each unit of the :class:`SearchSpace`) samples its group.
- **Placer**: a sequence-to-sequence model, an LSTM encoder that reads the group embeddings and an LSTM
  decoder with attention that outputs one device per group. A unit goes on its group's device.
- **Training**: both policies by REINFORCE on the joint log-likelihood, reward ``R = -sqrt(step time)``,
  a moving-average baseline ``B``, and OOM (here: any infeasible placement) scored as a failing runtime
  (ours: raised by how far the placement overflows memory when the runner says, as for every strategy,
  :func:`postplace.search.strategy.scores`; the paper's learned placer has no prior to start from,
  so Post's memory-aware start does not apply to it by default: ``init="none"``).
  Per update the paper draws m = 1 grouping and k = 4 placements for it (its Eqs. 4 and 6): the
  grouper's gradient is ``mean_i grad log p(g_i) * mean_j (R_ij - B)``, the placer's
  ``mean_ij grad log p(d_ij | g_i) * (R_ij - B)``.
- **Settings** it reports: Adam, learning rate 0.1, gradient clipping at norm 1.0, logits shaped as
  ``C * tanh(u / T)`` (Bello et al. 2016) with tanh constant C = 5 and temperature T = 10, m = 1 and
  k = 4, noise added to the logits early in training to explore (magnitude and schedule not given).
  256 groups (its best setting), grouper hidden size 64, placer LSTM size 256.

Where the paper is silent, what we chose (each is a :class:`HierarchicalConfig` field):

- **Unit features**: the paper embeds op type, output shapes and adjacency of TensorFlow ops. Units are
  groups of ops here, so we use ``space.features`` when given, else :func:`default_features` (relative
  time per device, allowed devices, degrees and bytes in/out, position). Columns are standardised.
- **Group embedding**: the mean of its members' features, the log of its size, and (as the paper's
  group adjacency vector) the fractions of its outgoing and incoming bytes to every group.
- **Attention**: multiplicative content-based ("general", Luong et al. 2015) rather than additive, so the
  teacher-forced replay of a whole sequence costs one matrix product. Unidirectional encoder.
- **Decoder input** at step j: the embedding of the device chosen at step j-1 (a start token first) and
  the encoder state of group j, so the decoder knows which group it places.
- **Logit shaping** ``C tanh(u/T)`` on the grouper's logits as well as the placer's (the paper names it
  for its policies without saying which). Noise: Gaussian, std ``noise_std`` on the shaped logits,
  falling linearly to 0 over the first ``noise_updates`` updates.
- **Baseline**: exponential moving average of batch-mean rewards, decay 0.9, started at the first
  batch's mean.
- **Placements told without an ask** (a warm start): they count for ``best`` and start the
  baseline, but give no gradient step (there is no sampled grouping to follow). After an ask, ``tell``
  must get exactly the asked placements back.
- **Devices a unit may not use**: the placer only offers a group the devices all its members may use
  (the intersection; their union when that is empty); a unit whose group lands on a device it may not
  use goes to its own fastest allowed device instead (by ``unit_time``, else its first allowed). So no
  disallowed device is ever returned. Empty groups are decoded (the sequence has fixed length) but
  their device choices, which change nothing, are left out of the loss.

Measured (``benchmarks/hp_learning.py``: a 256-unit layered DAG on ``k80x2``, 1,200 samples, 2-3 seeds,
step time / lower bound): with the paper's learning rate 0.1 the policy turns near-deterministic within
about 10 updates, on the single-GPU placement (2.21), keeping the best of its early samples (1.66);
lr 0.01 gets to 1.42 and lr 0.001 to 1.11 (simulated annealing: 1.20, random search: 2.51). The
``paper`` settings stay the default here, as the baseline the paper defines; a tuned rate belongs to
the recorded sweep on the zoo models (DESIGN.md section 4).

**The probe start** (``init="probe"``, the ``hp-probe`` strategy; ours, for issue 20's comparison from
the same start): the first samples are Post's candidate starts (:class:`postplace.search.starts.StartProbe`,
the same candidates and the same choice as Post's), told without a gradient step (they count for ``best``
only). Then the placer's device logits get a fixed bias towards the chosen start: Post's anchored prior on
it (:func:`postplace.search.start_prior.start_prior`, probabilities ``[G, D]``), per group the mean over
its members, and the log of that added to the shaped logits ``C tanh(u / T)`` (before the noise and the
mask) at every decoder step, in ``ask`` and in the replay alike. Why a bias on the output and not a
placer trained to imitate the start: it makes the first samples come from (about) the start's distribution
at once, costs no samples, and leaves the networks and their REINFORCE updates as the paper's; the shaped
logits span ``2 C = 10``, so the placer can still learn its way off the start. A group whose members share
a home leans to it as a unit does under Post's prior; a mixed group leans to its members' homes in
proportion (the grouper starts random, so early groups mix).

The model lives in PyTorch on the CPU. Sampling happens in :meth:`HierarchicalPlanner.ask` without
gradients (the decoder steps one group at a time); :meth:`tell` replays the sampled sequence with
teacher forcing (the noise drawn at ``ask`` is kept) to get the log-likelihood with gradients.
"""

from __future__ import annotations

import contextlib
import copy
import warnings
from dataclasses import asdict, dataclass, replace

import numpy as np
import torch
from torch import nn

from postplace.search.local import LocalSettings
from postplace.search.ranges import ranged
from postplace.search.start_prior import make_probe, start_prior, start_state
from postplace.search.strategy import SearchSpace, rng_from_state, rng_state, scores


@dataclass(frozen=True)
class HierarchicalConfig(LocalSettings):
    """The hierarchical planner's settings; each field's range (``ranged``) is checked by
    :func:`postplace.search.config.build_config`, and its reason is in the field's docstring. The
    local-move add-on's fields (:class:`postplace.search.local.LocalSettings`) are off by default."""

    num_groups: int = ranged(256, "[1, inf)", "groups the grouper may use")
    """Groups the grouper may use, at most the number of units (paper: 256 worked best). At least 1;
    more than the units are cut to their number."""
    grouper_hidden: int = ranged(64, "[1, inf)", "hidden size of the grouper")
    """Hidden size of the grouper's one hidden layer (paper: 64). Activation ReLU (ours; unstated).
    At least 1, as every layer size."""
    placer_hidden: int = ranged(256, "[1, inf)", "LSTM size of the placer")
    """LSTM size of the placer's encoder and decoder (paper: 256). At least 1."""
    device_embedding: int = ranged(32, "[1, inf)", "size of the decoder's device embedding")
    """Size of the decoder's embedding of the previous device (ours; unstated). At least 1."""
    lr: float = ranged(0.1, "(0, inf)", "Adam learning rate")
    """Adam learning rate for both policies (paper: 0.1). Above 0: at 0 nothing is learned."""
    grad_clip: float = ranged(1.0, "(0, inf)", "largest global gradient norm")
    """Clip the global gradient norm to this (paper: 1.0). Above 0: a norm of 0 zeroes every step."""
    tanh_constant: float = ranged(5.0, "(0, inf)", "C in C tanh(u / T) on the logits")
    """C in C * tanh(u / T) on the logits (paper: 5.0, after Bello et al. 2016). Above 0: at 0 every
    logit is 0 and the policies stay uniform."""
    temperature: float = ranged(10.0, "(0, inf)", "T in C tanh(u / T) on the logits")
    """T in C * tanh(u / T) on the logits (paper: 10.0). Above 0: the logits are divided by T."""
    shape_grouper_logits: bool = True
    """Apply C tanh(u/T) to the grouper as well as the placer (ours: the paper does not say which)."""
    groupings_per_ask: int = ranged(1, "[1, inf)", "groupings sampled per update")
    """m: groupings sampled per update (paper: m = 1, its Eq. 4). At least 1."""
    placements_per_grouping: int = ranged(4, "[1, inf)", "placer samples per grouping")
    """k: placer samples per grouping (paper: k = 4, its Eq. 6). An ask returns m * k placements. At
    least 1."""
    baseline_decay: float = ranged(0.9, "[0, 1)", "weight of the old baseline in its moving average")
    """B <- decay * B + (1 - decay) * mean reward of the batch (ours; the paper says moving average).
    In [0, 1): an average only for decay in [0, 1], and at 1 the baseline never moves."""
    noise_std: float = ranged(0.5, "[0, inf)", "std of the noise on the logits at the start")
    """Std of Gaussian noise on the shaped logits at the start (ours; the paper adds noise early on
    without a magnitude). At least 0 (0: no noise)."""
    noise_updates: int = ranged(100, "[0, inf)", "updates over which the noise falls to zero")
    """Updates over which the noise falls linearly to zero (ours: 400 samples at m*k = 4, a sixth of
    Post's 2,400-sample budget). At least 0 (0: no noise)."""
    group_adjacency: bool = True
    """Put the group's byte fractions to and from every group in its embedding (paper: an adjacency
    vector per group)."""
    init: str = ranged("none", why="start of the placer", choices=("none", "probe"))
    """'none' (the paper: the placer starts from its random weights) or 'probe': Post's candidate
    starts are asked first, and the placer's device logits then carry a fixed bias towards the one Post
    would choose (the log of Post's anchored prior on it, averaged over each group's members; see the
    module docstring), so hp learns from the same start as Post (the ``hp-probe`` strategy)."""

    @classmethod
    def paper(cls) -> HierarchicalConfig:
        """The settings the paper reports (equal to the defaults)."""
        return cls()


def default_features(space: SearchSpace) -> np.ndarray:
    """Per-unit features when the space has none: ``float[G, 2D + 6]``.

    Columns: position in unit order (0..1); per device the log of its time relative to the unit's
    fastest allowed device (capped at 5, and 5 where not allowed); per device 1 if allowed; the log of
    the unit's fastest time over the mean of those; log1p of in- and out-degree; log1p of bytes in and
    out over the mean bytes per edge. Without ``unit_time`` the time columns are 0; without ``edges``
    the degree columns are.
    """
    allowed = np.asarray(space.allowed, dtype=bool)
    G, D = allowed.shape
    pos = np.arange(G, dtype=np.float64)[:, None] / max(G - 1, 1)
    rel = np.zeros((G, D))
    fastest = np.zeros((G, 1))
    if space.unit_time is not None:
        t = np.where(allowed, np.asarray(space.unit_time, dtype=np.float64), np.inf)
        t = np.where(np.isfinite(t), t, np.inf)
        tmin = np.min(t, axis=1, keepdims=True)
        tiny = 1e-30
        with np.errstate(divide="ignore", invalid="ignore"):
            rel = np.log(np.maximum(t, tiny) / np.maximum(tmin, tiny))
        rel = np.where(np.isfinite(rel), np.minimum(rel, 5.0), 5.0)
        finite_min = np.where(np.isfinite(tmin), tmin, 0.0)
        fastest = np.log(np.maximum(finite_min, tiny) / max(float(finite_min.mean()), tiny))
    deg = np.zeros((G, 4))
    if space.edges is not None and len(space.edges[0]):
        src, dst, nbytes = (np.asarray(a) for a in space.edges)
        scale = max(float(np.mean(nbytes)), 1e-30)
        deg[:, 0] = np.log1p(np.bincount(dst, minlength=G))
        deg[:, 1] = np.log1p(np.bincount(src, minlength=G))
        deg[:, 2] = np.log1p(np.bincount(dst, weights=nbytes, minlength=G) / scale)
        deg[:, 3] = np.log1p(np.bincount(src, weights=nbytes, minlength=G) / scale)
    return np.concatenate([pos, rel, allowed.astype(np.float64), fastest, deg], axis=1)


def _standardise(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, dtype=np.float64)
    sd = x.std(axis=0)
    return np.where(sd > 1e-12, (x - x.mean(axis=0)) / np.where(sd > 1e-12, sd, 1.0), 0.0)


class _Model(nn.Module):
    """Grouper (feed-forward) and placer (LSTM encoder, LSTM decoder with attention) in one module."""

    def __init__(self, num_features: int, group_input: int, num_groups: int, num_devices: int, cfg: HierarchicalConfig):
        super().__init__()
        H = cfg.placer_hidden
        self.grouper = nn.Sequential(
            nn.Linear(num_features, cfg.grouper_hidden), nn.ReLU(), nn.Linear(cfg.grouper_hidden, num_groups)
        )
        self.encoder = nn.LSTM(group_input, H, batch_first=True)
        self.device_embed = nn.Embedding(num_devices + 1, cfg.device_embedding)  # last row: start token
        self.decoder = nn.LSTM(cfg.device_embedding + H, H, batch_first=True)
        self.attend = nn.Linear(H, H, bias=False)
        self.head = nn.Linear(2 * H, num_devices)

    def device_logits(self, dec: torch.Tensor, keys: torch.Tensor, enc: torch.Tensor) -> torch.Tensor:
        """Raw device logits ``[B, L, D]`` for decoder outputs ``dec [B, L, H]`` attending over ``enc``."""
        att = torch.softmax(dec @ keys.transpose(1, 2), dim=-1)  # [B, L, NG]
        return self.head(torch.cat([dec, att @ enc], dim=-1))


class HierarchicalPlanner:
    """The Hierarchical Planner (Mirhoseini et al., ICLR 2018) as an ask/tell strategy.

    Each ask returns ``m * k`` placements (``groupings_per_ask * placements_per_grouping``; fewer only
    if ``max_n`` is smaller, which then shrinks k, then m); each tell makes one REINFORCE update.
    ``best`` / ``best_score`` hold the best feasible placement seen. ``start_name`` and
    ``start_step_time``: with ``init="probe"`` the probe's chosen start and its step time once its
    candidates are told; else ``"none"`` and None.
    """

    name = "hp"

    def __init__(self, space: SearchSpace, *, seed: int = 0, config: HierarchicalConfig | None = None):
        self.space = space
        self.config = cfg = config or HierarchicalConfig()
        self.allowed = np.asarray(space.allowed, dtype=bool)
        G, D = self.allowed.shape
        self.num_groups = NG = max(1, min(cfg.num_groups, G))
        feats = space.features if space.features is not None else default_features(space)
        self.features = torch.tensor(_standardise(feats), dtype=torch.float32)
        if space.unit_time is not None:
            t = np.where(self.allowed, np.asarray(space.unit_time, dtype=np.float64), np.inf)
            self.fallback = np.where(np.any(np.isfinite(t), axis=1), np.argmin(t, axis=1), self.allowed.argmax(1))
        else:
            self.fallback = self.allowed.argmax(axis=1)
        self._allowed_t = torch.tensor(self.allowed, dtype=torch.float32)
        self._edges = None
        if cfg.group_adjacency and space.edges is not None and len(space.edges[0]):
            src, dst, nbytes = (np.asarray(a) for a in space.edges)
            self._edges = (
                torch.tensor(src, dtype=torch.long),
                torch.tensor(dst, dtype=torch.long),
                torch.tensor(nbytes / max(float(nbytes.sum()), 1e-30), dtype=torch.float32),
            )
        group_input = self.features.shape[1] + 1 + (2 * NG if cfg.group_adjacency else 0)

        self.rng = np.random.default_rng(seed)
        init_seed, gen_seed = (int(s) for s in self.rng.integers(2**62, size=2))
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(init_seed)
            self.model = _Model(self.features.shape[1], group_input, NG, D, cfg)
        self.gen = torch.Generator().manual_seed(gen_seed)
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=cfg.lr)
        self.baseline: float | None = None
        self.updates = 0
        self.skipped_updates = 0
        self.best: np.ndarray | None = None
        self.best_score = np.inf
        self._pending: dict | None = None
        # init='probe': Post's candidate starts, asked first; then a fixed bias towards the chosen one
        self.probe = make_probe(space) if cfg.init == "probe" else None
        self.start_name: str | None = "none"
        self.start_step_time: float | None = None
        self._start_prob: torch.Tensor | None = None  # [G, D]: Post's prior on the start, once chosen
        self.last_origins: list[str] | None = None  # the last ask's, when not all the placer's

    # ------------------------------------------------------------------------------ model pieces
    def _shape(self, logits: torch.Tensor) -> torch.Tensor:
        c = self.config
        return c.tanh_constant * torch.tanh(logits / c.temperature)

    def _noise_std(self) -> float:
        c = self.config
        if c.noise_updates <= 0:
            return 0.0
        return c.noise_std * max(0.0, 1.0 - self.updates / c.noise_updates)

    def _group_logits(self) -> torch.Tensor:
        logits = self.model.grouper(self.features)  # [G, NG]
        return self._shape(logits) if self.config.shape_grouper_logits else logits

    def _group_inputs(self, groups: torch.Tensor):
        """Embeddings ``[m, NG, E]``, device masks ``[m, NG, D]`` and non-empty flags ``[m, NG]``."""
        NG, G = self.num_groups, self.allowed.shape[0]
        A = nn.functional.one_hot(groups, NG).float()  # [m, G, NG]
        count = A.sum(dim=1)  # [m, NG]
        mean = A.transpose(1, 2) @ self.features / count.clamp(min=1)[..., None]
        parts = [mean, (torch.log1p(count) / np.log1p(G))[..., None]]
        if self.config.group_adjacency:
            flow = torch.zeros(groups.shape[0], NG, NG)
            if self._edges is not None:
                src, dst, w = self._edges
                flow = (A[:, src, :] * w[None, :, None]).transpose(1, 2) @ A[:, dst, :]  # [m, NG out, NG in]
            out = flow / flow.sum(dim=2, keepdim=True).clamp(min=1e-30)
            inc = flow.transpose(1, 2) / flow.sum(dim=1)[..., None].clamp(min=1e-30)
            parts += [out, inc]
        members_ok = A.transpose(1, 2) @ self._allowed_t  # [m, NG, D]: members that may use d
        inter = members_ok >= count[..., None] - 0.5
        union = members_ok > 0.5
        mask = torch.where(inter.any(dim=-1, keepdim=True), inter, union)
        nonempty = count > 0
        mask = mask | ~nonempty[..., None]
        return torch.cat(parts, dim=-1), mask, nonempty

    def _start_bias(self, groups: torch.Tensor) -> torch.Tensor | None:
        """With a probe start: ``[m, NG, D]``, the log of each group's members' mean start probability
        (0 for an empty group, whose choice changes nothing); None without one."""
        if self._start_prob is None:
            return None
        A = nn.functional.one_hot(groups, self.num_groups).float()  # [m, G, NG]
        count = A.sum(dim=1)  # [m, NG]
        mean = A.transpose(1, 2) @ self._start_prob / count.clamp(min=1)[..., None]
        bias = torch.log(mean.clamp(min=1e-30))
        return torch.where((count > 0)[..., None], bias, torch.zeros_like(bias))

    def _encode(self, groups: torch.Tensor, k: int):
        emb, mask, nonempty = self._group_inputs(groups)
        enc, (h, c) = self.model.encoder(emb)
        enc = enc.repeat_interleave(k, dim=0)
        state = (h.repeat_interleave(k, dim=1), c.repeat_interleave(k, dim=1))
        mask, nonempty = mask.repeat_interleave(k, dim=0), nonempty.repeat_interleave(k, dim=0)
        bias = self._start_bias(groups)
        bias = None if bias is None else bias.repeat_interleave(k, dim=0)
        return enc, self.model.attend(enc), state, mask, nonempty, bias

    def _expand(self, groups: np.ndarray, devices: np.ndarray, k: int) -> np.ndarray:
        """Unit placements ``[m*k, G]`` from groupings ``[m, G]`` and group devices ``[m*k, NG]``."""
        g = np.repeat(groups, k, axis=0)
        unit = np.take_along_axis(devices, g, axis=1)
        ok = self.allowed[np.arange(unit.shape[1])[None, :], unit]
        return np.where(ok, unit, self.fallback[None, :]).astype(np.int64)

    # ------------------------------------------------------------------------------ ask / tell
    def ask(self, max_n: int) -> np.ndarray:
        """The probe's candidates first (``init="probe"``), then ``m * k`` samples of the planner."""
        self.last_origins = None  # the placer's
        if self.probe is not None and (first := self.probe.ask(max_n)) is not None:
            self.last_origins = self.probe.last_origins
            return first
        with _cpu_modes():
            return self._ask(max_n)

    def _ask(self, max_n: int) -> np.ndarray:
        c = self.config
        max_n = max(1, max_n)
        k = max(1, min(c.placements_per_grouping, max_n))
        m = max(1, min(c.groupings_per_ask, max_n // k))
        G, D = self.allowed.shape
        NG, sd = self.num_groups, self._noise_std()
        with torch.no_grad():
            # ALGO LOGIC: the grouper samples one group per unit, m times
            gnoise = sd * torch.randn(m, G, NG, generator=self.gen)
            gprob = torch.softmax(self._group_logits()[None] + gnoise, dim=-1)
            groups = torch.multinomial(gprob.reshape(m * G, NG), 1, generator=self.gen).reshape(m, G)
            logp_group = torch.log(gprob.gather(2, groups[..., None])[..., 0]).sum(dim=1)
            # ALGO LOGIC: the placer decodes one device per group, k times per grouping
            enc, keys, state, mask, nonempty, bias = self._encode(groups, k)
            logp_dev = torch.zeros(m * k)
            pnoise = sd * torch.randn(m * k, NG, D, generator=self.gen)
            prev = torch.full((m * k,), D, dtype=torch.long)
            devices = torch.empty(m * k, NG, dtype=torch.long)
            for j in range(NG):
                inp = torch.cat([self.model.device_embed(prev), enc[:, j]], dim=-1)[:, None]
                dec, state = self.model.decoder(inp, state)
                logits = self._shape(self.model.device_logits(dec, keys, enc)[:, 0]) + pnoise[:, j]
                if bias is not None:
                    logits = logits + bias[:, j]
                logits = logits.masked_fill(~mask[:, j], float("-inf"))
                prob = torch.softmax(logits, dim=-1)
                prev = torch.multinomial(prob, 1, generator=self.gen)[:, 0]
                devices[:, j] = prev
                logp_dev += torch.where(nonempty[:, j], torch.log(prob.gather(1, prev[:, None])[:, 0]), 0.0)
        groups_np, devices_np = groups.numpy().astype(np.int64), devices.numpy().astype(np.int64)
        placements = self._expand(groups_np, devices_np, k)
        self._pending = {
            "groups": groups_np,
            "devices": devices_np,
            "k": k,
            "gnoise": gnoise.numpy(),
            "pnoise": pnoise.numpy(),
            "placements": placements.copy(),
            "logp_group": logp_group.numpy(),
            "logp_devices": logp_dev.numpy(),
        }
        return placements

    def _log_probs(self, p: dict) -> tuple[torch.Tensor, torch.Tensor]:
        """Teacher-forced replay: log p(grouping) ``[m]`` and log p(devices | grouping) ``[m*k]``."""
        groups, devices = torch.as_tensor(p["groups"]), torch.as_tensor(p["devices"])
        D = self.allowed.shape[1]
        glog = torch.log_softmax(self._group_logits()[None] + torch.as_tensor(p["gnoise"]), dim=-1)
        logp_group = glog.gather(2, groups[..., None])[..., 0].sum(dim=1)
        enc, keys, state, mask, nonempty, bias = self._encode(groups, p["k"])
        start = torch.full((devices.shape[0], 1), D, dtype=torch.long)
        prev = torch.cat([start, devices[:, :-1]], dim=1)
        dec, _ = self.model.decoder(torch.cat([self.model.device_embed(prev), enc], dim=-1), state)
        logits = self._shape(self.model.device_logits(dec, keys, enc)) + torch.as_tensor(p["pnoise"])
        if bias is not None:
            logits = logits + bias
        dlog = torch.log_softmax(logits.masked_fill(~mask, float("-inf")), dim=-1)
        logp_dev = dlog.gather(2, devices[..., None])[..., 0]
        logp_dev = torch.where(nonempty, logp_dev, torch.zeros_like(logp_dev)).sum(dim=1)
        return logp_group, logp_dev

    def tell(
        self, placements: np.ndarray, step_time: np.ndarray, feasible: np.ndarray, overflow: np.ndarray | None = None
    ) -> None:
        """One REINFORCE update on the batch last asked; the probe's candidates, when told, only choose
        the start (and count for ``best``)."""
        if self.probe is not None and self._tell_candidates(placements, step_time, feasible, overflow):
            return
        with _cpu_modes():
            self._tell(placements, step_time, feasible, overflow)

    def _tell_candidates(self, placements, step_time, feasible, overflow) -> bool:
        placements = np.atleast_2d(np.asarray(placements, dtype=np.int64))
        feasible = np.asarray(feasible, dtype=bool)
        s = scores(
            np.asarray(step_time, dtype=np.float64),
            feasible,
            self.space.failure_step_time,
            overflow,
            self.space.overflow_scale,
        )
        if not self.probe.tell(placements, s, np.asarray(step_time, dtype=np.float64), feasible):
            return False
        for i in np.flatnonzero(feasible):
            if s[i] < self.best_score:
                self.best, self.best_score = placements[i].copy(), float(s[i])
        if self.probe.done:
            self._start_from_probe()
        return True

    def _start_from_probe(self) -> None:
        probe = self.probe
        self.start_name, self.start_step_time = probe.name, probe.step_time
        if probe.home is not None:
            prob = np.exp(start_prior(self.space, probe))
            self._start_prob = torch.tensor(np.where(self.allowed, prob, 0.0), dtype=torch.float32)

    def _tell(self, placements: np.ndarray, step_time: np.ndarray, feasible: np.ndarray, overflow=None) -> None:
        p = self._pending
        placements = np.atleast_2d(np.asarray(placements, dtype=np.int64))
        if p is not None and not (
            p["placements"].shape == placements.shape and np.array_equal(placements, p["placements"])
        ):
            raise ValueError("hp: tell() must get back exactly the placements of the last ask()")
        feasible = np.asarray(feasible, dtype=bool)
        s = scores(
            np.asarray(step_time, dtype=np.float64),
            feasible,
            self.space.failure_step_time,
            overflow,
            self.space.overflow_scale,
        )
        for i in np.flatnonzero(feasible):
            if s[i] < self.best_score:
                self.best, self.best_score = placements[i].copy(), float(s[i])
        if p is None:
            # placements told without an ask (a warm start): no log-likelihood to follow, so no gradient
            # step; they still count for the best and set the baseline when it has none yet
            if self.baseline is None:
                self.baseline = float((-np.sqrt(s)).mean())
            return
        # ALGO LOGIC: REINFORCE with a moving-average baseline (paper Eqs. 4 and 6)
        reward = -np.sqrt(s)
        if self.baseline is None:
            self.baseline = float(reward.mean())
        k = p["k"]
        adv = torch.as_tensor(reward - self.baseline, dtype=torch.float32).reshape(-1, k)  # [m, k]
        logp_group, logp_dev = self._log_probs(p)
        objective = (logp_group * adv.mean(dim=1)).mean() + (logp_dev.reshape(-1, k) * adv).mean()
        self.optimizer.zero_grad()
        (-objective).backward()
        norm = nn.utils.clip_grad_norm_(self.model.parameters(), self.config.grad_clip)
        if torch.isfinite(norm):  # a non-finite gradient would poison every weight: skip that update
            self.optimizer.step()
        else:
            self.skipped_updates += 1
        d = self.config.baseline_decay
        self.baseline = d * self.baseline + (1 - d) * float(reward.mean())
        self.updates += 1
        self._pending = None

    # ------------------------------------------------------------------------------ state
    def state_dict(self) -> dict:
        return {
            "name": self.name,
            "config": asdict(self.config),
            "rng": rng_state(self.rng),
            "torch_generator": self.gen.get_state().numpy().copy(),
            "model": _to_numpy(self.model.state_dict()),
            "optimizer": _to_numpy(self.optimizer.state_dict()),
            "baseline": self.baseline,
            "updates": self.updates,
            "skipped_updates": self.skipped_updates,
            "best": None if self.best is None else self.best.copy(),
            "best_score": self.best_score,
            "pending": copy.deepcopy(self._pending),
            "start": start_state(self.probe, self.start_name, self.start_step_time),
        }

    def load_state_dict(self, state: dict) -> None:
        cfg = replace(self.config, **state["config"])
        if cfg != self.config:
            self.__init__(self.space, config=cfg)  # rebuild the networks at the saved sizes
        self.rng = rng_from_state(state["rng"])
        self.gen.set_state(torch.as_tensor(np.asarray(state["torch_generator"], dtype=np.uint8)))
        self.model.load_state_dict(_to_torch(state["model"]))
        self.optimizer.load_state_dict(_to_torch(state["optimizer"]))
        self.baseline, self.updates = state["baseline"], int(state["updates"])
        self.skipped_updates = int(state.get("skipped_updates", 0))
        self.best = None if state["best"] is None else np.asarray(state["best"], dtype=np.int64)
        self.best_score = float(state["best_score"])
        self._pending = copy.deepcopy(state["pending"])
        start = state.get("start", {"scores": [], "out": 0, "name": self.start_name})
        self._start_prob = None
        if self.probe is not None:
            self.probe.load_state_dict(start)
            if self.probe.done:
                self._start_from_probe()  # the bias again, from the same candidates and scores
        self.start_name, self.start_step_time = start["name"], start.get("step_time")


def _to_numpy(tree):
    """A copy of a torch state dict with every tensor as a numpy array (run folders hold data, not pickles)."""
    if isinstance(tree, torch.Tensor):
        return tree.detach().cpu().numpy().copy()
    if isinstance(tree, dict):
        return {k: _to_numpy(v) for k, v in tree.items()}
    if isinstance(tree, list | tuple):
        return type(tree)(_to_numpy(v) for v in tree)
    return copy.deepcopy(tree)


def _to_torch(tree):
    """The inverse of :func:`_to_numpy` (arrays back to tensors; optimizer state keys back to ints)."""
    if isinstance(tree, np.ndarray):
        return torch.from_numpy(tree.copy())
    if isinstance(tree, dict):
        return {(int(k) if isinstance(k, str) and k.isdigit() else k): _to_torch(v) for k, v in tree.items()}
    if isinstance(tree, list | tuple):
        return type(tree)(_to_torch(v) for v in tree)
    return tree


@contextlib.contextmanager
def _cpu_modes():
    """The CPU modes hp's networks run under, for one ask or tell; the caller's are restored after.

    - Without oneDNN: its LSTM backward returned NaN gradients once the LSTM saturated (seen on NMT-2
      at the paper's learning rate 0.1); PyTorch's native kernels do not.
    - Denormal floats flushed to zero: the replay's gradients fill with denormals as the gates
      saturate, and the CPU then runs the native LSTM backward about 4x slower (Inception-V3 on
      ``k80x2``, one thread: a tell took 1.0 s, 0.25 s flushed). Values under 1.2e-38 change nothing
      a placement policy learns. PyTorch cannot tell whether flushing was on before, so it is turned
      off after, as it is by default.
    """
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # a note about Intel GPUs, irrelevant here
        flags = torch.backends.mkldnn.flags(enabled=False)
        flags.__enter__()
    flushed = torch.set_flush_denormal(True)
    try:
        yield
    finally:
        if flushed:
            torch.set_flush_denormal(False)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            flags.__exit__(None, None, None)
