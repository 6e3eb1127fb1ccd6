"""Every strategy keeps the ask/tell contract (shapes, allowed devices, seeding, state round trip)."""

import numpy as np
import pytest

from postplace.search import STRATEGIES, make_strategy
from postplace.search.strategy import SearchSpace
from postplace.testing.contracts import check_cross_entropy_step, check_strategy_contract

# hp's networks run in torch: with two threads on a shared 2-core machine its contract took 138 s, with one 4 s
pytestmark = pytest.mark.usefixtures("torch_one_thread")

ALLOWED = np.array([[True, True, True], [True, False, True], [False, True, False], [True, True, True]] * 3)
SPACE = SearchSpace(
    allowed=ALLOWED,
    failure_step_time=1e3,
    unit_time=np.where(ALLOWED, 1.0, np.inf),
    device_names=("cpu", "gpu0", "gpu1"),
    device_kinds=("cpu", "gpu", "gpu"),
)


def contract_config(name):
    """The default config (a named start's own), except hp's networks at a tenth of the paper's width:
    the contract (shapes, allowed devices, seeding, the state round trip) does not depend on the width,
    and at full width hp took minutes of the suite's time here."""
    if name not in ("hp", "hp-probe"):
        return None
    from dataclasses import replace

    from postplace.search import config_class

    return replace(config_class(name)[1], grouper_hidden=8, placer_hidden=16, device_embedding=8)


@pytest.mark.parametrize("name", list(STRATEGIES))
def test_contract(name):
    cfg = contract_config(name)
    check_strategy_contract(lambda space, seed: make_strategy(name, space, seed=seed, config=cfg), SPACE)


def small_ce(name):
    """Post-family strategies with a cross-entropy step every 24 samples (K = 8), so the 96-240 samples
    the contract drives cross several CE steps (the default N = 480 is never reached there)."""
    from dataclasses import replace

    from postplace.search import config_class

    cfg = replace(config_class(name)[1], batch_size=8, ce_every=24)
    return lambda space, seed: make_strategy(name, space, seed=seed, config=cfg)


@pytest.mark.parametrize("name", ["post", "post-paper", "ce"])
def test_contract_across_cross_entropy_steps(name):
    check_strategy_contract(small_ce(name), SPACE)
    check_cross_entropy_step(small_ce(name), SPACE, 24)
