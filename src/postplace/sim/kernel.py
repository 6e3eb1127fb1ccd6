"""The compiled simulation kernel: :mod:`postplace.sim.reference` line for line, on flat arrays.

Same semantics, same event order, same floating-point operations in the same order, so both give
bit-identical schedules (the tests check this on random graphs). Heaps are hand-written on arrays:
the event heap is keyed by (time, sequence number), the per-device ready heaps by op index.
"""

from __future__ import annotations

import numpy as np
from numba import njit

OP_DONE, XFER_START, XFER_DONE, COLL_START, COLL_DONE = 0, 1, 2, 3, 4


@njit(cache=True)
def _ev_push(t, s, kind, ident, size, time, sq, k, x):
    """Push an event; the heap is ordered by (time, sequence number)."""
    i = size
    while i > 0:
        parent = (i - 1) >> 1
        if time < t[parent] or (time == t[parent] and sq < s[parent]):
            t[i] = t[parent]
            s[i] = s[parent]
            kind[i] = kind[parent]
            ident[i] = ident[parent]
            i = parent
        else:
            break
    t[i] = time
    s[i] = sq
    kind[i] = k
    ident[i] = x
    return size + 1


@njit(cache=True)
def _ev_pop(t, s, kind, ident, size):
    """Remove the root (the caller read it first); returns the new size."""
    size -= 1
    time = t[size]
    sq = s[size]
    k = kind[size]
    x = ident[size]
    i = 0
    while True:
        child = 2 * i + 1
        if child >= size:
            break
        right = child + 1
        if right < size and (t[right] < t[child] or (t[right] == t[child] and s[right] < s[child])):
            child = right
        if t[child] < time or (t[child] == time and s[child] < sq):
            t[i] = t[child]
            s[i] = s[child]
            kind[i] = kind[child]
            ident[i] = ident[child]
            i = child
        else:
            break
    t[i] = time
    s[i] = sq
    kind[i] = k
    ident[i] = x
    return size


@njit(cache=True)
def _rq_push(heap, size, d, x):
    """Push op ``x`` on device ``d``'s ready heap (a min-heap of op indices)."""
    i = size[d]
    size[d] = i + 1
    while i > 0:
        parent = (i - 1) >> 1
        if x < heap[d, parent]:
            heap[d, i] = heap[d, parent]
            i = parent
        else:
            break
    heap[d, i] = x


@njit(cache=True)
def _rq_pop(heap, size, d):
    """Pop the lowest op index from device ``d``'s ready heap."""
    top = heap[d, 0]
    m = size[d] - 1
    size[d] = m
    x = heap[d, m]
    i = 0
    while True:
        child = 2 * i + 1
        if child >= m:
            break
        if child + 1 < m and heap[d, child + 1] < heap[d, child]:
            child += 1
        if heap[d, child] < x:
            heap[d, i] = heap[d, child]
            i = child
        else:
            break
    heap[d, i] = x
    return top


@njit(cache=True)
def _release(
    i,
    dev,
    alloc_bytes,
    live,
    freed,
    done,
    local_rem,
    send_rem,
    in_ptr,
    in_edges,
    edge_src,
    edge_alias,
    xfer_of_edge,
    x_left,
    x_bytes,
    stack,
):
    """Free op ``i``'s output and, once nothing reads them, the tensors it wrote in place."""
    freed[i] = True
    stack[0] = i
    top = 1
    while top > 0:
        top -= 1
        j = stack[top]
        live[dev[j]] -= alloc_bytes[j]
        for k in range(in_ptr[j], in_ptr[j + 1]):
            e = in_edges[k]
            if not edge_alias[e]:
                continue
            src = edge_src[e]
            if dev[src] == dev[j]:
                local_rem[src] -= 1
                if not freed[src] and local_rem[src] == 0 and send_rem[src] == 0 and done[src]:
                    freed[src] = True
                    stack[top] = src
                    top += 1
            else:
                x = xfer_of_edge[e]
                x_left[x] -= 1
                if x_left[x] == 0:
                    live[dev[j]] -= x_bytes[x]


@njit(cache=True)
def _arrive(
    c,
    t,
    seq,
    ev_n,
    ev_t,
    ev_s,
    ev_k,
    ev_id,
    coll_left,
    coll_ptr,
    coll_members,
    coll_seconds,
    coll_res_ptr,
    coll_res,
    res_free,
    coll_start,
    coll_end,
    op_start,
    live_mode,
):
    """A member of collective ``c`` has its inputs; the last one starts it. Returns (events, sequence)."""
    coll_left[c] -= 1
    if coll_left[c] != 0:
        return ev_n, seq
    start = t
    for r in range(coll_res_ptr[c], coll_res_ptr[c + 1]):
        start = max(start, res_free[coll_res[r]])
    end = start + coll_seconds[c]
    for r in range(coll_res_ptr[c], coll_res_ptr[c + 1]):
        res_free[coll_res[r]] = end
    coll_start[c] = start
    coll_end[c] = end
    for k in range(coll_ptr[c], coll_ptr[c + 1]):
        op_start[coll_members[k]] = start
    if live_mode:  # a start event only matters for memory
        ev_n = _ev_push(ev_t, ev_s, ev_k, ev_id, ev_n, start, seq, COLL_START, c)
    ev_n = _ev_push(ev_t, ev_s, ev_k, ev_id, ev_n, end, seq + 1, COLL_DONE, c)
    return ev_n, seq + 2


@njit(cache=True)
def make_work(n, n_edges, D, num_res, num_slots, num_coll):
    """Scratch arrays for :func:`run_one`, allocated once per batch (run_one resets what it uses)."""
    cap = n + 2 * n_edges + 2 * num_coll + 1
    work_a = (
        np.empty(n, dtype=np.int64),  # pending in-edges per op
        np.empty((D, n), dtype=np.int64),  # per-device ready heaps
        np.zeros(D, dtype=np.int64),  # their sizes
        np.full(D, -1, dtype=np.int64),  # op running on each device
        np.empty(cap),  # event heap: time,
        np.empty(cap, dtype=np.int64),  # sequence number,
        np.empty(cap, dtype=np.int8),  # kind,
        np.empty(cap, dtype=np.int64),  # op or transfer id
        np.zeros(num_res),  # when each port / link direction is next free
        np.zeros(D),  # resident bytes per device
        np.zeros(D),  # live bytes per device
    )
    work_b = (
        np.empty(n, dtype=np.int64),  # local consumers not yet finished, per op
        np.empty(n, dtype=np.int64),  # sends not yet finished, per op
        np.empty(n, dtype=np.bool_),  # output freed
        np.empty(n, dtype=np.bool_),  # op finished
        np.empty(n_edges, dtype=np.int64),  # consumers left per transfer
        np.empty(n_edges, dtype=np.int64),  # transfer carrying each edge
        np.empty(num_slots * D, dtype=np.int64),  # (slot, device) -> op that made that transfer
        np.empty(num_slots * D, dtype=np.int64),  # ... and its id
        np.empty(n, dtype=np.int64),  # stack of ops being freed (see _release)
        np.empty(num_coll, dtype=np.int64),  # members not yet arrived, per collective
    )
    return work_a, work_b


@njit(cache=True)
def run_one(
    dev,
    op_time,
    alloc_bytes,
    persistent,
    live_mode,
    out_ptr,
    edge_dst,
    edge_slot,
    edge_bytes,
    in_ptr,
    in_edges,
    edge_src,
    edge_alias,
    indegree,
    num_slots,
    latency,
    bandwidth,
    route_ptr,
    route_res,
    num_res,
    coll_of,
    coll_ptr,
    coll_members,
    coll_seconds,
    coll_res_ptr,
    coll_res,
    coll_wire,
    # outputs and scratch, sized by the caller (see make_work)
    busy,
    peak,
    op_start,
    op_end,
    coll_start,
    coll_end,
    x_src,
    x_slot,
    x_from,
    x_to,
    x_bytes,
    x_start,
    x_end,
    work_a,
    work_b,
):
    """Simulate one placement ``dev[n]``; returns (makespan, bytes moved, number of transfers).

    ``coll_seconds``, ``coll_res_ptr``/``coll_res`` and ``coll_wire`` are this placement's collective
    durations, held resources and wire bytes (:meth:`postplace.sim.SimProblem.collective_arrays`)."""
    n = dev.shape[0]
    D = busy.shape[0]
    C = coll_ptr.shape[0] - 1
    pending, rq, rq_size, running, ev_t, ev_s, ev_k, ev_id, res_free, resident, live = work_a
    local_rem, send_rem, freed, done, x_left, xfer_of_edge, made_stamp, made_id, stack, coll_left = work_b
    ev_n = 0
    seq = 0
    n_x = 0
    for d in range(D):
        busy[d] = 0.0
        rq_size[d] = 0
        running[d] = -1
        resident[d] = 0.0
        live[d] = 0.0
    for r in range(res_free.shape[0]):
        res_free[r] = 0.0
    for k in range(made_stamp.shape[0]):
        made_stamp[k] = -1
    for i in range(n):
        pending[i] = indegree[i]
        local_rem[i] = 0
        send_rem[i] = 0
        freed[i] = False
        done[i] = False
        resident[dev[i]] += persistent[i]
        op_start[i] = np.nan
        op_end[i] = np.nan
    for c in range(C):
        coll_left[c] = coll_ptr[c + 1] - coll_ptr[c]
        coll_start[c] = np.nan
        coll_end[c] = np.nan
    for d in range(D):
        peak[d] = resident[d]
    if live_mode:  # consumer counts only serve to free memory; static mode allocates nothing
        for i in range(n):
            for e in range(out_ptr[i], out_ptr[i + 1]):
                if dev[edge_dst[e]] == dev[i]:
                    local_rem[i] += 1
    one = np.empty(1, dtype=np.int64)  # an ended op as a list of one, as a collective's members are
    t = 0.0
    for i in range(n):
        if pending[i] == 0:
            if coll_of[i] >= 0:
                ev_n, seq = _arrive(
                    coll_of[i],
                    t,
                    seq,
                    ev_n,
                    ev_t,
                    ev_s,
                    ev_k,
                    ev_id,
                    coll_left,
                    coll_ptr,
                    coll_members,
                    coll_seconds,
                    coll_res_ptr,
                    coll_res,
                    res_free,
                    coll_start,
                    coll_end,
                    op_start,
                    live_mode,
                )
            else:
                _rq_push(rq, rq_size, dev[i], i)

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
            if kind == OP_DONE or kind == COLL_DONE:
                # an op ends, or every member of a collective does (in op order): the same handling
                if kind == OP_DONE:
                    running[dev[ident]] = -1
                    one[0] = ident
                    ops, m0, m1 = one, 0, 1
                else:
                    ops, m0, m1 = coll_members, coll_ptr[ident], coll_ptr[ident + 1]
                for mk in range(m0, m1):
                    i = ops[mk]
                    d = dev[i]
                    op_end[i] = t
                    done[i] = True
                    for k in range(in_ptr[i], in_ptr[i + 1] if live_mode else in_ptr[i]):
                        e = in_edges[k]
                        if edge_alias[e]:
                            continue  # the tensor i wrote in place is held until i's output is freed
                        src = edge_src[e]
                        if dev[src] == d:
                            local_rem[src] -= 1
                            if not freed[src] and local_rem[src] == 0 and send_rem[src] == 0 and done[src]:
                                _release(
                                    src,
                                    dev,
                                    alloc_bytes,
                                    live,
                                    freed,
                                    done,
                                    local_rem,
                                    send_rem,
                                    in_ptr,
                                    in_edges,
                                    edge_src,
                                    edge_alias,
                                    xfer_of_edge,
                                    x_left,
                                    x_bytes,
                                    stack,
                                )
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
                                if coll_of[j] >= 0:
                                    ev_n, seq = _arrive(
                                        coll_of[j],
                                        t,
                                        seq,
                                        ev_n,
                                        ev_t,
                                        ev_s,
                                        ev_k,
                                        ev_id,
                                        coll_left,
                                        coll_ptr,
                                        coll_members,
                                        coll_seconds,
                                        coll_res_ptr,
                                        coll_res,
                                        res_free,
                                        coll_start,
                                        coll_end,
                                        op_start,
                                        live_mode,
                                    )
                                else:
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
                            if live_mode:  # a start event only matters for memory
                                ev_n = _ev_push(ev_t, ev_s, ev_k, ev_id, ev_n, start, seq, XFER_START, n_x)
                            ev_n = _ev_push(ev_t, ev_s, ev_k, ev_id, ev_n, end, seq + 1, XFER_DONE, n_x)
                            seq += 2
                            n_x += 1
                        x = made_id[key]
                        xfer_of_edge[e] = x
                        x_left[x] += 1
                    if live_mode and not freed[i] and local_rem[i] == 0 and send_rem[i] == 0:
                        _release(
                            i,
                            dev,
                            alloc_bytes,
                            live,
                            freed,
                            done,
                            local_rem,
                            send_rem,
                            in_ptr,
                            in_edges,
                            edge_src,
                            edge_alias,
                            xfer_of_edge,
                            x_left,
                            x_bytes,
                            stack,
                        )
            elif kind == COLL_START:
                for mk in range(coll_ptr[ident], coll_ptr[ident + 1]):
                    i = coll_members[mk]
                    d = dev[i]
                    live[d] += alloc_bytes[i]
                    if resident[d] + live[d] > peak[d]:
                        peak[d] = resident[d] + live[d]
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
                    _release(
                        src,
                        dev,
                        alloc_bytes,
                        live,
                        freed,
                        done,
                        local_rem,
                        send_rem,
                        in_ptr,
                        in_edges,
                        edge_src,
                        edge_alias,
                        xfer_of_edge,
                        x_left,
                        x_bytes,
                        stack,
                    )
                for e in range(out_ptr[src], out_ptr[src + 1]):
                    j = edge_dst[e]
                    if dev[j] == b and edge_slot[e] == slot:
                        pending[j] -= 1
                        if pending[j] == 0:
                            if coll_of[j] >= 0:
                                ev_n, seq = _arrive(
                                    coll_of[j],
                                    t,
                                    seq,
                                    ev_n,
                                    ev_t,
                                    ev_s,
                                    ev_k,
                                    ev_id,
                                    coll_left,
                                    coll_ptr,
                                    coll_members,
                                    coll_seconds,
                                    coll_res_ptr,
                                    coll_res,
                                    res_free,
                                    coll_start,
                                    coll_end,
                                    op_start,
                                    live_mode,
                                )
                            else:
                                _rq_push(rq, rq_size, b, j)

    makespan = 0.0
    for i in range(n):
        if op_end[i] > makespan:
            makespan = op_end[i]
    moved = 0.0
    for x in range(n_x):
        moved += x_bytes[x]
    for c in range(C):
        moved += coll_wire[c]
    return makespan, moved, n_x


@njit(cache=True)
def run_batch(
    placements,
    op_time,
    alloc_bytes,
    persistent,
    live_mode,
    out_ptr,
    edge_dst,
    edge_slot,
    edge_bytes,
    in_ptr,
    in_edges,
    edge_src,
    edge_alias,
    indegree,
    num_slots,
    latency,
    bandwidth,
    route_ptr,
    route_res,
    num_res,
    coll_of,
    coll_ptr,
    coll_members,
    coll_seconds,
    coll_res_ptr,
    coll_res,
    coll_wire,
    makespan,
    busy,
    peak,
    moved,
):
    """Simulate every row of ``placements[m, n]`` (op-level device ids) into the output arrays.

    ``coll_seconds[m, C]``, ``coll_res_ptr[m, C + 1]``, ``coll_res[m, R]`` and ``coll_wire[m, C]``: each
    row's collective costs (see :func:`run_one`)."""
    m, n = placements.shape
    n_edges = edge_dst.shape[0]
    C = coll_ptr.shape[0] - 1
    work_a, work_b = make_work(n, n_edges, busy.shape[1], num_res, num_slots, C)
    op_start = np.empty(n)
    op_end = np.empty(n)
    coll_start = np.empty(C)
    coll_end = np.empty(C)
    x_src = np.empty(n_edges, dtype=np.int64)
    x_slot = np.empty(n_edges, dtype=np.int64)
    x_from = np.empty(n_edges, dtype=np.int64)
    x_to = np.empty(n_edges, dtype=np.int64)
    x_bytes = np.empty(n_edges)
    x_start = np.empty(n_edges)
    x_end = np.empty(n_edges)
    for r in range(m):
        ms, mv, _ = run_one(
            placements[r],
            op_time,
            alloc_bytes,
            persistent,
            live_mode,
            out_ptr,
            edge_dst,
            edge_slot,
            edge_bytes,
            in_ptr,
            in_edges,
            edge_src,
            edge_alias,
            indegree,
            num_slots,
            latency,
            bandwidth,
            route_ptr,
            route_res,
            num_res,
            coll_of,
            coll_ptr,
            coll_members,
            coll_seconds[r],
            coll_res_ptr[r],
            coll_res[r],
            coll_wire[r],
            busy[r],
            peak[r],
            op_start,
            op_end,
            coll_start,
            coll_end,
            x_src,
            x_slot,
            x_from,
            x_to,
            x_bytes,
            x_start,
            x_end,
            work_a,
            work_b,
        )
        makespan[r] = ms
        moved[r] = mv


@njit(cache=True)
def invalid_rows(placements, allowed_kinds, kind_bits, rep):
    """True for each row that names a device out of range, puts an op on a kind it may not use, or
    splits a colocation set (``rep[i]``: the first op of op i's set). One pass per row."""
    m, n = placements.shape
    D = kind_bits.shape[0]
    bad = np.zeros(m, dtype=np.bool_)
    for r in range(m):
        row = placements[r]
        for i in range(n):
            d = row[i]
            if d < 0 or d >= D or (allowed_kinds[i] & kind_bits[d]) == 0 or row[rep[i]] != d:
                bad[r] = True
                break
    return bad
