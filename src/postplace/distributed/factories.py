"""Picklable recipes for evaluators: what a Ray actor calls once to build its own evaluator.

An evaluator holds compiled kernels, traced modules and open devices, none of which should travel
between processes. What travels is a small frozen dataclass; the actor calls it (``factory()``) once,
in its own process, and keeps the evaluator for every batch it is given. Any zero-argument callable
that cloudpickle can ship works the same way; these two cover the evaluators postplace has.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

__all__ = ["SimulatorFactory", "TorchZooFactory"]


@dataclass(frozen=True, eq=False)
class SimulatorFactory:
    """Builds :class:`postplace.sim.Simulator` ``(graph, cluster, cost_model=, group_of_op=)``.

    The graph and cluster are plain arrays and dataclasses, so they pickle; each actor compiles (or
    loads from numba's cache) the simulator's kernel once. Call it (``factory()``) to build the simulator.

    Parameters
    ----------
    graph : OpGraph
    cluster : Cluster
    group_of_op : numpy.ndarray, optional
        As :class:`~postplace.sim.Simulator` takes it.
    cost_model : CostModel, optional
        As :class:`~postplace.sim.Simulator` takes it (it must pickle).
    num_gpus : float
        What each actor asks Ray for (0: the simulator needs no GPU).

    Examples
    --------
    >>> from postplace.cluster import load_cluster
    >>> from postplace.distributed import SimulatorFactory
    >>> from postplace.graph import OpGraph
    >>> sim = SimulatorFactory(OpGraph.build(["a"], flops=[1e9]), load_cluster("k80x2"))()
    >>> sim.name, sim.evaluate([[1]]).feasible.tolist()
    ('simulator', [True])
    """

    graph: object
    cluster: object
    group_of_op: np.ndarray | None = None
    cost_model: object | None = None
    num_gpus: float = 0.0  #: the simulator needs no GPU

    def __call__(self):
        from postplace.sim import Simulator

        return Simulator(self.graph, self.cluster, cost_model=self.cost_model, group_of_op=self.group_of_op)


@dataclass(frozen=True, eq=False)
class TorchZooFactory:
    """Builds :class:`postplace.runtime.evaluator.TorchEvaluator` for zoo model ``model`` at ``size``.

    The step is traced in the actor, so only names travel. Call it (``factory()``) to build the
    evaluator. ``num_gpus`` is what each actor asks Ray for: the CUDA devices its logical devices map
    to (a ``k80x4`` placement needs 4 in one actor; Ray makes them ``cuda:0..3`` there), 0 when mapped
    to the CPU (``device_map="cpu"``: it never waits for a GPU).

    Parameters
    ----------
    model, size : str
        The zoo model and its size.
    cluster : Cluster, str or path
        A Cluster, preset name or file.
    group_of_op : numpy.ndarray, optional
        Placements are then over groups.
    device_map : str or mapping, optional
        ``"cpu"`` (``--map-all-to cpu``) or logical name -> torch device.
    optimizer : str or (class, kwargs)
        What the actor traces the step with.
    precision : str
        ``fp32``, ``bf16`` or ``fp16``.
    options : dict
        Further keyword arguments of TorchEvaluator (``steps``, ``discard``, ``timeout``, ``threads``).
    gpus : float, optional
        Overrides the GPUs each actor asks for (``num_gpus``).
    microbatches, colocation
        The step is traced as that many micro-batches (the placements are of that graph; a measured
        step is the m micro-batches and one update).
    """

    model: str
    size: str
    cluster: object
    group_of_op: np.ndarray | None = None
    device_map: object | None = None
    optimizer: object = "sgd"  #: a name or (class, kwargs): what the actor traces the step with
    precision: str = "fp32"
    options: dict = field(default_factory=dict)
    gpus: float | None = None
    microbatches: int = 1
    colocation: str = "none"

    @property
    def num_gpus(self) -> float:
        """GPUs one actor needs: 1 + the highest CUDA index its logical devices map to (``cuda:K`` needs
        K + 1 visible devices), 0 when none maps to CUDA; ``gpus`` overrides it."""
        if self.gpus is not None:
            return float(self.gpus)
        from postplace.runtime.placed import resolve_device_map

        names = self.cluster.device_names if hasattr(self.cluster, "device_names") else None
        if names is None:
            from postplace.cluster import load_cluster

            names = load_cluster(self.cluster).device_names
        cuda = [d.index or 0 for d in resolve_device_map(names, self.device_map) if d.type == "cuda"]
        return float(max(cuda) + 1) if cuda else 0.0

    def __call__(self):
        from postplace.runtime.evaluator import TorchEvaluator

        return TorchEvaluator.for_zoo(
            self.model,
            self.size,
            self.cluster,
            group_of_op=self.group_of_op,
            device_map=self.device_map,
            optimizer=self.optimizer,
            precision=self.precision,
            microbatches=self.microbatches,
            colocation=self.colocation,
            **self.options,
        )
