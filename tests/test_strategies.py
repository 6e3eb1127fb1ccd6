"""Every strategy keeps the ask/tell contract (shapes, allowed devices, seeding, state round trip)."""

import numpy as np
import pytest

from postplace.search import STRATEGIES, make_strategy
from postplace.search.strategy import SearchSpace
from postplace.testing.contracts import check_strategy_contract

ALLOWED = np.array([[True, True, True], [True, False, True], [False, True, False], [True, True, True]] * 3)
SPACE = SearchSpace(allowed=ALLOWED, failure_step_time=1e3, unit_time=np.where(ALLOWED, 1.0, np.inf),
                    device_names=("cpu", "gpu0", "gpu1"), device_kinds=("cpu", "gpu", "gpu"))  # fmt: skip


@pytest.mark.parametrize("name", [*STRATEGIES, "post-paper"])
def test_contract(name):
    check_strategy_contract(lambda space, seed: make_strategy(name, space, seed=seed), SPACE)
