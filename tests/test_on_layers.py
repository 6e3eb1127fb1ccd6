"""Every rival acts on Post's action space at m > 1 (issue 32 item 2): REINFORCE, random search and
annealing place a micro-batched step one stripe per layer, as Post does; at m = 1 they place units."""

from __future__ import annotations

import numpy as np
import pytest

from postplace import zoo
from postplace.cluster import load_cluster
from postplace.search import Budget, make_strategy, run
from postplace.search.on_layers import OnLayers
from postplace.search.problem import make_problem


@pytest.fixture(scope="module")
def problem():
    return make_problem(zoo.cached_graph("gpt2", "small", "sgd", microbatches=2), load_cluster("k80x4"))


@pytest.mark.parametrize("name", ["reinforce", "random", "anneal", "reinforce-paper", "reinforce-probe"])
def test_rivals_ask_one_stripe_per_layer(problem, name):
    s = make_strategy(name, problem.space, seed=0)
    inner = getattr(s, "inner", s)
    assert isinstance(s, OnLayers) or isinstance(inner, OnLayers)
    layered = s if isinstance(s, OnLayers) else inner
    asked = np.atleast_2d(s.ask(16))
    assert all(layered.actions_of(row) is not None for row in asked)  # every layer follows one stripe
    s.tell(asked, np.ones(len(asked)), np.ones(len(asked), dtype=bool))
    lay = problem.space.layers
    assert layered.inner.space.allowed.shape == (lay.num_layers, lay.num_actions)  # it decides per layer


def test_at_one_micro_batch_rivals_place_units():
    p = make_problem(zoo.cached_graph("gpt2", "small", "sgd"), load_cluster("k80x4"))
    assert not isinstance(make_strategy("reinforce", p.space), OnLayers)


def test_a_warm_start_placed_op_by_op_is_evaluated_but_not_learned_from(problem):
    s = make_strategy("reinforce", problem.space, seed=0)
    units = problem.space.allowed.shape[0]
    odd = np.zeros(units, dtype=np.int64)
    odd[: units // 2] = 1  # half of each layer's micro-batches apart: no stripe makes it
    allowed = problem.space.allowed[np.arange(units), odd]
    odd[~allowed] = 0
    assert s.actions_of(odd) is None
    before = s.policy.logits.copy()
    s.tell(odd[None], np.array([1.0]), np.array([True]))
    assert np.array_equal(before, s.policy.logits)  # not a sample of its policy: nothing to learn
    res = run(make_strategy("reinforce", problem.space, seed=0), problem.simulator, Budget(samples=8), warm_start=odd)
    assert res.samples == 8 and np.isfinite(res.best_step_time)


def test_a_rival_on_layers_resumes_where_it_stopped(problem):
    """``reinforce-probe`` on layers: its state (the probe of the units, the policy on the layers) saved
    after the probe and loaded into a fresh strategy gives the same next samples."""
    import copy

    from postplace.search.on_layers import OnLayers

    def layered(s):
        return s if isinstance(s, OnLayers) else s.inner

    s = make_strategy("reinforce-probe", problem.space, seed=0)
    for _ in range(4):
        asked = np.atleast_2d(s.ask(8))
        res = problem.simulator.evaluate(asked)
        s.tell(asked, res.step_time, res.feasible)
    assert layered(s).probe.done
    state = copy.deepcopy(s.state_dict())
    again = make_strategy("reinforce-probe", problem.space, seed=0)
    again.load_state_dict(state)
    assert layered(again).probe.done and layered(again).inner.probe is None
    assert again.start_name == s.start_name
    np.testing.assert_array_equal(again.ask(8), s.ask(8))
