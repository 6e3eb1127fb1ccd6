"""The two groups of :func:`postplace.place`'s arguments that travel together, as Optuna's
``create_study`` takes a sampler that carries its own settings: :class:`Step` (the training step
placed: a module's batch, loss and labels, the update, the precision) and :class:`Measure` (how
placements are judged beyond the simulator: the torch evaluator, ``--confirm``, Ray).
"""

from __future__ import annotations

from dataclasses import dataclass, fields

from postplace.errors import PostplaceError


@dataclass(frozen=True)
class Step:
    """The training step :func:`postplace.place` places (and :func:`postplace.compare` compares).

    Parameters
    ----------
    inputs : tensor or tuple of tensors, optional
        An ``nn.Module`` target's example batch (needed for a module only).
    loss_fn : callable, optional
        A module's loss: ``loss_fn(outputs)`` or, with ``targets``, ``loss_fn(outputs, *targets)``.
    targets : tensor or tuple of tensors, optional
        A module's labels: split with the inputs into micro-batches, and the placed step takes new ones
        each call (``step(inputs, targets)``). Without them a module is placed at m = 1 only.
    optimizer : str, torch.optim class, (class, kwargs) or factory
        The update the step ends with (:mod:`postplace.graph.optimizers`): ``"sgd"`` (default: lr 0.1,
        momentum 0.9, the paper zoo's), ``"adam"``, ``"adamw"``, ``torch.optim.AdamW``,
        ``(torch.optim.AdamW, {"lr": 3e-4})``, or ``params -> Optimizer`` (param groups kept). Its
        state (Adam's two moments) is memory the placement must fit.
    lr : float, optional
        The learning rate of a named optimizer or class.
    precision : {"fp32", "bf16", "fp16"}
        ``bf16``/``fp16``: the forward pass runs under ``torch.autocast`` in that dtype with fp32 master
        weights; each op is priced at its device's peak for the dtype it runs in.

    Examples
    --------
    >>> from postplace import Step
    >>> Step(optimizer="adamw", lr=3e-4, precision="bf16").precision
    'bf16'
    """

    inputs: object = None
    loss_fn: object = None
    targets: object = None
    optimizer: object = "sgd"
    lr: float | None = None
    precision: str = "fp32"

    def traced_step(self) -> dict:
        """The options every traced target takes (a zoo model's too): optimizer, lr, precision."""
        return {"optimizer": self.optimizer, "lr": self.lr, "precision": self.precision}


@dataclass(frozen=True)
class Measure:
    """How :func:`postplace.place` judges placements beyond the simulator.

    Parameters
    ----------
    evaluator : {"simulator", "torch"}
        Simulate every sample (default), or measure real steps (zoo models and modules only).
    map_all_to : str, optional
        When measuring: run every logical device on this torch device (e.g. ``"cpu"``).
    confirm : int
        Measure the K best candidates of a simulated search for real and return the fastest measured
        (needs code to run, and a run folder).
    confirm_with : {"process", "launch"}
        How ``confirm`` measures: ``"process"`` (default) runs each placement in this one process, each op
        on its logical device (:class:`~postplace.runtime.evaluator.TorchEvaluator`); ``"launch"`` runs it
        as one process per device over torch.distributed
        (:class:`~postplace.runtime.launch_measure.LaunchEvaluator`: gloo, every rank a CPU process
        standing in for its device; the step time is the median, after a warm-up, of the slowest
        rank's seconds per step). Not with ``ray`` or a ``map_all_to`` other than ``"cpu"``.
    ray : str, optional
        ``"local"`` or a Ray address: evaluate the search's samples on Ray actors (at every count).

    Raises
    ------
    PostplaceError
        One line for a ``confirm_with`` that is not one of :data:`CONFIRM_WITH`, or ``"launch"`` without
        ``confirm``, with ``ray`` or with ``map_all_to`` other than ``"cpu"``.

    Examples
    --------
    >>> from postplace import Measure
    >>> Measure(confirm=3).evaluator
    'simulator'
    >>> Measure(confirm=2, confirm_with="launch").confirm_with
    'launch'
    """

    evaluator: str = "simulator"
    map_all_to: str | None = None
    confirm: int = 0
    ray: str | None = None
    confirm_with: str = "process"

    def __post_init__(self):
        check_confirm_with(self.confirm_with, self.confirm, self.ray, self.map_all_to)

    @property
    def measured(self) -> bool:
        """Whether any figure of the run is measured (``--evaluator torch`` or ``--confirm K``)."""
        return self.evaluator != "simulator" or bool(self.confirm)


CONFIRM_WITH = ("process", "launch")
"""How ``--confirm`` measures: in this one process, or launched as one process per device."""


def check_confirm_with(confirm_with, confirm, ray, map_all_to) -> None:
    """``--confirm-with``'s value and the flags it goes with, each refusal one line."""
    if not isinstance(confirm_with, str) or confirm_with not in CONFIRM_WITH:
        raise PostplaceError(
            f"--confirm-with {confirm_with!r}: use process (each placement in this one process) or launch "
            "(one process per device over torch.distributed)"
        )
    if confirm_with == "process":
        return
    if not confirm:
        raise PostplaceError("--confirm-with launch says how --confirm K measures: give --confirm K too")
    if ray is not None:
        raise PostplaceError(
            "--confirm-with launch starts its processes on this machine; --ray does not apply: drop one of them"
        )
    if map_all_to not in (None, "cpu"):
        raise PostplaceError(
            f"--confirm-with launch runs every device as a CPU process (gloo); --map-all-to {map_all_to} "
            "does not apply: drop it"
        )


MOVED = {**{f.name: "step" for f in fields(Step)}, **{f.name: "measure" for f in fields(Measure)}}
"""Each grouped argument, and the group it travels in."""


def grouped(value, cls, name: str):
    """``value`` as a ``cls`` (None: the defaults); anything else is one line naming the type it needs."""
    if value is None:
        return cls()
    if not isinstance(value, cls):
        raise PostplaceError(f"{name}= takes a postplace.{cls.__name__}(...), not a {type(value).__name__}")
    return value


def check_moved(call: str, given: dict, groups: tuple[str, ...] = ("step", "measure")) -> None:
    """Refuse, in one line, a keyword of a group passed loose (``inputs=`` for ``step=Step(inputs=...)``);
    ``groups``: those ``call`` takes (a field of another group does not apply to it)."""
    for key in given:
        group = MOVED.get(key)
        if group is None:
            raise PostplaceError(f"{call}() got an unknown argument '{key}'; see help(postplace.{call})")
        cls = "Step" if group == "step" else "Measure"
        if group not in groups:
            raise PostplaceError(
                f"{call}({key}=...): {cls}'s fields do not apply to {call}; see help(postplace.{call})"
            )
        raise PostplaceError(f"{call}({key}=...): {key} is part of {group}=; pass {group}=postplace.{cls}({key}=...)")
