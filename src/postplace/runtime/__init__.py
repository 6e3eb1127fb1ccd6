"""Run a placement for real: placed PyTorch training steps, real step times, simulator fidelity.

* :func:`apply` -> :class:`PlacedStep`: the traced forward + backward + update step with every op on its
  device and an explicit transfer on every edge that crosses devices (:mod:`postplace.runtime.placed`);
* :func:`apply_zoo`: the same for a zoo model, traced as the placement's m micro-batches
  (:mod:`postplace.runtime.zoo_step`);
* :class:`LogicalDeviceCheck`: fails an op that reads a tensor of another logical device
  (:mod:`postplace.runtime.check`);
* :func:`rank_plan` -> :class:`RankPlan`: one program per device, every crossing tensor a send/recv in one
  global order, checked not to deadlock (:mod:`postplace.runtime.ranks`);
* :func:`launch` / :func:`launch_run`: those programs as one process per device through torch's elastic
  launcher, gloo on the CPU, NCCL on GPUs; :func:`run_rank`: one rank's entry point under ``torchrun``
  (:mod:`postplace.runtime.launcher`);
* :class:`TorchEvaluator`: the Evaluator that measures real step times (:mod:`postplace.runtime.evaluator`);
* calibration and the fidelity report (:mod:`postplace.runtime.calibrate`).
"""

from postplace.runtime.check import LogicalDeviceCheck
from postplace.runtime.launcher import LaunchResult, launch, launch_run, run_rank
from postplace.runtime.placed import PlacedStep, apply, default_device_map, resolve_device_map
from postplace.runtime.ranks import RankPlan, rank_plan
from postplace.runtime.zoo_step import apply_zoo

__all__ = [
    "LaunchResult",
    "LogicalDeviceCheck",
    "PlacedStep",
    "RankPlan",
    "TorchEvaluator",
    "apply",
    "apply_zoo",
    "default_device_map",
    "launch",
    "launch_run",
    "rank_plan",
    "resolve_device_map",
    "run_rank",
]


def __getattr__(name):
    if name == "TorchEvaluator":
        from postplace.runtime.evaluator import TorchEvaluator

        return TorchEvaluator
    raise AttributeError(name)
