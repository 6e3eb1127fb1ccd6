"""Tensor parallelism as a graph pass: Megatron-LM's split of a block's linear layers over t GPUs.

Megatron-LM (Shoeybi et al. 2019, Sec. 3) splits the first linear layer of an MLP by columns and the
second by rows, so the element-wise stretch between them runs on each GPU's columns alone and only the
second layer's output needs an all-reduce (forward), and the first layer's input gradient another
(backward); attention the same way, by heads: the query/key/value projections by columns, the output
projection by rows. Four all-reduces of one activation per block and micro-batch, nothing else.

The pass finds that pattern in the traced step by data flow, so it works on any module, not by names:
a *linear* is a forward ``mm``/``addmm`` one of whose operands comes from parameters alone (the weight,
its transpose, its cast); a linear L is *column-split* when everything its output reaches in the forward
pass before the next linear layer flows into one and the same linear R (nothing escapes to the
residual stream or the loss), and R is then *row-split*. Several column linears may share one R (the
query, key and value projections; SwiGLU's gate and up projections). In a model with such pairs, a
linear whose output reaches the loss through a softmax with no linear or norm between (a transformer's
output head, its weight read by it alone or also by lookups, as an embedding tied to the head) is split by
*vocabulary*: each GPU computes its share of the
logits, and the softmax over them all-reduces each token's maximum, sum and target logit (Megatron-LM's
vocabulary-parallel cross-entropy, three fp32 values per token). The input embedding of that vocabulary
(a table as large as the head's, read by lookups alone) is split by vocabulary too, as Megatron-LM splits
it (and a table tied to the head is that table): each GPU holds its rows, looks up the tokens that fall in
them (zeros for the others) and the vectors are all-reduced (a partial sum); its gradient is each GPU's
rows'. Every other op stays whole: each GPU runs it entirely (the norms, the residual adds, a position table) and
:func:`tensor_parallel` lists the linear layers it left whole.

What each op then is on one GPU follows from its inputs, forward and backward alike, as a sharding
rule: a split parameter (the weights and biases of the split linears) is a *shard* (1/t of it per GPU);
an op reading a shard computes a shard (1/t of its FLOPs, bytes and output); a matrix product of a
shard of activations with a shard of a weight is a *partial sum* (full size, 1/t of the FLOPs: the
row-split forward, the column-split input gradient), and sums of partial sums stay partial; any other
op reading a partial sum waits for its all-reduce. The gradients, their sums and the optimizer's
update of a shard are shards too, so the data-parallel pass that runs next (:mod:`postplace.plans
.data_parallel`) reduces, shards and gathers 1/t of them.

The pass runs in two halves around the data-parallel pass. :func:`tensor_parallel` rewrites the step
as one GPU of the group sees it, with a no-cost ``tp_all_reduce`` op (in place on the partial sum)
where the all-reduce goes; :func:`over_tensor_ranks` then copies a planned step once per GPU of the
group (``t{j}/NAME``) and makes each ``tp_all_reduce`` a collective over the group's copies.
Megatron-LM's rank order follows: GPU ``j + t x replica``, so a group is t neighbouring GPUs.

*Sequence parallelism* (Korthikanti et al. 2022, Megatron-LM's ``--sequence-parallel``; ``sequence=True``)
splits what tensor parallelism leaves whole between the blocks, the norms, dropouts and residual adds, by
tokens: such an op computes 1/t of the tokens (a fourth state, SEQUENCE). Where a partial sum flows into
one, its all-reduce becomes a *reduce-scatter*; where a split linear (or anything not known to act per
token: a whole linear, an embedding's backward) reads one, an *all-gather* of its tokens comes first, one
for the forward's readers and another just before the backward's (Megatron-LM gathers the norm's output
again in the backward rather than keeping it whole). The same bus bytes as the all-reduces in the
forward, one more gather per split pair in the backward, and the activations between the blocks at 1/t.
A per-token op whose output goes (through views) to an optimizer or a gradient sum reduces over the tokens
(a norm's weight, a row-split layer's bias): its gradient is a partial sum, all-reduced over the group
(Megatron-LM all-reduces the norms' gradients; here once per micro-batch, a few kB each). Which ops act
per token is an allow-list of op types (element-wise ops, norms, dropouts, views); a ``mean`` or ``sum``
over the sequence itself (pooling) would be taken for one over features, which a transformer has not.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping

import numpy as np

from postplace.errors import PostplaceError
from postplace.graph import PHASES, OpGraph
from postplace.graph.opgraph import REDUCES_ACROSS
from postplace.plans._draft import Draft
from postplace.plans._step import BACKWARD, FORWARD, UPDATE, chain_positions, parameter_ops, traced_name

__all__ = [
    "TP_ALL_GATHER",
    "TP_ALL_REDUCE",
    "TP_REDUCE_SCATTER",
    "check_degree",
    "over_tensor_ranks",
    "sequence_split",
    "sequence_split_ops",
    "split_activations",
    "split_linears",
    "tensor_parallel",
]

TP_ALL_REDUCE = "tp_all_reduce"
TP_ALL_GATHER = "tp_all_gather"
TP_REDUCE_SCATTER = "tp_reduce_scatter"
_TP_COLLECTIVES = {TP_ALL_REDUCE: "all_reduce", TP_ALL_GATHER: "all_gather", TP_REDUCE_SCATTER: "reduce_scatter"}
_PRODUCTS = ("mm", "addmm")
_LINEAR = ("add", "add_", "_to_copy", "clone", "view", "_unsafe_view", "reshape", "alias")  # of partial sums: partial
_NORMS = ("mean", "var", "var_mean", "std")  # a reduction over the split features: not Megatron's pattern
_REDUCTIONS = (*_NORMS, "sum")
_SOFTMAXES = ("_log_softmax", "log_softmax", "_softmax", "softmax", "logsumexp", "amax")
_ELEMENT_BYTES = (4.0, 2.0, 2.0)  # by graph.precision: fp32, bf16, fp16
WHOLE, SHARD, PARTIAL, SEQUENCE = 0, 1, 2, 3
_PURE_VIEWS = ("view", "_unsafe_view", "reshape", "alias", "t", "transpose", "permute", "detach")
_VIEWS = (*_PURE_VIEWS, "_to_copy", "clone")  # a cast gathers fewer bytes after it (bf16) than before: kept
# ops that act on each token alone: sequence parallelism splits them by tokens
_PER_TOKEN = frozenset(
    (
        *_VIEWS,
        *("add", "add_", "sub", "mul", "mul_", "div", "neg", "pow", "rsqrt", "sqrt", "exp", "tanh", "sigmoid"),
        *("mean", "var", "var_mean", "sum", "native_layer_norm", "native_layer_norm_backward"),
        *("_fused_rms_norm", "_fused_rms_norm_backward", "native_dropout", "native_dropout_backward"),
        *("gelu", "gelu_backward", "silu", "silu_backward", "relu", "threshold_backward", "masked_fill", "where"),
        *("expand", "copy_", "fill", "zeros_like", "ones_like", "empty_like", "bernoulli", "rand_like"),
        *("bernoulli_", "uniform_", "div_"),  # a dropout's mask drawn in place: split as the tensor it writes
    )
)


def _inputs(graph: OpGraph) -> list[list[int]]:
    """Per op, the ops whose data it reads (zero-byte ordering edges left out)."""
    ins: list[list[int]] = [[] for _ in range(graph.num_ops)]
    for s, d, b in zip(graph.edge_src.tolist(), graph.edge_dst.tolist(), graph.edge_bytes.tolist(), strict=True):
        if b > 0 and s not in ins[d]:
            ins[d].append(s)
    return ins


def _outputs(ins: list[list[int]]) -> list[list[int]]:
    """Per op, the ops that read its data (the reverse of :func:`_inputs`)."""
    outs: list[list[int]] = [[] for _ in ins]
    for d, srcs in enumerate(ins):
        for s in srcs:
            outs[s].append(d)
    return outs


def _params_read(ins: list[list[int]], weights: np.ndarray, is_param: np.ndarray, i: int) -> list[int]:
    """The parameter ops ``i`` reads, directly or through ops of parameters alone (``weights``: a
    transpose, a cast)."""
    found, todo, seen = [], [s for s in ins[i] if weights[s]], set()
    while todo:
        s = todo.pop()
        if s in seen:
            continue
        seen.add(s)
        if is_param[s]:
            found.append(s)
        todo.extend(x for x in ins[s] if weights[x])
    return found


def _from_parameters(graph: OpGraph, ins: list[list[int]]) -> np.ndarray:
    """``bool[n]``: parameters, and ops reading nothing but such ops (a weight's transpose, its cast)."""
    out = parameter_ops(graph).copy()
    for i in range(graph.num_ops):
        if not out[i] and ins[i]:
            out[i] = all(out[s] for s in ins[i])
    return out


def split_linears(graph: OpGraph, *, tied: bool = True) -> tuple[dict[int, str], list[int]]:
    """The Megatron pattern in ``graph`` (read off its first micro-batch's forward pass); with ``tied`` False
    a head whose table the embedding also reads stays whole (a pipeline sends the head's gradient of a tied
    table to the embedding's stage whole: :func:`split_activations`).

    Returns
    -------
    (dict, list)
        The parameter ops to split, each with ``"column"`` or ``"row"``; and the linear ops left whole.
    """
    ins = _inputs(graph)
    outs = _outputs(ins)
    weights = _from_parameters(graph, ins)
    is_param = parameter_ops(graph)
    first = int(graph.microbatch.max()) if graph.microbatch.max() < 0 else 0
    forward = (graph.phase == FORWARD) & (graph.microbatch == first)
    linear = np.array(
        [
            forward[i]
            and graph.op_types[i] in _PRODUCTS
            and any(weights[s] for s in ins[i])
            and not all(weights[s] for s in ins[i])
            for i in range(graph.num_ops)
        ]
    )

    readers: dict[int, set[int]] = {}  # parameter -> the forward ops reading it (through its transpose, cast...)
    for p in np.flatnonzero(is_param).tolist():
        seen, todo, found = set(), [p], set()
        while todo:
            j = todo.pop()
            for d in outs[j]:
                if weights[d] and d not in seen:
                    seen.add(d)
                    todo.append(d)
                elif not weights[d] and forward[d]:
                    found.add(d)
        readers[p] = found
    params: dict[int, list[int]] = {i: [] for i in np.flatnonzero(linear).tolist()}
    for p, found in readers.items():
        for d in found:
            if d in params:
                params[d].append(p)

    def reaches(i: int) -> int | None:
        """The one linear everything ``i`` feeds in the forward pass flows into; None when it escapes."""
        seen, todo, ends = set(), deque([i]), set()
        while todo:
            j = todo.popleft()
            nxt = [d for d in outs[j] if forward[d]]
            if not nxt:
                return None
            for d in nxt:
                if "norm" in graph.op_types[d] or graph.op_types[d] in _NORMS:
                    return None
                if linear[d]:
                    ends.add(d)
                elif d not in seen:
                    seen.add(d)
                    todo.append(d)
        return ends.pop() if len(ends) == 1 else None

    def ends_in_loss(i: int) -> bool:
        """Everything ``i`` feeds in the forward pass reaches the loss with no linear layer or norm between,
        through a softmax (a classifier's logits: a regression head is not split by vocabulary)."""
        seen, todo, softmax = set(), deque([i]), False
        while todo:
            for d in (d for d in outs[todo.popleft()] if forward[d]):
                if linear[d] or "norm" in graph.op_types[d] or graph.op_types[d] in _NORMS:
                    return False
                softmax = softmax or graph.op_types[d] in _SOFTMAXES
                if d not in seen:
                    seen.add(d)
                    todo.append(d)
        return softmax

    role: dict[int, str] = {}
    rows: set[int] = set()
    for col in params:  # in program order, so a row-split layer is never split by columns again
        row = reaches(col) if col not in rows else None
        if row is None or row == col or any(readers[p] != {i} for i in (col, row) for p in params[i]):
            continue
        rows.add(row)
        for p in params[col]:
            role[p] = "column"
        weight = max(params[row], key=lambda p: graph.output_bytes[p])  # a row-split layer's bias stays whole
        role[weight] = "row"

    def head_only(p: int, head: int) -> bool:
        """``p`` is read by ``head`` alone, or by it and lookups of the same table (an embedding tied to the
        head, as GPT-2's: Megatron-LM splits the shared table by vocabulary for both)."""
        if readers[p] == {head}:
            return True
        return tied and head in readers[p] and all(d == head or graph.op_types[d] == "embedding" for d in readers[p])

    for head in params:  # a transformer's output head: split by vocabulary, with its cross-entropy
        if (
            role
            and head not in rows
            and not any(p in role for p in params[head])
            and params[head]
            and all(head_only(p, head) for p in params[head])
            and ends_in_loss(head)
        ):
            for p in params[head]:
                role[p] = "vocab"
    heads = [p for p, r in role.items() if r == "vocab"]
    for p, found in readers.items():  # the input embedding of a vocabulary-split head's vocabulary: split alike
        if (
            heads
            and p not in role
            and found
            and all(graph.op_types[d] == "embedding" for d in found)
            and any(graph.output_bytes[p] == graph.output_bytes[h] for h in heads)
        ):
            role[p] = "embedding"
    whole = [i for i in params if not any(p in role for p in params[i])]
    return role, whole


def check_degree(graph: OpGraph, degree: int, role: dict) -> None:
    """One :class:`PostplaceError` line when ``graph`` cannot be split over ``degree`` GPUs: nothing to split
    (``role`` of :func:`split_linears` empty), or a zoo model's attention heads that ``degree`` does not divide."""
    if not role:
        raise PostplaceError(
            f"tensor parallelism: graph '{graph.name}' has no pair of linear layers Megatron-LM would "
            "split (a linear, an element-wise stretch or attention, a linear); use tp=1"
        )
    config = (graph.metadata.get("zoo") or {}).get("config") or {}
    for key in ("heads", "kv_heads"):
        if config.get(key) and config[key] % degree:
            what = key.replace("_", " ")
            raise PostplaceError(
                f"tensor parallelism: tp={degree} does not divide the {config[key]} {what} of "
                f"'{graph.name}'; choose a tp that divides them"
            )


def _states(graph: OpGraph, role: dict, ins: list[list[int]], weights: np.ndarray) -> np.ndarray:
    """Each op's state on one GPU of the group (WHOLE, SHARD or PARTIAL: the module docstring)."""
    n = graph.num_ops
    state = np.full(n, WHOLE, dtype=np.int64)
    looked_up: set[int] = set()  # the colocation sets of embedding lookups in a split table
    for i in range(n):
        if i in role:
            state[i] = SHARD
            continue
        got = [state[s] for s in ins[i]]
        if graph.op_types[i] == "embedding" and SHARD in got:  # each rank's rows: a term of every token's vector
            state[i] = PARTIAL
            looked_up.add(int(graph.colocation[i]))
        elif graph.op_types[i] == "embedding_dense_backward" and int(graph.colocation[i]) in looked_up - {-1}:
            state[i] = SHARD  # the gradient of this rank's rows
        elif PARTIAL in got and graph.op_types[i] in _LINEAR and all(x == PARTIAL for x in got):
            state[i] = PARTIAL
        elif (
            graph.op_types[i] in _PRODUCTS
            and any(state[s] == SHARD and weights[s] for s in ins[i])
            and any(state[s] == SHARD and not weights[s] for s in ins[i])
        ):
            state[i] = PARTIAL
        elif SHARD in got:
            state[i] = SHARD
    return state


def _gradient_sinks(graph: OpGraph, outs: list[list[int]]) -> np.ndarray:
    """``bool[n]``: ops that take a parameter's gradient as it is: the optimizer's, the gradient sums, the loss
    sums, and views or casts whose every reader is one."""
    sink = (graph.phase == UPDATE) | (chain_positions(graph) >= 0)
    for i in range(graph.num_ops - 1, -1, -1):
        if not sink[i] and graph.op_types[i] in _VIEWS and outs[i] and all(sink[d] for d in outs[i]):
            sink[i] = True
    return sink


def _sequence_states(
    graph: OpGraph, state: np.ndarray, ins: list[list[int]], outs: list[list[int]], weights: np.ndarray, sink
) -> np.ndarray:
    """``state`` with the ops sequence parallelism splits by tokens set to SEQUENCE: per-token ops (the
    allow-list) that tensor parallelism leaves whole and that read a partial sum (then reduce-scattered) or
    a split-by-tokens input, in the forward and the backward; never a gradient sink (``sink``:
    :func:`_gradient_sinks`)."""
    out = state.copy()
    across = set(graph.metadata.get(REDUCES_ACROSS) or ())  # a pooling over tokens, say: not per token
    for i in range(graph.num_ops):
        if weights[i] or sink[i] or graph.op_types[i] not in _PER_TOKEN:
            continue
        if graph.op_types[i] in _REDUCTIONS and graph.output_bytes[i] <= 8:  # a scalar (a loss): over every token
            continue
        if graph.names[i].removeprefix("rc:") in across and not any(sink[d] for d in outs[i]):
            continue  # over the tokens, and not a parameter's gradient (that one is summed per rank, all-reduced)
        if state[i] == WHOLE and graph.phase[i] in (FORWARD, BACKWARD):
            if any(out[s] == SEQUENCE or state[s] == PARTIAL for s in ins[i]):
                out[i] = SEQUENCE
        elif state[i] == PARTIAL and (graph.phase[i] == FORWARD or graph.names[i].startswith("rc:")):
            # the residual stream (and its recomputed copy): a sum of partial sums in plain tp, reduce-scattered
            # as each leaves its product here, so that the stream between the blocks (and a pipeline's send)
            # is 1/t of it
            out[i] = SEQUENCE
    for i in range(graph.num_ops - 1, -1, -1):  # a view read only whole, in its own phase: gathered once before it
        if (
            out[i] == SEQUENCE
            and graph.op_types[i] in _PURE_VIEWS
            and all(out[d] != SEQUENCE and graph.phase[d] == graph.phase[i] for d in outs[i])
        ):
            out[i] = WHOLE
    return out


def split_activations(graph: OpGraph, *, tied: bool = True) -> np.ndarray:
    """``bool[n]``: the ops whose output each GPU of a tensor-parallel group holds a part of and that do not
    come from parameters alone (the activations between a column-split and a row-split linear, and their
    gradients): a pipeline's stage cut must not send one (Megatron-LM cuts between whole layers)."""
    role, _whole = split_linears(graph, tied=tied)
    ins = _inputs(graph)
    weights = _from_parameters(graph, ins)
    return (_states(graph, role, ins, weights) == SHARD) & ~weights


def sequence_split_ops(graph: OpGraph, *, tied: bool = True) -> frozenset[str]:
    """The names of the ops :func:`tensor_parallel` with ``sequence`` runs on 1/t of the tokens (``graph``:
    recomputation applied, as the plan's pass sees it): :mod:`postplace.runtime.tensor` splits the same ops,
    so a launched plan moves what the simulated one charges."""
    return sequence_split(graph, tied=tied)[0]


def sequence_split(graph: OpGraph, *, tied: bool = True) -> tuple[frozenset[str], frozenset[str]]:
    """:func:`sequence_split_ops`, and the names of the partial sums sequence parallelism only reduce-scatters
    (every reader that takes the sum splits by tokens): a pipeline stage sends such a sum's tokens, not the sum
    (the launched pipeline does)."""
    state, outs = _sequence_state(graph, tied)
    split = frozenset(graph.names[i] for i in np.flatnonzero(state == SEQUENCE))
    scattered = frozenset(
        graph.names[i]
        for i in np.flatnonzero(state == PARTIAL)
        if any(state[d] == SEQUENCE for d in outs[i]) and all(state[d] in (SEQUENCE, PARTIAL) for d in outs[i])
    )
    return split, scattered


def _sequence_state(graph: OpGraph, tied: bool) -> tuple[np.ndarray, list[list[int]]]:
    role, _whole = split_linears(graph, tied=tied)
    ins = _inputs(graph)
    weights = _from_parameters(graph, ins)
    outs = _outputs(ins)
    state = _states(graph, role, ins, weights)
    return _sequence_states(graph, state, ins, outs, weights, _gradient_sinks(graph, outs)), outs


def tensor_parallel(
    graph: OpGraph, degree: int, *, sequence: bool = False, tied: bool = True, stages: Mapping[str, int] | None = None
) -> OpGraph:
    """The step as one GPU of a tensor-parallel group of ``degree`` sees it (see the module docstring).

    Parameters
    ----------
    graph : OpGraph
        A traced step (any micro-batch count, recomputation already applied).
    degree : int
        t, the GPUs of the group.
    sequence : bool
        Sequence parallelism too: the ops between the blocks split by tokens (the module docstring).
    tied : bool
        Split a table the embedding and the output head share (False in a pipeline: :func:`split_linears`).
    stages : mapping of str to int, optional
        A pipeline's stage of each traced op (by name): a partial sum a stage sends is all-reduced first (the
        stage sends the sum, not its term), as the launched pipeline does.

    Returns
    -------
    OpGraph
        Split ops at 1/t, ``tp_all_reduce`` ops where the group meets; ``metadata["tensor_parallel"]``
        says what was split and what was left whole.

    Raises
    ------
    PostplaceError
        No linear layer pair to split, or t not dividing the model's attention heads.
    """
    role, whole = split_linears(graph, tied=tied)
    check_degree(graph, degree, role)
    if sequence:
        _check_tokens(graph, degree)
    ins = _inputs(graph)
    weights = _from_parameters(graph, ins)
    n, t = graph.num_ops, float(degree)
    state = _states(graph, role, ins, weights)
    if sequence:
        outs = _outputs(ins)
        sink = _gradient_sinks(graph, outs)
        state = _sequence_states(graph, state, ins, outs, weights, sink)
    draft = Draft(graph)
    src, dst, slot, nbytes = (a.tolist() for a in (graph.edge_src, graph.edge_dst, graph.edge_slot, graph.edge_bytes))

    def collective_after(
        i: int, kind: str, key: tuple, *, inplace: bool, suffix: str = "", phase: int | None = None, **made
    ) -> int:
        """A no-cost op of the group's collective ``kind`` on op ``i``'s output (in place or not), at ``key``,
        in ``i``'s phase unless ``phase`` says."""
        op = draft.make(
            f"{kind}:{graph.names[i]}{suffix}",
            key,
            phase=int(graph.phase[i]) if phase is None else phase,
            microbatch=int(graph.microbatch[i]),
            module=graph.module[i],
            op_type=kind,
            inplace=inplace,
            **made,
        )
        if inplace:
            draft.set(op, "inplace_base", i)
        return op

    def all_reduce_after(i: int, **made) -> int:
        """A ``tp_all_reduce`` in place on op ``i``'s output, right after it."""
        return collective_after(i, TP_ALL_REDUCE, (i + 0.5, 1), inplace=True, **made)

    reductions: dict[int, float] = {}  # a per-token op's gradient of a parameter, summed over this rank's tokens
    if sequence:
        slots: dict[int, dict[int, float]] = {}
        for e in range(len(src)):
            if state[src[e]] == SEQUENCE and sink[dst[e]] and nbytes[e] > 0:
                slots.setdefault(src[e], {})[slot[e]] = nbytes[e]
        reductions = {i: sum(by_slot.values()) for i, by_slot in slots.items()}
    for i in range(n):
        if state[i] == WHOLE:
            draft.copy(i, graph.names[i], (float(i), 0), inplace_base=int(graph.inplace_base[i]))
            continue
        change = {"inplace_base": int(graph.inplace_base[i])}
        if state[i] == PARTIAL:
            change["output_bytes"] = float(graph.output_bytes[i])
        elif state[i] == SEQUENCE and i in reductions:  # its tokens' share of the work, a whole gradient out
            per_token = max(float(graph.output_bytes[i]) - reductions[i], 0.0)
            change["output_bytes"] = per_token / t + reductions[i]
        if i in role:
            change["persistent_bytes"] = float(graph.persistent_bytes[i]) / t
        draft.copy(i, graph.names[i], (float(i), 0), scale=1.0 / t, **change)

    def crosses(s: int, d: int) -> bool:  # an edge between two stages of a pipeline
        if stages is None:
            return False
        return stages.get(traced_name(graph.names[s])) != stages.get(traced_name(graph.names[d]))

    reduced: dict[int, int] = {}
    scattered: dict[int, int] = {}
    gathered: dict[tuple, int] = {}
    grad_reduced: dict[int, int] = {}
    waits: list[tuple[int, int]] = []  # (op, gather): the gather starts after the op
    first_reader = {}  # (op, slot, phase) -> the first reader needing its tokens gathered: the gather goes before it
    if sequence:
        for e in range(len(src)):
            s, d = src[e], dst[e]
            if state[s] == SEQUENCE and state[d] != SEQUENCE and not sink[d] and nbytes[e] > 0:
                k = (s, slot[e], int(graph.phase[d]))
                first_reader[k] = min(first_reader.get(k, d), d)
    for e in range(len(src)):
        s, d, b = src[e], dst[e], nbytes[e]
        if state[s] == SHARD:
            draft.edge(s, d, slot[e], b / t)
        elif state[s] == PARTIAL and state[d] == SEQUENCE and b > 0:
            if s not in scattered:
                scattered[s] = collective_after(s, TP_REDUCE_SCATTER, (s + 0.5, 1), inplace=False, output_bytes=b / t)
                draft.edge(s, scattered[s], slot[e], b)
            draft.edge(scattered[s], d, 0, b / t)
        elif state[s] == PARTIAL and (state[d] != PARTIAL or crosses(s, d)) and b > 0:
            if s not in reduced:
                reduced[s] = all_reduce_after(s)
                draft.edge(s, reduced[s], slot[e], b)
            draft.edge(reduced[s], d, 0, b)
        elif state[s] == SEQUENCE and state[d] == SEQUENCE:
            draft.edge(s, d, slot[e], b / t)
        elif state[s] == SEQUENCE and sink[d]:  # a gradient summed over this rank's tokens: all-reduced first
            # (per micro-batch, before ZeRO-2's and FSDP's reduce-scatters; Megatron-LM: once per step)
            if s not in grad_reduced:
                grad_reduced[s] = all_reduce_after(s, output_bytes=reductions[s])
            draft.edge(s, grad_reduced[s], slot[e], b)
            draft.edge(s, d, slot[e], b)
            draft.order(grad_reduced[s], d)
        elif state[s] == SEQUENCE and b > 0:  # a reader of every token: gathered for it
            k = (s, slot[e], int(graph.phase[d]))
            if k not in gathered:
                gathered[k] = collective_after(
                    s,
                    TP_ALL_GATHER,
                    (first_reader[k] - 0.5, 1, slot[e]),
                    inplace=False,
                    suffix=f":{slot[e]}:{PHASES[k[2]]}" if (slot[e], k[2]) != (0, FORWARD) else "",
                    phase=k[2],
                    output_bytes=b,
                )
                draft.edge(s, gathered[k], slot[e], b / t)
                # not before its reader's other inputs of that phase (a gathered norm output again in the
                # backward, a gradient gathered while a recomputed block runs): held whole no longer than needed
                waits += [(x, gathered[k]) for x in ins[first_reader[k]] if x != s and graph.phase[x] == k[2]]
            draft.edge(gathered[k], d, 0, b)
        else:
            draft.edge(s, d, slot[e], b)
    for x, gather in waits:
        draft.order(x, gather)
    vocab = _vocab_reductions(graph, role, state, ins, weights)
    for (
        i,
        nbytes_,
    ) in vocab.items():  # the softmax over split logits: each token's max, sum and target logit all-reduced
        ar = all_reduce_after(i, output_bytes=nbytes_)
        draft.order(i, ar)
        for e in range(graph.out_ptr[i], graph.out_ptr[i + 1]):
            draft.order(ar, dst[e])
    split = sorted({graph.module[i] for i in range(n) if i in role})
    meta = {
        "degree": degree,
        "split": split,
        "whole_linears": sorted({graph.module[i] for i in whole}),
        "all_reduces": len(reduced) + len(vocab) + len(grad_reduced),
    }
    if sequence:
        meta.update(sequence=True, reduce_scatters=len(scattered), all_gathers=len(gathered))
    suffix = "+sp" if sequence else ""
    out, _ = draft.freeze(f"{graph.name}+tp{degree}{suffix}", {**graph.metadata, "tensor_parallel": meta})
    return out


def _check_tokens(graph: OpGraph, degree: int) -> None:
    """One :class:`PostplaceError` line when a zoo model's sequence does not split into ``degree`` parts."""
    config = (graph.metadata.get("zoo") or {}).get("config") or {}
    seq = config.get("seq")
    if seq and seq % degree:
        raise PostplaceError(
            f"sequence parallelism: tp={degree} does not divide the sequence of {seq} tokens of "
            f"'{graph.name}'; choose a tp that divides it, or drop sp"
        )


def _vocab_reductions(
    graph: OpGraph, role: dict, state: np.ndarray, ins: list[list[int]], weights: np.ndarray
) -> dict[int, float]:
    """The softmax-like ops over a vocabulary-split head's logits (in the forward), each with the bytes its
    all-reduce carries: three fp32 values per token (the maximum, the sum of exponentials and the target's
    logit: the vocabulary-parallel cross-entropy's three all-reduces, one op here; :mod:`postplace.runtime.tensor`
    runs them). Tokens are the logits' elements over the vocabulary, which follows
    from the head's weight (vocabulary x width), input (tokens x width) and output (tokens x vocabulary)."""
    is_param = parameter_ops(graph)
    params = {
        i: _params_read(ins, weights, is_param, i)
        for i in range(graph.num_ops)
        if graph.phase[i] == FORWARD and graph.op_types[i] in _PRODUCTS
    }
    heads = {i: ps for i, ps in params.items() if any(role.get(p) == "vocab" for p in ps)}
    out: dict[int, float] = {}
    outs = _outputs(ins)
    for h, ps in heads.items():
        weight = max(ps, key=lambda p: graph.output_bytes[p])
        into = {  # what the head reads of each whole input: its edge (a layer norm's op also makes its statistics)
            int(graph.edge_src[e]): float(graph.edge_bytes[e])
            for e in graph.in_edges[graph.in_ptr[h] : graph.in_ptr[h + 1]]
            if state[graph.edge_src[e]] != SHARD
        }
        x = max(into, key=into.get, default=None)
        if x is None:
            continue
        logits = float(graph.output_bytes[h])
        vocab = np.sqrt(graph.output_bytes[weight] / 4.0 * logits / into[x])
        tokens = logits / (vocab * _ELEMENT_BYTES[int(graph.precision[h])])
        seen, todo = {h}, deque([h])
        while todo:
            for d in outs[todo.popleft()]:
                if d in seen or graph.phase[d] != FORWARD:
                    continue
                seen.add(d)
                if graph.op_types[d] in _SOFTMAXES:
                    out[d] = 3 * 4.0 * tokens
                else:
                    todo.append(d)
    return out


def over_tensor_ranks(graph: OpGraph, replica: np.ndarray, degree: int) -> tuple[OpGraph, np.ndarray]:
    """``graph`` (a planned step of :func:`tensor_parallel`, each op's replica in ``replica``) copied once
    per GPU of each group: ``(step, each op's GPU slot j + t x replica)``; each data-parallel collective
    becomes one per group rank j, each ``tp_all_reduce`` an all-reduce over its group."""
    draft = Draft(graph)
    n = graph.num_ops
    ncoloc = int(graph.colocation.max()) + 1 if n else 0
    copies = np.empty((n, degree), dtype=np.int64)
    coll = graph.collective.tolist()
    per_rank = [
        [draft.add_collective(c.kind, c.nbytes, f"{c.name}:t{j}") for j in range(degree)] for c in graph.collectives
    ]
    for i in range(n):
        group = -1
        kind = _TP_COLLECTIVES.get(graph.op_types[i])
        if kind is not None:
            # S, the full buffer (opgraph.Collective): a vocabulary reduction's or a gradient's bytes are the
            # op's own output; a partial sum's come in on its edge, as a reduce-scatter's; a gather makes them
            into = [float(graph.edge_bytes[e]) for e in graph.in_edges[graph.in_ptr[i] : graph.in_ptr[i + 1]]]
            if kind == "all_gather":
                size = float(graph.output_bytes[i])
            elif kind == "reduce_scatter":
                size = max(into)
            else:
                size = float(graph.output_bytes[i]) or max(into)
            group = draft.add_collective(kind, size, f"tp:{graph.names[i]}")
        for j in range(degree):
            change = {"inplace_base": -1}
            if graph.colocation[i] >= 0:
                change["colocation"] = int(graph.colocation[i]) + j * ncoloc
            if group >= 0:
                change["op_types"] = kind
            k = draft.copy(i, f"t{j}/{graph.names[i]}", (i, j), int(replica[i]) * degree + j, **change)
            draft.collective[k] = group if group >= 0 else (per_rank[coll[i]][j] if coll[i] >= 0 else -1)
            copies[i, j] = k
    for i in np.flatnonzero(graph.inplace_base >= 0).tolist():
        for j in range(degree):
            draft.set(int(copies[i, j]), "inplace_base", int(copies[graph.inplace_base[i], j]))
    for s, d, sl, b in zip(
        graph.edge_src.tolist(),
        graph.edge_dst.tolist(),
        graph.edge_slot.tolist(),
        graph.edge_bytes.tolist(),
        strict=True,
    ):
        for j in range(degree):
            draft.edge(int(copies[s, j]), int(copies[d, j]), sl, b)
    return draft.freeze(graph.name, graph.metadata)
