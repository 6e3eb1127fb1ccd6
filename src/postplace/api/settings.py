"""A run's settings, ``run.json``: one frozen :class:`RunSettings`, built once from the arguments of
``place`` (strategy, budget, seed, groups, pins, exclusions, warm start, evaluator, the strategy's
config dataclass, the micro-batch counts), written first and checksummed, read back and checked field
by field as if it came from the command line (a run folder is data the user may have edited); once
the search ended ``run.json`` also records the search's start (:data:`START_KEYS`).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np

from postplace.errors import PostplaceError
from postplace.search.state_io import fingerprint
from postplace.validate import read_json

SETTINGS = "run.json"  # postplace.search.state_io.RUN_SETTINGS, which the report reads


EVALUATORS = ("simulator", "torch")


START_KEYS = ("search_start", "search_start_per_microbatches")
"""What ``run.json`` and ``summary.json`` record of the search's start (:func:`search_start`): a result,
not a setting, so :func:`read_settings` checks and leaves them out (a folder from before has none)."""


@dataclasses.dataclass(frozen=True)
class RunSettings:
    """Everything a run was started with, as ``run.json`` records it: made once from ``place``'s arguments
    (:func:`make_settings`), or read back and checked field by field (:func:`read_settings`); never edited
    in place (a budget extension is :meth:`extended`). The optional fields are None where the file has no
    such key (a folder from before it, or a run that has no use for it)."""

    target: dict  # what was placed and how to load it again (postplace.api.target.Target.spec)
    graph_sha: str
    cluster_sha: str
    cluster_spec: str | None  # None: an in-memory cluster, given again to resume
    strategy: str
    budget: str  # as text: "2400" or "60s"
    seed: int
    groups: int | None  # None: op-level
    pins: tuple[str, ...]
    exclude: tuple[str, ...]
    warm_start: str | None
    evaluator: str
    map_all_to: str | None
    config: dict  # the strategy's config dataclass, every field
    graph: str | None = None
    cluster: str | None = None
    size: str | None = None
    version: int | None = 1
    microbatches: int | str | None = None  # "auto": over the counts below; else the pinned count
    microbatch_colocation: str | None = None
    microbatch_counts: tuple[int, ...] | None = None
    graph_shas: dict | None = None  # {"m": fingerprint} over several counts
    microbatch_skipped: dict | None = None
    microbatch_note: str | None = None
    budgets_before: tuple[str, ...] | None = None  # the budgets before each extension, oldest first

    @property
    def over_m(self) -> bool:
        """A run over several micro-batch counts (``--microbatches auto``)."""
        return self.microbatches == "auto"

    @property
    def pinned_count(self) -> int:
        """The one count a run not over m was traced at."""
        return self.target.get("microbatches", 1) if self.microbatches in (None, "auto") else self.microbatches

    @property
    def colocation(self) -> str:
        return self.microbatch_colocation or self.target.get("microbatch_colocation", "none")

    def to_json(self) -> dict:
        """The body of ``run.json`` (without its checksum): the optional fields that are None left out."""
        body = {"format": "postplace-run"}
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            if v is None and f.name in _OPTIONAL:
                continue
            body[f.name] = list(v) if isinstance(v, tuple) else v
        return body

    def checksum(self) -> str:
        return _checksum(self.to_json())

    def accepted_checksums(self) -> set[str]:
        """The checksums a checkpoint of this run may carry: these settings', and those they had before each
        budget extension (:attr:`budgets_before`: the same run with its earlier budget)."""
        before = self.budgets_before or ()
        accepted = {self.checksum()}
        for k, b in enumerate(before):
            accepted.add(dataclasses.replace(self, budget=b, budgets_before=before[:k] or None).checksum())
        return accepted

    def extended(self, budget: str) -> RunSettings:
        """The same run with a new budget, the old one kept (a checkpoint from before still belongs here)."""
        if budget == self.budget:
            return self
        return dataclasses.replace(self, budget=budget, budgets_before=(*(self.budgets_before or ()), self.budget))

    def with_start(self, summary: dict) -> dict:
        """``run.json``'s body once the search ended: the settings and the search's start (:data:`START_KEYS`)."""
        return {**self.to_json(), **{k: summary[k] for k in START_KEYS if k in summary}}

    @classmethod
    def from_json(cls, body: dict, path: Path) -> RunSettings:
        """Settings from ``run.json``'s body, every field checked as if it came from the command line."""
        _check_settings(path, body)
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(body) - known - {"format"})
        if unknown:
            raise PostplaceError(
                f"{path}: unknown field '{unknown[0]}' (edited, or written by another postplace); start a new run"
            )
        kw = {k: tuple(v) if isinstance(v, list) else v for k, v in body.items() if k != "format"}
        kw.setdefault("version", None)
        return cls(**kw)


_OPTIONAL = frozenset(f.name for f in dataclasses.fields(RunSettings) if f.default is not dataclasses.MISSING)


def read_settings(out: str | Path) -> RunSettings:
    """The settings a run folder was started with (``run.json``), checked once."""
    path = Path(out) / SETTINGS
    if not path.exists():
        raise PostplaceError(f"{out}: not a postplace run folder (no {SETTINGS}); start a run with --out {out}")
    try:
        s = read_json(path, "run settings file", finite=False)
    except PostplaceError as exc:
        raise PostplaceError(
            f"{path}: damaged run settings ({str(exc).removeprefix(f'{path}: ')}); start a new run"
        ) from None
    needed = (
        "format",
        "target",
        "graph_sha",
        "cluster_sha",
        "cluster_spec",
        "strategy",
        "budget",
        "seed",
        "groups",
        "pins",
        "exclude",
        "warm_start",
        "evaluator",
        "map_all_to",
        "config",
        "checksum",
    )
    if not isinstance(s, dict) or s.get("format") != "postplace-run" or any(k not in s for k in needed):
        raise PostplaceError(f"{path}: not a postplace run settings file; start a new run")
    body = {k: v for k, v in s.items() if k != "checksum"}
    if _checksum(body) != s["checksum"]:
        raise PostplaceError(f"{path}: its checksum does not match its content (edited or damaged); start a new run")
    _check_start_record(path, body)
    body = {k: v for k, v in body.items() if k not in START_KEYS}  # what the search found, not a setting
    return RunSettings.from_json(body, path)


def search_start(strategy) -> dict:
    """The search's start as run.json and summary.json record it: ``{"name", "step_time_s"}``, the probe's
    fastest candidate where the strategy probed (``anchor_name`` beside it where the policy was anchored
    on another), else the strategy's ``start_name`` and ``start_step_time`` (None where it has none):
    :func:`postplace.search.starts.start_record`."""
    from postplace.search.starts import start_record

    return start_record(strategy)


def record_start(out: Path, settings: RunSettings, summary: dict) -> None:
    """Rewrite run.json with the search's start (:data:`START_KEYS` of ``summary``) beside the settings,
    under one checksum; the settings' own checksum (the checkpoints') stays that of the settings alone."""
    _write_json(out, settings.with_start(summary))


def _check_start_record(path: Path, s: dict) -> None:
    """The start run.json recorded: ``{"name": text or null, "step_time_s": a number >= 0 or null}``, per
    micro-batch count (``{"1": ...}``) in ``search_start_per_microbatches``."""
    import math

    def ok(v) -> bool:
        step = v.get("step_time_s") if isinstance(v, dict) else None
        return (
            isinstance(v, dict)
            and (v.get("name") is None or isinstance(v["name"], str))
            and (
                step is None
                or (isinstance(step, int | float) and not isinstance(step, bool) and math.isfinite(step) and step >= 0)
            )
        )

    if "search_start" in s and not ok(s["search_start"]):
        raise PostplaceError(
            f"{path}: field 'search_start' is not a start's name and step time (edited or damaged); start a new run"
        )
    per = s.get("search_start_per_microbatches", {})
    if not isinstance(per, dict) or not all(isinstance(m, str) and m.isdigit() and ok(v) for m, v in per.items()):
        raise PostplaceError(
            f"{path}: field 'search_start_per_microbatches' is not a start per micro-batch "
            "count (edited or damaged); start a new run"
        )


def _check_settings(path: Path, s: dict) -> None:
    """Every field of a run's settings as if it came from the command line: type, range, and agreement
    between fields. A checksum proves only that the file is whole, not that an edit made sense."""
    from postplace import validate
    from postplace.graph.opgraph import PRECISIONS

    def bad(key: str, why: str):
        shown = json.dumps(_get_path(s, key), default=str)
        shown = shown if len(shown) <= 60 else shown[:57] + "..."
        return PostplaceError(f"{path}: field '{key}' is {shown}; {why} (edited or damaged); start a new run")

    def text(key: str, *, optional: bool = False, choices=None) -> None:
        v = _get_path(s, key)
        if v is None and optional:
            return
        if not isinstance(v, str) or not v:
            raise bad(key, "it must be a non-empty string" + (" or null" if optional else ""))
        if choices is not None and v not in choices:
            raise bad(key, f"it must be one of {', '.join(map(str, choices))}")

    def integer(key: str, minimum: int) -> None:
        v = _get_path(s, key)
        if isinstance(v, bool) or not isinstance(v, int) or not minimum <= v <= validate.INT64_MAX:
            raise bad(key, f"it must be an integer >= {minimum}")

    if s.get("version", 1) != 1 or type(s.get("version", 1)) is not int:  # absent: a folder from before it
        raise bad("version", "this postplace reads version 1")
    target = s["target"]
    if not isinstance(target, dict):
        raise bad("target", "it must be an object saying what was placed")
    text("target.kind", choices=("file", "zoo", "graph", "module"))
    kind = target["kind"]
    if kind == "file":
        text("target.path")
    if kind == "zoo":
        text("target.name")
        text("target.size")
    if "optimizer" in target:
        _check_optimizer_record(target["optimizer"], bad)
    if "precision" in target:
        text("target.precision", choices=PRECISIONS)
    for key in ("graph", "cluster", "size"):
        if key in s and not isinstance(s[key], str):
            raise bad(key, "it must be a string")
    for key in ("graph_sha", "cluster_sha"):
        v = s[key]
        if not isinstance(v, str) or len(v) != 16 or any(c not in "0123456789abcdef" for c in v):
            raise bad(key, "it must be 16 hexadecimal digits")
    text("cluster_spec", optional=True)
    text("strategy")
    if not isinstance(s["budget"], str):
        raise bad("budget", "it must be a budget as text (2400, 60s)")
    try:
        from postplace.search import Budget

        budget = Budget.parse(s["budget"])
    except PostplaceError:
        raise bad("budget", "it must be a number of samples (2400) or a time (60s)") from None
    if budget.samples is not None and budget.samples > validate.INT64_MAX:
        raise bad("budget", "it must fit 64 bits")
    integer("seed", 0)
    if s["groups"] is not None:
        integer("groups", 1)
    for key in ("pins", "exclude"):
        if not isinstance(s[key], list) or not all(isinstance(x, str) and x for x in s[key]):
            raise bad(key, "it must be a list of strings")
    text("warm_start", optional=True)
    text("evaluator", choices=EVALUATORS)
    text("map_all_to", optional=True)
    if not isinstance(s["config"], dict):
        raise bad("config", "it must be an object of the strategy's config fields")
    if s.get("microbatch_note") is not None and not isinstance(s["microbatch_note"], str):
        raise bad("microbatch_note", "it must be text or null")
    if "microbatch_colocation" in s:
        text("microbatch_colocation", choices=("none", "module"))
    if "microbatch_colocation" in target:
        text("target.microbatch_colocation", choices=("none", "module"))
    spec_m = target.get("microbatches", 1)
    if isinstance(spec_m, bool) or not isinstance(spec_m, int) or spec_m < 1:
        raise bad("target.microbatches", "it must be an integer >= 1")
    m = s.get("microbatches", spec_m)
    if m == "auto":
        if kind in ("file", "graph") or "microbatches" in target:
            raise bad("microbatches", f"a run over micro-batch counts needs a target traced again, not a '{kind}' one")
        counts, shas, skipped = s.get("microbatch_counts"), s.get("graph_shas"), s.get("microbatch_skipped", {})
        if (
            not isinstance(counts, list)
            or not counts
            or any(type(k) is not int or k < 1 for k in counts)
            or counts != sorted(set(counts))
            or counts[0] != 1
            or any(k & (k - 1) or k > 1 << 20 for k in counts)
        ):
            raise bad("microbatch_counts", "it must be the counts 1, 2, 4... the run traced, in order")
        if (
            not isinstance(shas, dict)
            or sorted(shas) != sorted(str(k) for k in counts)
            or not all(isinstance(v, str) for v in shas.values())
        ):
            raise bad("graph_shas", "it must hold one graph fingerprint per micro-batch count")
        if not isinstance(skipped, dict) or not all(isinstance(v, str) for v in skipped.values()):
            raise bad("microbatch_skipped", "it must map counts to the reason each was left out")
    elif isinstance(m, bool) or not isinstance(m, int) or m != spec_m:
        raise bad("microbatches", f"it must be 'auto' or the count the target was traced at ({spec_m})")
    elif "microbatch_counts" in s or "graph_shas" in s:
        raise bad("microbatches", "a run with micro-batch counts records 'auto'")
    before = s.get("budgets_before", [])
    if not isinstance(before, list) or not all(isinstance(b, str) for b in before):
        raise bad("budgets_before", "it must be a list of budgets as text")


def _check_optimizer_record(record, bad) -> None:
    """The optimizer a zoo or module run recorded: a name, or ``{"name", "groups": [{hyperparameters}]}``
    whose numbers are finite."""
    import math

    names = ("sgd", "adam", "adamw")
    if isinstance(record, str):
        if record.lower() not in names:
            raise bad("target.optimizer", f"it must be one of {', '.join(names)}")
        return
    ok = (
        isinstance(record, dict)
        and record.get("name") in names
        and isinstance(record.get("groups"), list)
        and len(record["groups"]) == 1
        and isinstance(record["groups"][0], dict)
    )

    def finite(v) -> bool:
        if isinstance(v, list):
            return all(finite(x) for x in v)
        return isinstance(v, bool) or (isinstance(v, int | float) and math.isfinite(v) and v >= 0)

    if not ok or not all(isinstance(k, str) and finite(v) for k, v in record["groups"][0].items()):
        raise bad(
            "target.optimizer",
            "it must be the optimizer postplace recorded (a name, or its finite, non-negative hyperparameters)",
        )


def _get_path(d, key: str):
    for part in key.split("."):
        d = d.get(part) if isinstance(d, dict) else None
    return d


def _checksum(body: dict) -> str:
    from postplace.search.state_io import settings_checksum

    return settings_checksum(body)


def make_settings(
    tgt,
    c,
    cluster_spec,
    *,
    strategy,
    budget,
    seed,
    pins,
    exclude,
    warm_start,
    evaluator,
    config,
    groups,
    size,
    map_all_to,
    confirm=0,
    **microbatch_fields,
) -> RunSettings:
    """The settings of a new run from ``place``'s arguments, each checked (one line for a bad one);
    ``microbatch_fields``: the :class:`RunSettings` fields of its micro-batch counts."""
    from postplace.search import Budget

    if isinstance(seed, bool) or not isinstance(seed, int | np.integer) or seed < 0:
        raise PostplaceError(f"seed {seed!r}: give an integer >= 0")
    if groups is not None and (isinstance(groups, bool) or not isinstance(groups, int | np.integer) or groups < 1):
        raise PostplaceError(f"groups {groups!r}: give a positive integer, or None for op-level placement")
    if evaluator not in EVALUATORS:
        raise PostplaceError(f"evaluator '{evaluator}': use simulator or torch")
    if evaluator != "torch" and map_all_to is not None and not confirm:
        raise PostplaceError("--map-all-to only applies to measured runs (--evaluator torch or --confirm K)")
    if evaluator == "torch" and tgt.spec["kind"] not in ("zoo", "module"):
        raise PostplaceError(
            "--evaluator torch needs a zoo model name or an nn.Module as TARGET (a graph file has no code to run)"
        )
    for name, seq in (("pins", pins), ("exclude", exclude)):
        if isinstance(seq, str) or not all(isinstance(x, str) for x in seq):
            raise PostplaceError(f"{name} must be a list of strings")
    text = budget_text(budget if hasattr(budget, "samples") else Budget.parse(budget))
    cfg = strategy_config(strategy, config)
    if warm_start is not None and Path(str(warm_start)).exists():
        warm_start = str(Path(str(warm_start)).resolve())  # a run folder resumes from any directory
    return RunSettings(
        target=tgt.spec,
        graph=tgt.graph.name,
        graph_sha=fingerprint(tgt.graph),
        cluster=c.name,
        cluster_spec=cluster_spec,
        cluster_sha=fingerprint(c),
        strategy=strategy,
        budget=text,
        seed=int(seed),
        groups=None if groups is None else int(groups),
        size=size,
        pins=tuple(pins),
        exclude=tuple(exclude),
        warm_start=None if warm_start is None else str(warm_start),
        evaluator=evaluator,
        map_all_to=map_all_to,
        config=config_json(cfg),
        **microbatch_fields,
    )


def budget_text(b) -> str:
    """A :class:`postplace.search.Budget` as ``run.json`` records it."""
    return f"{b.samples}" if b.samples is not None else f"{b.seconds:g}s"


def config_json(cfg) -> dict:
    """A strategy's config dataclass as ``run.json`` records it."""
    return {k: list(v) if isinstance(v, tuple) else v for k, v in dataclasses.asdict(cfg).items()}


def strategy_config(strategy: str, config):
    """The strategy's full config dataclass from ``config`` (None, "paper", a dict of overrides, or an instance)."""
    from postplace.search import STRATEGIES, config_class, make_strategy
    from postplace.search.config import build_config

    if strategy not in STRATEGIES:
        make_strategy(strategy, None)  # raises the one-line "unknown strategy" error
    if config is None:
        return build_config(strategy)
    if config == "paper":
        if strategy not in ("post", "post-paper"):
            raise PostplaceError("config 'paper' is Post's; use strategy post or post-paper")
        return config_class("post-paper")[1]
    if isinstance(config, dict):
        return build_config(strategy, config, source="config")
    cls, _ = config_class(strategy)
    if not isinstance(config, cls):
        raise PostplaceError(f"config for '{strategy}' must be a {cls.__name__}, not a {type(config).__name__}")
    return config


def build_strategy(settings: RunSettings, space):
    """The run's strategy over ``space``, from its recorded config (a config that cannot be built is one line)."""
    from postplace.search import make_strategy
    from postplace.search.config import build_config

    cfg = build_config(settings.strategy, settings.config, source="config")
    init = getattr(cfg, "init", None)
    units = space.allowed.shape[0]
    if isinstance(init, list | tuple) and len(init) != units:
        raise PostplaceError(
            f"config init: a start placement needs one device id per unit ({units} here), not "
            f"{len(init)}; use init=random or give {units} ids"
        )
    try:
        return make_strategy(settings.strategy, space, seed=settings.seed, config=cfg)
    except (ValueError, ZeroDivisionError) as exc:
        raise PostplaceError(f"config of '{settings.strategy}': {exc}") from None


def write_settings(out: Path, settings: RunSettings) -> None:
    """Write ``run.json`` (atomically, checksummed)."""
    _write_json(out, settings.to_json())


def _write_json(out: Path, body: dict) -> None:
    data = {**body, "checksum": _checksum(body)}
    tmp = out / (SETTINGS + ".tmp")
    tmp.write_text(json.dumps(data, indent=1))
    tmp.replace(out / SETTINGS)


def check_same_optimizer(recorded, optimizer, lr, what: str = "apply: the placement") -> None:
    from postplace.graph.optimizers import optimizer_mismatch

    differ = optimizer_mismatch(recorded, optimizer, lr)
    if differ is not None:
        recorded, given = differ
        raise PostplaceError(
            f"{what} was made for {_optimizer_text(recorded)}, not {_optimizer_text(given)}; "
            "its memory and update differ: start again with that optimizer"
        )


def _optimizer_text(record) -> str:
    if not isinstance(record, dict):
        return str(record)
    hp = record["groups"][0] if record.get("groups") else {}
    return f"{record['name']} (lr {hp.get('lr')})"
