"""A plan as users name it: ``ddp``, ``zero2``, ``fsdp+recompute:m=8``, ``zero1:m=4,dp=2``."""

from __future__ import annotations

import re
from dataclasses import dataclass

from postplace.errors import PostplaceError
from postplace.graph import OpGraph
from postplace.plans.data_parallel import LEVELS, PlannedStep, data_parallel
from postplace.plans.recompute import recompute

__all__ = ["PlanSpec", "apply_plan", "parse_plan"]

_OPTION = re.compile(r"^(m|dp)=([0-9]+)$")
_HOW = (f"write NAME[+recompute][:m=M][,dp=K] with NAME one of {', '.join(LEVELS)} "
        "(e.g. fsdp+recompute:m=8)")  # fmt: skip


@dataclass(frozen=True)
class PlanSpec:
    """One practitioner plan.

    Parameters
    ----------
    level : str
        One of :data:`postplace.plans.LEVELS`.
    recompute : bool
        Recompute every numbered unit's activations in the backward pass.
    microbatches : int, optional
        The step's micro-batch count (all replicas together); None: the caller chooses.
    replicas : int, optional
        The data-parallel degree; None: every GPU the plan may use.
    """

    level: str
    recompute: bool = False
    microbatches: int | None = None
    replicas: int | None = None

    @property
    def name(self) -> str:
        """The plan's name without its options (``fsdp+recompute``): a candidate's name in a table."""
        return self.level + ("+recompute" if self.recompute else "")

    def __str__(self) -> str:
        opts = [f"m={self.microbatches}"] * (self.microbatches is not None) + [f"dp={self.replicas}"] * (
            self.replicas is not None)  # fmt: skip
        return self.name + (":" + ",".join(opts) if opts else "")


def parse_plan(text: str) -> PlanSpec:
    """Read a plan's name (see the module docstring); one error line when it does not parse.

    >>> parse_plan("fsdp+recompute:m=8")
    PlanSpec(level='fsdp', recompute=True, microbatches=8, replicas=None)
    >>> str(parse_plan("zero2:dp=4"))
    'zero2:dp=4'
    """
    if not isinstance(text, str) or not text.strip():
        raise PostplaceError(f"--plan is empty; {_HOW}")
    head, _, tail = text.strip().partition(":")
    parts = head.split("+")
    level, extras = parts[0], parts[1:]
    if level not in LEVELS:
        raise PostplaceError(f"--plan '{text}': unknown plan '{level}'; {_HOW}")
    if any(x != "recompute" for x in extras) or len(extras) > 1:
        raise PostplaceError(f"--plan '{text}': only '+recompute' may follow the plan's name; {_HOW}")
    options: dict[str, int] = {}
    for opt in tail.split(",") if tail else ():
        match = _OPTION.match(opt.strip())
        if not match or match.group(1) in options:
            raise PostplaceError(f"--plan '{text}': option '{opt}' is not m=M or dp=K (each once); {_HOW}")
        value = int(match.group(2))
        if not 1 <= value <= 4096:
            raise PostplaceError(f"--plan '{text}': {match.group(1)}={value} must be between 1 and 4096")
        options[match.group(1)] = value
    return PlanSpec(level, bool(extras), options.get("m"), options.get("dp"))


def apply_plan(graph: OpGraph, spec: PlanSpec, replicas: int) -> PlannedStep:
    """The passes ``spec`` names over ``graph`` (traced at the plan's micro-batch count), on ``replicas`` GPUs.

    Parameters
    ----------
    graph : OpGraph
        The step traced as m micro-batches, m a multiple of ``replicas``.
    spec : PlanSpec
    replicas : int

    Returns
    -------
    PlannedStep
    """
    step = recompute(graph) if spec.recompute else graph
    return data_parallel(step, replicas, spec.level)
