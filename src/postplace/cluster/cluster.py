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

import tomllib
from dataclasses import dataclass
from functools import cached_property
from importlib import resources
from pathlib import Path

import numpy as np

from postplace.errors import PostplaceError
from postplace.graph.opgraph import DEVICE_KINDS, KIND_BITS


@dataclass(frozen=True)
class Device:
    """One compute device. ``memory`` is the usable capacity: the spec figure minus ``reserve``."""

    name: str
    kind: str
    model: str
    peak_flops: float
    memory_bandwidth: float
    memory: float
    launch_overhead: float

    @property
    def kind_bit(self) -> int:
        return KIND_BITS[self.kind]


@dataclass(frozen=True)
class Link:
    a: str
    b: str
    bandwidth: float
    latency: float


@dataclass(frozen=True, eq=False)
class Cluster:
    """Devices (``cpu``, ``gpu0``, ...), switches and links, with routes precomputed as arrays."""

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
            for f in ("peak_flops", "memory_bandwidth", "memory"):
                v = getattr(d, f)
                if not np.isfinite(v) or v <= 0:
                    raise PostplaceError(f"{where}: device '{d.name}' field '{f}' is {v!r}; it must be positive")
            if not np.isfinite(d.launch_overhead) or d.launch_overhead < 0:
                raise PostplaceError(f"{where}: device '{d.name}' field 'launch_overhead' must be >= 0")
        for link in self.links:
            for end in (link.a, link.b):
                if end not in names:
                    raise PostplaceError(f"{where}: a link names '{end}', which is neither a device nor a switch")
            if not np.isfinite(link.bandwidth) or link.bandwidth <= 0 or link.latency < 0:
                raise PostplaceError(f"{where}: link {link.a} - {link.b} needs bandwidth > 0 and latency >= 0")
        self._routes  # noqa: B018  (computes routes now so a disconnected cluster fails at load)

    # ------------------------------------------------------------------------------ views
    def __repr__(self) -> str:
        devs = ", ".join(f"{d.name} ({d.model}, {d.memory / 1e9:.3g} GB)" for d in self.devices)
        return f"Cluster({self.name!r}: {devs}; {len(self.links)} links)"

    @property
    def num_devices(self) -> int:
        return len(self.devices)

    @cached_property
    def device_names(self) -> tuple[str, ...]:
        return tuple(d.name for d in self.devices)

    def device_index(self, name: str) -> int:
        try:
            return self.device_names.index(name)
        except ValueError:
            raise PostplaceError(
                f"cluster '{self.name}' has no device '{name}'; its devices are {', '.join(self.device_names)}"
            ) from None

    @cached_property
    def kind_bits(self) -> np.ndarray:
        return np.array([d.kind_bit for d in self.devices], dtype=np.uint8)

    @cached_property
    def capacity(self) -> np.ndarray:
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
        """The nodes a transfer from device ``a`` to device ``b`` passes through, ends included."""
        return self._paths[(a, b)]

    def transfer_time(self, nbytes: float, a: int, b: int) -> float:
        """Seconds to move ``nbytes`` from device ``a`` to device ``b`` with the route to itself."""
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
        for a in range(D):
            for b in range(D):
                if a != b:
                    best = _best_route(adj, switches, dnames[a], dnames[b], self.links)
                    if best is None:
                        raise PostplaceError(
                            f"cluster '{self.name}': no route from {dnames[a]} to {dnames[b]}; "
                            "add a [[link]] that connects them (through switches)"
                        )
                    hops, nodes = best
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
        path = Path(path)
        try:
            text = path.read_text()
        except OSError as exc:
            raise PostplaceError(f"{path}: cannot read cluster file ({exc.strerror})") from None
        return cls.from_toml_text(text, source=str(path))

    @classmethod
    def from_toml_text(cls, text: str, *, source: str = "cluster") -> Cluster:
        try:
            d = tomllib.loads(text)
        except tomllib.TOMLDecodeError as exc:
            raise PostplaceError(f"{source}: not valid TOML ({exc})") from None
        devices = []
        for k, entry in enumerate(d.get("device", [])):
            where = f"{source}: device[{k}]"
            names = entry.get("names", [entry.get("name")])
            for name in names:
                if not isinstance(name, str):
                    raise PostplaceError(f"{where} needs a 'name' (or a 'names' list)")
                try:
                    spec_memory = float(entry["memory"])
                    devices.append(
                        Device(
                            name=name,
                            kind=str(entry["kind"]),
                            model=str(entry.get("model", entry["kind"])),
                            peak_flops=float(entry["peak_flops"]),
                            memory_bandwidth=float(entry["memory_bandwidth"]),
                            memory=spec_memory - float(entry.get("reserve", 0.0)),
                            launch_overhead=float(entry.get("launch_overhead", 0.0)),
                        )
                    )
                except KeyError as exc:
                    raise PostplaceError(f"{where} ('{name}') has no field {exc}; add it") from None
                except (TypeError, ValueError) as exc:
                    raise PostplaceError(f"{where} ('{name}'): {exc}") from None
        switches = []
        for k, entry in enumerate(d.get("switch", [])):
            if "name" not in entry:
                raise PostplaceError(f"{source}: switch[{k}] needs a 'name'")
            switches.append(str(entry["name"]))
        links = []
        for k, entry in enumerate(d.get("link", [])):
            try:
                links.append(
                    Link(str(entry["a"]), str(entry["b"]), float(entry["bandwidth"]), float(entry.get("latency", 0.0)))
                )
            except KeyError as exc:
                raise PostplaceError(f"{source}: link[{k}] has no field {exc}; add it") from None
        return cls(
            name=str(d.get("name", Path(source).stem)),
            devices=tuple(devices),
            switches=tuple(switches),
            links=tuple(links),
            description=str(d.get("description", "")),
        )


def _best_route(adj, switches, src: str, dst: str, links) -> tuple[list[tuple[int, int]], list[str]] | None:
    """Widest, then shortest, then lowest-numbered simple path from src to dst through switches only."""
    best_key = None
    best = None
    stack = [(src, [], [src])]
    while stack:
        node, hops, nodes = stack.pop()
        for nxt, k, direction in adj.get(node, []):
            if nxt in nodes:
                continue
            new_hops = [*hops, (k, direction)]
            if nxt == dst:
                key = (-min(links[h].bandwidth for h, _ in new_hops), len(new_hops), [h for h, _ in new_hops])
                if best_key is None or key < best_key:
                    best_key, best = key, (new_hops, [*nodes, nxt])
            elif nxt in switches:
                stack.append((nxt, new_hops, [*nodes, nxt]))
    return best


# ---------------------------------------------------------------------------------- presets
def preset_names() -> list[str]:
    return sorted(p.name.removesuffix(".toml") for p in resources.files("postplace.cluster.presets").iterdir()
                  if p.name.endswith(".toml"))


def load_cluster(spec: str | Path) -> Cluster:
    """A cluster from a TOML file path, else from a preset name."""
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
