"""The plans practitioners launch, as graph passes over a traced step (DESIGN section 4b).

Each pass is a function from a step to a step, composable with micro-batching (the step is traced as
m micro-batches first): :func:`recompute` (activation checkpointing per unit), :func:`data_parallel`
(``ddp``, ``zero1``, ``zero2``, ``fsdp`` over k replicas, with their collectives). :func:`parse_plan`
reads a plan's name as users write it (``fsdp+recompute:m=8``) and :func:`apply_plan` runs the passes
it names; :func:`sized_step` joins traces of several micro-batch sizes (a plan's ``mbs=``).
"""

from postplace.plans._step import unit_of
from postplace.plans.data_parallel import LEVELS, PlannedStep, data_parallel
from postplace.plans.recompute import recompute
from postplace.plans.sizes import sized_step
from postplace.plans.spec import PlanSpec, apply_plan, parse_plan

__all__ = [
    "LEVELS",
    "PlanSpec",
    "PlannedStep",
    "apply_plan",
    "data_parallel",
    "parse_plan",
    "recompute",
    "sized_step",
    "unit_of",
]
