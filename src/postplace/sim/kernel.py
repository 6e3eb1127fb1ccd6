"""The compiled simulation kernel: :mod:`postplace.sim.reference` line for line, on flat arrays.

Same semantics, same event order, same floating-point operations in the same order, so both give
bit-identical schedules (the tests check this on random graphs). Heaps are hand-written on arrays:
the event heap is keyed by (time, sequence number), the per-device ready heaps by op index.
"""

from __future__ import annotations

import numpy as np
from numba import njit

OP_DONE, XFER_START, XFER_DONE = 0, 1, 2


@njit(cache=True, inline="always")
def _ev_less(t, s, a, b):
    return t[a] < t[b] or (t[a] == t[b] and s[a] < s[b])


@njit(cache=True)
def _ev_push(t, s, kind, ident, size, time, sq, k, x):
    i = size
    t[i] = time
    s[i] = sq
    kind[i] = k
    ident[i] = x
    while i > 0:
        parent = (i - 1) >> 1
        if _ev_less(t, s, i, parent):
            t[i], t[parent] = t[parent], t[i]
            s[i], s[parent] = s[parent], s[i]
            kind[i], kind[parent] = kind[parent], kind[i]
            ident[i], ident[parent] = ident[parent], ident[i]
            i = parent
        else:
            break
    return size + 1


@njit(cache=True)
def _ev_pop(t, s, kind, ident, size):
    """Remove the root (the caller read it first); returns the new size."""
    size -= 1
    t[0] = t[size]
    s[0] = s[size]
    kind[0] = kind[size]
    ident[0] = ident[size]
    i = 0
    while True:
        left = 2 * i + 1
        if left >= size:
            break
        child = left
        if left + 1 < size and _ev_less(t, s, left + 1, left):
            child = left + 1
        if _ev_less(t, s, child, i):
            t[i], t[child] = t[child], t[i]
            s[i], s[child] = s[child], s[i]
            kind[i], kind[child] = kind[child], kind[i]
            ident[i], ident[child] = ident[child], ident[i]
            i = child
        else:
            break
    return size


@njit(cache=True)
def _rq_push(heap, size, d, x):
    i = size[d]
    heap[d, i] = x
    size[d] = i + 1
    while i > 0:
        parent = (i - 1) >> 1
        if heap[d, i] < heap[d, parent]:
            heap[d, i], heap[d, parent] = heap[d, parent], heap[d, i]
            i = parent
        else:
            break


@njit(cache=True)
def _rq_pop(heap, size, d):
    top = heap[d, 0]
    m = size[d] - 1
    size[d] = m
    heap[d, 0] = heap[d, m]
    i = 0
    while True:
        left = 2 * i + 1
        if left >= m:
            break
        child = left
        if left + 1 < m and heap[d, left + 1] < heap[d, left]:
            child = left + 1
        if heap[d, child] < heap[d, i]:
            heap[d, i], heap[d, child] = heap[d, child], heap[d, i]
            i = child
        else:
            break
    return top


@njit(cache=True)
def run_one(
    dev, op_time, alloc_bytes, persistent, live_mode,
    out_ptr, edge_dst, edge_slot, edge_bytes, in_ptr, in_edges, edge_src, indegree, num_slots,
    latency, bandwidth, route_ptr, route_res, num_res,
    # scratch and outputs, sized by the caller
    busy, peak, op_start, op_end,
    x_src, x_slot, x_from, x_to, x_bytes, x_start, x_end,
):  # fmt: skip
    """Simulate one placement ``dev[n]``; returns (makespan, bytes moved, number of transfers)."""
    n = dev.shape[0]
    D = busy.shape[0]
    n_edges = edge_dst.shape[0]
    pending = indegree.copy()
    rq = np.empty((D, n), dtype=np.int64)
    rq_size = np.zeros(D, dtype=np.int64)
    running = np.full(D, -1, dtype=np.int64)
    cap = n + 2 * n_edges + 1
    ev_t = np.empty(cap)
    ev_s = np.empty(cap, dtype=np.int64)
    ev_k = np.empty(cap, dtype=np.int8)
    ev_id = np.empty(cap, dtype=np.int64)
    ev_n = 0
    seq = 0
    res_free = np.zeros(num_res)
    resident = np.zeros(D)
    live = np.zeros(D)
    local_rem = np.zeros(n, dtype=np.int64)
    send_rem = np.zeros(n, dtype=np.int64)
    freed = np.zeros(n, dtype=np.bool_)
    done = np.zeros(n, dtype=np.bool_)
    x_left = np.zeros(n_edges, dtype=np.int64)
    xfer_of_edge = np.full(n_edges, -1, dtype=np.int64)
    made_stamp = np.full(num_slots * D, -1, dtype=np.int64)
    made_id = np.empty(num_slots * D, dtype=np.int64)
    n_x = 0

    for d in range(D):
        busy[d] = 0.0
    for i in range(n):
        resident[dev[i]] += persistent[i]
        op_start[i] = np.nan
        op_end[i] = np.nan
    for d in range(D):
        peak[d] = resident[d]
    for i in range(n):
        for e in range(out_ptr[i], out_ptr[i + 1]):
            if dev[edge_dst[e]] == dev[i]:
                local_rem[i] += 1
    for i in range(n):
        if pending[i] == 0:
            _rq_push(rq, rq_size, dev[i], i)

    t = 0.0
    while True:
        for d in range(D):
            if running[d] == -1 and rq_size[d] > 0:
                i = _rq_pop(rq, rq_size, d)
                running[d] = i
                op_start[i] = t
                dur = op_time[i, d]
                busy[d] += dur
                live[d] += alloc_bytes[i]
                if resident[d] + live[d] > peak[d]:
                    peak[d] = resident[d] + live[d]
                ev_n = _ev_push(ev_t, ev_s, ev_k, ev_id, ev_n, t + dur, seq, OP_DONE, i)
                seq += 1
        if ev_n == 0:
            break
        t = ev_t[0]
        while ev_n > 0 and ev_t[0] == t:
            kind = ev_k[0]
            ident = ev_id[0]
            ev_n = _ev_pop(ev_t, ev_s, ev_k, ev_id, ev_n)
            if kind == OP_DONE:
                i = ident
                d = dev[i]
                running[d] = -1
                op_end[i] = t
                done[i] = True
                for k in range(in_ptr[i], in_ptr[i + 1]):
                    e = in_edges[k]
                    src = edge_src[e]
                    if dev[src] == d:
                        local_rem[src] -= 1
                        if not freed[src] and local_rem[src] == 0 and send_rem[src] == 0 and done[src]:
                            freed[src] = True
                            live[dev[src]] -= alloc_bytes[src]
                    else:
                        x = xfer_of_edge[e]
                        x_left[x] -= 1
                        if x_left[x] == 0 and live_mode:
                            live[d] -= x_bytes[x]
                for e in range(out_ptr[i], out_ptr[i + 1]):
                    j = edge_dst[e]
                    b = dev[j]
                    if b == d:
                        pending[j] -= 1
                        if pending[j] == 0:
                            _rq_push(rq, rq_size, d, j)
                        continue
                    key = edge_slot[e] * D + b
                    if made_stamp[key] != i:
                        nbytes = edge_bytes[e]
                        r0 = route_ptr[d * D + b]
                        r1 = route_ptr[d * D + b + 1]
                        start = t
                        for r in range(r0, r1):
                            start = max(start, res_free[route_res[r]])
                        end = start + (latency[d, b] + nbytes / bandwidth[d, b])
                        for r in range(r0, r1):
                            res_free[route_res[r]] = end
                        made_stamp[key] = i
                        made_id[key] = n_x
                        x_src[n_x] = i
                        x_slot[n_x] = edge_slot[e]
                        x_from[n_x] = d
                        x_to[n_x] = b
                        x_bytes[n_x] = nbytes
                        x_start[n_x] = start
                        x_end[n_x] = end
                        x_left[n_x] = 0
                        send_rem[i] += 1
                        ev_n = _ev_push(ev_t, ev_s, ev_k, ev_id, ev_n, start, seq, XFER_START, n_x)
                        ev_n = _ev_push(ev_t, ev_s, ev_k, ev_id, ev_n, end, seq + 1, XFER_DONE, n_x)
                        seq += 2
                        n_x += 1
                    x = made_id[key]
                    xfer_of_edge[e] = x
                    x_left[x] += 1
                if not freed[i] and local_rem[i] == 0 and send_rem[i] == 0:
                    freed[i] = True
                    live[d] -= alloc_bytes[i]
            elif kind == XFER_START:
                if live_mode:
                    b = x_to[ident]
                    live[b] += x_bytes[ident]
                    if resident[b] + live[b] > peak[b]:
                        peak[b] = resident[b] + live[b]
            else:
                src = x_src[ident]
                slot = x_slot[ident]
                b = x_to[ident]
                send_rem[src] -= 1
                if not freed[src] and local_rem[src] == 0 and send_rem[src] == 0 and done[src]:
                    freed[src] = True
                    live[dev[src]] -= alloc_bytes[src]
                for e in range(out_ptr[src], out_ptr[src + 1]):
                    j = edge_dst[e]
                    if dev[j] == b and edge_slot[e] == slot:
                        pending[j] -= 1
                        if pending[j] == 0:
                            _rq_push(rq, rq_size, b, j)

    makespan = 0.0
    for i in range(n):
        if op_end[i] > makespan:
            makespan = op_end[i]
    moved = 0.0
    for x in range(n_x):
        moved += x_bytes[x]
    return makespan, moved, n_x


@njit(cache=True)
def run_batch(
    placements, op_time, alloc_bytes, persistent, live_mode,
    out_ptr, edge_dst, edge_slot, edge_bytes, in_ptr, in_edges, edge_src, indegree, num_slots,
    latency, bandwidth, route_ptr, route_res, num_res,
    makespan, busy, peak, moved,
):  # fmt: skip
    """Simulate every row of ``placements[m, n]`` (op-level device ids) into the output arrays."""
    m, n = placements.shape
    n_edges = edge_dst.shape[0]
    op_start = np.empty(n)
    op_end = np.empty(n)
    x_src = np.empty(n_edges, dtype=np.int64)
    x_slot = np.empty(n_edges, dtype=np.int64)
    x_from = np.empty(n_edges, dtype=np.int64)
    x_to = np.empty(n_edges, dtype=np.int64)
    x_bytes = np.empty(n_edges)
    x_start = np.empty(n_edges)
    x_end = np.empty(n_edges)
    for r in range(m):
        ms, mv, _ = run_one(
            placements[r], op_time, alloc_bytes, persistent, live_mode,
            out_ptr, edge_dst, edge_slot, edge_bytes, in_ptr, in_edges, edge_src, indegree, num_slots,
            latency, bandwidth, route_ptr, route_res, num_res,
            busy[r], peak[r], op_start, op_end,
            x_src, x_slot, x_from, x_to, x_bytes, x_start, x_end,
        )  # fmt: skip
        makespan[r] = ms
        moved[r] = mv
