"""Trace one training step of a PyTorch model into an :class:`OpGraph` (fake tensors, no real compute).

The step is forward, ``loss_fn``, ``torch.autograd.grad`` and a per-parameter optimizer update, traced
by ``make_fx(tracing_mode="fake")`` into aten ops. Shapes are real, data is not: nothing is computed
and no weights are read, so a batch-32 Inception-V3 traces in seconds on a laptop.

From the aten graph to the OpGraph (:func:`postplace.graph.fx_to_opgraph.build_graph`):

* **Folding.** Ops that do no work (``getitem``, views such as ``view``/``t``/``transpose``/``expand``,
  ``detach``; any aten op whose result aliases an input without writing it) are folded into the op
  that produced their input: a consumer of a view gets a data edge from the view's producer, carrying
  that producer's whole output tensor (``slot`` = which output). ``_unsafe_view`` and
  ``unsafe_split`` (views in all but schema) fold too; an op with no inputs and an empty result
  (batch norm's reserve ``empty``) is dropped.
* **Sources.** Each parameter is an op of type ``parameter`` (phase ``other``) whose persistent bytes
  are the parameter plus its optimizer state (slot 0 = the parameter, slots 1.. = the state tensors);
  each buffer (e.g. BatchNorm running statistics) an op ``buffer``; each model input an op ``input``;
  each constant the loss function closed over (targets) an op ``constant``. Gradients are ordinary
  activations: live from the backward op that makes them to the update op that reads them.
* **Costs.** FLOPs from :mod:`postplace.graph.flops`; ``bytes_accessed`` = bytes of every tensor
  argument read + bytes of every result written; ``output_bytes`` = bytes of the results.
  In-place ops (``add_``: the result aliases an input it writes) have ``inplace=True`` and
  ``inplace_base`` = the op whose output they write (aten's ``self``, their first argument).
* **Phases.** Annotated while tracing (``forward``: model + loss; ``backward``: autograd; ``update``).
* **Modules.** Each forward aten node also records the path of the innermost ``nn.Module`` that issued
  it (``node.meta["custom"]["module"]``, ``""`` = the root module; absent = the loss function), so
  :mod:`postplace.runtime` can report a placement per module. ``OpGraph.module`` keeps it per op
  (backward ops take their forward partner's module, update ops and parameters their parameter's).
* **Micro-batches** (``microbatches=m``): one micro-batch is traced, then replicated by the graph pass
  :func:`postplace.graph.microbatch.replicate_microbatches`; ``OpGraph.microbatch`` says which
  micro-batch each op computes for (-1: shared). Colocation is linked per micro-batch (``none``) or
  across them (``module``); a buffer joins the ops of micro-batch 0 that use it (``none``: the other
  micro-batches read it and their running-statistics writes are copied back by the runtime). Under
  ``none`` no op of a micro-batch joins a shared op's set through a folded view or by inheritance
  (a bias gradient's ``sum`` stays with its micro-batch instead of following the gradient sum to the
  parameter), so no set spans two micro-batches.
* **Colocation** (:func:`_colocate`): forward and backward ops are linked through the autograd
  sequence number (``node.meta["seq_nr"]``): a forward op records the number of the autograd node it
  created, and while autograd runs that node's backward we tag every aten op it issues with the same
  number (a pre-hook on every node of the autograd graph; the tag stays until the next node runs, so
  the gradient accumulation autograd does after a node, where a tensor feeds several ops, carries that
  node's tag too). A backward op with a partner joins the forward op's colocation set; the backward of
  a folded view (``expand`` -> ``sum``) joins the op the view was folded into. Where PyTorch exposes
  no link (the loss seed ``ones_like``; ops of custom autograd code that bypasses the hooks) the op
  joins the set of its first consumer that has one, else stays unconstrained. Each parameter's update
  ops join the parameter op's set; each buffer the step writes in place (batch norm's running
  statistics) joins the ops that use it; a buffer it only reads (LLaMA's rotary tables, GPT-2's causal
  mask) joins nothing, so the layers that read it may sit on different devices, each sent a copy. ``graph.metadata
  ["colocation"]`` counts backward ops linked directly, inherited from a consumer, or left free, and
  ``coverage`` = linked directly / all backward ops.

Not modelled: write-after-read order (an update op could be simulated before a backward op that
still reads the old parameter; data edges order it after the gradient it needs, which covers the
models here); random-number state of dropout.
"""

from __future__ import annotations

import contextlib
import logging
import time
import traceback
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.fx.traceback as fxt
from torch.func import functional_call
from torch.fx._lazy_graph_module import _use_lazy_graph_module
from torch.fx.experimental.proxy_tensor import make_fx

from postplace.errors import PostplaceError
from postplace.graph.fx_to_opgraph import build_graph
from postplace.graph.microbatch import replicate_microbatches
from postplace.graph.opgraph import OpGraph
from postplace.graph.optimizers import StepOptimizer, resolve_optimizer

__all__ = ["COLOCATION_MODES", "PRECISION_DTYPES", "Traced", "from_torch", "trace"]

#: how a layer's micro-batches are colocated (see :func:`from_torch`)
COLOCATION_MODES = ("none", "module")

#: precision -> the dtype autocast runs the forward pass in (None: no autocast)
PRECISION_DTYPES = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}


@dataclass
class Traced:
    """A traced step: the OpGraph plus what is needed to run it for real (:mod:`postplace.cost.profile`).

    ``op_of_node`` maps every fx node name to the op it became or was folded into (-1: none).
    """

    graph: OpGraph
    gm: torch.fx.GraphModule
    model: torch.nn.Module
    inputs: tuple
    optimizer: StepOptimizer
    op_of_node: dict[str, int] = field(default_factory=dict)
    microbatches: int = 1
    batch: tuple = ()  #: the whole batch (inputs, then targets) when traced with ``targets=``
    precision: str = "fp32"

    def split_batch(self, tensors) -> tuple:
        """Placeholder-order step inputs from full-batch ``tensors`` (the inputs, then the targets when
        the step was traced with ``targets=``): each cut into ``microbatches`` equal slices along dim 0,
        micro-batch 0's tensors first. With nothing given, the traced batch."""
        if not tensors:
            return tuple(self.inputs)
        return tuple(_split(tuple(tensors), self.microbatches, "inputs"))

    def real_args(self) -> list[torch.Tensor]:
        """Real tensors in placeholder order: copies of parameters and buffers, zero state, the inputs."""
        params = [p.detach().clone() for _, p in self.model.named_parameters()]
        bufs = [b.detach().clone() for _, b in self.model.named_buffers()]
        state = [t for i, p in enumerate(params) for t in self.optimizer.initial_state(i, p)]
        return [*params, *bufs, *state, *self.inputs]


def from_torch(
    model: torch.nn.Module,
    inputs,
    loss_fn: Callable,
    optimizer="sgd",
    *,
    lr: float | None = None,
    precision: str = "fp32",
    name: str | None = None,
    microbatches: int = 1,
    targets=None,
    microbatch_colocation: str = "none",
) -> OpGraph:
    """The OpGraph of one training step of ``model``: forward, loss, gradients and the optimizer's update.

    The step is ``loss_fn(model(*inputs))`` (or ``loss_fn(model(*inputs), *targets)``), its gradients,
    and the ``optimizer``'s update, traced with fake tensors (nothing is computed).

    Parameters
    ----------
    model : torch.nn.Module
        The model; at least one parameter must require grad.
    inputs : tensor or tuple of tensors
        An example batch.
    loss_fn : callable
        ``outputs -> scalar tensor`` (or ``(outputs, *targets) -> scalar tensor`` with ``targets``).
    optimizer : str, torch.optim class, (class, kwargs) or factory
        The update (:mod:`postplace.graph.optimizers`): ``"sgd"`` (lr 0.1, momentum 0.9: the paper
        zoo's default), ``"adam"``, ``"adamw"``, a ``torch.optim`` class, ``(class, kwargs)``, or a
        factory ``params -> Optimizer``. The update traced is torch.optim's own (SGD, Adam and AdamW),
        with its state (moments, step count) persistent.
    lr : float, optional
        Overrides a name's or class's learning rate.
    precision : {"fp32", "bf16", "fp16"}
        ``"bf16"`` / ``"fp16"``: the forward pass and the loss run under ``torch.autocast`` in that
        dtype (the CPU's autocast op lists: matmuls and convolutions in low precision; losses in fp32),
        backward follows autograd, and parameters, gradients and optimizer state stay fp32 (master
        weights). Each op records the precision it computes in, and the cost model prices it at the
        device's peak for that precision. No loss scaling is traced: fp16 without a ``GradScaler`` can
        underflow small gradients, as eager fp16 autocast without one does.
    name : str, optional
        The graph's name (default: the model's class name).
    microbatches : int
        ``m > 1``: gradient accumulation over m micro-batches (needs ``targets``). Every input and
        target is cut into m equal slices along dim 0 (the batch size must divide by m); micro-batch
        k's loss is ``loss_fn(model(*inputs_k), *targets_k) / m``, so with a mean-reduced loss the
        summed gradient is the mean gradient over the whole batch, and the step returns the sum of
        the m scaled losses (the mean of the micro-batch losses). Forward and backward run once per
        micro-batch in order, gradients are summed in program order, and the optimizer updates once.
        What differs from one full-batch step: batch statistics are per micro-batch (batch norm
        normalises each micro-batch by its own mean and variance, and its running statistics are
        updated m times, with the momentum applied m times), exactly as eager gradient accumulation
        does. See :mod:`postplace.graph.microbatch`.
    targets : tensor or tuple of tensors, optional
        The labels (``()`` for a loss without targets), so that a placed step takes new ones each
        call, ``step(inputs, targets)``; a ``loss_fn(outputs)`` that closes over them is traced with
        those values baked in, and a warning says so.
    microbatch_colocation : {"none", "module"}
        ``"none"``: the search may put one layer's micro-batches on different devices (data
        parallelism is a placement); ``"module"``: every micro-batch's ops of a layer are colocated
        (pure pipelines).

    Returns
    -------
    OpGraph
        The step's ops and edges, with its optimizer, precision and parameter bytes in ``metadata``.

    Raises
    ------
    PostplaceError
        One line, if the step cannot be traced (e.g. when control flow depends on tensor values), or
        for inputs or targets that are not tensors, no trainable parameter, an unknown precision or
        colocation mode, or micro-batches without targets.
    """
    return trace(
        model,
        inputs,
        loss_fn,
        optimizer,
        lr=lr,
        precision=precision,
        name=name,
        microbatches=microbatches,
        targets=targets,
        microbatch_colocation=microbatch_colocation,
    ).graph


def trace(
    model: torch.nn.Module,
    inputs,
    loss_fn: Callable,
    optimizer="sgd",
    *,
    lr: float | None = None,
    precision: str = "fp32",
    name: str | None = None,
    metadata: dict | None = None,
    microbatches: int = 1,
    targets=None,
    microbatch_colocation: str = "none",
) -> Traced:
    """Like :func:`from_torch`, but also return the fx graph module and the node -> op map."""
    if precision not in PRECISION_DTYPES:
        raise PostplaceError(f"unknown precision {precision!r}; use one of {', '.join(PRECISION_DTYPES)}")
    inputs = tuple(inputs) if isinstance(inputs, list | tuple) else (inputs,)
    label = name or type(model).__name__
    m = microbatches
    if isinstance(m, bool) or not isinstance(m, int) or m < 1:
        raise PostplaceError(f"microbatches must be a whole number >= 1, got {m!r}")
    if microbatch_colocation not in COLOCATION_MODES:
        raise PostplaceError(
            f"unknown micro-batch colocation '{microbatch_colocation}'; use one of {', '.join(COLOCATION_MODES)}"
        )
    if targets is None and m > 1:
        raise PostplaceError(
            f"cannot trace {label} with {m} micro-batches: give the targets (targets=...) and a "
            "loss_fn(outputs, *targets), so each micro-batch's loss gets its own targets"
        )
    if targets is not None:
        targets = tuple(targets) if isinstance(targets, list | tuple) else (targets,)
        bad = [type(x).__name__ for x in targets if not isinstance(x, torch.Tensor)]
        if bad:
            raise PostplaceError(f"cannot trace {label}: targets must be tensors (got {', '.join(bad)})")
    if not any(p.requires_grad for p in model.parameters()):
        raise PostplaceError(
            f"cannot trace a training step of {label}: it has no parameter that requires grad; "
            "unfreeze the parameters (p.requires_grad_(True)) to place a training step"
        )
    bad = [type(x).__name__ for x in inputs if not isinstance(x, torch.Tensor)]
    if bad:
        raise PostplaceError(
            f"cannot trace {label}: inputs must be tensors (got {', '.join(bad)}); "
            "close over other arguments in a wrapper module"
        )
    pnames = [n for n, _ in model.named_parameters()]
    bnames = [n for n, _ in model.named_buffers()]
    opt = resolve_optimizer(optimizer, [p for _, p in model.named_parameters()], lr=lr)
    n_inputs = len(inputs)
    per_mb = _split((*inputs, *(targets or ())), m, label)  # micro-batch 0's slices first
    own = len(per_mb) // m
    step = _make_step(model, loss_fn, pnames, bnames, opt, n_inputs, targets is not None, m, precision)
    fake = torch._subclasses.fake_tensor.FakeTensorMode(allow_non_fake_inputs=True)
    params = [_fake(fake, p.detach()).requires_grad_(p.requires_grad) for _, p in model.named_parameters()]
    bufs = [_fake(fake, b) for _, b in model.named_buffers()]
    with fake:
        state = [t for i, p in enumerate(params) for t in opt.initial_state(i, p)]
    args = [*params, *bufs, *state, *(_fake(fake, x) for x in per_mb[:own])]
    t0 = time.perf_counter()
    try:
        # a lazy GraphModule writes its Python code only when first run: graph-only callers never pay
        with fxt.preserve_node_meta(), torch.random.fork_rng(), _quiet_fake_tensor_log(), _use_lazy_graph_module(True):
            gm = make_fx(step, tracing_mode="fake")(args)
    except PostplaceError:
        raise
    except Exception as exc:  # noqa: BLE001 - any tracing failure becomes one user-facing line
        raise PostplaceError(_explain(label, exc)) from None
    if m > 1:
        gm = replicate_microbatches(gm, m, len(params) + len(bufs) + len(state))
    norms = _batch_norms(model) if m > 1 else []
    if norms:
        warnings.warn(MicrobatchNormWarning(norm_note(label, norms)), stacklevel=2)
    trace_s = time.perf_counter() - t0
    meta = {
        "source": "torch",
        "model": label,
        "optimizer": opt.describe(),
        "optimizer_slots": opt.slots,
        "precision": precision,
        "torch_version": torch.__version__,
        "trace_seconds": trace_s,
        "microbatches": m,
        "microbatch_colocation": microbatch_colocation,
        **({"microbatch_norms": norms} if norms else {}),
        **(metadata or {}),
    }
    graph, op_of_node = build_graph(
        gm,
        pnames,
        bnames,
        [len(opt.state_names(i)) for i in range(len(pnames))],
        label,
        meta,
        root=type(model).__name__,
        n_targets=len(targets or ()),
        colocation=microbatch_colocation,
    )
    if targets is None and not getattr(loss_fn, "targets_are_fixed", False):
        _warn_captured(graph, label)
    whole = (*inputs, *targets) if targets is not None else ()
    return Traced(graph, gm, model, tuple(per_mb), opt, op_of_node, m, whole, precision)


def _fake(mode, t: torch.Tensor) -> torch.Tensor:
    """A fake copy of ``t``; a meta tensor (a model too big to build for real) becomes a fake CPU
    tensor, so CPU autocast applies to it and nothing is ever allocated."""
    if t.is_meta:
        with mode:
            return torch.empty_strided(tuple(t.shape), tuple(t.stride()), dtype=t.dtype, device="cpu")
    return mode.from_tensor(t)


def _warn_captured(graph: OpGraph, label: str) -> None:
    consts = [n for n, t in zip(graph.names, graph.op_types, strict=True) if t == "constant"]
    if consts:
        warnings.warn(
            f"{label}: the traced step reads {len(consts)} tensor(s) captured at trace time ({consts[0]}...), "
            "e.g. targets the loss_fn closed over; every run of the placed step uses these same values. "
            "Give the labels as targets (place: step=Step(targets=(y,)); trace: targets=(y,)) with a "
            "loss_fn(outputs, y) to pass new ones each step",
            CapturedTensorWarning,
            stacklevel=3,
        )


class CapturedTensorWarning(UserWarning):
    """The traced step reads a tensor captured at trace time (a loss closed over its targets)."""


class MicrobatchNormWarning(UserWarning):
    """A step split into micro-batches changes what a batch-norm layer normalises over."""


def _batch_norms(model) -> list[str]:
    """The batch-norm layers in training mode (their batch statistics depend on the batch they see)."""
    return [
        name or type(mod).__name__
        for name, mod in model.named_modules()
        if isinstance(mod, torch.nn.modules.batchnorm._BatchNorm) and mod.training
    ]


def norm_note(label: str, norms: list[str]) -> str:
    """What splitting into micro-batches does to ``norms``, in one line (a warning, and a table's note)."""
    first = ", ".join(norms[:2]) + (", ..." if len(norms) > 2 else "")
    return (
        f"{label}: {len(norms)} batch-norm layer(s) ({first}) compute their batch statistics over each "
        "micro-batch, not the whole batch, so a step of more than one micro-batch trains differently from "
        "eager full-batch training; place at microbatches=1 to keep full-batch statistics"
    )


def _split(tensors: tuple, m: int, label: str) -> list:
    """Every tensor cut into ``m`` equal slices along dim 0; micro-batch 0's slices first."""
    if m == 1:
        return list(tensors)
    sizes = {tuple(x.shape[:1]) for x in tensors}
    if any(x.dim() == 0 for x in tensors) or len(sizes) > 1:
        shapes = ", ".join(str(tuple(x.shape)) for x in tensors)
        raise PostplaceError(
            f"cannot split {label} into {m} micro-batches: inputs and targets must share one batch "
            f"dimension (dim 0), got shapes {shapes}"
        )
    b = tensors[0].shape[0]
    if b % m:
        raise PostplaceError(f"cannot split {label}'s batch of {b} into {m} equal micro-batches; pick m dividing {b}")
    k = b // m
    return [x[i * k : (i + 1) * k] for i in range(m) for x in tensors]


# ------------------------------------------------------------------------------------- the step
def _make_step(model, loss_fn, pnames, bnames, opt, n_inputs=None, with_targets=False, m=1, precision="fp32"):
    n_p, n_b = len(pnames), len(bnames)
    counts = [len(opt.state_names(i)) for i in range(n_p)]
    starts = [n_p + n_b + sum(counts[:i]) for i in range(n_p + 1)]
    dtype = PRECISION_DTYPES[precision]
    autocast = contextlib.nullcontext() if dtype is None else torch.autocast("cpu", dtype=dtype)

    def step(flat):
        params, bufs = flat[:n_p], flat[n_p : n_p + n_b]
        data = flat[starts[n_p] :]
        k = len(data) if n_inputs is None else n_inputs
        inputs, targets = data[:k], data[k:]
        with fxt.annotate({"phase": "forward"}), _tag_modules(model), autocast:
            out = functional_call(
                model,
                {**dict(zip(pnames, params, strict=True)), **dict(zip(bnames, bufs, strict=True))},
                tuple(inputs),
            )
            loss = loss_fn(out, *targets) if with_targets else loss_fn(out)
            if m > 1 and isinstance(loss, torch.Tensor):
                loss = loss / m
        if not isinstance(loss, torch.Tensor) or loss.numel() != 1 or not loss.requires_grad:
            raise PostplaceError(
                f"loss_fn returned {type(loss).__name__} {tuple(getattr(loss, 'shape', ()))}; "
                "it must return a scalar tensor that depends on the model's parameters"
            )
        wrt = [p for p in params if p.requires_grad]
        with fxt.annotate({"phase": "backward"}), _tag_backward(loss):
            grads = iter(torch.autograd.grad(loss, wrt, allow_unused=True))
        with torch.no_grad():
            for i, p in enumerate(params):
                g = next(grads) if p.requires_grad else None
                if g is not None and opt.group_of_param[i] >= 0:
                    with fxt.annotate({"phase": "update", "param": i}):
                        opt.update(i, p, g, list(flat[starts[i] : starts[i + 1]]))
        return loss

    return step


@contextlib.contextmanager
def _tag_modules(model):
    """Annotate the aten ops each module issues with its path (innermost module wins), via hooks."""
    handles, open_tags = [], []

    def pre(path):
        def hook(module, args):
            ctx = fxt.annotate({"module": path})
            ctx.__enter__()
            open_tags.append(ctx)

        return hook

    def post(module, args, output):
        if open_tags:
            open_tags.pop().__exit__(None, None, None)

    for path, mod in model.named_modules():
        handles.append(mod.register_forward_pre_hook(pre(path)))
        handles.append(mod.register_forward_hook(post, always_call=True))
    try:
        yield
    finally:
        while open_tags:
            open_tags.pop().__exit__(None, None, None)
        for h in handles:
            h.remove()


@contextlib.contextmanager
def _tag_backward(loss):
    """Tag the aten ops each autograd node issues with that node's sequence number (see module doc).

    A tag opens when autograd is about to run a node and stays open until it runs the next one, so
    the gradient accumulation autograd does right after a node (summing that node's contribution into
    a tensor that feeds several ops) carries the node's tag too.
    """
    handles, open_tags = [], []

    def close():
        while open_tags:
            open_tags.pop().__exit__(None, None, None)

    def pre(seq):
        def hook(grad_outputs):
            close()
            ctx = fxt.annotate({"grad_fn": seq})
            ctx.__enter__()
            open_tags.append(ctx)

        return hook

    seen, todo = set(), [loss.grad_fn]
    while todo:
        node = todo.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        handles.append(node.register_prehook(pre(node._sequence_nr())))
        todo.extend(fn for fn, _ in node.next_functions)
    try:
        yield
    finally:
        close()
        for h in handles:
            h.remove()


@contextlib.contextmanager
def _quiet_fake_tensor_log():
    """Fake tensors log a full traceback when an op fails on them; we raise one line instead."""
    log = logging.getLogger("torch._subclasses.fake_tensor")
    level = log.level
    log.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        log.setLevel(level)


def _explain(label: str, exc: Exception) -> str:
    """One line: what failed, where in the user's code, what to try."""
    msg = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    where = ""
    for fr in reversed(traceback.extract_tb(exc.__traceback__)):
        if "/torch/" not in fr.filename and "/postplace/" not in fr.filename:
            where = f" at {fr.filename}:{fr.lineno}"
            break
    data_dep = "DataDependent" in type(exc).__name__ or "data-dependent" in msg or "data dependent" in msg
    if data_dep:
        if "_local_scalar_dense" in msg:
            msg = "a tensor is read as a Python value, e.g. by if, bool() or .item()"
        return (
            f"cannot trace {label}{where}: its control flow depends on tensor values ({msg[:160]}); "
            "make branches and loop counts depend on shapes or config only (use torch.where for "
            "value-dependent choices), or import a profiled graph file instead"
        )
    if "Expected more than 1 value per channel when training" in msg:  # torch's batch norm on one sample
        return (
            f"cannot trace {label}{where}: a batch norm layer computes its statistics over each micro-batch and "
            "needs 2 or more samples in each; use fewer micro-batches (or fewer replicas) or a larger batch"
        )
    return (
        f"cannot trace {label}{where}: {type(exc).__name__}: {msg[:200]}; check that the step runs "
        "eagerly on CPU with these inputs, or import a profiled graph file instead"
    )
