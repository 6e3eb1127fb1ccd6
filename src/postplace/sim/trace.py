"""One placement's schedule, and its Chrome trace-event JSON (opens in Perfetto or chrome://tracing)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from postplace.cluster import Cluster
from postplace.errors import PostplaceError
from postplace.graph import PHASES, OpGraph


@dataclass(frozen=True, eq=False)
class Schedule:
    """Every op's (device, start, end) and every transfer's (src op, slot, from, to, bytes, start, end).

    What :meth:`postplace.sim.Simulator.schedule` returns for one placement; times are seconds from
    the start of the step.

    Parameters
    ----------
    graph : OpGraph
    cluster : Cluster
    device : numpy.ndarray
        ``int64[num_ops]``: each op's device id.
    op_start, op_end : numpy.ndarray
        ``float64[num_ops]``: when each op starts and ends.
    transfers : list of tuple
        ``(src op, slot, from device, to device, bytes, start, end)`` for every transfer.
    step_time : float
        The step's makespan.
    peak_memory : numpy.ndarray
        ``float64[D]``: each device's peak memory in bytes.
    busy : numpy.ndarray
        ``float64[D]``: seconds each device computes.
    collectives : list of tuple
        ``(name, kind, start, end, member devices in rank order, wire bytes)`` for every collective of
        the graph, in collective order.

    Examples
    --------
    >>> from postplace.cluster import load_cluster
    >>> from postplace.graph import OpGraph
    >>> from postplace.sim import Simulator
    >>> g = OpGraph.build(["a", "b"], [(0, 1, 1e6)], flops=[1e9, 1e9])
    >>> s = Simulator(g, load_cluster("k80x2")).schedule([1, 2])
    >>> [(op, dev) for op, dev, start, end in s.rows()], len(s.transfers), s.transfers[0][4]
    ([('a', 'gpu0'), ('b', 'gpu1')], 1, 1000000.0)
    """

    graph: OpGraph
    cluster: Cluster
    device: np.ndarray
    op_start: np.ndarray
    op_end: np.ndarray
    transfers: list[tuple[int, int, int, int, float, float, float]]
    step_time: float
    peak_memory: np.ndarray
    busy: np.ndarray
    collectives: list[tuple[str, str, float, float, tuple[int, ...], float]] = field(default_factory=list)

    @property
    def bytes_moved(self) -> float:
        """Bytes sent between devices: every transfer's, then every collective's on the wire."""
        moved = 0.0
        for x in self.transfers:
            moved += x[4]
        for c in self.collectives:
            moved += c[5]
        return moved

    def rows(self) -> list[tuple[str, str, float, float]]:
        """(op name, device name, start, end) in program order.

        Returns
        -------
        list of tuple
        """
        names = self.cluster.device_names
        return [
            (self.graph.names[i], names[self.device[i]], float(self.op_start[i]), float(self.op_end[i]))
            for i in range(self.graph.num_ops)
        ]

    def chrome_trace(self) -> dict:
        """Trace-event JSON: one process per device, a compute track, a track per incoming link and one
        for the collectives the device takes part in.

        Returns
        -------
        dict
            ``{"traceEvents": [...], ...}``, times in microseconds.
        """
        us = 1e6
        events = []
        for d, name in enumerate(self.cluster.device_names):
            events.append({"ph": "M", "name": "process_name", "pid": d, "args": {"name": name}})
            events.append({"ph": "M", "name": "thread_name", "pid": d, "tid": 0, "args": {"name": "compute"}})
        g = self.graph
        for i in range(g.num_ops):
            events.append(
                {
                    "ph": "X",
                    "pid": int(self.device[i]),
                    "tid": 0,
                    "name": g.names[i],
                    "cat": PHASES[g.phase[i]],
                    "ts": self.op_start[i] * us,
                    "dur": (self.op_end[i] - self.op_start[i]) * us,
                    "args": {"op_type": g.op_types[i], "flops": float(g.flops[i])},
                }
            )
        for src, slot, a, b, nbytes, start, end in self.transfers:
            events.append(
                {
                    "ph": "X",
                    "pid": int(b),
                    "tid": 1 + int(a),
                    "cat": "transfer",
                    "name": f"{g.names[src]}:{slot} from {self.cluster.device_names[a]}",
                    "ts": start * us,
                    "dur": (end - start) * us,
                    "args": {"bytes": nbytes},
                }
            )
        D = self.cluster.num_devices
        for b in range(D):
            for a in range(D):
                if a != b:
                    events.append(
                        {
                            "ph": "M",
                            "name": "thread_name",
                            "pid": b,
                            "tid": 1 + a,
                            "args": {"name": f"recv from {self.cluster.device_names[a]}"},
                        }
                    )
        in_collectives = sorted({d for c in self.collectives for d in c[4]})
        for d in in_collectives:  # tid 1 + D: after the recv tracks
            events.append({"ph": "M", "name": "thread_name", "pid": d, "tid": 1 + D, "args": {"name": "collectives"}})
        for name, kind, start, end, devices, wire in self.collectives:
            for rank, d in enumerate(devices):
                events.append(
                    {
                        "ph": "X",
                        "pid": int(d),
                        "tid": 1 + D,
                        "cat": "collective",
                        "name": f"{name} ({kind})",
                        "ts": start * us,
                        "dur": (end - start) * us,
                        "args": {"kind": kind, "rank": rank, "ranks": len(devices), "wire_bytes": wire},
                    }
                )
        return {
            "traceEvents": events,
            "displayTimeUnit": "ms",
            "otherData": {"evaluator": "simulator", "step_time_s": self.step_time},
        }

    def save_chrome_trace(self, path: str | Path) -> None:
        """Write :meth:`chrome_trace` as JSON (open it in Perfetto or chrome://tracing).

        Parameters
        ----------
        path : str or path

        Raises
        ------
        PostplaceError
            When the file cannot be written.
        """
        try:
            Path(path).write_text(json.dumps(self.chrome_trace()))
        except OSError as exc:
            why = exc.strerror or exc
            raise PostplaceError(f"{path}: cannot write the trace ({why}); pick a writable path") from None


def memory_over_time(problem, device: np.ndarray) -> list[tuple[np.ndarray, np.ndarray]]:
    """Bytes held on each device during one step of an op-level placement, as step functions.

    Per device ``(times, bytes)``: ``bytes[k]`` is held from ``times[k]`` on (the first point is time 0
    with the persistent bytes). Every change the reference simulator makes is kept, several at one
    instant included, so the maximum is the step's peak (:attr:`Schedule.peak_memory`).
    """
    from postplace.sim import reference

    log: list[tuple[float, int, float]] = []
    run = reference.simulate(problem, np.asarray(device), memory_log=log)
    resident = np.zeros(problem.num_devices)
    np.add.at(resident, np.asarray(device, dtype=np.int64), problem.persistent)
    per_device: list[list[tuple[float, float]]] = [[] for _ in range(problem.num_devices)]
    for t, d, b in log:  # one pass, not one per device (64 GPUs and a CPU make 65)
        per_device[d].append((t, b))
    out = []
    for d, pts in enumerate(per_device):
        times = np.array([0.0] + [t for t, _ in pts] + [run.makespan])
        values = np.array([resident[d]] + [b for _, b in pts] + [pts[-1][1] if pts else resident[d]])
        out.append((times, values))
    return out
