"""The logical-device check: every tensor is tagged with the logical device it lives on, and an op that
reads a tensor of another logical device without a transfer is recorded as a violation.

It works even when every logical device is the CPU: tags belong to storages (a view or an in-place
result shares its input's storage, so it keeps the input's tag), not to torch devices. The check is a
``TorchDispatchMode`` that sees every aten call, so it does not trust the placed graph's own
bookkeeping: a missing :func:`~postplace.runtime.placed.transfer` shows up as an aten call whose
argument carries another tag.

:func:`run_with_check` runs a placed GraphModule node by node, telling the check which logical device
each node runs on (``node.meta["postplace_device"]``); transfer nodes are the only ones allowed to read
another device, and their result is tagged with the destination.
"""

from __future__ import annotations

import torch
import torch.fx
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

__all__ = ["LogicalDeviceCheck", "run_with_check"]


def _key(t: torch.Tensor):
    if t.numel() == 0 or t.device.type == "meta":
        return None
    return (t.device.type, t.device.index, t.untyped_storage().data_ptr())


class LogicalDeviceCheck(TorchDispatchMode):
    """Storage -> logical device tags; ``current`` is the device of the op being run (None: no check).

    A ``TorchDispatchMode`` that takes no arguments; :func:`run_with_check` drives it (see
    :meth:`postplace.runtime.PlacedStep.run_checked`).

    Attributes
    ----------
    tags : dict
        Storage key -> the logical device id it lives on.
    current : int or None
        The logical device of the node being run (None: no check).
    node : str
        The name of the node being run.
    violations : list of str
        Every aten call that read a tensor of another logical device (or an untagged one).
    """

    def __init__(self):
        super().__init__()
        self.tags: dict = {}
        self.current: int | None = None
        self.node: str = ""
        self.violations: list[str] = []

    def tag(self, value, device: int) -> None:
        """Record that every tensor in ``value`` (nested lists and tuples too) lives on logical ``device``."""
        for t in tree_flatten(value)[0]:
            if isinstance(t, torch.Tensor) and _key(t) is not None:
                self.tags[_key(t)] = device

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        ins = [t for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)]
        in_keys = {_key(t) for t in ins}
        if self.current is not None:
            for t in ins:
                k = _key(t)
                if k is None:
                    continue
                tag = self.tags.get(k)
                if tag != self.current:
                    where = "an untagged tensor" if tag is None else f"a tensor of device {tag}"
                    self.violations.append(f"{self.node} ({func}) on device {self.current} read {where}")
        out = func(*args, **kwargs)
        if self.current is not None:
            for t in tree_flatten(out)[0]:
                if isinstance(t, torch.Tensor):
                    k = _key(t)
                    if k is not None and k not in in_keys:
                        self.tags[k] = self.current
        return out


class _CheckedInterpreter(torch.fx.Interpreter):
    def __init__(self, gm, check: LogicalDeviceCheck):
        super().__init__(gm)
        self.check = check

    def run_node(self, n):
        d = n.meta.get("postplace_device")
        if n.op in ("placeholder", "get_attr"):
            out = super().run_node(n)
            self.check.tag(out, d)
            return out
        if "postplace_transfer" in n.meta:
            self.check.current = None  # the one place a read from another device is allowed
            out = super().run_node(n)
            self.check.tag(out, n.meta["postplace_transfer"][2])
            return out
        self.check.current, self.check.node = d, n.name
        try:
            return super().run_node(n)
        finally:
            self.check.current = None


def run_with_check(gm: torch.fx.GraphModule, args: list, check: LogicalDeviceCheck):
    """Run a placed GraphModule under ``check``; returns its output (violations land in ``check``)."""
    with check:
        return _CheckedInterpreter(gm, check).run(*args)
