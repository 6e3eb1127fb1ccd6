"""A cluster built from what a profiled workload says about its own machine.

dnn-partitioning workloads name the machine they were partitioned for: ``maxFPGAs`` accelerators of
``maxSizePerFPGA`` bytes each and ``maxCPUs`` CPUs (the importer keeps them in the graph's metadata as
``max_accelerators``, ``max_size_per_accelerator`` and ``max_cpus``). They do not say what the
accelerators are or how they are linked, so :func:`cluster_from_workload` takes those from a preset:

- the counts come from the file: GPU ``i`` copies the preset's GPU ``i mod P`` (P = the preset's GPU
  count: model, peak FLOP/s, bandwidth, launch overhead), CPU ``j`` the preset's CPU ``j mod C``;
- every GPU's memory is the file's ``maxSizePerFPGA``, used as the usable capacity (no reserve: in the
  file's model a device holds exactly that); CPUs keep the preset's memory;
- links come from the preset. A copy of a GPU keeps its template's links; GPUs of a later copy round
  (``i >= P``) get their own copies of the switches that serve only GPUs (a K80 board's PCIe switch,
  an NVSwitch), named ``<switch>-copy<round>``, joined to the rest as the template switch is: so 6
  GPUs from ``k80x4`` are three K80 boards of two dies, not one board of three. Switches left with a
  single link (they join nothing) are dropped;
- op times are not touched: the graph carries the file's measured latencies per device kind.

``resolve_cluster("workload:k80x4", graph)`` is what ``--cluster workload:PRESET`` does on the CLI.
"""

from __future__ import annotations

from dataclasses import replace

from postplace.cluster.cluster import Cluster, Device, Link, load_cluster
from postplace.errors import PostplaceError
from postplace.graph.opgraph import OpGraph

PREFIX = "workload:"
MAX_DEVICES = 128
"""The most devices a workload's own machine may have: a cluster's routes take time cubic in its
devices (256 take seconds, 512 over a minute), and dnn-partitioning machines have a handful. A file
claiming a million accelerators is refused at once instead of hanging."""


def resolve_cluster(spec: str, graph: OpGraph) -> Cluster:
    """``workload:PRESET`` (or ``workload:FILE.toml``): the graph's own machine; anything else: load_cluster."""
    spec = str(spec)
    if spec.startswith(PREFIX):
        base = spec[len(PREFIX) :]
        if not base:
            raise PostplaceError(
                "--cluster workload: needs a preset or .toml file after the colon, e.g. workload:k80x4"
            )
        return cluster_from_workload(graph, load_cluster(base))
    return load_cluster(spec)


def workload_machine(graph: OpGraph) -> dict | None:
    """The file's own machine as the importer kept it, or None when the graph carries none."""
    m = graph.metadata
    keys = ("max_accelerators", "max_size_per_accelerator", "max_cpus")
    if not any(m.get(k) is not None for k in keys):
        return None
    from postplace import validate

    out = {}
    for k in keys:  # a graph file's metadata is the user's to edit: checked as the importer checks the file
        value, where = m.get(k), f"graph '{graph.name}': metadata field '{k}'"
        if value is None:
            out[k] = None
        elif k == "max_size_per_accelerator":
            out[k] = validate.number(value, where, positive=True)
        else:
            out[k] = validate.integer(value, where, minimum=0)
    return out


def cluster_from_workload(graph: OpGraph, base: Cluster) -> Cluster:
    """The workload's machine: its accelerator count and memory, its CPU count, ``base``'s devices and links."""
    machine = workload_machine(graph)
    if machine is None:
        raise PostplaceError(
            f"graph '{graph.name}' says nothing about its machine (no maxFPGAs / maxSizePerFPGA / maxCPUs); "
            "--cluster workload:PRESET needs a dnn-partitioning workload, give a plain preset instead"
        )
    gpus = [d for d in base.devices if d.kind == "gpu"]
    cpus = [d for d in base.devices if d.kind == "cpu"]
    n_gpu = len(gpus) if machine["max_accelerators"] is None else machine["max_accelerators"]
    n_cpu = len(cpus) if machine["max_cpus"] is None else machine["max_cpus"]
    if n_gpu and not gpus:
        raise PostplaceError(f"cluster '{base.name}' has no GPU to copy for the workload's {n_gpu} accelerators")
    if n_cpu and not cpus:
        raise PostplaceError(f"cluster '{base.name}' has no CPU to copy for the workload's {n_cpu} CPUs")
    if n_gpu + n_cpu > MAX_DEVICES:
        raise PostplaceError(
            f"graph '{graph.name}': the workload's machine has {n_gpu} accelerators and {n_cpu} "
            f"CPU(s); --cluster workload:PRESET builds machines of up to {MAX_DEVICES} devices "
            "(routes between every pair of devices are computed): give a cluster TOML file or "
            "a preset instead"
        )
    if n_gpu + n_cpu == 0:
        raise PostplaceError(f"graph '{graph.name}': the workload's machine has no device (maxFPGAs and maxCPUs are 0)")
    memory = machine["max_size_per_accelerator"]

    # (new device, template device name, copy round)
    made: list[tuple[Device, str, int]] = []
    for j in range(n_cpu):
        t = cpus[j % len(cpus)]
        made.append((replace(t, name="cpu" if j == 0 else f"cpu{j}"), t.name, 0))
    for i in range(n_gpu):
        t = gpus[i % len(gpus)]
        d = replace(t, name=f"gpu{i}", memory=t.memory if memory is None else memory)
        made.append((d, t.name, i // len(gpus)))
    rounds = sorted({r for _, _, r in made})

    kind_of = {d.name: d.kind for d in base.devices}
    local = {s for s in base.switches if _serves_only_gpus(s, base, kind_of)}

    def copy_name(node: str, r: int) -> str:
        return f"{node}-copy{r}" if r and node in local else node

    switches = list(base.switches)
    switches += [copy_name(s, r) for r in rounds if r for s in base.switches if s in local]
    links: list[Link] = []
    for link in base.links:
        a_dev, b_dev = link.a in kind_of, link.b in kind_of
        if not a_dev and not b_dev:  # switch - switch: once per round where it touches a local switch
            links.append(link)
            for r in rounds:
                if r and (link.a in local or link.b in local):
                    links.append(replace(link, a=copy_name(link.a, r), b=copy_name(link.b, r)))
        elif a_dev and b_dev:  # device - device: kept where both ends are kept under their own names
            names = {d.name for d, _, _ in made}
            if link.a in names and link.b in names:
                links.append(link)
        else:
            dev_end, other = (link.a, link.b) if a_dev else (link.b, link.a)
            for d, template, r in made:
                if template == dev_end:
                    links.append(Link(d.name, copy_name(other, r), link.bandwidth, link.latency))
    switches, links = _prune(switches, links)
    devices = tuple(d for d, _, _ in made)
    mem = "its preset memory" if memory is None else f"{memory / 1e9:.2f} GB each (maxSizePerFPGA)"
    return Cluster(
        name=f"{PREFIX}{base.name}",
        devices=devices,
        switches=tuple(switches),
        links=tuple(links),
        description=(
            f"the machine of '{graph.name}': {n_gpu} {gpus[0].model if gpus else 'GPU'} GPUs of {mem}, "
            f"{n_cpu} CPU(s) (maxFPGAs, maxCPUs); device models and links from '{base.name}'"
        ),
    )


def describe_machine(graph: OpGraph, cluster: Cluster) -> list[str]:
    """Lines for ``info``: the file's own machine beside the cluster in use, and where they differ."""
    machine = workload_machine(graph)
    if machine is None:
        return []
    n_acc, size, n_cpu = machine["max_accelerators"], machine["max_size_per_accelerator"], machine["max_cpus"]
    parts = []
    if n_acc is not None:
        parts.append(f"{n_acc} accelerators" + ("" if size is None else f" of {size / 1e9:.2f} GB"))
    elif size is not None:
        parts.append(f"accelerators of {size / 1e9:.2f} GB")
    if n_cpu is not None:
        parts.append(f"{n_cpu} CPU" + ("" if n_cpu == 1 else "s"))
    gpus = [d for d in cluster.devices if d.kind == "gpu"]
    cpus = [d for d in cluster.devices if d.kind == "cpu"]
    gpu_mem = sorted({d.memory for d in gpus})
    have = f"{len(gpus)} GPUs" + (f" of {', '.join(f'{m / 1e9:.2f}' for m in gpu_mem)} GB" if gpus else "")
    have += f", {len(cpus)} CPU" + ("" if len(cpus) == 1 else "s")
    lines = [
        f"the file's own machine: {', '.join(parts)} (maxFPGAs, maxSizePerFPGA, maxCPUs)",
        f"cluster {cluster.name}: {have}",
    ]
    diffs = []
    if size is not None and gpus and any(m != size for m in gpu_mem):
        diffs.append("GPU memory")
    if n_acc is not None and len(gpus) != n_acc:
        diffs.append("accelerator count")
    if n_cpu is not None and len(cpus) != n_cpu:
        diffs.append("CPU count")
    if diffs:
        lines.append(
            f"the cluster's {' and '.join(diffs)} differ from the file's; --cluster workload:{_base_name(cluster)} "
            "builds the file's machine from that preset"
        )
    return lines


def _base_name(cluster: Cluster) -> str:
    return cluster.name[len(PREFIX) :] if cluster.name.startswith(PREFIX) else cluster.name


def _serves_only_gpus(switch: str, base: Cluster, kind_of: dict[str, str]) -> bool:
    """True when every device linked to ``switch`` is a GPU (a board switch, an NVSwitch), and there is one."""
    ends = [link.b if link.a == switch else link.a for link in base.links if switch in (link.a, link.b)]
    devices = [e for e in ends if e in kind_of]
    return bool(devices) and all(kind_of[e] == "gpu" for e in devices)


def _prune(switches: list[str], links: list[Link]) -> tuple[list[str], list[Link]]:
    """Drop switches with at most one link (dead ends), repeatedly, and their links."""
    switches = list(dict.fromkeys(switches))
    while True:
        degree = {s: 0 for s in switches}
        for link in links:
            for end in (link.a, link.b):
                if end in degree:
                    degree[end] += 1
        dead = {s for s, k in degree.items() if k <= 1}
        if not dead:
            return switches, links
        switches = [s for s in switches if s not in dead]
        links = [link for link in links if link.a not in dead and link.b not in dead]
