"""A plan as users name it: ``ddp``, ``zero2``, ``fsdp+recompute:m=8``, ``zero1:m=4,dp=2``, and hybrids
per unit: ``ddp:shard=root`` (FSDP for the root unit: the embedding and the head; DDP for the blocks),
``fsdp:recompute=blocks.30/blocks.31`` (recompute the last two blocks only; a run: ``recompute=blocks.0-67``),
and a pipeline's blocks per stage: ``ddp:pp=4,m=32,stages=9/10/10/11``."""

from __future__ import annotations

import re
from dataclasses import dataclass

from postplace.errors import PostplaceError
from postplace.graph import OpGraph
from postplace.plans._step import microbatch_count, units
from postplace.plans.data_parallel import LEVELS, PlannedStep, data_parallel
from postplace.plans.recompute import recompute
from postplace.plans.sizes import SIZES_KEY
from postplace.plans.tensor import over_tensor_ranks, tensor_parallel

__all__ = ["PlanSpec", "apply_plan", "parse_plan", "recomputed"]

_OPTION = re.compile(r"^(m|dp|pp|tp)=([0-9]+)$")
_SCHEDULE = re.compile(r"^(schedule)=(gpipe|1f1b|interleaved-[0-9]+)$")
_UNITS = re.compile(r"^(shard|recompute|selective)=([A-Za-z0-9_.-]+(?:/[A-Za-z0-9_.-]+)*)$")
_RUN = re.compile(r"^(.*\.)([0-9]+)-([0-9]+)$")
_STAGES = re.compile(r"^(stages)=([0-9]+(?:/[0-9]+)*)$")
_SIZES = re.compile(r"^(mbs)=([A-Za-z0-9_.-]+:[0-9]+(?:/[A-Za-z0-9_.-]+:[0-9]+)*)$")
_HOW = (
    f"write NAME[+recompute|+selective][:m=M][,dp=K][,tp=T[,sp]][,pp=P][,schedule=gpipe|1f1b|interleaved-V]"
    "[,shard=U/U...][,recompute=U/U...][,selective=U/U...][,stages=B/B...][,mbs=GPU:N/GPU:N] "
    f"with NAME one of {', '.join(LEVELS)} "
    "and U a unit (root, blocks.3) or a run of them (blocks.0-7) "
    "(e.g. fsdp+recompute:m=8, ddp:pp=2,m=8,schedule=1f1b, fsdp:tp=2,sp,m=8)"
)


@dataclass(frozen=True)
class PlanSpec:
    """One practitioner plan.

    Parameters
    ----------
    level : str
        One of :data:`postplace.plans.LEVELS`.
    recompute : bool
        Recompute every numbered unit's activations in the backward pass.
    microbatches : int, optional
        The step's micro-batch count (all replicas together); None: the caller chooses.
    replicas : int, optional
        The data-parallel degree; None: every GPU the plan may use.
    shard : tuple of str, optional
        A hybrid of ``ddp`` or ``fsdp``: exactly these units sharded as FSDP shards them, the others
        replicated as DDP does (``""`` is the root unit). None: the level's own rule.
    recompute_units : tuple of str, optional
        With ``recompute``: only these units recomputed. None: every numbered unit.
    selective : bool
        With ``recompute``: torchtitan's selective op rule (attention outputs and every other matrix
        product kept, the rest recomputed: :func:`postplace.plans.recompute`), written ``+selective``.
    pipeline : int, optional
        ``pp``: pipeline stages; each data-parallel replica's layers cut into that many stages, GPU
        ``dp_rank + dp x stage`` (Megatron-LM's rank order without tensor parallelism). None: no pipeline.
    schedule : str, optional
        With ``pipeline``: ``gpipe``, ``1f1b`` (the default) or ``interleaved-V`` (the blocks cut into
        ``pipeline x V`` chunks, chunk c on the pipeline's GPU c mod ``pipeline``: :mod:`postplace.plans.schedule`).
    tensor : int, optional
        ``tp``: the tensor-parallel degree (:mod:`postplace.plans.tensor`); GPUs ``j + tp x i`` (Megatron-LM's
        rank order: a group is tp neighbouring GPUs). None: no tensor parallelism.
    selective_units : tuple of str, optional
        Units recomputed by torchtitan's selective op rule, beside ``recompute_units`` (then a tuple, maybe
        empty) recomputed whole: a mix per block, written ``recompute=blocks.0-9,selective=blocks.10-31``.
        None: the rule of ``selective`` for every recomputed unit.
    sequence : bool
        With ``tensor``: sequence parallelism (Megatron-LM's ``--sequence-parallel``, torchtitan's default with
        tensor parallelism), written ``sp``: the norms, dropouts and residual adds between the blocks split by
        tokens over the tensor group (:mod:`postplace.plans.tensor`).
    stage_blocks : tuple of int, optional
        With ``pipeline`` and a schedule of one chunk per GPU: the blocks (numbered units) of each stage in
        order, written ``stages=9/10/10/11`` (Megatron-LM's uneven first and last stages, torchtitan's
        modules per stage); the embedding side goes with the first stage, the head side with the last. None:
        the cut balances the stages.
    micro_sizes : tuple of (str, int), optional
        Sequences per micro-batch on each GPU model, written ``mbs=H100:3/A100-80GB:1``: on GPUs of two
        generations the fast ones take larger micro-batches, every replica the same count of them, so the
        collectives still meet (Megatron-LM's ``--micro-batch-size``, per GPU model; neither Megatron-LM nor
        torchtitan offers it: a data loader that gives each rank its own local batch, with the loss scaled
        by the rank's share of the global batch, runs it under FSDP2 or DDP). Without a pipeline; priced by
        the layered estimate, or op by op on the step traced at each size (:func:`postplace.plans.sized_step`);
        not launched. None: every micro-batch is ``batch / m`` sequences.
    """

    level: str
    recompute: bool = False
    microbatches: int | None = None
    replicas: int | None = None
    shard: tuple[str, ...] | None = None
    recompute_units: tuple[str, ...] | None = None
    selective: bool = False
    pipeline: int | None = None
    schedule: str | None = None
    tensor: int | None = None
    stage_blocks: tuple[int, ...] | None = None
    selective_units: tuple[str, ...] | None = None
    sequence: bool = False
    micro_sizes: tuple[tuple[str, int], ...] | None = None

    def __post_init__(self):
        if self.micro_sizes is not None and (
            not self.micro_sizes or any(not isinstance(n, int) or n < 1 for _, n in self.micro_sizes)
        ):
            raise PostplaceError(f"plan {self.level}: micro_sizes gives each GPU model a size of 1 sequence or more")
        if self.micro_sizes is not None and self.pipeline:
            raise PostplaceError(
                f"plan {self.level}: mbs= gives each GPU model its micro-batch size, and a pipeline's stages "
                "run one micro-batch size; drop pp or mbs"
            )
        if self.shard is not None and self.level not in ("ddp", "fsdp"):
            raise PostplaceError(
                f"plan {self.level}: shard= makes a hybrid of ddp and fsdp; {self.level} shards by its own rule"
            )
        if self.sequence and (self.tensor or 1) < 2:
            raise PostplaceError(f"plan {self.level}: sp splits a tensor group's norms by tokens; give tp=T (T >= 2)")
        if self.selective_units and (self.recompute_units is None or self.selective or not self.recompute):
            raise PostplaceError(
                f"plan {self.level}: selective_units mixes with recompute_units (a tuple, the units recomputed "
                "whole); for one rule over some units give selective=True and recompute_units"
            )
        if both := sorted(set(self.selective_units or ()) & set(self.recompute_units or ())):
            raise PostplaceError(f"plan {self.level}: unit '{both[0] or 'root'}' is in both recompute= and selective=")

    def replicas_over(self, gpus: int) -> int:
        """The data-parallel degree on ``gpus`` GPUs: one replica per ``pipeline`` stages of ``tensor`` GPUs.

        >>> PlanSpec("ddp", pipeline=2).replicas_over(8), PlanSpec("fsdp").replicas_over(8)
        (4, 8)
        >>> PlanSpec("fsdp", pipeline=2, tensor=2).replicas_over(8)
        2
        """
        return gpus // self.model_parallel

    @property
    def model_parallel(self) -> int:
        """The GPUs of one replica: ``tp x pp``."""
        return (self.pipeline or 1) * (self.tensor or 1)

    @property
    def one_chunk_pipeline(self) -> bool:
        """A pipeline of one chunk per GPU (1F1B or GPipe): the schedules whose blocks per stage ``stages=``
        may give (interleaved cuts its chunks evenly)."""
        return bool(self.pipeline) and (self.schedule or "1f1b") in ("1f1b", "gpipe")

    @property
    def name(self) -> str:
        """The plan's name without its options (``fsdp+recompute``): a candidate's name in a table."""
        if self.selective:
            return self.level + "+selective"
        return self.level + ("+recompute" if self.recompute and self.recompute_units is None else "")

    def recompute_rules(self, blocks) -> dict[str, str]:
        """How each of ``blocks`` (unit names) is recomputed: ``"full"``, ``"selective"`` (torchtitan's op
        rule) or ``""`` (not at all)."""
        rules = dict.fromkeys(blocks, "")
        if self.recompute:
            whole = blocks if self.recompute_units is None else self.recompute_units
            rules.update(dict.fromkeys(whole, "selective" if self.selective else "full"))
            rules.update(dict.fromkeys(self.selective_units or (), "selective"))
        return rules

    def __str__(self) -> str:
        opts = [f"m={self.microbatches}"] * (self.microbatches is not None) + [f"dp={self.replicas}"] * (
            self.replicas is not None
        )
        if self.tensor is not None:
            opts += [f"tp={self.tensor}"] + ["sp"] * self.sequence
        if self.pipeline is not None:
            opts += [f"pp={self.pipeline}", f"schedule={self.schedule or '1f1b'}"]
        if self.stage_blocks is not None:
            opts.append("stages=" + "/".join(map(str, self.stage_blocks)))
        for key, names in (
            ("shard", self.shard),
            ("recompute", self.recompute_units),
            ("selective", self.selective_units),
        ):
            if names is not None and not (key == "recompute" and not names and self.selective_units):
                opts.append(f"{key}={'/'.join(_runs(names)) or 'none'}")
        if self.micro_sizes is not None:
            opts.append("mbs=" + "/".join(f"{model}:{n}" for model, n in self.micro_sizes))
        return self.name + (":" + ",".join(opts) if opts else "")


def parse_plan(text: str) -> PlanSpec:
    """Read a plan's name (see the module docstring); one error line when it does not parse.

    >>> parse_plan("fsdp+recompute:m=8").recompute, parse_plan("fsdp+selective:m=8").selective
    (True, True)
    >>> str(parse_plan("zero2:dp=4"))
    'zero2:dp=4'
    """
    if not isinstance(text, str) or not text.strip():
        raise PostplaceError(f"--plan is empty; {_HOW}")
    if long := re.search(r"[0-9]{10,}", text):
        shown = text if len(text) <= 60 else f"{text[:40]}... ({len(text)} characters)"
        raise PostplaceError(
            f"--plan '{shown}': a number of {len(long.group())} digits; every count in a plan is at most 4096"
        )
    head, _, tail = text.strip().partition(":")
    parts = head.split("+")
    level, extras = parts[0], parts[1:]
    if level not in LEVELS:
        raise PostplaceError(f"--plan '{text}': unknown plan '{level}'; {_HOW}")
    if any(x not in ("recompute", "selective") for x in extras) or len(extras) > 1:
        raise PostplaceError(f"--plan '{text}': only '+recompute' or '+selective' may follow the plan's name; {_HOW}")
    options: dict[str, object] = {}
    for opt in tail.split(",") if tail else ():
        opt = opt.strip()
        if opt == "sp" and "sp" not in options:
            options["sp"] = True
            continue
        match = (
            _OPTION.match(opt) or _UNITS.match(opt) or _SCHEDULE.match(opt) or _STAGES.match(opt) or _SIZES.match(opt)
        )
        key = "sp" if opt == "sp" else match.group(1) if match else opt.partition("=")[0]
        if key in options:
            raise PostplaceError(f"--plan '{text}': {key}{'=' * (key != 'sp')} is given twice; give it once")
        if not match:
            raise PostplaceError(
                f"--plan '{text}': option '{opt}' is not m=M, dp=K, tp=T, sp, pp=P, schedule=S, "
                f"shard=U/U, recompute=U/U, selective=U/U, stages=B/B or mbs=GPU:N/GPU:N (each once); {_HOW}"
            )
        if match.re is _SIZES:
            options["mbs"] = _sizes(match.group(2), text)
            continue
        if match.re is _STAGES:
            options["stages"] = tuple(int(x) for x in match.group(2).split("/"))
            continue
        if match.re is _SCHEDULE:
            options["schedule"] = match.group(2)
            continue
        if match.re is _UNITS:
            names = match.group(2).split("/")
            options[match.group(1)] = () if names == ["none"] else _expanded(names, text)
            if twice := sorted({u for u in options[match.group(1)] if options[match.group(1)].count(u) > 1}):
                raise PostplaceError(
                    f"--plan '{text}': {match.group(1)}= names unit '{twice[0] or 'root'}' twice; name each unit once"
                )
            continue
        value = int(match.group(2))
        if not 1 <= value <= 4096:
            raise PostplaceError(f"--plan '{text}': {match.group(1)}={value} must be between 1 and 4096")
        options[match.group(1)] = value
    if "shard" in options and level not in ("ddp", "fsdp"):
        raise PostplaceError(f"--plan '{text}': shard= makes a hybrid of ddp and fsdp; {level} shards by its own rule")
    if "recompute" in options and extras == ["recompute"]:
        raise PostplaceError(f"--plan '{text}': give '+recompute' (every unit) or recompute=U/U (those), not both")
    if "selective" in options:
        if extras:
            raise PostplaceError(
                f"--plan '{text}': selective=U/U names the units the selective rule recomputes; drop "
                f"'+{extras[0]}' (recompute=U/U names those recomputed whole)"
            )
        if both := sorted(set(options["selective"]) & set(options.get("recompute", ()))):
            raise PostplaceError(f"--plan '{text}': unit '{both[0] or 'root'}' is in both recompute= and selective=")
        if "recompute" not in options:  # one rule: the plan's +selective over those units
            extras = ["selective"]
            options["recompute"] = options.pop("selective")
    if options.get("sp") and (options.get("tp") or 1) < 2:
        raise PostplaceError(f"--plan '{text}': sp splits a tensor group's norms by tokens; give tp=T with T >= 2")
    if "mbs" in options and (options.get("pp") or 1) > 1:
        raise PostplaceError(
            f"--plan '{text}': mbs= gives each GPU model its micro-batch size, and a pipeline's stages run one; "
            "drop pp or mbs"
        )
    if "schedule" in options and (options.get("pp") or 1) < 2:
        raise PostplaceError(f"--plan '{text}': schedule= orders a pipeline's stages; give pp=P with P >= 2")
    units = options.get("recompute")
    pp, tp = options.get("pp"), options.get("tp")
    if (stages := options.get("stages")) is not None:
        if not pp or pp < 2:
            raise PostplaceError(f"--plan '{text}': stages= gives a pipeline's blocks per stage; give pp=P with P >= 2")
        if len(stages) != (pp or 1) or min(stages) < 1:
            raise PostplaceError(
                f"--plan '{text}': stages= gives each of the pp={pp} stages its blocks, at least one each; "
                f"give {pp} counts (e.g. pp=2,stages=15/17)"
            )
        if options.get("schedule", "1f1b") not in ("gpipe", "1f1b"):
            raise PostplaceError(
                f"--plan '{text}': stages= cuts one chunk per GPU; {options['schedule']} cuts the blocks evenly"
            )
    return PlanSpec(
        level,
        bool(extras) or units is not None,
        options.get("m"),
        options.get("dp"),
        options.get("shard"),
        units,
        selective=extras == ["selective"],
        pipeline=pp if pp and pp > 1 else None,
        schedule=options.get("schedule", "1f1b") if pp and pp > 1 else None,
        tensor=tp if tp and tp > 1 else None,
        stage_blocks=options.get("stages"),
        selective_units=options.get("selective") or None,
        sequence=bool(options.get("sp")),
        micro_sizes=options.get("mbs"),
    )


def _sizes(body: str, text: str) -> tuple[tuple[str, int], ...]:
    """``H100:3/A100-80GB:1`` as ``(("H100", 3), ("A100-80GB", 1))``; one line for a repeated model or a size out
    of range."""
    out: list[tuple[str, int]] = []
    for item in body.split("/"):
        model, _, n = item.rpartition(":")
        if not 1 <= int(n) <= 4096:
            raise PostplaceError(f"--plan '{text}': mbs= gives {model} {int(n)} sequences; give 1 to 4096")
        if model in dict(out):
            raise PostplaceError(f"--plan '{text}': mbs= names GPU model {model} twice; give each model once")
        out.append((model, int(n)))
    return tuple(out)


def _runs(names) -> list[str]:
    """Unit names as a plan writes them: ``root`` for the root, three or more consecutive numbered units
    of one prefix as a run (``blocks.0-74``)."""
    out: list[str] = []
    k = 0
    names = list(names)
    while k < len(names):
        prefix, _, num = names[k].rpartition(".")
        j = k
        while num.isdigit() and j + 1 < len(names) and names[j + 1] == f"{prefix}.{int(num) + j + 1 - k}":
            j += 1
        if j - k >= 2:
            out.append(f"{prefix}.{num}-{int(num) + j - k}")
        else:
            out += [u or "root" for u in names[k : j + 1]]
        k = j + 1
    return out


def _expanded(names: list[str], text: str) -> tuple[str, ...]:
    """Unit names from a plan's text: ``root`` the root, a run ``blocks.0-74`` every block from 0 to 74."""
    out: list[str] = []
    for u in names:
        run = _RUN.match(u)
        if run is None:
            if "-" in u:
                raise PostplaceError(f"--plan '{text}': '{u}' is neither a unit nor a run such as blocks.0-3; {_HOW}")
            out.append("" if u == "root" else u)
            continue
        first, last = int(run.group(2)), int(run.group(3))
        if last - first >= 4096:
            raise PostplaceError(f"--plan '{text}': the run '{u}' names {last - first + 1} units; at most 4096")
        if last < first:
            raise PostplaceError(
                f"--plan '{text}': the run '{u}' ends before it starts; write {run.group(1)}{last}-{first}"
            )
        out += [f"{run.group(1)}{k}" for k in range(first, last + 1)]
    return tuple(out)


def recomputed(graph: OpGraph, spec: PlanSpec) -> OpGraph:
    """``graph`` with the recomputation ``spec`` names (none: ``graph``), the first pass of :func:`apply_plan`."""
    which = list(spec.recompute_units) if spec.recompute_units is not None else None
    step = graph
    if spec.recompute and (which is None or which):
        step = recompute(step, which, selective=spec.selective)
    if spec.selective_units:  # a mix: the selective rule's units after the whole ones
        step = recompute(step, list(spec.selective_units), selective=True)
    return step


def apply_plan(graph: OpGraph, spec: PlanSpec, replicas: int, *, bucket_key=None) -> PlannedStep:
    """The passes ``spec`` names over ``graph`` (traced at the plan's micro-batch count), on ``replicas`` GPUs.

    Parameters
    ----------
    graph : OpGraph
        The step traced as m micro-batches, m a multiple of ``replicas``.
    spec : PlanSpec
    replicas : int
        The data-parallel degree (each replica ``tp`` GPUs wide).
    bucket_key : mapping of str to int, optional
        As for :func:`postplace.plans.data_parallel` (a pipeline's GPU per op: each stage's own buckets).

    Returns
    -------
    PlannedStep
    """
    stamp = graph.metadata.get(SIZES_KEY)
    if stamp is not None and spec.micro_sizes is None:
        raise PostplaceError(
            f"plan '{spec}': the step was joined from traces at micro-batch sizes {stamp} (sized_step); a plan "
            "without mbs= runs the step traced at one size: give the plan its mbs= or trace the step at one size"
        )
    if stamp is not None and len(stamp) != microbatch_count(graph):
        raise PostplaceError(
            f"plan '{spec}': the step's size list names {len(stamp)} micro-batches and the step has "
            f"{microbatch_count(graph)}; join it again with postplace.placers.practitioner.sized_graph"
        )
    if spec.micro_sizes is not None and stamp is None:
        raise PostplaceError(
            f"plan '{spec}': mbs= (a micro-batch size per GPU model) needs the step traced at each size and joined "
            "(postplace.plans.sized_step; simulate_plan does it for a zoo model), or drop mbs"
        )
    known = set(units(graph))
    for key, names in (("shard", spec.shard), ("recompute", spec.recompute_units), ("selective", spec.selective_units)):
        bad = sorted(set(names or ()) - known)
        if bad:
            some = ", ".join(u or "root" for u in sorted(known, key=lambda u: (u != "", u))[:6])
            raise PostplaceError(
                f"plan '{spec}': {key}= names unit '{bad[0] or 'root'}', which graph "
                f"'{graph.name}' does not have (its units: {some}, ...)"
            )
    step = recomputed(graph, spec)
    if spec.tensor:
        stages = bucket_key if spec.pipeline else None
        step = tensor_parallel(step, spec.tensor, sequence=spec.sequence, tied=not spec.pipeline, stages=stages)
    shard = frozenset(spec.shard) if spec.shard is not None else None
    planned = data_parallel(step, replicas, spec.level, shard=shard, bucket_key=bucket_key)
    if not spec.tensor:
        return planned
    ranks, slot = over_tensor_ranks(planned.graph, planned.replica, spec.tensor)
    return PlannedStep(ranks, slot, planned.replicas * spec.tensor, planned.level)
