"""The op graph of one training step: data model, importers and exporters."""

from postplace.graph.io import load_graph
from postplace.graph.opgraph import (
    DEVICE_KINDS,
    MEMORY_MODES,
    PHASES,
    GraphError,
    Measurement,
    OpGraph,
    topological_order,
)

__all__ = [
    "DEVICE_KINDS",
    "MEMORY_MODES",
    "PHASES",
    "GraphError",
    "Measurement",
    "OpGraph",
    "load_graph",
    "topological_order",
]
