"""Evaluators beyond the simulator: measuring samples with the torch runtime (``--evaluator
torch``), on Ray actors (``--ray``), and ``--confirm K``, which measures the K best candidates for
real and returns the fastest measured.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from postplace.api.target import Target, _recorded_step
from postplace.errors import PostplaceError


def _torch_evaluator(settings: dict, tgt: Target, c, problem):
    from dataclasses import replace

    judge = _measurer(settings, tgt, c, group_of_op=problem.grouping.group_of_op)
    # measured seconds can exceed the simulator's bound: failures must still score worst
    space = replace(problem.space, failure_step_time=max(problem.space.failure_step_time, judge.failure_step_time))
    return judge, space


def _measurer(settings: dict, tgt: Target, c, *, group_of_op=None):
    """The in-process TorchEvaluator of the target's own code (a traced module or a zoo model), over
    ``group_of_op``'s units or, without it, at op level."""
    from postplace.runtime.evaluator import TorchEvaluator

    if tgt.traced is not None:
        return TorchEvaluator(tgt.traced, c, group_of_op=group_of_op, device_map=settings["map_all_to"])
    spec = tgt.spec
    return TorchEvaluator.for_zoo(spec["name"], spec["size"], c, group_of_op=group_of_op,
                                  device_map=settings["map_all_to"], graph=tgt.graph,
                                  microbatches=spec.get("microbatches", 1),
                                  colocation=spec.get("microbatch_colocation", "none"))  # fmt: skip


def _check_confirm(k: int, settings: dict, tgt: Target, out: Path | None, ray: str | None) -> None:
    """``--confirm K`` measures the K best of a simulated search: it needs code to run and a run folder."""
    if isinstance(k, bool) or not isinstance(k, int | np.integer) or k < 0:
        raise PostplaceError(f"--confirm {k!r}: give how many of the search's best placements to measure (0 = none)")
    if not k:
        return
    if settings["evaluator"] != "simulator":
        raise PostplaceError("--confirm measures a simulated search's best; with --evaluator torch every sample "
                             "is measured already: drop --confirm")  # fmt: skip
    if tgt.traced is None and tgt.spec.get("kind") != "zoo":
        raise PostplaceError("--confirm runs placements for real: give a zoo model name or an nn.Module target "
                             "(a graph file has no code to run)")  # fmt: skip
    if out is None:
        raise PostplaceError("--confirm reads the search's best placements from its run folder: pass out=DIR")
    if ray is not None and tgt.spec.get("kind") != "zoo":
        raise PostplaceError("--confirm with --ray needs a zoo model name (actors trace it themselves)")


def _ray_evaluator(address: str, settings: dict, tgt: Target, c, problem):
    """The search's evaluator on Ray actors (``--ray local`` or an address): the same answers, in parallel."""
    from postplace.distributed import RayEvaluator, SimulatorFactory, TorchZooFactory

    gop = problem.grouping.group_of_op
    if settings["evaluator"] == "torch":
        if tgt.spec.get("kind") != "zoo":
            raise PostplaceError("--ray with --evaluator torch needs a zoo model name (actors trace it themselves)")
        factory = TorchZooFactory(tgt.spec["name"], tgt.spec["size"], c, group_of_op=gop,
                                  device_map=settings["map_all_to"], microbatches=tgt.spec.get("microbatches", 1),
                                  colocation=tgt.spec.get("microbatch_colocation", "none"),
                                  **_recorded_step(tgt.spec))  # fmt: skip
    else:
        factory = SimulatorFactory(problem.graph, c, group_of_op=gop, cost_model=problem.simulator.problem.cost_model)
    return RayEvaluator(factory, address=address)


def _confirm(k: int, settings: dict, tgt: Target, c, problem, out: Path, ray: str | None, answer=()):
    """Measure the ``k`` best distinct candidates of the answer (the search's best placements from its
    cache and the one-shot candidates ``answer``: placers, data parallelism, pipeline, warm start, by
    simulated step time) and the best single device; the fastest measured wins."""
    from postplace.confirm import candidates_from_run
    from postplace.confirm import confirm as measure

    searched = candidates_from_run(out, problem.simulator, k)
    pool = []  # (simulated step time, order, label, op placement)
    if len(searched):
        times = problem.simulator.evaluate_ops(searched).step_time
        pool += [(float(t), i, f"search #{i + 1}", ops) for i, (t, ops) in enumerate(zip(times, searched, strict=True))]
    pool += [(k_.step_time_s, len(pool) + j, k_.name, k_.placement) for j, k_ in enumerate(answer)
             if k_.feasible and k_.name != "search" and not k_.name.startswith("single:")]  # fmt: skip
    pool.sort(key=lambda x: (x[0], x[1]))
    chosen, seen = [], set()
    for _t, _i, label, ops in pool:
        key = np.asarray(ops, dtype=np.int64).tobytes()
        if key not in seen:
            seen.add(key)
            chosen.append((label, ops))
        if len(chosen) == k:
            break
    cands = np.stack([ops for _, ops in chosen]) if chosen else np.zeros((0, tgt.graph.num_ops), dtype=np.int64)
    labels = [label for label, _ in chosen]
    if ray is not None:  # a zoo model: _check_confirm refused a module before the search
        from postplace.distributed import RayEvaluator, TorchZooFactory

        measurer = RayEvaluator(TorchZooFactory(tgt.spec["name"], tgt.spec["size"], c,
                                                device_map=settings["map_all_to"],
                                                microbatches=tgt.spec.get("microbatches", 1),
                                                colocation=tgt.spec.get("microbatch_colocation", "none")),
                                address=ray)  # fmt: skip
    else:
        measurer = _measurer(settings, tgt, c)
    try:
        return measure(problem.simulator, measurer, cands, allowed=problem.op_allowed, labels=labels or None)
    finally:
        if hasattr(measurer, "shutdown"):
            measurer.shutdown()
