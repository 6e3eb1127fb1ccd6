"""Trace one training step of a PyTorch model into an :class:`OpGraph` (fake tensors, no real compute).

The step is forward, ``loss_fn``, ``torch.autograd.grad`` and a per-parameter optimizer update, traced
by ``make_fx(tracing_mode="fake")`` into aten ops. Shapes are real, data is not: nothing is computed
and no weights are read, so a batch-32 Inception-V3 traces in seconds on a laptop.

From the aten graph to the OpGraph (:func:`_build_graph`):

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
  In-place ops (``add_``: the result aliases an input it writes) have ``inplace=True``.
* **Phases.** Annotated while tracing (``forward``: model + loss; ``backward``: autograd; ``update``).
* **Colocation** (:func:`_colocate`): forward and backward ops are linked through the autograd
  sequence number (``node.meta["seq_nr"]``): a forward op records the number of the autograd node it
  created, and while autograd runs that node's backward we tag every aten op it issues with the same
  number (a pre-hook on every node of the autograd graph; the tag stays until the next node runs, so
  the gradient accumulation autograd does after a node, where a tensor feeds several ops, carries that
  node's tag too). A backward op with a partner joins the forward op's colocation set; the backward of
  a folded view (``expand`` -> ``sum``) joins the op the view was folded into. Where PyTorch exposes
  no link (the loss seed ``ones_like``; ops of custom autograd code that bypasses the hooks) the op
  joins the set of its first consumer that has one, else stays unconstrained. Each parameter's update
  ops join the parameter op's set; each buffer joins the ops that use it. ``graph.metadata
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
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.fx.traceback as fxt
from torch.func import functional_call
from torch.fx.experimental.proxy_tensor import make_fx

from postplace.errors import PostplaceError
from postplace.graph.flops import op_flops, tensor_bytes
from postplace.graph.opgraph import OpGraph

__all__ = ["OPTIMIZERS", "Traced", "from_torch", "trace"]

#: optimizer name -> state tensors per parameter (SGD momentum buffer; Adam first and second moments)
OPTIMIZERS = {"sgd": 1, "adam": 2}


@dataclass
class Traced:
    """A traced step: the OpGraph plus what is needed to run it for real (:mod:`postplace.cost.profile`).

    ``op_of_node`` maps every fx node name to the op it became or was folded into (-1: none).
    """

    graph: OpGraph
    gm: torch.fx.GraphModule
    model: torch.nn.Module
    inputs: tuple
    optimizer: str
    op_of_node: dict[str, int] = field(default_factory=dict)

    def real_args(self) -> list[torch.Tensor]:
        """Real tensors in placeholder order: copies of parameters and buffers, zero state, the inputs."""
        params = [p.detach().clone() for _, p in self.model.named_parameters()]
        bufs = [b.detach().clone() for _, b in self.model.named_buffers()]
        state = [torch.zeros_like(p) for p in params for _ in range(OPTIMIZERS[self.optimizer])]
        return [*params, *bufs, *state, *self.inputs]


def from_torch(
    model: torch.nn.Module, inputs, loss_fn: Callable, optimizer: str = "sgd", *, name: str | None = None
) -> OpGraph:
    """The OpGraph of one training step of ``model`` on ``inputs``: ``loss_fn(model(*inputs))``,
    its gradients, and an ``optimizer`` update (``"sgd"`` with momentum, or ``"adam"``).

    ``inputs`` is a tensor or a tuple of tensors; ``loss_fn(outputs)`` returns a scalar tensor and may
    close over real target tensors. Raises :class:`PostplaceError` (one line) if the step cannot be
    traced, e.g. when control flow depends on tensor values.
    """
    return trace(model, inputs, loss_fn, optimizer, name=name).graph


def trace(
    model: torch.nn.Module,
    inputs,
    loss_fn: Callable,
    optimizer: str = "sgd",
    *,
    name: str | None = None,
    metadata: dict | None = None,
) -> Traced:
    """Like :func:`from_torch`, but also return the fx graph module and the node -> op map."""
    if optimizer not in OPTIMIZERS:
        raise PostplaceError(f"unknown optimizer '{optimizer}'; use one of {sorted(OPTIMIZERS)}")
    inputs = tuple(inputs) if isinstance(inputs, list | tuple) else (inputs,)
    label = name or type(model).__name__
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
    step = _make_step(model, loss_fn, pnames, bnames, optimizer)
    fake = torch._subclasses.fake_tensor.FakeTensorMode(allow_non_fake_inputs=True)
    params = [
        fake.from_tensor(p.detach()).requires_grad_(p.requires_grad) for _, p in model.named_parameters()
    ]
    bufs = [fake.from_tensor(b) for _, b in model.named_buffers()]
    with fake:
        state = [torch.empty_like(p) for p in params for _ in range(OPTIMIZERS[optimizer])]
    args = [*params, *bufs, *state, *(fake.from_tensor(x) for x in inputs)]
    t0 = time.perf_counter()
    try:
        with fxt.preserve_node_meta(), torch.random.fork_rng(), _quiet_fake_tensor_log():
            gm = make_fx(step, tracing_mode="fake")(args)
    except PostplaceError:
        raise
    except Exception as exc:  # noqa: BLE001 - any tracing failure becomes one user-facing line
        raise PostplaceError(_explain(label, exc)) from None
    trace_s = time.perf_counter() - t0
    meta = {
        "source": "torch",
        "model": label,
        "optimizer": optimizer,
        "optimizer_slots": OPTIMIZERS[optimizer],
        "torch_version": torch.__version__,
        "trace_seconds": trace_s,
        **(metadata or {}),
    }
    trains = [p.requires_grad for _, p in model.named_parameters()]
    graph, op_of_node = _build_graph(gm, pnames, bnames, trains, optimizer, label, meta)
    return Traced(graph, gm, model, inputs, optimizer, op_of_node)


# ------------------------------------------------------------------------------------- the step
def _make_step(model, loss_fn, pnames, bnames, optimizer):
    slots = OPTIMIZERS[optimizer]
    n_p, n_b = len(pnames), len(bnames)

    def step(flat):
        params, bufs = flat[:n_p], flat[n_p : n_p + n_b]
        state, inputs = flat[n_p + n_b : n_p + n_b + n_p * slots], flat[n_p + n_b + n_p * slots :]
        with fxt.annotate({"phase": "forward"}):
            out = functional_call(
                model,
                {**dict(zip(pnames, params, strict=True)), **dict(zip(bnames, bufs, strict=True))},
                tuple(inputs),
            )
            loss = loss_fn(out)
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
                if g is not None:
                    with fxt.annotate({"phase": "update", "param": i}):
                        _update(optimizer, p, g, state[i * slots : (i + 1) * slots])
        return loss

    return step


def _update(optimizer: str, p, g, state) -> None:
    """One optimizer step for one parameter, as torch.optim's single-tensor (``foreach=False``) code
    does at steady state (state already exists): SGD lr 0.1, momentum 0.9; Adam lr 1e-3,
    betas (0.9, 0.999), eps 1e-8, bias corrections of step 1000 (a Python number, not a tensor)."""
    if optimizer == "sgd":
        (buf,) = state
        buf.mul_(0.9).add_(g)
        p.add_(buf, alpha=-0.1)
    else:
        m, v = state
        b1, b2, t = 0.9, 0.999, 1000
        m.lerp_(g, 1 - b1)
        v.mul_(b2).addcmul_(g, g, value=1 - b2)
        denom = (v.sqrt() / (1 - b2**t) ** 0.5).add_(1e-8)
        p.addcdiv_(m, denom, value=-1e-3 / (1 - b1**t))


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
    return (
        f"cannot trace {label}{where}: {type(exc).__name__}: {msg[:200]}; check that the step runs "
        "eagerly on CPU with these inputs, or import a profiled graph file instead"
    )


# ------------------------------------------------------------------------------------- the graph
#: aten ops that do no work but whose schema does not declare an alias (or that only drop autograd)
_VIEW_LIKE = frozenset(
    "detach alias lift_fresh _unsafe_view _reshape_alias unsafe_split unsafe_split_with_sizes "
    "unsafe_chunk".split()
)


def _is_view(node: torch.fx.Node) -> bool:
    """True for ops that do no work: getitem, detach, and aten ops whose result aliases an input
    they do not write (views)."""
    t = node.target
    if t is __import__("operator").getitem:
        return True
    schema = getattr(t, "_schema", None)
    if schema is None:
        return False
    if t.overloadpacket.__name__ in _VIEW_LIKE:
        return True
    rets = schema.returns
    return bool(rets) and rets[0].alias_info is not None and not rets[0].alias_info.is_write


def _is_inplace(node: torch.fx.Node) -> bool:
    schema = getattr(node.target, "_schema", None)
    rets = schema.returns if schema is not None else ()
    return bool(rets) and rets[0].alias_info is not None and rets[0].alias_info.is_write


class _Ops:
    """Growing per-op lists; turned into an OpGraph at the end."""

    def __init__(self):
        self.names, self.types, self.flops, self.bytes, self.out = [], [], [], [], []
        self.persist, self.phase, self.inplace, self.seq, self.param = [], [], [], [], []
        self.slot_bytes: dict[tuple[int, int], float] = {}

    def add(
        self,
        name,
        typ,
        phase,
        *,
        flops=0.0,
        nbytes=0.0,
        out=0.0,
        persist=0.0,
        inplace=False,
        seq=None,
        param=None,
    ) -> int:
        self.names.append(name)
        self.types.append(typ)
        self.flops.append(flops)
        self.bytes.append(nbytes)
        self.out.append(out)
        self.persist.append(persist)
        self.phase.append(phase)
        self.inplace.append(inplace)
        self.seq.append(seq)
        self.param.append(param)
        return len(self.names) - 1


def _build_graph(gm, pnames, bnames, trains, optimizer, label, meta):
    n_p, n_b = len(pnames), len(bnames)
    slots = OPTIMIZERS[optimizer]
    ops = _Ops()
    where: dict[str, tuple[int, int] | None] = {}  # fx node name -> (op, slot) its value lives in
    op_of_node: dict[str, int] = {}
    edges: dict[tuple[int, int, int], float] = {}
    consts: dict[str, int] = {}
    n_call, phase = 0, "forward"
    view_seq: list[tuple[int, int]] = []  # (seq_nr, op) of forward views folded into that op
    placeholders = 0
    ph_names = [nd.name for nd in gm.graph.nodes if nd.op == "placeholder"]
    for node in gm.graph.nodes:
        val = node.meta.get("val")
        if node.op == "placeholder":
            k = placeholders
            placeholders += 1
            nbytes = tensor_bytes(val)
            if k < n_p:
                trained = trains[k]  # a frozen parameter has no optimizer state
                i = ops.add(
                    f"param:{pnames[k]}",
                    "parameter",
                    "other",
                    out=nbytes,
                    persist=nbytes * (1 + slots * trained),
                    param=k,
                )
                where[node.name] = (i, 0)
            elif k < n_p + n_b:
                i = ops.add(f"buffer:{bnames[k - n_p]}", "buffer", "other", out=nbytes, persist=nbytes)
                where[node.name] = (i, 0)
            elif k < n_p + n_b + n_p * slots:
                j = k - n_p - n_b
                i = where[ph_names[j // slots]][0]
                where[node.name] = (i, 1 + j % slots)
            else:
                i = ops.add(f"input:{k - n_p - n_b - n_p * slots}", "input", "forward", out=nbytes)
                where[node.name] = (i, 0)
            ops.slot_bytes[where[node.name]] = float(nbytes)
            op_of_node[node.name] = where[node.name][0]
            continue
        if node.op == "get_attr":
            if node.target not in consts:
                nbytes = tensor_bytes(val)
                consts[node.target] = ops.add(f"const:{node.target}", "constant", "other", out=nbytes)
                ops.slot_bytes[(consts[node.target], 0)] = float(nbytes)
            where[node.name] = (consts[node.target], 0)
            op_of_node[node.name] = consts[node.target]
            continue
        if node.op != "call_function":
            continue
        n_call += 1
        custom = node.meta.get("custom") or {}
        phase = custom.get("phase", phase)
        if _is_view(node):
            where[node.name] = _fold(node, where)
            op_of_node[node.name] = where[node.name][0] if where[node.name] else -1
            if phase == "forward" and where[node.name] is not None and node.meta.get("seq_nr") is not None:
                view_seq.append((node.meta["seq_nr"], where[node.name][0]))
            continue
        if not node.all_input_nodes and tensor_bytes(val) == 0:  # e.g. batch norm's empty reserve
            where[node.name] = None
            op_of_node[node.name] = -1
            continue
        args = torch.fx.node.map_arg(node.args, lambda n: n.meta.get("val"))
        kwargs = torch.fx.node.map_arg(node.kwargs, lambda n: n.meta.get("val"))
        read = sum(tensor_bytes(a.meta.get("val")) for a in node.all_input_nodes)
        out = tensor_bytes(val)
        seq = custom.get("grad_fn") if phase == "backward" else node.meta.get("seq_nr")
        i = ops.add(
            node.name,
            node.target.overloadpacket.__name__,
            phase,
            flops=op_flops(node.target, args, kwargs, val),
            nbytes=float(read + out),
            out=float(out),
            inplace=_is_inplace(node),
            seq=seq,
            param=custom.get("param"),
        )
        where[node.name] = (i, 0)
        op_of_node[node.name] = i
        vals = val if isinstance(val, list | tuple) else [val]
        for s, v in enumerate(vals):
            ops.slot_bytes[(i, s)] = float(tensor_bytes(v))
        for a in node.all_input_nodes:
            src = where.get(a.name)
            if src is not None and src[0] != i:
                edges[(src[0], i, src[1])] = ops.slot_bytes.get(src, 0.0)
    coloc, report = _colocate(ops, edges, view_seq)
    meta = {
        **meta,
        "ops_before_folding": n_call,
        "colocation": report,
        "param_bytes": float(sum(ops.out[i] for i in range(len(ops.names)) if ops.types[i] == "parameter")),
        "buffer_bytes": float(sum(ops.persist[i] for i in range(len(ops.names)) if ops.types[i] == "buffer")),
    }
    graph = OpGraph.build(
        ops.names,
        [(s, d, b, sl) for (s, d, sl), b in edges.items()],
        op_types=ops.types,
        flops=ops.flops,
        bytes_accessed=ops.bytes,
        output_bytes=ops.out,
        persistent_bytes=ops.persist,
        colocation=coloc,
        phase=ops.phase,
        inplace=ops.inplace,
        memory_mode="live",
        name=label,
        metadata=meta,
    )
    return graph, op_of_node


def _fold(node, where) -> tuple[int, int] | None:
    """Where a view's value lives: ``getitem(x, k)`` of a real op is that op's slot k; any other view
    lives where its first tensor argument lives."""
    src = node.all_input_nodes[0] if node.all_input_nodes else None
    if src is None:
        return None
    base = where.get(src.name)
    if (
        node.target.__name__ == "getitem"
        and base is not None
        and not _is_view_node(src)
        and src.op == "call_function"
    ):
        return (base[0], int(node.args[1]))
    return base


def _is_view_node(node) -> bool:
    return node.op == "call_function" and _is_view(node)


def _colocate(ops: _Ops, edges, view_seq) -> tuple[np.ndarray, dict]:
    n = len(ops.names)
    parent = list(range(n))

    def find(x):
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    def union(a, b):
        ra, rb = find(a), find(b)
        if ra != rb:
            parent[max(ra, rb)] = min(ra, rb)

    fwd: dict[int, list[int]] = {}
    for i in range(n):
        if ops.phase[i] == "forward" and ops.seq[i] is not None and ops.types[i] not in ("input",):
            fwd.setdefault(ops.seq[i], []).append(i)
    for seq, i in view_seq:  # a view's backward (e.g. expand -> sum) goes where the view's value lives
        if ops.types[i] != "input" and i not in fwd.get(seq, []):
            fwd.setdefault(seq, []).append(i)
    succ: dict[int, list[int]] = {}
    for s, d, _sl in sorted(edges):
        succ.setdefault(s, []).append(d)
    param_op = {ops.param[i]: i for i in range(n) if ops.types[i] == "parameter"}
    direct, free = 0, []
    bwd = [i for i in range(n) if ops.phase[i] == "backward"]
    linked = set()
    for i in bwd:
        partners = fwd.get(ops.seq[i]) if ops.seq[i] is not None else None
        if partners:
            direct += 1
            linked.add(i)
            for j in partners:
                union(i, j)
        else:
            free.append(i)
    inherited = 0
    for i in reversed(free):  # consumers come later in program order: resolve them first
        heir = next((d for d in succ.get(i, []) if d in linked or ops.phase[d] == "update"), None)
        if heir is not None:
            union(i, heir)
            linked.add(i)
            inherited += 1
    for i in range(n):
        if ops.phase[i] == "update" and ops.param[i] in param_op:
            union(i, param_op[ops.param[i]])
        if ops.types[i] == "buffer":
            for d in succ.get(i, []):
                union(i, d)
    roots = [find(i) for i in range(n)]
    sizes: dict[int, int] = {}
    for r in roots:
        sizes[r] = sizes.get(r, 0) + 1
    ids: dict[int, int] = {}
    coloc = np.full(n, -1, dtype=np.int64)
    for i, r in enumerate(roots):
        if sizes[r] > 1:
            coloc[i] = ids.setdefault(r, len(ids))
    n_b = len(bwd)
    report = {
        "backward_ops": n_b,
        "linked_by_seq_nr": direct,
        "inherited_from_consumer": inherited,
        "unconstrained": n_b - direct - inherited,
        "coverage": direct / n_b if n_b else 1.0,
        "sets": len(ids),
        "update_ops_with_parameter": sum(
            1 for i in range(n) if ops.phase[i] == "update" and ops.param[i] in param_op
        ),
    }
    return coloc, report
