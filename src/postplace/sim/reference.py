"""The reference simulator: the semantics of :mod:`postplace.sim`, written plainly in Python.

It exists to be read and to check the compiled kernel against (they must agree exactly, bit for bit).
It is slow; use :class:`postplace.sim.Simulator` for real work.

Semantics (the same in both implementations):

* Time advances from event to event. Events are op completions, transfer starts and transfer
  completions, ordered by (time, sequence number of their creation), so ties are reproducible.
* After all events at one instant are processed, every idle device (in device order) starts the
  ready op that comes first in program order. An op is ready when every in-edge has delivered.
* When an op finishes, each of its output tensors (slot) is sent once to every *other* device that has
  a consumer of it; transfers are created in the order of the op's out-edges. A transfer a -> b holds
  a's egress port, b's ingress port and every link direction on the route; each of these serves
  transfers one at a time in the order they became ready (a transfer reserves all of them at creation,
  starting when the last is free: FIFO, no overtaking). It takes ``latency + bytes / bandwidth``.
* Memory (live mode): an op's output is allocated on its device when it starts and freed when its
  last local consumer has finished and all its sends are done (at once at its end if it has no
  consumer); a received tensor is allocated on the receiver when the transfer starts and freed when
  its last consumer there has finished. In-place ops allocate nothing: their output *is* the tensor
  they write (their ``inplace_base``'s output, or its received copy; every input when the base is not
  known), so that tensor is held until the in-place op's own output is freed (its consumers and sends
  done), not merely until the in-place op finishes; chains of in-place ops hold it to the end of the
  chain. Persistent bytes are resident all along. In static mode a device holds the persistent bytes
  (footprints) of its ops and nothing else. Frees at an instant happen before the ops started at that instant allocate.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass

import numpy as np

from postplace.sim.problem import SimProblem

OP_DONE, XFER_START, XFER_DONE = 0, 1, 2


@dataclass
class Run:
    """One placement's simulation: summaries and the full schedule."""

    makespan: float
    busy: np.ndarray
    peak: np.ndarray
    bytes_moved: float
    op_start: np.ndarray
    op_end: np.ndarray
    transfers: list  # (src op, slot, from device, to device, bytes, start, end)


def simulate(p: SimProblem, dev: np.ndarray, memory_log: list | None = None) -> Run:
    """Simulate one placement; ``memory_log`` (a list) receives ``(time, device, bytes held)`` at every
    change of a device's memory, after the change (persistent bytes included)."""
    n, D = p.num_ops, p.num_devices
    dev = [int(x) for x in dev]
    pending = [int(x) for x in p.indegree]
    ready: list[list[int]] = [[] for _ in range(D)]
    running = [-1] * D
    events: list[tuple] = []
    seq = 0
    op_start = np.full(n, np.nan)
    op_end = np.full(n, np.nan)
    busy = np.zeros(D)
    res_free = [0.0] * p.num_resources

    resident = np.zeros(D)
    for i in range(n):
        resident[dev[i]] += p.persistent[i]
    live = [0.0] * D
    peak = resident.copy()
    local_rem = [0] * n
    for i in range(n):
        for e in range(p.out_ptr[i], p.out_ptr[i + 1]):
            if dev[int(p.edge_dst[e])] == dev[i]:
                local_rem[i] += 1
    send_rem = [0] * n
    freed = [False] * n
    transfers: list[list] = []  # [src, slot, a, b, bytes, start, end, consumers_left]
    xfer_of_edge = [-1] * p.edge_dst.shape[0]

    def note(d):
        if memory_log is not None:
            memory_log.append((t, d, float(resident[d] + live[d])))

    def alloc(d, nbytes):
        live[d] += nbytes
        note(d)
        if resident[d] + live[d] > peak[d]:
            peak[d] = resident[d] + live[d]

    def can_free(i):
        return not freed[i] and local_rem[i] == 0 and send_rem[i] == 0 and not np.isnan(op_end[i])

    def release(i):
        # free op i's output and, once nothing reads it any more, every tensor it wrote in place
        freed[i] = True
        stack = [i]
        while stack:
            j = stack.pop()
            live[dev[j]] -= p.alloc_bytes[j]
            note(dev[j])
            for k in range(p.in_ptr[j], p.in_ptr[j + 1]):
                e = int(p.in_edges[k])
                if not p.edge_alias[e]:
                    continue
                src = int(p.edge_src[e])
                if dev[src] == dev[j]:
                    local_rem[src] -= 1
                    if can_free(src):
                        freed[src] = True
                        stack.append(src)
                else:
                    x = transfers[xfer_of_edge[e]]
                    x[7] -= 1
                    if x[7] == 0:
                        live[dev[j]] -= x[4]
                        note(dev[j])

    def maybe_free_output(i):
        if can_free(i):
            release(i)

    for i in range(n):
        if pending[i] == 0:
            heapq.heappush(ready[dev[i]], i)

    t = 0.0
    while True:
        for d in range(D):
            if running[d] == -1 and ready[d]:
                i = heapq.heappop(ready[d])
                running[d] = i
                op_start[i] = t
                dur = p.op_time[i, d]
                busy[d] += dur
                alloc(d, p.alloc_bytes[i])
                heapq.heappush(events, (t + dur, seq, OP_DONE, i))
                seq += 1
        if not events:
            break
        t = events[0][0]
        while events and events[0][0] == t:
            _, _, kind, ident = heapq.heappop(events)
            if kind == OP_DONE:
                i = ident
                d = dev[i]
                running[d] = -1
                op_end[i] = t
                for k in range(p.in_ptr[i], p.in_ptr[i + 1]):
                    e = int(p.in_edges[k])
                    if p.edge_alias[e]:
                        continue  # the tensor i wrote in place is held until i's output is freed
                    src = int(p.edge_src[e])
                    if dev[src] == d:
                        local_rem[src] -= 1
                        maybe_free_output(src)
                    else:
                        x = transfers[xfer_of_edge[e]]
                        x[7] -= 1
                        if x[7] == 0 and p.live_mode:
                            live[d] -= x[4]
                            note(d)
                made: dict[tuple[int, int], int] = {}
                for e in range(p.out_ptr[i], p.out_ptr[i + 1]):
                    j = int(p.edge_dst[e])
                    b = dev[j]
                    if b == d:
                        pending[j] -= 1
                        if pending[j] == 0:
                            heapq.heappush(ready[d], j)
                        continue
                    key = (int(p.edge_slot[e]), b)
                    if key not in made:
                        nbytes = float(p.edge_bytes[e])
                        route = p.route_res[p.route_ptr[d * D + b] : p.route_ptr[d * D + b + 1]]
                        start = t
                        for r in route:
                            start = max(start, res_free[r])
                        end = start + (p.latency[d, b] + nbytes / p.bandwidth[d, b])
                        for r in route:
                            res_free[r] = end
                        made[key] = len(transfers)
                        transfers.append([i, key[0], d, b, nbytes, start, end, 0])
                        send_rem[i] += 1
                        if p.live_mode:  # a start event only matters for memory
                            heapq.heappush(events, (start, seq, XFER_START, made[key]))
                        heapq.heappush(events, (end, seq + 1, XFER_DONE, made[key]))
                        seq += 2
                    xfer_of_edge[e] = made[key]
                    transfers[made[key]][7] += 1
                maybe_free_output(i)
            elif kind == XFER_START:
                x = transfers[ident]
                if p.live_mode:
                    alloc(x[3], x[4])
            else:
                x = transfers[ident]
                src, slot, b = x[0], x[1], x[3]
                send_rem[src] -= 1
                maybe_free_output(src)
                for e in range(p.out_ptr[src], p.out_ptr[src + 1]):
                    j = int(p.edge_dst[e])
                    if dev[j] == b and int(p.edge_slot[e]) == slot:
                        pending[j] -= 1
                        if pending[j] == 0:
                            heapq.heappush(ready[b], j)

    makespan = float(np.max(op_end)) if n else 0.0
    moved = float(sum(x[4] for x in transfers))
    records = [tuple(x[:7]) for x in transfers]
    return Run(makespan, busy, peak, moved, op_start, op_end, records)
