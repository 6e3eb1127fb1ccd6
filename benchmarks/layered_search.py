"""``place --layered`` at scale: the practitioner's grid (``best-3d``) against each strategy's own best over its
per-block choices (how each block recomputes: not at all, whole, or by torchtitan's selective op rule; where a
1F1B pipeline's stages are cut), the same bases and the same number of plans for every strategy
(:func:`postplace.compare_layered`).

Per row (LLaMA in bf16 with AdamW, micro-batches of one and two sequences, every plan priced by the layered
estimate): ``best-3d`` in the words to launch it with, each strategy's own best over ``best-3d`` (``post``;
``post-start``, its anchored start sampled with every learning step off; ``local``, local moves alone;
``random``), Post's new bests by origin (``policy``: its own samples; ``local``: its moves), the MFU of Post's
answer (PaLM's count) and the wall time of ``place --layered`` with Post (the grid, then Post's searches).
Every time is simulated and estimated.

Run: ``OMP_NUM_THREADS=1 python benchmarks/layered_search.py`` (about 5 minutes on 2 cores); ``--quick``: the
first two rows at 480 plans.
"""

from __future__ import annotations

import argparse
import json

ROWS = [
    ("llama", "1b@64", "dgx8"),
    ("llama", "7b@64", "dgx8"),
    ("llama", "13b@64", "dgx8x2"),
    ("llama", "7b@512", "dgx8x8"),
    ("llama", "13b@256", "dgx8x8"),
    ("llama", "70b@256", "dgx8x8"),
    ("llama", "70b@256", "dgx8x2"),
]
STRATEGIES = ("post", "post-start", "local", "random")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=2400, help="plans each strategy prices per row")
    parser.add_argument("--quick", action="store_true", help="the first two rows at 480 plans")
    parser.add_argument("--json", help="write the rows here")
    args = parser.parse_args()
    import torch
    from layered import _model_flops  # the sibling benchmark's PaLM count

    from postplace import compare_layered, zoo
    from postplace.cluster import load_cluster

    torch.set_num_threads(1)
    rows = ROWS[:2] if args.quick else ROWS
    samples = 480 if args.quick else args.samples
    out = []
    head = f"{'model':8s} {'cluster':7s} {'best-3d':58s} {'s':>8s}"
    head += "".join(f" {name:>10s}" for name in STRATEGIES) + f" {'MFU':>6s} {'new bests (post)':24s} {'wall s':>6s}"
    print(head)
    for model, size, cluster_name in rows:
        c = compare_layered(
            model, cluster_name, size=size, optimizer="adamw", precision="bf16", strategies=STRATEGIES, samples=samples
        )
        by = {r["strategy"]: r for r in c.rows}
        post = by["post"]
        answer = min(post["median_s"] or float("inf"), c.best_3d.step_time_s or float("inf"))
        cfg = zoo.spec(model).config(size)
        gpu = next(d for d in load_cluster(cluster_name).devices if d.kind == "gpu")
        mfu = (
            _model_flops(cfg, cfg["batch"]) / (answer * c.gpus * gpu.peak_for("bf16"))
            if answer < float("inf")
            else None
        )
        grid_s = sum(v for k, v in c.timing.items() if k in ("trace_s", "measure_s", "grid_s"))
        wall = grid_s + post["wall_s"]
        out.append(dict(model=f"{model} {size}", cluster_name=cluster_name, **c.summary, mfu=mfu, place_wall_s=wall))
        cells = "".join(f" {by[s]['over_best_3d'] or float('nan'):10.4f}" for s in STRATEGIES)
        bests = ", ".join(f"{k} {v}" for k, v in post["new_bests"].items()) or "none"
        print(
            f"{size:8s} {cluster_name:7s} {c.best_3d.words[:58]:58s} {c.best_3d.step_time_s or float('nan'):8.3f}"
            f"{cells} {(mfu or 0) * 100:5.1f}% {bests:24s} {wall:6.1f}"
        )
    print("(strategy columns: its own best over best-3d's step time; below 1 is faster)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1, default=str)


if __name__ == "__main__":
    main()
