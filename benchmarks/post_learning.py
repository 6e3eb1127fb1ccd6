"""What Post's learning adds after its start, and from a data-parallel seed (issue 20 item 2); with
``--goals``, issue 32's table: Post against local moves alone and the paper's rivals, pair by pair.

    OMP_NUM_THREADS=1 python benchmarks/post_learning.py [--samples 2400] [--seed 0]
    OMP_NUM_THREADS=1 python benchmarks/post_learning.py --goals [--seeds 3] [--samples 2400] [--pairs ...]

``--goals`` (issue 32, "How it is checked"): per pair (the paper's ten at m = 1, six micro-batched zoo
steps, the three profiled workloads of ``../shared/data/dnn-partitioning`` on ``k80x4`` where that folder
is present), the lower bound, Post's start (the probe's choice) against it, the medians over the seeds of
``local`` (local moves alone from Post's start), ``post-paper`` and ``reinforce-paper`` (the paper's
uniform start, no local moves) and Post's default, ``1 - post / local``, and the new bests of Post's
default after the probe by origin (policy samples, local moves; summed over the seeds). Then the goals'
lines: the median of ``1 - post / local`` over the pairs whose start is at least 5% above the lower bound
and the policy's share of the new bests there; the pairs where Post is more than 1% behind ``local``;
``post-paper`` against ``reinforce-paper`` on the paper's pairs. Every number simulated.

Part 1, from Post's own start (default ``post``, micro-batched zoo steps): how many of the policy's
own samples and of the local moves beat the start, the policy samples' median against it, and the
final best, with local moves and without (``use_local=False``).

Part 2, seeded with data parallelism (``warm_start=data_parallel_placement``, told as sample 0): the
seed's step time on the per-group space (``make_problem(layers=False)``) and on the layer space, and
the best after the budget, with and without local moves. Simulated, one seed.
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

import numpy as np

from postplace import zoo
from postplace.cluster import load_cluster
from postplace.graph import load_graph
from postplace.paper import PAPER_CLUSTERS, PAPER_MODELS
from postplace.placers.data_parallel import data_parallel_placement
from postplace.search import Budget, PostConfig, PostStrategy, make_problem, make_strategy, run
from postplace.search.origins import origin_stats

CASES = (("resnet50", "k80x4", 4), ("gpt2", "dgx8", 8), ("inception_v3", "k80x4", 4))
SEEDED = (("resnet50", "k80x2", 2), ("resnet50", "k80x4", 4), ("gpt2", "dgx8", 8))
MICROBATCHED = "resnet50/k80x2/2,resnet50/k80x4/4,inception_v3/k80x2/2,inception_v3/k80x4/4,gpt2/k80x4/4,gpt2/dgx8/8"
SHARED = Path(__file__).resolve().parents[2] / "shared/data/dnn-partitioning"
PROFILED = ("resnet50_training", "bert_l-3_training", "gnmt_training")
RIVALS = ("local", "post-paper", "reinforce-paper", "post")


class Counting(PostStrategy):
    """Post that keeps, per told batch after the probe, the policy's own and the local moves' times."""

    def __init__(self, *a, **k):
        super().__init__(*a, **k)
        self.own_times, self.local_times = [], []

    def tell(self, placements, step_time, feasible, overflow=None):
        if self.probe is None or self.probe.done:
            own = len(placements) - self._pending_local
            ok = np.asarray(feasible, dtype=bool)
            t = np.where(ok, np.asarray(step_time, dtype=float), np.inf)
            self.own_times.append(t[:own])
            self.local_times.append(t[own:])
        super().tell(placements, step_time, feasible, overflow)


def from_the_start(samples: int, seed: int) -> None:
    print(
        "model        cluster m  local  start                 start ms  own  own<start  own median/start  "
        "local  local<start  best ms"
    )
    for name, cluster, m in CASES:
        p = make_problem(zoo.cached_graph(name, "full", microbatches=m), load_cluster(cluster))
        for local in (False, True):
            s = Counting(p.space, seed=seed, config=PostConfig(use_local=local))
            r = run(s, p.simulator, Budget(samples=samples), space=p.space)
            start = s.start_step_time
            own = np.concatenate(s.own_times)
            loc = np.concatenate(s.local_times) if s.local_times else np.zeros(0)
            print(
                f"{name:12} {cluster:7} {m}  {'on' if local else 'off':5}  {s.start_name:20} {start * 1e3:9.1f} "
                f"{len(own):4} {int((own < start).sum()):10} {np.median(own) / start:17.2f} {len(loc):6} "
                f"{int((loc < start).sum()):12} {r.best_step_time * 1e3:8.2f}",
                flush=True,
            )


def seeded(samples: int, seed: int) -> None:
    print("\nmodel        cluster m  grouping  local  seed ms  -> best ms")
    for name, cluster, m in SEEDED:
        g = zoo.cached_graph(name, "full", microbatches=m)
        c = load_cluster(cluster)
        ops = data_parallel_placement(g, c)
        for layers in (False, True):
            p = make_problem(g, c, layers=layers)
            warm = p.grouping.collapse(ops)
            start = float(p.simulator.evaluate(warm[None]).step_time[0])
            for local in (False, True):
                s = PostStrategy(p.space, seed=seed, config=PostConfig(use_local=local))
                r = run(s, p.simulator, Budget(samples=samples), space=p.space, warm_start=warm)
                print(
                    f"{name:12} {cluster:7} {m}  {'layers' if layers else 'groups':8}  {'on' if local else 'off':5} "
                    f"{start * 1e3:8.2f} -> {r.best_step_time * 1e3:8.2f}",
                    flush=True,
                )


def goal_pairs(text: str) -> list[tuple[str, object, str]]:
    """(label, graph, cluster) of ``MODEL/CLUSTER/M,...`` or, empty, the default pairs of ``--goals``."""
    every = not text
    if every:
        text = ",".join(f"{m}/{c}/1" for m in PAPER_MODELS for c in PAPER_CLUSTERS) + "," + MICROBATCHED
    pairs = []
    for item in text.split(","):
        model, cluster, m = item.split("/")
        graph = zoo.cached_graph(model, "full", microbatches=int(m)) if int(m) > 1 else zoo.cached_graph(model, "full")
        pairs.append((f"{model}-{cluster}" + (f"@m{m}" if int(m) > 1 else ""), graph, cluster))
    if every and SHARED.is_dir():
        pairs += [(f"{n}-k80x4", load_graph(SHARED / f"{n}.json"), "k80x4") for n in PROFILED]
    return pairs


def goals(samples: int, seeds: int, pairs_text: str) -> None:
    print(
        f"{'pair':26} {'LB ms':>8} {'start':>20} {'start/LB':>8} "
        + " ".join(f"{r:>15}" for r in RIVALS)
        + f" {'1-post/local':>12} {'post new bests policy/local':>28}"
    )
    rows = []
    for label, graph, cluster in goal_pairs(pairs_text):
        p = make_problem(graph, load_cluster(cluster))
        lb = p.simulator.lower_bound
        medians, new_bests, start = {}, {"policy": 0, "local": 0}, None
        for name in RIVALS:
            bests = []
            for seed in range(seeds):
                s = make_strategy(name, p.space, seed=seed)
                r = run(s, p.simulator, Budget(samples=samples), space=p.space)
                bests.append(r.best_step_time)
                if name == "post":
                    stats = origin_stats(r.origins, r.step_times, lb)
                    start = (stats["start_name"], stats["start_step_time_s"])  # the probe's: the same every seed
                    for o in new_bests:
                        new_bests[o] += stats["new_bests"].get(o, 0)
            medians[name] = statistics.median(bests)
        gain = 1 - medians["post"] / medians["local"]
        rows.append((label, start[1] / lb, gain, new_bests, medians))
        print(
            f"{label:26} {lb * 1e3:8.2f} {start[0]:>20} {start[1] / lb:8.3f} "
            + " ".join(f"{medians[r] * 1e3:15.2f}" for r in RIVALS)
            + f" {gain * 100:+11.1f}% {new_bests['policy']:>21}/{new_bests['local']}",
            flush=True,
        )
    far = [r for r in rows if r[1] >= 1.05]
    if far:
        policy = sum(r[3]["policy"] for r in far)
        total = policy + sum(r[3]["local"] for r in far)
        print(
            f"pairs whose start is >= 5% above the lower bound: {len(far)}; Post below local by "
            f"{statistics.median(r[2] for r in far) * 100:+.2f}% (median; goal >= 2%); the policy's own samples made "
            f"{policy} of {total} new bests after the probe (goal >= a quarter)"
        )
    behind = [f"{r[0]} {r[2] * 100:+.1f}%" for r in rows if r[2] < -0.01]
    print(f"pairs where Post is more than 1% behind local (goal: none): {', '.join(behind) or 'none'}")
    paper = [r for r in rows if "@m" not in r[0] and r[0].split("-")[0] in PAPER_MODELS]
    if paper:
        wins = [1 - r[4]["post-paper"] / r[4]["reinforce-paper"] for r in paper]
        print(
            f"from the uniform start, no local moves: post-paper below reinforce-paper on {sum(w > 0 for w in wins)}"
            f"/{len(wins)} paper pairs (goal >= 8 of 10), median {statistics.median(wins) * 100:+.1f}%"
        )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--samples", type=int, default=2400)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--goals", action="store_true", help="issue 32's table instead of issue 20's two parts")
    ap.add_argument("--seeds", type=int, default=3, help="with --goals")
    ap.add_argument("--pairs", default="", help="with --goals: MODEL/CLUSTER/M,... (default: every pair)")
    args = ap.parse_args()
    if args.goals:
        goals(args.samples, args.seeds, args.pairs)
        return
    from_the_start(args.samples, args.seed)
    seeded(args.samples, args.seed)


if __name__ == "__main__":
    main()
