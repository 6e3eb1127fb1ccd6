"""What Post's learning adds after its start, and from a data-parallel seed (issue 20 item 2).

    OMP_NUM_THREADS=1 python benchmarks/post_learning.py [--samples 2400] [--seed 0]

Part 1, from Post's own start (default ``post``, micro-batched zoo steps): how many of the policy's
own samples and of the local moves beat the start, the policy samples' median against it, and the
final best, with local moves and without (``use_local=False``).

Part 2, seeded with data parallelism (``warm_start=data_parallel_placement``, told as sample 0): the
seed's step time on the per-group space (``make_problem(layers=False)``) and on the layer space, and
the best after the budget, with and without local moves. Simulated, one seed.
"""

from __future__ import annotations

import argparse

import numpy as np

from postplace import zoo
from postplace.cluster import load_cluster
from postplace.placers.data_parallel import data_parallel_placement
from postplace.search import Budget, PostConfig, PostStrategy, make_problem, run

CASES = (("resnet50", "k80x4", 4), ("gpt2", "dgx8", 8), ("inception_v3", "k80x4", 4))
SEEDED = (("resnet50", "k80x2", 2), ("resnet50", "k80x4", 4), ("gpt2", "dgx8", 8))


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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--samples", type=int, default=2400)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    from_the_start(args.samples, args.seed)
    seeded(args.samples, args.seed)


if __name__ == "__main__":
    main()
