"""Run a placement for real: the traced training step rewritten so each op runs on its device.

:func:`apply` takes the fx graph of the joint forward + backward + update step that the search placed
(:class:`~postplace.graph.trace_torch.Traced`) and an op-level placement, and builds a new fx
GraphModule (:func:`placed_graph_module`) in which

* every node runs on the device of the op it belongs to (a folded view runs where the op it was folded
  into runs; a node the tracer dropped, such as batch norm's empty reserve, runs where its first
  consumer runs); factory calls (``empty``, ``arange``...) get their ``device=`` rewritten;
* every use of a value on another device goes through an explicit :func:`transfer` node (a copy), made
  once per (value, destination device) and reused by later consumers there, as the simulator assumes;
  a value written in place after it was sent is sent again to the next consumer that needs it;
* an op that writes in place into a tensor of another device writes into its copy; where the program
  reads that tensor again under another name (a view written in place, then its base read), or the
  tensor is state kept across steps (a parameter updated away from its parameter op), the result is
  copied back to where the tensor lives (``meta["postplace_write_back"]``), so every later
  reader sees the write;
* parameters, buffers and optimizer state live on the device of their parameter / buffer op and are
  updated in place by the step's own update ops, so the optimizer state persists across steps.

The result, :class:`PlacedStep`, is a callable that runs one training step and returns the loss.
Logical device names map to torch devices through ``device_map`` (default ``cpu -> cpu``,
``gpuK -> cuda:K``); ``device_map="cpu"`` maps every device to the CPU, which runs any placement on a
CPU-only machine with all the transfers still in place (as copies), for checking.

:meth:`PlacedStep.module_report` says which ``nn.Module`` ran where, per phase (forward, backward,
update), which is what a user reads; :meth:`PlacedStep.run_checked` runs a step under
:class:`~postplace.runtime.check.LogicalDeviceCheck`, which fails if any op reads a tensor that lives
on another logical device.
"""

from __future__ import annotations

import dataclasses
import operator
import time
from collections import Counter, defaultdict
from collections.abc import Mapping, Sequence

import numpy as np
import torch
import torch.fx

from postplace.errors import PostplaceError

__all__ = ["PlacedStep", "apply", "default_device_map", "placed_graph_module", "resolve_device_map", "transfer"]

_PHASES = ("forward", "backward", "update")


def transfer(value, device):
    """The explicit transfer node of a placed graph: a copy of ``value`` on ``device`` (tensors in
    lists and tuples too); what is not a tensor passes through."""
    if isinstance(value, torch.Tensor):
        return value.to(device, copy=True)
    if isinstance(value, list | tuple):
        return type(value)(transfer(v, device) for v in value)
    return value


def default_device_map(names: Sequence[str]) -> dict[str, str]:
    """The default torch device of each logical device: ``cpu`` -> ``cpu``, ``gpuK`` -> ``cuda:K``.

    Parameters
    ----------
    names : sequence of str
        Logical device names (a cluster's ``device_names``).

    Returns
    -------
    dict of str to str
        Logical name -> torch device string.

    Raises
    ------
    PostplaceError
        For a name with no default (anything else must be given explicitly).

    Examples
    --------
    >>> from postplace.runtime import default_device_map
    >>> default_device_map(["cpu", "gpu0", "gpu1"])
    {'cpu': 'cpu', 'gpu0': 'cuda:0', 'gpu1': 'cuda:1'}
    """
    out = {}
    for n in names:
        if n == "cpu" or n.startswith("cpu"):
            out[n] = "cpu"
        elif n.startswith("gpu") and n[3:].isdigit():
            out[n] = f"cuda:{int(n[3:])}"
        else:
            raise PostplaceError(f"device '{n}' has no default torch device; give a device map such as {n}=cuda:0")
    return out


def resolve_device_map(names: Sequence[str], device_map: str | Mapping[str, str] | None) -> list[torch.device]:
    """One torch device per logical device, from a device map over the defaults.

    Parameters
    ----------
    names : sequence of str
        Logical device names.
    device_map : str, mapping or None
        None: :func:`default_device_map`; a string: every logical device there (``"cpu"``); a
        mapping: those entries over the defaults.

    Returns
    -------
    list of torch.device
        In the order of ``names``.

    Raises
    ------
    PostplaceError
        For a mapping that names an unknown logical device, a value that is not a torch device, or a
        name with no default.

    Examples
    --------
    >>> from postplace.runtime import resolve_device_map
    >>> resolve_device_map(["cpu", "gpu0"], "cpu")
    [device(type='cpu'), device(type='cpu')]
    >>> resolve_device_map(["cpu", "gpu0"], {"gpu0": "cuda:1"})
    [device(type='cpu'), device(type='cuda', index=1)]
    """
    if isinstance(device_map, str):
        chosen = {n: device_map for n in names}
    else:
        chosen = {}
        given = dict(device_map or {})
        unknown = sorted(set(given) - set(names))
        if unknown:
            raise PostplaceError(f"device map names '{unknown[0]}', which is not a device here ({', '.join(names)})")
        for n in names:
            chosen[n] = given[n] if n in given else default_device_map([n])[n]
    out = []
    for n in names:
        try:
            out.append(torch.device(chosen[n]))
        except (RuntimeError, TypeError) as exc:
            raise PostplaceError(f"device map: '{chosen[n]}' for {n} is not a torch device ({exc})") from None
    return out


# ------------------------------------------------------------------------------ the placed graph
#: aten ops that write arguments their schema does not mark as written (batch norm's running statistics)
_UNDECLARED_WRITES = {"native_batch_norm": (3, 4)}


def written_args(node) -> list[int]:
    """Indices of the (tensor) arguments a node writes in place."""
    schema = getattr(node.target, "_schema", None)
    if schema is None or node.op != "call_function":
        return []
    extra = _UNDECLARED_WRITES.get(node.target.overloadpacket.__name__, ())
    return [
        k
        for k, a in enumerate(schema.arguments)
        if ((a.alias_info is not None and a.alias_info.is_write) or k in extra)
        and k < len(node.args)
        and isinstance(node.args[k], torch.fx.Node)
    ]


def aliased_arg(node) -> torch.fx.Node | None:
    """The argument whose storage a node's result shares (a view, ``getitem``, or an in-place op that
    returns what it wrote), or None for a fresh result."""
    if node.op != "call_function":
        return None
    if node.target is operator.getitem:
        return node.all_input_nodes[0] if node.all_input_nodes else None
    schema = getattr(node.target, "_schema", None)
    if schema is None or not schema.returns or schema.returns[0].alias_info is None:
        return None
    sets = schema.returns[0].alias_info.before_set
    for k, a in enumerate(schema.arguments):
        if a.alias_info is not None and a.alias_info.before_set & sets and k < len(node.args):
            if isinstance(node.args[k], torch.fx.Node):
                return node.args[k]
    return node.all_input_nodes[0] if node.all_input_nodes else None


def _of_module(n: torch.fx.Node) -> bool:
    """A getitem of a collective's results."""
    return n.target is operator.getitem and n.args[0].op == "call_module"


def node_devices(gm: torch.fx.GraphModule, op_of_node: Mapping[str, int], op_device: np.ndarray) -> dict[str, int]:
    """Logical device of every fx node (see the module docstring); the output node is left out."""
    dev: dict[str, int] = {}
    nodes = [n for n in gm.graph.nodes if n.op != "output"]
    for n in nodes:
        op = op_of_node.get(n.name, -1)
        if op >= 0:
            dev[n.name] = int(op_device[op])

    def by_users(n) -> None:
        users = [u for u in n.users if u.name in dev]
        if n.name not in dev and users:
            dev[n.name] = dev[users[0].name]

    for n in reversed(nodes):  # a dropped node goes where its first consumer goes
        by_users(n)
    # a replica's collective nodes no placed op reads (ZeRO-1: a bucket whose sums no update of this replica
    # reads, a gathered parameter copied into this replica's own) go with what they read, then with that
    for n in nodes:
        placed_input = [a for a in n.all_input_nodes if a.name in dev]
        if n.name not in dev and placed_input and (n.op in ("call_module", "call_method") or _of_module(n)):
            dev[n.name] = dev[placed_input[0].name]
    for n in reversed(nodes):
        by_users(n)
    for n in nodes:
        if n.name not in dev:
            dev[n.name] = int(op_device[0]) if len(op_device) else 0
    return dev


def placed_graph_module(
    gm: torch.fx.GraphModule,
    op_of_node: Mapping[str, int],
    op_device: np.ndarray,
    torch_devices: Sequence[torch.device],
) -> tuple[torch.fx.GraphModule, dict]:
    """A copy of ``gm`` with every node on its device and a :func:`transfer` on every crossing edge.

    Every node of the result carries ``meta["postplace_device"]`` (its logical device id); a transfer
    node also carries ``meta["postplace_transfer"] = (source node name, src device, dst device)``.
    Returns the module and a summary (number of transfer nodes, their bytes, write-backs).
    """
    dev = node_devices(gm, op_of_node, op_device)
    g = torch.fx.Graph()
    new: dict[str, torch.fx.Node] = {}
    sent: dict[tuple[str, int], torch.fx.Node] = {}
    root_of: dict[str, str] = {}  # node -> the node whose storage its value shares (views, in-place)
    by_root: dict[str, set[str]] = defaultdict(set)
    n_transfers, transfer_bytes, write_backs = 0, 0.0, 0
    order = {n.name: (k, n) for k, n in enumerate(gm.graph.nodes)}

    def fetch(src: torch.fx.Node, d: int) -> torch.fx.Node:
        nonlocal n_transfers, transfer_bytes
        if dev[src.name] == d:
            return new[src.name]
        key = (src.name, d)
        if key not in sent:
            t = g.call_function(transfer, (new[src.name], torch_devices[d]))
            t.meta["postplace_device"] = d
            t.meta["postplace_transfer"] = (src.name, dev[src.name], d)
            t.meta["val"] = src.meta.get("val")
            sent[key] = t
            n_transfers += 1
            transfer_bytes += _nbytes(src.meta.get("val"))
        return sent[key]

    def send(value: torch.fx.Node, src: int, dst: int, label: str) -> torch.fx.Node:
        """An uncached transfer of a node of the new graph (a written copy going home)."""
        nonlocal n_transfers, transfer_bytes
        t = g.call_function(transfer, (value, torch_devices[dst]))
        t.meta["postplace_device"] = dst
        t.meta["postplace_transfer"] = (label, src, dst)
        n_transfers += 1
        transfer_bytes += _nbytes(order[label][1].meta.get("val"))
        return t

    def write_back(value: torch.fx.Node, y: torch.fx.Node, aliases) -> None:
        """Copy ``value`` (on another device) into ``y``'s storage where ``y`` lives."""
        nonlocal write_backs
        dy = dev[y.name]
        back = g.call_function(torch.ops.aten.copy_.default, (new[y.name], value))
        back.meta["postplace_device"] = dy
        back.meta["postplace_write_back"] = y.name
        for alias in aliases:  # copies of the storage on other devices are stale again
            for dd in range(len(torch_devices)):
                if dd != dy:
                    sent.pop((alias, dd), None)
        write_backs += 1

    def propagate(x: torch.fx.Node, aliases) -> None:
        """``x``'s value on its device was just written: carry the write along what it aliases, across
        devices where a write went to a copy (see the module docstring)."""
        while (y := aliased_arg(x)) is not None:
            if dev[y.name] != dev[x.name]:
                if not written_args(x):
                    return  # a view of a copy: its original is not reachable from here
                write_back(fetch(x, dev[y.name]), y, aliases)
            x = y

    consts: dict[str, int] = {}  # constant attribute -> logical device
    for node in gm.graph.nodes:
        if node.op == "output":
            g.output(torch.fx.node.map_arg(node.args[0], lambda a: new[a.name]))
            continue
        d = dev[node.name]
        if node.op == "get_attr":
            consts[node.target] = d
        cp = g.node_copy(node, lambda a, d=d: fetch(a, d))
        if node.op == "call_function" and "device" in cp.kwargs:
            cp.kwargs = {**cp.kwargs, "device": torch_devices[d]}
        cp.meta["postplace_device"] = d
        new[node.name] = cp
        # storage roots: a view or an in-place result shares its input's storage
        base = aliased_arg(node)
        root = root_of.get(base.name, base.name) if base is not None else node.name
        root_of[node.name] = root
        by_root[root].add(node.name)
        for k in written_args(node):
            y = node.args[k]
            yroot = root_of.get(y.name, y.name)
            for alias in by_root[yroot]:  # written in place: copies sent before are stale now
                for dd in range(len(torch_devices)):
                    sent.pop((alias, dd), None)
            state = order[yroot][1].op in ("placeholder", "get_attr")  # read again by the next step
            if state or _read_later(node, by_root[yroot], order):
                if dev[y.name] != d:  # the op wrote into its copy of y
                    write_back(send(cp.args[k], d, dev[y.name], y.name), y, by_root[yroot])
                propagate(y, by_root[yroot])
    root = torch.nn.Module()
    for name, d in consts.items():
        value = getattr(gm, name)
        setattr(root, name, value.to(torch_devices[d], copy=True) if isinstance(value, torch.Tensor) else value)
    for target in {n.target for n in g.nodes if n.op == "call_module"}:  # a replica's collectives
        root.add_module(target, getattr(gm, target))
    out = torch.fx.GraphModule(root, g)
    return out, {"transfers": n_transfers, "transfer_bytes": transfer_bytes, "write_backs": write_backs}


def _read_later(node, aliases, order) -> bool:
    """Whether a node after ``node`` reads one of ``aliases`` (names sharing the written storage)."""
    here = order[node.name][0]
    return any(order[u.name][0] > here for a in aliases for u in order[a][1].users)


def _nbytes(val) -> float:
    if isinstance(val, torch.Tensor):
        return float(val.numel() * val.element_size())
    if isinstance(val, list | tuple):
        return float(sum(_nbytes(v) for v in val))
    return 0.0


# ------------------------------------------------------------------------------ the step
@dataclasses.dataclass(eq=False)
class PlacedStep:
    """One placed training step with its own parameters, buffers and optimizer state (see module doc).

    Call it (``step()`` or ``step(*new_inputs)``) to run one step: it returns the loss tensor (on the
    device of the loss op). A step traced as m micro-batches takes the full batch (inputs, then
    targets) and cuts it into micro-batches itself. ``parameters()`` / ``buffers()`` give the current
    values by name. :func:`apply` (or :func:`postplace.apply`) builds it; its fields are not passed by hand.

    Parameters
    ----------
    traced : postplace.graph.trace_torch.Traced
        The traced step it runs.
    gm : torch.fx.GraphModule
        The placed graph module (:func:`placed_graph_module`).
    op_device : numpy.ndarray
        ``int64[num_ops]``: each op's logical device id.
    device_names : tuple of str
        The logical devices.
    torch_devices : tuple of torch.device
        The torch device of each logical device.
    args : list
        Placeholder values: parameters, buffers, optimizer state (inputs appended per call).
    n_persistent : int
        How many of ``args`` persist across steps.
    input_devices : tuple of torch.device
        Where each step input is copied to.
    summary : dict
        What the placing did (transfers, write-backs, ops per device).

    Raises
    ------
    PostplaceError
        When called with another number of inputs than the step was traced with.
    """

    traced: object
    gm: torch.fx.GraphModule
    op_device: np.ndarray
    device_names: tuple[str, ...]
    torch_devices: tuple[torch.device, ...]
    args: list  #: placeholder values: parameters, buffers, optimizer state (inputs appended per call)
    n_persistent: int
    input_devices: tuple[torch.device, ...]
    summary: dict

    def __call__(self, *inputs):
        xs = self.traced.split_batch(inputs)
        if len(xs) != len(self.input_devices):
            raise PostplaceError(f"the placed step takes {len(self.input_devices)} inputs, got {len(xs)}")
        batch = [x.to(d, copy=True) for x, d in zip(xs, self.input_devices, strict=True)]
        with torch.no_grad():
            return _unwrap(self.gm(*self.args[: self.n_persistent], *batch))

    # ---------------------------------------------------------------------- state
    def parameters(self) -> dict[str, torch.Tensor]:
        """The current parameters by name, on their devices.

        Returns
        -------
        dict of str to torch.Tensor
        """
        names = [n for n, _ in self.traced.model.named_parameters()]
        return dict(zip(names, self.args[: len(names)], strict=True))

    def buffers(self) -> dict[str, torch.Tensor]:
        """The current buffers (e.g. batch norm's running statistics) by name, on their devices.

        Returns
        -------
        dict of str to torch.Tensor
        """
        p = len(list(self.traced.model.parameters()))
        names = [n for n, _ in self.traced.model.named_buffers()]
        return dict(zip(names, self.args[p : p + len(names)], strict=True))

    def copy_to_model(self, model: torch.nn.Module | None = None) -> None:
        """Write the trained parameters and buffers back into ``model`` (default: the traced one).

        Parameters
        ----------
        model : torch.nn.Module, optional
            A module with the traced one's parameter and buffer names.
        """
        model = model or self.traced.model
        with torch.no_grad():
            for name, t in {**self.parameters(), **self.buffers()}.items():
                target = _get(model, name)
                target.copy_(t.to(target.device))

    def synchronize(self) -> None:
        """Wait for every CUDA device this step uses (CPU ops are synchronous)."""
        for d in {self.torch_devices[k] for k in np.unique(self.op_device)}:
            if d.type == "cuda":
                torch.cuda.synchronize(d)

    # ---------------------------------------------------------------------- checking
    def run_checked(self, *inputs):
        """Run one step node by node under :class:`~postplace.runtime.check.LogicalDeviceCheck`.

        Parameters
        ----------
        *inputs : torch.Tensor
            As for a call of the step (none: the traced batch).

        Returns
        -------
        tuple
            ``(loss, violations)``: the loss and every op that read a tensor of another logical device
            (a list of str; empty when the placement's transfers are complete).
        """
        from postplace.runtime.check import LogicalDeviceCheck, run_with_check

        xs = self.traced.split_batch(inputs)
        batch = [x.to(d, copy=True) for x, d in zip(xs, self.input_devices, strict=True)]
        with torch.no_grad():
            check = LogicalDeviceCheck()
            loss = run_with_check(self.gm, self.args[: self.n_persistent] + batch, check)
        return _unwrap(loss), check.violations

    # ---------------------------------------------------------------------- reporting
    def module_report(self) -> list[dict]:
        """Where each module ran, per phase: ``[{module, phase, devices: {name: op count}}]``.

        Returns
        -------
        list of dict
        """
        rows = module_placement(self.traced, self.op_device, self.device_names)
        return rows

    def format_module_report(self, depth: int | None = None) -> str:
        """:meth:`module_report` as text: one line per module, its device per phase.

        Parameters
        ----------
        depth : int, optional
            Cut module paths to their first ``depth`` names, counting submodules with them.

        Returns
        -------
        str
        """
        return format_module_report(self.module_report(), depth)


def _unwrap(out):
    return out[0] if isinstance(out, list | tuple) and len(out) == 1 else out


def _get(model, name):
    *path, leaf = name.split(".")
    mod = model.get_submodule(".".join(path)) if path else model
    return getattr(mod, leaf)


def apply(
    model: torch.nn.Module,
    graph,
    placement,
    devices=None,
    *,
    device_map: str | Mapping[str, str] | None = None,
) -> PlacedStep:
    """A training-step callable that runs ``graph``'s traced step under ``placement``.

    Parameters
    ----------
    model : torch.nn.Module
        The model the step was traced from; its current parameters and buffers are copied to their
        devices (the model itself is not changed; see :meth:`PlacedStep.copy_to_model`).
    graph : postplace.graph.trace_torch.Traced
        The traced step (from ``trace(model, inputs, loss_fn)``).
    placement : array of int or dict
        Op-level device ids ``int[num_ops]``, or ``{op name: device name}``.
    devices : Cluster or list of str, optional
        The logical device names; default: the names in ``placement`` when it is a mapping, else
        ``cpu, gpu0, gpu1...``.
    device_map : str or mapping, optional
        Logical name -> torch device (see :func:`resolve_device_map`); ``"cpu"`` puts every device on
        the CPU.

    Returns
    -------
    PlacedStep

    Raises
    ------
    PostplaceError
        When ``graph`` is not a traced step, the placement does not match it (length, unknown ops or
        devices, an op without a device), the device map is bad, the model's parameters are not the
        traced ones (or are on the meta device), or the placement needs CUDA devices this machine lacks.

    Examples
    --------
    A sketch (:func:`postplace.apply` has a runnable example)::

        traced = trace(model, inputs, loss_fn)
        step = apply(model, traced, placement, cluster, device_map="cpu")
        for _ in range(10):
            loss = step()
    """
    from postplace.graph.trace_torch import Traced

    if not isinstance(graph, Traced):
        raise PostplaceError(
            f"apply needs the traced step (postplace.graph.trace_torch.trace(...)), got a {type(graph).__name__}; "
            "a graph file has no code to run"
        )
    traced = graph
    names = device_names_of(devices, placement, traced.graph.num_ops)
    op_device = op_devices(traced.graph, placement, names)
    tdev = resolve_device_map(names, device_map)
    _check_runnable(model, names, tdev, op_device)
    pnames = [n for n, _ in traced.model.named_parameters()]
    if [n for n, _ in model.named_parameters()] != pnames:
        raise PostplaceError("apply: the model's parameters are not the ones the step was traced with")
    gm, summary = placed_graph_module(traced.gm, traced.op_of_node, op_device, tdev)
    dev = node_devices(traced.gm, traced.op_of_node, op_device)
    ph = [n.name for n in traced.gm.graph.nodes if n.op == "placeholder"]
    params = [p.detach() for p in model.parameters()]
    bufs = [b.detach() for b in model.buffers()]
    args = []
    for k, t in enumerate(params + bufs):
        args.append(t.to(tdev[dev[ph[k]]], copy=True))
    for i, p in enumerate(params):
        for t in traced.optimizer.initial_state(i, p, device="meta"):
            args.append(torch.zeros_like(t, device=tdev[dev[ph[len(args)]]]))
    n_persist = len(args)
    in_dev = tuple(tdev[dev[ph[k]]] for k in range(n_persist, len(ph)))
    summary = {**summary, "ops_per_device": dict(Counter(names[d] for d in op_device))}
    return PlacedStep(traced, gm, op_device, tuple(names), tuple(tdev), args, n_persist, in_dev, summary)


def _check_runnable(model, names, tdev, op_device) -> None:
    """One line, before anything is copied, for a step this machine cannot run."""
    if any(p.is_meta for p in model.parameters()):
        raise PostplaceError(
            "apply: the model's parameters are on the meta device (a model traced without "
            "weights); build it with real weights to run the step"
        )
    used = sorted({int(d) for d in np.unique(op_device)})
    cuda = [names[d] for d in used if tdev[d].type == "cuda"]
    if cuda and not torch.cuda.is_available():
        raise PostplaceError(
            f"apply: the placement puts ops on {', '.join(cuda)} (cuda), and this machine has "
            "no CUDA; to run every device on the CPU (for checking) pass device_map='cpu' "
            "(on the command line: --map-all-to cpu), or run it where the GPUs are"
        )
    count = torch.cuda.device_count() if cuda else 0
    missing = [f"{names[d]} -> {tdev[d]}" for d in used if tdev[d].type == "cuda" and (tdev[d].index or 0) >= count]
    if missing:
        raise PostplaceError(
            f"apply: {missing[0]}, but this machine has {count} CUDA device(s); "
            "give a device_map onto the devices it has"
        )


def device_names_of(devices, placement, n_ops) -> list[str]:
    """The logical device names a placement refers to: the cluster's or the given list's, else those a
    mapping names (cpu first) or ``cpu, gpu0...`` for an array of ids."""
    if devices is None:
        if isinstance(placement, Mapping):
            found = sorted(set(placement.values()), key=lambda s: (s != "cpu", s))
            return found
        k = int(np.max(placement)) + 1 if len(placement) else 1
        return ["cpu"] + [f"gpu{i}" for i in range(k - 1)]
    if hasattr(devices, "device_names"):
        return list(devices.device_names)
    return [str(d) for d in devices]


def op_devices(graph, placement, names) -> np.ndarray:
    """Each op's device id in ``names`` from a mapping (op name -> device) or an array of ids."""
    if isinstance(placement, Mapping):
        idx = {n: i for i, n in enumerate(names)}
        dev = np.full(graph.num_ops, -1, dtype=np.int64)
        for op, d in placement.items():
            if op not in graph._index:
                raise PostplaceError(f"placement: op '{op}' is not in graph '{graph.name}'")
            if d not in idx:
                raise PostplaceError(f"placement: op '{op}' is on '{d}', which is not a device ({', '.join(names)})")
            dev[graph.index(op)] = idx[d]
        if np.any(dev < 0):
            i = int(np.flatnonzero(dev < 0)[0])
            raise PostplaceError(f"placement: op '{graph.names[i]}' has no device; give every op a device")
        return dev
    dev = np.asarray(placement, dtype=np.int64).reshape(-1)
    if dev.shape[0] != graph.num_ops:
        raise PostplaceError(f"placement has {dev.shape[0]} entries for {graph.num_ops} ops; give op-level ids")
    if np.any((dev < 0) | (dev >= len(names))):
        raise PostplaceError(f"placement has device ids outside 0..{len(names) - 1}")
    return dev


# ------------------------------------------------------------------------------ module report
def op_modules(traced) -> list[str]:
    """The ``nn.Module`` path each op belongs to: forward ops by the module that issued them, backward
    ops by the forward op whose autograd node made them, update ops and parameters by the parameter's
    module; ``(loss)`` for the loss function, ``(inputs)``, and ``(other)`` where nothing links an op."""
    g = traced.graph
    if any(g.module):  # recorded by the tracer (OpGraph.module), by the same rules
        return list(g.module)
    mods: list[str | None] = [None] * g.num_ops
    seq_module: dict[int, str] = {}
    root = type(traced.model).__name__
    pnames = [n for n, _ in traced.model.named_parameters()]

    def label(path):
        return root if path == "" else path

    for node in traced.gm.graph.nodes:
        op = traced.op_of_node.get(node.name, -1)
        custom = node.meta.get("custom") or {}
        if op < 0 or mods[op] is not None:
            continue
        if custom.get("phase") == "forward" and node.op == "call_function":
            m = label(custom["module"]) if "module" in custom else "(loss)"
            mods[op] = m
            if node.meta.get("seq_nr") is not None:
                seq_module.setdefault(node.meta["seq_nr"], m)
        elif custom.get("phase") == "backward" and custom.get("grad_fn") in seq_module:
            mods[op] = seq_module[custom["grad_fn"]]
        elif custom.get("phase") == "update" and custom.get("param") is not None:
            mods[op] = label(pnames[custom["param"]].rpartition(".")[0])
    for i, (name, typ) in enumerate(zip(g.names, g.op_types, strict=True)):
        if mods[i] is None:
            if typ in ("parameter", "buffer"):
                mods[i] = label(name.split(":", 1)[1].rpartition(".")[0])
            elif typ == "input":
                mods[i] = "(inputs)"
            elif typ == "constant":
                mods[i] = "(loss)"
    for members in g.colocation_sets:  # unlinked ops take the module of their colocation set
        known = Counter(mods[i] for i in members if mods[i] is not None)
        if known:
            fill = known.most_common(1)[0][0]
            for i in members:
                if mods[i] is None:
                    mods[i] = fill
    return [m or "(other)" for m in mods]


def module_placement(traced, op_device: np.ndarray, device_names: Sequence[str]) -> list[dict]:
    g = traced.graph
    mods = op_modules(traced)
    from postplace.graph.opgraph import PHASES

    rows: dict[tuple[str, str], Counter] = {}
    order: dict[str, int] = {}
    for i in range(g.num_ops):
        phase = PHASES[g.phase[i]]
        if phase == "other":
            phase = "state" if g.op_types[i] in ("parameter", "buffer") else "forward"
        order.setdefault(mods[i], len(order))
        rows.setdefault((mods[i], phase), Counter())[device_names[op_device[i]]] += 1
    keys = sorted(rows, key=lambda k: (order[k[0]], ("state", *_PHASES).index(k[1])))
    return [{"module": m, "phase": p, "devices": dict(rows[(m, p)])} for m, p in keys]


def format_module_report(rows: list[dict], depth: int | None = None) -> str:
    """One line per module: its device per phase (``gpu0`` or ``cpu 3 / gpu0 5`` when split)."""
    merged: dict[str, dict[str, Counter]] = {}
    for r in rows:
        m = r["module"]
        if depth is not None and not m.startswith("("):
            m = ".".join(m.split(".")[:depth])
        merged.setdefault(m, {}).setdefault(r["phase"], Counter()).update(r["devices"])
    cols = ("state", *_PHASES)
    width = max([len(m) for m in merged] + [6])
    lines = [f"{'module':{width}}  " + "  ".join(f"{c:18}" for c in cols)]
    for m, by in merged.items():
        cells = []
        for c in cols:
            cnt = by.get(c)
            if not cnt:
                cells.append(f"{'-':18}")
            elif len(cnt) == 1:
                cells.append(f"{next(iter(cnt)):18}")
            else:
                cells.append(f"{' / '.join(f'{d} {k}' for d, k in sorted(cnt.items())):18}")
        lines.append(f"{m:{width}}  " + "  ".join(cells))
    return "\n".join(lines)


def time_steps(step: PlacedStep, steps: int, *, inputs=(), deadline: float | None = None) -> list[float]:
    """Seconds of each of ``steps`` steps (synchronised); stops early past ``deadline``
    (``time.perf_counter()`` value)."""
    out = []
    for _ in range(steps):
        t0 = time.perf_counter()
        loss = step(*inputs)
        step.synchronize()
        float(loss)
        out.append(time.perf_counter() - t0)
        if deadline is not None and time.perf_counter() > deadline:
            break
    return out
