"""How much of Post's batch local moves should take: Post at several ``local_fraction`` against local moves
alone (``local``), at equal samples, on the paper's ten model x machine pairs (issue 32 item 5).

    OMP_NUM_THREADS=1 python benchmarks/local_share.py [--fractions 0,0.125,0.25,0.5] [--seeds 5] [--samples 2400]

``local_fraction = 0`` is ``post-probe`` (Post's probe start, no local moves), 0.5 Post's default. Each cell
is ``1 - post / local`` of the medians over the seeds (positive: Post's step is shorter); then per
fraction the median over the pairs, the pairs Post wins, and its worst pair. Every number simulated, the
problems as ``compare`` builds them (full-size models, m = 1).
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics

from postplace.cluster import load_cluster
from postplace.paper import PAPER_CLUSTERS, PAPER_MODELS
from postplace.search import Budget, PostConfig, make_problem, make_strategy, run
from postplace.zoo import cached_graph


def median_best(problem, name: str, config, seeds: int, samples: int) -> float:
    bests = []
    for seed in range(seeds):
        s = make_strategy(name, problem.space, seed=seed, config=config)
        bests.append(run(s, problem.simulator, Budget(samples=samples), space=problem.space).best_step_time)
    return statistics.median(bests)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--fractions", default="0,0.125,0.25,0.5")
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--samples", type=int, default=2400)
    args = ap.parse_args()
    fractions = [float(f) for f in args.fractions.split(",")]
    gains: dict[float, list[float]] = {f: [] for f in fractions}
    print(f"{'pair':22} {'local ms':>9} " + " ".join(f"{'f=' + str(f):>9}" for f in fractions), flush=True)
    for model in PAPER_MODELS:
        graph = cached_graph(model, "full")
        for name in PAPER_CLUSTERS:
            problem = make_problem(graph, load_cluster(name))
            local = median_best(problem, "local", None, args.seeds, args.samples)
            cells = []
            for f in fractions:
                config = dataclasses.replace(PostConfig(), use_local=f > 0, local_fraction=f)
                gain = 1 - median_best(problem, "post", config, args.seeds, args.samples) / local
                gains[f].append(gain)
                cells.append(f"{gain * 100:+8.1f}%")
            print(f"{model + '-' + name:22} {local * 1e3:9.2f} " + " ".join(cells), flush=True)
    for f in fractions:
        g = gains[f]
        print(
            f"local_fraction {f}: median {statistics.median(g) * 100:+.2f}%, Post ahead on {sum(x > 0 for x in g)}"
            f"/{len(g)} pairs, worst {min(g) * 100:+.1f}%"
        )


if __name__ == "__main__":
    main()
