"""Profile one zoo model's training step on this CPU and print measured vs roofline per op type.

PYTHONPATH=src python benchmarks/profile_cpu.py [--model resnet50] [--size full] [--runs 3]
"""

from __future__ import annotations

import argparse
import time

from postplace.cost.profile import profile_cpu
from postplace.zoo.cli import traced_step


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="resnet50")
    ap.add_argument("--size", default="full", choices=("small", "full"))
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--top", type=int, default=20)
    args = ap.parse_args()
    t0 = time.perf_counter()
    graph, report = profile_cpu(traced_step(args.model, args.size), runs=args.runs)
    print(f"{graph.name}: {graph.num_ops} ops")
    print(report.format(top=args.top))
    print(f"wall time {time.perf_counter() - t0:.1f} s; provenance: {graph.measured[-1].provenance}")


if __name__ == "__main__":
    main()
