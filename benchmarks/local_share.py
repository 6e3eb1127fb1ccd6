"""Post's learning against local moves alone (``local``) at equal samples: the share of the batch local moves
take, and any other change to the search as an ablation row (issue 32 item 5).

    OMP_NUM_THREADS=1 python benchmarks/local_share.py [--fractions 0,0.125,0.25,0.5] [--seeds 5] [--samples 2400]
    OMP_NUM_THREADS=1 python benchmarks/local_share.py --configs "post;post:local_pick=policy" [--pairs PAIRS]

With ``--fractions`` (the default) the rows are Post at each ``local_fraction`` (0 is ``post-probe``: Post's
probe start, no local moves; 0.5 Post's default). With ``--configs`` they are the strategies given, each
``NAME`` or ``NAME:KEY=VALUE,KEY=VALUE`` (the fields of its config, checked as ``--set`` checks them; a
value cannot hold a comma). Pairs
are the paper's ten at m = 1 by default, or ``--pairs MODEL/CLUSTER/M,...`` (a micro-batched step, where
Post acts on layers and stripes). Each cell is ``1 - x / local`` of the medians over the seeds (positive: a
shorter step than local moves alone); then per row the median over the pairs, the pairs it wins and its
worst. Every number simulated, the problems as ``compare`` builds them (full-size models).
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics

from postplace.cluster import load_cluster
from postplace.paper import PAPER_CLUSTERS, PAPER_MODELS
from postplace.search import Budget, PostConfig, make_problem, make_strategy, run
from postplace.search.config import build_config
from postplace.zoo import cached_graph


def median_best(problem, name: str, config, seeds: int, samples: int) -> float:
    bests = []
    for seed in range(seeds):
        s = make_strategy(name, problem.space, seed=seed, config=config)
        bests.append(run(s, problem.simulator, Budget(samples=samples), space=problem.space).best_step_time)
    return statistics.median(bests)


def rows_of(args) -> dict[str, tuple[str, object]]:
    """Row label -> (strategy, config or None)."""
    if args.configs:
        rows = {}
        for spec in args.configs.split(";"):
            name, _, rest = spec.partition(":")
            fields = dict(kv.split("=", 1) for kv in rest.split(",") if kv)
            rows[spec] = (name, build_config(name, fields) if fields else None)
        return rows
    return {
        f"f={f}": ("post", dataclasses.replace(PostConfig(), use_local=f > 0, local_fraction=f))
        for f in (float(x) for x in args.fractions.split(","))
    }


def pairs_of(text: str) -> list[tuple[str, str, int]]:
    if not text:
        return [(model, cluster, 1) for model in PAPER_MODELS for cluster in PAPER_CLUSTERS]
    return [(model, cluster, int(m)) for model, cluster, m in (p.split("/") for p in text.split(","))]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--fractions", default="0,0.125,0.25,0.5")
    ap.add_argument("--configs", default="", help="strategies as NAME or NAME:KEY=VALUE,..., separated by ';'")
    ap.add_argument("--pairs", default="", help="MODEL/CLUSTER/M,... (default: the paper's ten pairs at m = 1)")
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--samples", type=int, default=2400)
    args = ap.parse_args()
    rows = rows_of(args)
    gains: dict[str, list[float]] = {label: [] for label in rows}
    print(f"{'pair':26} {'local ms':>9} " + " ".join(f"{label:>12}" for label in rows), flush=True)
    for model, cluster, m in pairs_of(args.pairs):
        graph = cached_graph(model, "full", microbatches=m) if m > 1 else cached_graph(model, "full")
        problem = make_problem(graph, load_cluster(cluster))
        local = median_best(problem, "local", None, args.seeds, args.samples)
        cells = []
        for label, (name, config) in rows.items():
            gain = 1 - median_best(problem, name, config, args.seeds, args.samples) / local
            gains[label].append(gain)
            cells.append(f"{gain * 100:+11.1f}%")
        pair = f"{model}-{cluster}" + (f"@m{m}" if m > 1 else "")
        print(f"{pair:26} {local * 1e3:9.2f} " + " ".join(cells), flush=True)
    for label, g in gains.items():
        print(
            f"{label}: median {statistics.median(g) * 100:+.2f}%, ahead of local on {sum(x > 0 for x in g)}"
            f"/{len(g)} pairs, worst {min(g) * 100:+.1f}%"
        )


if __name__ == "__main__":
    main()
