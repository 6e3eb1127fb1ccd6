"""Op times per device: measured where the graph carries a measurement, roofline estimates elsewhere.

Two methods make a cost model, as in FlexFlow's estimator: :meth:`CostModel.op_times` (a table
``[n_ops, D]`` built once per graph and cluster) and :meth:`CostModel.transfer_time` (bytes between two
devices, over the route's slowest link). The simulator reads only the table and the cluster's routes.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Protocol

import numpy as np

from postplace.cluster import Cluster
from postplace.cluster.cluster import PRECISION_PEAK_FIELDS
from postplace.cost.achieved import (
    ACHIEVED,
    KERNEL_MODELS,
    MEASURED_STEP_ERROR,
    UPDATE_FORMS,
    classify_ops,
    gemm_fill,
    update_times,
)
from postplace.errors import PostplaceError
from postplace.graph import PHASES, OpGraph
from postplace.graph.opgraph import PRECISIONS


@dataclass(frozen=True, eq=False)
class OpTimes:
    """``table[i, d]``: seconds op i takes on device d (inf where the op may not run there).

    What :meth:`CostModel.op_times` returns, so no number hides whether it was measured or estimated.

    Parameters
    ----------
    table : numpy.ndarray
        ``float64[n_ops, D]``: seconds op i takes on device d (inf where the op may not run there).
    measured : numpy.ndarray
        ``bool[n_ops, D]``: whether the time came from a measurement.
    sources : tuple of str
        Per device, one line saying where its times came from.
    unable : numpy.ndarray, optional
        ``bool[n_ops, D]``: an inf that says the device cannot compute the op (no peak for its precision on
        a device the caller will not use: :class:`RooflineCostModel`'s ``priced_devices``), not an overflow.
    """

    table: np.ndarray
    measured: np.ndarray
    sources: tuple[str, ...]
    unable: np.ndarray | None = None


class CostModel(Protocol):
    """What a cost model provides: an op time table, and the time of a transfer between two devices.

    Any object with these two methods is one (:class:`RooflineCostModel` is the default); pass it as
    ``cost_model=`` to the simulator, the placers and :func:`postplace.search.make_problem`.
    """

    def op_times(self, graph: OpGraph, cluster: Cluster) -> OpTimes:
        """Seconds every op of ``graph`` takes on every device of ``cluster``.

        Parameters
        ----------
        graph : OpGraph
        cluster : Cluster

        Returns
        -------
        OpTimes
            Built once per graph and cluster; inf where an op may not run on a device.
        """
        ...

    def transfer_time(self, cluster: Cluster, nbytes: float, a: int, b: int) -> float:
        """Seconds to move ``nbytes`` from device ``a`` to device ``b`` of ``cluster``.

        Parameters
        ----------
        cluster : Cluster
        nbytes : float
        a, b : int
            Device ids.

        Returns
        -------
        float
        """
        ...


@dataclass(frozen=True)
class RooflineCostModel:
    """The default cost model: measured op times where the graph has them, roofline estimates elsewhere.

    For each op and device: the graph's measured time for that device's model; else one measured for
    the device's kind as a whole (a profiled file that does not name its hardware); else, only when
    ``allow_other_models`` is set, one measured on another model of the same kind (the source line
    says so); else the roofline ``max(FLOPs / rate, bytes / bandwidth)`` plus the device's launch
    overhead. With ``kernels="datasheet"`` the rate is the device's peak for the precision the op
    computes in (:meth:`~postplace.cluster.Device.peak_for`: ``peak_flops`` for fp32,
    ``peak_flops_bf16``, ``peak_flops_fp16``) and the bandwidth its nominal one; with
    ``kernels="achieved"`` (the default) a GPU whose model has :data:`~postplace.cost.achieved.ACHIEVED`
    rates gets the fractions of those its kernels reach, by kind of op (:mod:`postplace.cost.achieved`).
    A GPU prices the update in ``update`` form (foreach by default, as torch.optim runs on CUDA); a CPU
    always prices the traced ops. Overhead is never added to a measured time. A transfer takes the
    cluster's :meth:`~postplace.cluster.Cluster.transfer_time`.

    Parameters
    ----------
    allow_other_models : bool
        Borrow a time measured on another model of the same kind where the device's own model and
        kind have none.
    kernels : {"achieved", "datasheet"}
        The rates an estimate uses: what kernels reach (where the GPU model has published rates), or
        the plain datasheet roofline.
    update : {"foreach", "fused", "traced"}
        The optimizer form a GPU runs the update in.
    priced_devices : tuple of int, optional
        The devices that must price every op (None: all). Another device with no peak for an op's
        precision prices it at inf, so it can never run it: a plan on some GPUs of a cluster whose other
        GPUs lack the step's precision (bf16 on the A100s of ``mixed``, beside V100s).

    Raises
    ------
    PostplaceError
        From :meth:`op_times`: an op with FLOPs that must be estimated on a device (of ``priced_devices``)
        with no peak for its precision is an error, never a guess.

    Examples
    --------
    >>> from postplace.cluster import load_cluster
    >>> from postplace.cost import RooflineCostModel
    >>> from postplace.graph import OpGraph
    >>> g = OpGraph.build(["a", "b"], [(0, 1, 1e6)], flops=[2.8e9, 0.0], allowed_kinds=["gpu", ["cpu", "gpu"]])
    >>> t = RooflineCostModel().op_times(g, load_cluster("k80x2"))  # devices cpu, gpu0, gpu1
    >>> t.table.round(6).tolist()  # a: 2.8 GFLOP at a K80 die's 2.8 TFLOP/s + 10 us launch; not on the CPU
    [[inf, 0.00101, 0.00101], [5e-06, 1e-05, 1e-05]]
    >>> t.sources[1]
    'gpu0 (K80): 2 roofline estimates (datasheet rates: no kernel rates known for K80)'
    """

    allow_other_models: bool = False
    kernels: str = "achieved"
    update: str = "foreach"
    priced_devices: tuple[int, ...] | None = None

    def __post_init__(self):
        if self.kernels not in KERNEL_MODELS:
            raise PostplaceError(f"cost model: kernels '{self.kernels}' is not one of {', '.join(KERNEL_MODELS)}")
        if self.update not in UPDATE_FORMS:
            raise PostplaceError(f"cost model: update '{self.update}' is not one of {', '.join(UPDATE_FORMS)}")

    def step_error(self, cluster: Cluster) -> float:
        """How far this model's step time was off a published run, for the rates that price ``cluster``'s
        GPUs (:data:`~postplace.cost.achieved.MEASURED_STEP_ERROR`; datasheet rates where any GPU model has
        no achieved ones).

        >>> from postplace.cluster import load_cluster
        >>> RooflineCostModel().step_error(load_cluster("dgx8")), RooflineCostModel().step_error(load_cluster("k80x4"))
        (0.157, 0.346)
        """
        achieved = self.kernels == "achieved" and not _without_rates(cluster)[1]
        return MEASURED_STEP_ERROR["achieved" if achieved else "datasheet"]

    def describe(self, cluster: Cluster | None = None) -> str:
        """Which model prices an estimate, in a few words (every output that shows a time says it); given
        the cluster, which of its GPU models have no achieved rates and so keep the datasheet's.

        >>> from postplace.cluster import load_cluster
        >>> RooflineCostModel().describe(load_cluster("dgx8"))
        'roofline at achieved kernel rates, foreach update'
        >>> RooflineCostModel().describe(load_cluster("k80x2"))
        'roofline at datasheet rates (no kernel rates known for K80), foreach update'
        """
        rates = "achieved kernel rates" if self.kernels == "achieved" else "datasheet rates"
        if self.kernels == "achieved" and cluster is not None:
            models, unknown = _without_rates(cluster)
            if unknown and len(unknown) == len(models):
                rates = f"datasheet rates (no kernel rates known for {', '.join(unknown)})"
            elif unknown:
                rates += f" (datasheet rates for {', '.join(unknown)}: none known)"
        return f"roofline at {rates}, {self.update} update"

    def op_times(self, graph: OpGraph, cluster: Cluster) -> OpTimes:
        """Seconds every op of ``graph`` takes on every device of ``cluster`` (see the class).

        Parameters
        ----------
        graph : OpGraph
        cluster : Cluster

        Returns
        -------
        OpTimes

        Raises
        ------
        PostplaceError
            When an op must be estimated on a device with no peak for its precision.
        """
        n, D = graph.num_ops, cluster.num_devices
        table = np.empty((n, D))
        measured = np.zeros((n, D), dtype=bool)
        unable = np.zeros((n, D), dtype=bool)
        sources = []
        mixed = graph.precisions_used not in ((), ("fp32",))
        is_matmul, is_attention = classify_ops(graph)
        has_update = bool((graph.phase == PHASES.index("update")).any())
        for d, dev in enumerate(cluster.devices):
            peaks = np.array([np.nan if (pk := dev.peak_for(p)) is None else pk for p in PRECISIONS])
            peak = peaks[graph.precision]  # NaN where the device has no peak for the op's precision
            peak = np.where(graph.flops > 0, peak, 1.0)  # an op that computes nothing needs no units
            gpu = dev.kind == "gpu"
            rates = ACHIEVED.get(dev.model) if gpu and self.kernels == "achieved" else None
            rate, bandwidth = peak, dev.memory_bandwidth
            if rates is not None:
                fill = gemm_fill(graph, rates.sms)
                rate = peak * np.where(is_matmul, rates.matmul * fill, np.where(is_attention, rates.attention, 1.0))
                bandwidth = dev.memory_bandwidth * rates.memory
            with np.errstate(over="ignore"):  # an overflow to inf is reported by the simulator's checks
                compute = graph.flops / rate
                roof = np.maximum(compute, graph.bytes_accessed / bandwidth)
            times = roof + dev.launch_overhead
            if gpu and self.update != "traced" and has_update:
                priced = update_times(graph, self.update, compute, bandwidth, dev.launch_overhead)
                times = np.where(np.isnan(priced), times, priced)
            have = np.zeros(n, dtype=bool)
            used = []
            for m in self._candidates(graph, dev):
                take = ~have & ~np.isnan(m.times)
                if take.any():
                    times = np.where(take, m.times, times)
                    have |= take
                    used.append(f"{int(take.sum())} measured ({m.key}: {m.provenance})")
            allowed = (graph.allowed_kinds & dev.kind_bit) != 0
            if self.priced_devices is None or d in self.priced_devices:
                _check_peaks(graph, cluster, dev, peak, allowed & ~have)
            else:  # a device the caller will not use: what it cannot compute it never runs
                unable[:, d] = np.isnan(times) & allowed
                times = np.where(np.isnan(times), np.inf, times)
            if n - int(have.sum()):
                prec = np.unique(graph.precision[~have & allowed & (graph.flops > 0)]) if mixed else ()
                rates_used = ", ".join(f"{PRECISIONS[p]} at {peaks[p] / 1e12:.3g} TFLOP/s" for p in prec)
                rates_used = f" ({rates_used})" if rates_used else ""
                used.append(f"{n - int(have.sum())} roofline estimates{rates_used}{self._how(dev, has_update)}")
            table[:, d] = np.where(allowed, times, np.inf)
            measured[:, d] = have & allowed
            sources.append(f"{dev.name} ({dev.model}): " + "; ".join(used or ["no ops"]))
        return OpTimes(table, measured, tuple(sources), unable if unable.any() else None)

    def _how(self, dev, has_update: bool) -> str:
        if dev.kind != "gpu":
            return ""
        if self.kernels == "datasheet":
            words = "datasheet rates"
        elif dev.model in ACHIEVED:
            r = ACHIEVED[dev.model]
            words = (
                f"achieved rates: matmul {r.matmul:.0%}, attention {r.attention:.0%}, "
                f"memory {r.memory:.0%} of datasheet"
            )
        else:
            words = f"datasheet rates: no kernel rates known for {dev.model}"
        return f" ({words}{f'; {self.update} update' if has_update else ''})"

    def _candidates(self, graph: OpGraph, dev):
        exact = [m for m in graph.measured if m.key == dev.model]
        kind = [m for m in graph.measured if m.key == dev.kind and m.key != dev.model]
        other = []
        if self.allow_other_models:
            other = [m for m in graph.measured if m.kind == dev.kind and m not in exact and m not in kind]
            other = [_Borrowed(m, dev.model) for m in other]
        return exact + kind + other

    def transfer_time(self, cluster: Cluster, nbytes: float, a: int, b: int) -> float:
        """Seconds to move ``nbytes`` from device ``a`` to ``b``: :meth:`Cluster.transfer_time`.

        Parameters
        ----------
        cluster : Cluster
        nbytes : float
        a, b : int
            Device ids.

        Returns
        -------
        float
        """
        return cluster.transfer_time(nbytes, a, b)


def _without_rates(cluster: Cluster) -> tuple[list[str], list[str]]:
    """``(the cluster's GPU models, those of them with no achieved kernel rates)``, sorted."""
    models = sorted({d.model for d in cluster.devices if d.kind == "gpu"})
    return models, [m for m in models if m not in ACHIEVED]


def _check_peaks(graph: OpGraph, cluster: Cluster, dev, peak: np.ndarray, estimated: np.ndarray) -> None:
    """Raise if an op this device must price by roofline computes in a precision it has no peak for."""
    missing = estimated & np.isnan(peak)
    if not missing.any():
        return
    p = PRECISIONS[int(graph.precision[np.flatnonzero(missing)[0]])]
    count = int((missing & (graph.precision == PRECISIONS.index(p))).sum())
    field = PRECISION_PEAK_FIELDS[p]
    have = " or ".join(q for q in PRECISIONS if dev.peak_for(q) is not None)
    raise PostplaceError(
        f"cluster '{cluster.name}': {dev.name} ({dev.model}) has no {p} units ({field} not given) for "
        f"{count} {p} op(s) of graph '{graph.name}'; trace the step in {have}, or give {field} in the cluster file"
    )


@dataclass(frozen=True)
class _Borrowed:
    """A measurement from another model of the same kind, labelled as such."""

    inner: object
    target: str

    @property
    def key(self):
        return self.inner.key

    @property
    def times(self):
        return self.inner.times

    @property
    def provenance(self):
        return f"{self.inner.provenance}; borrowed from model {self.inner.key} for {self.target}"


def priced_on(cost_model, cluster: Cluster, devices) -> CostModel | None:
    """The cost model for a placement or plan that runs on some devices of a cluster alone.

    The other devices run nothing, so a precision they lack is no error (bf16 on the A100s of a cluster with
    V100s; :attr:`RooflineCostModel.priced_devices`).

    Parameters
    ----------
    cost_model : CostModel or None
        The caller's model; None: the default :class:`RooflineCostModel`.
    cluster : Cluster
    devices : iterable of int
        The devices the placement or plan uses (repeats allowed: a placement's op devices).

    Returns
    -------
    CostModel or None
        A roofline model pricing only ``devices``; ``cost_model`` itself when it is another kind of model or
        every device is used.

    Examples
    --------
    >>> from postplace.cluster import load_cluster
    >>> priced_on(None, load_cluster("k80x2"), [0, 1, 1]).priced_devices
    (0, 1)
    >>> priced_on(None, load_cluster("k80x2"), [0, 1, 2]) is None
    True
    """
    used = tuple(sorted({int(d) for d in devices}))
    if (cost_model is not None and not isinstance(cost_model, RooflineCostModel)) or len(used) == cluster.num_devices:
        return cost_model
    return replace(cost_model or RooflineCostModel(), priced_devices=used)
