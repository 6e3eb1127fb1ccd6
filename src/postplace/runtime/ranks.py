"""One program per rank from a placed step: the ops of one device, with torch.distributed send/recv
for every tensor that crosses devices (DESIGN.md section 7).

:func:`rank_plan` takes the traced step (:class:`~postplace.graph.trace_torch.Traced`) and an op-level
placement and returns a :class:`RankPlan`: one rank per device the placement uses (rank k runs the
k-th of those devices in device order), and for each rank a :class:`RankProgram`, an fx GraphModule of
the nodes placed on its device. The programs are cut out of the one-process placed step
(:func:`postplace.runtime.placed.placed_graph_module`), node for node in its order, so a rank runs the
same ops in the same order as the one-process step does, and only the copies differ:

* every :func:`~postplace.runtime.placed.transfer` of the placed step becomes a message from the
  sender's rank to the receiver's rank, posted by both at the transfer's place in the one global
  program order (the sender's send and the receiver's recv of message k come after every message
  before k on both ranks);
* a message carries the tensor an op produced (its output, or one output of several), not a view of
  it: a view that crosses devices is rebuilt on the receiver from the message, as the simulator
  charges the op's output once per receiving device; a message is sent once per (tensor, receiving
  device) and again only after the tensor was written in place on the sender (or its copy on the
  receiver);
* what the receiver's ops read is laid out as the one-process step's copy is (``tensor.to(device,
  copy=True)``: the same strides, a fresh allocation), so every op reads what it read in one process
  and the results agree bit for bit (on the CPU, with the same torch threads);
* a random op (``torch.Tag.nondeterministic_seeded``: dropout, ``bernoulli_``...) on a CPU rank is
  replayed on scratch tensors by every other CPU rank, so every rank's CPU generator draws what the one
  process's generator draws, in the same order (seed every rank alike before the first step).

:meth:`RankPlan.check` proves, before anything is launched, that both ends of every message agree on
the order and that blocking sends and receives cannot deadlock (:func:`check_order`): the plan is run
as if every send waited for its receive.

Nothing here starts a process or touches torch.distributed; :mod:`postplace.runtime.launcher` runs the
programs, one process per rank.
"""

from __future__ import annotations

import dataclasses
import hashlib
import operator
from collections.abc import Sequence

import numpy as np
import torch
import torch.fx

from postplace.errors import PostplaceError
from postplace.runtime.placed import aliased_arg, placed_graph_module, transfer, written_args

__all__ = ["Collective", "Message", "RankPlan", "RankProgram", "batch_messages", "check_order", "rank_plan"]

SEND = "postplace_send"
"""The submodule of a rank's GraphModule that posts a send: ``postplace_send(message index, value)``."""
RECV = "postplace_recv"
"""The submodule of a rank's GraphModule that posts a receive: ``postplace_recv(message index) -> tensor``."""
BATCH = "postplace_batch"
"""The submodule of a rank's GraphModule that posts several sends and receives at once (``batch_isend_irecv``):
``postplace_batch(((kind, message index, value or None), ...)) -> the received tensors``, in the batch's order."""
REDUCE = "postplace_all_reduce"
"""The submodule of a rank's GraphModule that calls a collective: ``postplace_all_reduce(index, tensor) -> tensor``."""
ALL_REDUCE = "all_reduce"
"""The kind of :class:`RankComm` that sums a tensor over every rank: ``(collective index, tensor) -> tensor``."""
REDUCE_MAX = "postplace_all_reduce_max"
"""The submodule of a rank's GraphModule that takes a maximum over ranks: ``postplace_all_reduce_max(index, t)``."""
ALL_REDUCE_MAX = "all_reduce_max"
"""The kind of :class:`RankComm` that takes the elementwise maximum of a tensor over its group's ranks
(a vocabulary-split cross-entropy's per-token maximum: :mod:`postplace.runtime.tensor`)."""
SCATTER = "postplace_reduce_scatter"
"""The submodule of a rank's GraphModule that calls a reduce-scatter: ``postplace_reduce_scatter(index, tensors)``."""
REDUCE_SCATTER = "reduce_scatter"
"""The kind of :class:`RankComm` that sums whole tensors over every rank onto their owners: ``(collective index,
every tensor of the collective) -> the rank's own sums``, in the collective's order (ZeRO-2's gradients)."""
GATHER = "postplace_all_gather"
"""The submodule of a rank's GraphModule that calls an all-gather: ``postplace_all_gather(index, tensors)``."""
ALL_GATHER = "all_gather"
"""The kind of :class:`RankComm` that gathers whole tensors each rank owns onto every rank: ``(collective index,
the rank's own tensors) -> every tensor of the collective``, in the collective's order (ZeRO-1's parameters)."""


def numel_of(shape: tuple[int, ...]) -> int:
    """The elements of a tensor of ``shape`` (1 for a scalar)."""
    return int(np.prod(shape, dtype=np.int64)) if shape else 1


@dataclasses.dataclass(frozen=True)
class Collective:
    """One collective of a step, called by every rank of its ``group`` (every rank when empty) in ``index``
    order: its kind, the fx node whose value it carries, and that value's shape and dtype. An all-gather of
    whole tensors also names each tensor's ``owners`` (the position in the group of the rank that sends it)
    and ``shapes``, in the order every rank receives them."""

    index: int
    kind: str
    value: str
    shape: tuple[int, ...]
    dtype: torch.dtype
    owners: tuple[int, ...] = ()
    shapes: tuple[tuple[int, ...], ...] = ()
    group: tuple[int, ...] = ()

    @property
    def nbytes(self) -> int:
        return numel_of(self.shape) * torch.empty((), dtype=self.dtype).element_size()

    def members(self, world: int) -> tuple[int, ...]:
        """The ranks that call it: its ``group`` (a pipeline stage's replicas), or every rank when empty."""
        return self.group or tuple(range(world))


@dataclasses.dataclass(frozen=True)
class Message:
    """One tensor sent from one rank to another in one training step.

    ``index`` is its place in the global order (every rank posts its messages in increasing index);
    ``value`` the fx node of the placed step whose tensor it carries and ``op`` that node's op in the
    OpGraph (-1: none); ``shape``/``stride``/``dtype`` the layout both ends allocate (the layout of the
    one-process step's copy of it).
    """

    index: int
    src: int
    dst: int
    value: str
    op: int
    shape: tuple[int, ...]
    stride: tuple[int, ...]
    dtype: torch.dtype

    @property
    def numel(self) -> int:
        return numel_of(self.shape)

    @property
    def nbytes(self) -> int:
        return self.numel * torch.empty((), dtype=self.dtype).element_size()


@dataclasses.dataclass(frozen=True, eq=False)
class RankProgram:
    """What one rank runs: ``gm`` called with the placeholders ``inputs`` names (indices into the
    traced step's placeholders: parameters, buffers, optimizer state, then the batch) returns the
    step's outputs ``outputs`` names (indices into the traced step's outputs; the loss is output 0).
    ``actions`` lists its sends, receives and collective calls in the order it posts them:
    ``("send" | "recv", message)`` or ``("collective", collective index)``.
    """

    rank: int
    device: int
    gm: torch.fx.GraphModule
    inputs: tuple[int, ...]
    outputs: tuple[int, ...]
    actions: tuple[tuple[str, int], ...]


@dataclasses.dataclass(frozen=True, eq=False)
class RankPlan:
    """Per-rank programs of one placed step (see the module docstring).

    Parameters
    ----------
    device_names : tuple of str
        Every logical device of the placement's machine.
    ranks : tuple of int
        The logical device of each rank: the devices the placement uses, in device order.
    messages : tuple of Message
        Every message of one step, in the global order.
    programs : tuple of RankProgram
        One per rank.
    n_persistent : int
        Placeholders before the batch (parameters, buffers, optimizer state).
    collectives : tuple of Collective
        Every collective of one step, in the order every rank calls them.
    partial_loss : bool
        Each rank returns its share of the loss (data parallelism: the launcher sums them); else one
        rank returns the whole loss.
    sharded : frozenset of int
        FSDP: the parameters (indices into the traced step's placeholders, whose first ones are the
        parameters) each rank holds 1/k of, with their same-shaped optimizer state (flattened, padded to a
        multiple of k, its slice); the launcher cuts them so and joins them back. Every parameter under
        ``fsdp``, those of the sharded units of a hybrid (``ddp:shard=U/U``), none else.
    tensor_split : tuple of (int, int, int)
        Tensor parallelism: ``(placeholder index, dimension, blocks)`` of every parameter and optimizer state
        that rank j holds part ``j mod tensor_degree`` of (:func:`postplace.runtime.tensor.tensor_shard`); the
        launcher cuts them so and joins them back.
    tensor_degree : int
        Tensor parallelism: the ranks of a group (``tp``), ranks ``r tp .. r tp + tp - 1`` replica r's.
    """

    device_names: tuple[str, ...]
    ranks: tuple[int, ...]
    messages: tuple[Message, ...]
    programs: tuple[RankProgram, ...]
    n_persistent: int
    collectives: tuple[Collective, ...] = ()
    partial_loss: bool = False
    sharded: frozenset[int] = frozenset()
    tensor_split: tuple[tuple[int, int, int], ...] = ()
    tensor_degree: int = 1

    @property
    def world_size(self) -> int:
        return len(self.ranks)

    def rank_name(self, rank: int) -> str:
        """``rank 1 (gpu0)``: a rank as error lines name it."""
        return f"rank {rank} ({self.device_names[self.ranks[rank]]})"

    def bytes_sent(self) -> dict[int, int]:
        """Bytes each rank sends in one step, by rank."""
        out = dict.fromkeys(range(self.world_size), 0)
        for m in self.messages:
            out[m.src] += m.nbytes
        return out

    def bytes_received(self) -> dict[int, int]:
        """Bytes each rank receives in one step, by rank."""
        out = dict.fromkeys(range(self.world_size), 0)
        for m in self.messages:
            out[m.dst] += m.nbytes
        return out

    def bytes_by_tensor(self) -> dict[tuple[int, int, int], int]:
        """Bytes of one step by ``(producing op, sending device, receiving device)`` (logical device
        ids), the key the simulator's transfers (:class:`postplace.sim.trace.Schedule`) sum to."""
        out: dict[tuple[int, int, int], int] = {}
        for m in self.messages:
            key = (m.op, self.ranks[m.src], self.ranks[m.dst])
            out[key] = out.get(key, 0) + m.nbytes
        return out

    def digest(self) -> str:
        """A short hash of the ranks and the messages (who sends what to whom, in which order): two
        processes that built the same plan agree on it."""
        h = hashlib.sha256(
            repr((self.device_names, self.ranks, tuple(sorted(self.sharded)), self.tensor_split)).encode()
        )
        for m in self.messages:
            h.update(repr((m.index, m.src, m.dst, m.value, m.shape, m.stride, str(m.dtype))).encode())
        for c in self.collectives:
            h.update(repr((c.index, c.kind, c.value, c.shape, str(c.dtype), c.owners, c.shapes, c.group)).encode())
        return h.hexdigest()[:16]

    def check(self) -> None:
        """:func:`check_order` on this plan's programs; one :class:`PostplaceError` line when they
        could deadlock or disagree, or a collective's group is not in rank order (torch's process groups
        order their ranks, and an all-gather's owners are positions in the group)."""
        for c in self.collectives:
            if list(c.group) != sorted(set(c.group)):
                raise PostplaceError(
                    f"collective {c.index} ({c.value}) names its group {list(c.group)} out of rank order; "
                    "build the plan's groups in rank order"
                )
        check_order(
            [p.actions for p in self.programs],
            self.messages,
            [self.rank_name(r) for r in range(self.world_size)],
            collectives=self.collectives,
        )


def check_order(
    actions: Sequence[Sequence[tuple[str, int]]],
    messages: Sequence[Message],
    names: Sequence[str] | None = None,
    *,
    collectives: Sequence[Collective] = (),
) -> None:
    """Prove that blocking sends, receives and collectives in these per-rank orders cannot deadlock.

    Every message must be sent by its ``src`` rank and received by its ``dst`` rank exactly once, and a
    collective a rank lists (``("collective", index)``) must be listed once by every rank of its group and
    by no other. Then the ranks are run as if every send waited for its matching receive (the strictest
    blocking semantics; buffered sends only make progress easier) and every collective for all its
    members: each rank advances while its next action is the send or receive whose other end is posted
    at the same time, or the collective every member has reached. If every rank finishes, the order
    cannot deadlock, and both ends of every pair of ranks agree on the order of their messages.
    (A plan whose programs list no collective, ``ddp`` over the whole world, calls them in one order
    on every rank by construction.)

    Parameters
    ----------
    actions : sequence of sequences of (str, int)
        Per rank, ``("send", message index)`` / ``("recv", message index)`` / ``("collective", index)``
        in the order posted.
    messages : sequence of Message
        By index.
    names : sequence of str, optional
        How each rank is named in the error line (default ``rank K``).
    collectives : sequence of Collective
        By index: the collectives the actions name, with their groups.

    Raises
    ------
    PostplaceError
        One line naming what the first stuck ranks wait for, or the message posted by the wrong rank.

    Examples
    --------
    >>> import torch
    >>> from postplace.runtime.ranks import Message, check_order
    >>> a = Message(0, 0, 1, "x", 0, (2,), (1,), torch.float32)
    >>> b = Message(1, 1, 0, "y", 1, (2,), (1,), torch.float32)
    >>> check_order([[("send", 0), ("recv", 1)], [("recv", 0), ("send", 1)]], [a, b])
    >>> check_order([[("recv", 1), ("send", 0)], [("recv", 0), ("send", 1)]], [a, b])  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    postplace.errors.PostplaceError: the per-rank programs can deadlock: rank 0 waits to receive message 1 (y) ...
    """
    world = len(actions)
    names = list(names) if names is not None else [f"rank {r}" for r in range(world)]
    seen: dict[tuple[str, int], int] = {}
    called: dict[int, set[int]] = {}
    for r, acts in enumerate(actions):
        for kind, k in (x for act in acts for x in _members(act)):
            if kind == "collective":
                members = collectives[k].members(world)
                if r not in members or r in called.setdefault(k, set()):
                    raise PostplaceError(
                        f"the per-rank programs are inconsistent: {names[r]} calls collective {k} "
                        f"({collectives[k].value}), whose group is ranks {list(members)}, or calls it twice; "
                        "build every rank's program from one plan"
                    )
                called[k].add(r)
                continue
            m = messages[k]
            if kind not in ("send", "recv") or (kind, k) in seen or (m.src if kind == "send" else m.dst) != r:
                owner = m.src if kind == "send" else m.dst
                raise PostplaceError(
                    f"the per-rank programs are inconsistent: {names[r]} posts {kind} of message {k} "
                    f"({m.value}), which belongs to rank {owner}'s program, or posts it twice; "
                    "build every rank's program from one plan"
                )
            seen[(kind, k)] = r
    for m in messages:
        for kind in ("send", "recv"):
            if (kind, m.index) not in seen:
                who = names[m.src] if kind == "send" else names[m.dst]
                raise PostplaceError(
                    f"the per-rank programs are inconsistent: {who} never posts the {kind} of message "
                    f"{m.index} ({m.value}); build every rank's program from one plan"
                )
    for k, who in called.items():
        missing = sorted(set(collectives[k].members(world)) - who)
        if missing:
            raise PostplaceError(
                f"the per-rank programs are inconsistent: {names[missing[0]]} never calls collective {k} "
                f"({collectives[k].value}) of its group; build every rank's program from one plan"
            )
    pos = [0] * world
    matched: set[tuple[str, int]] = set()

    def at(r: int):
        return actions[r][pos[r]] if pos[r] < len(actions[r]) else None

    def peer_of(kind: str, k: int) -> tuple[int, tuple[str, int]]:
        m = messages[k]
        return (m.dst, ("recv", k)) if kind == "send" else (m.src, ("send", k))

    progress = True
    while progress:
        progress = False
        for r in range(world):
            while (act := at(r)) is not None:
                if act[0] == "collective":
                    members = collectives[act[1]].members(world)
                    if any(at(q) != act for q in members):
                        break
                    for q in members:
                        pos[q] += 1
                    progress = True
                    continue
                for op in _members(act):  # posted now: matched when the other end is posted too
                    peer, other = peer_of(*op)
                    if op not in matched and at(peer) is not None and other in _members(at(peer)):
                        matched.update((op, other))
                if not all(op in matched for op in _members(act)):
                    break
                pos[r] += 1
                progress = True
    stuck = [r for r in range(world) if at(r) is not None]
    if stuck:
        waits = []
        for r in stuck[:2]:
            kind, k = next((op for op in _members(at(r)) if op not in matched), _members(at(r))[0])
            if kind == "collective":
                late = [q for q in collectives[k].members(world) if at(q) != (kind, k)]
                what = f"call collective {k} ({collectives[k].value}) with {names[late[0]]}"
            else:
                m = messages[k]
                what = (
                    f"send message {k} ({m.value}) to {names[m.dst]}"
                    if kind == "send"
                    else f"receive message {k} ({m.value}) from {names[m.src]}"
                )
            waits.append(f"{names[r]} waits to {what}")
        raise PostplaceError(
            f"the per-rank programs can deadlock: {', and '.join(waits)}; every rank must post its "
            "sends, receives and collectives in one global order"
        )


def _members(action) -> tuple[tuple[str, int], ...]:
    """The sends and receives a rank posts at once in ``action``: a batch's, or the action itself."""
    return tuple(action[1]) if action[0] == "batch" else (action,)


# ------------------------------------------------------------------------------ message buffers
def outgoing(message: Message, value: torch.Tensor) -> torch.Tensor:
    """The 1-d tensor a sender passes to ``send``: ``value``'s memory in the message's layout (no copy
    when ``value`` is laid out so already)."""
    if tuple(value.shape) != message.shape or value.dtype != message.dtype:
        raise PostplaceError(
            f"message {message.index} ({message.value}): the step made a {value.dtype} "
            f"{tuple(value.shape)} tensor where the plan expects {message.dtype} {message.shape}; "
            "every rank must run the step the plan was made from"
        )
    if tuple(value.stride()) != message.stride:
        value = torch.empty_strided(message.shape, message.stride, dtype=message.dtype, device=value.device).copy_(
            value
        )
    return value.as_strided((message.numel,), (1,), value.storage_offset())


def incoming(message: Message, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """``(tensor, its 1-d memory)``: a fresh tensor in the message's layout, and what ``recv`` fills."""
    t = torch.empty_strided(message.shape, message.stride, dtype=message.dtype, device=device)
    return t, t.as_strided((message.numel,), (1,), 0)


# ------------------------------------------------------------------------------ building the plan
class RankComm(torch.nn.Module):
    """The send or receive of a rank's program; :mod:`postplace.runtime.launcher` sets ``channel``."""

    def __init__(self, kind: str):
        super().__init__()
        self.kind = kind
        self.channel = None

    def forward(self, index: int, value=None):
        if self.channel is None:
            raise PostplaceError("a rank's program runs only under postplace.runtime.launcher (no channel is set)")
        if self.kind == "send":
            self.channel.send(index, value)
            return None
        if self.kind == "batch":
            return self.channel.batch(index)
        if self.kind in (ALL_REDUCE, ALL_REDUCE_MAX):
            return self.channel.all_reduce(index, value)
        if self.kind == ALL_GATHER:
            return self.channel.all_gather(index, value)
        if self.kind == REDUCE_SCATTER:
            return self.channel.reduce_scatter(index, value)
        return self.channel.recv(index)


def _val(node: torch.fx.Node):
    """The fake value of a node of the placed step (a transfer: its source's)."""
    v = node.meta.get("val")
    if v is None and node.op == "call_function" and node.target is transfer:
        return _val(node.args[0])
    return v


#: ops whose outputs are views of their input although their schema says otherwise (LSTM gates)
_UNSAFE_VIEWS = ("unsafe_split", "unsafe_split_with_sizes", "unsafe_chunk")


def _is_unsafe_view(node: torch.fx.Node) -> bool:
    packet = getattr(node.target, "overloadpacket", None)
    return node.op == "call_function" and packet is not None and packet.__name__ in _UNSAFE_VIEWS


def _is_view_op(node: torch.fx.Node) -> bool:
    schema = getattr(node.target, "_schema", None)
    if node.op != "call_function" or schema is None or not schema.returns:
        return False
    return (schema.returns[0].alias_info is not None or _is_unsafe_view(node)) and not written_args(node)


def _view_base(x: torch.fx.Node) -> torch.fx.Node | None:
    """The node ``x`` is a view of, rebuilt from it alone (a view op, or one output of a view op such
    as ``split``); None when ``x`` holds a tensor of its own."""
    if x.op != "call_function" or x.target is transfer:
        return None
    if x.target is operator.getitem:
        base = x.args[0]
        return base if isinstance(base, torch.fx.Node) and _is_view_op(base) else None
    if not _is_view_op(x) or len(x.all_input_nodes) != 1:
        return None
    return x.all_input_nodes[0]


def _copy_layout(val: torch.Tensor) -> tuple[int, ...]:
    """The strides ``val.to(device, copy=True)`` gives (the one-process step's copy)."""
    meta = torch.empty_strided(tuple(val.shape), tuple(val.stride()), dtype=val.dtype, device="meta")
    return tuple(meta.to("meta", copy=True).stride())


def rank_plan(traced, op_device, device_names: Sequence[str], device: str | torch.device = "cpu") -> RankPlan:
    """The per-rank programs of ``traced``'s step under an op-level placement (module docstring).

    Parameters
    ----------
    traced : postplace.graph.trace_torch.Traced
        The traced step.
    op_device : array of int
        Logical device id per op of ``traced.graph``.
    device_names : sequence of str
        The logical devices' names (``op_device`` indexes them).
    device : str or torch.device
        The torch device every rank's program runs on (its own; ``cpu`` for gloo processes).

    Returns
    -------
    RankPlan
        Not yet checked: call :meth:`RankPlan.check`.

    Raises
    ------
    PostplaceError
        When a value that crosses devices is not a tensor (a Python number an op returned), which a
        message cannot carry.
    """
    op_device = np.asarray(op_device, dtype=np.int64)
    torch_device = torch.device(device)
    names = tuple(device_names)
    placed, _ = placed_graph_module(traced.gm, traced.op_of_node, op_device, [torch_device] * len(names))
    nodes = list(placed.graph.nodes)
    used = sorted(
        {int(d) for d in np.unique(op_device)} | {n.meta["postplace_device"] for n in nodes if n.op != "output"}
    )
    rank_of = {d: r for r, d in enumerate(used)}
    world = len(used)
    graphs = [torch.fx.Graph() for _ in range(world)]
    env: list[dict[str, torch.fx.Node]] = [{} for _ in range(world)]
    inputs: list[list[int]] = [[] for _ in range(world)]
    actions: list[list[tuple[str, int]]] = [[] for _ in range(world)]
    consts: list[set[str]] = [set() for _ in range(world)]
    comms: list[set[str]] = [set() for _ in range(world)]
    messages: list[Message] = []
    # (root node, receiving rank) -> (the received tensor, the write count when it was sent)
    cache: dict[tuple[str, int], tuple[torch.fx.Node, int]] = {}
    root_of: dict[str, str] = {}  # storage root of every placed node (views and in-place results share it)
    piece_of: dict[str, str] = {}  # storage root of an output of unsafe_split -> the root of what it splits
    stamp: dict[str, int] = {}  # storage root -> the count of the last write into it
    part: dict[str, int] = {}  # storage root -> the count of the last write into one of its unsafe pieces
    fresh: dict[str, tuple[str, int]] = {}  # transfer node whose value is a received tensor itself -> its key
    n_ph = writes = 0

    def storage_root(n: torch.fx.Node) -> str:
        if n.target is operator.getitem and _is_unsafe_view(n.args[0]):
            return n.name  # one piece of an unsafe split: apart from the others (piece_of links its whole)
        base = aliased_arg(n) if n.op == "call_function" and n.target is not transfer else None
        return root_of.get(base.name, base.name) if base is not None else n.name

    def valid(root: torch.fx.Node, chain: list, sent: int) -> bool:
        """Whether what was sent at write count ``sent`` still holds the values ``chain`` reads."""
        if stamp.get(root_of[root.name], -1) >= sent:
            return False
        pieces = [v for v in chain if v.target is operator.getitem and _is_unsafe_view(v.args[0])]
        if not pieces:  # reads the whole tensor: a write into any unsafe piece of it counts
            return part.get(root_of[root.name], -1) < sent
        return all(stamp.get(root_of[v.name], -1) < sent for v in pieces)

    pending: list[list[torch.fx.Node]] = [[] for _ in range(world)]  # replays waiting for a node to make scratch from
    for node in nodes:
        _replay_pending(pending, graphs, torch_device)
        if node.op == "output":
            continue
        d = node.meta["postplace_device"]
        r = rank_of[d]
        g = graphs[r]
        root_of[node.name] = storage_root(node)
        if node.target is operator.getitem and _is_unsafe_view(node.args[0]):
            piece_of[root_of[node.name]] = root_of[node.args[0].all_input_nodes[0].name]
        if node.op == "call_function" and node.target is transfer:
            src = node.args[0]
            a = src.meta["postplace_device"]
            root, chain = src, []
            while (base := _view_base(root)) is not None and base.meta["postplace_device"] == a:
                chain.append(root)
                root = base
            chain.reverse()
            key = (root.name, r)
            if key in cache and valid(root, chain, cache[key][1]):
                x, is_fresh = cache[key][0], False
            else:
                val = _val(root)
                if not isinstance(val, torch.Tensor):
                    raise PostplaceError(
                        f"'{root.name}' ({type(val).__name__}) is used on {names[d]} but made on {names[a]}: "
                        "a message carries tensors only; place the ops that use it with the op that makes it"
                    )
                k = len(messages)
                messages.append(
                    Message(
                        k,
                        rank_of[a],
                        r,
                        root.name,
                        int(traced.op_of_node.get(root.name, -1)),
                        tuple(val.shape),
                        _copy_layout(val),
                        val.dtype,
                    )
                )
                graphs[rank_of[a]].call_module(SEND, (k, env[rank_of[a]][root.name]))
                actions[rank_of[a]].append(("send", k))
                x = g.call_module(RECV, (k,))
                x.meta["val"] = val
                actions[r].append(("recv", k))
                writes += 1
                cache[key] = (x, writes)
                is_fresh = True
            for view in chain:  # rebuilt on the receiver from the message
                base = x
                x = g.node_copy(view, lambda _a, base=base: base)
            if chain or not is_fresh:  # a fresh copy, as the one-process transfer makes
                x = g.call_function(transfer, (x, torch_device))
            else:
                fresh[node.name] = key
            x.meta["val"] = _val(node)
            env[r][node.name] = x
            continue
        cp = g.node_copy(node, lambda arg, r=r: env[r][arg.name])
        env[r][node.name] = cp
        if node.op == "placeholder":
            inputs[r].append(n_ph)
            n_ph += 1
        elif node.op == "get_attr":
            consts[r].add(node.target)
        elif node.op == "call_module":  # a collective of a replica's program (a pipeline stage's all-reduce)
            comms[r].add(node.target)
            actions[r].append(("collective", int(node.args[0])))
        elif node.op == "call_function" and _is_random(node):
            _replay_random(node, r, graphs, torch_device, pending)
        for j in written_args(node):  # written in place: what was sent of that storage is stale now
            writes += 1
            written = root_of[node.args[j].name]
            stamp[written] = writes
            if written in piece_of:
                part[piece_of[written]] = writes
            if written in fresh:  # the receiver wrote into the received tensor itself
                cache.pop(fresh.pop(written), None)
    _replay_pending(pending, graphs, torch_device)
    outputs: list[list[int]] = [[] for _ in range(world)]
    out_node = nodes[-1]
    flat = out_node.args[0] if isinstance(out_node.args[0], list | tuple) else [out_node.args[0]]
    for i, v in enumerate(flat):
        if isinstance(v, torch.fx.Node):
            outputs[rank_of[v.meta["postplace_device"]]].append(i)
    programs = []
    for r in range(world):
        graphs[r].output(tuple(env[r][flat[i].name] for i in outputs[r]))
        root = torch.nn.Module()
        for c in consts[r]:
            setattr(root, c, getattr(placed, c))
        root.add_module(SEND, RankComm("send"))
        root.add_module(RECV, RankComm("recv"))
        for c in comms[r]:
            root.add_module(c, RankComm(getattr(traced.gm, c).kind))
        gm = torch.fx.GraphModule(root, graphs[r])
        programs.append(RankProgram(r, used[r], gm, tuple(inputs[r]), tuple(outputs[r]), tuple(actions[r])))
    n_persistent = n_ph - len(traced.inputs)
    return RankPlan(names, tuple(used), tuple(messages), tuple(programs), n_persistent)


def _is_random(node: torch.fx.Node) -> bool:
    return torch.Tag.nondeterministic_seeded in getattr(node.target, "tags", ())


def _replay_random(node: torch.fx.Node, owner: int, graphs, torch_device: torch.device, pending) -> None:
    """On every other rank (CPU ranks: one generator per process), the same random op on scratch
    tensors, so each rank's generator advances as the one process's does.

    The scratch is made from a node already in the rank's program (``new_zeros`` of its first node), not
    from constants: a program travels to its process pickled, and unpickling a GraphModule traces its code
    again, which runs a call on constants alone at once and keeps its result, so a replay made of constants
    would vanish from the program and the generators drift apart. A rank whose program is still empty keeps
    the replay in ``pending`` until its first node (it draws nothing of its own before that)."""
    if torch_device.type != "cpu":
        return
    for r, g in enumerate(graphs):
        if r == owner:
            continue
        if pending[r] or not len(g.nodes):
            pending[r].append(node)
            continue
        _replay_on(node, g, torch_device)


def _replay_pending(pending, graphs, torch_device: torch.device) -> None:
    """The replays that waited for a rank's first node, once it has one."""
    for r, g in enumerate(graphs):
        if pending[r] and len(g.nodes):
            for node in pending[r]:
                _replay_on(node, g, torch_device)
            pending[r].clear()


def _replay_on(node: torch.fx.Node, g: torch.fx.Graph, torch_device: torch.device) -> None:
    anchor = next(iter(g.nodes))

    def scratch(arg):
        val = arg.meta.get("val")
        if not isinstance(val, torch.Tensor):
            raise PostplaceError(
                f"random op '{node.name}' reads '{arg.name}', which is not a tensor; it cannot "
                "be replayed on the other ranks"
            )
        how = {"dtype": val.dtype, "device": torch_device}
        return g.call_function(torch.ops.aten.new_zeros.default, (anchor, tuple(val.shape)), how)

    g.node_copy(node, scratch)


def batch_messages(plan: RankPlan) -> RankPlan:
    """``plan`` with each rank's runs of sends and receives that nothing between them needs posted at once,
    as one ``batch_isend_irecv`` (:data:`BATCH`) where each was a blocking call.

    A send or receive joins the batch of the one before it on its rank when the only ops between them are
    copies and views of tensors the batch receives (nothing else waits longer than it did), and, for a send,
    when the tensor it sends is made before the batch. A receive posted earlier fills a fresh tensor, read
    where it was read before. The programs compute what they computed; only when each message may travel
    changes, and :meth:`RankPlan.check` proves the batched order cannot deadlock either (a batch completes
    when the other end of each of its messages is posted).
    """
    programs = []
    for prog in plan.programs:
        gm, actions = _batched(prog)
        programs.append(dataclasses.replace(prog, gm=gm, actions=actions))
    return dataclasses.replace(plan, programs=tuple(programs))


def _batched(prog: RankProgram) -> tuple[torch.fx.GraphModule, tuple]:
    g = prog.gm.graph
    nodes = list(g.nodes)
    pos = {n: i for i, n in enumerate(nodes)}
    runs: list[list[torch.fx.Node]] = []
    received: set[torch.fx.Node] = set()  # the open run's receives and what is made of them alone (copies, views)
    for n in nodes:
        comm = n.op == "call_module" and n.target in (SEND, RECV)
        if not comm:
            passive = n.op == "call_function" and not written_args(n) and set(n.all_input_nodes) <= received
            if passive and n.all_input_nodes:
                received.add(n)  # waits for the batch instead of for its own receive: nothing else is delayed
            elif runs and runs[-1]:
                runs.append([])  # anything else between two messages keeps them apart
                received = set()
            continue
        if runs and runs[-1] and (n.target == RECV or pos[n.args[1]] < pos[runs[-1][0]]):
            runs[-1].append(n)
        else:
            runs.append([n])
            received = set()
        if n.target == RECV:
            received.add(n)
    batches = [run for run in runs if len(run) > 1]
    if not batches:
        return prog.gm, prog.actions
    first = {run[0]: run for run in batches}
    inside = {n for run in batches for n in run}
    actions = []
    for n in nodes:
        if n in first:
            actions.append(("batch", tuple(("send" if c.target == SEND else "recv", int(c.args[0])) for c in first[n])))
        elif n.op == "call_module" and n.target in (SEND, RECV) and n not in inside:
            actions.append(("send" if n.target == SEND else "recv", int(n.args[0])))
        elif n.op == "call_module" and n not in inside:
            actions.append(("collective", int(n.args[0])))
    if not hasattr(prog.gm, BATCH):
        prog.gm.add_module(BATCH, RankComm("batch"))
    for run in batches:
        ops = tuple(
            ("send", int(c.args[0]), c.args[1]) if c.target == SEND else ("recv", int(c.args[0]), None) for c in run
        )
        with g.inserting_before(run[0]):
            batch = g.call_module(BATCH, (ops,))
            received = [c for c in run if c.target == RECV]
            for k, c in enumerate(received):
                got = g.call_function(operator.getitem, (batch, k))
                got.meta = dict(c.meta)
                c.replace_all_uses_with(got)
        for c in run:
            g.erase_node(c)
    prog.gm.recompile()
    return prog.gm, tuple(actions)
