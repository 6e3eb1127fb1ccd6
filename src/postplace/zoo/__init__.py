"""The benchmark zoo: the paper's models, written in this project's code, traced once and cached.

``MODELS`` lists them (name -> :class:`ModelSpec`); ``build(name, size)`` gives ``(model, inputs,
loss_fn)`` ready for :func:`postplace.graph.from_torch`; ``cached_graph(name, size, optimizer)``
traces once and keeps the graph file under ``$POSTPLACE_CACHE`` (default ``~/.cache/postplace``),
keyed by model, config, optimizer, torch version and the tracer's own source, so a change to any of
them traces afresh. ``size="small"`` is a narrow, shallow version of the same architecture that
traces in well under a second (for tests); ``"full"`` is the configuration the figures come from.
A model may name more sizes (``sizes(name)`` lists them; ``llama`` has ``1b`` and ``7b``, ``full``
being ``7b``); a size in its spec's ``meta_only`` is built on the meta device and never materialised:
it is for tracing its graph, not for training.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from postplace.errors import PostplaceError

__all__ = [
    "MODELS",
    "SIZES",
    "ModelSpec",
    "TargetLoss",
    "build",
    "cache_dir",
    "cached_graph",
    "graph_factory",
    "sizes",
    "trace_model",
]

MAX_BATCH = 2**20
"""The largest global batch a zoo size may carry (``SIZE@N``)."""

#: The sizes every zoo model has; :func:`sizes` gives one model's, extra named sizes included.
SIZES = ("small", "full")


@dataclass(frozen=True)
class ModelSpec:
    """One zoo model: what it is, where each figure of its config comes from, its configs.

    Parameters
    ----------
    name : str
        Its key in :data:`MODELS`.
    description : str
        What the model is, in one line.
    source : str
        Where each figure of its config comes from (papers, released configs, our choices).
    full : dict
        The configuration the figures come from (batch, sizes, layers...).
    small : dict
        A narrow, shallow version of the same architecture that traces in well under a second.
    sizes : dict of str to dict
        Extra named configs beside ``small`` and ``full`` (``full`` may equal one of them).
    meta_only : tuple of str
        The sizes too large to materialise: :func:`build` keeps those on the meta device and refuses
        ``init=True``.

    Examples
    --------
    >>> from postplace.zoo import MODELS
    >>> MODELS["gpt2"].config("small")["layers"], MODELS["llama"].size_names()
    (2, ('small', 'full', '1b', '7b', '3.1-8b', '13b', '70b'))
    """

    name: str
    description: str
    source: str
    full: dict
    small: dict = field(default_factory=dict)
    sizes: dict[str, dict] = field(default_factory=dict)
    meta_only: tuple[str, ...] = ()

    def size_names(self) -> tuple[str, ...]:
        """``small``, ``full``, then the extra sizes."""
        return (*SIZES, *(s for s in self.sizes if s not in SIZES))

    def config(self, size: str) -> dict:
        """A copy of the config of ``size``; ``SIZE@N`` is that size at a global batch of N.

        Parameters
        ----------
        size : str
            One of :meth:`size_names`, optionally ``@N`` (N from 1 to 1,048,576).

        Returns
        -------
        dict

        Raises
        ------
        PostplaceError
            For an unknown size.
        """
        base, at, batch = size.partition("@")
        if at:
            if not re.fullmatch(r"[0-9]{1,9}", batch) or not 1 <= int(batch) <= MAX_BATCH:  # ASCII digits only
                shown = size if len(size) <= 40 else f"{size[:30]}... ({len(size)} characters)"
                raise PostplaceError(
                    f"size '{shown}' of model '{self.name}': the batch after '@' must be a whole "
                    f"number from 1 to {MAX_BATCH} (e.g. 7b@512)"
                )
            return {**self.config(base), "batch": int(batch)}
        if size == "full":
            return dict(self.full)
        if size == "small":
            return dict(self.small)
        if size in self.sizes:
            return dict(self.sizes[size])
        raise PostplaceError(
            f"unknown size '{size}' for model '{self.name}'; use one of {', '.join(self.size_names())}"
        )


_LLAMA_7B = dict(batch=8, seq=2048, vocab=32000, d=4096, layers=32, heads=32, kv_heads=32, ffn=11008, theta=10000.0)
_LLAMA_1B = dict(batch=8, seq=2048, vocab=128256, d=2048, layers=16, heads=32, kv_heads=8, ffn=8192, theta=500000.0)
_LLAMA_13B = dict(batch=8, seq=4096, vocab=32000, d=5120, layers=40, heads=40, kv_heads=40, ffn=13824, theta=10000.0)
_LLAMA_70B = dict(batch=8, seq=4096, vocab=32000, d=8192, layers=80, heads=64, kv_heads=8, ffn=28672, theta=10000.0)
_LLAMA_31_8B = dict(
    batch=16, seq=8192, vocab=128256, d=4096, layers=32, heads=32, kv_heads=8, ffn=14336, theta=500000.0
)
_POST = "Post paper (Gao et al., NeurIPS 2018) Sec. 5: batch 32 for the CNNs, 4-layer RNNLM, 2/4-layer NMT"
MODELS: dict[str, ModelSpec] = {
    m.name: m
    for m in (
        ModelSpec(
            "inception_v3",
            "Inception-V3 image classifier, 299x299 ImageNet images",
            f"Szegedy et al. CVPR 2016 (architecture, 299x299, 1000 classes); {_POST}",
            dict(batch=32, image=299, classes=1000, width=1.0),
            dict(batch=2, image=75, classes=10, width=0.125),
        ),
        ModelSpec(
            "resnet50",
            "ResNet-50 image classifier, 224x224 ImageNet images",
            f"He et al. CVPR 2016 Table 1 (3-4-6-3 bottlenecks, 224x224, 1000 classes); {_POST}",
            dict(batch=32, image=224, classes=1000, blocks=(3, 4, 6, 3), width=1.0),
            dict(batch=2, image=32, classes=10, blocks=(1, 1, 1, 1), width=0.125),
        ),
        ModelSpec(
            "rnnlm",
            "4-layer LSTM language model, unrolled (each time step is its own ops)",
            "layers: Post paper Sec. 5; hidden 1500, vocab 10k, 35 steps, batch 20: the 'large' PTB "
            "model of Zaremba et al. 2014 (the Post paper does not give them; our choice)",
            dict(batch=20, steps=35, vocab=10000, hidden=1500, layers=4),
            dict(batch=2, steps=4, vocab=50, hidden=16, layers=4),
        ),
        ModelSpec(
            "nmt2",
            "GNMT-like 2-layer encoder-decoder with attention, unrolled",
            "layers: Post paper Sec. 5; hidden 1024, 32k wordpiece vocab, batch 128: Wu et al. 2016 "
            "(GNMT); sequence length 40 is our choice",
            dict(batch=128, src_len=40, tgt_len=40, vocab=32000, hidden=1024, layers=2),
            dict(batch=2, src_len=4, tgt_len=3, vocab=50, hidden=16, layers=2),
        ),
        ModelSpec(
            "nmt4",
            "GNMT-like 4-layer encoder-decoder with attention, unrolled",
            "as nmt2, with 4 encoder and 4 decoder layers (Post paper Sec. 5)",
            dict(batch=128, src_len=40, tgt_len=40, vocab=32000, hidden=1024, layers=4),
            dict(batch=2, src_len=4, tgt_len=3, vocab=50, hidden=16, layers=4),
        ),
        ModelSpec(
            "gpt2",
            "GPT-2 small (124M) decoder-only transformer",
            "Radford et al. 2019 Table 2 and the released 124M config (12 layers, d 768, 12 heads, "
            "vocab 50257, context 1024); batch 8 is our choice",
            dict(batch=8, seq=1024, vocab=50257, d=768, layers=12, heads=12, context=1024),
            dict(batch=2, seq=16, vocab=50, d=32, layers=2, heads=4, context=16),
        ),
        ModelSpec(
            "llama",
            "LLaMA-style decoder: RMSNorm, GQA with RoPE, SwiGLU, untied head",
            "Touvron et al. 2023 (LLaMA, Sec. 2.2: RMSNorm, SwiGLU, rotary embeddings); 7b (= full): "
            "Llama 2 7B (Touvron et al. 2023b: d 4096, 32 layers, 32 heads, no kv sharing, ffn 11008, "
            "vocab 32000, RoPE theta 10000); 1b: Llama 3.2 1B's released config (d 2048, 16 layers, 32 "
            "heads over 8 kv heads, ffn 8192, vocab 128256, theta 500000) with an untied output head "
            "(1.50e9 parameters, not 1.24e9) and no rope scaling; seq 2048 and batch 8 are our choice "
            "for those two; 3.1-8b: Llama 3.1 8B's released config (d 4096, 32 layers, 32 heads over 8 kv "
            "heads, ffn 14336, vocab 128256, untied head, theta 500000, no rope scaling) at the batch of "
            "torchtitan's published H100 run (benchmarks/llama3_h100_202412_torchtitan.md: 16 sequences of "
            "8192 tokens, 2 per GPU on 8 GPUs); 1b, 7b and 3.1-8b are traced on the meta device, never "
            "materialised; 13b and 70b: Llama 2 13B and 70B (Touvron et al. 2023b, Table 1 and the released "
            "configs: d 5120, 40 layers, 40 heads, ffn 13824; d 8192, 80 layers, 64 heads over 8 kv heads, ffn "
            "28672; vocab 32000, context 4096), seq 4096 and batch 8 our choice, meta device only",
            _LLAMA_7B,
            dict(batch=2, seq=16, vocab=64, d=32, layers=2, heads=4, kv_heads=2, ffn=64, theta=10000.0),
            {"1b": _LLAMA_1B, "7b": _LLAMA_7B, "3.1-8b": _LLAMA_31_8B, "13b": _LLAMA_13B, "70b": _LLAMA_70B},
            meta_only=("full", "1b", "7b", "3.1-8b", "13b", "70b"),
        ),
    )
}


def base_size(size: str) -> str:
    """The size without its batch: ``7b`` of ``7b@512``."""
    return size.partition("@")[0]


def known_size(name: str, size: str) -> bool:
    """``size`` is one of model ``name``'s sizes, optionally at a batch (``7b@512``): what
    :meth:`ModelSpec.config` accepts."""
    if name not in MODELS:
        return False
    try:
        spec(name).config(size)
    except PostplaceError:
        return False
    return True


def spec(name: str) -> ModelSpec:
    if name not in MODELS:
        raise PostplaceError(f"unknown zoo model '{name}'; known models: {', '.join(MODELS)}")
    return MODELS[name]


def sizes(name: str) -> tuple[str, ...]:
    """The sizes zoo model ``name`` has: ``small``, ``full``, then any it names besides.

    Parameters
    ----------
    name : str
        A key of :data:`MODELS`.

    Returns
    -------
    tuple of str

    Raises
    ------
    PostplaceError
        For an unknown model.

    Examples
    --------
    >>> from postplace.zoo import sizes
    >>> sizes("gpt2"), sizes("llama")
    (('small', 'full'), ('small', 'full', '1b', '7b', '3.1-8b', '13b', '70b'))
    """
    return spec(name).size_names()


class TargetLoss:
    """A loss over a model's outputs and its targets: ``fn(outputs, *targets)``.

    Calling it with the outputs alone uses the whole batch's ``targets`` (the one-batch contract of
    ``from_torch``), while ``fn`` and ``targets`` give the micro-batch contract
    (``from_torch(..., targets=...)``).

    Parameters
    ----------
    fn : callable
        ``(outputs, *targets) -> scalar loss``.
    *targets : torch.Tensor
        The whole batch's targets.

    Examples
    --------
    >>> import torch
    >>> from postplace.zoo import TargetLoss
    >>> loss = TargetLoss(torch.nn.functional.mse_loss, torch.ones(2))
    >>> loss(torch.zeros(2)).item(), len(loss.targets)
    (1.0, 1)
    """

    targets_are_fixed = True  #: the one-batch contract bakes these targets in on purpose: no warning

    def __init__(self, fn, *targets):
        self.fn, self.targets = fn, targets

    def __call__(self, outputs):
        return self.fn(outputs, *self.targets)


def _ce(out, y):
    import torch.nn.functional as F

    return F.cross_entropy(out, y)


def _ce_flat_targets(out, y):
    import torch.nn.functional as F

    return F.cross_entropy(out.reshape(-1, out.shape[-1]), y.reshape(-1))


def build(
    name: str,
    size: str = "full",
    *,
    seed: int = 0,
    batch: int | None = None,
    init: bool = True,
    layers: int | None = None,
):
    """``(model, inputs, loss_fn)`` for one zoo model, ready for :func:`postplace.graph.from_torch`.

    A freshly initialised model in training mode, a random batch, and a cross-entropy
    :class:`TargetLoss` over random targets (per-sample targets, ``[batch]`` or ``[batch, steps]``, so
    that micro-batches can split them).

    Parameters
    ----------
    name : str
        A key of :data:`MODELS`.
    size : str
        One of :func:`sizes`.
    seed : int
        Seed of the initialisation and of the random batch.
    batch : int, optional
        Overrides the config's batch size.
    layers : int, optional
        Overrides the config's number of blocks (the layered estimate measures a few and repeats them:
        :mod:`postplace.placers.layered`).
    init : bool
        False leaves parameters and buffers uninitialised (built on the meta device, then given empty
        CPU storage): the same shapes for tracing a graph, without the seconds a full-size model's
        random initialisation costs; never train such a model. A size in the spec's ``meta_only``
        (llama's ``1b``, ``7b``, ``3.1-8b`` and ``full``) stays on the meta device, inputs and targets included,
        whatever ``init`` says; ``init=True`` for it is refused.

    Returns
    -------
    tuple
        ``(model, inputs, loss_fn)``: a ``torch.nn.Module``, a tuple of input tensors, and a
        :class:`TargetLoss`.

    Raises
    ------
    PostplaceError
        For an unknown model or size, or ``init=True`` for a ``meta_only`` size.

    Examples
    --------
    >>> from postplace.zoo import build
    >>> model, inputs, loss_fn = build("gpt2", "small")
    >>> type(model).__name__, tuple(inputs[0].shape), loss_fn(model(*inputs)).dim()
    ('GPT2', (2, 16), 0)
    """
    import contextlib

    import torch

    from postplace.zoo import llama, seq, vision

    s = spec(name)
    cfg = s.config(size)
    meta = base_size(size) in s.meta_only
    if meta and init:
        raise PostplaceError(
            f"{name} at size {size} is traced on the meta device and never materialised, so it has no weights "
            "to initialise or train; build it with init=False for its graph, or train --size small"
        )
    if batch is not None:
        cfg["batch"] = batch
    if layers is not None:
        if "layers" not in cfg or layers < 1:
            raise PostplaceError(f"{name}: layers={layers}: give a block count >= 1 for a model made of blocks")
        cfg["layers"] = layers
    gen = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    b = cfg["batch"]
    where = contextlib.nullcontext() if init else torch.device("meta")

    def ready(model):
        return (model if init or meta else model.to_empty(device="cpu")).train()

    if name == "llama":
        with where:
            model = llama.Llama(
                cfg["vocab"],
                cfg["d"],
                cfg["layers"],
                cfg["heads"],
                cfg["kv_heads"],
                cfg["ffn"],
                context=cfg["seq"],
                theta=cfg["theta"],
            )
        shape = (b, cfg["seq"])
        if meta:  # token values are never read: empty int64 tensors on the meta device
            tokens, y = (torch.empty(shape, dtype=torch.int64, device="meta") for _ in range(2))
        else:
            tokens = torch.randint(0, cfg["vocab"], shape, generator=gen)
            y = torch.randint(0, cfg["vocab"], shape, generator=gen)
        return ready(model), (tokens,), TargetLoss(_ce_flat_targets, y)

    if name in ("inception_v3", "resnet50"):
        with where:
            if name == "inception_v3":
                model = vision.InceptionV3(width=cfg["width"], classes=cfg["classes"])
            else:
                model = vision.ResNet50(blocks=cfg["blocks"], width=cfg["width"], classes=cfg["classes"])
        inputs = (torch.randn(b, 3, cfg["image"], cfg["image"], generator=gen),)
        y = torch.randint(0, cfg["classes"], (b,), generator=gen)
        return ready(model), inputs, TargetLoss(_ce, y)
    if name == "rnnlm":
        with where:
            model = seq.RNNLM(cfg["vocab"], cfg["hidden"], cfg["layers"])
        inputs = (torch.randint(0, cfg["vocab"], (b, cfg["steps"]), generator=gen),)
        y = torch.randint(0, cfg["vocab"], (b, cfg["steps"]), generator=gen)
        return ready(model), inputs, TargetLoss(_ce_flat_targets, y)
    if name in ("nmt2", "nmt4"):
        with where:
            model = seq.NMT(cfg["vocab"], cfg["hidden"], cfg["layers"])
        src = torch.randint(0, cfg["vocab"], (b, cfg["src_len"]), generator=gen)
        tgt = torch.randint(0, cfg["vocab"], (b, cfg["tgt_len"]), generator=gen)
        y = torch.randint(0, cfg["vocab"], (b, cfg["tgt_len"]), generator=gen)
        return ready(model), (src, tgt), TargetLoss(_ce_flat_targets, y)
    with where:
        model = seq.GPT2(cfg["vocab"], cfg["d"], cfg["layers"], cfg["heads"], cfg["context"])
    tokens = torch.randint(0, cfg["vocab"], (b, cfg["seq"]), generator=gen)
    y = torch.randint(0, cfg["vocab"], (b, cfg["seq"]), generator=gen)
    return ready(model), (tokens,), TargetLoss(_ce_flat_targets, y)


def trace_model(
    name: str,
    size: str = "full",
    optimizer="sgd",
    *,
    lr: float | None = None,
    precision: str = "fp32",
    microbatches: int = 1,
    colocation: str = "none",
    batch: int | None = None,
    init: bool = True,
    layers: int | None = None,
):
    """Build and trace one zoo model; returns a :class:`postplace.graph.trace_torch.Traced`.

    A ``meta_only`` size passes its targets to the tracer as step inputs (``targets=``), never as
    tensors the loss closes over: the tracer fakes inputs and parameters alike, while a closed-over
    meta tensor would stay on the meta device.

    Parameters
    ----------
    name, size : str
        The zoo model and its size.
    optimizer, lr, precision
        As :func:`postplace.graph.from_torch` takes them.
    microbatches : int
        ``m > 1`` traces the step as m micro-batches (see ``from_torch``).
    colocation : {"none", "module"}
        The micro-batch colocation mode (with ``microbatches > 1``).
    batch : int, optional
        Overrides the config's batch size (not part of the graph cache, which keeps the config's).
    init : bool
        False: for the graph only (see :func:`build`).
    layers : int, optional
        Overrides the config's block count (see :func:`build`).

    Returns
    -------
    postplace.graph.trace_torch.Traced
        The traced step (its ``graph`` is named ``name-size``, with ``-mbM-colocation`` for m > 1).

    Raises
    ------
    PostplaceError
        For an unknown model or size, or a step that cannot be traced (see :func:`build` and
        :func:`postplace.graph.from_torch`).
    """
    import warnings

    from postplace.graph.trace_torch import MicrobatchNormWarning, trace

    model, inputs, loss_fn = build(name, size, batch=batch, init=init, layers=layers)
    cfg = {**spec(name).config(size), **({"batch": batch} if batch is not None else {})}
    if layers is not None:
        cfg["layers"] = layers
    meta = {"zoo": {"name": name, "size": size, "config": _jsonable(cfg)}}
    label = f"{name}-{size}" if microbatches == 1 else f"{name}-{size}-mb{microbatches}-{colocation}"
    if microbatches == 1 and base_size(size) not in spec(name).meta_only:
        return trace(model, inputs, loss_fn, optimizer, lr=lr, precision=precision, name=label, metadata=meta)
    with warnings.catch_warnings():  # the graph records its batch norms; place says so where its answer splits
        warnings.simplefilter("ignore", MicrobatchNormWarning)
        return trace(
            model,
            inputs,
            loss_fn.fn,
            optimizer,
            lr=lr,
            precision=precision,
            name=label,
            metadata=meta,
            microbatches=microbatches,
            targets=loss_fn.targets,
            microbatch_colocation=colocation,
        )


def cache_dir() -> Path:
    """The folder :func:`cached_graph` keeps traced graphs in: ``$POSTPLACE_CACHE``, else ``~/.cache/postplace``.

    Returns
    -------
    pathlib.Path
    """
    return Path(os.environ.get("POSTPLACE_CACHE") or Path.home() / ".cache" / "postplace")


def cached_graph(
    name: str,
    size: str = "full",
    optimizer="sgd",
    *,
    lr: float | None = None,
    precision: str = "fp32",
    microbatches: int = 1,
    colocation: str = "none",
):
    """The OpGraph of one zoo model, traced on first use and read from the cache after that.

    The cache (:func:`cache_dir`) is keyed by model, config, torch version and the tracer's source,
    and by the optimizer and its hyperparameters, the precision, the micro-batch count and colocation
    mode too. An optimizer factory has no key of its own: its graph is traced every time. A damaged
    cache entry is traced again, never trusted.

    Parameters
    ----------
    name, size : str
        The zoo model and its size.
    optimizer, lr, precision
        As :func:`postplace.graph.from_torch` takes them.
    microbatches : int
        Trace the step as that many micro-batches.
    colocation : {"none", "module"}
        The micro-batch colocation mode.

    Returns
    -------
    OpGraph

    Raises
    ------
    PostplaceError
        For an unknown model or size, a step that cannot be traced, or a cache folder that cannot be
        written (set ``POSTPLACE_CACHE``).
    """
    import torch

    from postplace.graph.opgraph import OpGraph
    from postplace.graph.optimizers import optimizer_record

    cfg = spec(name).config(size)
    record = optimizer_record(optimizer, lr)
    trace_kw = dict(lr=lr, precision=precision, microbatches=microbatches, colocation=colocation, init=False)
    if record is None:
        return trace_model(name, size, optimizer, **trace_kw).graph
    key = json.dumps(
        {
            "name": name,
            "size": size,
            "config": _jsonable(cfg),
            "optimizer": record,
            "precision": precision,
            "torch": torch.__version__,
            "tracer": _tracer_digest(),
            "microbatches": microbatches,
            "colocation": colocation if microbatches > 1 else "none",
        },
        sort_keys=True,
    )
    mb = "" if microbatches == 1 else f"mb{microbatches}-{colocation}-"
    tag = record["name"] + ("" if precision == "fp32" else f"-{precision}")
    path = cache_dir() / f"{name}-{size}-{tag}-{mb}{hashlib.sha256(key.encode()).hexdigest()[:16]}.json"
    if path.exists():
        try:
            return OpGraph.load(path)
        except PostplaceError:
            pass  # a damaged cache entry is traced again, never trusted
    graph = trace_model(name, size, optimizer, **trace_kw).graph
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        graph.save(path)
    except OSError as exc:
        raise PostplaceError(
            f"cannot write the graph cache {path} ({exc.strerror}); set POSTPLACE_CACHE to a writable folder"
        ) from None
    return graph


def graph_factory(name: str, size: str = "full", optimizer="sgd", *, lr: float | None = None, precision: str = "fp32"):
    """A function ``(m, colocation) -> OpGraph``: the zoo model's step traced as m micro-batches.

    It calls ``cached_graph(name, size, optimizer, ..., microbatches=m, colocation=...)``: the graph
    factory benchmarks and tests take.

    Parameters
    ----------
    name, size : str
        The zoo model and its size.
    optimizer, lr, precision
        As :func:`cached_graph` takes them.

    Returns
    -------
    callable
        ``graph_for(m, colocation) -> OpGraph``.

    Raises
    ------
    PostplaceError
        For an unknown model (at once; an unknown size when the factory is called).
    """
    spec(name)

    def graph_for(m: int, colocation: str):
        return cached_graph(name, size, optimizer, lr=lr, precision=precision, microbatches=m, colocation=colocation)

    return graph_for


def _tracer_digest() -> str:
    """Hash of the source files that decide what a traced graph holds."""
    here = Path(__file__).resolve().parent
    files = [
        here / "__init__.py",
        here / "vision.py",
        here / "seq.py",
        here / "llama.py",
        here.parent / "graph" / "trace_torch.py",
        here.parent / "graph" / "fx_to_opgraph.py",
        here.parent / "graph" / "microbatch.py",
        here.parent / "graph" / "flops.py",
    ]
    h = hashlib.sha256()
    for f in files:
        h.update(f.read_bytes())
    return h.hexdigest()[:16]


def _jsonable(cfg: dict) -> dict:
    return {k: list(v) if isinstance(v, tuple) else v for k, v in cfg.items()}
