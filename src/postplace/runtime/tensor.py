"""Tensor parallelism (``ddp:tp=T``) as one program per rank: Megatron-LM's split of the traced step, with
the shapes each GPU of the group really computes (DESIGN.md section 7).

The simulated plan (:func:`postplace.plans.tensor.tensor_parallel`) decides which parameters are split and
prices the step one GPU of the group runs. Here the same decision (:func:`postplace.plans.tensor.split_linears`
on the traced step's graph) becomes a real program: rank j of the group holds its part of every split parameter
and of its optimizer state, and every fx node of the step is rewritten for the tensors it then reads. Each
value has a *layout*:

* whole: every rank holds all of it (the residual stream, the norms, the embedding);
* split along one dimension: the dimension of size S is ``groups`` blocks of ``degree`` parts, rank j holding
  part j of every block (``groups`` > 1 for a fused layer: GPT-2's one query/key/value matrix is three blocks,
  so each rank holds its heads of each; a batch-of-heads dimension after a reshape is one block per sequence);
* partial: every rank holds a full-sized term and the value is their sum (a row-split product, a
  column-split layer's input gradient), with, for a row-split layer's bias, the bias to add after the sum.

The layout of a node's output follows from its inputs' (a matrix product of a split activation and a weight
split along the same contraction dimension is partial; a view keeps the split on the dimension that holds
the same elements; a pointwise op keeps it where it broadcasts), and the node's arguments are rewritten
for the local shapes (a view's shape, a split's size). Where a partial value meets an op that is not a
sum, it is all-reduced over the group first, exactly where the simulated plan's ``tp_all_reduce`` sits: the
same ops keep a partial sum partial here and there (views, copies, sums of partial sums).

The vocabulary-split head's cross-entropy is Megatron-LM's: the log-softmax over the split logits
all-reduces each token's maximum and sum of exponentials, the loss all-reduces the target's log-probability
(three fp32 values per token, what the simulated plan charges), and its backward is local (the gradient of
log-softmax under the loss is ``softmax - one_hot``, whose per-token sum every rank knows).

Sequence parallelism (``tp=T,sp``) splits by tokens the ops the simulated plan splits so (the plan's own list,
:func:`sequence_split_of`): their values are laid out split along the sequence (of each
sequence's tokens, rank j holds the j-th 1/T), each partial sum such an op reads is reduce-scattered by tokens
(once per value), what any other op reads of them is all-gathered (once per value and phase: a norm's output
again in the backward), and a parameter's gradient summed over the rank's tokens is all-reduced over the group as
it leaves its op (per micro-batch). An op so split whose inputs are whole here (a dropout's mask, drawn whole
so that every rank's generator stays in step) takes its rank's tokens of them. In a pipeline of groups a stage
sends part j of the next its tokens of the stream, and a received value is gathered once per phase however many
views of it the receiving stage rebuilds.

Data parallelism around the groups is the replica's, each collective over the ranks holding the same parts:
``ddp``'s (every gradient bucket all-reduced), ZeRO-1's and ZeRO-2's (every parameter gathered from its owner
after the update; ZeRO-2 reduce-scatters each micro-batch's gradients to their owners) or FSDP's, torchtitan's
2D plan (rank j + T r holds slice r of part j of every parameter and moment, each unit's parts gathered over
the part's ranks before its forward and its backward, their gradients reduce-scattered there; the update runs
on the slices, whose layout is whole to the split: elementwise). Recomputation is the replica's
(:mod:`postplace.runtime.recompute`), and a pipeline of groups is the pipeline's ranks each made T parts
(:func:`tensor_ranks`).
"""

from __future__ import annotations

import dataclasses
import math
import operator

import torch
import torch.fx

from postplace.errors import PostplaceError
from postplace.graph import PHASES
from postplace.runtime.placed import written_args
from postplace.runtime.ranks import (
    ALL_GATHER,
    ALL_REDUCE,
    ALL_REDUCE_MAX,
    GATHER,
    RECV,
    REDUCE,
    REDUCE_MAX,
    REDUCE_SCATTER,
    SCATTER,
    SEND,
    Collective,
    RankPlan,
    RankProgram,
)

__all__ = [
    "launchable_tensor",
    "tensor_plan",
    "tensor_ranks",
    "SequenceSplit",
    "sequence_split_of",
    "stamp_traced",
    "tensor_shard",
    "tensor_unshard",
    "zero_owners_split",
    "vocab_embedding",
    "vocab_embedding_backward",
    "vocab_log_softmax_backward",
    "vocab_nll_backward",
    "vocab_nll_loss",
    "vocab_picked",
]

aten = torch.ops.aten
_BACKWARD = PHASES.index("backward")


@dataclasses.dataclass(frozen=True)
class Split:
    """A value split over the group along ``dim``: ``groups`` blocks of ``degree`` parts, rank j holding part
    j of each; ``sources`` are the split parameters it derives from (to regroup them when a later op needs
    more blocks)."""

    dim: int
    groups: int
    sources: frozenset = frozenset()


@dataclasses.dataclass(frozen=True)
class Partial:
    """A value each rank holds a term of (full size); ``bias`` is added once after the sum."""

    bias: object = None


class _Regroup(Exception):
    """A split op needs ``sources`` split into ``groups`` blocks (a fused layer found late)."""

    def __init__(self, sources: frozenset, groups: int):
        super().__init__()
        self.sources, self.groups = sources, groups


# ---------------------------------------------------------------------------------------- slicing
def tensor_shard(x: torch.Tensor, dim: int, groups: int, degree: int, j: int) -> torch.Tensor:
    """Rank ``j``'s part of ``x`` split along ``dim`` in ``groups`` blocks of ``degree`` parts (a copy)."""
    s = tuple(x.shape)
    y = x.reshape(*s[:dim], groups, degree, s[dim] // (groups * degree), *s[dim + 1 :])
    return y.select(dim + 1, j).reshape(*s[:dim], s[dim] // degree, *s[dim + 1 :]).clone()


def part_of(x: torch.Tensor, dim: int, size: int, groups: int, degree: int, j: int) -> torch.Tensor:
    """:func:`tensor_shard` inside a rank's program (``size``: ``x``'s length along ``dim``, given so the
    program traces again without reading a shape)."""
    block = size // groups
    width = block // degree
    pieces = [x.narrow(dim, g * block + j * width, width) for g in range(groups)]
    return pieces[0] if groups == 1 else torch.cat(pieces, dim)


def tensor_unshard(parts: list[torch.Tensor], dim: int, groups: int) -> torch.Tensor:
    """The tensor whose parts (:func:`tensor_shard`, in rank order) are ``parts``."""
    s = tuple(parts[0].shape)
    blocks = [p.reshape(*s[:dim], groups, 1, s[dim] // groups, *s[dim + 1 :]) for p in parts]
    return torch.cat(blocks, dim + 1).reshape(*s[:dim], s[dim] * len(parts), *s[dim + 1 :])


def tokens_front(x: torch.Tensor, dim: int, groups: int, degree: int, shape: list[int]) -> torch.Tensor:
    """``x`` (of ``shape``, given so the program traces again without reading a shape) laid out so that its j-th
    of ``degree`` equal flat chunks is rank j's part (:func:`part_of`): a flat reduce-scatter then leaves each
    rank its part, and a flat all-gather of the parts joins this layout (:func:`tokens_back` undoes it)."""
    s = tuple(shape)
    y = x.reshape(*s[:dim], groups, degree, s[dim] // (groups * degree), *s[dim + 1 :])
    return y.movedim(dim + 1, 0).contiguous()


def tokens_back(y: torch.Tensor, dim: int, groups: int, degree: int, shape: list[int]) -> torch.Tensor:
    """The tensor of ``shape`` whose :func:`tokens_front` layout ``y`` is (every rank's part, in rank order)."""
    part = [*shape[:dim], groups, shape[dim] // (groups * degree), *shape[dim + 1 :]]
    return y.reshape(degree, *part).movedim(0, dim + 1).reshape(shape)


# ------------------------------------------------------------------- the vocabulary-parallel loss
def vocab_picked(logp: torch.Tensor, target: torch.Tensor, start: int) -> torch.Tensor:
    """Each token's log-probability of its target where the target is in this rank's vocabulary slice
    ``[start, start + width)``, else 0: summed over the group, every token's."""
    local = target - start
    inside = (local >= 0) & (local < logp.shape[1])
    picked = logp.gather(1, torch.where(inside, local, 0).unsqueeze(1)).squeeze(1)
    return torch.where(inside, picked, torch.zeros_like(picked))


def vocab_embedding(weight: torch.Tensor, tokens: torch.Tensor, start: int) -> torch.Tensor:
    """The vectors of the tokens in this rank's rows ``[start, start + rows)`` of a vocabulary-split embedding
    table, zeros for the others: summed over the group, every token's vector."""
    local = tokens - start
    inside = (local >= 0) & (local < weight.shape[0])
    out = torch.nn.functional.embedding(torch.where(inside, local, 0), weight)
    return out * inside.unsqueeze(-1).to(out.dtype)


def vocab_embedding_backward(grad, tokens, start: int, rows: int, padding_idx: int, scale_grad_by_freq: bool):
    """``embedding_dense_backward`` for this rank's rows of a vocabulary-split table: the gradient rows of the
    tokens inside them (the others' gradients are other ranks')."""
    local = tokens - start
    inside = (local >= 0) & (local < rows)
    masked = grad * inside.unsqueeze(-1).to(grad.dtype)
    pad = padding_idx - start if 0 <= padding_idx - start < rows else -1
    return aten.embedding_dense_backward(masked, torch.where(inside, local, 0), rows, pad, scale_grad_by_freq)


def vocab_nll_loss(picked: torch.Tensor, target: torch.Tensor, reduction: int, ignore_index: int):
    """``nll_loss_forward``'s ``(loss, total weight)`` from every token's picked log-probability."""
    valid = target != ignore_index
    total = valid.sum().to(picked.dtype)
    loss = -torch.where(valid, picked, torch.zeros_like(picked)).sum()
    return (loss / total if reduction == 1 else loss), total


def _token_weights(grad_output, target, reduction: int, ignore_index: int, total_weight) -> torch.Tensor:
    """The gradient of the loss with respect to each token's target log-probability."""
    scale = grad_output / total_weight if reduction == 1 else grad_output
    return torch.where(target != ignore_index, -scale, torch.zeros((), dtype=grad_output.dtype))


def vocab_nll_backward(grad_output, logp, target, start: int, reduction: int, ignore_index: int, total_weight):
    """``nll_loss_backward`` on this rank's slice of the vocabulary: the one-hot of the targets inside it."""
    local = target - start
    inside = (local >= 0) & (local < logp.shape[1])
    w = torch.where(inside, _token_weights(grad_output, target, reduction, ignore_index, total_weight), 0.0)
    out = torch.zeros_like(logp)
    return out.scatter_(1, torch.where(inside, local, 0).unsqueeze(1), w.to(logp.dtype).unsqueeze(1))


def vocab_log_softmax_backward(grad, out, grad_output, target, reduction: int, ignore_index: int, total_weight):
    """``_log_softmax_backward_data`` over a split vocabulary when ``grad`` is the loss's: ``grad - exp(out) x
    (the sum of grad over the whole vocabulary)``, a sum every rank knows (each token's weight)."""
    per_token = _token_weights(grad_output, target, reduction, ignore_index, total_weight).to(out.dtype)
    return grad - torch.exp(out) * per_token.unsqueeze(1)


# ------------------------------------------------------------------------------ layouts of ops
_SAME = ("clone", "detach", "alias", "_to_copy", "contiguous", "lift_fresh_copy")
_VIEWS = ("view", "_unsafe_view", "reshape")
_KEEP_PARTIAL = ("add", "add_", "_to_copy", "clone", "view", "_unsafe_view", "reshape", "alias")  # as the pass's
_LIKE = ("zeros_like", "ones_like", "empty_like", "full_like")


def _name(target) -> str:
    return getattr(getattr(target, "_overloadpacket", None), "__name__", getattr(target, "__name__", str(target)))


def _val(n: torch.fx.Node):
    """A node's fake value; a gradient read back from a data-parallel bucket's all-reduce: the gradient's."""
    v = n.meta.get("val")
    if v is None and n.target is operator.getitem and n.args[0].op == "call_module":
        return _val(n.args[0].args[1][n.args[1]])
    return v


def _same_split(a, b) -> bool:
    """Two layouts that are one split (of whatever parameters they derive from), or both whole."""
    if isinstance(a, Split) and isinstance(b, Split):
        return (a.dim, a.groups) == (b.dim, b.groups)
    return a is None and b is None


def _random(n: torch.fx.Node) -> bool:
    return torch.Tag.nondeterministic_seeded in getattr(n.target, "tags", ())


def _shape(n: torch.fx.Node) -> tuple[int, ...]:
    return tuple(_val(n).shape)


def _norm(d: int, ndim: int) -> int:
    return d + ndim if d < 0 else d


def _view_split(full_in: tuple, full_out: tuple, s: Split, t: int) -> Split | None:
    """The split of a view's output: the dimension whose elements are the same blocks and parts."""
    outer = math.prod(full_in[: s.dim]) * s.groups
    for d, size in enumerate(full_out):
        before = math.prod(full_out[:d])
        if size > 1 and outer % before == 0 and (before * size) % (outer * t) == 0:
            return Split(d, outer // before, s.sources)
    return None


_ALIASING = ("view", "_unsafe_view", "reshape", "alias", "add_")  # ops whose output may be their input's memory


def _shared(x: torch.fx.Node) -> bool:
    """Another op may read the memory of ``x`` (another reader of it, or of what it is a view of)."""
    while True:
        if len(x.users) > 1:
            return True
        if x.op != "call_function" or _name(x.target) not in _ALIASING or not isinstance(x.args[0], torch.fx.Node):
            return False
        x = x.args[0]


def _local(shape: tuple, lay, t: int) -> tuple:
    if not isinstance(lay, Split):
        return tuple(shape)
    return tuple(x // t if d == lay.dim else x for d, x in enumerate(shape))


TOKENS = "@tokens"  # the source of a layout split by tokens (sequence parallelism), not by a parameter
TRACED = "postplace_traced"  # a traced node's meta: its name, which every copy of it keeps (a program may rename)


def _by_tokens(lay) -> bool:
    return isinstance(lay, Split) and TOKENS in lay.sources


@dataclasses.dataclass(frozen=True)
class _Tokens:
    """Sequence parallelism: the ops the simulated plan splits by tokens (their names in the plan's graph:
    :func:`postplace.plans.tensor.sequence_split_ops`), and a micro-batch's (sequences, tokens per sequence)."""

    traced: object
    ops: frozenset[str]
    batch: int
    seq: int
    scattered: frozenset[str] = frozenset()  # partial sums a pipeline's stage sends as its tokens

    def name(self, op: int, again: bool = False) -> str:
        return ("rc:" if again else "") + self.traced.graph.names[op]

    def op(self, n: torch.fx.Node) -> tuple[int, bool]:
        """The traced op ``n`` computes (or is a view of), and whether ``n`` is a recomputed copy of it."""
        again = n.meta.get("recompute")
        return self.traced.op_of_node.get(again or n.meta.get(TRACED, ""), -1), again is not None

    def split_here(self, n: torch.fx.Node) -> bool:
        op, again = self.op(n)
        return op >= 0 and self.name(op, again) in self.ops

    def scatters(self, x: torch.fx.Node) -> bool:
        """``x`` is a partial sum the simulated plan only reduce-scatters (:attr:`scattered`)."""
        op, again = self.op(x)
        return op >= 0 and not again and self.name(op) in self.scattered

    def phase(self, n: torch.fx.Node) -> int:
        """The phase whose gather ``n`` reads: a recomputed copy's is the backward's (it runs there), as is an
        op outside the traced step's (a pipeline's send of a gradient)."""
        op, again = self.op(n)
        return _BACKWARD if again or op < 0 else int(self.traced.graph.phase[op])

    def layout(self, shape: tuple) -> Split | None:
        """The split by sequence of a value of ``shape``: (sequences, tokens, ...) by its second dimension,
        (sequences x tokens, ...) by blocks of its first."""
        if tuple(shape[:2]) == (self.batch, self.seq):
            return Split(1, 1, frozenset({TOKENS}))
        if shape and shape[0] == self.batch * self.seq:
            return Split(0, self.batch, frozenset({TOKENS}))
        return None


class _Builder:
    """One rank's program: the traced step's nodes rewritten in order (see the module docstring)."""

    def __init__(
        self,
        traced,
        src: torch.fx.Graph,
        degree: int,
        rank: int,
        params: dict[str, Split],
        *,
        gathered=None,
        message=None,
        replica: int = 0,
        sliced: frozenset[str] = frozenset(),
        tokens: _Tokens | None = None,
        message_ops: dict[int, int] | None = None,
    ):
        self.traced, self.src, self.t, self.j = traced, src, degree, rank
        self.gathered = gathered  # ZeRO/FSDP: the source's collective index -> (value names, owners) it carries
        self.replica = replica  # ZeRO-2: the position in a reduce-scatter's group whose sums land here
        self.sliced = sliced  # FSDP: placeholders held as slices of their flattened part (elementwise updates only)
        self.message = message or (lambda k: k)  # a message of the source program -> this rank's (a pipeline's)
        self.params = params
        self.g = torch.fx.Graph()
        self.env: dict[torch.fx.Node, torch.fx.Node] = {}
        self.lay: dict[torch.fx.Node, object] = {}
        self.reduced: dict[torch.fx.Node, torch.fx.Node] = {}
        # (over "tp" or "dp", kind, label, shape, dtype, owners, shapes, the source's collective index)
        self.calls: list[tuple[str, str, str, tuple, torch.dtype, tuple, tuple, int]] = []
        self.nll: dict[torch.fx.Node, tuple] = {}  # a rewritten nll_loss_backward -> what its gradient's sums need
        self.looked_up: dict[torch.fx.Node, int] = {}  # tokens looked up in a split table -> this rank's first row
        self.tokens = tokens  # sequence parallelism
        self.sent_tokens: dict[int, tuple] = {}  # a pipeline's message of this rank's tokens -> their shape
        self.message_ops = message_ops or {}  # a pipeline's message -> the traced op whose value it carries
        self.scattered: dict[torch.fx.Node, tuple] = {}  # a partial sum -> this rank's tokens of it, their layout
        self.joined: dict[tuple[torch.fx.Node, int], torch.fx.Node] = {}  # (split by tokens, phase) -> gathered

    # -- collectives
    def reduce(self, value: torch.fx.Node, kind: str, label: str, shape: tuple, dtype) -> torch.fx.Node:
        k = len(self.calls)
        out = self.g.call_module(REDUCE_MAX if kind == ALL_REDUCE_MAX else REDUCE, (k, [value]))
        self.calls.append(("tp", kind, label, tuple(shape), dtype, (), (), -1))
        return self.g.call_function(operator.getitem, (out, 0))

    def refuse(self, reader: torch.fx.Node, x: torch.fx.Node | None = None):
        what = f"'{x.name}', which the Megatron-LM split leaves divided over the group" if x else "a split tensor"
        raise PostplaceError(
            f"tensor parallelism: op '{reader.name}' ({reader.target}) of '{self.traced.graph.name}' reads {what}, "
            "in a way postplace cannot run split; "
            + (
                "launch the plan without ',sp'"
                if self.tokens is not None
                else "use tp=1 or a plan without tensor parallelism"
            )
        )

    def whole(self, x: torch.fx.Node, reader: torch.fx.Node) -> torch.fx.Node:
        """``x``'s value as every rank holds it: a partial sum all-reduced (once), a whole value as it is."""
        lay = self.lay.get(x)
        if isinstance(lay, Split):
            self.refuse(reader, x)
        if not isinstance(lay, Partial):
            return self.env[x]
        if x not in self.reduced:
            value = self.env[x]
            if _shared(x):  # the all-reduce writes its buffer; another reader may want the term
                value = self.g.call_function(aten.clone.default, (value,))
            val = _val(x)
            out = self.reduce(value, ALL_REDUCE, f"{x.name}@tp", tuple(val.shape), val.dtype)
            if lay.bias is not None:
                out = self.g.call_function(aten.add.Tensor, (out, lay.bias))
            self.reduced[x] = out
        return self.reduced[x]

    def local_arg(self, a, reader):
        return torch.fx.map_arg(a, lambda x: self.whole(x, reader))

    # -- sequence parallelism
    def received(self, n: torch.fx.Node):
        """A pipeline's received value: split by tokens where the simulated plan's stage sends its tokens."""
        op = self.message_ops.get(n.args[0], -1)
        if self.tokens is None or op < 0:
            return None
        if self.tokens.name(op) not in self.tokens.ops | self.tokens.scattered:
            return None
        lay = self.tokens.layout(_shape(n))
        if lay is None:
            self.refuse(n, n)
        return lay

    def value_op(self, x: torch.fx.Node) -> tuple[int, bool]:
        """:meth:`_Tokens.op` of the value ``x`` holds: a pipeline's received one (and its copy onto the rank's
        device) is the sent op's."""
        if x.op == "call_module" and x.target == RECV:
            return self.message_ops.get(x.args[0], -1), False
        if x.op == "call_function" and _name(x.target) == "transfer" and isinstance(x.args[0], torch.fx.Node):
            return self.value_op(x.args[0])
        return self.tokens.op(x)

    def chain(self, x: torch.fx.Node, *, any_view: bool = False) -> tuple[torch.fx.Node, list[torch.fx.Node]]:
        """The value ``x`` is a view of (the op's output the simulated plan's collective carries) and the views
        from it to ``x``, in order: reshapes and copies (``any_view``: every view the graph folds into its op)."""
        views = []
        while (
            x.op == "call_function"
            and x.target is not operator.getitem
            and x.args
            and isinstance(x.args[0], torch.fx.Node)
            and (any_view or _name(x.target) in (*_VIEWS, *_SAME, "transfer"))
            and self.value_op(x)[0] >= 0
            and self.value_op(x) == self.value_op(x.args[0])
            and type(self.lay.get(x)) is type(self.lay.get(x.args[0]))
        ):
            views.append(x)
            x = x.args[0]
        return x, views[::-1]

    def replay(self, views: list[torch.fx.Node], value: torch.fx.Node, lay) -> tuple[torch.fx.Node, object]:
        """``views`` applied again to ``value`` (their first input's value, laid out ``lay``)."""
        for v in views:
            args = list(torch.fx.map_arg(v.args[1:], lambda y: self.env[y]))
            if _name(v.target) in _VIEWS and isinstance(lay, Split):
                lay = _view_split(_shape(v.args[0]), _shape(v), lay, self.t)
                if lay is None:
                    self.refuse(v, v.args[0])
                args[0] = list(_local(_shape(v), lay, self.t))
            kwargs = torch.fx.map_arg(dict(v.kwargs), lambda y: self.env[y])
            value = self.g.call_function(v.target, (value, *args), kwargs)
        return value, lay

    def scatter(self, x: torch.fx.Node) -> tuple[torch.fx.Node, Split]:
        """``x``, a partial sum, reduce-scattered by tokens over the group: this rank's tokens of the sum (once
        per value the simulated plan's reduce-scatter carries)."""
        root, views = self.chain(x)
        if root not in self.scattered:
            shape, val = _shape(root), _val(root)
            lay = self.tokens.layout(shape)
            if lay is None:
                self.refuse(root, root)
            front = self.g.call_function(tokens_front, (self.env[root], lay.dim, lay.groups, self.t, list(shape)))
            k = len(self.calls)
            out = self.g.call_module(SCATTER, (k, [front]))
            part = self.g.call_function(operator.getitem, (out, 0))
            part = self.g.call_function(aten.view.default, (part, list(_local(shape, lay, self.t))))
            self.calls.append(
                ("tp", REDUCE_SCATTER, f"{root.name}@sp", shape, val.dtype, (), ((math.prod(shape),),), -1)
            )
            bias = self.lay[root].bias
            if bias is not None:  # a row-split layer's bias, added once to each token's sum
                part = self.g.call_function(aten.add.Tensor, (part, bias))
            self.scattered[root] = (part, lay)
        part, lay = self.scattered[root]
        return self.replay(views, part, lay) if views else (part, lay)

    def gather(self, x: torch.fx.Node, reader: torch.fx.Node) -> torch.fx.Node:
        """``x``, split by tokens, whole on every rank for ``reader``: all-gathered over the group once per
        value and phase (a norm's output again in the backward, as the simulated plan)."""
        root, views = self.chain(x, any_view=True)
        key = (root, self.tokens.phase(reader))
        if key not in self.joined:
            lay, val = self.lay[root], _val(root)
            shape = tuple(val.shape)
            k = len(self.calls)
            out = self.g.call_module(GATHER, (k, [self.env[root]]))
            front = self.g.call_function(operator.getitem, (out, 0))
            self.joined[key] = self.g.call_function(tokens_back, (front, lay.dim, lay.groups, self.t, list(shape)))
            flat = (math.prod(shape),)
            self.calls.append(("tp", ALL_GATHER, f"{root.name}@sp", shape, val.dtype, (), (flat,), -1))
        return self.replay(views, self.joined[key], None)[0] if views else self.joined[key]

    # -- the walk
    def build(self):
        for n in self.src.nodes:
            if n.op == "placeholder":
                self.env[n] = self.g.node_copy(n)
                self.lay[n] = None if n.name in self.sliced else self.params.get(n.name)
            elif n.op == "get_attr":
                self.env[n] = self.g.node_copy(n)
            elif n.op == "output":
                self.g.output(torch.fx.map_arg(n.args[0], lambda x, n=n: self.whole(x, n)))
            else:
                self.node(n)
        return self.g, self.calls

    def emit(self, n: torch.fx.Node, args, kwargs=None, lay=None, target=None) -> None:
        kwargs = torch.fx.map_arg(dict(n.kwargs), lambda x: self.env[x]) if kwargs is None else dict(kwargs)
        new = self.g.create_node("call_function", target or n.target, tuple(args), kwargs, name=n.name)
        new.meta = dict(n.meta)
        self.env[n], self.lay[n] = new, lay

    def node(self, n: torch.fx.Node) -> None:
        if n.op == "call_module" and n.target == REDUCE:  # a data-parallel bucket: this rank's parts of it
            values = [self.env[x] if isinstance(self.lay.get(x), Split) else self.whole(x, n) for x in n.args[1]]
            k = len(self.calls)
            self.env[n] = self.g.call_module(REDUCE, (k, values))
            self.lay[n] = tuple(self.lay.get(x) if isinstance(self.lay.get(x), Split) else None for x in n.args[1])
            numel = sum(math.prod(_local(_shape(x), self.lay[n][i], self.t)) for i, x in enumerate(n.args[1]))
            label = "+".join(x.name for x in n.args[1])
            self.calls.append(("dp", ALL_REDUCE, label, (numel,), _val(n.args[1][0]).dtype, (), (), n.args[0]))
            return
        if n.op == "call_module" and n.target == SCATTER:  # ZeRO-2, FSDP: this rank's parts of the gradients
            names, owners = self.gathered(n.args[0])
            xs = n.args[1]
            lays = [self.lay.get(x) if isinstance(self.lay.get(x), Split) else None for x in xs]
            values = [self.env[x] if lay is not None else self.whole(x, n) for x, lay in zip(xs, lays, strict=True)]
            shapes = tuple(_local(_shape(x), lay, self.t) for x, lay in zip(xs, lays, strict=True))
            self.env[n] = self.g.call_module(SCATTER, (len(self.calls), values))
            # ZeRO-2: the sums this replica owns, as their parts; FSDP: slices (their update is elementwise)
            self.lay[n] = (
                tuple(lay for lay, o in zip(lays, owners, strict=True) if o == self.replica) if owners else None
            )
            dtype = _val(xs[0]).dtype
            numel = sum(math.prod(x) for x in shapes)
            self.calls.append(
                ("dp", REDUCE_SCATTER, "+".join(names), (numel,), dtype, tuple(owners), shapes, n.args[0])
            )
            return
        if n.op == "call_module" and n.target == GATHER:  # ZeRO: the parts' owners send them; FSDP: slices
            names, owners = self.gathered(n.args[0])
            holders = {x.name: x for x in self.src.nodes if x.op == "placeholder"}
            shapes = tuple(_local(_shape(holders[p]), self.params.get(p), self.t) for p in names)
            self.env[n] = self.g.call_module(GATHER, (len(self.calls), [self.env[x] for x in n.args[1]]))
            self.lay[n] = tuple(self.params.get(p) for p in names)
            dtype = _val(holders[names[0]]).dtype
            numel = sum(math.prod(x) for x in shapes)
            self.calls.append(("dp", ALL_GATHER, "+".join(names), (numel,), dtype, tuple(owners), shapes, n.args[0]))
            return
        if n.op == "call_module" and n.target == SEND:  # a pipeline's message: part j to part j of the next stage
            x = n.args[1]
            if self.tokens is not None and self.tokens.split_here(x):  # the stream between blocks: its tokens
                if not _by_tokens(self.lay.get(x)):
                    self.refuse(n, x)
                self.sent_tokens[n.args[0]] = _local(_shape(x), self.lay[x], self.t)
                self.g.call_module(SEND, (self.message(n.args[0]), self.env[x]))
                return
            if self.tokens is not None and isinstance(self.lay.get(x), Partial) and self.tokens.scatters(x):
                part, lay = self.scatter(x)  # a sum the next stage reads by tokens: its tokens, reduce-scattered
                self.sent_tokens[n.args[0]] = _local(_shape(x), lay, self.t)
                self.g.call_module(SEND, (self.message(n.args[0]), part))
                return
            if self.tokens is not None and _by_tokens(self.lay.get(x)):
                self.g.call_module(SEND, (self.message(n.args[0]), self.gather(x, n)))
                return
            if isinstance(self.lay.get(n.args[1]), Split):
                raise PostplaceError(
                    f"tensor parallelism: the pipeline's stage cut of '{self.traced.graph.name}' sends "
                    f"'{n.args[1].name}', a value split over the group (the cut falls between the layers of a "
                    "split pair); launch runs pipelines of tensor-parallel groups whose stages hold whole blocks"
                )
            self.g.call_module(SEND, (self.message(n.args[0]), self.whole(n.args[1], n)))
            return
        if n.op == "call_module" and n.target == RECV:
            self.env[n] = self.g.call_module(RECV, (self.message(n.args[0]),))
            self.env[n].meta = dict(n.meta)
            self.lay[n] = self.received(n)
            return
        if n.op == "call_method" and n.target == "copy_":  # ZeRO-1: a gathered parameter into this copy
            self.env[n] = self.g.call_method("copy_", (self.env[n.args[0]], self.env[n.args[1]]))
            self.lay[n] = self.lay.get(n.args[0])
            return
        if n.op != "call_function":
            raise PostplaceError(f"tensor parallelism: node '{n.name}' ({n.op}) is not an op; cannot split it")
        if self.tokens is None or n.target is operator.getitem or self.tokens.op(n)[0] < 0:
            self.function(n)  # no op of the simulated plan (a pipeline's transfer): laid out by its own rule
            return
        # sequence parallelism: an op split by tokens takes each partial sum it reads reduce-scattered; any
        # other op takes what is split by tokens gathered (once per phase), as the simulated plan. The op's
        # own rule then runs on those values (swapped in for its inputs while it runs, as one reader's view:
        # another reader of the same input may need the partial sum, or the split, as it is)
        here = self.tokens.split_here(n)
        swap = {}
        for x in n.all_input_nodes:
            if self.value_op(x) == self.tokens.op(n):  # a view of x, folded into its op: laid out as it
                continue
            if here and isinstance(self.lay.get(x), Partial):
                swap[x] = self.scatter(x)
            elif isinstance(self.lay.get(x), Partial) and self.tokens.split_here(x):
                # a parameter's gradient summed over this rank's tokens: all-reduced as it leaves its op, once
                # per micro-batch (the simulated plan's; Megatron-LM all-reduces the sum once per step)
                swap[x] = (self.whole(x, n), None)
            elif not here and _by_tokens(self.lay.get(x)):
                swap[x] = (self.gather(x, n), None)
        if here and not written_args(n) and not _random(n):
            split = [lay for x in n.all_input_nodes for lay in [swap.get(x, (None, self.lay.get(x)))[1]] if lay]
            if not split:  # split by tokens where its inputs are whole here (a dropout's mask, drawn whole)
                for x in n.all_input_nodes:  # not a parameter or buffer, whatever its length
                    whole = self.lay.get(x) is None and x.op != "placeholder"
                    lay = self.tokens.layout(_shape(x)) if whole else None
                    if lay is not None:
                        size = _shape(x)[lay.dim]
                        args = (self.env[x], lay.dim, size, lay.groups, self.t, self.j)
                        swap[x] = (self.g.call_function(part_of, args), lay)
        saved = {x: (self.env[x], self.lay.get(x)) for x in swap}
        for x, (value, lay) in swap.items():
            self.env[x], self.lay[x] = value, lay
        try:
            self.function(n)
        finally:
            for x, (value, lay) in saved.items():
                self.env[x], self.lay[x] = value, lay

    def function(self, n: torch.fx.Node) -> None:
        ins = [a for a in n.all_input_nodes]
        lays = [self.lay.get(a) for a in ins]
        if n.target is operator.getitem:
            src, idx = n.args
            lay = self.lay.get(src)
            self.emit(n, (self.env[src], idx), lay=lay[idx] if isinstance(lay, (tuple, list)) else None)
            return
        if n.target is operator.add and len(lays) == 2 and _same_split(*lays):  # ZeRO-2: an owner's sum of parts
            self.emit(n, torch.fx.map_arg(n.args, lambda x: self.env[x]), lay=lays[0])
            return
        if all(x is None for x in lays) and not (
            _name(n.target) == "embedding_dense_backward" and ins[1:2] and ins[1] in self.looked_up
        ):
            self.emit(n, torch.fx.map_arg(n.args, lambda x: self.env[x]), lay=None)
            return
        name = _name(n.target)
        rule = getattr(self, f"op_{name}", None)
        if rule is None:
            if name.startswith("_scaled_dot_product"):
                rule = self.attention
            elif name in _LIKE:
                rule = self.like
            elif name in _SAME:
                rule = self.same
            elif name in _VIEWS:
                rule = self.view
            elif isinstance(n.target, torch._ops.OpOverload) and torch.Tag.pointwise in n.target.tags:
                rule = self.pointwise
            else:
                rule = self.opaque
        rule(n, ins, lays)

    def opaque(self, n, ins, lays) -> None:
        self.emit(n, self.local_arg(n.args, n), self.local_arg(n.kwargs, n), lay=None)

    def one_split(self, n, lays) -> Split | None:
        """The one split input of an op that moves it; None (the op emitted whole) when a partial sum is
        read: it is all-reduced first."""
        splits = [x for x in lays if isinstance(x, Split)]
        if len(splits) > 1:
            self.refuse(n)
        if not splits or any(isinstance(x, Partial) for x in lays):
            self.opaque(n, None, lays)
            return None
        return splits[0]

    def same(self, n, ins, lays) -> None:
        src = n.args[0]
        lay = self.lay.get(src)
        if isinstance(lay, Partial) and _name(n.target) not in _KEEP_PARTIAL:
            self.opaque(n, ins, lays)
            return
        self.emit(n, (self.env[src], *n.args[1:]), lay=lay)

    def view(self, n, ins, lays) -> None:
        src = n.args[0]
        lay = self.lay.get(src)
        full_out = _shape(n)
        if isinstance(lay, Partial):
            if lay.bias is not None and full_out[-1:] != _shape(src)[-1:]:
                self.opaque(n, ins, lays)
                return
            self.emit(n, (self.env[src], list(full_out)), lay=lay)
            return
        out = _view_split(_shape(src), full_out, lay, self.t)
        if out is None:
            self.refuse(n, src)
        self.emit(n, (self.env[src], list(_local(full_out, out, self.t))), lay=out)

    def op_expand(self, n, ins, lays) -> None:
        lay = self.one_split(n, lays)
        if lay is None:
            return
        full_out = _shape(n)
        out = Split(lay.dim + len(full_out) - len(_shape(n.args[0])), lay.groups, lay.sources)
        self.emit(n, (self.env[n.args[0]], list(_local(full_out, out, self.t)), *n.args[2:]), lay=out)

    def moved(self, n, lay: Split, dim: int) -> None:
        self.emit(n, (self.env[n.args[0]], *n.args[1:]), lay=Split(dim, lay.groups, lay.sources))

    def op_t(self, n, ins, lays) -> None:
        lay = self.one_split(n, lays)
        if lay is None:
            return
        self.moved(n, lay, 1 - lay.dim if len(_shape(n)) == 2 else lay.dim)

    def op_transpose(self, n, ins, lays) -> None:
        lay = self.one_split(n, lays)
        if lay is None:
            return
        nd = len(_shape(n))
        a, b = _norm(n.args[1], nd), _norm(n.args[2], nd)
        self.moved(n, lay, b if lay.dim == a else a if lay.dim == b else lay.dim)

    def op_permute(self, n, ins, lays) -> None:
        lay = self.one_split(n, lays)
        if lay is None:
            return
        dims = [_norm(d, len(_shape(n))) for d in n.args[1]]
        self.moved(n, lay, dims.index(lay.dim))

    def op_unsqueeze(self, n, ins, lays) -> None:
        lay = self.one_split(n, lays)
        if lay is None:
            return
        d = _norm(n.args[1], len(_shape(n)))
        self.moved(n, lay, lay.dim + (d <= lay.dim))

    def op_squeeze(self, n, ins, lays) -> None:
        lay = self.one_split(n, lays)
        if lay is None:
            return
        nd = len(_shape(n.args[0]))
        dims = n.args[1] if len(n.args) > 1 else [d for d, x in enumerate(_shape(n.args[0])) if x == 1]
        dims = [_norm(d, nd) for d in (dims if isinstance(dims, (list, tuple)) else [dims])]
        if lay.dim in dims:
            self.refuse(n, n.args[0])
        # the full shape's size-1 dimensions, named: a part may have size 1 where the whole has not
        self.emit(
            n,
            (self.env[n.args[0]], dims),
            {},
            lay=Split(lay.dim - sum(d < lay.dim for d in dims), lay.groups, lay.sources),
            target=aten.squeeze.dims,
        )

    def op_slice(self, n, ins, lays) -> None:
        lay = self.one_split(n, lays)
        if lay is None:
            return
        if _norm(n.args[1], len(_shape(n))) == lay.dim:
            self.refuse(n, n.args[0])
        self.moved(n, lay, lay.dim)

    def op_split(self, n, ins, lays) -> None:
        lay = self.one_split(n, lays)
        if lay is None:
            return
        full = _shape(n.args[0])
        dim = _norm(n.args[2] if len(n.args) > 2 else 0, len(full))
        sizes = n.args[1] if isinstance(n.args[1], (list, tuple)) else None
        chunks = len(_val(n))
        if dim != lay.dim:
            self.emit(n, (self.env[n.args[0]], *n.args[1:]), lay=tuple([lay] * chunks))
            return
        if (sizes is not None and len(set(sizes)) != 1) or (sizes is None and n.args[1] * chunks != full[dim]):
            self.refuse(n, n.args[0])  # unequal pieces of the split dimension
        if lay.groups % chunks:
            raise _Regroup(lay.sources, math.lcm(lay.groups, chunks))
        each = Split(dim, lay.groups // chunks, lay.sources)
        size = [x // self.t for x in sizes] if sizes is not None else n.args[1] // self.t
        self.emit(n, (self.env[n.args[0]], size, *n.args[2:]), lay=tuple([each] * chunks))

    op_split_with_sizes = op_split

    def op_cat(self, n, ins, lays) -> None:
        tensors = n.args[0]
        dim = _norm(n.args[1] if len(n.args) > 1 else 0, len(_shape(n)))
        parts = [self.lay.get(x) for x in tensors]
        if not all(isinstance(x, Split) and x.dim == parts[0].dim for x in parts):
            self.refuse(n)
        sources = frozenset().union(*(x.sources for x in parts))
        if dim == parts[0].dim:
            if len({_shape(x)[dim] // p.groups for x, p in zip(tensors, parts, strict=True)}) != 1:
                self.refuse(n)  # blocks of unequal sizes: no one block size describes the result
            lay = Split(dim, sum(x.groups for x in parts), sources)
        elif all(x.groups == parts[0].groups for x in parts):
            lay = Split(parts[0].dim, parts[0].groups, sources)
        else:
            self.refuse(n)
        self.emit(n, ([self.env[x] for x in tensors], *n.args[1:]), lay=lay)

    def product(self, n, a, b, batch: int):
        """The layout of ``a @ b`` (``batch`` leading batch dimensions), or None when it is not Megatron's."""
        la, lb = self.lay.get(a), self.lay.get(b)
        if isinstance(la, Partial) or isinstance(lb, Partial):
            return None
        i, k, j = batch, batch + 1, batch + 1
        if la is None and lb is None:
            return "whole"
        if isinstance(la, Split) and isinstance(lb, Split):
            if la.dim == k and lb.dim == batch and la.groups == lb.groups:  # the contraction: partial sums
                return Partial()
            if batch and la.dim == 0 and lb.dim == 0 and la.groups == lb.groups:
                return Split(0, la.groups, la.sources | lb.sources)
            return None
        if la is None and lb.dim == j:
            return Split(j, lb.groups, lb.sources)
        if lb is None and la.dim == i:
            return Split(i, la.groups, la.sources)
        return None

    def op_mm(self, n, ins, lays, batch: int = 0) -> None:
        lay = self.product(n, *n.args[:2], batch=batch)
        if lay is None or lay == "whole":
            self.opaque(n, ins, lays)
            return
        self.emit(n, [self.env[x] for x in n.args[:2]], lay=lay)

    def op_bmm(self, n, ins, lays) -> None:
        self.op_mm(n, ins, lays, batch=1)

    def op_addmm(self, n, ins, lays) -> None:
        bias, a, b = n.args[:3]
        lay = self.product(n, a, b, batch=0)
        lb = self.lay.get(bias)
        if isinstance(lay, Partial) and lb is None and not n.kwargs:  # Megatron: the bias after the sum
            self.emit(n, (self.env[a], self.env[b]), {}, lay=Partial(self.env[bias]), target=aten.mm.default)
        elif isinstance(lay, Split) and lay.dim == 1 and isinstance(lb, Split) and lb.groups == lay.groups:
            lay = Split(1, lay.groups, lay.sources | lb.sources)
            self.emit(n, (self.env[bias], self.env[a], self.env[b], *n.args[3:]), lay=lay)
        else:
            self.opaque(n, ins, lays)

    def op_sum(self, n, ins, lays) -> None:
        lay = self.one_split(n, lays)
        if lay is None:
            return
        src = n.args[0]
        nd = len(_shape(src))
        dims = n.args[1] if len(n.args) > 1 and n.args[1] else list(range(nd))  # none named: every one
        dims = [_norm(d, nd) for d in dims]
        keep = len(n.args) > 2 and n.args[2] or n.kwargs.get("keepdim", False)
        if lay.dim in dims:
            out = Partial()
        else:
            out = Split(lay.dim if keep else lay.dim - sum(d < lay.dim for d in dims), lay.groups, lay.sources)
        self.emit(n, (self.env[src], *n.args[1:]), lay=out)

    def op_mean(self, n, ins, lays) -> None:
        lay = self.one_split(n, lays)
        if lay is None:
            return
        nd = len(_shape(n.args[0]))
        dims = n.args[1] if len(n.args) > 1 and n.args[1] else range(nd)
        if lay.dim in [_norm(d, nd) for d in dims]:
            self.refuse(n, n.args[0])
        self.op_sum(n, ins, lays)

    def softmax_like(self, n, ins, lays) -> None:
        if any(isinstance(x, Partial) for x in lays):
            self.opaque(n, ins, lays)
            return
        splits = [x for x in lays if isinstance(x, Split)]
        if any((x.dim, x.groups) != (splits[0].dim, splits[0].groups) for x in splits) or len(splits) != len(ins):
            self.refuse(n)
        lay = Split(splits[0].dim, splits[0].groups, frozenset().union(*(x.sources for x in splits)))
        dim = _norm(n.args[-2] if _name(n.target).endswith("backward_data") else n.args[1], len(_shape(n)))
        if dim == lay.dim:
            self.refuse(n, n.args[0])
        self.emit(n, torch.fx.map_arg(n.args, lambda x: self.env[x]), lay=lay)

    op__softmax = op__softmax_backward_data = softmax_like
    op_transfer = same  # a pipeline's received value copied onto the rank's device: as it came

    def op_new_zeros(self, n, ins, lays) -> None:
        """A tensor of a given shape made from another for its dtype and device only (another stage's random
        op replayed on scratch: :func:`postplace.runtime.ranks.rank_plan`): the rank's part serves as well."""
        self.emit(n, (self.env[n.args[0]], *n.args[1:]), lay=None)  # a partial term's dtype and device as well

    def attention(self, n, ins, lays) -> None:
        heads = [x for x in lays if x is not None]
        if not all(isinstance(x, Split) and x.dim == 1 and x.groups == heads[0].groups for x in heads):
            self.refuse(n)  # attention over heads split alike, or nothing
        for x, lay in zip(ins, lays, strict=True):
            if lay is None and len(_shape(x)) >= 3 and _shape(x)[1] != 1:
                self.refuse(n, x)  # a mask per head would need its heads' part
        vals = _val(n)
        outs = tuple(
            Split(1, heads[0].groups, heads[0].sources) if isinstance(v, torch.Tensor) and v.dim() >= 3 else None
            for v in (vals if isinstance(vals, (tuple, list)) else (vals,))
        )
        self.emit(n, torch.fx.map_arg(n.args, lambda x: self.env[x]), lay=outs)

    def pointwise(self, n, ins, lays) -> None:
        if any(isinstance(x, Partial) for x in lays):
            name = _name(n.target)
            sum_of_terms = name not in ("add", "add_") or (
                len(n.args) >= 2 and all(isinstance(a, torch.fx.Node) for a in n.args[:2])
            )  # a number added to a partial sum would be added once per rank
            if name in _KEEP_PARTIAL and sum_of_terms and all(isinstance(x, Partial) and x.bias is None for x in lays):
                self.emit(n, torch.fx.map_arg(n.args, lambda x: self.env[x]), lay=Partial())
                return
            if not any(isinstance(x, Split) for x in lays):
                self.opaque(n, ins, lays)
                return
        nd = len(_shape(n))
        out = None
        for x, lay in zip(ins, lays, strict=True):
            if isinstance(lay, Split):
                here = Split(lay.dim + nd - len(_shape(x)), lay.groups, lay.sources)
                if out is not None and (out.dim, out.groups) != (here.dim, here.groups):
                    self.refuse(n, x)
                out = here if out is None else Split(out.dim, out.groups, out.sources | here.sources)
        written = {n.args[k] for k in written_args(n)}
        parts: dict[torch.fx.Node, torch.fx.Node] = {}  # a whole operand as large as the split: this rank's part
        for x, lay in zip(ins, lays, strict=True):
            shape = _shape(x)
            at = out.dim - (nd - len(shape))
            if not isinstance(lay, Split) and 0 <= at < len(shape) and shape[at] != 1:
                if x in written or isinstance(lay, Partial):
                    self.refuse(n, x)  # its part would be written, not it; a partial sum has no part to take
                parts[x] = self.g.call_function(part_of, (self.env[x], at, shape[at], out.groups, self.t, self.j))

        def local(x):
            if x in parts:
                return parts[x]
            return self.env[x] if isinstance(self.lay.get(x), Split) else self.whole(x, n)

        self.emit(n, torch.fx.map_arg(n.args, local), torch.fx.map_arg(n.kwargs, local), lay=out)

    def op_copy_(self, n, ins, lays) -> None:
        """A copy into a value of the same layout (AMSGrad's running maximum): each rank copies its part."""
        a, b = self.lay.get(n.args[0]), self.lay.get(n.args[1])
        if isinstance(a, Split) and _same_split(a, b):
            self.emit(n, torch.fx.map_arg(n.args, lambda x: self.env[x]), lay=a)
            return
        self.opaque(n, ins, lays)

    def like(self, n, ins, lays) -> None:
        lay = self.lay.get(n.args[0])
        if isinstance(lay, Split) and any(_random(u) for u in n.users):  # a dropout mask: drawn whole, as one
            # process draws it, so every rank's generator stays in step and each op takes its part of it
            dtype = n.kwargs.get("dtype")
            kwargs = {"dtype": dtype} if dtype else {}
            self.emit(n, (self.env[n.args[0]], list(_shape(n))), kwargs, lay=None, target=aten.new_empty.default)
            return
        self.emit(n, (self.env[n.args[0]], *n.args[1:]), lay=lay if isinstance(lay, Split) else None)

    # -- sequence parallelism's layer norm: each token normalised alone
    def op_native_layer_norm(self, n, ins, lays) -> None:
        x, shape = n.args[:2]
        lay = self.lay.get(x)
        rest = n.args[2:4]
        if not _by_tokens(lay) or lay.dim >= len(_shape(x)) - len(shape) or any(self.lay.get(w) for w in rest if w):
            self.opaque(n, ins, lays)
            return
        self.emit(n, torch.fx.map_arg(n.args, lambda y: self.env[y]), lay=(lay, lay, lay))

    def op_native_layer_norm_backward(self, n, ins, lays) -> None:
        grad, x, shape, mean, rstd, weight, bias = n.args[:7]
        lay = next((y for y in map(self.lay.get, (grad, x, mean, rstd)) if y is not None), None)
        if not _by_tokens(lay) or any(self.lay.get(w) for w in (weight, bias) if w):
            self.opaque(n, ins, lays)
            return

        def part(y):  # a whole operand (the block's input, its statistics): this rank's tokens of it
            if _same_split(self.lay.get(y), lay):
                return self.env[y]
            if self.lay.get(y) is not None:
                self.refuse(n, y)
            size = _shape(y)[lay.dim]
            cut = self.g.call_function(part_of, (self.env[y], lay.dim, size, lay.groups, self.t, self.j))
            # the CPU kernel reads the statistics as if contiguous: a narrowed view would be read wrong
            return self.g.call_function(aten.clone.default, (cut,), {"memory_format": torch.contiguous_format})

        args = (part(grad), part(x), shape, part(mean), part(rstd), *torch.fx.map_arg(n.args[5:], self.env.get))
        # the input's gradient of this rank's tokens; the weight's and bias's summed over them: partial sums
        self.emit(n, args, lay=(lay, Partial(), Partial()))

    # -- the vocabulary-split embedding
    def op_embedding(self, n, ins, lays) -> None:
        weight, tokens = n.args[:2]
        lay = self.lay.get(weight)
        if not (isinstance(lay, Split) and lay.dim == 0 and lay.groups == 1) or len(n.args) > 2:
            self.opaque(n, ins, lays)  # refuses: a table split otherwise, a padding row
            return
        start = self.j * _shape(weight)[0] // self.t
        self.looked_up[tokens] = start
        self.emit(n, (self.env[weight], self.whole(tokens, n), start), {}, lay=Partial(), target=vocab_embedding)

    def op_embedding_dense_backward(self, n, ins, lays) -> None:
        grad, tokens, rows, padding_idx, scale = n.args
        if tokens not in self.looked_up:
            self.opaque(n, ins, lays)
            return
        start = self.looked_up[tokens]
        args = (self.whole(grad, n), self.whole(tokens, n), start, rows // self.t, padding_idx, scale)
        self.emit(n, args, {}, lay=Split(0, 1), target=vocab_embedding_backward)

    # -- the vocabulary-split cross-entropy
    def op__log_softmax(self, n, ins, lays) -> None:
        lay = self.one_split(n, lays)
        if lay is None:
            return
        x = self.env[n.args[0]]
        dim = _norm(n.args[1], len(_shape(n)))
        if dim != lay.dim or lay.groups != 1:
            self.softmax_like(n, ins, lays)
            return
        val = _val(n)
        stat = tuple(1 if d == dim else s for d, s in enumerate(_shape(n)))
        g = self.g
        top = g.call_function(aten.amax.default, (x, [dim], True))
        top = self.reduce(top, ALL_REDUCE_MAX, f"{n.name}:max@tp", stat, val.dtype)
        shifted = g.call_function(aten.sub.Tensor, (x, top))
        sums = g.call_function(aten.sum.dim_IntList, (g.call_function(aten.exp.default, (shifted,)), [dim], True))
        sums = self.reduce(sums, ALL_REDUCE, f"{n.name}:sum@tp", stat, val.dtype)
        out = g.call_function(aten.sub.Tensor, (shifted, g.call_function(aten.log.default, (sums,))))
        self.env[n], self.lay[n] = out, lay

    def start(self, logp: torch.fx.Node) -> int:
        return self.j * _shape(logp)[1] // self.t

    def op_nll_loss_forward(self, n, ins, lays) -> None:
        logp, target, weight, reduction, ignore = n.args
        lay = self.lay.get(logp)
        if not (isinstance(lay, Split) and lay.dim == 1 and lay.groups == 1) or weight is not None or reduction == 0:
            self.opaque(n, ins, lays)
            return
        tgt = self.whole(target, n)
        picked = self.g.call_function(vocab_picked, (self.env[logp], tgt, self.start(logp)))
        val = _val(logp)
        picked = self.reduce(picked, ALL_REDUCE, f"{n.name}:target@tp", (val.shape[0],), val.dtype)
        self.emit(n, (picked, tgt, reduction, ignore), {}, lay=(None, None), target=vocab_nll_loss)

    def op_nll_loss_backward(self, n, ins, lays) -> None:
        grad, logp, target, weight, reduction, ignore, total = n.args
        lay = self.lay.get(logp)
        if not isinstance(lay, Split) or weight is not None:
            self.opaque(n, ins, lays)
            return
        w = [self.whole(x, n) for x in (grad, target, total)]
        args = (w[0], self.env[logp], w[1], self.start(logp), reduction, ignore, w[2])
        self.emit(n, args, {}, lay=lay, target=vocab_nll_backward)
        self.nll[n] = (w[0], w[1], reduction, ignore, w[2])

    def op__log_softmax_backward_data(self, n, ins, lays) -> None:
        grad, out = n.args[:2]
        if grad not in self.nll:
            self.softmax_like(n, ins, lays)
            return
        go, tgt, reduction, ignore, total = self.nll[grad]
        args = (self.env[grad], self.env[out], go, tgt, reduction, ignore, total)
        self.emit(n, args, {}, lay=self.lay.get(grad), target=vocab_log_softmax_backward)


# ------------------------------------------------------------------------------ the plan
_COMMS = {
    REDUCE: ALL_REDUCE,
    REDUCE_MAX: ALL_REDUCE_MAX,
    GATHER: ALL_GATHER,
    SCATTER: REDUCE_SCATTER,
    SEND: "send",
    RECV: "recv",
}


def _settled(traced, params: dict[str, Split], builders) -> list:
    """What ``builders()`` (the ranks' builders over ``params``) build; where a split op needs more blocks
    (a fused layer) the parameters it derives from are regrouped and every rank is built again."""
    for _ in range(8):  # each retry gives a fused layer its blocks; a model has few kinds of them
        try:
            return [b.build() for b in builders()]
        except _Regroup as need:
            for name, lay in list(params.items()):  # a parameter and its optimizer state alike
                if lay.sources & need.sources:
                    params[name] = Split(lay.dim, need.groups, lay.sources)
    raise PostplaceError(f"tensor parallelism: the split of '{traced.graph.name}' does not settle")


def _tensor_split(traced, params: dict[str, Split]) -> tuple[tuple[int, int, int], ...]:
    """:attr:`RankPlan.tensor_split` of ``params``: (placeholder index, dimension, blocks), in order."""
    holders = [n.name for n in traced.gm.graph.nodes if n.op == "placeholder"]
    return tuple(sorted((holders.index(name), lay.dim, lay.groups) for name, lay in params.items()))


def zero_owners_split(traced, degree: int, replicas: int, *, tied: bool = True) -> dict[int, int]:
    """ZeRO-1's owner of each parameter op of ``traced``: the simulated plan's, found on the split step (where
    a split parameter weighs 1/``degree``; ``tied`` False in a pipeline, as the simulated plan splits it)."""
    from postplace.plans.data_parallel import zero_owners
    from postplace.plans.tensor import tensor_parallel

    split = tensor_parallel(traced.graph, degree, tied=tied)
    index = {name: i for i, name in enumerate(traced.graph.names)}
    return {index[split.names[p]]: r for p, r in zero_owners(split, replicas).items()}


def tensor_ranks(
    plan: RankPlan,
    traced,
    degree: int,
    devices: list[int],
    *,
    sequence: SequenceSplit | None = None,
) -> RankPlan:
    """``plan`` (per-rank programs of unsplit replicas or stages, before batching: a pipeline's) with each
    rank q made ``degree`` ranks ``q degree + j``, part j of its split program, on the plan's GPUs ``devices``
    (the group of q's GPU: it and the next ``degree - 1``, Megatron-LM's order). Every message of ``plan``
    goes from part j to part j (a stage sends its whole activation from every part, as the simulated plan
    does), every collective of ``plan`` runs over part j of its ranks, and each group all-reduces its partial
    sums over itself. With ``sequence`` (:func:`sequence_split_of`'s) the groups run sequence parallelism, and a
    message of the stream between blocks carries part j's tokens of it to part j, as does a message of a partial
    sum only reduce-scattered (``sequence.scattered``), reduce-scattered first."""
    t = degree
    if sequence is not None and any(TRACED not in n.meta for n in traced.gm.graph.nodes):
        raise PostplaceError(  # the programs were copied from unnamed nodes: their ops cannot be found
            "tensor_ranks: make the SequenceSplit with sequence_split_of before the programs are copied from the step"
        )
    tokens = None if sequence is None else _sequence_of(traced, sequence, t)
    params = split_parameters(traced, t, tied=False)  # a pipeline: a tied table whole, as the simulated plan
    for prog in plan.programs:
        for n in prog.gm.graph.nodes:  # the messages the programs receive carry their shapes
            if n.op == "call_module" and n.target == RECV and "val" not in n.meta:
                m = plan.messages[n.args[0]]
                n.meta["val"] = torch.empty(m.shape, dtype=m.dtype, device="meta")

    def gathered(k: int) -> tuple[list[str], tuple[int, ...]]:  # a stage's: the unsplit plan's collective says
        return plan.collectives[k].value.split("+"), plan.collectives[k].owners

    message_ops = {m.index: m.op for m in plan.messages}

    made: list[_Builder] = []  # the last attempt's builders: what each sent of its tokens

    def builders():
        made[:] = [
            _Builder(
                traced,
                prog.gm.graph,
                t,
                j,
                params,
                gathered=gathered,
                message=lambda k, j=j: k * t + j,
                tokens=tokens,
                message_ops=message_ops,
            )
            for prog in plan.programs
            for j in range(t)
        ]
        return made

    built = _settled(traced, params, builders)
    by_tokens = {k: shape for b in made for k, shape in b.sent_tokens.items()}
    collectives: list[Collective] = []
    index: dict[tuple[int, int], int] = {}  # (rank, its program's k-th collective) -> the plan's
    for c in plan.collectives:  # each of the unsplit plan's, once per part, over that part of its ranks
        for j in range(t):
            members = tuple(q * t + j for q in c.members(plan.world_size))
            local = next(call for q in c.members(plan.world_size) for call in built[q * t + j][1] if call[7] == c.index)
            for rank in members:
                k = next(i for i, call in enumerate(built[rank][1]) if call[0] == "dp" and call[7] == c.index)
                index[(rank, k)] = len(collectives)
            collectives.append(
                dataclasses.replace(c, index=len(collectives), shape=local[3], shapes=local[6] or (), group=members)
            )
    for q in range(plan.world_size):  # each group's own: its partial sums
        for k, call in enumerate(built[q * t][1]):
            if call[0] == "tp":
                for j in range(t):
                    index[(q * t + j, k)] = len(collectives)
                group = tuple(q * t + j for j in range(t))
                collectives.append(
                    Collective(len(collectives), *call[1:5], owners=call[5], shapes=call[6], group=group)
                )

    def part(m):  # a message of the tokens of each part: their shape, laid out contiguously
        if m.index not in by_tokens:
            return {}
        shape = tuple(by_tokens[m.index])
        return {"shape": shape, "stride": tuple(torch.empty(shape, device="meta").stride())}

    messages = tuple(
        dataclasses.replace(m, index=m.index * t + j, src=m.src * t + j, dst=m.dst * t + j, **part(m))
        for m in plan.messages
        for j in range(t)
    )
    from postplace.runtime.ddp import graph_module

    programs, ranks = [], []
    for rank, (g, _calls) in enumerate(built):
        q, j = divmod(rank, t)
        actions = []
        for node in g.nodes:
            if node.op != "call_module":
                continue
            if node.target in (SEND, RECV):
                actions.append(("send" if node.target == SEND else "recv", int(node.args[0])))
            else:
                node.args = (index[(rank, node.args[0])], *node.args[1:])
                actions.append(("collective", node.args[0]))
        old = plan.programs[q]
        device = devices[devices.index(old.device) + j]
        gm = graph_module(traced, g, _COMMS)
        programs.append(RankProgram(rank, device, gm, old.inputs, old.outputs if j == 0 else (), tuple(actions)))
        ranks.append(device)
    return RankPlan(
        plan.device_names,
        tuple(ranks),
        messages,
        tuple(programs),
        plan.n_persistent,
        collectives=tuple(collectives),
        partial_loss=plan.partial_loss,
        tensor_split=_tensor_split(traced, params),
        tensor_degree=t,
    )


def launchable_tensor(spec) -> bool:
    """The plan (a :class:`postplace.plans.PlanSpec`) is tensor parallelism :func:`tensor_plan` runs: groups
    that are ``ddp``, ``zero1``, ``zero2`` or ``fsdp`` replicas (``fsdp:tp=T``, ``+recompute`` or ``+selective``
    or not), their per-unit hybrids (``ddp:tp=T,shard=U/U``), or pipelines of ``ddp`` or ``zero1`` groups
    (:func:`tensor_ranks`)."""
    if spec.pipeline:  # a pipeline of groups: ddp or zero1 replicas (runtime.pipeline)
        return bool(spec.tensor) and spec.level in ("ddp", "zero1") and spec.shard is None
    hybrid = spec.shard is None or spec.level in ("ddp", "fsdp")  # a per-unit hybrid's groups: fsdp's program
    return bool(spec.tensor) and spec.level in ("ddp", "zero1", "zero2", "fsdp") and hybrid


def split_parameters(traced, degree: int, *, tied: bool = True) -> dict[str, Split]:
    """The placeholders split over the group (parameters and their same-shaped optimizer state), each with
    its dimension: a column-split weight or bias and a vocabulary-split head by rows (dim 0), a row-split
    weight by columns (dim 1)."""
    from postplace.plans.tensor import check_degree, split_linears

    role, _whole = split_linears(traced.graph, tied=tied)
    check_degree(traced.graph, degree, role)
    out: dict[str, Split] = {}
    for i, (p, holder, moments) in enumerate(_parameter_holders(traced)):
        kind = role.get(traced.op_of_node.get(holder, -1))
        if kind is not None:
            dim = 1 if kind == "row" else 0
            if p.shape[dim] % degree:
                raise PostplaceError(
                    f"tensor parallelism: tp={degree} does not divide dimension {dim} ({p.shape[dim]}) of "
                    f"parameter {i} of '{traced.graph.name}'; choose a tp that divides it"
                )
            lay = Split(dim, 1, frozenset({holder}))
            out.update(dict.fromkeys((holder, *moments), lay))
    return out


def _parameter_holders(traced):
    """Per parameter of the traced model, in order: it, its placeholder's name and the names of its optimizer
    state's placeholders shaped like it (the step counts left out)."""
    holders = [n.name for n in traced.gm.graph.nodes if n.op == "placeholder"]
    params = list(traced.model.parameters())
    at = len(params) + len(list(traced.model.buffers()))
    for i, p in enumerate(params):
        names = traced.optimizer.state_names(i)
        yield p, holders[i], [holders[at + k] for k, s in enumerate(names) if s != "step"]
        at += len(names)


def tensor_plan(
    traced,
    devices: list[int],
    device_names,
    *,
    tp: int | None = None,
    bucket_bytes: float = 25e6,
    recompute=(),
    selective: bool | frozenset[str] = False,
    level: str = "ddp",
    sequence: SequenceSplit | None = None,
    shard: frozenset[str] | None = None,
) -> RankPlan:
    """Per-rank programs of ``traced`` split Megatron-style over groups of ``tp`` of the logical devices
    ``devices`` (see the module docstring): rank ``j + tp x r`` is part j of replica r, Megatron-LM's order.

    With more than one group, each group is a ``ddp`` replica (:func:`postplace.runtime.ddp.replica_program`:
    its micro-batches, its gradients all-reduced in buckets after the backward), and each bucket is
    all-reduced over the ranks that hold the same parts (j of every replica), as Megatron-LM's
    data-parallel groups do. With ``recompute`` (units, and ``selective`` as for
    :func:`postplace.runtime.ddp.ddp_plan`) each group's program runs those units' forward again before their
    backward, split alike: the recomputed forward all-reduces its partial sums again, as Megatron-LM's does.
    With ``level="zero1"`` each replica owns whole parameters (its part of them), as the simulated plan's
    owners on the split step (:func:`postplace.plans.data_parallel.zero_owners`), holds their moments alone,
    updates them alone, and all-gathers the others' parts after the update over the ranks of its part;
    ``"zero2"`` also reduce-scatters each micro-batch's gradients to their owners. With ``level="fsdp"`` each
    replica is :func:`postplace.runtime.fsdp.fsdp_replica_program`'s, every parameter and moment a slice of its
    part (``sharded``), gathered and reduce-scattered over the ranks of the part; with ``shard`` (units) the
    replicas are the per-unit hybrid's (:func:`postplace.runtime.fsdp.fsdp_replica_program`: those units as
    FSDP's, the others whole, their gradients all-reduced in buckets of ``bucket_bytes``). With ``sequence`` (the
    simulated plan's ops split by tokens: :func:`sequence_split_of`) the group runs
    sequence parallelism: those ops on its rank's tokens of each sequence, each partial sum they read
    reduce-scattered by tokens, what another op reads of them all-gathered once per phase.

    Returns
    -------
    RankPlan
        No messages; its collectives: per group, the partial sums' all-reduces and the cross-entropy's three
        per micro-batch; per part, the gradient buckets' all-reduces over the replicas. ``tensor_split``
        names what each rank holds a part of.

    Raises
    ------
    PostplaceError
        A step with nothing to split, a tp that does not divide a split dimension or the devices, replicas
        that do not divide the micro-batches, an op the split cannot run (one line naming it).
    """
    from postplace.runtime.ddp import check_replicas, graph_module, replica_program, whole_program

    t = tp or len(devices)
    if len(devices) % t:
        raise PostplaceError(f"tensor parallelism: tp={t} does not divide the {len(devices)} GPUs of the plan")
    dp, world = len(devices) // t, len(devices)
    if level not in ("ddp", "zero1", "zero2", "fsdp"):
        raise PostplaceError(f"tensor parallelism launches in ddp, zero1, zero2 or fsdp replicas, not {level}")
    by_units = level == "fsdp" or shard is not None  # FSDP's program: every unit sharded, or those of a hybrid
    if (level != "ddp" or shard is not None) and dp < 2:
        what = f"{level}" if shard is None else "a per-unit hybrid (shard=)"
        raise PostplaceError(
            f"tensor parallelism: {what} shards over replicas of the {t}-GPU group and the plan has {dp}; "
            f"give it 2 or more replicas, or use ddp:tp={t} for one group"
        )
    if sequence is not None:
        stamp_traced(traced)  # before the replicas' programs are copied from it
    tokens = None if sequence is None else _sequence_of(traced, sequence, t)
    owners = zero_owners_split(traced, t, dp) if level in ("zero1", "zero2") else None
    replica_calls: list[list] = [[] for _ in range(dp)]  # each replica's collective calls, by index
    sliced: frozenset[int] = frozenset()
    if dp > 1:
        check_replicas(traced, dp, level)
        programs = []
        for r in range(dp):
            if by_units:
                from postplace.runtime.fsdp import fsdp_replica_program

                gm, replica_calls[r], sliced = fsdp_replica_program(
                    traced,
                    r,
                    traced.microbatches // dp,
                    recompute=recompute,
                    selective=selective,
                    shard=shard,
                    bucket_bytes=bucket_bytes,
                )
            else:
                gm, replica_calls[r] = replica_program(
                    traced, r, traced.microbatches // dp, bucket_bytes, owners=owners, sharded_grads=level == "zero2"
                )
            programs.append(gm)
    else:
        programs = [whole_program(traced)]
    if recompute and not (by_units and dp > 1):  # FSDP's replica recomputes from its backward gathers itself
        from postplace.runtime.recompute import recompute_program

        for gm in programs:
            recompute_program(gm, traced, set(recompute), selective=selective)
    sources = [gm.graph for gm in programs]
    params = split_parameters(traced, t)

    def gathered(r: int):  # ZeRO and FSDP: replica r's collective k, as its program records it
        return lambda k: (list(replica_calls[r][k][1]), replica_calls[r][k][3])

    slices = sliced_placeholders(traced, sliced)
    built = _settled(
        traced,
        params,
        lambda: [
            _Builder(traced, sources[r], t, j, params, gathered=gathered(r), replica=r, sliced=slices, tokens=tokens)
            for r in range(dp)
            for j in range(t)
        ],
    )
    calls = built[0][1]
    index: dict[tuple[int, int], int] = {}  # (the program's k-th collective, rank) -> the plan's collective
    collectives = []
    for k, (over, kind, label, shape, dtype, who, shapes, _source) in enumerate(calls):
        if over == "tp":
            groups = [tuple(r * t + j for j in range(t)) for r in range(dp)]
        else:
            groups = [tuple(r * t + j for r in range(dp)) for j in range(t)]
        for members in groups:
            for rank in members:
                index[(k, rank)] = len(collectives)
            group = members if len(members) < world else ()
            collectives.append(
                Collective(len(collectives), kind, label, shape, dtype, owners=who, shapes=shapes, group=group)
            )
    holders = [n.name for n in traced.gm.graph.nodes if n.op == "placeholder"]
    programs = []
    for rank, (g, mine) in enumerate(built):
        if [c[:2] + c[3:] for c in mine] != [c[:2] + c[3:] for c in calls]:  # one graph cut alike: never
            raise AssertionError("the ranks of a tensor-parallel plan call their collectives in different orders")
        for node in g.nodes:
            if node.op == "call_module":
                node.args = (index[(node.args[0], rank)], *node.args[1:])
        kept = {n.name for n in g.nodes if n.op == "placeholder"}
        programs.append(
            RankProgram(
                rank,
                devices[rank],
                graph_module(traced, g, _COMMS),
                tuple(i for i, x in enumerate(holders) if x in kept),
                (0,) if rank % t == 0 else (),  # the group's loss once
                tuple(("collective", index[(k, rank)]) for k in range(len(calls))),
            )
        )
    return RankPlan(
        tuple(device_names),
        tuple(devices),
        (),
        tuple(programs),
        len(holders) - len(traced.inputs),
        collectives=tuple(collectives),
        partial_loss=dp > 1,
        sharded=sliced,
        tensor_split=_tensor_split(traced, params),
        tensor_degree=t,
    )


def stamp_traced(traced) -> None:
    """Name every traced node in its metadata, which the programs' copies of it keep (a program may rename a
    copy): sequence parallelism finds each node's op by it. Call before the programs are made."""
    for n in traced.gm.graph.nodes:
        n.meta.setdefault(TRACED, n.name)


@dataclasses.dataclass(frozen=True)
class SequenceSplit:
    """What a launch of a plan with ``sp`` splits by tokens, as the simulated plan does: ``ops``, the names of the
    ops run on a rank's tokens, and ``scattered``, the partial sums only reduce-scattered (a pipeline stage sends
    their tokens)."""

    ops: frozenset[str]
    scattered: frozenset[str] = frozenset()


def sequence_split_of(traced, spec, *, tied: bool = True) -> SequenceSplit:
    """The :class:`SequenceSplit` of launching ``spec`` on ``traced``: the simulated pass's own lists
    (:func:`postplace.plans.tensor.sequence_split` on the step as ``spec`` recomputes it; ``tied``: a head tied to
    the embedding split with it, False in a pipeline), the traced nodes named first (:func:`stamp_traced`), so
    call it before any program is copied from ``traced``."""
    from postplace.plans.spec import recomputed
    from postplace.plans.tensor import sequence_split

    ops, scattered = sequence_split(recomputed(traced.graph, spec), tied=tied)
    stamp_traced(traced)
    return SequenceSplit(ops, scattered)


def _sequence_of(traced, sequence: SequenceSplit, degree: int) -> _Tokens:
    """Sequence parallelism's :class:`_Tokens` for ``traced``, whose first batch input is (sequences, tokens)."""
    ops, scattered = sequence.ops, sequence.scattered
    first = next(  # token ids (sequences, tokens) or vectors (sequences, tokens, width)
        (x for x in traced.inputs if x.dim() >= (2 if not x.is_floating_point() else 3)), None
    )
    if ops and (first is None or first.shape[1] % degree):
        why = (
            "no input of (sequences, tokens) or (sequences, tokens, width) to split by tokens"
            if first is None
            else f"a sequence of {first.shape[1]} tokens, which tp={degree} does not split"
        )
        raise PostplaceError(f"sequence parallelism: '{traced.graph.name}' has {why}; launch the plan without ',sp'")
    if first is None:  # nothing is split by tokens: sp changes nothing
        return _Tokens(traced, ops, 0, 0, scattered)
    return _Tokens(traced, ops, int(first.shape[0]), int(first.shape[1]), scattered)


def sliced_placeholders(traced, sliced: frozenset[int]) -> frozenset[str]:
    """The placeholders FSDP holds as slices: the parameters ``sliced`` names (indices) and their optimizer
    state (the step counts stay whole)."""
    every = enumerate(_parameter_holders(traced))
    return frozenset(name for i, (_p, holder, moments) in every if i in sliced for name in (holder, *moments))
