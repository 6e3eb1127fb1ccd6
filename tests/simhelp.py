"""Run a placement through both simulators and insist they agree exactly."""

import numpy as np

from postplace.sim import Simulator, reference


def schedule_both(graph, cluster, cost, placement):
    sim = Simulator(graph, cluster, cost_model=cost)
    dev = np.asarray(placement, dtype=np.int64)
    sched = sim.schedule(dev)
    ref = reference.simulate(sim.problem, dev)
    np.testing.assert_array_equal(ref.op_start, sched.op_start)
    np.testing.assert_array_equal(ref.op_end, sched.op_end)
    np.testing.assert_array_equal(ref.peak, sched.peak_memory)
    np.testing.assert_array_equal(ref.busy, sched.busy)
    assert ref.transfers == sched.transfers
    assert ref.makespan == sched.step_time
    return sim, sched
