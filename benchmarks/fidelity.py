"""Simulator fidelity against real step times: calibrate on some zoo models and batch sizes, score on others.

    PYTHONPATH=src python benchmarks/fidelity.py [--threads 1] [--runs 3] [--save m.pkl | --load m.pkl]

Every configuration of :data:`postplace.runtime.calibrate.FIDELITY_CONFIGS` is traced, its ops are
timed on every device present and its placements (single CPU; with CUDA also single GPUs and a
CPU+GPU split) are run for real (median of the last 5 of 10 steps). The cost model is fitted on the
calibration split (resnet50, rnnlm, gpt2 at their smallest and largest batch) and scored on the rest
(the same models at the other batch sizes, and inception_v3, nmt2, nmt4 at all batch sizes). For
reference it also scores the plain roofline (measured peak and bandwidth, no fit) and the graphs' own
per-op measurements (in-sample: every op of that very graph measured).
"""

from __future__ import annotations

import argparse
import pickle
import time

import numpy as np
import torch

from postplace.runtime.calibrate import (
    FIDELITY_CONFIGS,
    FidelityReport,
    FidelityRow,
    device_model,
    device_roofline,
    devices_present,
    fidelity,
    measure_config,
    measure_link,
    measured_cluster,
)

CALIBRATION_MODELS = ("resnet50", "rnnlm", "gpt2")


def is_calibration(model: str, k: int, n: int) -> bool:
    return model in CALIBRATION_MODELS and k in (0, n - 1)


def other_cost_models(measured, devices, rooflines, links) -> dict:
    """Spearman / MdAPE over the held-out rows for the plain roofline and the graphs' own measurements."""
    import dataclasses

    from postplace.sim import Simulator

    cluster = measured_cluster(devices, rooflines, links)
    out = {}
    for label, strip in (("roofline, no fit", True), ("per-op profile of the same graph", False)):
        rows = []
        for split, m in measured:
            g = dataclasses.replace(m.graph, measured=()) if strip else m.graph
            labels = list(m.placements)
            res = Simulator(g, cluster).evaluate_ops(np.stack([m.placements[k] for k in labels]))
            rows += [
                FidelityRow(m.config.label, k, float(res.step_time[i]), m.step_times[k], split)
                for i, k in enumerate(labels)
            ]
        out[label] = FidelityReport(rows, "").scores("held-out")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--models", default=",".join(FIDELITY_CONFIGS))
    ap.add_argument("--save", default=None, help="pickle the measurements here")
    ap.add_argument("--load", default=None, help="score pickled measurements instead of measuring")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    t0 = time.perf_counter()
    if args.load:
        with open(args.load, "rb") as f:
            devices, rooflines, links, measured = pickle.load(f)
    else:
        devices = devices_present()
        rooflines = {device_model(d): device_roofline(d) for _, d in devices}
        links = {n: measure_link(devices[0][1], d) for n, d in devices[1:]}
        measured = []
        for model in args.models.split(","):
            cfgs = FIDELITY_CONFIGS[model]
            for k, cfg in enumerate(cfgs):
                split = "calibration" if is_calibration(model, k, len(cfgs)) else "held-out"
                m = measure_config(cfg, devices, rooflines=rooflines, runs=args.runs)
                measured.append((split, m))
                print(
                    f"  measured {cfg.label:20} {split:11} "
                    + ", ".join(f"{p} {t * 1e3:.1f} ms" for p, t in m.step_times.items())
                    + (f" ({m.reasons})" if m.reasons else ""),
                    flush=True,
                )
        if args.save:
            with open(args.save, "wb") as f:
                pickle.dump((devices, rooflines, links, measured), f)
    report, fits = fidelity(
        [m for s, m in measured if s == "calibration"],
        [m for s, m in measured if s == "held-out"],
        devices,
        rooflines,
        links,
    )
    report.header = f"torch {torch.__version__}, {torch.get_num_threads()} thread(s); rooflines " + ", ".join(
        f"{k}: {p / 1e9:.1f} GFLOP/s, {b / 1e9:.1f} GB/s" for k, (p, b) in rooflines.items()
    )
    print(report.format())
    for label, s in other_cost_models(measured, devices, rooflines, links).items():
        print(f"for reference, {label}: held-out Spearman {s['spearman']:.3f}, median absolute error {s['mdape']:.1%}")
    for key, f in fits.items():
        print(
            f"fit for {key}: {len(f.coef)} op types with their own coefficients, default (a, b, c) = "
            + ", ".join(f"{c:.3g}" for c in f.default)
        )
    print(f"wall time {time.perf_counter() - t0:.0f} s")


if __name__ == "__main__":
    main()
