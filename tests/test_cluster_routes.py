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
    links = (Link("x", "s1", 1.0, 0.0), Link("s1", "y", 1.0, 0.0),  # 2 links, 1 byte/s
             Link("x", "s2", 5.0, 0.0), Link("s2", "s3", 5.0, 0.0), Link("s3", "y", 5.0, 0.0))  # fmt: skip
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
