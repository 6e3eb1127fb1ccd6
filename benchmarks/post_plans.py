"""Post's learning on the per-unit plan space (issue 29 item 4, measured before it is built into ``place``).

Each decision is one group of units (the root unit alone, the numbered units in up to ``--groups``
contiguous runs) and has four choices: DDP, FSDP, DDP + recompute, FSDP + recompute (a hybrid plan,
:func:`postplace.plans.data_parallel` with ``shard=`` and :func:`postplace.plans.recompute` with its
units). A strategy's "placement" is one choice per group; the evaluator rewrites the step by that plan
and simulates it (plans tried once, then cached). Post's paper form (``post-paper``: uniform start,
cross-entropy and PPO, no local moves), the cross-entropy method alone (``ce``) and ``random`` get
the same budget and seeds; the table gives each one's best (median and range over seeds), the samples
to its best, against the best uniform plan (every group the same choice). Every time is simulated.

    OMP_NUM_THREADS=1 python benchmarks/post_plans.py [--rows resnet50/k80x4/4,gpt2/mixed/8]
        [--budget 64] [--seeds 3] [--groups 8] [--strategies "random;ce;post-paper"] [--from-best]

``--from-best`` starts every strategy at the best uniform plan (told first; Post's prior anchored there), as
``place``'s plan search does; ``--strategies`` takes ``NAME:KEY=VALUE,...`` for a config's fields.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

from postplace import zoo
from postplace.cluster import load_cluster
from postplace.placers.practitioner import CHOICES, PlanChoices


def strategy_of(text: str, space):
    """``name`` or ``name:key=value,key=value`` (fields of the strategy's config): the name and its config (None:
    its own)."""
    from dataclasses import fields, replace

    from postplace.search import make_strategy

    name, _, sets = text.partition(":")
    if not sets:
        return name, None
    config = make_strategy(name, space).config
    known = {f.name: getattr(config, f.name) for f in fields(config)}

    def value(key: str, text: str):
        if key not in known:
            raise SystemExit(f"--strategies {name}: no field '{key}' (its fields: {', '.join(known)})")
        default = known[key]
        if isinstance(default, bool):
            if text.lower() not in ("true", "false"):
                raise SystemExit(f"--strategies {name}: {key} takes true or false, not '{text}'")
            return text.lower() == "true"
        if default is None or isinstance(default, (int, float)):
            number = float(text)
            return int(number) if isinstance(default, int) and number.is_integer() else number
        return text

    pairs = [kv.split("=", 1) for kv in sets.split(",")]
    if any(len(kv) != 2 for kv in pairs):
        raise SystemExit(f"--strategies {text}: give NAME:KEY=VALUE,KEY=VALUE")
    return name, replace(config, **{k: value(k, v) for k, v in pairs})


def row(spec: str, budget: int, seeds: int, groups: int, strategies, from_best: bool) -> None:
    model, cluster, m = spec.split("/")
    g = zoo.cached_graph(model, "full", "sgd", microbatches=int(m))
    c = load_cluster(cluster)
    gpus = [i for i, d in enumerate(c.devices) if d.kind == "gpu"][: int(m)]
    ev = PlanChoices(g, c, gpus, runs=groups)
    G = len(ev.groups)
    uniform = {name: ev.evaluate(np.full((1, G), k)) for k, name in enumerate(CHOICES)}
    fits = {k: float(v.step_time[0]) for k, v in uniform.items() if v.feasible[0]}
    best_uniform = min(fits.values()) if fits else None
    print(
        f"{spec}: {G} groups x {len(CHOICES)} choices; uniform: "
        + ", ".join(f"{k} {v * 1e3:.2f} ms" for k, v in fits.items()),
        flush=True,
    )
    home = None
    if from_best and fits:
        home = [CHOICES.index(min(fits, key=fits.get))] * G
    for strategy in strategies:
        t0 = time.perf_counter()
        name, config = strategy_of(strategy, ev.space(home))
        res = [ev.search(name, budget, seed, start=home, config=config) for seed in range(seeds)]
        bests = [r.best_step_s for r in res]
        below = sum(b < best_uniform - 1e-12 for b in bests) if best_uniform else 0
        print(
            f"  {strategy:10s} best median {statistics.median(bests) * 1e3:.3f} ms "
            f"(range {min(bests) * 1e3:.3f}-{max(bests) * 1e3:.3f}), found at samples {[r.at for r in res]}, "
            f"below the best uniform plan in {below} of {seeds} seeds; new bests "
            f"{[r.new_bests for r in res]}; {time.perf_counter() - t0:.0f} s",
            flush=True,
        )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", default="resnet50/k80x4/4,gpt2/mixed/8")
    ap.add_argument("--budget", type=int, default=64)
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--groups", type=int, default=8)
    ap.add_argument("--strategies", default="random;ce;post-paper", help="NAME[:KEY=VALUE,...];... (config fields)")
    ap.add_argument("--from-best", action="store_true", help="start at the best uniform plan, as place does")
    args = ap.parse_args()
    for spec in args.rows.split(","):
        row(spec, args.budget, args.seeds, args.groups, args.strategies.split(";"), args.from_best)


if __name__ == "__main__":
    main()
