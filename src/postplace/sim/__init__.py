"""The event-driven execution simulator (the default evaluator), its bounds and traces.

Semantics are written once, in :mod:`postplace.sim.reference`; :mod:`postplace.sim.kernel` compiles
the same algorithm with numba and :class:`Simulator` batches it.
"""

from postplace.sim.bounds import failure_step_time, lower_bound
from postplace.sim.problem import SimProblem
from postplace.sim.simulate import EvalResult, Evaluator, Simulator
from postplace.sim.trace import Schedule

__all__ = [
    "EvalResult",
    "Evaluator",
    "Schedule",
    "SimProblem",
    "Simulator",
    "failure_step_time",
    "lower_bound",
]
