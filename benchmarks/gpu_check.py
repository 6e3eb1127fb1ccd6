"""One-command GPU check: numerics, calibration, fidelity and confirm on the CPU and CUDA GPUs present.

For a machine with one CPU and one or more CUDA GPUs; under 8 minutes on one modern GPU. Four parts,
everything written to one folder (``--out``, default ``runs/gpu_check``):

A. numerics: every zoo model (small) trained two steps with its ops split across ``cpu`` and ``gpu0``
   (a random placement by colocation set; dropout ops kept on the CPU so both runs draw the same mask),
   against eager training on the CPU: losses and updated parameters (TF32 off);
B. calibration (what ``postplace calibrate gpt2`` does): op times of GPT-2 (mid-sized) on every device
   present, the links, a fit on its smallest and largest batch, the fidelity report on the other two;
   writes ``measured.toml``;
C. fidelity: for each model of ``--models`` (default 4) at a mid-sized configuration, >= 10 placements
   (single CPU, single GPU, a layer split, random CPU+GPU splits by group, and Post's three best on the
   calibrated cluster) measured for real (median of steps 6-10) against the calibrated simulator:
   the table, Spearman, median error, worst cases (``fidelity.txt`` / ``.json``);
D. confirm: per model, Post's three best plus the simulator's best single device measured, the
   fastest measured returned (:func:`postplace.confirm.confirm`; ``confirm.txt`` / ``.json``);
E. kernel rates: a few bf16 GEMM shapes, a streaming add and (with 2+ GPUs) one NCCL all-reduce timed on
   gpu0, beside what the cost model's achieved rates (:mod:`postplace.cost.achieved`) predict for the
   GPU's model (``kernels.json``), so those rates are checked the first time a GPU is lent.

On a machine without CUDA, part A runs with ``gpu0`` mapped to the CPU (the placed step, its transfers
and colocation still checked) and B-D are skipped, saying why; ``--rehearse`` runs B-D too, with
``gpu0`` a second logical device on the CPU (same code paths, CPU numbers: a rehearsal, not a result).

Run (repository root; how to install on the lent GPU machine: benchmarks/gpu_check.sh)::

    python benchmarks/gpu_check.py --out runs/gpu_check
    python benchmarks/gpu_check.py --rehearse --models gpt2,rnnlm,nmt2 --budget 240   # CPU-only rehearsal
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
import traceback
from pathlib import Path

import numpy as np
import torch

from postplace.cluster.placement import colocation_representative, single_device
from postplace.confirm import candidates_from_run, confirm
from postplace.runtime import apply
from postplace.runtime import calibrate as cal
from postplace.runtime.evaluator import TorchEvaluator
from postplace.search import Budget, make_problem, make_strategy, run
from postplace.sim import EvalResult
from postplace.testing.eager import eager_sgd_losses
from postplace.zoo import MODELS, build, trace_model


class Log:
    def __init__(self, path: Path):
        self.f = open(path, "w")  # noqa: SIM115

    def __call__(self, text: str = "") -> None:
        print(text, flush=True)
        self.f.write(text + "\n")
        self.f.flush()


class Memo:
    """Measures each distinct op-level placement once (confirm re-asks for some of the fidelity rows)."""

    def __init__(self, inner):
        self.inner, self.name, self.cache = inner, inner.name, {}

    def evaluate(self, placements):
        placements = np.atleast_2d(placements)
        todo = list({p.tobytes(): p for p in placements if p.tobytes() not in self.cache}.values())
        if todo:
            res = self.inner.evaluate(np.stack(todo))
            for j, p in enumerate(todo):
                self.cache[p.tobytes()] = (res.step_time[j], res.peak_mem[j], res.oom[j], res.failed[j], res.reasons[j])
        rows = [self.cache[p.tobytes()] for p in placements]
        return EvalResult(
            np.array([r[0] for r in rows]),
            np.stack([r[1] for r in rows]),
            np.array([r[2] for r in rows]),
            np.array([r[3] for r in rows]),
            [r[4] for r in rows],
            self.name,
        )


# ------------------------------------------------------------------------------ A. numerics
def numerics(log: Log, gpu: str, tol: float = 1e-3) -> list[dict]:
    rows = []
    for k, name in enumerate(MODELS):
        t0 = time.perf_counter()
        tr = trace_model(name, "small")
        g = tr.graph
        rep = colocation_representative(g)
        dev = np.random.default_rng(k).integers(0, 2, g.num_ops)[rep]
        rng_ops = [i for i, t in enumerate(g.op_types) if "dropout" in t or "bernoulli" in t]
        for i in rng_ops:  # same random stream as the eager CPU run
            dev[rep == rep[i]] = 0
        step = apply(tr.model, tr, dev, ["cpu", "gpu0"], device_map={"cpu": "cpu", "gpu0": gpu})
        losses = []
        for _ in range(2):
            torch.manual_seed(123)
            losses.append(float(step().item()))
        model, inputs, loss_fn = build(name, "small")
        ref = eager_sgd_losses(model, inputs, loss_fn, 2)
        loss_err = max(abs(a - b) / max(abs(b), 1e-12) for a, b in zip(losses, ref, strict=True))
        param_err = 0.0
        for pname, p in model.named_parameters():
            q = step.parameters()[pname].detach().to("cpu")
            param_err = max(param_err, float(((q - p.detach()).abs() / (p.detach().abs() + 1e-4)).max()))
        ok = loss_err < tol and param_err < 100 * tol
        row = {
            "model": name,
            "ops": g.num_ops,
            "on_gpu0": int((dev == 1).sum()),
            "transfers": step.summary["transfers"],
            "loss_rel_err": loss_err,
            "param_rel_err": param_err,
            "ok": bool(ok),
            "s": time.perf_counter() - t0,
        }
        rows.append(row)
        log(
            f"  {name:14} {g.num_ops:5} ops, {row['on_gpu0']:5} on gpu0 ({gpu}), {row['transfers']:5} transfers: "
            f"loss rel err {loss_err:.1e}, param rel err {param_err:.1e}  {'ok' if ok else 'MISMATCH'}"
        )
    return rows


# ------------------------------------------------------------------------------ B. calibration
def calibration(log: Log, devices, out: Path, runs: int):
    t0 = time.perf_counter()
    rooflines = {cal.device_model(d): cal.device_roofline(d) for _, d in devices}
    links = {n: cal.measure_link(devices[0][1], d) for n, d in devices[1:]}
    cfgs = cal.FIDELITY_CONFIGS["gpt2"]
    measured = [cal.measure_config(c, devices, rooflines=rooflines, runs=runs) for c in cfgs]
    calib, held = [measured[0], measured[-1]], measured[1:-1]
    report, fits = cal.fidelity(calib, held, devices, rooflines, links)
    report.header = f"calibrated on gpt2 at batch {cfgs[0].label} and {cfgs[-1].label}; scored on the others"
    toml = cal.cluster_toml(devices, rooflines, links, fits)
    (out / "measured.toml").write_text(toml)
    text = report.format()
    (out / "calibration.txt").write_text(text + "\n")
    log(text)
    log(f"  wrote {out / 'measured.toml'} ({time.perf_counter() - t0:.0f} s)")
    return rooflines, links, fits


# ------------------------------------------------------------------------------ C + D
def fidelity_and_confirm(log: Log, devices, dmap, rooflines, links, fits, models, budget, out: Path, randoms: int):
    cluster = cal.measured_cluster(devices, rooflines, links, fits)
    cm = cal.CalibratedCostModel(fits)
    rows, confirms = [], {}
    for m in models:
        t0 = time.perf_counter()
        cfg = cal.FIDELITY_CONFIGS[m][1]
        tr = cal.trace_config(cfg)
        prob = make_problem(tr.graph, cluster, groups=32, cost_model=cm, seed=0)
        sim = prob.simulator
        search_dir = out / f"search-{m}"
        if search_dir.exists():
            import shutil

            shutil.rmtree(search_dir)
        run(make_strategy("post", prob.space, seed=0), sim, Budget(samples=budget), out_dir=search_dir)
        post = candidates_from_run(search_dir, sim, 3)
        labels, placements = [], []
        for d in cluster.device_names:
            labels.append(f"single:{d}")
            placements.append(single_device(tr.graph, cluster, d))
        for k, p in cal._placements(tr.graph, cluster.device_names).items():
            if k.startswith("split"):
                labels.append(k)
                placements.append(p)
        rng = np.random.default_rng(len(m))
        allowed = prob.space.allowed
        for r in range(randoms):
            units = np.array([rng.choice(np.flatnonzero(a)) for a in allowed])
            labels.append(f"random split {r + 1}")
            placements.append(prob.grouping.expand(units))
        for k, p in enumerate(post):
            labels.append(f"post #{k + 1}")
            placements.append(p)
        ops = np.stack(placements)
        measurer = Memo(TorchEvaluator(tr, cluster, device_map=dmap, steps=10, discard=5, timeout=60))
        meas = measurer.evaluate(ops)
        simd = sim.evaluate_ops(ops)
        for label, s, t, ok, why in zip(
            labels, simd.step_time, meas.step_time, ~(meas.oom | meas.failed), meas.reasons, strict=True
        ):
            rows.append(cal.FidelityRow(cfg.label, label, float(s), float(t) if ok else float("inf"), "held-out"))
            if not ok:
                log(f"  {cfg.label} {label}: did not run ({why})")
        res = confirm(sim, measurer, post, labels=[f"post #{k + 1}" for k in range(len(post))])
        confirms[m] = res.to_dict()
        log(
            f"\n  confirm, {cfg.label} (Post {budget} samples on the calibrated cluster; {time.perf_counter() - t0:.0f} s):"
        )
        log("  " + res.format().replace("\n", "\n  "))
    report = cal.FidelityReport(rows, ", ".join(f"{n} = {cal.device_model(d)} ({d})" for n, d in devices))
    report.header = "fidelity: placements measured for real against the calibrated simulator"
    text = report.format(worst=5)
    (out / "fidelity.txt").write_text(text + "\n")
    (out / "fidelity.json").write_text(
        json.dumps(
            {
                "scores": report.scores("held-out"),
                "rows": [
                    {
                        "config": r.config,
                        "placement": r.placement,
                        "simulated_s": r.simulated,
                        "measured_s": r.measured if np.isfinite(r.measured) else None,
                    }
                    for r in rows
                ],
            },
            indent=1,
        )
    )
    (out / "confirm.json").write_text(json.dumps(confirms, indent=1))
    log(text)
    return report


GEMM_SHAPES = ((16384, 4096, 4096), (16384, 14336, 4096), (16384, 4096, 14336), (2048, 768, 768), (8192, 768, 3072))


def _cuda_seconds(fn, repeats: int = 20) -> float:
    """Median seconds of ``fn`` on the current CUDA stream, timed with events after 3 warm-up calls."""
    for _ in range(3):
        fn()
    times = []
    for _ in range(repeats):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        torch.cuda.synchronize()
        times.append(a.elapsed_time(b) / 1e3)
    return float(np.median(times))


def kernel_rates(log: Log) -> dict:
    """Time GEMMs, a streaming add and an all-reduce on gpu0 against the achieved-rate model's prices."""
    from postplace.cluster import load_cluster
    from postplace.cost import RooflineCostModel
    from postplace.cost.achieved import ACHIEVED
    from postplace.graph import OpGraph

    name = torch.cuda.get_device_name(0)
    model = "H100" if "H100" in name else "A100-40GB" if "A100" in name else None
    preset = {"H100": ("dgx8", 1), "A100-40GB": ("mixed", 1)}.get(model)
    cluster = load_cluster(preset[0]) if preset else None
    log(f"  {name}: cost-model row {model or 'none (datasheet roofline only)'}")
    rows = []

    def predicted(flops, bytes_, out_bytes, kind):
        if cluster is None:
            return None
        g = OpGraph.build(
            ["k"],
            [],
            op_types=[kind],
            flops=[flops],
            bytes_accessed=[bytes_],
            output_bytes=[out_bytes],
            precision=["bf16"],
        )
        return float(RooflineCostModel().op_times(g, cluster).table[0, preset[1]])

    for m, n, k in GEMM_SHAPES:
        a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        b = torch.randn(k, n, device="cuda", dtype=torch.bfloat16)
        s = _cuda_seconds(lambda a=a, b=b: a @ b)
        flops = 2.0 * m * n * k
        p = predicted(flops, 2.0 * (m * k + k * n + m * n), 2.0 * m * n, "mm")
        rows.append({"kernel": f"mm {m}x{n}x{k} bf16", "measured_s": s, "predicted_s": p, "tflops": flops / s / 1e12})
    x = torch.randn(256 * 2**20, device="cuda", dtype=torch.bfloat16)
    s = _cuda_seconds(lambda: x.add(1.0))
    p = predicted(float(x.numel()), 4.0 * x.numel(), 2.0 * x.numel(), "add")
    rows.append({"kernel": "add 512 MB bf16", "measured_s": s, "predicted_s": p, "gbps": 4.0 * x.numel() / s / 1e9})
    if torch.cuda.device_count() > 1:
        import torch.cuda.nccl as nccl

        k = torch.cuda.device_count()
        bufs = [torch.ones(128 * 2**20, device=f"cuda:{d}", dtype=torch.bfloat16) for d in range(k)]
        s = _cuda_seconds(lambda: nccl.all_reduce(bufs), repeats=10)
        nbytes = 2.0 * bufs[0].numel()
        rows.append(
            {
                "kernel": f"all-reduce 256 MB over {k} GPUs",
                "measured_s": s,
                "predicted_s": None,
                "busbw_gbps": 2 * (k - 1) / k * nbytes / s / 1e9,
            }
        )
    else:
        log("  all-reduce skipped: one GPU")
    for r in rows:
        ratio = f"{r['predicted_s'] / r['measured_s']:.2f}" if r.get("predicted_s") else "-"
        rate = {k: v for k, v in r.items() if k in ("tflops", "gbps", "busbw_gbps")}
        log(f"  {r['kernel']}: measured {r['measured_s'] * 1e3:.3f} ms, predicted/measured {ratio}, {rate}")
    return {"gpu": name, "rates_row": model, "rates": ACHIEVED[model].__dict__ if model else None, "rows": rows}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="runs/gpu_check")
    ap.add_argument("--models", default="gpt2,rnnlm,nmt2,resnet50", help="zoo models for fidelity/confirm (>= 3)")
    ap.add_argument("--budget", type=int, default=480, help="Post samples per model on the calibrated cluster")
    ap.add_argument("--randoms", type=int, default=4, help="random CPU+GPU splits per model")
    ap.add_argument("--runs", type=int, default=3, help="runs per op when calibrating")
    ap.add_argument("--rehearse", action="store_true", help="without CUDA: run B-D with gpu0 on the CPU")
    ap.add_argument("--skip", default="", help="parts to skip, e.g. A or B,C")
    args = ap.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    log = Log(out / "summary.txt")
    cuda = torch.cuda.is_available()
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    models = [m for m in args.models.split(",") if m]
    unknown = [m for m in models if m not in cal.FIDELITY_CONFIGS]
    if unknown:
        print(f"error: unknown model(s) {unknown}; choose from {', '.join(cal.FIDELITY_CONFIGS)}", file=sys.stderr)
        return 2
    env = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": cuda,
        "gpus": [torch.cuda.get_device_name(k) for k in range(torch.cuda.device_count())] if cuda else [],
        "cpu": cal.device_model(torch.device("cpu")),
        "cpu_threads": torch.get_num_threads(),
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "rehearse": args.rehearse,
    }
    log(f"postplace GPU check: {json.dumps(env)}")
    skip = set(args.skip.upper().split(",")) - {""}
    skipped, times, failed = [], {}, []
    t_all = time.perf_counter()

    def part(key, title, fn):
        if key in skip:
            skipped.append(f"{key} ({title}): --skip")
            return None
        log(f"\n== {key}. {title}")
        t0 = time.perf_counter()
        try:
            return fn()
        except Exception as exc:  # noqa: BLE001 - report and go on with the other parts
            failed.append(f"{key}: {type(exc).__name__}: {exc}")
            log(f"  FAILED: {type(exc).__name__}: {exc}")
            (out / f"error-{key}.txt").write_text(traceback.format_exc())
            return None
        finally:
            times[key] = time.perf_counter() - t0

    gpu = "cuda:0" if cuda else "cpu"
    if not cuda:
        log("no CUDA device: part A maps gpu0 to the CPU (placement, transfers and colocation still checked)")
    num = part(
        "A",
        f"numerics: every zoo model (small), ops split across cpu and gpu0 ({gpu}), vs eager CPU training",
        lambda: numerics(log, gpu),
    )
    if num is not None:
        (out / "numerics.json").write_text(json.dumps(num, indent=1))
        if not all(r["ok"] for r in num):
            failed.append("A: numerics mismatch: " + ", ".join(r["model"] for r in num if not r["ok"]))
    if cuda or args.rehearse:
        if cuda:
            devices = cal.devices_present()
        else:
            devices = [("cpu", torch.device("cpu")), ("gpu0", torch.device("cpu"))]
            log(
                "\nREHEARSAL: no CUDA device; gpu0 is a second logical device on the CPU. The numbers below test the "
                "code paths only: they are not GPU results."
            )
        dmap = {n: str(d) for n, d in devices}
        calib = part(
            "B",
            "calibration on " + ", ".join(f"{n} ({d})" for n, d in devices),
            lambda: calibration(log, devices, out, args.runs),
        )
        if calib is not None:
            part(
                "C",
                f"fidelity and confirm on {', '.join(models)}",
                lambda: fidelity_and_confirm(log, devices, dmap, *calib, models, args.budget, out, args.randoms),
            )
        elif "C" not in skip:
            skipped.append("C, D (fidelity, confirm): calibration (B) did not finish")
    else:
        why = "no CUDA device (torch.cuda.is_available() is False); --rehearse runs them with gpu0 on the CPU"
        skipped += [f"B (calibration): {why}", f"C (fidelity, >= 30 placements): {why}", f"D (confirm): {why}"]
    if cuda:
        rates = part(
            "E",
            "kernel rates: GEMMs, a streaming add, an all-reduce vs the achieved-rate cost model",
            lambda: kernel_rates(log),
        )
        if rates is not None:
            (out / "kernels.json").write_text(json.dumps(rates, indent=1))
    else:
        skipped.append("E (kernel rates): no CUDA device")
    total = time.perf_counter() - t_all
    log("\n== summary")
    log("time per part: " + ", ".join(f"{k} {v:.0f} s" for k, v in times.items()) + f"; total {total:.0f} s")
    for s in skipped:
        log(f"skipped {s}")
    for f in failed:
        log(f"FAILED {f}")
    (out / "env.json").write_text(
        json.dumps({**env, "times_s": times, "total_s": total, "skipped": skipped, "failed": failed}, indent=1)
    )
    log(f"everything is in {out}/")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
