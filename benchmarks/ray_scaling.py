"""Evaluations per second against the number of Ray actors, for the simulator and for a slow evaluator.

The slow evaluator is the simulator plus a sleep per placement (``--sleep``, default 50 ms), standing in
for a real measurement (TorchEvaluator's 10 steps take tens of milliseconds to seconds per placement).
In-process (no Ray) is the baseline; each Ray row is a pool of N actors on a local cluster started
with ``--cpus`` CPUs. Batches are Post's (48 placements) and a larger one (480). Each cell: the best of
``--reps`` timed batches after one warm-up batch.

    PYTHONPATH=src python benchmarks/ray_scaling.py [--model gpt2 --size small --cluster k80x4]
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np

from postplace.cluster import load_cluster
from postplace.distributed import RayEvaluator, SimulatorFactory
from postplace.search import make_problem
from postplace.testing.faulty import SleepyFactory
from postplace.zoo import cached_graph


def best_rate(ev, rows: np.ndarray, reps: int) -> float:
    ev.evaluate(rows)
    best = np.inf
    for _ in range(reps):
        t0 = time.perf_counter()
        ev.evaluate(rows)
        best = min(best, time.perf_counter() - t0)
    return len(rows) / best


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="gpt2")
    ap.add_argument("--size", default="small")
    ap.add_argument("--cluster", default="k80x4")
    ap.add_argument("--cpus", type=int, default=os.cpu_count() or 2)
    ap.add_argument("--sleep", type=float, default=0.05)
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args()
    import ray

    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    graph, cluster = cached_graph(args.model, args.size), load_cluster(args.cluster)
    prob = make_problem(graph, cluster, groups=256, seed=0)
    sim = SimulatorFactory(graph, cluster, group_of_op=prob.simulator.group_of_op)
    slow = SleepyFactory(sim, args.sleep)
    rng = np.random.default_rng(0)
    batches = {n: rng.integers(0, cluster.num_devices, (n, prob.space.num_units)) for n in (48, 480)}
    ray.init(num_cpus=args.cpus, include_dashboard=False, log_to_driver=False)
    print(
        f"{graph.name} ({graph.num_ops} ops, {prob.space.num_units} groups) on {cluster.name}; "
        f"local Ray with {args.cpus} CPUs; machine: {os.cpu_count()} cores"
    )
    print(f"{'evaluator':28} {'actors':>6} {'batch':>6} {'evals/s':>10} {'vs in-process':>14}")
    for label, fac, sizes in (
        ("simulator", sim, (48, 480)),
        (f"simulator + sleep {args.sleep * 1e3:g} ms", slow, (48,)),
    ):
        local = fac()
        for n in sizes:
            rows = batches[n]
            base = best_rate(local, rows, args.reps)
            print(f"{label:28} {'none':>6} {n:6} {base:10.1f} {1.0:14.2f}")
            for actors in range(1, args.cpus + 1):
                ev = RayEvaluator(fac, actors=actors, address=None)
                rate = best_rate(ev, rows, args.reps)
                ev.shutdown()
                print(f"{label:28} {actors:6} {n:6} {rate:10.1f} {rate / base:14.2f}")
    ray.shutdown()


if __name__ == "__main__":
    main()
