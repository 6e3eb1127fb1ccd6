"""Distributed evaluation on Ray (optional: ``pip install 'postplace[ray]'``).

* :class:`RayEvaluator`: any Evaluator (the Simulator, TorchEvaluator) run by a pool of Ray actors,
  each building its evaluator once; batches split across them and gathered in order; actors that die
  are replaced and their placements retried (:mod:`postplace.distributed.ray_evaluator`);
* :class:`SimulatorFactory`, :class:`TorchZooFactory`: the picklable recipes an actor builds its
  evaluator from (:mod:`postplace.distributed.factories`);
* :func:`init_ray`: start a local cluster or join one; :func:`require_ray`: ray, or how to install it.

Importing this package does not import Ray; only building a RayEvaluator (or :func:`init_ray`) does.
"""

from postplace.distributed.factories import SimulatorFactory, TorchZooFactory
from postplace.distributed.ray_evaluator import EvaluatorLost, RayEvaluator, init_ray, merge_results, require_ray

__all__ = [
    "EvaluatorLost",
    "RayEvaluator",
    "SimulatorFactory",
    "TorchZooFactory",
    "init_ray",
    "merge_results",
    "require_ray",
]
