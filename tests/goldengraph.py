"""A two-layer step traced as two micro-batches, written out by hand (one op per layer and pass), as
``from_torch(..., microbatches=2)`` makes it: for each micro-batch k, ``f1_k -> f2_k -> b2_k -> b1_k``
(b2 sends the activation gradient to b1 and makes layer 2's weight gradient), then one gradient sum
per layer (``a1 = g1_0 + g1_1``), then the updates. Parameters ``p1``, ``p2`` are read by their
layer's forward and backward ops and written by the update. Shared by the golden tests of the
simulator on micro-batches and of the parallel yardsticks.

Activations are ACT bytes, parameters and gradients PARAM bytes; op times (seconds): TIME by kind.
"""

import numpy as np

from postplace.graph import OpGraph

ACT, PARAM = 10.0, 20.0
NAMES = ["p1", "p2"]
NAMES += [f"{op}_{k}" for k in (0, 1) for op in ("f1", "f2", "b2", "b1")]
NAMES += ["a2", "a1", "u2", "u1"]
TIME = {"p": 0, "f1": 1, "f2": 2, "b2": 2, "b1": 2, "a": 1, "u": 1}


def op(name):
    return NAMES.index(name)


def layer_of(name):
    return "a" if name in ("p1", "a1", "u1") or name.startswith(("f1", "b1")) else "b"


def two_layer_two_microbatches(output_bytes=None, *, parameter_sets=False, columns=2):
    """``(graph, [n_ops, columns] op times)``. ``parameter_sets``: each parameter with its gradient sum
    and update is one colocation set, and ops carry module paths ``a`` / ``b``, as the tracer makes them."""
    e = []
    for k in (0, 1):
        f1, f2, b2, b1 = (op(f"{x}_{k}") for x in ("f1", "f2", "b2", "b1"))
        e += [(op("p1"), f1, PARAM), (op("p2"), f2, PARAM), (op("p2"), b2, PARAM)]
        e += [(f1, f2, ACT), (f1, b1, ACT), (f2, b2, ACT)]
        e += [(b2, b1, ACT, 0), (b2, op("a2"), PARAM, 1), (b1, op("a1"), PARAM)]  # b2: slot 0 dx, slot 1 grad
    e += [(op("a2"), op("u2"), PARAM), (op("a1"), op("u1"), PARAM), (op("p2"), op("u2"), PARAM)]
    e += [(op("p1"), op("u1"), PARAM)]
    kind = [n.split("_")[0] if "_" in n else n[0] for n in NAMES]  # f1, f2, b2, b1, or p, a, u
    phase = {"p": "other", "f": "forward", "b": "backward", "a": "backward", "u": "update"}
    extra = {}
    if parameter_sets:
        coloc = {"p1": 0, "a1": 0, "u1": 0, "p2": 1, "a2": 1, "u2": 1}
        extra = {"colocation": [coloc.get(n, -1) for n in NAMES], "module": [layer_of(n) for n in NAMES]}
    g = OpGraph.build(
        NAMES,
        e,
        phase=[phase[n[0]] for n in NAMES],
        microbatch=[int(n[-1]) if "_" in n else -1 for n in NAMES],
        persistent_bytes=[PARAM if n[0] == "p" else 0 for n in NAMES],
        output_bytes=output_bytes if output_bytes is not None else [0] * len(NAMES),
        **extra,
    )
    return g, np.array([[TIME[k]] * columns for k in kind], dtype=float)
