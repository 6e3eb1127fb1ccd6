"""What the runtime commands show, as plain functions returning text, so ``cli.py`` wires each in one line:
``postplace train MODEL --placement FILE --steps N [--map-all-to cpu]`` -> :func:`cmd_train`,
``postplace calibrate MODEL`` -> :func:`cmd_calibrate`, ``postplace launch RUN_FOLDER`` -> :func:`cmd_launch`.
Errors are :class:`PostplaceError` lines.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch

from postplace.errors import PostplaceError

__all__ = ["cmd_calibrate", "cmd_launch", "cmd_train"]

MAX_THREADS = 1024
"""The most torch threads ``--threads`` sets: beyond the cores of any machine, and OpenMP crashed the
process (a segmentation fault) when asked for 100,000."""


def _check_threads(threads: int | None) -> None:
    if threads is not None and not 1 <= threads <= MAX_THREADS:
        raise PostplaceError(
            f"--threads {threads}: give 1 to {MAX_THREADS:,} threads (this machine has {os.cpu_count()} cores)"
        )


def _placement(spec: str, graph, cluster, mapped=None):
    """(op-level ids, device names) from ``single:DEVICE`` or a ``{op name: device name}`` JSON file.

    Without a cluster the file must name every op of the graph and nothing else, each with a device
    name that runs somewhere: ``cpu``, ``gpuK``, or a name ``mapped`` (by --device) says where to run."""
    from postplace.cluster.placement import load_placement, single_device
    from postplace.graph.opgraph import read_json

    if spec.startswith("single:"):
        name = spec.split(":", 1)[1]
        if cluster is not None:
            return single_device(graph, cluster, name), list(cluster.device_names)
        return np.zeros(graph.num_ops, dtype=np.int64), [name]
    if cluster is not None:
        return load_placement(spec, graph, cluster), list(cluster.device_names)
    if not Path(spec).exists():
        raise PostplaceError(f"{spec}: no such placement file (or use single:DEVICE)")
    mapping = read_json(spec)
    if not isinstance(mapping, dict):
        raise PostplaceError(f"{spec}: a placement file is one JSON object {{op name: device name}}")
    known = set(graph.names)
    for name, device in mapping.items():
        if name not in known:
            raise PostplaceError(f"{spec}: op '{name}' is not in graph '{graph.name}'; check the op names")
        if not isinstance(device, str):
            raise PostplaceError(f"{spec}: op '{name}' maps to {device!r}; use a device name such as 'gpu0'")
        runnable = device == "cpu" or (device[:3] == "gpu" and device[3:].isdigit()) or device in (mapped or ())
        if not runnable and mapped is not True:
            raise PostplaceError(
                f"{spec}: op '{name}' is on '{device}', which is not cpu or gpuK; give --cluster, or "
                f"--device {device}=TORCH_DEVICE"
            )
    missing = [n for n in graph.names if n not in mapping]
    if missing:
        raise PostplaceError(
            f"{spec}: {len(missing)} ops have no device (e.g. '{missing[0]}'); give --cluster to complete "
            "the placement through colocation, or write every op"
        )
    names = sorted(set(mapping.values()), key=lambda s: (s != "cpu", s))
    idx = {n: k for k, n in enumerate(names)}
    return np.array([idx[mapping[n]] for n in graph.names], dtype=np.int64), names


def _explain(exc: BaseException) -> str:
    msg = str(exc).strip().splitlines()[0][:200] if str(exc).strip() else type(exc).__name__
    hint = "; on a machine without those devices add --map-all-to cpu" if "cuda" in msg.lower() else ""
    return msg + hint


def _sizes_of(model: str) -> tuple[str, ...]:
    """The sizes zoo model ``model`` has (``small``, ``full`` for a name the zoo does not know: that
    is reported where the model is built)."""
    from postplace.zoo import MODELS, SIZES, sizes

    return sizes(model) if model in MODELS else SIZES


def _known(model: str, size) -> bool:
    """``size`` is one of ``model``'s (:func:`_sizes_of`), optionally at a batch (``small@8``)."""
    from postplace.zoo import MODELS, known_size

    if not isinstance(size, str):
        return False
    return known_size(model, size) if model in MODELS else size in _sizes_of(model)


def _recorded_spec(placement: str) -> dict | None:
    """The target a placement's run was made for (the ``summary.json`` beside a ``placement.json``)."""
    import json

    summary = Path(placement).parent / "summary.json"
    spec = None
    if not placement.startswith("single:") and summary.is_file():
        try:
            spec = json.loads(summary.read_text()).get("target_spec")
        except (OSError, ValueError, UnicodeDecodeError, AttributeError):
            spec = None
    return spec if isinstance(spec, dict) and spec.get("kind") == "zoo" else None


def _step_for(placement: str, optimizer, lr, precision) -> dict:
    """The optimizer and precision to train with: as the placement's run recorded them (a flag that
    disagrees is one line), else the flags (default SGD, fp32)."""
    from postplace.graph.optimizers import optimizer_from_record, optimizer_mismatch

    spec = _recorded_spec(placement) or {}
    rec_opt, rec_prec = spec.get("optimizer"), spec.get("precision")
    if rec_opt is not None:
        differ = optimizer_mismatch(rec_opt, optimizer, lr)
        if differ is not None:
            was, given = differ
            raise PostplaceError(
                f"{placement} was made for the {was['name']} optimizer with "
                f"{was['groups'][0]} (its summary.json), not {given['name']} with "
                f"{given['groups'][0]}; drop --optimizer/--lr"
            )
    if rec_prec is not None and precision is not None and precision != rec_prec:
        raise PostplaceError(
            f"{placement} was made for --precision {rec_prec} (its summary.json), not {precision}; "
            f"drop --precision or give {rec_prec}"
        )
    if rec_opt is not None:
        return {"optimizer": optimizer_from_record(rec_opt), "lr": None, "precision": rec_prec or "fp32"}
    return {"optimizer": optimizer or "sgd", "lr": lr, "precision": precision or rec_prec or "fp32"}


def _size_for(model: str, placement: str, size: str | None) -> str:
    """The zoo size to train: the one the placement was made for where its run folder says so (the
    ``summary.json`` beside a ``placement.json`` records the target), else ``size`` (default full, as
    every command's);
    a ``size`` or model that disagrees with the run is one error line naming both."""
    spec = _recorded_spec(placement)
    if isinstance(spec, dict) and spec.get("kind") == "zoo" and _known(model, spec.get("size")):
        if spec.get("name") != model:
            raise PostplaceError(
                f"{placement} was made for zoo model '{spec.get('name')}' (its summary.json), not "
                f"'{model}'; train {spec.get('name')}"
            )
        if size is not None and size != spec["size"]:
            raise PostplaceError(
                f"{placement} was made for {model} at --size {spec['size']} (its summary.json), not "
                f"--size {size}; drop --size or give --size {spec['size']}"
            )
        return spec["size"]
    return "full" if size is None else size


def cmd_train(
    model: str,
    placement: str | None,
    steps: int = 10,
    *,
    size: str | None = None,
    cluster: str | None = None,
    map_all_to: str | None = None,
    device_map: Sequence[str] = (),
    optimizer: str | None = None,
    seed: int = 0,
    threads: int | None = None,
    microbatches: int | None = None,
    colocation: str = "none",
    lr: float | None = None,
    precision: str | None = None,
    as_json: bool = False,
) -> str:
    """``postplace train MODEL --placement FILE --steps N``: train zoo model ``MODEL`` (a fresh random batch
    every step) under a placement and report each step's measured time and loss, the median of the
    second half of the steps, and which module ran where.

    ``placement``: ``single:DEVICE`` or a placement JSON file (as ``postplace place`` writes it);
    ``cluster``: preset or file, to check the placement's rules and complete it through colocation,
    and to print the simulated step time beside the measured one; ``map_all_to``: one torch device for
    every logical device (``cpu`` runs any placement on a CPU-only machine, transfers included as
    copies); ``device_map``: ``NAME=TORCH_DEVICE`` entries (e.g. ``gpu1=cuda:0``) over the defaults
    ``cpu -> cpu``, ``gpuK -> cuda:K``; ``threads``: torch's CPU threads for the run (default: as they
    are; on a machine shared with other jobs, 1 avoids threads waiting on each other at every small op);
    ``microbatches``/``colocation``: run the step traced as that many micro-batches (gradient
    accumulation; the placement is of that graph, e.g. from ``postplace graph MODEL --microbatches m`` or
    a ``postplace place`` run over several m). ``microbatches=None``: as the placement file's op names
    say (``mb0_...mb{m-1}_`` copies: m; none: 1); a count that disagrees with the file is one error line.
    ``optimizer``/``lr``/``precision``: the step's update and autocast dtype; default as the
    placement's run recorded them, else SGD (lr 0.1, momentum 0.9) in fp32.

    ``MODEL`` may be a run folder of ``postplace place`` instead (``postplace train RUN_FOLDER``): its
    zoo model and ``placement.json``, on its cluster unless ``cluster`` says otherwise. ``as_json``: one
    JSON object ``{"losses": [...], "step_times_s": [...], ...}`` instead of the table (the losses
    ``postplace launch RUN_FOLDER --json`` prints, from the same batches: torch's generator is seeded
    with ``seed`` before the first step, the batches drawn from a generator seeded alike).
    """
    if Path(model).is_dir():
        from postplace.runtime.launcher import run_folder

        if placement is not None:
            raise PostplaceError(f"{model} is a run folder, whose placement is its placement.json; drop --placement")
        run = run_folder(model)
        model, placement, cluster = run["name"], str(run["placement"]), cluster or run["cluster"]
    elif placement is None:
        raise PostplaceError(f"give --placement FILE (or single:DEVICE) for zoo model '{model}', or a run folder")
    if steps < 1:
        raise PostplaceError(f"--steps {steps}: give at least 1 step")
    size = _size_for(model, placement, size)
    if not _known(model, size):
        raise PostplaceError(f"--size '{size}': use one of {', '.join(_sizes_of(model))} (SIZE@N at a batch of N)")
    _check_threads(threads)
    saved = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    try:
        step = _step_for(placement, optimizer, lr, precision)
        return _train(
            model,
            placement,
            steps,
            size,
            cluster,
            map_all_to,
            device_map,
            step,
            seed,
            microbatches,
            colocation,
            as_json,
        )
    finally:
        torch.set_num_threads(saved)


def _file_microbatches(spec: str, mb: int | None) -> tuple[int, bool]:
    """The micro-batch count to trace: ``mb`` checked against a placement file's op names, or read from
    them when ``mb`` is None; and whether it was read from the file."""
    from postplace.graph.opgraph import read_json
    from postplace.runtime.zoo_step import check_placement_microbatches

    if mb is not None and (isinstance(mb, bool) or mb < 1):
        raise PostplaceError(f"--microbatches {mb}: give at least 1")
    if spec.startswith("single:") or not Path(spec).is_file():
        return (1 if mb is None else mb), False  # a missing file is reported where it is read
    mapping = read_json(spec)
    if not isinstance(mapping, dict):
        raise PostplaceError(f"{spec}: a placement file is one JSON object {{op name: device name}}")
    return check_placement_microbatches(mapping, mb, spec), mb is None


def _train(
    model, placement, steps, size, cluster, map_all_to, device_map, step_kw, seed, mb=None, coloc="none", as_json=False
) -> str:
    from postplace.cluster import load_cluster
    from postplace.runtime.placed import apply
    from postplace.runtime.zoo_step import random_like, trace_zoo_step

    c = load_cluster(cluster) if cluster else None
    mb, inferred = _file_microbatches(placement, mb)
    if map_all_to is not None:
        dmap = map_all_to
    else:
        dmap = {}
        for entry in device_map:
            if "=" not in entry:
                raise PostplaceError(f"--device '{entry}': write NAME=TORCH_DEVICE, e.g. gpu0=cuda:0")
            k, v = entry.split("=", 1)
            dmap[k.strip()] = v.strip()
    traced = trace_zoo_step(model, size, microbatches=mb, colocation=coloc, **step_kw)
    graph = traced.graph
    dev, names = _placement(placement, graph, c, mapped=True if map_all_to is not None else set(dmap))
    try:
        step = apply(traced.model, traced, dev, names, device_map=dmap)
    except (RuntimeError, AssertionError) as exc:
        raise PostplaceError(f"cannot set up the placed step: {_explain(exc)}") from None
    gen = torch.Generator().manual_seed(seed)
    where = ", ".join(f"{n} -> {d}" for n, d in zip(step.device_names, step.torch_devices, strict=True))
    lines = [
        f"{graph.name}: {graph.num_ops} ops, placement {placement}: "
        + ", ".join(f"{n} {k} ops" for n, k in step.summary["ops_per_device"].items())
        + f"; {step.summary['transfers']} transfer nodes ({step.summary['transfer_bytes'] / 2**20:.2f} MiB per step)",
        f"devices: {where}; torch {torch.__version__}, {torch.get_num_threads()} CPU threads",
    ]
    if mb > 1:
        src = " (read from the placement's op names)" if inferred else ""
        lines.append(f"each step: {mb} micro-batches{src}, gradients accumulated, one {traced.optimizer.name} update")
    lines.append(f"update: {traced.optimizer}; precision {traced.precision}")
    lines.append(f"{'step':>5} {'loss':>10} {'time ms':>10}")
    times, losses = [], []
    torch.manual_seed(seed)  # random ops (dropout) draw as every rank of `postplace launch` does
    try:
        for k in range(steps):
            batch = [random_like(x, gen) for x in traced.batch or traced.inputs]
            t0 = time.perf_counter()
            loss = step(*batch)
            step.synchronize()
            value = float(loss)
            losses.append(value)
            times.append(time.perf_counter() - t0)
            lines.append(f"{k + 1:5d} {value:10.4f} {times[-1] * 1e3:10.2f}")
    except torch.OutOfMemoryError as exc:
        msg = str(exc).splitlines()[0][:120]
        raise PostplaceError(f"step {len(times) + 1} ran out of device memory ({msg})") from None
    except (RuntimeError, AssertionError) as exc:
        raise PostplaceError(f"step {len(times) + 1} failed: {_explain(exc)}") from None
    if as_json:
        import json

        return json.dumps(
            {
                "losses": losses,
                "step_times_s": times,
                "placement": placement,
                "devices": dict(zip(step.device_names, map(str, step.torch_devices), strict=True)),
                "threads": torch.get_num_threads(),
                "seed": seed,
            }
        )
    tail = times[len(times) // 2 :]
    lines.append(
        f"measured step time: median {np.median(tail) * 1e3:.2f} ms over steps {steps - len(tail) + 1}..{steps} "
        "(the first half are warm-up)"
    )
    if c is not None:
        from postplace.cost import priced_on
        from postplace.sim import Simulator

        sim = Simulator(graph, c, cost_model=priced_on(None, c, dev.tolist())).evaluate_ops(dev[None])
        note = " (cluster devices, not the devices this ran on)" if map_all_to or device_map else ""
        lines.append(f"simulated step time on {c.name}: {sim.step_time[0] * 1e3:.2f} ms{note}")
    lines.append("")
    lines.append("where each module ran (op counts where a module is split):")
    lines.append(step.format_module_report(depth=2))
    return "\n".join(lines)


def cmd_calibrate(
    model: str,
    size: str = "full",
    *,
    out: str | Path | None = None,
    out_cluster: str | Path | None = None,
    out_graph: str | Path | None = None,
    batches: Sequence[int] | None = None,
    score_on: Sequence[str] = (),
    runs: int = 3,
    threads: int | None = None,
) -> str:
    """``postplace calibrate MODEL``: measure op and transfer times on the devices present, write them into
    a cluster file (``out_cluster``, default ``OUT/measured.toml``) and the graph of ``MODEL`` at ``size``
    (``out_graph``, default ``OUT/graph.json``; ``out`` default ``runs/calibrate-MODEL-SIZE``), and print a
    fidelity report of simulated against measured step time.

    The fidelity part uses the mid-sized configuration of ``MODEL`` (see
    :data:`postplace.runtime.calibrate.FIDELITY_CONFIGS`) at ``batches`` (default: its four batch
    sizes): the cost model is fitted on the smallest and the largest batch and scored on the others,
    and on every batch of each model in ``score_on`` (held-out models). On a CPU-only machine the
    placements are the single CPU; with CUDA devices also each GPU alone and a CPU+GPU split.
    ``threads`` sets torch's CPU threads for all measurements (default: as they are).
    """
    from postplace.runtime import calibrate as cal
    from postplace.zoo import MODELS, trace_model

    for m in (model, *score_on):
        if m not in MODELS:
            raise PostplaceError(f"unknown zoo model '{m}'; known models: {', '.join(MODELS)}")
        if m not in cal.FIDELITY_CONFIGS:
            known = ", ".join(cal.FIDELITY_CONFIGS)
            raise PostplaceError(f"model '{m}' has no calibration configs; use one of {known}")
    if size not in _sizes_of(model):
        raise PostplaceError(f"--size '{size}': use one of {', '.join(_sizes_of(model))}")
    from postplace.cost.profile import check_runs

    check_runs(runs)
    _check_threads(threads)
    if batches is not None and any(b < 1 for b in batches):
        raise PostplaceError(f"--batches {','.join(map(str, batches))}: batch sizes must be >= 1")
    bs = list(batches or [c.overrides["batch"] for c in cal.FIDELITY_CONFIGS[model]])
    if len(bs) < 3:
        raise PostplaceError(f"--batches: give at least 3 batch sizes (fit on the smallest and largest), got {bs}")
    bs = sorted(bs)
    saved = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    try:
        devices = cal.devices_present()
        rooflines = {cal.device_model(d): cal.device_roofline(d) for _, d in devices}
        links = {n: cal.measure_link(devices[0][1], d) for n, d in devices[1:]}
        base = cal.FIDELITY_CONFIGS[model][0].overrides
        calib, held = [], []
        for b in bs:
            m = cal.measure_config(cal.Config(model, {**base, "batch": b}), devices, rooflines=rooflines, runs=runs)
            (calib if b in (bs[0], bs[-1]) else held).append(m)
        for other in score_on:
            for cfg in cal.FIDELITY_CONFIGS[other]:
                held.append(cal.measure_config(cfg, devices, rooflines=rooflines, runs=runs))
        report, fits = cal.fidelity(calib, held, devices, rooflines, links)
        target = cal.measure_config(
            trace_model(model, size), devices, rooflines=rooflines, runs=runs, steps=4, discard=2
        )
        used_threads = torch.get_num_threads()
    finally:
        torch.set_num_threads(saved)
    folder = Path(out or f"runs/calibrate-{model}-{size}")
    out_cluster = Path(out_cluster or folder / "measured.toml")
    out_graph = Path(out_graph or folder / "graph.json")
    try:
        for path in (out_cluster, out_graph):
            path.parent.mkdir(parents=True, exist_ok=True)
        out_cluster.write_text(cal.cluster_toml(devices, rooflines, links, fits))
    except OSError as exc:
        raise PostplaceError(f"{out_cluster}: cannot write the cluster file ({exc.strerror or exc})") from None
    target.graph.save(out_graph)
    report.header = (
        f"calibrated on {model} at batch {bs[0]} and {bs[-1]}; scored on "
        + ", ".join([f"{model} at batch {b}" for b in bs[1:-1]] + [f"{o} (all batches)" for o in score_on])
        + f"; torch {torch.__version__}, {used_threads} CPU thread(s)"
    )
    measured_here = ", ".join(f"{k} {v * 1e3:.2f} ms" for k, v in target.step_times.items())
    return "\n".join(
        [
            report.format(),
            f"wrote {out_cluster} (devices: {', '.join(n for n, _ in devices)}; "
            "measured rates, fitted per-op overhead)",
            f"wrote {out_graph} ({target.graph.name}: per-op times for {', '.join(target.op_times)}; measured step "
            f"{measured_here})",
            f"use them with: postplace simulate {out_graph} --cluster {out_cluster} --placement single:cpu",
        ]
    )


def cmd_launch(
    folder: str,
    steps: int = 3,
    *,
    as_json: bool = False,
    seed: int = 0,
    timeout: float = 60.0,
    backend: str = "gloo",
    threads: int | None = 1,
    checkpoint=None,
    resume: bool = False,
) -> str:
    """``postplace launch RUN_FOLDER``: run the folder's placement with one process per device it uses
    (:func:`postplace.runtime.launcher.launch_run`) and report each step's loss, and each rank's bytes per
    step (measured, beside the simulator's for the same placement) and measured step time.

    ``as_json``: one JSON object ``{"losses", "bytes_sent", "bytes_received", "ranks", "step_times_s",
    "comm_times_s", "backend", "simulated_bytes_sent", "simulated_bytes_received", "measured_on"}``
    (bytes per step, by rank).
    """
    import json

    from postplace.runtime.launcher import launch_run

    if threads is not None:
        _check_threads(threads)
    result, sim = launch_run(
        folder,
        steps=steps,
        seed=seed,
        timeout=timeout,
        backend=backend,
        threads=threads,
        checkpoint=checkpoint,
        resume=resume,
    )
    from postplace.runtime.launcher import measured_on

    where = measured_on(backend)
    if as_json:
        simulated = {f"simulated_{k}": {str(r): n for r, n in v.items()} for k, v in sim.items()}
        return json.dumps({**result.to_json(), **simulated, "measured_on": where, "steps": steps, "seed": seed})
    plan = result.plan
    lines = [
        f"{folder}: {plan.world_size} processes by torch's elastic launcher, {len(plan.messages)} messages"
        + (f" and {len(plan.collectives)} collectives" if plan.collectives else "")
        + " per step",
        f"measured on {where}; torch {torch.__version__}, "
        f"{threads if threads is not None else torch.get_num_threads()} CPU thread(s) per rank",
        f"{'step':>5} {'loss':>12}",
    ]
    if result.start_step:
        lines.insert(2, f"resumed after step {result.start_step}, the last every rank recorded in {checkpoint}")
    lines += [f"{result.start_step + k + 1:5d} {loss:12.6f}" for k, loss in enumerate(result.losses)]
    lines.append("")
    lines.append(
        f"{'rank':>4} {'device':8} {'sent B/step':>12} {'simulated':>12} {'received':>12} {'simulated':>12} "
        f"{'step ms':>9} {'comm ms':>9}"
    )
    for r, device in result.ranks.items():
        tail = result.step_times_s[r][len(result.step_times_s[r]) // 2 :]
        comm = result.comm_times_s[r][len(result.comm_times_s[r]) // 2 :]
        lines.append(
            f"{r:4d} {device:8} {result.bytes_sent[r]:12,d} {sim['bytes_sent'][r]:12,d} "
            f"{result.bytes_received[r]:12,d} {sim['bytes_received'][r]:12,d} "
            f"{np.median(tail) * 1e3:9.2f} {np.median(comm) * 1e3:9.2f}"
        )
    lines.append(
        "step and comm ms: medians over the second half of the steps (measured; comm: inside sends and "
        "receives, waits included)"
    )
    return "\n".join(lines)
