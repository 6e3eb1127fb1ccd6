"""Cluster: devices and the interconnect that moves tensors between them.

A cluster file (TOML) lists ``[[device]]`` entries, optional ``[[switch]]`` entries (PCIe switches,
host bridges, NVSwitch fabrics: nodes that forward but compute nothing) and ``[[link]]`` entries
joining two nodes. Every link is full duplex: each direction is a separate resource that carries one
transfer at a time. Every device also has one egress and one ingress port (its copy engines).

The route between two devices is the path through switches (devices never forward) with the widest
bottleneck, then the fewest links, then the lowest link numbers, so it is unique and stable. A
transfer from ``a`` to ``b`` takes ``sum of link latencies + bytes / bottleneck bandwidth`` and holds
``a``'s egress port, ``b``'s ingress port and every link direction on the route for that time.
"""

from __future__ import annotations

import heapq
import tomllib
from dataclasses import dataclass
from functools import cached_property
from importlib import resources
from pathlib import Path

import numpy as np

from postplace import validate as v
from postplace.errors import PostplaceError
from postplace.graph.opgraph import DEVICE_KINDS, KIND_BITS, PRECISIONS

#: The optional per-precision peak fields of a device (``peak_flops`` itself is the FP32 peak).
PRECISION_PEAK_FIELDS = {"bf16": "peak_flops_bf16", "fp16": "peak_flops_fp16"}


@dataclass(frozen=True)
class Device:
    """One compute device. ``memory`` is the usable capacity: the spec figure minus ``reserve``.

    Parameters
    ----------
    name : str
        Its unique name in the cluster (``cpu``, ``gpu0``...).
    kind : {"cpu", "gpu"}
        Its kind, one of :data:`postplace.graph.DEVICE_KINDS`.
    model : str
        The hardware model (``"K80"``), the key measured op times are looked up by.
    peak_flops : float
        The FP32 peak (FLOP/s).
    memory_bandwidth : float
        Bytes/s of its memory.
    memory : float
        Usable bytes: a cluster file's ``memory`` minus its ``reserve``.
    launch_overhead : float
        Seconds added to every op run on it (kernel launch, framework dispatch).
    peak_flops_bf16, peak_flops_fp16 : float, optional
        The peaks for ops computed in bf16 and fp16 (dense tensor-core rates on GPUs that have them),
        or None where the device cannot compute in that precision at all (no such units and no
        emulation worth pricing): a graph with ops in it cannot be priced there.
    """

    name: str
    kind: str
    model: str
    peak_flops: float
    memory_bandwidth: float
    memory: float
    launch_overhead: float
    peak_flops_bf16: float | None = None
    peak_flops_fp16: float | None = None

    @property
    def kind_bit(self) -> int:
        """Its kind's bit in an op's ``allowed_kinds`` mask (1 cpu, 2 gpu)."""
        return KIND_BITS[self.kind]

    def peak_for(self, precision: str) -> float | None:
        """Peak FLOP/s for ops computed in ``precision``; None if the device has no figure for it.

        Parameters
        ----------
        precision : {"fp32", "bf16", "fp16"}
            A name from :data:`postplace.graph.opgraph.PRECISIONS`.

        Returns
        -------
        float or None

        Raises
        ------
        PostplaceError
            For an unknown precision.
        """
        if precision == "fp32":
            return self.peak_flops
        if precision not in PRECISION_PEAK_FIELDS:
            raise PostplaceError(f"unknown precision '{precision}'; use one of {PRECISIONS}")
        return getattr(self, PRECISION_PEAK_FIELDS[precision])


@dataclass(frozen=True)
class Link:
    """One full-duplex link between two nodes (devices or switches); each direction is its own resource.

    Parameters
    ----------
    a, b : str
        The names of the nodes it joins.
    bandwidth : float
        Bytes/s in each direction.
    latency : float
        Seconds added to every transfer that crosses it.
    """

    a: str
    b: str
    bandwidth: float
    latency: float


@dataclass(frozen=True, eq=False)
class Cluster:
    """Devices (``cpu``, ``gpu0``, ...), switches and links, with routes precomputed as arrays.

    Load one with :func:`load_cluster` (a preset or a TOML file) or build one from its parts; it is
    checked on construction, and the routes between every pair of devices are computed then.

    Parameters
    ----------
    name : str
        The cluster's name.
    devices : tuple of Device
        At least one; device ``k`` is device id ``k`` of a placement.
    switches : tuple of str
        Names of nodes that forward transfers but compute nothing (PCIe switches, NVSwitch fabrics).
    links : tuple of Link
        The links joining devices and switches.
    description : str
        Free text.

    Raises
    ------
    PostplaceError
        When there is no device, a name is used twice, a device has an unknown kind or a figure that is
        not a positive number, a link names an unknown node or has no positive bandwidth, or two
        devices have no route between them.

    Examples
    --------
    >>> from postplace.cluster import Cluster, Device, Link
    >>> gpu = dict(kind="gpu", model="T", peak_flops=1e12, memory_bandwidth=1e11, memory=8e9, launch_overhead=0.0)
    >>> c = Cluster("two", (Device("gpu0", **gpu), Device("gpu1", **gpu)), (), (Link("gpu0", "gpu1", 1e9, 1e-6),))
    >>> c.device_names, c.transfer_time(1e6, 0, 1)
    (('gpu0', 'gpu1'), 0.001001)
    """

    name: str
    devices: tuple[Device, ...]
    switches: tuple[str, ...]
    links: tuple[Link, ...]
    description: str = ""

    def __post_init__(self):
        where = f"cluster '{self.name}'"
        if not self.devices:
            raise PostplaceError(f"{where}: no [[device]] entries; a cluster needs at least one device")
        names = [d.name for d in self.devices] + list(self.switches)
        dup = {n for n in names if names.count(n) > 1}
        if dup:
            name = sorted(dup)[0]
            raise PostplaceError(f"{where}: name '{name}' is used twice; device and switch names must be unique")
        for d in self.devices:
            if d.kind not in DEVICE_KINDS:
                raise PostplaceError(f"{where}: device '{d.name}' has kind '{d.kind}'; use one of {DEVICE_KINDS}")
            optional = [f for f in PRECISION_PEAK_FIELDS.values() if getattr(d, f) is not None]
            for f in ("peak_flops", "memory_bandwidth", "memory", *optional):
                val = getattr(d, f)
                if not _positive_number(val):
                    what = "usable memory (memory - reserve)" if f == "memory" else f"field '{f}'"
                    need = "positive" if _number(val) else "a positive number"
                    raise PostplaceError(f"{where}: device '{d.name}' {what} is {val!r}; it must be {need}")
            if not np.isfinite(d.launch_overhead) or d.launch_overhead < 0:
                raise PostplaceError(f"{where}: device '{d.name}' field 'launch_overhead' must be >= 0")
        for link in self.links:
            for end in (link.a, link.b):
                if end not in names:
                    raise PostplaceError(f"{where}: a link names '{end}', which is neither a device nor a switch")
            if not np.isfinite(link.bandwidth) or link.bandwidth <= 0 or not (0 <= link.latency < np.inf):
                raise PostplaceError(f"{where}: link {link.a} - {link.b} needs bandwidth > 0 and latency >= 0")
        self._routes  # noqa: B018  (computes routes now so a disconnected cluster fails at load)

    # ------------------------------------------------------------------------------ views
    def __repr__(self) -> str:
        devs = ", ".join(f"{d.name} ({d.model}, {d.memory / 1e9:.3g} GB)" for d in self.devices)
        return f"Cluster({self.name!r}: {devs}; {len(self.links)} links)"

    @property
    def num_devices(self) -> int:
        """The number of devices (switches are not devices)."""
        return len(self.devices)

    @cached_property
    def device_names(self) -> tuple[str, ...]:
        """The devices' names, in device id order."""
        return tuple(d.name for d in self.devices)

    def device_index(self, name: str) -> int:
        """The device id of the device called ``name``.

        Parameters
        ----------
        name : str

        Returns
        -------
        int

        Raises
        ------
        PostplaceError
            When the cluster has no such device.
        """
        try:
            return self.device_names.index(name)
        except ValueError:
            raise PostplaceError(
                f"cluster '{self.name}' has no device '{name}'; its devices are {', '.join(self.device_names)}"
            ) from None

    @cached_property
    def kind_bits(self) -> np.ndarray:
        """Each device's kind bit (``uint8[D]``), to test against an op's ``allowed_kinds``."""
        return np.array([d.kind_bit for d in self.devices], dtype=np.uint8)

    @cached_property
    def capacity(self) -> np.ndarray:
        """Usable memory per device in bytes (``float64[D]``)."""
        return np.array([d.memory for d in self.devices], dtype=np.float64)

    @property
    def num_resources(self) -> int:
        """Egress ports (0..D-1), ingress ports (D..2D-1), then two directions per link."""
        return 2 * self.num_devices + 2 * len(self.links)

    @property
    def bandwidth(self) -> np.ndarray:
        """Bottleneck bandwidth of the route a -> b in bytes/s (inf on the diagonal)."""
        return self._routes[0]

    @property
    def latency(self) -> np.ndarray:
        """Summed link latency of the route a -> b in seconds (0 on the diagonal)."""
        return self._routes[1]

    @property
    def route_ptr(self) -> np.ndarray:
        """CSR pointer over pairs ``a * D + b`` into :attr:`route_resources`."""
        return self._routes[2]

    @property
    def route_resources(self) -> np.ndarray:
        """Resource ids held by a transfer a -> b: egress(a), ingress(b), then the route's link directions."""
        return self._routes[3]

    def route(self, a: int, b: int) -> list[str]:
        """The nodes a transfer from device ``a`` to device ``b`` passes through, ends included.

        Parameters
        ----------
        a, b : int
            Device ids.

        Returns
        -------
        list of str
            Node names (devices and switches), from ``a`` to ``b``.
        """
        return self._paths[(a, b)]

    def transfer_time(self, nbytes: float, a: int, b: int) -> float:
        """Seconds to move ``nbytes`` from device ``a`` to device ``b`` with the route to itself.

        The route's summed link latency plus ``nbytes`` over its bottleneck bandwidth; 0 when ``a == b``.

        Parameters
        ----------
        nbytes : float
        a, b : int
            Device ids.

        Returns
        -------
        float
        """
        if a == b:
            return 0.0
        return float(self.latency[a, b] + nbytes / self.bandwidth[a, b])

    # ------------------------------------------------------------------------------ routing
    @cached_property
    def _paths(self) -> dict[tuple[int, int], list[str]]:
        return self._routes[4]

    @cached_property
    def _routes(self):
        dnames = self.device_names
        switches = set(self.switches)
        adj: dict[str, list[tuple[str, int, int]]] = {}
        for k, link in enumerate(self.links):
            adj.setdefault(link.a, []).append((link.b, k, 0))
            adj.setdefault(link.b, []).append((link.a, k, 1))
        D = len(dnames)
        bw = np.full((D, D), np.inf)
        lat = np.zeros((D, D))
        ptr = [0]
        res: list[int] = []
        paths: dict[tuple[int, int], list[str]] = {}
        hops_of = _best_routes(adj, switches, dnames, self.links)
        for a in range(D):
            for b in range(D):
                if a != b:
                    if (a, b) not in hops_of:
                        raise PostplaceError(
                            f"cluster '{self.name}': no route from {dnames[a]} to {dnames[b]}; "
                            "add a [[link]] that connects them (through switches)"
                        )
                    hops, nodes = hops_of[(a, b)]
                    bw[a, b] = min(self.links[k].bandwidth for k, _ in hops)
                    lat[a, b] = sum(self.links[k].latency for k, _ in hops)
                    res.extend([a, D + b] + [2 * D + 2 * k + direction for k, direction in hops])
                    paths[(a, b)] = nodes
                else:
                    paths[(a, b)] = [dnames[a]]
                ptr.append(len(res))
        return bw, lat, np.array(ptr, dtype=np.int64), np.array(res, dtype=np.int64), paths

    # ------------------------------------------------------------------------------ loading
    @classmethod
    def from_toml(cls, path: str | Path) -> Cluster:
        """Read a cluster TOML file (see :meth:`from_toml_text`).

        Parameters
        ----------
        path : str or path

        Returns
        -------
        Cluster

        Raises
        ------
        PostplaceError
            When the file cannot be read or is not a valid cluster.
        """
        return cls.from_toml_text(v.read_text(path, "cluster file"), source=str(path))

    @classmethod
    def from_toml_text(cls, text: str, *, source: str = "cluster") -> Cluster:
        """Parse a cluster TOML strictly: numbers are finite numbers, names strings, tables complete.

        ``nan``, ``inf``, strings and booleans are errors where a number is needed, and every table has
        the fields it needs.

        Parameters
        ----------
        text : str
            TOML with ``[[device]]`` (``name`` or ``names``, ``kind``, ``peak_flops``,
            ``memory_bandwidth``, ``memory``; optional ``model``, ``reserve``, ``launch_overhead``,
            ``peak_flops_bf16``, ``peak_flops_fp16``), optional ``[[switch]]`` (``name``) and
            ``[[link]]`` (``a``, ``b``, ``bandwidth``; optional ``latency``) entries, and optional
            ``name`` and ``description``.
        source : str
            What the errors call the text (a file name); also the default name (its stem).

        Returns
        -------
        Cluster

        Raises
        ------
        PostplaceError
            One line naming the entry and field at fault.
        """
        try:
            d = tomllib.loads(text)
        except tomllib.TOMLDecodeError as exc:
            raise PostplaceError(f"{source}: not valid TOML ({exc})") from None
        except RecursionError:
            raise PostplaceError(f"{source}: TOML nested too deeply to read") from None

        def tables(key):
            val = d.get(key, [])
            if not isinstance(val, list) or not all(isinstance(e, dict) for e in val):
                raise PostplaceError(f"{source}: '{key}' must be a list of tables: write [[{key}]] entries")
            return val

        def num(entry, key, where, default=None, **kw):
            if key not in entry:
                if default is None:
                    raise PostplaceError(f"{where} has no field '{key}'; add it")
                return default
            return v.number(entry[key], f"{where} field '{key}'", **kw)

        devices = []
        precision_fields = PRECISION_PEAK_FIELDS.values()  # optional: a device without one has no such units
        for k, entry in enumerate(tables("device")):
            where = f"{source}: device[{k}]"
            if "names" in entry:
                names = entry["names"]
                if not isinstance(names, list) or not names:
                    raise PostplaceError(f"{where} field 'names' must be a non-empty list of strings")
            elif "name" in entry:
                names = [entry["name"]]
            else:
                raise PostplaceError(f"{where} needs a 'name' (or a 'names' list)")
            for j, name in enumerate(names):
                v.string(name, f"{where} name" if "names" not in entry else f"{where} names[{j}]")
            kind = v.string(entry.get("kind"), f"{where} field 'kind'") if "kind" in entry else None
            if kind is None:
                raise PostplaceError(f"{where} ('{names[0]}') has no field 'kind'; add it")
            model = v.string(entry.get("model", kind), f"{where} field 'model'")
            spec_memory = num(entry, "memory", where, positive=True)
            reserve = num(entry, "reserve", where, 0.0, minimum=0.0)
            for name in names:
                devices.append(
                    Device(
                        name=name,
                        kind=kind,
                        model=model,
                        peak_flops=num(entry, "peak_flops", where, positive=True),
                        memory_bandwidth=num(entry, "memory_bandwidth", where, positive=True),
                        memory=spec_memory - reserve,
                        launch_overhead=num(entry, "launch_overhead", where, 0.0, minimum=0.0),
                        **{f: num(entry, f, where, positive=True) for f in precision_fields if f in entry},
                    )
                )
        switches = []
        for k, entry in enumerate(tables("switch")):
            if "name" not in entry:
                raise PostplaceError(f"{source}: switch[{k}] needs a 'name'")
            switches.append(v.string(entry["name"], f"{source}: switch[{k}] name"))
        links = []
        for k, entry in enumerate(tables("link")):
            where = f"{source}: link[{k}]"
            for end in ("a", "b"):
                if end not in entry:
                    raise PostplaceError(f"{where} has no field '{end}'; add it")
            links.append(
                Link(
                    v.string(entry["a"], f"{where} field 'a'"),
                    v.string(entry["b"], f"{where} field 'b'"),
                    num(entry, "bandwidth", where, positive=True),
                    num(entry, "latency", where, 0.0, minimum=0.0),
                )
            )
        return cls(
            name=v.string(d.get("name", Path(source).stem), f"{source}: field 'name'"),
            devices=tuple(devices),
            switches=tuple(switches),
            links=tuple(links),
            description=v.string(d.get("description", ""), f"{source}: field 'description'"),
        )


def _number(x) -> bool:
    return isinstance(x, int | float | np.number) and not isinstance(x, bool | np.bool_)


def _positive_number(x) -> bool:
    return _number(x) and bool(np.isfinite(x)) and x > 0


def _best_routes(adj, switches, dnames, links) -> dict[tuple[int, int], tuple[list[tuple[int, int]], list[str]]]:
    """Per device pair (a, b): the widest, then shortest, then lowest-numbered path through switches.

    The same rule as comparing every simple path by (-bottleneck, number of links, link numbers), in
    polynomial time: the widest bottleneck W from each device by a max-min Dijkstra; then, per
    destination b and per width W of the pairs that end at b, on the links of bandwidth >= W only (every
    path there from a source of width W has bottleneck exactly W), one breadth-first search back from b
    gives each node's distance to b; walking from a, the lowest-numbered link that steps one closer gives
    the lexicographically smallest shortest path. A node's step is found once per search and shared by
    every walk through it, so the pairs cost their path lengths: O(D E log V) for the widths, one
    O(V + E) search per (destination, distinct width), and O(D^2 x path length) for the walks (before,
    each (destination, width) scanned all D^2 pairs and each step scanned a switch's every link: D^3
    and worse). Returns ``(hops, nodes)`` with hops as (link number, direction) and nodes ends
    included; unreachable pairs are left out.
    """
    index = {n: i for i, n in enumerate(dnames)}
    bandwidth = [link.bandwidth for link in links]
    sources: dict[int, dict[float, list[int]]] = {}  # destination -> width -> the sources of that width
    for a, src in enumerate(dnames):  # max-min Dijkstra; only the source and switches forward
        best = {src: np.inf}
        heap = [(-np.inf, src)]
        while heap:
            neg, node = heapq.heappop(heap)
            if -neg < best.get(node, -1.0):
                continue
            if node != src and node not in switches:
                continue
            for nxt, k, _ in adj.get(node, ()):
                w = min(-neg, bandwidth[k])
                if w > best.get(nxt, -1.0):
                    best[nxt] = w
                    heapq.heappush(heap, (-w, nxt))
        for node, w in best.items():
            if node in index and node != src:
                sources.setdefault(index[node], {}).setdefault(w, []).append(a)
    out = {}
    for b, dst in enumerate(dnames):
        for w, starts in sources.get(b, {}).items():
            dist = {dst: 0}  # BFS back from dst over links of bandwidth >= w
            frontier = [dst]
            while frontier:
                nxt_frontier = []
                for node in frontier:
                    if node != dst and node not in switches:
                        continue
                    for nxt, k, _ in adj.get(node, ()):
                        if bandwidth[k] >= w and nxt not in dist:
                            dist[nxt] = dist[node] + 1
                            nxt_frontier.append(nxt)
                frontier = nxt_frontier
            step: dict[str, tuple[int, int, str]] = {}  # node -> (link, direction, next node) towards dst
            for a in starts:
                node, hops, nodes = dnames[a], [], [dnames[a]]
                while node != dst:
                    s = step.get(node)
                    if s is None:
                        here = dist[node]
                        s = step[node] = min(
                            (k, direction, nxt)
                            for nxt, k, direction in adj[node]
                            if bandwidth[k] >= w and dist.get(nxt) == here - 1 and (nxt == dst or nxt in switches)
                        )
                    k, direction, node = s
                    hops.append((k, direction))
                    nodes.append(node)
                out[(a, b)] = (hops, nodes)
    return out


# ---------------------------------------------------------------------------------- presets
def preset_names() -> list[str]:
    """The names of the shipped cluster presets, sorted.

    Returns
    -------
    list of str

    Examples
    --------
    >>> from postplace.cluster import preset_names
    >>> "k80x2" in preset_names()
    True
    """
    return sorted(
        p.name.removesuffix(".toml")
        for p in resources.files("postplace.cluster.presets").iterdir()
        if p.name.endswith(".toml")
    )


def load_cluster(spec: str | Path) -> Cluster:
    """A cluster from a TOML file path, else from a preset name.

    Parameters
    ----------
    spec : str or path
        A path ending in ``.toml`` or naming a file that exists, else a name from :func:`preset_names`.

    Returns
    -------
    Cluster

    Raises
    ------
    PostplaceError
        For a missing file, an unknown preset, or a file that is not a valid cluster.

    Examples
    --------
    >>> from postplace.cluster import load_cluster
    >>> c = load_cluster("k80x2")
    >>> c.device_names, c.route(1, 2)
    (('cpu', 'gpu0', 'gpu1'), ['gpu0', 'board0', 'gpu1'])
    """
    path = Path(spec)
    if path.suffix == ".toml" or path.exists():
        if not path.exists():
            raise PostplaceError(f"{path}: no such cluster file")
        return Cluster.from_toml(path)
    if str(spec) not in preset_names():
        raise PostplaceError(
            f"unknown cluster preset '{spec}'; choose one of {', '.join(preset_names())} or give a .toml file"
        )
    text = resources.files("postplace.cluster.presets").joinpath(f"{spec}.toml").read_text()
    return Cluster.from_toml_text(text, source=f"preset {spec}")
