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

It takes a traced step (:class:`~postplace.graph.trace_torch.Traced`): the code and tensors to run
come with it. Turning a zoo model name, or a graph file traced from a zoo model, into one is the zoo's
business (:func:`postplace.zoo.cli.traced_step`, what ``postplace profile`` does): the cost models know
nothing of the zoo (DESIGN.md section 1). A bare graph has no code to run: profiling an imported
workload (a graph file with no model behind it) is a one-line :class:`PostplaceError`.
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

MAX_RUNS = 10_000
"""The most timed runs per op: the median of a few suffices (5 by default), and every run keeps one
float per op (10^12 runs asked for petabytes)."""


def check_runs(runs: int) -> None:
    """``--runs`` of ``profile`` and ``calibrate``: 1 to :data:`MAX_RUNS`, else one error line."""
    if not 1 <= runs <= MAX_RUNS:
        raise PostplaceError(f"--runs {runs}: give 1 to {MAX_RUNS:,} timed runs (the median is kept)")


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


class NodeTimer(torch.fx.Interpreter):
    """Runs an fx graph node by node and times each aten call alone (``times``: seconds by node name): the
    interpreter's own work per node (fetching the arguments) is no op's cost. On a CUDA ``device`` the
    call is synchronised on both sides, so its time is the kernel's, launch included."""

    def __init__(self, gm, device: torch.device | None = None):
        super().__init__(gm)
        self.cuda = device if device is not None and device.type == "cuda" else None
        self.times: dict[str, float] = {}

    def run_node(self, n):
        self._node = n
        return super().run_node(n)

    def call_function(self, target, args, kwargs):
        if self.cuda is not None:
            torch.cuda.synchronize(self.cuda)
        t0 = time.perf_counter()
        out = super().call_function(target, args, kwargs)
        if self.cuda is not None:
            torch.cuda.synchronize(self.cuda)
        self.times[self._node.name] = time.perf_counter() - t0
        return out


def profile_cpu(
    traced,
    *,
    runs: int = 5,
    warmup: int = 1,
    peak_flops: float | None = None,
    mem_bw: float | None = None,
    threads: int | None = None,
) -> tuple[OpGraph, ProfileReport]:
    """Profile a traced training step on this CPU; return its graph with a CPU measurement added, and a report.

    ``traced`` is a :class:`~postplace.graph.trace_torch.Traced` (:func:`postplace.graph.trace_torch.trace`
    of a model; :func:`postplace.zoo.cli.traced_step` for a zoo model or a graph file traced from one).
    Anything else, an OpGraph included, has no code to run here: :class:`PostplaceError` saying why.
    ``threads`` sets torch's intra-op threads while timing (default: leave them as they are); other
    processes competing for the cores inflate single calls, which the median over runs damps.
    """
    from postplace.graph.trace_torch import Traced

    if not isinstance(traced, Traced):
        raise PostplaceError(_not_traced(traced))
    if not 1 <= runs <= MAX_RUNS or warmup < 0:
        raise PostplaceError(
            f"profile_cpu: runs must be 1 .. {MAX_RUNS:,} and warmup >= 0 (got runs={runs}, warmup={warmup})"
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
            interp = NodeTimer(traced.gm)
            interp.run(traced.real_args())
            if r >= warmup:
                for node_name, t in interp.times.items():
                    op = traced.op_of_node.get(node_name, -1)
                    if op >= 0:
                        samples[r - warmup, op] += t


def _not_traced(target) -> str:
    """Why ``target`` cannot be profiled, and what to pass instead (one line)."""
    if isinstance(target, OpGraph):
        zoo = target.metadata.get("zoo")
        if not zoo:
            return (
                f"graph '{target.name}' was imported, not traced from a model: there is no code to run, "
                "so it cannot be profiled here; profile a zoo model or a torch model instead"
            )
        return (
            f"graph '{target.name}' holds no code to run: trace zoo model '{zoo.get('name')}' again and pass "
            "the traced step (postplace.zoo.cli.traced_step(graph); `postplace profile FILE` does it)"
        )
    if isinstance(target, str):
        return (
            f"cannot profile '{target}': pass a traced step (postplace.graph.trace_torch.trace of your model; "
            f"for a zoo model postplace.zoo.cli.traced_step('{target}'), or `postplace profile {target}`)"
        )
    return f"cannot profile a {type(target).__name__}; pass a traced step (postplace.graph.trace_torch.Traced)"


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
