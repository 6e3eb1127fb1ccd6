"""Per-rank checkpoints of a launched step (DESIGN.md section 7): after every step each rank writes what it
holds (its parameters, buffers and optimizer state: the persistent placeholders of its program) and
torch's generator state to ``DIR/rank{r}-step{k}.npz``, then a JSON record beside it naming the launch's
key (:func:`launch_key`: the plan, the traced step with its optimizer, the seed and the batches' seed), the
rank, the step, each array's placeholder, shape and dtype, and the arrays'
sha256; the record is written last, so a file without its record is not a checkpoint. Each rank keeps its
last two steps: the ranks run in lock step (every step ends in messages or collectives between them), so
when a rank dies the others have finished the same step or the one before, and a resumed launch starts
every rank from the last step all of them recorded (:func:`common_step`, found once by the launcher). A
launch that does not resume needs a folder without checkpoints (:func:`check_fresh`). Data only: npz
arrays and JSON, never pickle.

``DIR`` must be a folder every rank can read (one host, or a shared file system). Under ``torchrun`` each
rank finds the step itself, and a fresh launch's folder is not checked.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import numpy as np
import torch

from postplace.errors import PostplaceError

FORMAT = "postplace-rank-checkpoint"
KEEP = 2
_BITS = {torch.bfloat16: torch.int16, torch.float16: torch.int16}  # numpy lacks bf16: kept as its bits


def _stem(rank: int, step: int) -> str:
    return f"rank{rank}-step{step}"


def launch_key(plan, graph, seed: int, batches) -> str:
    """What a checkpoint may be resumed by: the same plan (ranks, messages, collectives), the same traced
    step (its graph's fingerprint, which holds the optimizer and its hyperparameters), the same seed and the
    same batch stream (its seed)."""
    from postplace.search.state_io import fingerprint

    key = (plan.digest(), fingerprint(graph), int(seed), getattr(batches, "seed", None), batches is None)
    return hashlib.sha256(repr(key).encode()).hexdigest()[:16]


def check_fresh(folder: Path) -> None:
    """A launch that does not resume writes into a folder without checkpoints: one launch's steps beside
    another's would be resumed as if they were one run."""
    if folder.is_dir() and any(folder.glob("rank*-step*.json")):
        raise PostplaceError(
            f"--checkpoint {folder} holds a launch's checkpoints; pass --resume to continue it, or give an empty folder"
        )


def write(folder: Path, key: str, rank: int, step: int, held: list[tuple[int, torch.Tensor]], device=None) -> None:
    """Rank ``rank``'s state after ``step`` steps: ``held`` is ``[(placeholder index, tensor)]``; on a CUDA
    ``device`` its generator's state too."""
    folder.mkdir(parents=True, exist_ok=True)
    arrays, layout = {}, []
    for i, t in held:
        t = t.detach().cpu()
        kept = t.view(_BITS[t.dtype]) if t.dtype in _BITS else t
        arrays[f"p{i}"] = kept.numpy()
        layout.append({"placeholder": i, "shape": list(t.shape), "dtype": str(t.dtype).removeprefix("torch.")})
    arrays["rng"] = torch.get_rng_state().numpy()
    if device is not None and torch.device(device).type == "cuda":
        arrays["cuda_rng"] = torch.cuda.get_rng_state(device).numpy()
    stem = _stem(rank, step)
    tmp = folder / f"{stem}.tmp.npz"
    np.savez(tmp, **arrays)
    os.replace(tmp, folder / f"{stem}.npz")
    record = {
        "format": FORMAT,
        "key": key,
        "rank": rank,
        "step": step,
        "arrays": layout,
        "sha256": hashlib.sha256((folder / f"{stem}.npz").read_bytes()).hexdigest(),
    }
    (folder / f"{stem}.json.tmp").write_text(json.dumps(record))
    os.replace(folder / f"{stem}.json.tmp", folder / f"{stem}.json")
    for old in folder.glob(f"rank{rank}-step*.json"):
        k = _step_of(old, rank)
        if k is not None and not step - KEEP < k <= step:
            old.unlink(missing_ok=True)
            (folder / f"{_stem(rank, k)}.npz").unlink(missing_ok=True)


def _step_of(path: Path, rank: int) -> int | None:
    tail = path.name.removeprefix(f"rank{rank}-step").removesuffix(".json")
    return int(tail) if tail.isdigit() else None


def steps_of(folder: Path, rank: int) -> set[int]:
    """The steps rank ``rank`` recorded in ``folder`` (records only: an npz without one is no checkpoint)."""
    return {k for p in folder.glob(f"rank{rank}-step*.json") if (k := _step_of(p, rank)) is not None}


def common_step(folder: Path, world: int) -> int:
    """The last step every rank recorded (0: none), where a resumed launch starts."""
    if not folder.is_dir():
        return 0
    common = set.intersection(*(steps_of(folder, r) for r in range(world))) if world else set()
    return max(common, default=0)


def read(folder: Path, key: str, rank: int, step: int, placeholders: list[int]) -> tuple[list, dict]:
    """Rank ``rank``'s tensors after ``step`` steps, in the order of ``placeholders``, and the generators'
    states (``{"rng": ..., "cuda_rng": ...}``); one error line when the record is not this launch's
    (:func:`launch_key`), not this rank's, or its arrays were changed."""
    stem = _stem(rank, step)
    where = folder / f"{stem}.json"
    try:
        record = json.loads(where.read_text())
        data = (folder / f"{stem}.npz").read_bytes()
    except (OSError, ValueError) as exc:
        raise PostplaceError(f"{where}: unreadable ({exc}); start the launch again without --resume") from None
    if not isinstance(record, dict) or record.get("format") != FORMAT or record.get("rank") != rank:
        raise PostplaceError(f"{where}: not a rank checkpoint of rank {rank}; start the launch again without --resume")
    if record.get("key") != key:
        raise PostplaceError(
            f"{where}: written by another launch (its plan, step, optimizer, seed or batches differ); resume "
            "with the placement, step and --seed it was launched with, or start again in an empty folder"
        )
    if hashlib.sha256(data).hexdigest() != record.get("sha256"):
        raise PostplaceError(f"{where}: its arrays do not match their checksum (damaged); start again")
    layout = record.get("arrays")
    if not isinstance(layout, list) or [a.get("placeholder") for a in layout if isinstance(a, dict)] != placeholders:
        raise PostplaceError(f"{where}: holds other tensors than rank {rank}'s program takes; start again")
    with np.load(folder / f"{stem}.npz", allow_pickle=False) as npz:
        tensors = []
        for a in layout:
            dtype = getattr(torch, str(a.get("dtype")), None)
            if not isinstance(dtype, torch.dtype) or f"p{a['placeholder']}" not in npz.files:
                raise PostplaceError(
                    f"{where}: tensor {a['placeholder']} has no array or dtype here (edited); start again"
                )
            t = torch.from_numpy(npz[f"p{a['placeholder']}"].copy())
            t = t.view(dtype) if dtype in _BITS else t
            if list(t.shape) != a["shape"] or t.dtype != dtype:
                raise PostplaceError(
                    f"{where}: tensor {a['placeholder']} is not the {a['dtype']} {a['shape']} recorded"
                )
            tensors.append(t)
        rng = {name: torch.from_numpy(npz[name].copy()) for name in ("rng", "cuda_rng") if name in npz.files}
    return tensors, rng
