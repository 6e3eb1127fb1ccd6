"""``place --layered`` at scale: the practitioner's grid (``best-3d``) against a strategy over its per-block
choices (how each block recomputes: not at all, whole, or by torchtitan's selective op rule; where a 1F1B
pipeline's stages are cut), each strategy with the same bases and the same number of plans.

Per row (LLaMA in bf16 with AdamW, micro-batches of one and two sequences, every plan priced by the layered
estimate): ``best-3d`` in the words to launch it with, each strategy's own best (``post``; ``post-start``, its
anchored start sampled with every learning step off; ``local``, local moves alone; ``random``), its gain over
``best-3d``, Post's new bests by origin (``policy``: its own samples; ``local``: its moves), MFU (PaLM's count)
and the wall time of ``place --layered`` with Post. Every time is simulated and estimated.

Run: ``OMP_NUM_THREADS=1 python benchmarks/layered_search.py`` (about 10 minutes on 2 cores); ``--quick``: the
first two rows at 480 plans.
"""

from __future__ import annotations

import argparse
import json
import time

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

    from postplace import zoo
    from postplace.api.layered import place_layered
    from postplace.cluster import load_cluster

    torch.set_num_threads(1)
    rows = ROWS[:2] if args.quick else ROWS
    samples = 480 if args.quick else args.samples
    out = []
    head = f"{'model':8s} {'cluster':7s} {'best-3d':58s} {'s':>8s}"
    head += (
        "".join(f" {name:>10s}" for name in STRATEGIES)
        + f" {'answer/best-3d':>14s} {'MFU':>6s} {'new bests (post)':24s} {'wall s':>6s}"
    )
    print(head)
    for model, size, cluster_name in rows:
        found = {}
        for strategy in STRATEGIES:
            t0 = time.perf_counter()
            r = place_layered(
                model, cluster_name, size=size, optimizer="adamw", precision="bf16", strategy=strategy, samples=samples
            )
            found[strategy] = (r, time.perf_counter() - t0)
        post, wall = found["post"]
        best3d = next(c for c in post.candidates if c.name == "best-3d")
        own = {s: next(c for c in found[s][0].candidates if c.name == "search") for s in STRATEGIES}
        cfg = zoo.spec(model).config(size)
        cluster = load_cluster(cluster_name)
        gpu = next(d for d in cluster.devices if d.kind == "gpu")
        mfu = (
            _model_flops(cfg, cfg["batch"]) / (post.step_time_s * post.gpus * gpu.peak_for("bf16"))
            if post.step_time_s
            else None
        )
        bests: dict[str, int] = {}
        for s in post.searches:
            for k, v in s["new_bests"].items():
                bests[k] = bests.get(k, 0) + v
        row = dict(
            model=f"{model} {size}",
            cluster=cluster_name,
            best_3d=best3d.plan,
            best_3d_words=best3d.words,
            best_3d_s=best3d.step_time_s,
            own_s={s: own[s].step_time_s for s in STRATEGIES},
            own_plan={s: own[s].plan for s in STRATEGIES},
            answer=post.plan,
            answer_s=post.step_time_s,
            answer_over_best_3d=(post.step_time_s / best3d.step_time_s) if best3d.step_time_s else None,
            mfu=mfu,
            new_bests=bests,
            searches=post.searches,
            wall_s=wall,
            timing=post.timing,
        )
        out.append(row)
        cells = "".join(
            f" {(own[s].step_time_s or float('nan')) / (best3d.step_time_s or float('nan')):10.4f}" for s in STRATEGIES
        )
        print(
            f"{size:8s} {cluster_name:7s} {best3d.words[:58]:58s} {best3d.step_time_s or float('nan'):8.3f}{cells} "
            f"{row['answer_over_best_3d'] or float('nan'):14.4f} {(mfu or 0) * 100:5.1f}% "
            f"{', '.join(f'{k} {v}' for k, v in bests.items()) or 'none':24s} {wall:6.1f}"
        )
    print("(strategy columns: its own best over best-3d's step time; below 1 is faster)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1, default=str)


if __name__ == "__main__":
    main()
