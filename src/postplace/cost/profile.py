"""Measure op times on this machine's CPU by running a traced training step for real.

:func:`profile_cpu` re-runs the step's fx graph node by node with real tensors (copies of the
model's parameters, its example batch, zero optimizer state), times every aten call with
``time.perf_counter`` (CPU ops are synchronous), and sums the calls folded into each op (a view
costs microseconds; it is charged to the op it was folded into). Each op gets the median over
``runs`` timed runs after ``warmup`` untimed ones, stored in the graph as a :class:`Measurement`
keyed by this CPU's model name (kind ``cpu``), so the simulator uses it for devices of that model.

It also reports, per op type, how far the roofline estimate ``max(FLOPs / peak, bytes / mem_bw)``
is from the measurement. ``peak`` and ``mem_bw`` default to what :func:`measure_roofline` measures
here (a large matmul and a large copy), so the ratio shows how well FLOPs and bytes predict time,
not how far a datasheet is from reality.

An imported workload (a graph file with no model behind it) has no code to run: profiling it is a
one-line :class:`PostplaceError`.
"""

from __future__ import annotations

import dataclasses
import platform
import time
from dataclasses import dataclass

import numpy as np
import torch

from postplace.errors import PostplaceError
from postplace.graph.opgraph import Measurement, OpGraph

__all__ = ["OpTypeRow", "ProfileReport", "cpu_model_name", "measure_roofline", "profile_cpu"]

_SOURCE_OPS = ("parameter", "buffer", "input", "constant")


def cpu_model_name() -> str:
    """This CPU's model name (``/proc/cpuinfo`` "model name"), the device key for its measurements."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "cpu"


def measure_roofline(n: int = 1024, copy_mb: int = 256, repeats: int = 20) -> tuple[float, float]:
    """(peak FLOP/s, memory bytes/s) of this CPU as torch sees them: best of ``repeats`` timings of
    an ``n x n`` float32 matmul and of a ``copy_mb`` MB copy (read + write counted)."""
    a, b = torch.randn(n, n), torch.randn(n, n)
    src = torch.empty(copy_mb * 2**20 // 4)
    dst = torch.empty_like(src)
    best_mm = best_cp = float("inf")
    torch.mm(a, b)
    dst.copy_(src)
    for _ in range(repeats):
        t0 = time.perf_counter()
        torch.mm(a, b)
        best_mm = min(best_mm, time.perf_counter() - t0)
        t0 = time.perf_counter()
        dst.copy_(src)
        best_cp = min(best_cp, time.perf_counter() - t0)
    return 2.0 * n**3 / best_mm, 2.0 * src.numel() * 4 / best_cp


@dataclass(frozen=True)
class OpTypeRow:
    op_type: str
    count: int
    measured_s: float  #: sum of the medians over ops of this type
    roofline_s: float  #: sum of the roofline estimates
    median_ratio: float  #: median over ops of measured / roofline (1 = roofline exact; >1 = slower)


@dataclass(frozen=True)
class ProfileReport:
    key: str
    runs: int
    peak_flops: float
    mem_bw: float
    step_s: float  #: sum of all op medians
    rows: tuple[OpTypeRow, ...]

    def format(self, top: int = 15) -> str:
        """A plain-text table, op types by total measured time."""
        lines = [
            f"CPU '{self.key}', median of {self.runs} runs; "
            f"roofline peak {self.peak_flops / 1e9:.1f} GFLOP/s, "
            f"memory {self.mem_bw / 1e9:.1f} GB/s; sum of op times {self.step_s * 1e3:.1f} ms",
            f"{'op type':32} {'ops':>6} {'measured ms':>12} {'roofline ms':>12} {'median meas/roof':>17}",
        ]
        for r in self.rows[:top]:
            lines.append(
                f"{r.op_type:32} {r.count:6d} {r.measured_s * 1e3:12.3f} {r.roofline_s * 1e3:12.3f} "
                f"{r.median_ratio:17.2f}"
            )
        if len(self.rows) > top:
            lines.append(f"... {len(self.rows) - top} more op types")
        return "\n".join(lines)


class _TimingInterpreter(torch.fx.Interpreter):
    def __init__(self, gm):
        super().__init__(gm)
        self.times: dict[str, float] = {}

    def run_node(self, n):
        if n.op != "call_function":
            return super().run_node(n)
        t0 = time.perf_counter()
        out = super().run_node(n)
        self.times[n.name] = time.perf_counter() - t0
        return out


def profile_cpu(
    target,
    *,
    size: str = "small",
    optimizer: str = "sgd",
    runs: int = 5,
    warmup: int = 1,
    peak_flops: float | None = None,
    mem_bw: float | None = None,
    threads: int | None = None,
) -> tuple[OpGraph, ProfileReport]:
    """Profile a training step on this CPU; return the graph with a CPU measurement added, and a report.

    ``target`` is a :class:`~postplace.graph.trace_torch.Traced`, a zoo model name (traced at
    ``size`` with ``optimizer``), or an OpGraph traced from a zoo model (traced again from the config
    it records). Any other OpGraph was imported and has nothing to run: :class:`PostplaceError`.
    ``threads`` sets torch's intra-op threads while timing (default: leave them as they are); other
    processes competing for the cores inflate single calls, which the median over runs damps.
    """
    from postplace.graph.trace_torch import Traced

    traced = _resolve(target, size, optimizer)
    assert isinstance(traced, Traced)
    if runs < 1 or warmup < 0:
        raise PostplaceError(
            f"profile_cpu: runs must be >= 1 and warmup >= 0 (got runs={runs}, warmup={warmup})"
        )
    graph = traced.graph
    samples = np.zeros((runs, graph.num_ops))
    saved_threads = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    used_threads = torch.get_num_threads()
    try:
        _time_runs(traced, samples, runs, warmup)
        if peak_flops is None or mem_bw is None:
            mp, mb = measure_roofline()
            peak_flops, mem_bw = peak_flops or mp, mem_bw or mb
    finally:
        torch.set_num_threads(saved_threads)
    times = np.median(samples, axis=0)
    types = np.array(graph.op_types)
    times[np.isin(types, _SOURCE_OPS)] = 0.0  # sources do no work; a stray view charged to them is noise
    key = cpu_model_name()
    prov = (
        f"profile_cpu: median of {runs} runs (after {warmup} warm-up) of each aten call, run node by node "
        f"on real tensors; torch {torch.__version__}, {used_threads} threads, "
        f"{time.strftime('%Y-%m-%d %H:%M:%S %Z')}"
    )
    measured = tuple(m for m in graph.measured if m.key != key) + (Measurement(key, "cpu", times, prov),)
    out = dataclasses.replace(graph, measured=measured)
    return out, _report(out, times, key, runs, peak_flops, mem_bw)


def _time_runs(traced, samples, runs, warmup) -> None:
    """Fill ``samples[run, op]`` with the seconds of the aten calls folded into each op."""
    with torch.no_grad():
        for r in range(warmup + runs):
            interp = _TimingInterpreter(traced.gm)
            interp.run(traced.real_args())
            if r >= warmup:
                for node_name, t in interp.times.items():
                    op = traced.op_of_node.get(node_name, -1)
                    if op >= 0:
                        samples[r - warmup, op] += t


def _resolve(target, size, optimizer):
    from postplace.graph.trace_torch import Traced
    from postplace.zoo import MODELS, trace_model

    if isinstance(target, Traced):
        return target
    if isinstance(target, str):
        if target not in MODELS:
            raise PostplaceError(
                f"cannot profile '{target}': not a zoo model ({', '.join(MODELS)}); "
                "for your own model, trace it with postplace.graph.trace_torch.trace and pass the result"
            )
        return trace_model(target, size, optimizer)
    if isinstance(target, OpGraph):
        zoo = target.metadata.get("zoo")
        if not zoo:
            raise PostplaceError(
                f"graph '{target.name}' was imported, not traced from a model: there is no code to run, "
                "so it cannot be profiled here; profile a zoo model or a torch model instead"
            )
        from postplace.graph.optimizers import optimizer_from_record

        recorded = optimizer_from_record(target.metadata.get("optimizer", optimizer))
        traced = trace_model(zoo["name"], zoo["size"], recorded, precision=target.metadata.get("precision", "fp32"))
        if traced.graph.names != target.names:
            raise PostplaceError(
                f"graph '{target.name}' no longer matches zoo model '{zoo['name']}' as traced now "
                "(the model or tracer changed); re-create the graph with `postplace graph`"
            )
        return dataclasses.replace(traced, graph=dataclasses.replace(traced.graph, measured=target.measured))
    raise PostplaceError(f"cannot profile a {type(target).__name__}; pass a zoo model name or a traced model")


def _report(graph: OpGraph, times, key, runs, peak, bw) -> ProfileReport:
    roof = np.maximum(graph.flops / peak, graph.bytes_accessed / bw)
    rows = []
    types = np.array(graph.op_types)
    for t in sorted(set(graph.op_types) - set(_SOURCE_OPS)):
        idx = np.flatnonzero(types == t)
        pos = idx[roof[idx] > 0]
        ratio = float(np.median(times[pos] / roof[pos])) if pos.size else float("nan")
        rows.append(OpTypeRow(t, int(idx.size), float(times[idx].sum()), float(roof[idx].sum()), ratio))
    rows.sort(key=lambda r: -r.measured_s)
    return ProfileReport(key, runs, float(peak), float(bw), float(times.sum()), tuple(rows))
