"""The one-shot placers (issue 5) on the shared workloads: simulated step time, ratios, OOM, wall time.

    python benchmarks/placers.py [--shared ../shared/data/dnn-partitioning] [--clusters k80x4 k80x2]
                                 [--workloads resnet50_training bert_l-3_training gnmt_training]

For each cluster and workload: every placer of ``postplace.placers.PLACERS`` with its defaults (seed 0,
roofline/measured cost model), evaluated by the simulator; ``/LB`` is the step time over the
simulator's lower bound, ``/single`` over the best single device's step time. ``wall`` is the placer's
own time (the simulation is not counted), the median of ``--repeats`` runs. The last row per workload
is data parallelism over the GPUs: a different kind of parallelism (replicas, not a placement),
estimated analytically (see ``postplace.placers.data_parallel``), for the same global batch.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

from postplace.cluster import load_cluster
from postplace.errors import PostplaceError
from postplace.graph import load_graph
from postplace.placers import PLACERS, data_parallel_step_time
from postplace.sim import Simulator

WORKLOADS = ("resnet50_training", "bert_l-3_training", "gnmt_training")


def timed(fn, repeats: int, *args):
    walls, out = [], None
    for _ in range(repeats):
        t = time.perf_counter()
        out = fn(*args)
        walls.append(time.perf_counter() - t)
    return out, statistics.median(walls)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shared", default=str(Path(__file__).resolve().parents[2] / "shared/data/dnn-partitioning"))
    ap.add_argument("--clusters", nargs="+", default=["k80x4", "k80x2"])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--workloads", nargs="+", default=list(WORKLOADS), help="shared workloads to run (file stems)")
    args = ap.parse_args()
    header = (
        f"{'cluster':<7} {'graph':<18} {'placer':<14} {'step (s)':>10} {'/LB':>6} {'/single':>8} {'OOM':>4} "
        f"{'wall (s)':>9}"
    )
    for cname in args.clusters:
        cluster = load_cluster(cname)
        print(header)
        for wl in args.workloads:
            path = Path(args.shared) / f"{wl}.json"
            if not path.exists():
                print(f"(skipping {wl}: {path} not found)")
                continue
            graph = load_graph(path)
            sim = Simulator(graph, cluster)
            lb = sim.lower_bound
            single = None
            rows = []
            for name, fn in PLACERS.items():
                try:
                    dev, wall = timed(fn, args.repeats, graph, cluster)
                except PostplaceError as exc:
                    print(f"{cname:<7} {wl:<18} {name:<14} failed: {exc}")
                    continue
                r = sim.evaluate(dev[None])
                step = float(r.step_time[0])
                if name == "single":
                    single = step
                rows.append((name, step, bool(r.oom[0]), wall))
            dp, wall = timed(data_parallel_step_time, args.repeats, graph, cluster)
            rows.append(("data-parallel*", dp.step_time, dp.oom, wall))
            for name, step, oom, wall in rows:
                ratio = f"{step / single:8.3f}" if single else f"{'-':>8}"
                print(
                    f"{cname:<7} {wl:<18} {name:<14} {step:10.4f} {step / lb:6.3f} {ratio} "
                    f"{'yes' if oom else 'no':>4} {wall:9.4f}"
                )
            print(
                f"{'':<7} {wl:<18} lower bound {lb:.4f} s; data parallel: compute {dp.compute_time:.4f} s + "
                f"all-reduce {dp.allreduce_time:.4f} s of {dp.gradient_bytes / 1e6:.1f} MB ({dp.gradient_source})"
            )
        print()
    print("* data-parallel is not a placement: replicas on every GPU plus a ring all-reduce (analytic estimate)")


if __name__ == "__main__":
    main()
