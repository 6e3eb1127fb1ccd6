"""The micro-batch counts a run weighs (DESIGN.md section 4c) and how its budget is shared among them.

When the target can be traced again (a zoo model, a module with ``Step(targets=...)``), ``place`` traces the
step as m micro-batches for every m of :func:`microbatch_counts` (1, 2, 4... dividing the batch, up to
the number of GPUs or 8, whichever is larger, or further to the count where one micro-batch fits);
:mod:`postplace.api.run` weighs the same candidates at every m and answers with the fastest of all.

The search budget goes where it pays, by successive halving over m (Jamieson and Talwalkar, 2016;
:func:`halving_rounds`): round r gives an equal share ``B / R`` to the counts still in, split evenly;
after each round the better half of them (by the best step time known at that m, search or candidate;
ties to the smaller m) stays in, until one is left. With 4 counts and 2400 samples: 200 each, then 400
for two, then 800 for one. One count is the special case of one round. ``plans.json`` records which
counts each round kept, as it decides (:func:`write_plans`), so a run stopped at any moment resumes to
the same answer (:func:`read_plans`).

A finished run extends to a larger budget (``resume(out, budget=...)``): the rounds run again as
recorded, each count's share now that of the larger budget under the same rule (never less than it
holds), its search resumed from its checkpoint; a count that holds its share already runs nothing in
that round. Every earlier sample is kept, and rounds not yet decided are decided as above.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from postplace.errors import PostplaceError
from postplace.validate import read_json

__all__ = ["PLANS", "fitting_count", "halving_rounds", "microbatch_counts", "read_plans", "trace_counts", "write_plans"]

PLANS = "plans.json"


def microbatch_counts(batch: int, gpus: int, fits_at: int = 1) -> list[int]:
    """Powers of two dividing ``batch``, up to ``max(8, gpus, fits_at)``: data parallelism over every
    GPU, pipelines of up to 8 micro-batches on small machines, and enough micro-batches for one
    micro-batch's activations to fit a GPU beside the whole replicated state (``fits_at``, from
    :func:`fitting_count`). (Twice the GPUs would halve a deep pipeline's bubble, but doubles the
    largest graph: 32 x Inception-V3 is 70,000 ops.)"""
    cap = min(batch, max(8, gpus, fits_at))
    out, m = [], 1
    while m <= cap:
        if batch % m == 0:
            out.append(m)
        m *= 2
    return out


def trace_counts(trace, counts) -> tuple[dict, dict[str, str]]:
    """``({m: trace(m)}, {m: why})`` over ``counts``: a count whose step cannot be traced (a
    :class:`PostplaceError`, e.g. batch norm over one sample per micro-batch) is left out, with its reason."""
    traced, skipped = {}, {}
    for m in counts:
        try:
            traced[m] = trace(m)
        except PostplaceError as exc:
            skipped[str(m)] = str(exc)
    return traced, skipped


def fitting_count(graph, cluster, exclude=()) -> int:
    """The smallest power of two m for which one micro-batch's activations (the one-batch step's
    peak on its first GPU, less the persistent bytes, over m) fit the smallest GPU beside the
    persistent state and a gradient per parameter: where a step needs gradient accumulation to fit
    at all (GPT-2 at batch 64 on 12 GB dies: 16), the counts must reach it. 1 without a GPU. The GPUs
    ``exclude`` names (``--exclude``) are left out."""
    from postplace.cluster.placement import single_device
    from postplace.cost import priced_on
    from postplace.sim import Simulator

    names = list(cluster.device_names)
    excluded = {names.index(d) for d in exclude if d in names}
    gpus = [d for d in range(cluster.num_devices) if cluster.devices[d].kind == "gpu" and d not in excluded]
    if not gpus:
        return 1
    ops = single_device(graph, cluster, cluster.device_names[gpus[0]])
    sim = Simulator(graph, cluster, cost_model=priced_on(None, cluster, set(range(cluster.num_devices)) - excluded))
    peak = float(sim.evaluate_ops(ops[None]).peak_mem[0, gpus[0]])
    state = float(graph.persistent_bytes.sum()) + float(graph.metadata.get("param_bytes") or 0.0)
    room = float(min(cluster.capacity[gpus])) - state
    need = max(peak - float(graph.persistent_bytes.sum()), 0.0)
    if room <= 0:
        return 1 << 20  # the state alone does not fit: as many micro-batches as the batch allows
    m = 1
    while need / m > room:
        m *= 2
    return m


def halving_rounds(n: int) -> list[int]:
    """How many counts each round of successive halving runs: ``[n, ceil(n/2), ..., 1]``."""
    sizes = [n]
    while sizes[-1] > 1:
        sizes.append(math.ceil(sizes[-1] / 2))
    return sizes


def write_plans(out: Path, counts: list[int], rounds: list[list[int]]) -> None:
    tmp = out / (PLANS + ".tmp")
    tmp.write_text(json.dumps({"format": "postplace-plans", "counts": counts, "rounds": rounds}))
    tmp.replace(out / PLANS)


def read_plans(out: Path, counts: list[int], sizes: list[int]) -> list[list[int]]:
    """The rounds a resumed run already decided, checked against the counts and the halving schedule."""
    path = out / PLANS
    if not path.exists():
        # round 1's decision is written before any search starts: a search without it lost its rounds
        searched = [f"m{m}" for m in counts if (out / f"m{m}" / "history.jsonl").exists()]
        if searched:
            raise PostplaceError(
                f"{path}: missing, while {', '.join(searched)} hold searches of this run (the "
                "halving's decisions are lost: deleted?); start a new run"
            )
        return []
    try:
        d = read_json(path, "plans file", finite=False)
    except PostplaceError as exc:
        raise PostplaceError(f"{path}: damaged ({str(exc).removeprefix(f'{path}: ')}); start a new run") from None
    rounds = d.get("rounds") if isinstance(d, dict) else None
    recorded = d.get("counts") if isinstance(d, dict) else None
    ok = isinstance(d, dict) and d.get("format") == "postplace-plans" and isinstance(recorded, list)
    ok = ok and [type(m) for m in recorded] == [int] * len(counts) and recorded == counts  # 2.0, true: not counts
    ok = ok and isinstance(rounds, list) and len(rounds) <= len(sizes)
    alive = counts
    for r, kept in enumerate(rounds if ok else []):
        if (
            not isinstance(kept, list)
            or len(kept) != sizes[r]
            or any(type(m) is not int for m in kept)
            or not set(kept) <= set(alive)
            or kept != sorted(set(kept))
        ):
            ok = False
            break
        alive = kept
    if not ok:
        raise PostplaceError(f"{path}: not the rounds of this run (edited or damaged); start a new run")
    return rounds
