"""A product of per-unit softmax distributions over devices, and the updates Post applies to it.

The policy has logits ``u[G, D]``; devices a unit may not use are masked out (probability exactly 0,
never sampled). Three updates act on it, each a small function so tests can check them one by one:
:func:`cross_entropy_update` (set the distribution to the elite's frequencies, mixed with uniform),
:func:`ppo_gradient` (the clipped surrogate's gradient) and :func:`reinforce_gradient`.
"""

from __future__ import annotations

import numpy as np

MASKED = -1e30  # logit of a device a unit may not use: exp() underflows to exactly 0


class CategoricalPolicy:
    def __init__(self, allowed: np.ndarray, logits: np.ndarray | None = None):
        self.allowed = np.asarray(allowed, dtype=bool)
        if not self.allowed.any(axis=1).all():
            raise ValueError("every unit needs at least one allowed device")
        base = np.zeros(self.allowed.shape) if logits is None else np.asarray(logits, dtype=np.float64)
        self.logits = np.where(self.allowed, base, MASKED)

    def probs(self) -> np.ndarray:
        z = self.logits - self.logits.max(axis=1, keepdims=True)
        e = np.where(self.allowed, np.exp(z), 0.0)
        return e / e.sum(axis=1, keepdims=True)

    def log_probs(self) -> np.ndarray:
        z = self.logits - self.logits.max(axis=1, keepdims=True)
        lse = np.log(np.where(self.allowed, np.exp(z), 0.0).sum(axis=1, keepdims=True))
        return np.where(self.allowed, z - lse, -np.inf)

    def sample(self, rng: np.random.Generator, k: int) -> np.ndarray:
        """``k`` placements ``[k, G]``; a zero-probability device is never drawn."""
        p = self.probs()
        cum = np.cumsum(p, axis=1)
        last = self.allowed.shape[1] - 1 - np.argmax(self.allowed[:, ::-1], axis=1)
        cum[np.arange(len(cum)), last] = 1.0  # guard rounding: the last allowed device closes at 1
        cum[np.arange(cum.shape[1])[None, :] > last[:, None]] = 1.0
        u = rng.random((k, cum.shape[0]))
        return np.argmax(u[:, :, None] < cum[None, :, :], axis=2).astype(np.int64)

    def log_prob(self, placements: np.ndarray) -> np.ndarray:
        """Log-probability of each placement under the current policy, ``[k]``."""
        lp = self.log_probs()
        return lp[np.arange(lp.shape[0])[None, :], placements].sum(axis=1)

    def set_probs(self, p: np.ndarray) -> None:
        with np.errstate(divide="ignore"):
            self.logits = np.where(self.allowed & (p > 0), np.log(np.where(p > 0, p, 1.0)), MASKED)


def cross_entropy_update(policy: CategoricalPolicy, elite: np.ndarray, eps: float) -> None:
    """Set each unit's distribution to its device frequencies in ``elite`` (the maximum-likelihood fit,
    i.e. the global minimum of the cross-entropy), then ``p <- (1 - eps) p + eps / D_allowed`` over
    the unit's allowed devices so that no allowed device is left at zero."""
    G, D = policy.allowed.shape
    counts = np.zeros((G, D))
    np.add.at(counts, (np.broadcast_to(np.arange(G), elite.shape), elite), 1.0)
    freq = counts / len(elite)
    n_allowed = policy.allowed.sum(axis=1, keepdims=True)
    policy.set_probs(np.where(policy.allowed, (1 - eps) * freq + eps / n_allowed, 0.0))


def _score_gradient(policy: CategoricalPolicy, placements: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """sum_i weights[i] * d log pi(x_i) / d logits, divided by the number of samples."""
    G, D = policy.allowed.shape
    onehot = np.zeros((G, D))
    np.add.at(
        onehot,
        (np.broadcast_to(np.arange(G), placements.shape), placements),
        np.broadcast_to(weights[:, None], placements.shape),
    )
    grad = onehot - weights.sum() * policy.probs()
    return np.where(policy.allowed, grad, 0.0) / len(placements)


def ppo_gradient(
    policy: CategoricalPolicy, placements: np.ndarray, old_log_prob: np.ndarray, advantage: np.ndarray, clip: float
) -> np.ndarray:
    """Gradient (for ascent) of PPO's clipped surrogate ``mean_i min(r_i A_i, clip(r_i) A_i)``.

    A sample whose ratio left ``[1 - clip, 1 + clip]`` on the side its advantage pushes contributes
    nothing (the min selects the constant clipped term)."""
    ratio = np.exp(policy.log_prob(placements) - old_log_prob)
    clipped = ((advantage > 0) & (ratio > 1 + clip)) | ((advantage < 0) & (ratio < 1 - clip))
    return _score_gradient(policy, placements, np.where(clipped, 0.0, ratio * advantage))


def reinforce_gradient(policy: CategoricalPolicy, placements: np.ndarray, advantage: np.ndarray) -> np.ndarray:
    """Gradient (for ascent) of ``mean_i A_i log pi(x_i)``."""
    return _score_gradient(policy, placements, advantage)


def normalized_advantage(reward: np.ndarray) -> np.ndarray:
    """(reward - mean) / std over the batch; all zeros when the std is zero (nothing to learn)."""
    std = reward.std()
    if not np.isfinite(std) or std < 1e-12 * max(1.0, float(np.abs(reward).max())):
        return np.zeros_like(reward)
    return (reward - reward.mean()) / std


class Adam:
    """Adam for gradient *ascent* on one array (Kingma & Ba 2015; defaults from the paper)."""

    def __init__(self, shape, lr: float, beta1: float = 0.9, beta2: float = 0.999, eps: float = 1e-8):
        self.lr, self.beta1, self.beta2, self.eps = lr, beta1, beta2, eps
        self.reset(shape)

    def reset(self, shape) -> None:
        self.m = np.zeros(shape)
        self.v = np.zeros(shape)
        self.t = 0

    def step(self, params: np.ndarray, grad: np.ndarray) -> np.ndarray:
        self.t += 1
        self.m = self.beta1 * self.m + (1 - self.beta1) * grad
        self.v = self.beta2 * self.v + (1 - self.beta2) * grad * grad
        m_hat = self.m / (1 - self.beta1**self.t)
        v_hat = self.v / (1 - self.beta2**self.t)
        return params + self.lr * m_hat / (np.sqrt(v_hat) + self.eps)

    def state_dict(self) -> dict:
        return {"m": self.m.copy(), "v": self.v.copy(), "t": self.t}

    def load_state_dict(self, s: dict) -> None:
        self.m, self.v, self.t = s["m"].copy(), s["v"].copy(), int(s["t"])
