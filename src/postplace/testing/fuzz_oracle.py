"""Independent checks of an accepted answer: bounds on a step time computed by the fuzz itself from the
case's files and the documented cost model, never by calling postplace's simulator or cost model.

The documented model (``cost/model.py``'s and ``cluster/cluster.py``'s docstrings, the semantics in
``sim/reference.py``): an op takes ``max(FLOPs / peak, bytes / memory bandwidth) + launch overhead`` on
a device whose model has no achieved kernel rates; a GPU prices an update op in foreach form
(``roofline + launch overhead / FOREACH_TENSORS_PER_LAUNCH``); a device runs one op at a time and never
idles while an op of its own is ready; an op's output tensor goes once to each other device with a
consumer, over the route of widest bottleneck (then fewest links, then lowest link numbers) through
switches, in ``sum of latencies + bytes / bottleneck``. From it, for a placement:

* **lower bound**: the busiest device's total op time, and the longest chain of ops with each
  cross-device edge's transfer (the step cannot end before either);
* **upper bound**: every op time plus every transfer, one after another (nothing ever waits on
  nothing: an op that is not running waits for a transfer, which runs or waits for one that runs);
* with every op on one device the two meet: the step time **equals** the sum of the op times.

And for a search over all placements (:func:`place_check`): no placement beats the larger of the
slowest op at its fastest device and the ops' fastest times summed over the devices' count.
Each check proves the simulator's answer is consistent with the model it documents, computed apart;
it says nothing of whether that model is right for real hardware. Checks apply where the model is
plain (fp32, no measured times, no achieved rates, no collectives) and return None elsewhere.
"""

from __future__ import annotations

import json
import math
from importlib import resources

from postplace.testing.fuzz_expect import Verdict, judge_cluster, judge_graph, judge_placement, read_json, read_toml

__all__ = ["place_check", "placement_bounds", "simulate_check"]

REL = 1e-9


def _flag(argv: list[str], flag: str) -> str | None:
    return argv[argv.index(flag) + 1] if flag in argv and argv.index(flag) + 1 < len(argv) else None


def _load(files: dict[str, bytes], argv: list[str]):
    """(graph doc, cluster doc) of a case, read by the fuzz's own parsers; None where the model is not plain."""
    from postplace.cost.achieved import ACHIEVED

    target, cluster = argv[1], _flag(argv, "--cluster")
    if target not in files or cluster is None or any(f in argv for f in ("--microbatches", "--plan", "--size")):
        return None
    if cluster in files:
        text = files[cluster]
    else:
        preset = resources.files("postplace.cluster") / "presets" / f"{cluster}.toml"
        if not preset.is_file():
            return None
        text = preset.read_bytes()
    try:
        g, c = read_json(files[target]), read_toml(text)
        judge_graph(g, g)  # the shape only: format, version, unique names
        judge_cluster(c)
    except (Verdict, KeyError, TypeError):
        return None
    ops = g["ops"]
    if g.get("measured") or "collective" in ops or any(p != "fp32" for p in ops.get("precision", ["fp32"])):
        return None
    if any(e.get("kind") == "gpu" and e.get("model", "gpu") in ACHIEVED for e in c["device"]):
        return None
    return g, c


def _devices(c: dict) -> list[dict]:
    out = []
    for e in c["device"]:
        for name in e["names"] if "names" in e else [e["name"]]:
            out.append({**e, "name": name})
    return out


def op_time(g: dict, i: int, dev: dict) -> float:
    """Seconds op ``i`` takes on ``dev`` by the documented roofline (inf where its kind is not allowed)."""
    from postplace.cost.achieved import FOREACH_TENSORS_PER_LAUNCH

    ops = g["ops"]
    kinds = ops["allowed_kinds"][i]
    if dev["kind"] not in ([kinds] if isinstance(kinds, str) else kinds):
        return math.inf
    flops = ops["flops"][i]
    compute = flops / dev["peak_flops"] if flops > 0 else 0.0
    roof = max(compute, ops["bytes_accessed"][i] / dev["memory_bandwidth"])
    launch = dev.get("launch_overhead", 0.0)
    if dev["kind"] == "gpu" and ops["phase"][i] == "update":
        return roof + launch / FOREACH_TENSORS_PER_LAUNCH
    return roof + launch


def _route_costs(c: dict, a: str, b: str) -> tuple[float, float, float]:
    """(least latency, most latency, bottleneck bandwidth) of the routes the documented rule may pick."""
    device_names = {d["name"] for d in _devices(c)}
    links = c.get("link", [])
    best: list[tuple[float, int, tuple[int, ...], float]] = []

    def walk(node, seen, used):
        if node == b:
            bw = min(links[k]["bandwidth"] for k in used)
            best.append((-bw, len(used), tuple(sorted(used)), sum(links[k].get("latency", 0.0) for k in used)))
            return
        if node != a and node in device_names:
            return  # devices never forward
        for k, link in enumerate(links):
            for x, y in ((link["a"], link["b"]), (link["b"], link["a"])):
                if x == node and y not in seen:
                    walk(y, seen | {y}, used + [k])

    walk(a, {a}, [])
    top = min(best)[:2]
    tied = [r for r in best if r[:2] == top]
    return min(r[3] for r in tied), max(r[3] for r in tied), -top[0]


def placement_bounds(g: dict, c: dict, dev: list[int]) -> tuple[float, float] | None:
    """(lower, upper) bounds on the step time of placement ``dev`` (device index per op) by the model."""
    devices = _devices(c)
    n = len(dev)
    t = [op_time(g, i, devices[dev[i]]) for i in range(n)]
    if not all(math.isfinite(x) for x in t):
        return None
    e = g["edges"]
    slots = e.get("slot", [0] * len(e["src"]))
    groups: dict[tuple[int, int, int], list[float]] = {}
    for s, d, slot, nbytes in zip(e["src"], e["dst"], slots, e["bytes"], strict=True):
        if dev[s] != dev[d]:
            groups.setdefault((s, slot, dev[d]), []).append(nbytes)
    cost: dict[tuple[int, int], tuple[float, float, float]] = {}

    def xfer(s: int, b: int, nbytes: float, lo: bool) -> float:
        key = (dev[s], b)
        if key not in cost:
            cost[key] = _route_costs(c, devices[dev[s]]["name"], devices[b]["name"])
        lat_lo, lat_hi, bw = cost[key]
        return (lat_lo if lo else lat_hi) + nbytes / bw

    busy = [0.0] * len(devices)
    for i in range(n):
        busy[dev[i]] += t[i]
    upper = sum(t) + sum(xfer(s, b, max(v), False) for (s, _, b), v in groups.items())
    preds: list[list[tuple[int, float]]] = [[] for _ in range(n)]
    for s, d, slot in zip(e["src"], e["dst"], slots, strict=True):
        wait = 0.0 if dev[s] == dev[d] else xfer(s, dev[d], min(groups[(s, slot, dev[d])]), True)
        preds[d].append((s, wait))
    finish: list[float | None] = [None] * n

    def end(i: int, depth: int = 0) -> float:
        if finish[i] is None:
            if depth > n:
                raise RecursionError("a cycle")
            finish[i] = max((end(s, depth + 1) + w for s, w in preds[i]), default=0.0) + t[i]
        return finish[i]

    try:
        chain = max(end(i) for i in range(n))
    except RecursionError:
        return None
    return max(max(busy), chain), upper


def _placement(g: dict, c: dict, spec: str, files: dict[str, bytes]) -> list[int] | None:
    """Device index per op: ``single:DEV`` as documented (ops its kind may not run, with their colocation
    set, to the first device of a kind they may use) or the case's placement file."""
    devices = _devices(c)
    index = {d["name"]: k for k, d in enumerate(devices)}
    ops = g["ops"]
    kinds = [[k] if isinstance(k, str) else list(k) for k in ops["allowed_kinds"]]
    if spec.startswith("single:"):
        if spec[7:] not in index:
            return None
        sets: dict[int, set[str]] = {}
        for k, col in enumerate(ops["colocation"]):
            if col >= 0:
                sets[col] = sets.get(col, {"cpu", "gpu"}) & set(kinds[k])
        dev = []
        for k, col in enumerate(ops["colocation"]):
            may = sets[col] if col >= 0 else set(kinds[k])
            d = index[spec[7:]]
            if devices[d]["kind"] not in may:
                d = next((j for j, x in enumerate(devices) if x["kind"] in may), None)
                if d is None:
                    return None
            dev.append(d)
        return dev
    if spec not in files:
        return None
    try:
        graph = {"names": ops["name"], "kinds": kinds, "colocation": ops["colocation"]}
        names = judge_placement(read_json(files[spec]), graph, {d["name"]: d["kind"] for d in devices})
    except Verdict:
        return None
    return [index[x] for x in names]


def simulate_check(files: dict[str, bytes], argv: list[str]):
    """For an accepted ``simulate``: its step time within :func:`placement_bounds` (equal to the sum of the
    op times when every op is on one device); None where no independent computation applies."""
    loaded = _load(files, argv)
    spec = _flag(argv, "--placement")
    if argv[0] != "simulate" or loaded is None or spec is None:
        return None
    g, c = loaded
    dev = _placement(g, c, spec, files)
    bounds = None if dev is None else placement_bounds(g, c, dev)
    if bounds is None:
        return None
    lo, hi = bounds

    def check(out: str) -> bool:
        st = json.loads(out.strip().splitlines()[-1])["step_time_s"]
        return lo * (1 - REL) <= st <= hi * (1 + REL)

    return check


def place_check(files: dict[str, bytes], argv: list[str]):
    """For an accepted ``place`` on a graph file: the returned and the search's best step times are no
    lower than any placement can reach (the slowest op at its fastest, and the ops' fastest times spread
    evenly over every device); None where no independent computation applies."""
    loaded = _load(files, argv)
    if argv[0] != "place" or loaded is None or "--resume" in argv:
        return None
    g, c = loaded
    devices = _devices(c)
    fastest = [min(op_time(g, i, d) for d in devices) for i in range(len(g["ops"]["name"]))]
    if not all(math.isfinite(x) for x in fastest):
        return None
    bound = max(max(fastest, default=0.0), sum(fastest) / len(devices))

    def check(out: str) -> bool:
        doc = json.loads(out.strip().splitlines()[-1])
        times = [doc.get("best_step_time_s"), doc.get("search_best_step_time_s")]
        return all(x is None or x >= bound * (1 - REL) for x in times)

    return check
