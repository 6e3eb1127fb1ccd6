"""How the data-parallel yardstick moved: the old analytic estimate, the fixed one, and the simulated one.

Per zoo model x cluster (full size, simulated, roofline costs):

* ``old est``: the analytic estimate as it was before (gradient bytes = every persistent byte of the
  parameter ops, so SGD's momentum was all-reduced too);
* ``new est``: the same estimate with the gradient bytes fixed to the parameters' own bytes (what
  ``compare`` still shows, labelled an estimate, for graph files that cannot be traced again);
* ``simulated``: data parallelism as a placement of the step traced as m micro-batches (micro-batch k
  on GPU k mod #GPUs, every parameter's gradient sent to its owner, which updates it: the bytes of a
  ring all-reduce), the fastest m of those ``place`` weighs that fits with the state replicated;
  ``OOM`` where none does. This is the ``data-parallel`` candidate and row everywhere now.

    OMP_NUM_THREADS=1 python benchmarks/dp_yardstick.py [--models resnet50,gpt2] [--clusters k80x2,k80x4]
"""

from __future__ import annotations

import argparse
import math

from postplace.api.over_m import microbatch_counts
from postplace.cluster import load_cluster
from postplace.errors import PostplaceError
from postplace.placers import data_parallel_step_time, simulate_data_parallel
from postplace.zoo import cached_graph, spec


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="inception_v3,resnet50,rnnlm,nmt2,nmt4,gpt2")
    ap.add_argument("--clusters", default="k80x2,k80x4,dgx8,dgx8x2,mixed")
    args = ap.parse_args()
    print(
        f"{'model':12} {'cluster':7} {'old est':>8} {'new est':>8} {'simulated':>9} {'m':>2} {'grad MB old':>11} "
        f"{'new':>6}  (ms)"
    )
    for model in args.models.split(","):
        g1 = cached_graph(model)
        batch = int(spec(model).config("full")["batch"])
        for name in args.clusters.split(","):
            c = load_cluster(name)
            old_bytes = float(g1.persistent_bytes[[n.startswith("param:") for n in g1.names]].sum())
            old = data_parallel_step_time(g1, c, gradient_bytes=old_bytes)
            new = data_parallel_step_time(g1, c)
            best, best_m = math.inf, None
            gpus = sum(d.kind == "gpu" for d in c.devices)
            for m in microbatch_counts(batch, gpus)[1:]:
                try:
                    dp = simulate_data_parallel(cached_graph(model, microbatches=m), c)
                except PostplaceError:
                    continue
                if not dp.oom and dp.step_time < best:
                    best, best_m = dp.step_time, m
            sim = "OOM" if best_m is None else f"{best * 1e3:.1f}"
            print(
                f"{model:12} {name:7} {old.step_time * 1e3:8.1f} {new.step_time * 1e3:8.1f} {sim:>9} "
                f"{best_m or '-':>2} {old_bytes / 1e6:11.1f} {new.gradient_bytes / 1e6:6.1f}",
                flush=True,
            )


if __name__ == "__main__":
    main()
