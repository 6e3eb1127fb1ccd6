"""The pieces of Post, one at a time."""

import numpy as np
import pytest

from postplace.search.policy import (
    Adam,
    CategoricalPolicy,
    cross_entropy_update,
    normalized_advantage,
    ppo_gradient,
)
from postplace.search.post import PostConfig, PostStrategy
from postplace.search.strategy import SearchSpace

ALLOWED = np.array([[True, True, True], [True, False, True], [False, True, False]])


def test_cross_entropy_step_is_elite_frequencies_mixed_with_eps_over_allowed():
    policy = CategoricalPolicy(ALLOWED, np.random.default_rng(0).normal(size=(3, 3)))
    elite = np.array([[0, 2, 1], [0, 0, 1], [1, 2, 1], [0, 2, 1]])
    cross_entropy_update(policy, elite, eps=0.1)
    expected = np.array(
        [
            [0.9 * 3 / 4 + 0.1 / 3, 0.9 * 1 / 4 + 0.1 / 3, 0.9 * 0 + 0.1 / 3],
            [0.9 * 1 / 4 + 0.1 / 2, 0.0, 0.9 * 3 / 4 + 0.1 / 2],
            [0.0, 1.0, 0.0],
        ]
    )
    np.testing.assert_allclose(policy.probs(), expected, rtol=1e-12)


def test_ppo_gradient_is_zero_for_samples_clipped_on_the_side_their_advantage_pushes():
    allowed = np.ones((2, 2), dtype=bool)
    policy = CategoricalPolicy(allowed, np.array([[2.0, 0.0], [0.0, 0.0]]))
    x = np.array([[0, 1], [1, 0]])
    now = policy.log_prob(x)
    # sample 0: ratio e^1 > 1.2 with positive advantage -> clipped; sample 1: ratio e^-1 < 0.8, A < 0 -> clipped
    old = now - np.array([1.0, -1.0])
    g = ppo_gradient(policy, x, old, np.array([1.0, -1.0]), clip=0.2)
    assert np.all(g == 0)
    # the same ratios with the opposite advantages are not clipped: the gradient is not zero
    g = ppo_gradient(policy, x, old, np.array([-1.0, 1.0]), clip=0.2)
    assert np.abs(g).sum() > 0.1
    # inside the clip range, the gradient is ratio * A * (onehot - p), averaged
    g = ppo_gradient(policy, x[:1], now[:1], np.array([2.0]), clip=0.2)
    p = policy.probs()
    expected = 2.0 * (np.array([[1, 0], [0, 1]]) - p)
    np.testing.assert_allclose(g, expected, rtol=1e-12)


def test_zero_probability_devices_are_never_sampled():
    policy = CategoricalPolicy(ALLOWED, np.array([[50.0, -50.0, 0.0], [0.0, 0.0, 30.0], [0.0, 0.0, 0.0]]))
    x = policy.sample(np.random.default_rng(0), 20000)
    assert ALLOWED[np.arange(3)[None, :], x].all()
    assert np.bincount(x[:, 2], minlength=3).tolist() == [0, 20000, 0]


def test_sampling_follows_the_probabilities():
    policy = CategoricalPolicy(np.ones((1, 3), dtype=bool), np.log(np.array([[0.2, 0.3, 0.5]])))
    x = policy.sample(np.random.default_rng(1), 50000)[:, 0]
    np.testing.assert_allclose(np.bincount(x) / 50000, [0.2, 0.3, 0.5], atol=0.01)


def test_zero_std_batch_gives_zero_advantage():
    assert not normalized_advantage(np.full(8, -0.3)).any()
    a = normalized_advantage(np.array([1.0, 2.0, 3.0]))
    assert a.mean() == pytest.approx(0) and a.std() == pytest.approx(1)


def test_adam_moves_towards_the_gradient():
    adam = Adam((2,), lr=0.1)
    x = adam.step(np.zeros(2), np.array([1.0, -1.0]))
    np.testing.assert_allclose(x, [0.1, -0.1], rtol=1e-6)


def space(failure=100.0):
    return SearchSpace(allowed=ALLOWED, failure_step_time=failure, unit_time=np.where(ALLOWED, 1.0, np.inf))


def test_an_all_oom_batch_changes_nothing_and_raises_nothing():
    s = PostStrategy(space(), seed=0, config=PostConfig(batch_size=4, ce_every=8))
    before = s.policy.logits.copy()
    for _ in range(4):  # covers PPO steps and CE steps
        p = s.ask(4)
        s.tell(p, np.full(4, 1.0), np.zeros(4, dtype=bool))
    np.testing.assert_array_equal(s.policy.logits, before)


def test_infeasible_samples_never_enter_the_elite():
    s = PostStrategy(space(), seed=0, config=PostConfig(batch_size=4, ce_every=4, eps=0.0, use_ppo=False))
    p = np.array([[0, 0, 1], [2, 2, 1], [1, 0, 1], [1, 2, 1]])
    s.ask(4)
    # the fastest sample is OOM; the best feasible one is [1, 2, 1]
    s.tell(p, np.array([0.1, 5.0, 3.0, 1.0]), np.array([False, True, True, True]))
    np.testing.assert_allclose(s.policy.probs(), [[0, 1, 0], [0, 0, 1], [0, 1, 0]], atol=1e-12)
