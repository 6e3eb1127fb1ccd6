"""CPU seconds of `postplace graph MODEL` at full size, per zoo model and micro-batch count.

Each run is a fresh process (`python -m postplace.cli graph MODEL --microbatches m`) with an empty
graph cache, so the time includes Python and torch start-up, building the model, tracing (make_fx),
the micro-batch replication pass, the fx-to-OpGraph conversion and writing the cache file: what a
new user waits for. CPU = user + system time of the child; peak RSS from the kernel (the largest child so far). Where m
does not divide the batch (RNNLM: 20), the largest m below it that does is used.

    PYTHONPATH=src python benchmarks/trace_speed.py [--models gpt2,rnnlm] [--microbatches 1,8]
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run(model: str, m: int) -> dict:
    with tempfile.TemporaryDirectory() as cache:
        env = {**os.environ, "POSTPLACE_CACHE": cache, "PYTHONPATH": str(ROOT / "src"), "OMP_NUM_THREADS": "1"}
        cmd = [sys.executable, "-m", "postplace.cli", "graph", model, "--microbatches", str(m)]
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        t0 = time.perf_counter()
        out = subprocess.run(cmd, env=env, capture_output=True, text=True)
        wall = time.perf_counter() - t0
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        if out.returncode:
            raise SystemExit(f"{' '.join(cmd)} failed: {out.stdout[-400:]}{out.stderr[-400:]}")
        ops = int(out.stdout.split(" ops ")[0].rsplit(" ", 1)[-1].replace(",", ""))
    return {
        "cpu": (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime),
        "wall": wall,
        "rss_mib": after.ru_maxrss / 1024,
        "ops": ops,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="inception_v3,resnet50,rnnlm,nmt2,nmt4,gpt2")
    ap.add_argument("--microbatches", default="1,8")
    args = ap.parse_args()
    ms = [int(x) for x in args.microbatches.split(",")]
    print(f"{'model':13} {'m':>3} {'ops':>8} {'CPU s':>7} {'wall s':>7} {'RSS MiB':>8} {'CPU / m=1':>10}")
    from postplace.zoo import spec

    for model in args.models.split(","):
        base = None
        batch = spec(model).config("full")["batch"]
        for want in ms:
            m = max(k for k in range(1, want + 1) if batch % k == 0)  # rnnlm's batch of 20: m = 5 for 8
            r = run(model, m)
            base = r["cpu"] if m == 1 else base
            ratio = f"{r['cpu'] / base:10.2f}" if base else f"{'-':>10}"
            print(
                f"{model:13} {m:3d} {r['ops']:8d} {r['cpu']:7.1f} {r['wall']:7.1f} {r['rss_mib']:8.0f} {ratio}",
                flush=True,
            )


if __name__ == "__main__":
    main()
