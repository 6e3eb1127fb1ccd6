"""The op graph of one training step: data model, importers and exporters."""

from postplace.graph.io import load_graph
from postplace.graph.opgraph import (
    COLLECTIVE_KINDS,
    DEVICE_KINDS,
    MEMORY_MODES,
    PHASES,
    Collective,
    GraphError,
    Measurement,
    OpGraph,
    topological_order,
)

__all__ = [
    "COLLECTIVE_KINDS",
    "DEVICE_KINDS",
    "MEMORY_MODES",
    "PHASES",
    "Collective",
    "GraphError",
    "Measurement",
    "OpGraph",
    "load_graph",
    "topological_order",
    "from_torch",
]


def __getattr__(name):
    # from_torch needs torch; import it on first use so `import postplace.graph` stays light
    if name == "from_torch":
        from postplace.graph.trace_torch import from_torch

        return from_torch
    raise AttributeError(f"module 'postplace.graph' has no attribute '{name}'")
