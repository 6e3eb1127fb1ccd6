"""Continuing a run folder: ``run.json`` read and checked, the arguments given again compared with
the recorded ones (one line for each that differs), the checkpoint checked against the settings it
was written under, the recorded cluster checked against its fingerprint, then the same run again.
"""

from __future__ import annotations

from pathlib import Path

from postplace.api.result import PlaceResult
from postplace.api.run import place_run
from postplace.api.settings import (
    SETTINGS,
    RunSettings,
    budget_text,
    check_same_optimizer,
    config_json,
    read_settings,
    strategy_config,
)
from postplace.api.target import Target, load_cluster, load_target, recorded_step
from postplace.errors import PostplaceError
from postplace.search.state_io import fingerprint, fingerprints


def resume_folder(
    out: Path, budget, graph, cluster, progress: bool, confirm, ray, given: dict, confirm_with: str = "process"
) -> PlaceResult:
    from postplace.search import Budget
    from postplace.search.checkpoint import CHECKPOINT

    settings = read_settings(out)
    _check_given(out, settings, given)
    over_m = settings.over_m
    if not over_m and (out / CHECKPOINT).exists():
        _check_checkpoint_settings(out, settings)
    if budget is not None:
        new = Budget.parse(budget)
        old = Budget.parse(settings.budget)
        if over_m:
            _check_over_m_extension(out, budget, new, old)
        elif new.samples is not None and (out / CHECKPOINT).exists():
            from postplace.search.checkpoint import checkpoint_samples

            done = checkpoint_samples(out)
            if new.samples < done:
                raise PostplaceError(f"--budget {budget}: the run in {out} already has {done} samples")
        if new != old:  # the old budget is kept: a checkpoint from before the extension still belongs here
            settings = settings.extended(budget_text(new))
    spec = settings.target
    if over_m:
        return _resume_over_m(out, settings, cluster, progress, confirm, ray, confirm_with)
    if spec["kind"] == "file":
        tgt = load_target(spec["path"])
    elif spec["kind"] == "zoo":
        tgt = load_target(
            spec["name"],
            size=spec["size"],
            microbatches=spec.get("microbatches", 1),
            microbatch_colocation=spec.get("microbatch_colocation", "none"),
            **recorded_step(spec),
        )
    elif graph is not None:
        tgt = Target(graph, None, spec)
    elif (out / "graph.json").exists():
        tgt = load_target(out / "graph.json")
        tgt.spec = spec
    else:
        raise PostplaceError(f"{out}: the run was started from an in-memory graph; pass graph= to resume it")
    if settings.graph_sha not in fingerprints(tgt.graph):
        raise PostplaceError(f"{out}: the graph is not the one this run was started with (its file changed?)")
    c = _recorded_cluster(out, settings, cluster, tgt.graph)
    return place_run(
        settings,
        {settings.pinned_count: tgt},
        c,
        out=out,
        resume=True,
        progress=progress,
        confirm_k=confirm,
        ray=ray,
        confirm_with=confirm_with,
    )


def _check_over_m_extension(out: Path, given, new, old) -> None:
    """A run over several micro-batch counts extends to a larger budget of the same kind: its rule shares the
    budget out by rounds (:mod:`postplace.api.over_m`), so each count's share under the new budget is at
    least what it holds, and its searches resume from their checkpoints."""
    if (new.samples is None) != (old.samples is None):
        raise PostplaceError(
            f"--budget {given}: the run in {out} over several micro-batch counts was given "
            f"{budget_text(old)}; extend it in {'samples' if old.samples is not None else 'seconds'}"
            ", as it was started"
        )
    if (new.samples, new.seconds) < (old.samples, old.seconds):  # one of the two is None in both
        raise PostplaceError(
            f"--budget {given}: the run in {out} was given {budget_text(old)}, shared out over its "
            "micro-batch counts; give at least that much"
        )


def _check_checkpoint_settings(out: Path, settings: RunSettings) -> None:
    """The checkpoint was written under these settings (its ``settings_checksum``), or under the same
    ones before a budget extension (``budgets_before``): a checkpoint of another seed, grouping or
    strategy would be continued as if it were this run's."""
    from postplace.search.checkpoint import CHECKPOINT, read_meta

    meta = read_meta(out)
    want = meta.get("settings_checksum") if isinstance(meta, dict) else meta
    if want is None:  # a folder from before checkpoints recorded it
        return
    if want not in settings.accepted_checksums():
        raise PostplaceError(
            f"{out}/{CHECKPOINT} was written under other settings than {out}/{SETTINGS} (one of "
            "them edited, or copied from another run); start a new run"
        )


def _recorded_cluster(out: Path, settings: RunSettings, cluster, graph):
    """The cluster a run was started with (``cluster`` where it was in memory), checked against its fingerprint."""
    if cluster is None:
        if settings.cluster_spec is None:
            raise PostplaceError(f"{out}: the run was started with an in-memory cluster; pass cluster= to resume it")
        cluster = settings.cluster_spec
    c, _ = load_cluster(cluster, graph)
    if fingerprint(c) != settings.cluster_sha:
        raise PostplaceError(f"{out}: the cluster is not the one this run was started with (its file changed?)")
    return c


def _resume_over_m(
    out: Path, settings: RunSettings, cluster, progress: bool, confirm, ray, confirm_with: str = "process"
) -> PlaceResult:
    spec, shas, counts = settings.target, settings.graph_shas, settings.microbatch_counts  # read_settings checked
    targets_by_m = {}
    for m in counts:
        if spec["kind"] == "zoo":
            tgt = load_target(
                spec["name"],
                size=spec["size"],
                microbatches=m,
                microbatch_colocation=settings.colocation,
                **recorded_step(spec),
            )
        elif (out / f"m{m}" / "graph.json").exists():
            own = spec if m == 1 else {**spec, "microbatches": m, "microbatch_colocation": settings.colocation}
            tgt = Target(load_target(out / f"m{m}" / "graph.json").graph, None, own)
        else:
            raise PostplaceError(f"{out}: m{m}/graph.json is missing; the run cannot be resumed, start a new one")
        if shas[str(m)] not in fingerprints(tgt.graph):
            raise PostplaceError(f"{out}: the graph at {m} micro-batches is not the one this run was started with")
        targets_by_m[m] = tgt
    c = _recorded_cluster(out, settings, cluster, targets_by_m[counts[0]].graph)
    return place_run(
        settings,
        targets_by_m,
        c,
        out=out,
        resume=True,
        progress=progress,
        confirm_k=confirm,
        ray=ray,
        confirm_with=confirm_with,
    )


def _resolved(value) -> str:
    p = Path(str(value))
    return str(p.resolve()) if p.exists() else str(value)


def _check_given(out: Path, settings: RunSettings, given: dict) -> None:
    """Settings given again with --resume must equal the recorded ones (``budget`` aside)."""
    if {"optimizer", "lr"} & set(given):
        check_same_optimizer(
            settings.target.get("optimizer", "sgd"),
            given.pop("optimizer", None),
            given.pop("lr", None),
            f"--resume {out}: the run",
        )
    for key, value in given.items():
        if key == "precision":
            recorded = settings.target.get("precision", "fp32")
            if value != recorded:
                raise PostplaceError(
                    f"--resume {out}: the run was started with precision {recorded}, not {value}; "
                    "drop the flag or start a new run"
                )
            continue
        if key == "config":
            cfg = config_json(strategy_config(settings.strategy, value))
            for field_ in value:
                if _norm(cfg[field_]) != _norm(settings.config.get(field_)):
                    raise PostplaceError(
                        f"--resume {out}: the run was started with {field_}="
                        f"{settings.config.get(field_)!r}, not {cfg[field_]!r}; drop the "
                        "setting or start a new run"
                    )
            continue
        if key == "target":
            spec = settings.target
            recorded, value = spec.get("path") or spec.get("name"), _resolved(value)
        elif key == "cluster":
            recorded, value = settings.cluster_spec, _resolved(value)
        elif key == "warm_start":
            recorded, value = settings.warm_start, None if value is None else _resolved(value)
        elif key in ("microbatches", "microbatch_colocation"):
            recorded = (
                settings.colocation
                if key == "microbatch_colocation"
                else ("auto" if settings.over_m else settings.pinned_count)
            )
            if value is None:  # not given: the default
                continue
        elif key in _GIVEN_AGAIN:
            recorded = getattr(settings, key)
        else:
            raise PostplaceError(f"resume: unknown setting '{key}'")
        if _norm(value) != _norm(recorded):
            raise PostplaceError(
                f"--resume {out}: the run was started with {key} {_norm(recorded)!r}, not {_norm(value)!r}; "
                "drop the flag or start a new run"
            )


_GIVEN_AGAIN = ("strategy", "seed", "groups", "pins", "exclude", "evaluator", "map_all_to", "size")
"""The settings ``--resume`` may be given again (each must equal the recorded one), beside those above."""


def _norm(v):
    if isinstance(v, tuple | list):
        return [_norm(x) for x in v]
    return str(v) if isinstance(v, Path) else v
