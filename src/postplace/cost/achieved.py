"""What GPU kernels reach in practice, and the optimizer update as GPUs run it.

A datasheet roofline prices every FLOP at the tensor cores' peak and every byte at the memory's nominal
bandwidth. Real kernels reach less, by kind of op; :class:`KernelRates` holds, per GPU model, the
fraction of the datasheet rate each kind reaches, each with its public source:

* **matrix products** (``mm``, ``addmm``, ``bmm``, ``baddbmm``, convolutions as implicit GEMMs):
  ``matmul`` x peak once the GEMM fills the GPU. A GEMM whose output has fewer 128 x 128 tiles than the
  GPU has SMs leaves SMs idle; its rate scales by ``min(1, output elements / (SMs x 128 x 128))``:
  ``seconds = FLOPs / (peak x matmul x fill)``;
* **attention kernels** (``scaled_dot_product_*``, forward and backward): ``attention`` x peak on the
  work they do (a causal mask's skipped half is not counted: :mod:`postplace.graph.flops`);
* **everything else** (element-wise, reductions, normalisation, copies): bytes at ``memory`` x the
  nominal bandwidth, FLOPs at the datasheet peak, whichever is slower;
* **communication** keeps the links' nominal rates: NCCL's all-reduce on 8 H100 over NVLink reaches a
  bus bandwidth of 460-480 GB/s in nccl-tests reference runs, at or above the 450 GB/s per direction
  our ring model charges.

A GPU model without a row is priced by the plain datasheet roofline, and the cost model's source
line says so.

**The update.** The traced update is torch.optim's single-tensor form, one small kernel per op and
parameter. On CUDA, torch.optim runs the *foreach* form by default (one multi-tensor kernel per op over
the whole parameter list) and the *fused* form when asked (``fused=True``: one kernel for the whole
update). Priced on a GPU:

* ``"foreach"``: each traced update op's roofline (its bytes at the memory rate, unless its FLOPs take
  longer), plus a launch overhead shared by the tensors one multi-tensor launch covers
  (:data:`FOREACH_TENSORS_PER_LAUNCH`);
* ``"fused"``: per parameter, one pass that reads the parameter, its gradient and its state and writes
  the parameter and its state, ``(3 + 2 x slots) x parameter bytes`` at the memory rate (or the ops'
  FLOPs, if slower), plus
  ``1 / FUSED_TENSORS_PER_LAUNCH`` of a launch; the time is shared among the parameter's traced ops in
  proportion to their bytes, so any placement of them sums to it;
* ``"traced"``: the traced ops as they are (what a CPU runs; CPU devices always take this).

The traced ops stay in the graph for execution and numerics; only their price changes.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from postplace.graph import PHASES, OpGraph

__all__ = [
    "ACHIEVED",
    "FOREACH_TENSORS_PER_LAUNCH",
    "FUSED_TENSORS_PER_LAUNCH",
    "GEMM_TILE",
    "KERNEL_MODELS",
    "MEASURED_STEP_ERROR",
    "KernelRates",
    "UPDATE_FORMS",
    "classify_ops",
    "gemm_fill",
    "update_times",
]

#: output elements one GEMM thread block computes (a 128 x 128 tile, cuBLAS's common Hopper/Ampere tile)
GEMM_TILE = 128 * 128
#: tensors one launch of torch's multi-tensor kernels covers: ``depth_to_max_tensors`` in
#: ``aten/src/ATen/native/cuda/MultiTensorApply.cuh`` is 110, 64, 48, 36, 30 for 1-5 tensor lists; a
#: foreach AdamW op reads 2-3 lists
FOREACH_TENSORS_PER_LAUNCH = 48
#: the fused Adam(W) kernel walks 4 lists (parameter, gradient, two moments): 36 tensors per launch
FUSED_TENSORS_PER_LAUNCH = 36
UPDATE_FORMS = ("foreach", "fused", "traced")
#: how far the simulated step time was from the one published run it is checked against, per rates
#: (benchmarks/published_runs.py: torchtitan's Llama 3.1 8B on 8 H100, 2.843 s measured; achieved rates
#: 2.396 s, datasheet rates 1.860 s); two candidates closer than this are not told apart by the model
MEASURED_STEP_ERROR = {"achieved": 0.157, "datasheet": 0.346}
KERNEL_MODELS = ("achieved", "datasheet")

_MATMUL = frozenset("mm addmm bmm baddbmm convolution convolution_backward _convolution".split())
_UPDATE = PHASES.index("update")


@dataclass(frozen=True)
class KernelRates:
    """Fractions of a GPU model's datasheet rates that its kernels reach (see the module docstring).

    Parameters
    ----------
    matmul : float
        A GEMM that fills the GPU, as a fraction of the tensor-core (or FP32) peak.
    attention : float
        A fused attention kernel, forward and backward, as a fraction of the peak.
    memory : float
        A streaming kernel, as a fraction of the nominal memory bandwidth.
    sms : int
        Streaming multiprocessors (for the GEMM fill).
    source : str
        Where each figure comes from.
    """

    matmul: float
    attention: float
    memory: float
    sms: int
    source: str


_A100 = KernelRates(
    matmul=0.86,
    attention=0.70,
    memory=0.90,
    sms=108,
    source="matmul: maximum achievable bf16 matmul 268-271 of 312 TFLOP/s on an A100 SXM (stas00/ml-engineering, "
    "MAMF table); attention: FlashAttention-2 trains at up to 225 TFLOP/s per A100, 72% of peak (Dao 2023, "
    "abstract); memory: as the H100's (an estimate)",
)

_H100 = KernelRates(
    matmul=0.80,
    attention=0.35,
    memory=0.90,
    sms=132,
    source="matmul: maximum achievable bf16 matmul 792-821 of 989 TFLOP/s on an H100 SXM (stas00/ml-engineering, "
    "compute/accelerator, MAMF table); attention: FlashAttention-2, torch's flash backend, reaches 35% of an "
    "H100's peak (Shah et al. 2024, FlashAttention-3, abstract); memory: streaming copies sustain about 3.0 of "
    "3.35 TB/s (public STREAM-style measurements; an estimate, checked by benchmarks/gpu_check.py)",
)
#: GPU model (a device's ``model``) -> its kernel rates
ACHIEVED: dict[str, KernelRates] = {
    "H100": _H100,
    "H100-96GB": _H100,
    "A100-40GB": _A100,
    "A100-80GB": _A100,  # the same chip (108 SMs, the same clocks); only the HBM size and rate differ
}


def classify_ops(graph: OpGraph) -> tuple[np.ndarray, np.ndarray]:
    """``(is_matmul, is_attention)``: ``bool[n]`` each, from the op types."""
    types = graph.op_types
    matmul = np.array([t.rstrip("_") in _MATMUL for t in types], dtype=bool)
    attention = np.array(["scaled_dot_product" in t for t in types], dtype=bool)
    return matmul, attention


def gemm_fill(graph: OpGraph, sms: int) -> np.ndarray:
    """Per op, the fraction of SMs a GEMM's output tiles keep busy: ``min(1, elements / (sms x GEMM_TILE))``.

    The output's element size is taken from the op's precision (2 bytes for bf16/fp16, else 4).
    """
    from postplace.graph.opgraph import PRECISIONS

    size = np.array([4.0 if p == "fp32" else 2.0 for p in PRECISIONS])[graph.precision]
    elements = graph.output_bytes / size
    return np.clip(elements / (sms * GEMM_TILE), 1e-6, 1.0)


def update_times(
    graph: OpGraph, form: str, compute_s: np.ndarray, memory_bandwidth: float, launch_overhead: float
) -> np.ndarray:
    """Seconds each update op takes on a GPU when the update runs in ``form`` (NaN for other ops).

    Parameters
    ----------
    graph : OpGraph
    form : {"foreach", "fused"}
    compute_s : numpy.ndarray
        Per op, its FLOPs at the device's rate (an update op is slower than its bytes only if it
        computes more than it moves).
    memory_bandwidth : float
        Bytes/s the update's streaming kernels reach.
    launch_overhead : float
        Seconds per kernel launch.

    Returns
    -------
    numpy.ndarray
        ``float64[n]``.
    """
    n = graph.num_ops
    out = np.full(n, np.nan)
    update = graph.phase == _UPDATE
    roof = np.maximum(compute_s, graph.bytes_accessed / memory_bandwidth)
    out[update] = roof[update] + launch_overhead / FOREACH_TENSORS_PER_LAUNCH
    if form != "fused":
        return out
    slots = float(graph.metadata.get("optimizer_slots", 0) or 0)
    is_param = np.array(
        [t == "parameter" or nm.startswith("param:") for t, nm in zip(graph.op_types, graph.names, strict=True)]
    )
    groups: dict[int, list[int]] = {}
    for i in np.flatnonzero(update & (graph.colocation >= 0)).tolist():
        groups.setdefault(int(graph.colocation[i]), []).append(i)
    param_bytes: dict[int, float] = {}
    for i in np.flatnonzero(is_param & (graph.colocation >= 0)).tolist():
        c = int(graph.colocation[i])
        param_bytes[c] = param_bytes.get(c, 0.0) + float(graph.output_bytes[i])
    for c, ops in groups.items():
        if c not in param_bytes:
            continue  # no parameter to size the pass by: keep the foreach price
        one_pass = max(float(compute_s[ops].sum()), (3.0 + 2.0 * slots) * param_bytes[c] / memory_bandwidth)
        total = one_pass + launch_overhead / FUSED_TENSORS_PER_LAUNCH
        weight = graph.bytes_accessed[ops]
        share = weight / weight.sum() if weight.sum() > 0 else np.full(len(ops), 1.0 / len(ops))
        out[ops] = total * share
    return out
