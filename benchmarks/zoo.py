"""Trace every zoo model and print what its training-step graph holds (issue 3).

    PYTHONPATH=src python benchmarks/zoo.py [--size full|small] [--models a,b]

Columns: aten calls before folding, ops and edges after, total GFLOP of one step, fwd+bwd FLOPs over
forward FLOPs, parameter bytes, colocation coverage (backward ops linked to their forward op through
autograd sequence numbers), number and largest size of colocation sets, trace time (make_fx with fake
tensors on this machine; the model's construction is not included).

The last two columns are the simulated step times (roofline costs) of the whole step on one K80
die and on the CPU of the ``k80x4`` preset; "OOM" marks a placement whose peak exceeds the device.
"""

from __future__ import annotations

import argparse
import platform
import time

import torch

from postplace.zoo import MODELS, trace_model
from postplace.zoo.cli import graph_summary


#: (header, fn(OpGraph) -> str) columns appended to the table; the simulator adds its own here.
def _single_device_ms(device: str):
    def column(graph) -> str:
        from postplace.cluster import load_cluster
        from postplace.cluster.placement import single_device
        from postplace.sim import Simulator

        cluster = load_cluster("k80x4")
        r = Simulator(graph, cluster).evaluate_ops(single_device(graph, cluster, device)[None])
        return f"{r.step_time[0] * 1e3:.1f}" + (" OOM" if r.oom[0] else "")

    return column


EXTRA_COLUMNS: list = [("1 K80 ms (sim)", _single_device_ms("gpu0")), ("CPU ms (sim)", _single_device_ms("cpu"))]

HEAD = (
    f"| {'model':13} | {'aten calls':>10} | {'ops':>6} | {'edges':>6} | {'GFLOP/step':>10} "
    f"| {'fwd+bwd/fwd':>11} "
    f"| {'params MiB':>10} | {'coloc cov':>9} | {'sets':>5} | {'largest':>7} | {'trace s':>7} |"
)


def table(models, size="full", extra=None) -> list[str]:
    """Markdown table lines, one row per model, traced afresh (no cache) so trace time is real."""
    extra = list(EXTRA_COLUMNS) + list(extra or [])
    head = HEAD + "".join(f" {h} |" for h, _ in extra)
    lines = [head, "|" + "|".join("-" * (len(c) + 0) for c in head.split("|")[1:-1]) + "|"]
    for name in models:
        t0 = time.perf_counter()
        graph = trace_model(name, size).graph
        total = time.perf_counter() - t0
        s = graph_summary(graph)
        row = (
            f"| {name:13} | {s['ops_before']:10d} | {s['ops']:6d} | {s['edges']:6d} | {s['gflops']:10.1f} "
            f"| {s['fwd_bwd_over_fwd']:11.2f} | {s['param_bytes'] / 2**20:10.1f} | {s['coverage']:9.1%} "
            f"| {s['coloc_sets']:5d} | {s['largest_set']:7d} | {s['trace_s']:7.1f} |"
        )
        row += "".join(f" {fn(graph)} |" for _, fn in extra)
        lines.append(row)
        print(f"  ({name}: build + trace + graph {total:.1f} s)", flush=True)
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", default="full", choices=("small", "full"))
    ap.add_argument("--models", default=",".join(MODELS))
    args = ap.parse_args()
    print(
        f"machine: {platform.processor() or platform.machine()}, {torch.get_num_threads()} torch threads, "
        f"torch {torch.__version__}, python {platform.python_version()}"
    )
    for line in table(args.models.split(","), args.size):
        print(line)


if __name__ == "__main__":
    main()
