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
  chain. Persistent bytes are resident all along; a parameter or buffer op's output is the tensor its
  persistent bytes hold, so it allocates nothing more. In static mode a device holds the persistent bytes
  (footprints) of its ops and nothing else. Frees at an instant happen before the ops started at that instant allocate.
* Collectives: a member op of a collective never runs on its device's queue and adds nothing to its
  busy time. When all its in-edges have delivered it has arrived; when the last member of the collective
  arrives, the collective is created: it holds every resource :func:`postplace.sim.collectives.collective_cost`
  names for its members' devices, starting when the last of them is free (FIFO with transfers, as a
  transfer does), for its duration. At its start every member's output is allocated on the member's
  device; at its end every member (in op order) finishes as an ordinary op finishing then: it frees its
  inputs, delivers to its local consumers and sends its outputs to consumers on other devices.
  Collective start and end events are ordered with the others by (time, sequence number).
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field

import numpy as np

from postplace.sim.problem import SimProblem

OP_DONE, XFER_START, XFER_DONE, COLL_START, COLL_DONE = 0, 1, 2, 3, 4


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
    collectives: list = field(default_factory=list)  # (collective, start, end, wire bytes) per collective


def simulate(p: SimProblem, dev: np.ndarray, memory_log: list | None = None) -> Run:
    """Simulate one placement; ``memory_log`` (a list) receives ``(time, device, bytes held)`` at every
    change of a device's memory, after the change (persistent bytes included)."""
    n, D, C = p.num_ops, p.num_devices, p.num_collectives
    c_sec, c_ptr, c_res, c_wire = (a[0] for a in p.collective_arrays(np.asarray(dev, dtype=np.int64)[None, :]))
    coll_left = np.diff(p.coll_ptr).tolist()
    coll_start = [np.nan] * C
    coll_end = [np.nan] * C
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

    def deliver(j, b):
        # one more input of op j is on its device b
        pending[j] -= 1
        if pending[j] == 0:
            if p.coll_of[j] >= 0:
                arrive(int(p.coll_of[j]))
            else:
                heapq.heappush(ready[b], j)

    def arrive(c):
        # a member of collective c has its inputs; the last one to arrive starts it
        nonlocal seq
        coll_left[c] -= 1
        if coll_left[c]:
            return
        held = c_res[c_ptr[c] : c_ptr[c + 1]]
        start = t
        for r in held:
            start = max(start, res_free[r])
        end = start + c_sec[c]
        for r in held:
            res_free[r] = end
        coll_start[c], coll_end[c] = start, end
        for i in p.collective_members(c):
            op_start[i] = start
        if p.live_mode:  # a start event only matters for memory
            heapq.heappush(events, (start, seq, COLL_START, c))
        heapq.heappush(events, (end, seq + 1, COLL_DONE, c))
        seq += 2

    def finish(i):
        # op i (run on its device, or a collective member) ends now
        nonlocal seq
        d = dev[i]
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
                deliver(j, d)
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

    t = 0.0
    for i in range(n):
        if pending[i] == 0:
            if p.coll_of[i] >= 0:
                arrive(int(p.coll_of[i]))
            else:
                heapq.heappush(ready[dev[i]], i)

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
                running[dev[ident]] = -1
                finish(ident)
            elif kind == COLL_DONE:
                for i in p.collective_members(ident):
                    finish(int(i))
            elif kind == COLL_START:
                for i in p.collective_members(ident):
                    alloc(dev[i], p.alloc_bytes[i])
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
                        deliver(j, b)

    makespan = float(np.max(op_end)) if n else 0.0
    moved = 0.0
    for x in transfers:
        moved += x[4]
    for c in range(C):
        moved += c_wire[c]
    records = [tuple(x[:7]) for x in transfers]
    colls = [(c, float(coll_start[c]), float(coll_end[c]), float(c_wire[c])) for c in range(C)]
    return Run(makespan, busy, peak, moved, op_start, op_end, records, colls)
