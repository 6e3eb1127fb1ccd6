"""hp's CPU modes (flushed denormals, no oneDNN) hold during its ask and tell only."""

import numpy as np
import torch

from postplace.search.hierarchical import HierarchicalConfig, HierarchicalPlanner
from postplace.search.strategy import SearchSpace


def _denormal_survives() -> bool:
    return bool((torch.tensor([1e-39], dtype=torch.float32) * 1.0).item() != 0.0)


def test_denormals_are_flushed_inside_and_restored_after():
    space = SearchSpace(allowed=np.ones((6, 2), dtype=bool), failure_step_time=10.0, unit_time=np.ones((6, 2)))
    hp = HierarchicalPlanner(space, seed=0, config=HierarchicalConfig(num_groups=3, placer_hidden=8))
    assert _denormal_survives()
    seen = []
    original = hp._group_logits

    def spy():
        seen.append(_denormal_survives())
        return original()

    hp._group_logits = spy
    x = hp.ask(4)
    hp.tell(x, np.arange(4.0), np.ones(4, dtype=bool))
    assert seen == [False, False]  # once in ask, once in the replay of tell
    assert _denormal_survives()
    assert torch.backends.mkldnn.enabled
