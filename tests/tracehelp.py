"""Checks on traced graphs shared by the tracer and zoo tests."""

import numpy as np
import pytest

from postplace.graph import PHASES

BWD = PHASES.index("backward")
CAPTURED_TARGETS = pytest.mark.filterwarnings("ignore::postplace.graph.trace_torch.CapturedTensorWarning")
"""A test that traces a loss_fn closing over its labels on purpose: the tracer's warning about them is expected."""


def assert_backward_colocated_with_forward(tr) -> None:
    """Find each backward compute op's forward partner independently, from the fx metadata (the
    forward node whose autograd sequence number the backward op was issued for); every op with a
    partner must be colocated with it, and at least 90% of them must have one."""
    g, gm = tr.graph, tr.gm
    fwd_seq = {}
    for n in gm.graph.nodes:
        if (n.meta.get("custom") or {}).get("phase") == "forward" and n.meta.get("seq_nr") is not None:
            op = tr.op_of_node.get(n.name, -1)
            if op >= 0 and g.op_types[op] not in ("input", "constant"):  # data, never colocated
                fwd_seq.setdefault(n.meta["seq_nr"], set()).add(op)
    nodes = {n.name: n for n in gm.graph.nodes}
    compute = [i for i in np.flatnonzero(g.phase == BWD) if g.flops[i] > 0]
    with_partner = 0
    for i in compute:
        partners = fwd_seq.get((nodes[g.names[i]].meta.get("custom") or {}).get("grad_fn"), set())
        if partners:
            with_partner += 1
            assert all(g.colocation[j] == g.colocation[i] != -1 for j in partners), g.names[i]
    assert with_partner >= 0.9 * len(compute)
