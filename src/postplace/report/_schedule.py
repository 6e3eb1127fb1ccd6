"""The schedule and memory of the placement a report draws: simulated again with
:meth:`postplace.sim.Simulator.schedule`, so the Gantt chart (a lane per device, and one per port and
link direction that carried a transfer) and the memory figures are the simulator's, whatever evaluator
judged the search.
"""

from __future__ import annotations

import numpy as np

from postplace.errors import PostplaceError
from postplace.report._checks import MAX_STEP_S
from postplace.report._curves import MAX_POINTS


def _resource_names(cluster) -> list[str]:
    D = cluster.num_devices
    names = [f"{d} egress" for d in cluster.device_names] + [f"{d} ingress" for d in cluster.device_names]
    for link in cluster.links:
        names += [f"link {link.a}->{link.b}", f"link {link.b}->{link.a}"]
    assert len(names) == cluster.num_resources == 2 * D + 2 * len(cluster.links)
    return names


def _downsample_steps(times: np.ndarray, values: np.ndarray) -> tuple[list, list]:
    """A step function with at most ~MAX_POINTS points, keeping each bin's maximum (so peaks survive)."""
    if len(times) <= MAX_POINTS:
        return times.tolist(), values.tolist()
    edges = np.linspace(times[0], times[-1], MAX_POINTS // 2 + 1)
    idx = np.clip(np.searchsorted(edges, times, side="right") - 1, 0, len(edges) - 2)
    t_out, v_out = [], []
    for b in range(len(edges) - 1):
        sel = np.flatnonzero(idx == b)
        if sel.size:
            t_out += [float(times[sel[0]]), float(times[sel[-1]])]
            v_out += [float(values[sel].max()), float(values[sel[-1]])]
    return t_out, v_out


def schedule_info(graph, cluster, ops: np.ndarray, source: str) -> tuple[dict, dict, object]:
    """(schedule info, memory info, the Schedule) of one op-level placement, simulated again."""
    from postplace.cost import priced_on
    from postplace.graph import PHASES
    from postplace.sim import Simulator
    from postplace.sim.trace import memory_over_time

    sim = Simulator(graph, cluster, cost_model=priced_on(None, cluster, np.asarray(ops).tolist()))
    sched = sim.schedule(ops)
    if not (np.isfinite(sched.step_time) and sched.step_time <= MAX_STEP_S):  # its Gantt chart's axis overflows
        raise PostplaceError(
            f"{source}: its simulated step takes {float(sched.step_time):.3g} s, past the "
            f"{MAX_STEP_S:g} s a report can draw: graph '{graph.name}' or cluster "
            f"'{cluster.name}' has figures no hardware has; check their flops, bytes, bandwidths "
            "and latencies"
        )
    res = _resource_names(cluster)
    lanes: dict[int, list] = {}
    for src, _slot, a, b, _nbytes, start, end in sched.transfers:
        for r in cluster.route_resources[
            cluster.route_ptr[a * cluster.num_devices + b] : cluster.route_ptr[a * cluster.num_devices + b + 1]
        ]:
            lanes.setdefault(int(r), []).append([float(start), float(end), PHASES[graph.phase[src]]])
    schedule = {
        "source": source,
        "step_time_s": float(sched.step_time),
        "lower_bound_s": float(sim.lower_bound),
        "devices": list(cluster.device_names),
        "ops": {
            "device": sched.device.tolist(),
            "start_s": sched.op_start.tolist(),
            "end_s": sched.op_end.tolist(),
            "phase": [PHASES[k] for k in graph.phase],
        },
        "busy_s": sched.busy.tolist(),
        "link_lanes": [{"name": res[r], "intervals": lanes[r]} for r in sorted(lanes)],
        "transfers": len(sched.transfers),
        "bytes_moved": float(sched.bytes_moved),
    }
    timeline = memory_over_time(sim.problem, sched.device)
    memory = {
        "devices": list(cluster.device_names),
        "peak_bytes": sched.peak_memory.tolist(),
        "capacity_bytes": cluster.capacity.tolist(),
        "oom_devices": [
            cluster.device_names[d] for d in range(cluster.num_devices) if sched.peak_memory[d] > cluster.capacity[d]
        ],
        "memory_mode": graph.memory_mode,
        "over_time": [],
    }
    for d, (t, v) in enumerate(timeline):
        tt, vv = _downsample_steps(t, v)
        memory["over_time"].append({"device": cluster.device_names[d], "time_s": tt, "bytes": vv})
    return schedule, memory, sched
