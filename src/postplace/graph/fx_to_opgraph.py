"""From a traced fx graph of one training step to an :class:`OpGraph`: folding, costs, colocation.

The rules (what is folded, what each op costs, how colocation sets form) are described in
:mod:`postplace.graph.trace_torch`, which calls :func:`build_graph`; this module applies them.
"""

from __future__ import annotations

import operator

import numpy as np
import torch

from postplace.graph.flops import op_flops, tensor_bytes
from postplace.graph.opgraph import REDUCES_ACROSS, OpGraph

__all__ = ["build_graph"]

#: aten ops that do no work but whose schema does not declare an alias (or that only drop autograd)
_VIEW_LIKE = frozenset(
    "detach alias lift_fresh _unsafe_view _reshape_alias unsafe_split unsafe_split_with_sizes unsafe_chunk".split()
)


def _is_view(node: torch.fx.Node) -> bool:
    """True for ops that do no work: getitem, detach, and aten ops whose result aliases an input
    they do not write (views)."""
    t = node.target
    if t is operator.getitem:
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
        self.base: list[int] = []  # per op: the op whose output an in-place op writes (-1: none)
        self.mb, self.module, self.template, self.acc = [], [], [], []
        self.precision: list[str] = []
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
        mb=-1,
        module=None,
        template=None,
        acc=False,
        precision="fp32",
    ) -> int:
        self.names.append(name)
        self.types.append(typ)
        self.flops.append(flops)
        self.bytes.append(nbytes)
        self.out.append(out)
        self.persist.append(persist)
        self.phase.append(phase)
        self.inplace.append(inplace)
        self.base.append(-1)
        self.seq.append(seq)
        self.param.append(param)
        self.mb.append(mb)
        self.module.append(module)
        self.template.append(template)
        self.acc.append(acc)
        self.precision.append(precision)
        return len(self.names) - 1


def build_graph(gm, pnames, bnames, state_counts, label, meta, *, root="", n_targets=0, colocation="none"):
    """The OpGraph of fx graph ``gm`` (placeholders: parameters, buffers, optimizer state, then per
    micro-batch its inputs and ``n_targets`` targets), and the map fx node name -> op index (-1: dropped).

    ``state_counts[k]``: how many optimizer state tensors parameter k has (0 when frozen); they follow
    the buffers in parameter order and become the parameter op's slots 1, 2...

    ``meta["microbatches"]`` (default 1) says how many micro-batches ``gm`` holds
    (:mod:`postplace.graph.microbatch`); ``colocation`` is ``"none"`` (a layer's micro-batches are
    colocated only within each micro-batch) or ``"module"`` (every micro-batch's copy of an op joins the
    original's set). ``root`` labels the ops the root module issues in ``OpGraph.module``."""
    n_p, n_b = len(pnames), len(bnames)
    m = int(meta.get("microbatches", 1))
    n_state = sum(state_counts)
    state_owner = [(k, 1 + j) for k, c in enumerate(state_counts) for j in range(c)]
    n_own = (sum(1 for nd in gm.graph.nodes if nd.op == "placeholder") - n_p - n_b - n_state) // m
    seq_module: dict[tuple[int, int], str] = {}
    costs: dict[str, tuple] = {}  # template node -> (flops, read, out, slot bytes, type, in place)

    def modlabel(path):
        return root if path == "" else path

    def pmodule(k):
        return modlabel(pnames[k].rpartition(".")[0]) if k is not None and 0 <= k < n_p else None

    ops = _Ops()
    where: dict[str, tuple[int, int] | None] = {}  # fx node name -> (op, slot) its value lives in
    op_of_node: dict[str, int] = {}
    edges: dict[tuple[int, int, int], float] = {}
    consts: dict[str, int] = {}
    n_call, phase = 0, "forward"
    view_seq: list[tuple[int, int]] = []  # (seq_nr, op) of forward views folded into that op
    across: list[str] = []  # reductions over a dimension other than the last (REDUCES_ACROSS)
    placeholders = 0
    ph_names = [nd.name for nd in gm.graph.nodes if nd.op == "placeholder"]
    for node in gm.graph.nodes:
        val = node.meta.get("val")
        if node.op == "placeholder":
            k = placeholders
            placeholders += 1
            nbytes = tensor_bytes(val)
            if k < n_p:
                i = ops.add(
                    f"param:{pnames[k]}",
                    "parameter",
                    "other",
                    out=nbytes,
                    persist=nbytes,  # its optimizer state is added as the state placeholders come
                    param=k,
                    module=pmodule(k),
                )
                where[node.name] = (i, 0)
            elif k < n_p + n_b:
                bname = bnames[k - n_p]
                i = ops.add(
                    f"buffer:{bname}",
                    "buffer",
                    "other",
                    out=nbytes,
                    persist=nbytes,
                    module=modlabel(bname.rpartition(".")[0]),
                )
                where[node.name] = (i, 0)
            elif k < n_p + n_b + n_state:
                owner, slot = state_owner[k - n_p - n_b]
                i = where[ph_names[owner]][0]
                ops.persist[i] += nbytes
                where[node.name] = (i, slot)
            else:
                mb, j = divmod(k - n_p - n_b - n_state, n_own)
                kind = f"input:{j}" if j < n_own - n_targets else f"target:{j - n_own + n_targets}"
                i = ops.add(
                    f"mb{mb}_{kind}" if m > 1 else kind,
                    "input",
                    "forward",
                    out=nbytes,
                    mb=mb,
                    module="(inputs)" if kind.startswith("input") else "(loss)",
                )
                where[node.name] = (i, 0)
            ops.slot_bytes[where[node.name]] = float(nbytes)
            op_of_node[node.name] = where[node.name][0]
            continue
        if node.op == "get_attr":
            if node.target not in consts:
                nbytes = tensor_bytes(val)
                consts[node.target] = ops.add(f"const:{node.target}", "constant", "other", out=nbytes, module="(loss)")
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
                mb = custom.get("microbatch", 0)
                view_seq.append(((mb, node.meta["seq_nr"]), where[node.name][0]))
            continue
        if not node.all_input_nodes and tensor_bytes(val) == 0:  # e.g. batch norm's empty reserve
            where[node.name] = None
            op_of_node[node.name] = -1
            continue
        template = custom.get("template")
        known = costs.get(template) if template is not None else None
        if known is None:  # a micro-batch's copy costs what the node it copies costs: count once
            args = torch.fx.node.map_arg(node.args, lambda n: n.meta.get("val"))
            kwargs = torch.fx.node.map_arg(node.kwargs, lambda n: n.meta.get("val"))
            read = sum(tensor_bytes(a.meta.get("val")) for a in node.all_input_nodes)
            vals = val if isinstance(val, list | tuple) else [val]
            known = (
                op_flops(node.target, args, kwargs, val),
                float(read),
                float(tensor_bytes(val)),
                [float(tensor_bytes(v)) for v in vals],
                node.target.overloadpacket.__name__,
                _is_inplace(node),
                _precision([*vals, *(a.meta.get("val") for a in node.all_input_nodes)]),
            )
            if template is not None:
                costs[template] = known
        flops, read, out, slot_out, typ, inplace, precision = known
        seq = custom.get("grad_fn") if phase == "backward" else node.meta.get("seq_nr")
        mb = custom.get("microbatch", 0 if phase in ("forward", "backward") else -1)
        if custom.get("accumulate") or phase == "update":
            module = pmodule(custom.get("param"))
        elif custom.get("loss_sum"):
            module = "(loss)"
        elif phase == "forward":
            module = modlabel(custom["module"]) if "module" in custom else "(loss)"
            if seq is not None:
                seq_module.setdefault((mb, seq), module)
        else:
            module = seq_module.get((mb, seq))
        i = ops.add(
            node.name,
            typ,
            phase,
            flops=flops,
            nbytes=read + out,
            out=out,
            inplace=inplace,
            seq=seq,
            param=custom.get("param"),
            mb=mb,
            module=module,
            template=template,
            acc=bool(custom.get("accumulate")),
            precision=precision,
        )
        where[node.name] = (i, 0)
        op_of_node[node.name] = i
        if _reduces_across(node):
            across.append(node.name)
        for s, b in enumerate(slot_out):
            ops.slot_bytes[(i, s)] = b
        for a in node.all_input_nodes:
            src = where.get(a.name)
            if src is not None and src[0] != i:
                edges[(src[0], i, src[1])] = ops.slot_bytes.get(src, 0.0)
        written = node.args[0] if ops.inplace[i] and node.args else None  # aten's in-place ops write `self`
        if isinstance(written, torch.fx.Node) and where.get(written.name) is not None:
            ops.base[i] = where[written.name][0] if where[written.name][0] != i else -1
    coloc, report = _colocate(ops, edges, view_seq, colocation if m > 1 else "none")
    modules = _fill_modules(ops.module, coloc, ops.types)
    meta = {
        **meta,
        "ops_before_folding": n_call,
        "colocation": report,
        "param_bytes": float(sum(ops.out[i] for i in range(len(ops.names)) if ops.types[i] == "parameter")),
        "buffer_bytes": float(sum(ops.persist[i] for i in range(len(ops.names)) if ops.types[i] == "buffer")),
        REDUCES_ACROSS: across,
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
        inplace_base=ops.base,
        memory_mode="live",
        name=label,
        metadata=meta,
        microbatch=ops.mb,
        module=modules,
        precision=ops.precision,
    )
    return graph, op_of_node


_REDUCING = ("mean", "sum", "var", "var_mean", "std", "std_mean", "amax", "amin", "logsumexp", "prod")


def _reduces_across(node: torch.fx.Node) -> bool:
    """``node`` reduces over a dimension other than the last of its input (and, of one with 3 or more, the first:
    the sequences, whose sum per token position, a position embedding's gradient say, each rank of sequence
    parallelism can take over its own positions), or over all of them."""
    if node.target.overloadpacket.__name__ not in _REDUCING or not node.args:
        return False
    x = node.args[0].meta.get("val") if isinstance(node.args[0], torch.fx.Node) else None
    if not isinstance(x, torch.Tensor) or x.dim() < 2:
        return False
    dims = node.kwargs.get("dim", node.args[1] if len(node.args) > 1 else None)
    if dims is None or (isinstance(dims, list | tuple) and not dims):
        return True  # every dimension
    dims = [dims] if isinstance(dims, int) else list(dims)
    kept = {x.dim() - 1} | ({0} if x.dim() >= 3 else set())
    return any(d % x.dim() not in kept for d in dims if isinstance(d, int))


def _precision(vals) -> str:
    """The precision an op computes in: the lowest-precision floating dtype among its results and inputs
    (a matmul autocast ran in bf16 reads and writes bf16; a cast to bf16 is priced as bf16 too)."""
    dtypes = {v.dtype for v in vals if isinstance(v, torch.Tensor)}
    if torch.bfloat16 in dtypes:
        return "bf16"
    return "fp16" if torch.float16 in dtypes else "fp32"


def _fill_modules(mods, coloc, types) -> list[str]:
    """Ops no rule labelled take the most common module of their colocation set, else ``(other)``."""
    mods = list(mods)
    by_set: dict[int, dict[str, int]] = {}
    for m, c in zip(mods, coloc, strict=True):
        if m is not None and c >= 0:
            cnt = by_set.setdefault(int(c), {})
            cnt[m] = cnt.get(m, 0) + 1
    for i, m in enumerate(mods):
        if m is None:
            cnt = by_set.get(int(coloc[i]))
            mods[i] = max(cnt, key=cnt.get) if cnt else "(other)"
    return mods


def _fold(node, where) -> tuple[int, int] | None:
    """Where a view's value lives: ``getitem(x, k)`` of a real op is that op's slot k; any other view
    lives where its first tensor argument lives."""
    src = node.all_input_nodes[0] if node.all_input_nodes else None
    if src is None:
        return None
    base = where.get(src.name)
    if node.target.__name__ == "getitem" and base is not None and not _is_view_node(src) and src.op == "call_function":
        return (base[0], int(node.args[1]))
    return base


def _is_view_node(node) -> bool:
    return node.op == "call_function" and _is_view(node)


def _colocate(ops: _Ops, edges, view_seq, mode: str = "none") -> tuple[np.ndarray, dict]:
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
            fwd.setdefault((ops.mb[i], ops.seq[i]), []).append(i)
    # micro-batches kept apart (mode none, m > 1): no link from one micro-batch's op to a shared op
    # (a parameter, buffer, gradient sum or update), or every micro-batch would be tied to it
    apart = mode == "none" and max(ops.mb, default=0) > 0
    for seq, i in view_seq:  # a view's backward (e.g. expand -> sum) goes where the view's value lives
        if apart and ops.mb[i] < 0:
            continue
        if ops.types[i] != "input" and i not in fwd.get(seq, []):
            fwd.setdefault(seq, []).append(i)
    succ: dict[int, list[int]] = {}
    for s, d, _sl in sorted(edges):
        succ.setdefault(s, []).append(d)
    param_op = {ops.param[i]: i for i in range(n) if ops.types[i] == "parameter"}
    direct, free = 0, []
    bwd = [i for i in range(n) if ops.phase[i] == "backward" and not ops.acc[i]]  # sums have no partner
    linked = set()
    for i in bwd:
        partners = fwd.get((ops.mb[i], ops.seq[i])) if ops.seq[i] is not None else None
        if partners:
            direct += 1
            linked.add(i)
            for j in partners:
                union(i, j)
        else:
            free.append(i)
    inherited = 0
    for i in reversed(free):  # consumers come later in program order: resolve them first
        heir = next(
            (
                d
                for d in succ.get(i, [])
                if (d in linked or ops.phase[d] == "update" or ops.acc[d]) and not (apart and ops.mb[d] != ops.mb[i])
            ),
            None,
        )
        if heir is not None:
            union(i, heir)
            linked.add(i)
            inherited += 1
    # written: the base of an in-place op, or read by a batch norm (aten's batch norm updates the running
    # statistics it is given without an in-place op of its own)
    written = {b for b in ops.base if b >= 0}
    written |= {s for s, d, _sl in edges if ops.types[s] == "buffer" and "batch_norm" in ops.types[d]}
    for i in range(n):
        if (ops.phase[i] == "update" or ops.acc[i]) and ops.param[i] in param_op:
            union(i, param_op[ops.param[i]])
        # a buffer the step writes (running statistics) stays with micro-batch 0's users (all, in module mode;
        # see trace_torch); one it only reads (rotary tables, a causal mask) is sent where it is read
        if ops.types[i] == "buffer" and i in written:
            for d in succ.get(i, []):
                if ops.mb[d] <= 0 or mode == "module":
                    union(i, d)
    if mode == "module":  # every micro-batch's copy of an op joins the original's set
        first: dict[str, int] = {}
        for i in range(n):
            t = ops.template[i]
            if t is not None and ops.types[i] != "input":
                union(i, first.setdefault(t, i))
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
        "update_ops_with_parameter": sum(1 for i in range(n) if ops.phase[i] == "update" and ops.param[i] in param_op),
    }
    return coloc, report
