"""Route finding: the polynomial search equals enumerating every simple path, and scales."""

import numpy as np

from postplace.cluster.cluster import Cluster, Device, Link


def enumerate_routes(cluster):
    """The old rule by brute force: every simple path through switches, keyed by
    (-bottleneck, number of links, link numbers); returns {(a, b): (bottleneck, links, node list)}."""
    adj = {}
    for k, link in enumerate(cluster.links):
        adj.setdefault(link.a, []).append((link.b, k))
        adj.setdefault(link.b, []).append((link.a, k))
    names = cluster.device_names
    out = {}
    for a, src in enumerate(names):
        for b, dst in enumerate(names):
            if a == b:
                continue
            best = None
            stack = [(src, [], [src])]
            while stack:
                node, hops, nodes = stack.pop()
                for nxt, k in adj.get(node, []):
                    if nxt in nodes:
                        continue
                    if nxt == dst:
                        h = [*hops, k]
                        key = (-min(cluster.links[i].bandwidth for i in h), len(h), h, [*nodes, nxt])
                        best = key if best is None or key[:3] < best[:3] else best
                    elif nxt in cluster.switches:
                        stack.append((nxt, [*hops, k], [*nodes, nxt]))
            out[(a, b)] = best
    return out


def random_cluster(rng, n_dev, n_sw, n_links):
    devices = tuple(Device(f"d{i}", "gpu", "g", 1e12, 1e12, 1e9, 0.0) for i in range(n_dev))
    switches = tuple(f"s{i}" for i in range(n_sw))
    nodes = [d.name for d in devices] + list(switches)
    links = [Link(d.name, switches[rng.integers(n_sw)], 1.0, 0.0) for d in devices]  # connected via switches
    for i in range(1, n_sw):
        links.append(Link(switches[i], switches[rng.integers(i)], 1.0, 0.0))
    for _ in range(n_links):
        a, b = rng.choice(len(nodes), 2, replace=True)
        links.append(Link(nodes[a], nodes[b], 1.0, 0.0))
    bws = [1.0, 2.0, 4.0]  # few distinct values, so ties in width and length are common
    links = [Link(x.a, x.b, float(rng.choice(bws)), float(rng.integers(3)) * 1e-6) for x in links]
    order = rng.permutation(len(links))
    return Cluster("r", devices, switches, tuple(links[i] for i in order))


def test_routes_equal_the_enumeration_of_every_simple_path():
    rng = np.random.default_rng(0)
    for case in range(60):
        c = random_cluster(rng, int(rng.integers(2, 5)), int(rng.integers(1, 5)), int(rng.integers(0, 6)))
        want = enumerate_routes(c)
        D = c.num_devices
        for (a, b), (neg_bw, _, hops, nodes) in want.items():
            assert c.route(a, b) == nodes, (case, a, b)
            assert c.bandwidth[a, b] == -neg_bw
            assert c.latency[a, b] == sum(c.links[k].latency for k in hops)
            res = c.route_resources[c.route_ptr[a * D + b] : c.route_ptr[a * D + b + 1]]
            assert res[:2].tolist() == [a, D + b]
            assert [(r - 2 * D) // 2 for r in res[2:]] == hops


def test_a_wide_long_route_beats_a_narrow_short_one():
    devices = (Device("x", "gpu", "g", 1, 1, 1, 0.0), Device("y", "gpu", "g", 1, 1, 1, 0.0))
    links = (
        Link("x", "s1", 1.0, 0.0),
        Link("s1", "y", 1.0, 0.0),  # 2 links, 1 byte/s
        Link("x", "s2", 5.0, 0.0),
        Link("s2", "s3", 5.0, 0.0),
        Link("s3", "y", 5.0, 0.0),
    )
    c = Cluster("w", devices, ("s1", "s2", "s3"), links)
    assert c.route(0, 1) == ["x", "s2", "s3", "y"] and c.bandwidth[0, 1] == 5.0


def test_a_64_gpu_leaf_spine_gets_its_routes():
    # the enumeration of every simple path never finished on this one (5 x 10^7 paths per pair and
    # more); load times are measured in benchmarks/cluster_load.py, not asserted here
    spines, leaves, per_leaf = 4, 8, 8
    devices = tuple(Device(f"gpu{i}", "gpu", "g", 1e12, 1e12, 1e9, 0.0) for i in range(leaves * per_leaf))
    switches = tuple(f"spine{s}" for s in range(spines)) + tuple(f"leaf{f}" for f in range(leaves))
    links = [Link(f"gpu{i}", f"leaf{i // per_leaf}", 25e9, 1e-6) for i in range(leaves * per_leaf)]
    links += [Link(f"leaf{f}", f"spine{s}", 50e9, 1e-6) for f in range(leaves) for s in range(spines)]
    c = Cluster("ls", devices, switches, tuple(links))
    assert c.route(0, 63) == ["gpu0", "leaf0", "spine0", "leaf7", "gpu63"]  # lowest-numbered spine link
    assert c.route(0, 1) == ["gpu0", "leaf0", "gpu1"]
    assert c.bandwidth[0, 63] == 25e9 and c.latency[0, 63] == 4e-6


def quartic_best_routes(adj, switches, dnames, links):
    """The route finder before its per-destination searches shared their steps (D^3 and worse): per
    (destination, width) a scan of every pair, per step a scan of the node's every link. Kept as the
    reference the faster one must equal, route for route."""
    import heapq

    index = {n: i for i, n in enumerate(dnames)}
    width = {}
    for a, src in enumerate(dnames):
        best = {src: np.inf}
        heap = [(-np.inf, src)]
        while heap:
            neg, node = heapq.heappop(heap)
            if -neg < best.get(node, -1.0):
                continue
            if node != src and node not in switches:
                continue
            for nxt, k, _ in adj.get(node, ()):
                w = min(-neg, links[k].bandwidth)
                if w > best.get(nxt, -1.0):
                    best[nxt] = w
                    heapq.heappush(heap, (-w, nxt))
        for node, w in best.items():
            if node in index and node != src:
                width[(a, index[node])] = w
    out = {}
    for b, dst in enumerate(dnames):
        for w in sorted({w for (a, bb), w in width.items() if bb == b}):
            dist = {dst: 0}
            frontier = [dst]
            while frontier:
                nxt_frontier = []
                for node in frontier:
                    if node != dst and node not in switches:
                        continue
                    for nxt, k, _ in adj.get(node, ()):
                        if links[k].bandwidth >= w and nxt not in dist:
                            dist[nxt] = dist[node] + 1
                            nxt_frontier.append(nxt)
                frontier = nxt_frontier
            for (a, bb), wa in width.items():
                if bb != b or wa != w:
                    continue
                node, hops, nodes = dnames[a], [], [dnames[a]]
                while node != dst:
                    here = dist[node]
                    k, direction, node = min(
                        (k, direction, nxt)
                        for nxt, k, direction in adj[node]
                        if links[k].bandwidth >= w and dist.get(nxt) == here - 1 and (nxt == dst or nxt in switches)
                    )
                    hops.append((k, direction))
                    nodes.append(node)
                out[(a, b)] = (hops, nodes)
    return out


def route_arrays(c, finder, monkeypatch):
    """(bandwidth, latency, route_ptr, route_resources, paths) of ``c`` rebuilt with ``finder``."""
    from postplace.cluster import cluster as module

    with monkeypatch.context() as m:
        m.setattr(module, "_best_routes", finder)
        return Cluster(c.name, c.devices, c.switches, c.links)._routes


def hetero_cluster(rng, n_dev):
    """Two levels of switches with random bandwidths (many distinct widths per destination) and extra
    switch-to-switch links (many equally short routes)."""
    n_sw = max(2, n_dev // 4)
    devices = tuple(Device(f"gpu{i}", "gpu", "g", 1e12, 1e12, 1e9, 0.0) for i in range(n_dev))
    sw = tuple(f"s{i}" for i in range(n_sw))
    bw = lambda: float(rng.integers(1, 6)) * 1e9  # noqa: E731
    links = [Link(f"gpu{i}", sw[i % n_sw], bw(), 1e-6) for i in range(n_dev)]
    links += [Link(sw[i], sw[int(rng.integers(i))], bw(), 1e-6) for i in range(1, n_sw)]
    links += [Link(sw[int(a)], sw[int(b)], bw(), 1e-6) for a, b in rng.integers(n_sw, size=(n_sw, 2)) if a != b]
    return Cluster("hetero", devices, sw, tuple(links))


def test_routes_equal_the_previous_route_finder_on_presets_and_random_clusters(monkeypatch):
    from postplace.cluster import load_cluster

    rng = np.random.default_rng(3)
    presets = [load_cluster(p) for p in ("k80x2", "k80x4", "dgx8", "dgx8x2", "mixed", "h100")]
    clusters = presets + [
        random_cluster(rng, int(rng.integers(2, 8)), int(rng.integers(1, 7)), int(rng.integers(0, 12)))
        for _ in range(150)
    ]
    clusters += [hetero_cluster(rng, n) for n in (8, 16, 33)]
    from postplace.cluster.cluster import _best_routes

    for c in clusters:
        old, new = route_arrays(c, quartic_best_routes, monkeypatch), route_arrays(c, _best_routes, monkeypatch)
        for x, y in zip(old[:4], new[:4], strict=True):
            assert x.dtype == y.dtype and np.array_equal(x, y), c.name
        assert old[4] == new[4], c.name
        assert np.array_equal(c.route_resources, new[3])  # the module's own finder is the new one
    big = clusters[-1]  # several widths into one destination: one search per (destination, width)
    assert len({float(w) for w in big.bandwidth[:, 0] if np.isfinite(w)}) > 1
