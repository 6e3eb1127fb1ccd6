"""Run a placement for real: placed PyTorch training steps, real step times, simulator fidelity.

* :func:`apply` -> :class:`PlacedStep`: the traced forward + backward + update step with every op on its
  device and an explicit transfer on every edge that crosses devices (:mod:`postplace.runtime.placed`);
* :func:`apply_zoo`: the same for a zoo model, traced as the placement's m micro-batches
  (:mod:`postplace.runtime.zoo_step`);
* :class:`LogicalDeviceCheck`: fails an op that reads a tensor of another logical device
  (:mod:`postplace.runtime.check`);
* :class:`TorchEvaluator`: the Evaluator that measures real step times (:mod:`postplace.runtime.evaluator`);
* calibration and the fidelity report (:mod:`postplace.runtime.calibrate`).
"""

from postplace.runtime.check import LogicalDeviceCheck
from postplace.runtime.placed import PlacedStep, apply, default_device_map, resolve_device_map
from postplace.runtime.zoo_step import apply_zoo

__all__ = [
    "LogicalDeviceCheck",
    "PlacedStep",
    "TorchEvaluator",
    "apply",
    "apply_zoo",
    "default_device_map",
    "resolve_device_map",
]


def __getattr__(name):
    if name == "TorchEvaluator":
        from postplace.runtime.evaluator import TorchEvaluator

        return TorchEvaluator
    raise AttributeError(name)
