"""Placed steps as one process per device: measured step time per rank beside the simulated one.

    python benchmarks/distributed_run.py [--models resnet50,gpt2] [--stages 2] [--microbatches 1] [--steps 10]
                                         [--backend gloo]

For each zoo model (small: batch 2) a GPipe-style pipeline (``place_pipeline``) over ``--stages`` GPUs of
``k80x2`` / ``k80x4``, the step traced as ``--microbatches`` micro-batches, is launched through torch's elastic
launcher (:func:`postplace.runtime.launch`), one process per stage, and timed: per rank the median
step time over the second half of the steps, the part of it inside sends and receives (waits
included), and the bytes it sent per step. Beside it: the same placement run in one process (every
device on the CPU, transfers as copies, :func:`postplace.runtime.apply`), and the simulator's step
time and bytes on the plan's cluster. With gloo the ranks are CPU processes standing in for the GPUs
(each with ``--threads`` torch threads), so the measured times are this machine's, not the cluster's;
``--backend nccl`` runs the ranks on their GPUs where they exist.

``--plan ddp`` (or ``zero1``, ``zero2``, ``fsdp``, a pipeline ``ddp:pp=2,schedule=1f1b``, tensor parallelism
``ddp:tp=2``) launches that plan instead (:func:`postplace.runtime.launcher.launch_plan`: one process per GPU
over ``--stages`` GPUs, ``pp`` stages of ``tp`` GPUs each for ``--stages / (pp tp)`` replicas, ``--microbatches`` a multiple of the replicas): "sent B" is then each rank's
messages and collective payload (all-reduced or, zero2, reduce-scattered gradients; ZeRO also all-gathered
parameters), "sim sent B" the simulated plan's for that rank, "sim ms" the simulated plan's step.
"""

from __future__ import annotations

import argparse
import os
import platform
import time

import numpy as np
import torch

from postplace.cluster import load_cluster
from postplace.placers.pipeline import place_pipeline
from postplace.runtime import apply, launch
from postplace.runtime.launcher import RandomBatches
from postplace.runtime.zoo_step import trace_zoo_step
from postplace.sim import Simulator


def one_process_ms(traced, placement, cluster, steps: int, threads: int) -> float:
    saved = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        step = apply(traced.model, traced, placement, cluster, device_map="cpu")
        batches = RandomBatches(0)
        times = []
        for _ in range(steps):
            batch = batches(traced)
            t0 = time.perf_counter()
            float(step(*batch))
            times.append(time.perf_counter() - t0)
    finally:
        torch.set_num_threads(saved)
    return float(np.median(times[len(times) // 2 :])) * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="resnet50,gpt2")
    ap.add_argument("--stages", type=int, default=2, help="pipeline stages = processes (2 on k80x2, up to 4 on k80x4)")
    ap.add_argument("--microbatches", type=int, default=1)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--backend", default="gloo")
    ap.add_argument(
        "--plan",
        default=None,
        help="ddp, zero1, zero2, fsdp (+recompute...) or a pipeline (ddp:pp=2,schedule=1f1b): launch it over --stages GPUs",
    )
    args = ap.parse_args()
    cluster = load_cluster("k80x2" if args.stages <= 2 else "k80x4")
    print(
        f"{platform.machine()}, {os.cpu_count()} cores, torch {torch.__version__}; backend {args.backend}, "
        f"{args.threads} thread(s) per rank, {args.steps} steps (medians of the second half); cluster {cluster.name}, "
        f"{args.microbatches} micro-batch(es)"
    )
    print(
        f"{'model':<10} {'rank':>4} {'device':<6} {'step ms':>8} {'comm ms':>8} {'sent B':>9} {'sim sent B':>10} "
        f"{'1-proc ms':>9} {'sim ms':>8} {'launch s':>8}"
    )
    for name in args.models.split(","):
        traced = trace_zoo_step(name, "small", microbatches=args.microbatches)
        if args.plan:
            ddp_rows(name, traced, cluster, args)
            continue
        placement = place_pipeline(traced.graph, cluster, stages=args.stages)
        schedule = Simulator(traced.graph, cluster).schedule(placement)
        t0 = time.perf_counter()
        result = launch(
            traced,
            placement,
            cluster,
            steps=args.steps,
            batches=RandomBatches(0),
            backend=args.backend,
            threads=args.threads,
        )
        wall = time.perf_counter() - t0
        single = one_process_ms(traced, placement, cluster, args.steps, args.threads)
        sim_sent = {}
        for _op, _slot, a, _b, nbytes, *_ in schedule.transfers:
            sim_sent[a] = sim_sent.get(a, 0) + int(nbytes)
        for r, device in result.ranks.items():
            half = len(result.step_times_s[r]) // 2
            step_ms = np.median(result.step_times_s[r][half:]) * 1e3
            comm_ms = np.median(result.comm_times_s[r][half:]) * 1e3
            d = result.plan.ranks[r]
            print(
                f"{name:<10} {r:>4} {device:<6} {step_ms:8.2f} {comm_ms:8.2f} {result.bytes_sent[r]:9,d} "
                f"{sim_sent.get(d, 0):10,d} {single:9.2f} {schedule.step_time * 1e3:8.3f} {wall:8.1f}"
            )


def ddp_rows(name, traced, cluster, args) -> None:
    """The plan ``args.plan`` over ``args.stages`` GPUs (replicas, or ``pp`` stages of ``args.stages / pp``
    replicas), launched and simulated."""
    from postplace.placers.practitioner import plan_step
    from postplace.plans import parse_plan
    from postplace.runtime.launcher import launch_plan, simulated_plan_bytes

    head, _, options = args.plan.partition(":")
    spec = parse_plan(args.plan)
    per_replica = (spec.pipeline or 1) * (spec.tensor or 1)
    plan = f"{head}:" + ",".join(
        [*filter(None, [options]), f"m={args.microbatches}", f"dp={args.stages // per_replica}"]
    )
    gpus = [d for d, dev in enumerate(cluster.devices) if dev.kind == "gpu"][: args.stages]
    sim = plan_step(traced.graph, cluster, parse_plan(plan), gpus)
    t0 = time.perf_counter()
    result = launch_plan(
        traced, plan, cluster, steps=args.steps, batches=RandomBatches(0), backend=args.backend, threads=args.threads
    )
    wall = time.perf_counter() - t0
    sim_sent = simulated_plan_bytes(traced.graph, parse_plan(plan), cluster, result.plan)["bytes_sent"]
    single = one_process_ms(traced, np.zeros(traced.graph.num_ops, dtype=np.int64), cluster, args.steps, args.threads)
    for r, device in result.ranks.items():
        half = len(result.step_times_s[r]) // 2
        step_ms = np.median(result.step_times_s[r][half:]) * 1e3
        comm_ms = np.median(result.comm_times_s[r][half:]) * 1e3
        print(
            f"{name:<10} {r:>4} {device:<6} {step_ms:8.2f} {comm_ms:8.2f} {result.bytes_sent[r]:9,d} "
            f"{sim_sent[r]:10,d} {single:9.2f} {sim.step_time_s * 1e3:8.3f} {wall:8.1f}"
        )


if __name__ == "__main__":
    main()
