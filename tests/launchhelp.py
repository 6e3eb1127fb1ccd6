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


def launched_run_folder(path, plan: str):
    """``postplace launch RUN_FOLDER --steps 2 --json`` on a run folder of GPT-2 (small, AdamW, 2 micro-batches)
    whose returned plan is ``plan`` (:func:`tests.clihelp.plan_run_folder`): the folder, the printed JSON,
    and the one-process losses of the same 2 steps."""
    import json

    from postplace.runtime.zoo_step import trace_zoo_step
    from tests.clihelp import plan_run_folder, run_cli

    folder = plan_run_folder(path, plan)
    got = run_cli("launch", folder, "--steps", "2", "--json")
    assert got.returncode == 0, got.stderr
    losses, _ = one_process(trace_zoo_step("gpt2", "small", microbatches=2, optimizer="adamw"), 2)
    return folder, json.loads(got.stdout), losses
