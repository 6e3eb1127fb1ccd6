"""Per-rank checkpoints of a launched step (DESIGN.md section 7): after every step each rank writes what it
holds (its parameters, buffers and optimizer state: the persistent placeholders of its program) and
torch's generator state as ``DIR/rank{r}-step{k}.json`` and the ``.npz`` beside it, through the run
folders' own checkpoint format (:func:`postplace.search.state_io.save_state`: arrays first, the
checksummed JSON last, so a file without its record is not a checkpoint). The record names the launch's
key (:func:`launch_key`: the plan, the traced step with its optimizer, the seed and the batches' seed), the
rank, the step, and each tensor's placeholder and dtype. Each rank keeps its last two steps: the ranks run
in lock step (every step ends in messages or collectives between them), so when a rank dies the others
have finished the same step or the one before, and a resumed launch starts every rank from the last step
all of them recorded (:func:`common_step`, found once by the launcher). A launch that does not resume
needs a folder without checkpoints (:func:`check_fresh`). Data only: npz arrays and JSON, never pickle.

``DIR`` must be a folder every rank can read (one host, or a shared file system). Under ``torchrun`` each
rank finds the step itself, and a fresh launch's folder is not checked.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import torch

from postplace.errors import PostplaceError
from postplace.search.state_io import load_state, save_state

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


def write(
    folder: Path,
    key: str,
    rank: int,
    step: int,
    held: list[tuple[int, torch.Tensor]],
    device=None,
    split=(),
    degree: int = 1,
) -> None:
    """Rank ``rank``'s state after ``step`` steps: ``held`` is ``[(placeholder index, tensor)]``; on a CUDA
    ``device`` its generator's state too; ``split`` and ``degree``: the placeholders held as tensor-parallel
    parts and the ranks of a group (:class:`postplace.runtime.ranks.RankPlan`), so that :func:`load_into`
    joins them."""
    folder.mkdir(parents=True, exist_ok=True)
    tensors = []
    for i, t in held:
        t = t.detach().cpu()
        data = (t.view(_BITS[t.dtype]) if t.dtype in _BITS else t).numpy()
        tensors.append({"placeholder": i, "dtype": str(t.dtype).removeprefix("torch."), "data": data})
    state = {"format": FORMAT, "key": key, "rank": rank, "step": step, "tensors": tensors}
    if split:
        state["tensor_split"] = [list(x) for x in split]
        state["tensor_degree"] = int(degree)
    state["rng"] = torch.get_rng_state().numpy()
    if device is not None and torch.device(device).type == "cuda":
        state["cuda_rng"] = torch.cuda.get_rng_state(device).numpy()
    save_state(folder / f"{_stem(rank, step)}.json", state)
    for old in folder.glob(f"rank{rank}-step*.json"):
        k = _step_of(old, rank)
        if k is not None and not step - KEEP < k <= step:
            old.unlink(missing_ok=True)
            for arrays in folder.glob(f"{_stem(rank, k)}-*.npz"):
                arrays.unlink(missing_ok=True)


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
    states (``{"rng": ..., "cuda_rng": ...}``); one error line when the record is damaged, not this launch's
    (:func:`launch_key`) or not this rank's."""
    where = folder / f"{_stem(rank, step)}.json"
    try:
        state = load_state(where)
    except PostplaceError as exc:
        raise PostplaceError(
            f"{str(exc).removesuffix('; start a new run')}; start the launch again without --resume"
        ) from None
    if not isinstance(state, dict) or state.get("format") != FORMAT or state.get("rank") != rank:
        raise PostplaceError(f"{where}: not a rank checkpoint of rank {rank}; start the launch again without --resume")
    if state.get("key") != key:
        raise PostplaceError(
            f"{where}: written by another launch (its plan, step, optimizer, seed or batches differ); resume "
            "with the placement, step and --seed it was launched with, or start again in an empty folder"
        )
    records = state.get("tensors")
    if not isinstance(records, list) or [a.get("placeholder") for a in records if isinstance(a, dict)] != placeholders:
        raise PostplaceError(f"{where}: holds other tensors than rank {rank}'s program takes; start again")
    tensors = [t for _, t in _tensors(records, where)]
    rng = {
        name: torch.from_numpy(state[name]) for name in ("rng", "cuda_rng") if isinstance(state.get(name), np.ndarray)
    }
    return tensors, rng


def _tensors(records: list, where: Path) -> list[tuple[int, torch.Tensor]]:
    """``(placeholder, tensor)`` of a record's tensors; one error line for one without its array or dtype."""
    out = []
    for a in records:
        dtype = getattr(torch, str(a.get("dtype")), None) if isinstance(a, dict) else None
        if not isinstance(dtype, torch.dtype) or not isinstance(a.get("data"), np.ndarray):
            raise PostplaceError(f"{where}: a tensor has no array or dtype here (edited); start again")
        t = torch.from_numpy(a["data"])
        t = t.view(dtype) if dtype in _BITS else t
        if t.dtype != dtype:
            raise PostplaceError(f"{where}: tensor {a['placeholder']} is not the {a['dtype']} recorded")
        out.append((int(a["placeholder"]), t))
    return out


def load_into(model: torch.nn.Module, folder: str | Path, step: int | None = None) -> int:
    """Write a launch's checkpoint (``--checkpoint DIR``) into ``model``, the user's one model: its parameters
    and buffers after the last step every rank recorded (or ``step``), whatever the plan split them into.

    Each rank holds the placeholders of its program (parameters first, in ``model.named_parameters()``
    order, then buffers): a parameter held whole by some rank (its stage, its replica; replicas hold equal
    copies) is copied from the first that holds it; one held as FSDP slices (every rank a slice of the
    flattened, padded tensor) or as tensor-parallel parts is joined back in rank order. Optimizer state is not
    the model's and is left out.

    Parameters
    ----------
    model : torch.nn.Module
        The module the launch was traced from (same parameter and buffer names, shapes and dtypes).
    folder : path
        The launch's ``--checkpoint`` folder.
    step : int, optional
        The step to load (default: the last step every rank recorded).

    Returns
    -------
    int
        The step loaded.

    Raises
    ------
    PostplaceError
        One line: no checkpoint in ``folder``, a step not every rank recorded, ranks of different launches, or
        a checkpoint of another model (a parameter no rank holds, or of another shape or dtype).
    """
    from postplace.runtime.launcher import joined

    folder = Path(folder)
    ranks = sorted({int(p.name[4:].split("-", 1)[0]) for p in folder.glob("rank*-step*.json") if p.name[4].isdigit()})
    if not ranks or ranks != list(range(len(ranks))):
        raise PostplaceError(
            f"{folder}: holds no launch checkpoint of ranks 0..K-1; give the folder --checkpoint wrote"
        )
    world = len(ranks)
    step = common_step(folder, world) if step is None else step
    if not step or any(step not in steps_of(folder, r) for r in ranks):
        raise PostplaceError(
            f"{folder}: not every rank recorded step {step}; give one of {sorted(steps_of(folder, 0))}"
        )
    held: dict[int, list[torch.Tensor]] = {}
    keys = set()
    parts: dict[int, tuple[int, int]] = {}  # tensor parallelism: placeholder -> (dimension, blocks)
    degree = 1
    for r in ranks:
        where = folder / f"{_stem(r, step)}.json"
        state = load_state(where)
        if not isinstance(state, dict) or state.get("format") != FORMAT or not isinstance(state.get("tensors"), list):
            raise PostplaceError(f"{where}: not a rank checkpoint")
        keys.add(state.get("key"))
        for i, dim, blocks in state.get("tensor_split") or ():
            parts[int(i)] = (int(dim), int(blocks))
        degree = int(state.get("tensor_degree", degree))
        for i, t in _tensors(state["tensors"], where):
            held.setdefault(i, []).append(t)
    if len(keys) > 1:
        raise PostplaceError(f"{folder}: its ranks' checkpoints come from different launches; give one launch's folder")
    named = [*model.named_parameters(), *model.named_buffers()]
    with torch.no_grad():
        for i, (name, p) in enumerate(named):
            copies = held.get(i)
            if not copies:
                raise PostplaceError(f"{folder}: no rank holds '{name}'; it is a checkpoint of another model's launch")
            whole = [t for t in copies if tuple(t.shape) == tuple(p.shape)]
            sliced = len(copies) == world  # FSDP's slices, of parts or not: every rank holds one
            value = whole[0] if whole else joined(copies, p.shape, degree if sliced or i in parts else 1, parts.get(i))
            if value is None or value.dtype != p.dtype or tuple(value.shape) != tuple(p.shape):
                raise PostplaceError(
                    f"{folder}: '{name}' is held as {[tuple(t.shape) for t in copies]} {copies[0].dtype}, not as the "
                    f"model's {tuple(p.shape)} {p.dtype}; it is a checkpoint of another model's launch"
                )
            p.copy_(value)
    return step
