"""The one-process reference the launch tests hold every launched plan against."""

import numpy as np
import torch

from postplace.cluster import load_cluster
from postplace.runtime.launcher import RandomBatches
from postplace.runtime.placed import apply


def one_process(traced, steps: int, seed: int = 0):
    """The step on one device (the CPU), on the batches a launch with ``RandomBatches(seed)`` draws:
    the losses of ``steps`` steps and the parameters after them."""
    step = apply(
        traced.model, traced, np.zeros(traced.graph.num_ops, dtype=np.int64), load_cluster("k80x4"), device_map="cpu"
    )
    batches = RandomBatches(seed)
    torch.manual_seed(seed)
    losses = [float(step(*batches(traced))) for _ in range(steps)]
    return losses, step.parameters()
