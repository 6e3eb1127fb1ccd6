"""One-shot placement baselines: plain functions ``place_X(graph, cluster, *, cost_model, seed) -> int64[n_ops]``.

Every placer places colocation sets as units and puts ops that may only run on a CPU on a CPU; the
result is an op-level device-id array that :func:`postplace.cluster.placement.invalid_reason` accepts.
Which of them respect memory (``m-topo``, ``m-etf``, ``m-sct``: always, or they raise
:class:`PlacementError`; ``single``: always, or it raises :class:`NoSingleDeviceFits`; ``metis``: where
its repair step can; ``pipeline``: where some balanced cut fits, else it returns the time-balanced one,
OOM; ``cpu``, ``expert``, ``heft``: not at all) is said in each docstring.

Data parallelism is not in :data:`PLACERS`, since it needs a step traced as m > 1 micro-batches:
:func:`data_parallel_placement` places such a step (micro-batch j on GPU ``j % k``, parameters
sharded) and :func:`simulate_data_parallel` times it with the simulator and reports the memory of
replicas that each hold the whole state. For a file workload that cannot be traced again,
:func:`data_parallel_step_time` is an analytic estimate (replicas, not a placement), labelled as one.

Each placer registers itself where it is defined, with :func:`register_placer` (its name, roles and
rank; :mod:`postplace.placers.registry`): :data:`REGISTRY` and :data:`PLACERS` hold them all, and every
list of placer names elsewhere (``place``'s candidates, ``compare``'s rows, the paper's heuristics) is
derived from :data:`REGISTRY`. A new placer is its own module, imported below.

>>> from postplace.graph import OpGraph
>>> from postplace.testing import star_cluster
>>> sorted(PLACERS)
['cpu', 'expert', 'heft', 'm-etf', 'm-sct', 'm-topo', 'metis', 'pipeline', 'single']
>>> place("cpu", OpGraph.build(["a"]), star_cluster()).tolist()
[0]
"""

from __future__ import annotations

import numpy as np

from postplace.cluster import Cluster
from postplace.errors import PostplaceError
from postplace.graph import OpGraph
from postplace.placers._common import PlacementError, memory_account

# each placer module registers its placers where it defines them (postplace.placers.registry); importing
# them here fills REGISTRY, in the order their ranks give, whatever the order of these imports
from postplace.placers.baechi import place_m_etf, place_m_sct, place_m_topo
from postplace.placers.data_parallel import (
    DataParallelPlan,
    DataParallelResult,
    data_parallel_placement,
    data_parallel_step_time,
    simulate_data_parallel,
)
from postplace.placers.expert import place_expert
from postplace.placers.heft import place_heft
from postplace.placers.metis import place_metis
from postplace.placers.pipeline import place_pipeline
from postplace.placers.registry import PLACERS, REGISTRY, Placer, register_placer
from postplace.placers.single import NoSingleDeviceFits, place_cpu, place_single

__all__ = [
    "PLACERS",
    "REGISTRY",
    "Placer",
    "DataParallelPlan",
    "DataParallelResult",
    "NoSingleDeviceFits",
    "PlacementError",
    "data_parallel_placement",
    "data_parallel_step_time",
    "memory_account",
    "place",
    "place_cpu",
    "place_expert",
    "place_heft",
    "place_m_etf",
    "place_m_sct",
    "place_m_topo",
    "place_metis",
    "place_pipeline",
    "place_single",
    "register_placer",
    "simulate_data_parallel",
]


def place(name: str, graph: OpGraph, cluster: Cluster, **kw) -> np.ndarray:
    """Run the placer called ``name`` (a key of :data:`PLACERS`) with keyword arguments ``kw``.

    Parameters
    ----------
    name : str
        A key of :data:`PLACERS`.
    graph : OpGraph
    cluster : Cluster
    **kw
        The placer's own keyword arguments (``cost_model``, ``seed``, ``allowed``...).

    Returns
    -------
    numpy.ndarray
        ``int64[n_ops]``: a device id per op.

    Raises
    ------
    PostplaceError
        For an unknown name, and whatever the placer raises (:class:`PlacementError` and
        :class:`NoSingleDeviceFits` are PostplaceErrors).

    Examples
    --------
    >>> from postplace.cluster import load_cluster
    >>> from postplace.graph import OpGraph
    >>> from postplace.placers import place
    >>> g = OpGraph.build(["a", "b"], [(0, 1, 1e6)], flops=[1e9, 1e9])
    >>> place("single", g, load_cluster("k80x2")).tolist()
    [1, 1]
    """
    try:
        fn = PLACERS[name]
    except KeyError:
        raise PostplaceError(f"unknown placer '{name}'; choose one of {', '.join(PLACERS)}") from None
    return fn(graph, cluster, **kw)
