"""Make the profiled workload shipped in ``src/postplace/data/`` (README, "Where one GPU is not enough").

    python benchmarks/make_shipped_workload.py [--runs 5] [--out src/postplace/data/resnet50_profiled.json]

Traces the zoo's full ResNet-50 training step (batch 32, 224x224, SGD with momentum, fp32), runs it on
this machine's CPU node by node with real tensors and keeps each op's median time over ``--runs`` runs
(:func:`postplace.zoo.trace_model`, then :func:`postplace.cost.profile.profile_cpu`: what
``postplace profile resnet50 --size full`` does), then writes the graph with the machine, torch
version, thread count and this command in its metadata (``metadata["shipped"]``). The measurement is keyed by this CPU's model name, so only a device of that
model in a cluster file gets the measured times; every other device is priced by its roofline.

It also prints this CPU's roofline (peak FLOP/s, copy bandwidth) as ``profile_cpu`` measured it: the
shipped cluster file's ``cpu`` device gives those figures, for any op it would have to estimate.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import platform
import sys
import time
from pathlib import Path

import torch

import postplace
from postplace.cost.profile import cpu_model_name, profile_cpu
from postplace.zoo import trace_model

ROOT = Path(__file__).resolve().parent.parent


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=5, help="timed runs per op (the median is kept)")
    ap.add_argument("--out", type=Path, default=ROOT / "src" / "postplace" / "data" / "resnet50_profiled.json")
    args = ap.parse_args()
    t0 = time.perf_counter()
    graph, report = profile_cpu(trace_model("resnet50", "full", "sgd"), runs=args.runs)
    wall = time.perf_counter() - t0
    try:
        load = os.getloadavg()
    except OSError:
        load = None
    shipped = {
        "what": "the zoo's full ResNet-50 training step (batch 32, 224x224, SGD momentum 0.9, fp32), "
        "op times measured on the CPU below; every other device is priced by its roofline",
        "command": "python benchmarks/make_shipped_workload.py --runs " + str(args.runs),
        "equivalent_cli": f"postplace profile resnet50 --size full --runs {args.runs} --out FILE",
        "measured_device": {
            "kind": "cpu",
            "model": cpu_model_name(),
            "logical_cpus": os.cpu_count(),
            "torch_threads": torch.get_num_threads(),
        },
        "machine": f"{platform.system()} {platform.release()} {platform.machine()}",
        "python": platform.python_version(),
        "torch_version": torch.__version__,
        "postplace_version": postplace.__version__,
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "load_average_after": None if load is None else [round(x, 2) for x in load],
        "roofline_measured": {"peak_flops": report.peak_flops, "memory_bandwidth": report.mem_bw},
        "sum_of_op_medians_s": report.step_s,
        "wall_s": round(wall, 1),
    }
    graph = dataclasses.replace(graph, name="resnet50-profiled", metadata={**graph.metadata, "shipped": shipped})
    args.out.parent.mkdir(parents=True, exist_ok=True)
    graph.save(args.out)
    print(report.format(top=12))
    print(f"{graph.num_ops} ops; wall {wall:.1f} s; written to {args.out} ({args.out.stat().st_size / 1e3:.0f} kB)")
    print(f"provenance: {graph.measured[-1].provenance}")
    print(f"cpu roofline: peak_flops = {report.peak_flops:.3e}, memory_bandwidth = {report.mem_bw:.3e}")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
