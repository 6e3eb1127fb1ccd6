"""The optimizer a traced training step updates with: torch.optim's own update, traced per parameter.

A user names it as they build it for eager training (:func:`resolve_optimizer`):

* a name: ``"sgd"`` (the paper zoo's default: lr 0.1, momentum 0.9), ``"adam"`` (lr 1e-3) or
  ``"adamw"`` (lr 1e-3, weight decay 0.01, torch's defaults); ``lr=`` overrides the learning rate;
* a class, ``torch.optim.AdamW``, or a class with keyword arguments, ``(torch.optim.AdamW, {"lr": 3e-4})``;
* a factory ``params -> Optimizer`` (called with the model's parameters, so it may build param groups,
  e.g. no weight decay on biases), or an optimizer already built over the model's parameters.

Every parameter keeps its group's hyperparameters. :class:`SGD <torch.optim.SGD>`, :class:`Adam
<torch.optim.Adam>` and :class:`AdamW <torch.optim.AdamW>` are traced; others are refused with one line.

**What is traced.** For each parameter, torch.optim's functional update (``torch.optim.sgd.sgd``,
``torch.optim.adam.adam``) on that one parameter, single-tensor (``foreach=False``): the same code eager
training runs on the CPU. The step count and the moments are state tensors that persist across steps,
so one traced graph serves every step. Adam and AdamW run in torch's *capturable* form, the form
CUDA graphs and ``torch.compile`` replay: bias corrections are computed from the step tensor in float32
rather than from a Python number in float64, so they match eager Adam within about 1e-6 relative
(``tests/test_optimizers.py`` checks 3 steps). SGD matches eager bit for bit. State starts at zero,
as torch.optim starts it (SGD's first momentum step, ``0 * momentum + grad``, equals eager's copy of
the gradient; with ``dampening`` it would not, so a dampened SGD is refused). Learning-rate schedulers
are not traced: the learning rate is a constant of the graph.
"""

from __future__ import annotations

import contextlib
import inspect
import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch.optim.adam import adam as adam_update
from torch.optim.sgd import sgd as sgd_update

from postplace.errors import PostplaceError

__all__ = [
    "NAMED",
    "StepOptimizer",
    "optimizer_from_record",
    "optimizer_mismatch",
    "optimizer_record",
    "recorded_step",
    "resolve_optimizer",
]

#: name -> (class, keyword arguments): the optimizers a name stands for
NAMED: dict[str, tuple[type, dict]] = {
    "sgd": (torch.optim.SGD, {"lr": 0.1, "momentum": 0.9}),
    "adam": (torch.optim.Adam, {"lr": 1e-3}),
    "adamw": (torch.optim.AdamW, {"lr": 1e-3}),
}
_SUPPORTED = {torch.optim.SGD: "sgd", torch.optim.Adam: "adam", torch.optim.AdamW: "adamw"}
#: hyperparameters of each class that change the traced maths (the rest choose kernels, not results)
_HYPER = {
    "sgd": ("lr", "momentum", "dampening", "weight_decay", "nesterov", "maximize"),
    "adam": ("lr", "betas", "eps", "weight_decay", "amsgrad", "maximize", "decoupled_weight_decay"),
}
_HYPER["adamw"] = _HYPER["adam"]


@dataclass(frozen=True)
class StepOptimizer:
    """One optimizer, resolved against a model: its class name and each parameter's hyperparameters.

    ``group_of_param[i]`` is parameter i's group in ``groups`` (-1: frozen or in no group, so it is
    never updated and has no state)."""

    name: str
    groups: tuple[dict, ...]
    group_of_param: tuple[int, ...]

    # ------------------------------------------------------------------------------ state
    def state_names(self, i: int) -> tuple[str, ...]:
        """Names of parameter i's state tensors, in placeholder order."""
        g = self.group_of_param[i]
        if g < 0:
            return ()
        hp = self.groups[g]
        if self.name == "sgd":
            return ("momentum_buffer",) if hp["momentum"] != 0 else ()
        return ("step", "exp_avg", "exp_avg_sq", *(("max_exp_avg_sq",) if hp["amsgrad"] else ()))

    def initial_state(self, i: int, p: torch.Tensor, device=None) -> list[torch.Tensor]:
        """Parameter i's state as torch.optim creates it: zeros (the step count a float32 scalar)."""
        device = p.device if device is None else device
        return [
            torch.zeros((), dtype=torch.float32, device=device)
            if s == "step"
            else torch.zeros_like(p, device=device, memory_format=torch.preserve_format)
            for s in self.state_names(i)
        ]

    @property
    def slots(self) -> int:
        """State tensors the size of a parameter that a trained parameter holds (for memory estimates)."""
        return max((sum(s != "step" for s in self.state_names(i)) for i in range(len(self.group_of_param))), default=0)

    # ------------------------------------------------------------------------------ the update
    def update(self, i: int, p: torch.Tensor, g: torch.Tensor, state: list[torch.Tensor]) -> None:
        """Parameter i's update, in place, by torch.optim's functional single-tensor code."""
        hp = self.groups[self.group_of_param[i]]
        if self.name == "sgd":
            sgd_update(
                [p],
                [g],
                [state[0] if state else None],
                foreach=False,
                fused=False,
                weight_decay=hp["weight_decay"],
                momentum=hp["momentum"],
                lr=hp["lr"],
                dampening=hp["dampening"],
                nesterov=hp["nesterov"],
                maximize=hp["maximize"],
            )
            return
        step, m, v, *vmax = state
        with _capturable_on_any_device():
            adam_update(
                [p],
                [g],
                [m],
                [v],
                vmax,
                [step],
                foreach=False,
                capturable=True,
                differentiable=False,
                fused=False,
                decoupled_weight_decay=hp["decoupled_weight_decay"],
                amsgrad=hp["amsgrad"],
                beta1=hp["betas"][0],
                beta2=hp["betas"][1],
                lr=hp["lr"],
                weight_decay=hp["weight_decay"],
                eps=hp["eps"],
                maximize=hp["maximize"],
            )

    # ------------------------------------------------------------------------------ records
    def describe(self) -> dict:
        """JSON: the name and each group's hyperparameters (what run.json and the summary record)."""
        return {"name": self.name, "groups": [dict(g) for g in self.groups]}

    def __str__(self) -> str:
        hp = self.groups[0] if self.groups else {}
        shown = ", ".join(f"{k} {_num(v)}" for k, v in hp.items() if k in ("lr", "momentum", "weight_decay"))
        more = f", {len(self.groups)} param groups" if len(self.groups) > 1 else ""
        return f"{self.name} ({shown}{more})"


def _num(v) -> str:
    return f"{v:g}" if isinstance(v, float) else str(v)


@contextlib.contextmanager
def _capturable_on_any_device():
    """torch.optim refuses ``capturable=True`` for CPU tensors outside ``torch.compile``: the check
    guards CUDA-graph capture. A traced step is replayed like a captured graph, so trace it the way
    torch.compile does, with the compiling flag set for the duration of the update."""
    flag = torch.compiler._is_compiling_flag
    torch.compiler._is_compiling_flag = True
    try:
        yield
    finally:
        torch.compiler._is_compiling_flag = flag


# ---------------------------------------------------------------------------------- resolving
def resolve_optimizer(optimizer, params: list[torch.Tensor], *, lr: float | None = None) -> StepOptimizer:
    """The :class:`StepOptimizer` of ``optimizer`` (see the module doc for the forms) over ``params``
    (a model's parameters, in order; frozen ones are never updated)."""
    if isinstance(optimizer, StepOptimizer):
        if lr is not None:
            raise PostplaceError("lr= is given twice: the optimizer was already resolved; set lr in it instead")
        return optimizer
    trained = [p for p in params if p.requires_grad]
    opt = _build(optimizer, trained, lr)
    name = _SUPPORTED.get(type(opt))
    if name is None:
        raise PostplaceError(
            f"optimizer {type(opt).__module__}.{type(opt).__name__} cannot be traced; postplace traces "
            "torch.optim.SGD, Adam and AdamW (give one of them, or the name 'sgd', 'adam' or 'adamw')"
        )
    index = {id(p): k for k, p in enumerate(params)}
    group_of_param = [-1] * len(params)
    groups = []
    for g, group in enumerate(opt.param_groups):
        hp = {k: _plain(k, group[k], name) for k in _HYPER[name] if k in group}
        _check(name, hp, group)
        groups.append(hp)
        for p in group["params"]:
            k = index.get(id(p))
            if k is None:
                raise PostplaceError(
                    f"the {name} optimizer holds a tensor that is not one of the model's parameters; "
                    "build it over model.parameters() (or a factory that receives them)"
                )
            if params[k].requires_grad:
                group_of_param[k] = g
    return StepOptimizer(name, tuple(groups), tuple(group_of_param))


def _build(optimizer, trained: list[torch.Tensor], lr: float | None) -> torch.optim.Optimizer:
    if lr is not None and (isinstance(lr, bool) or not isinstance(lr, int | float) or not math.isfinite(lr) or lr < 0):
        raise PostplaceError(f"lr must be a finite number >= 0, got {lr!r}")
    extra = {} if lr is None else {"lr": float(lr)}
    if isinstance(optimizer, torch.optim.Optimizer):
        if lr is not None:
            raise PostplaceError("lr= with an optimizer already built: set the learning rate when building it")
        return optimizer
    if isinstance(optimizer, str):
        key = optimizer.lower()
        if key not in NAMED:
            raise PostplaceError(
                f"unknown optimizer '{optimizer}'; use one of {', '.join(NAMED)}, "
                "a torch.optim class, or a factory params -> Optimizer"
            )
        cls, kwargs = NAMED[key]
        return _construct(cls, {**kwargs, **extra}, trained)
    if isinstance(optimizer, tuple) and len(optimizer) == 2 and isinstance(optimizer[0], type):
        cls, kwargs = optimizer
        if not isinstance(kwargs, dict):
            raise PostplaceError(
                f"optimizer ({cls.__name__}, ...): the second item must be a dict of keyword "
                f"arguments, got {type(kwargs).__name__}"
            )
        return _construct(cls, {**kwargs, **extra}, trained)
    if isinstance(optimizer, type) and issubclass(optimizer, torch.optim.Optimizer):
        return _construct(optimizer, extra, trained)
    if callable(optimizer):
        if lr is not None:
            raise PostplaceError("lr= with an optimizer factory: set the learning rate inside the factory")
        return _from_factory(optimizer, trained)
    raise PostplaceError(
        f"optimizer must be a name, a torch.optim class, (class, kwargs) or a factory "
        f"params -> Optimizer, not a {type(optimizer).__name__}"
    )


def _construct(cls: type, kwargs: dict, trained: list[torch.Tensor]) -> torch.optim.Optimizer:
    if not (isinstance(cls, type) and issubclass(cls, torch.optim.Optimizer)):
        raise PostplaceError(f"optimizer class {cls!r} is not a torch.optim.Optimizer")
    try:
        return cls(trained, **kwargs)
    except (TypeError, ValueError) as exc:
        raise PostplaceError(f"cannot build {cls.__name__}({_kw(kwargs)}): {exc}") from None


def _from_factory(factory: Callable, trained: list[torch.Tensor]) -> torch.optim.Optimizer:
    try:
        opt = factory(trained)
    except Exception as exc:  # noqa: BLE001 - the user's factory failing is one line
        first = str(exc).splitlines()[0] if str(exc) else ""
        raise PostplaceError(
            f"the optimizer factory failed on the model's parameters: {type(exc).__name__}: {first}"
        ) from None
    if not isinstance(opt, torch.optim.Optimizer):
        raise PostplaceError(f"the optimizer factory returned a {type(opt).__name__}, not a torch.optim.Optimizer")
    return opt


def _kw(kwargs: dict) -> str:
    return ", ".join(f"{k}={v!r}" for k, v in kwargs.items())


def _plain(key: str, value, name: str):
    """A hyperparameter as a JSON-able Python value (a tensor learning rate becomes its float)."""
    if isinstance(value, torch.Tensor):
        if value.numel() != 1 or value.is_meta:
            raise PostplaceError(
                f"{name}: hyperparameter {key} is a tensor of shape {tuple(value.shape)}; give a number"
            )
        value = value.item()
    if isinstance(value, tuple | list):
        return [_plain(key, v, name) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        raise PostplaceError(f"{name}: hyperparameter {key} is {value}; it must be finite")
    return value


def _check(name: str, hp: dict, group: dict) -> None:
    if group.get("differentiable"):
        raise PostplaceError(
            f"{name} with differentiable=True cannot be placed: a training step does not "
            "differentiate through its update"
        )
    if name == "sgd" and hp["momentum"] != 0 and hp["dampening"] != 0:
        raise PostplaceError(
            f"sgd with dampening={hp['dampening']} cannot be traced exactly: its first step "
            "copies the gradient into the momentum buffer, which a graph that starts the "
            "buffer at zero does only without dampening; use dampening=0"
        )


# ---------------------------------------------------------------------------------- records
def optimizer_record(optimizer, lr: float | None = None) -> dict | None:
    """What ``optimizer`` (with ``lr``) resolves to for any model whose parameters form one group, as
    :meth:`StepOptimizer.describe` writes it, without a model; None for a factory or a built optimizer
    (their groups depend on the model). This is the key a cached zoo graph and a run folder keep."""
    if isinstance(optimizer, StepOptimizer):
        return optimizer.describe() if len(optimizer.groups) == 1 else None
    if isinstance(optimizer, torch.optim.Optimizer) or (callable(optimizer) and not isinstance(optimizer, type)):
        return None
    probe = torch.nn.Parameter(torch.zeros(1))
    return resolve_optimizer(optimizer, [probe], lr=lr).describe()


def optimizer_from_record(record) -> tuple[type, dict] | str:
    """The optimizer a run folder recorded (``describe()``'s dict, or an older folder's name), in a form
    :func:`resolve_optimizer` takes again."""
    if isinstance(record, str):
        return record
    try:
        name, groups = record["name"], record["groups"]
        (hp,) = groups
        cls = NAMED[name][0]
        accepted = inspect.signature(cls.__init__).parameters  # AdamW fixes decoupled_weight_decay itself
        kwargs = {k: tuple(v) if isinstance(v, list) else v for k, v in hp.items() if k in accepted}
    except (KeyError, TypeError, ValueError):
        raise PostplaceError(f"the recorded optimizer {record!r} is not one postplace wrote; start a new run") from None
    return cls, kwargs


def recorded_step(record: dict) -> dict:
    """``{"optimizer", "precision"}`` that trace a recorded step again, from a run's target spec or a
    graph's metadata (both keep ``optimizer`` and ``precision``; older ones: SGD, fp32)."""
    return {
        "optimizer": optimizer_from_record(record.get("optimizer", "sgd")),
        "precision": record.get("precision", "fp32"),
    }


def optimizer_mismatch(recorded, optimizer, lr: float | None) -> tuple[dict, dict] | None:
    """``(recorded, given)`` records when ``optimizer``/``lr`` name another optimizer than the one a run
    recorded (an older run's name stands for that optimizer at its defaults); None when they agree, when
    neither is given, or when the given one has no record of its own (a factory)."""
    if optimizer is None and lr is None:
        return None
    given = optimizer_record("sgd" if optimizer is None else optimizer, lr)
    if not isinstance(recorded, dict):
        recorded = optimizer_record(recorded)
    return None if given is None or given == recorded else (recorded, given)
