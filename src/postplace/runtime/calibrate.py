"""Calibration and fidelity: measure op and transfer times on the devices present, fit a cost model,
and score the simulator's step times against measured ones on models and batch sizes it was not fit on.

Measuring (:func:`measure_config`): a zoo model at one configuration is traced; its ops are timed one by
one on every device present (the CPU through :func:`postplace.cost.profile.profile_cpu`; each CUDA
device by :func:`profile_ops`, which runs the step node by node on that device with a synchronise
around each call); then the real step time of a few placements is measured end to end with
:class:`~postplace.runtime.TorchEvaluator`'s protocol (median of the last 5 of 10 steps). On a
CPU-only machine the one placement is the single CPU; with CUDA devices, also each GPU alone and a
CPU+GPU split (the forward and backward of the first half of the modules on the GPU, the rest on the
CPU, each parameter's update with it).

Fitting (:func:`fit`): per device model and op type, ``time = a * FLOPs / peak + b * bytes / mem_bw + c``
with non-negative coefficients, fitted by least squares on relative error over the ops of the
calibration configurations; an op type with fewer than ``min_ops`` calibration ops uses the fit over
all ops. Ops timed one at a time are not the step run as a whole (timing a call adds a few
microseconds to it; a whole step runs with caches in another state), so a second stage scales the
work part (``a``, ``b``) and the constant part (``c``) of every op type by two factors fitted, again by
relative least squares, to the measured single-device step times of the calibration configurations.
``peak`` and ``mem_bw`` are this device's measured matmul and copy rates
(:func:`postplace.cost.profile.measure_roofline`). :class:`CalibratedCostModel` turns the fit into op
times for the simulator (a :class:`~postplace.cost.CostModel`).

Scoring (:func:`fidelity`): for each held-out configuration and placement, the simulated step time
(:class:`~postplace.sim.Simulator` with the calibrated cost model, on the measured cluster) against the
measured one: Spearman rank correlation, median absolute percentage error, the worst cases.

The configurations (:data:`FIDELITY_CONFIGS`) are mid-sized versions of the zoo models (between
``small``, which is all per-op overhead, and ``full``, too slow for a 2-core CPU) at several batch
sizes; they are built by :func:`trace_config`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import platform
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from postplace.cost.profile import NodeTimer
from postplace.errors import PostplaceError

__all__ = [
    "FIDELITY_CONFIGS",
    "CalibratedCostModel",
    "Config",
    "FidelityReport",
    "Fit",
    "Measured",
    "cluster_toml",
    "fidelity",
    "fit",
    "measure_config",
    "profile_ops",
    "trace_config",
]

_SOURCE_OPS = ("parameter", "buffer", "input", "constant")


@dataclass(frozen=True)
class Config:
    """One zoo model at one configuration: ``overrides`` on top of its ``small`` config."""

    model: str
    overrides: dict = field(default_factory=dict)

    @property
    def label(self) -> str:
        return f"{self.model} b{self.overrides.get('batch', '?')}"


#: mid-sized zoo configurations (dimensions fixed, batch varied) that run in 10-400 ms on one core
_MEDIUM = {
    "resnet50": dict(image=64, classes=100, blocks=(1, 1, 1, 1), width=0.25),
    "inception_v3": dict(image=107, classes=100, width=0.25),
    "rnnlm": dict(steps=8, vocab=2000, hidden=256, layers=4),
    "nmt2": dict(src_len=8, tgt_len=8, vocab=2000, hidden=256, layers=2),
    "nmt4": dict(src_len=8, tgt_len=8, vocab=2000, hidden=256, layers=4),
    "gpt2": dict(seq=64, vocab=2000, d=128, layers=2, heads=4, context=64),
}
_BATCHES = {
    "resnet50": (4, 8, 16, 32),
    "inception_v3": (2, 4, 8, 16),
    "rnnlm": (8, 16, 32, 64),
    "nmt2": (8, 16, 32, 64),
    "nmt4": (4, 8, 16, 32),
    "gpt2": (4, 8, 16, 32),
}
FIDELITY_CONFIGS: dict[str, list[Config]] = {
    m: [Config(m, {**_MEDIUM[m], "batch": b}) for b in bs] for m, bs in _BATCHES.items()
}


@contextlib.contextmanager
def _zoo_config(name: str, overrides: dict):
    """Let ``zoo.build(name, "small")`` build ``overrides`` on top of the small config, for a moment."""
    from postplace import zoo

    spec = zoo.spec(name)
    unknown = sorted(set(overrides) - set(spec.small))
    if unknown:
        raise PostplaceError(f"model '{name}' has no config field '{unknown[0]}'; fields: {', '.join(spec.small)}")
    zoo.MODELS[name] = dataclasses.replace(spec, small={**spec.small, **overrides})
    try:
        yield
    finally:
        zoo.MODELS[name] = spec


def trace_config(cfg: Config, optimizer: str = "sgd"):
    """The :class:`~postplace.graph.trace_torch.Traced` step of one configuration."""
    from postplace.zoo import trace_model

    with _zoo_config(cfg.model, cfg.overrides):
        tr = trace_model(cfg.model, "small", optimizer)
    tr.graph.metadata["zoo"]["size"] = "custom"
    return tr


# ------------------------------------------------------------------------------ measuring
def devices_present() -> list[tuple[str, torch.device]]:
    """(logical name, torch device): ``cpu`` and ``gpuK`` for each CUDA device."""
    out = [("cpu", torch.device("cpu"))]
    if torch.cuda.is_available():
        out += [(f"gpu{k}", torch.device(f"cuda:{k}")) for k in range(torch.cuda.device_count())]
    return out


def device_model(device: torch.device) -> str:
    from postplace.cost.profile import cpu_model_name

    return cpu_model_name() if device.type == "cpu" else torch.cuda.get_device_name(device)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def device_roofline(device: torch.device) -> tuple[float, float]:
    """(peak FLOP/s, bytes/s) measured on ``device``: best of 10 float32 matmuls and copies."""
    from postplace.cost.profile import measure_roofline

    if device.type == "cpu":
        return measure_roofline(repeats=10)
    n = 4096
    a, b = torch.randn(n, n, device=device), torch.randn(n, n, device=device)
    src = torch.empty(256 * 2**20 // 4, device=device)
    dst = torch.empty_like(src)
    best_mm = best_cp = math.inf
    for _ in range(11):
        _sync(device)
        t0 = time.perf_counter()
        torch.mm(a, b)
        _sync(device)
        best_mm = min(best_mm, time.perf_counter() - t0)
        t0 = time.perf_counter()
        dst.copy_(src)
        _sync(device)
        best_cp = min(best_cp, time.perf_counter() - t0)
    return 2.0 * n**3 / best_mm, 2.0 * src.numel() * 4 / best_cp


def measure_link(a: torch.device, b: torch.device, sizes=(2**12, 2**16, 2**20, 2**24, 2**26)) -> tuple[float, float]:
    """(bandwidth bytes/s, latency s) of copies from ``a`` to ``b``: least squares over ``sizes``
    of the best of 5 timed copies each."""
    xs, ys = [], []
    for nbytes in sizes:
        src = torch.empty(nbytes // 4, device=a)
        best = math.inf
        for _ in range(6):
            _sync(a)
            _sync(b)
            t0 = time.perf_counter()
            src.to(b, copy=True)
            _sync(a)
            _sync(b)
            best = min(best, time.perf_counter() - t0)
        xs.append(float(nbytes))
        ys.append(best)
    slope, intercept = np.polyfit(xs, ys, 1)
    return 1.0 / max(slope, 1e-15), max(float(intercept), 0.0)


def profile_ops(traced, device: torch.device, *, runs: int = 3, warmup: int = 1) -> np.ndarray:
    """Median seconds of each op when the whole step runs on ``device``, node by node, synchronised
    around every aten call (for a CUDA device: what one op costs there, launch included)."""
    from postplace.runtime.placed import apply

    g = traced.graph
    samples = np.zeros((runs, g.num_ops))
    step = apply(traced.model, traced, np.zeros(g.num_ops, dtype=np.int64), ["x"], device_map=str(device))
    xs = [x.to(device) for x in traced.inputs]
    with torch.no_grad():
        for r in range(warmup + runs):
            timer = NodeTimer(step.gm, device)
            timer.run(*step.args[: step.n_persistent], *xs)
            if r >= warmup:
                for name, t in timer.times.items():
                    op = traced.op_of_node.get(name, -1)
                    if op >= 0:
                        samples[r - warmup, op] += t
    times = np.median(samples, axis=0)
    times[np.isin(np.array(g.op_types), _SOURCE_OPS)] = 0.0
    return times


def _placements(graph, names: Sequence[str]) -> dict[str, np.ndarray]:
    """The placements measured for one configuration (see the module docstring)."""
    from postplace.cluster.placement import colocation_representative

    n = graph.num_ops
    out = {f"single:{d}": np.full(n, k, dtype=np.int64) for k, d in enumerate(names)}
    if len(names) > 1:
        # first half of the forward program (and what is colocated with it) on gpu0, the rest on the cpu
        fwd = np.flatnonzero(graph.phase == 0)
        cut = fwd[len(fwd) // 2] if fwd.size else n
        rep = colocation_representative(graph)
        first = np.arange(n) < cut
        dev = np.where(first[rep], 1, 0)
        out["split:gpu0+cpu"] = dev
    return out


@dataclass
class Measured:
    """One configuration, measured: its graph (with per-op times per device model) and real step times."""

    config: Config
    graph: object  #: OpGraph with a Measurement per device model present
    op_times: dict  #: device model -> per-op seconds
    step_times: dict  #: placement label -> measured median seconds (inf where it failed)
    placements: dict  #: placement label -> op-level device ids
    reasons: dict  #: placement label -> failure reason
    single: dict = field(default_factory=dict)  #: single-device placement label -> device model


def measure_config(
    cfg: Config | object,
    devices: Sequence[tuple[str, torch.device]] | None = None,
    *,
    rooflines: dict | None = None,
    runs: int = 3,
    steps: int = 10,
    discard: int = 5,
) -> Measured:
    """Trace (a :class:`Config`) or take (a Traced) one step; time its ops on every device and its
    placements end to end."""
    from postplace.cost.profile import profile_cpu
    from postplace.graph.opgraph import Measurement
    from postplace.runtime.evaluator import TorchEvaluator

    traced = trace_config(cfg) if isinstance(cfg, Config) else cfg
    config = cfg if isinstance(cfg, Config) else Config(traced.graph.name)
    devices = list(devices or devices_present())
    rooflines = rooflines if rooflines is not None else {}
    graph = traced.graph
    op_times = {}
    for _name, dev in devices:
        key = device_model(dev)
        if dev.type == "cpu":
            peak, bw = rooflines.get(key, (1.0, 1.0))
            graph, _ = profile_cpu(
                dataclasses.replace(traced, graph=graph), runs=runs, warmup=1, peak_flops=peak, mem_bw=bw
            )
            op_times[key] = graph.measured[-1].times
        else:
            times = profile_ops(traced, dev, runs=runs)
            prov = f"postplace.runtime.profile_ops on {dev}: median of {runs} runs, synchronised per aten call"
            graph = dataclasses.replace(graph, measured=(*graph.measured, Measurement(key, "gpu", times, prov)))
            op_times[key] = times
    names = [n for n, _ in devices]
    placements = _placements(graph, names)
    ev = TorchEvaluator(traced, names, device_map={n: str(d) for n, d in devices}, steps=steps, discard=discard)
    res = ev.evaluate(np.stack(list(placements.values())))
    step_times = dict(zip(placements, res.step_time.tolist(), strict=True))
    reasons = {k: r for k, r in zip(placements, res.reasons, strict=True) if r}
    single = {f"single:{n}": device_model(d) for n, d in devices}
    return Measured(config, graph, op_times, step_times, placements, reasons, single)


# ------------------------------------------------------------------------------ fitting
@dataclass(frozen=True)
class Fit:
    """Per device model: ``coef[op type] = (a, b, c)`` for ``a * FLOPs/peak + b * bytes/bw + c``;
    ``default`` for op types fitted on too few ops; ``peak``/``bw`` the device's measured rates."""

    device_model: str
    peak: float
    bw: float
    coef: dict
    default: tuple
    ops: int  #: calibration ops the fit saw
    scale: tuple = (1.0, 1.0)  #: second-stage factors (work, constant) applied to every coefficient
    op_overhead: float = 0.0  #: first-stage per-op constant over all ops (one call timed at a time)

    def predict(self, graph) -> np.ndarray:
        f, b = graph.flops / self.peak, graph.bytes_accessed / self.bw
        out = np.empty(graph.num_ops)
        for i, t in enumerate(graph.op_types):
            a, bb, c = self.coef.get(t, self.default)
            out[i] = a * f[i] + bb * b[i] + c
        out[np.isin(np.array(graph.op_types), _SOURCE_OPS)] = 0.0
        return out


def _nnls_rel(X: np.ndarray, y: np.ndarray) -> tuple:
    from scipy.optimize import nnls

    w = 1.0 / np.maximum(y, 1e-7)
    coef, _ = nnls(X * w[:, None], y * w)
    return tuple(float(c) for c in coef)


def fit(measured: Sequence[Measured], rooflines: dict, *, min_ops: int = 8) -> dict[str, Fit]:
    """One :class:`Fit` per device model, over the ops of ``measured`` (see the module docstring)."""
    fits = {}
    for key, (peak, bw) in rooflines.items():
        rows = [(m.graph, m.op_times[key]) for m in measured if key in m.op_times]
        if not rows:
            continue
        types = np.concatenate([np.array(g.op_types) for g, _ in rows])
        X = np.concatenate([np.stack([g.flops / peak, g.bytes_accessed / bw, np.ones(g.num_ops)], 1) for g, _ in rows])
        y = np.concatenate([t for _, t in rows])
        work = ~np.isin(types, _SOURCE_OPS) & (y > 0)
        types, X, y = types[work], X[work], y[work]
        default = _nnls_rel(X, y)
        coef = {}
        for t in np.unique(types):
            sel = types == t
            if sel.sum() >= min_ops:
                coef[str(t)] = _nnls_rel(X[sel], y[sel])
        f = Fit(key, float(peak), float(bw), coef, default, int(y.size), op_overhead=default[2])
        fits[key] = _step_scale(f, [m for m in measured if key in m.op_times])
    return fits


def _step_scale(f: Fit, measured: Sequence[Measured]) -> Fit:
    """Second stage: scale work and constant parts so single-device step sums match measured steps."""
    rows, ys = [], []
    for m in measured:
        for label, model in m.single.items():
            t = m.step_times.get(label, np.inf)
            if model == f.device_model and np.isfinite(t):
                work = Fit(f.device_model, f.peak, f.bw, _part(f.coef, True), _part1(f.default, True), 0)
                const = Fit(f.device_model, f.peak, f.bw, _part(f.coef, False), _part1(f.default, False), 0)
                rows.append([work.predict(m.graph).sum(), const.predict(m.graph).sum()])
                ys.append(t)
    if len(ys) < 2:
        return f
    s_work, s_const = _nnls_rel(np.array(rows), np.array(ys))
    if s_work <= 0:
        return f

    def scaled(c):
        return (c[0] * s_work, c[1] * s_work, c[2] * s_const)

    return dataclasses.replace(
        f, coef={t: scaled(c) for t, c in f.coef.items()}, default=scaled(f.default), scale=(s_work, s_const)
    )


def _part1(c: tuple, work: bool) -> tuple:
    return (c[0], c[1], 0.0) if work else (0.0, 0.0, c[2])


def _part(coef: dict, work: bool) -> dict:
    return {t: _part1(c, work) for t, c in coef.items()}


@dataclass(frozen=True)
class CalibratedCostModel:
    """A :class:`~postplace.cost.CostModel`: fitted times for devices whose model has a :class:`Fit`,
    the default roofline cost model elsewhere. A time the graph measured for that device model is not
    used (the point is to predict graphs that were not measured)."""

    fits: dict
    label: str = "calibrated"

    def op_times(self, graph, cluster):
        from postplace.cost import RooflineCostModel
        from postplace.cost.model import OpTimes

        base = RooflineCostModel().op_times(dataclasses.replace(graph, measured=()), cluster)
        table, sources = base.table.copy(), list(base.sources)
        for d, dev in enumerate(cluster.devices):
            f = self.fits.get(dev.model)
            if f is not None:
                allowed = (graph.allowed_kinds & dev.kind_bit) != 0
                table[:, d] = np.where(allowed, f.predict(graph), np.inf)
                sources[d] = f"{dev.name} ({dev.model}): {self.label} per-op-type fit on {f.ops} measured ops"
        return OpTimes(table, np.zeros_like(base.measured), tuple(sources))

    def transfer_time(self, cluster, nbytes, a, b):
        return cluster.transfer_time(nbytes, a, b)


# ------------------------------------------------------------------------------ the cluster file
def cluster_toml(
    devices: Sequence[tuple[str, torch.device]],
    rooflines: dict,
    links: dict,
    fits: dict | None = None,
) -> str:
    """A cluster file for the devices present, with measured peak rates, memory and links."""
    import os

    lines = [
        'name = "measured"',
        f'description = "measured by postplace calibrate on {platform.node() or "this machine"}, '
        f'{time.strftime("%Y-%m-%d")}, torch {torch.__version__}"',
        "",
    ]
    for name, dev in devices:
        key = device_model(dev)
        peak, bw = rooflines[key]
        if dev.type == "cpu":
            mem = float(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
            reserve = min(8e9, 0.2 * mem)
        else:
            mem = float(torch.cuda.get_device_properties(dev).total_memory)
            reserve = 1e9
        f = (fits or {}).get(key)
        overhead = f.op_overhead if f is not None else 5e-6
        lines += [
            "[[device]]",
            f'name = "{name}"',
            f'kind = "{"cpu" if dev.type == "cpu" else "gpu"}"',
            f'model = "{key}"',
            f"peak_flops = {peak:.6g}   # measured: best float32 matmul",
            f"memory_bandwidth = {bw:.6g}   # measured: best large copy (read + write)",
            f"memory = {mem:.6g}",
            f"reserve = {reserve:.6g}",
            f"launch_overhead = {overhead:.3g}   # fitted: per-op constant of ops timed one at a time",
            "",
        ]
    if len(devices) > 1:
        lines += ["[[switch]]", 'name = "host"', ""]
        cpu_bw = rooflines[device_model(devices[0][1])][1]
        lines += ["[[link]]", f'a = "{devices[0][0]}"', 'b = "host"', f"bandwidth = {cpu_bw:.6g}", "latency = 0.0", ""]
        for name, _dev in devices[1:]:
            bw, lat = links.get(name, (1.6e10, 1e-5))
            lines += [
                "[[link]]",
                f'a = "{name}"',
                'b = "host"',
                f"bandwidth = {bw:.6g}   # measured: copies to and from the host, least squares",
                f"latency = {lat:.3g}",
                "",
            ]
    return "\n".join(lines)


# ------------------------------------------------------------------------------ scoring
@dataclass
class FidelityRow:
    config: str
    placement: str
    simulated: float
    measured: float
    split: str  #: "calibration" or "held-out"

    @property
    def ape(self) -> float:
        return abs(self.simulated - self.measured) / self.measured


@dataclass
class FidelityReport:
    rows: list
    devices: str
    header: str = ""

    def scores(self, split: str = "held-out") -> dict:
        from scipy.stats import spearmanr

        rows = [r for r in self.rows if r.split == split and np.isfinite(r.measured)]
        if not rows:
            return {"n": 0, "spearman": float("nan"), "mdape": float("nan")}
        sim = [r.simulated for r in rows]
        mea = [r.measured for r in rows]
        ranked = len(rows) > 2 and np.ptp(sim) > 0 and np.ptp(mea) > 0  # else no rank correlation is defined
        rho = float(spearmanr(sim, mea).statistic) if ranked else float("nan")
        return {"n": len(rows), "spearman": rho, "mdape": float(np.median([r.ape for r in rows]))}

    def format(self, worst: int = 5) -> str:
        out = [self.header] if self.header else []
        out.append(f"devices: {self.devices}")
        out.append(f"{'config':22} {'placement':18} {'split':11} {'simulated ms':>13} {'measured ms':>12} {'error':>8}")
        for r in self.rows:
            out.append(
                f"{r.config:22} {r.placement:18} {r.split:11} {r.simulated * 1e3:13.2f} {r.measured * 1e3:12.2f} "
                f"{(r.simulated - r.measured) / r.measured:+8.1%}"
            )
        for split in ("calibration", "held-out"):
            s = self.scores(split)
            if np.isfinite(s["spearman"]):
                rank = f"Spearman rank correlation {s['spearman']:.3f}"
            elif s["n"] < 3:
                rank = "no rank correlation (it needs 3 or more cases)"
            else:
                rank = "no rank correlation (the simulated or the measured times are all equal)"
            error = f"median absolute error {s['mdape']:.1%}" if s["n"] else "nothing measured"
            out.append(f"{split}: {s['n']} case{'' if s['n'] == 1 else 's'}, {rank}, {error}")
        held = sorted((r for r in self.rows if r.split == "held-out"), key=lambda r: -r.ape)[:worst]
        if held:
            out.append(
                "worst held-out cases: "
                + "; ".join(f"{r.config} {r.placement} {(r.simulated - r.measured) / r.measured:+.1%}" for r in held)
            )
        return "\n".join(out)


def measured_cluster(devices, rooflines, links, fits=None):
    from postplace.cluster import Cluster

    return Cluster.from_toml_text(cluster_toml(devices, rooflines, links, fits), source="measured cluster")


def fidelity(
    calibration: Sequence[Measured],
    held_out: Sequence[Measured],
    devices: Sequence[tuple[str, torch.device]],
    rooflines: dict,
    links: dict,
) -> tuple[FidelityReport, dict]:
    """Fit on ``calibration``, simulate every measured placement of both sets, compare."""
    from postplace.sim import Simulator

    fits = fit(calibration, rooflines)
    cluster = measured_cluster(devices, rooflines, links, fits)
    cm = CalibratedCostModel(fits)
    rows = []
    for split, group in (("calibration", calibration), ("held-out", held_out)):
        for m in group:
            sim = Simulator(m.graph, cluster, cost_model=cm)
            labels = list(m.placements)
            res = sim.evaluate_ops(np.stack([m.placements[k] for k in labels]))
            for k, label in enumerate(labels):
                rows.append(FidelityRow(m.config.label, label, float(res.step_time[k]), m.step_times[label], split))
    names = ", ".join(f"{n} = {device_model(d)} ({d})" for n, d in devices)
    return FidelityReport(rows, names), fits
