"""The two trivial baselines: the fastest single device that fits, and everything on the CPU."""

from __future__ import annotations

import numpy as np

from postplace.cluster import Cluster
from postplace.cluster.placement import single_device
from postplace.cost import CostModel
from postplace.graph import OpGraph
from postplace.placers._common import PlacementError, allowed_matrix, check_graph, devices_of_kind
from postplace.placers.registry import register_placer

__all__ = ["NoSingleDeviceFits", "place_cpu", "place_single"]


class NoSingleDeviceFits(PlacementError):
    """No single-device placement of the graph fits in memory (the model needs model parallelism)."""


@register_placer("single", candidate=True, rank=10)
def place_single(
    graph: OpGraph,
    cluster: Cluster,
    *,
    cost_model: CostModel | None = None,
    seed: int = 0,
    devices: list[str] | None = None,
    allowed: np.ndarray | None = None,
) -> np.ndarray:
    """Every op on the one device that runs the step fastest without running out of memory.

    Each device's single-device placement (ops that may not run there go to the first device of a kind
    they may use, e.g. CPU-only ops to the CPU) is simulated; the fastest one that is not OOM wins,
    ties going to the lower device id.

    Parameters
    ----------
    graph, cluster : OpGraph, Cluster
    cost_model : CostModel, optional
        Default :class:`postplace.cost.RooflineCostModel`.
    seed : int
        Unused (the placer is deterministic); accepted so every placer has the same signature.
    devices : list of str, optional
        Device names to consider (default: all).
    allowed : numpy.ndarray, optional
        ``[n_ops, D]`` bool: the user's constraints (pins, exclusions). A device no op may use is no
        candidate; an op that may not use the candidate device goes to the first device it may use.

    Returns
    -------
    numpy.ndarray
        int64 device id per op.

    Raises
    ------
    NoSingleDeviceFits
        When every candidate single-device placement is OOM ("no single device fits").

    References
    ----------
    The "single GPU" baseline of Mirhoseini et al., "Device Placement Optimization with Reinforcement
    Learning", ICML 2017, and of Gao et al., "Post", NeurIPS 2018.

    Examples
    --------
    >>> from postplace.graph import OpGraph
    >>> from postplace.testing import TableCostModel, star_cluster
    >>> g = OpGraph.build(["a", "b"], [(0, 1, 1.0)])
    >>> place_single(g, star_cluster(("cpu", "gpu")), cost_model=TableCostModel([[5, 1], [5, 1]])).tolist()
    [1, 1]
    """
    from postplace.sim import Simulator

    check_graph(graph, cluster, "single", allowed)
    names = list(cluster.device_names) if devices is None else list(devices)
    if allowed is not None:
        ok = allowed_matrix(graph, cluster, allowed)
        names = [nm for nm in names if ok[:, cluster.device_index(nm)].any()]
    cands = np.stack([on_device(graph, cluster, nm, allowed) for nm in names])
    res = Simulator(graph, cluster, cost_model=cost_model).evaluate(cands)
    ok = np.flatnonzero(res.feasible)
    if ok.size == 0:
        need = float(res.peak_mem.max(axis=1).min())
        raise NoSingleDeviceFits(
            f"no single device fits graph '{graph.name}' on cluster '{cluster.name}': the smallest peak is "
            f"{need / 1e9:.3g} GB, the largest device holds {cluster.capacity.max() / 1e9:.3g} GB; "
            "use a model-parallel placer (m-topo, m-etf, m-sct, metis)"
        )
    best = ok[np.argmin(res.step_time[ok])]
    return cands[best].copy()


def on_device(graph: OpGraph, cluster: Cluster, device: str, allowed: np.ndarray | None = None) -> np.ndarray:
    """Every op on ``device`` where it may go; the others to the first device they may use."""
    if allowed is None:
        return single_device(graph, cluster, device)
    ok = allowed_matrix(graph, cluster, allowed)
    d = cluster.device_index(device)
    return np.where(ok[:, d], d, ok.argmax(axis=1)).astype(np.int64)


@register_placer("cpu", rank=80)
def place_cpu(
    graph: OpGraph,
    cluster: Cluster,
    *,
    cost_model: CostModel | None = None,
    seed: int = 0,
    allowed: np.ndarray | None = None,
) -> np.ndarray:
    """Every op on the (first) CPU; ops that may not run on a CPU go to the first device they may use.

    No memory check: this is the plain "CPU only" baseline, whose step time the Post paper and
    Mirhoseini et al. (ICML 2017) report.

    Parameters
    ----------
    graph, cluster : OpGraph, Cluster
    cost_model : CostModel, optional
        Unused (nothing is timed); accepted so every placer has the same signature.
    seed : int
        Unused (the placer is deterministic).
    allowed : numpy.ndarray, optional
        ``[n_ops, D]`` bool: the user's constraints (pins, exclusions). A CPU no op may use is skipped;
        an op that may not use the CPU goes to the first device it may use.

    Returns
    -------
    numpy.ndarray
        int64 device id per op.

    Raises
    ------
    PlacementError
        When the cluster has no CPU (left after the constraints), or an op may run on no device.

    Examples
    --------
    >>> from postplace.graph import OpGraph
    >>> from postplace.testing import star_cluster
    >>> place_cpu(OpGraph.build(["a", "b"], [(0, 1)]), star_cluster(("gpu", "cpu"))).tolist()
    [1, 1]
    """
    check_graph(graph, cluster, "cpu", allowed)
    cpus = devices_of_kind(cluster, "cpu")
    if allowed is not None:
        cpus = [d for d in cpus if allowed_matrix(graph, cluster, allowed)[:, d].any()]
    if not cpus:
        raise PlacementError(
            f"cpu: cluster '{cluster.name}' has no CPU device"
            + (" left after the constraints" if allowed is not None else "")
        )
    return on_device(graph, cluster, cluster.device_names[cpus[0]], allowed)
