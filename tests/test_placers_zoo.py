"""Every one-shot placer gives a valid placement on every zoo model (small versions)."""

import pytest

from postplace.cluster import load_cluster
from postplace.cluster.placement import invalid_reason
from postplace.placers import PLACERS, place
from postplace.sim import Simulator
from postplace.zoo import MODELS, cached_graph

MEMORY_AWARE = {"single", "m-topo", "m-etf", "m-sct"}


@pytest.mark.parametrize("model", sorted(MODELS))
def test_every_placer_on_every_zoo_model(model):
    graph = cached_graph(model, "small")
    cluster = load_cluster("k80x4")
    sim = Simulator(graph, cluster)
    for name in sorted(PLACERS):
        ops = place(name, graph, cluster)
        assert invalid_reason(graph, cluster, ops) is None, (model, name)
        res = sim.evaluate_ops(ops[None])
        assert not res.failed[0]
        assert res.step_time[0] >= sim.lower_bound * (1 - 1e-9)
        if name in MEMORY_AWARE:
            assert not res.oom[0], (model, name)
