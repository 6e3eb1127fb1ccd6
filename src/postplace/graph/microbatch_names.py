"""Names of micro-batch copies: the graph pass of :mod:`postplace.graph.microbatch` calls micro-batch
k's copy of op ``name`` ``mb{k}_name``; shared ops keep their names. Read here, in one place, by pins
(a pattern names every copy), by placement files (which m they were made for) and by warm starts
made at another m. Pure text: no torch."""

from __future__ import annotations

import re
from collections.abc import Iterable

__all__ = ["COPY_PREFIX", "copied_name", "placement_microbatches"]

COPY_PREFIX = re.compile(r"^mb(\d+)_")


def copied_name(name: str) -> str:
    """The name of the op a micro-batch copy copies (``mb3_conv`` -> ``conv``); other names unchanged."""
    return COPY_PREFIX.sub("", name, count=1)


def placement_microbatches(op_names: Iterable[str]) -> int:
    """The micro-batch count the op names imply: 1 + the largest k of an ``mb{k}_`` prefix, 1 when no
    name has one (a step traced as one micro-batch)."""
    ks = [int(m.group(1)) for n in op_names if (m := COPY_PREFIX.match(n))]
    return max(ks) + 1 if ks else 1
