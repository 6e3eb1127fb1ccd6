"""Post against every baseline on the paper's models and machines (issue 5).

    python benchmarks/compare.py [--models inception_v3,resnet50,rnnlm,nmt2,nmt4] [--clusters k80x2,k80x4]
                                 [--budget 2400] [--seeds 3] [--out runs/bench-compare]

Runs ``postplace compare MODEL --cluster C --strategies all`` for each pair (resumable: rerun the same
command after an interruption) and prints, per pair, Post's median best step time and its reduction
relative to the hierarchical planner (``hp``), to the best one-shot heuristic, to data parallelism and
to the best single device: ``reduction = 1 - post / other`` (positive: Post is faster).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from postplace.cluster import load_cluster
from postplace.comparison import ALL, compare
from postplace.zoo import cached_graph

HEURISTICS = ("single", "cpu", "expert", "metis", "heft", "m-topo", "m-etf", "m-sct")


def reduction(post: float | None, other: float | None) -> str:
    if post is None or other is None:
        return "-"
    return f"{(1 - post / other) * 100:+.1f}%"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="inception_v3,resnet50,rnnlm,nmt2,nmt4")
    ap.add_argument("--clusters", default="k80x2,k80x4")
    ap.add_argument("--budget", type=int, default=2400)
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--out", default="runs/bench-compare")
    ap.add_argument("--strategies", default="all", help="comma-separated, or all (e.g. all but hp, to save time)")
    args = ap.parse_args()
    names = list(ALL) if args.strategies == "all" else args.strategies.split(",")
    lines = []
    t0 = time.perf_counter()
    for model in args.models.split(","):
        graph = cached_graph(model, "full")
        for cname in args.clusters.split(","):
            t = time.perf_counter()
            report = compare(
                graph,
                load_cluster(cname),
                names,
                budget=args.budget,
                seeds=args.seeds,
                out=Path(args.out) / f"{model}-{cname}",
            )
            rows = {r["strategy"]: r for r in report["rows"]}
            print(f"\n## {model} on {cname} ({time.perf_counter() - t:.0f} s)", flush=True)
            print(f"{'strategy':<14} {'best ms':>10} {'/single':>8} {'/LB':>7} {'OOM':>4} {'wall s':>8}")
            for r in report["rows"]:
                best = r["best_step_time_s"]
                print(
                    f"{r['strategy']:<14} {'-' if best is None else f'{best * 1e3:.2f}':>10} "
                    f"{r['ratio_to_single'] or float('nan'):>8.3f} {r['ratio_to_lower_bound'] or float('nan'):>7.3f} "
                    f"{r['oom_count']:>4} {r['wall_time_s']:>8.1f}",
                    flush=True,
                )
            post = rows["post"]["best_step_time_s"]
            heur = [
                rows[h]["best_step_time_s"]
                for h in HEURISTICS
                if h in rows and rows[h]["best_step_time_s"] is not None and not rows[h]["oom_count"]
            ]
            best_heur = min(heur) if heur else None
            hp = rows["hp"]["best_step_time_s"] if "hp" in rows else None
            dp = rows["data-parallel"]["best_step_time_s"] if "data-parallel" in rows else None
            lines.append((model, cname, post, hp, best_heur, dp, report["single_device_step_time_s"]))
    print(
        f"\n## Post's reduction of step time (median of {args.seeds} seeds, {args.budget} samples; "
        f"total wall {time.perf_counter() - t0:.0f} s)"
    )
    print(
        f"{'model':<14} {'cluster':<7} {'post ms':>9} {'vs hp':>8} {'vs best heuristic':>18} {'vs data-par':>12} "
        f"{'vs single':>10}"
    )
    for model, cname, post, hp, heur, dp, single in lines:
        print(
            f"{model:<14} {cname:<7} {post * 1e3:>9.2f} {reduction(post, hp):>8} {reduction(post, heur):>18} "
            f"{reduction(post, dp):>12} {reduction(post, single):>10}"
        )


if __name__ == "__main__":
    main()
