"""FLOPs and bytes of one aten call, from the shapes of its arguments (no real compute).

Matrix products, convolutions and attention use torch's own formulas
(:data:`torch.utils.flop_counter.flop_registry`, a multiply-add = 2 FLOPs; CPU attention kernels
borrow the formula of their CUDA twin). torch's attention formula ignores a causal mask; a fused
attention kernel skips the masked half of the scores (FlashAttention-2, Dao 2023, Sec. 3.1), so an
``is_causal`` call counts half. torch counts every other
op as zero, which would make a placement search think elementwise, normalisation, pooling, softmax,
embedding and reduction ops are free; for those we count our own, stated here:

* elementwise and reductions: ``factor x`` the element count of the largest tensor argument or result
  (a sum reads every input element once; ``add`` writes every output element once), with the factor
  from :data:`FACTORS` (1 for plain arithmetic; more for transcendental functions and fused
  normalisation / softmax kernels, roughly the arithmetic each element goes through);
* pooling: output elements x window size (forward and backward alike);
* ``nll_loss``: one FLOP per target element; embedding backward: one add per gradient element;
* ops that only move or create data (copy, cat, gather, embedding forward, index, factories) count
  zero FLOPs: their cost is in their bytes, which a roofline model reads too.

Any other op counts one FLOP per element (see :func:`op_flops`), so nothing is silently free.
"""

from __future__ import annotations

import math

import torch
from torch.utils.flop_counter import flop_registry

__all__ = ["FACTORS", "ZERO_FLOP_OPS", "op_flops", "tensor_bytes", "numel"]

#: FLOPs per element for ops without a torch formula (base names; in-place ``add_`` -> ``add``).
FACTORS: dict[str, float] = {
    **dict.fromkeys(
        "add sub rsub mul div neg relu threshold_backward maximum minimum clamp clamp_min clamp_max where "
        "abs sign eq ne gt ge lt le masked_fill sqrt rsqrt reciprocal exp log pow square "
        "sum mean amax amin max min argmax any all logical_not bitwise_not copy_sign hardtanh "
        "hardtanh_backward leaky_relu leaky_relu_backward dropout bernoulli native_dropout_backward".split(),
        1.0,
    ),
    **dict.fromkeys("addcmul addcdiv lerp native_dropout var std".split(), 2.0),
    **dict.fromkeys("sigmoid_backward tanh_backward".split(), 3.0),
    **dict.fromkeys("sigmoid tanh silu erf".split(), 4.0),
    **dict.fromkeys("_softmax_backward_data _log_softmax_backward_data".split(), 4.0),
    **dict.fromkeys("_softmax _log_softmax".split(), 5.0),
    "gelu": 8.0,
    "gelu_backward": 12.0,
    **dict.fromkeys(
        "native_batch_norm _native_batch_norm_legit _native_batch_norm_legit_functional "
        "_native_batch_norm_legit_no_training native_layer_norm".split(),
        8.0,
    ),
    **dict.fromkeys("native_batch_norm_backward native_layer_norm_backward".split(), 12.0),
}

#: Ops that move, create or select data and do no arithmetic.
ZERO_FLOP_OPS = frozenset(
    "copy clone _to_copy cat stack zeros ones empty full fill zero zeros_like ones_like empty_like "
    "full_like new_zeros new_ones new_empty new_full scalar_tensor arange embedding index index_select "
    "gather constant_pad_nd slice_scatter select_scatter _unsafe_index lift_fresh_copy empty_strided "
    "_unsafe_view view_copy expand_copy permute_copy t_copy transpose_copy squeeze_copy unsqueeze_copy "
    "slice_copy select_copy split_copy split_with_sizes_copy unbind_copy alias_copy detach_copy "
    "as_strided_copy repeat _local_scalar_dense".split()
)

#: CPU kernels with the same arguments as an op torch has a formula for (torch registers only the
#: CUDA attention kernels; ``scaled_dot_product_attention`` on CPU lowers to these).
_SAME_FORMULA = {
    "_scaled_dot_product_flash_attention_for_cpu": torch.ops.aten._scaled_dot_product_flash_attention,
    "_scaled_dot_product_flash_attention_for_cpu_backward": (
        torch.ops.aten._scaled_dot_product_flash_attention_backward
    ),
}

_POOLS = ("max_pool2d_with_indices", "avg_pool2d", "max_pool2d_with_indices_backward", "avg_pool2d_backward")


def numel(x) -> int:
    return x.numel() if isinstance(x, torch.Tensor) else 0


def tensor_bytes(x) -> int:
    """Bytes of a tensor, or of every tensor in a (nested) tuple/list; 0 for anything else."""
    if isinstance(x, torch.Tensor):
        return x.numel() * x.element_size()
    if isinstance(x, list | tuple):
        return sum(tensor_bytes(y) for y in x)
    return 0


def base_name(target) -> str:
    """``aten.add_.Tensor`` -> ``add`` (in-place and overload stripped), for the factor tables."""
    name = target.overloadpacket.__name__ if hasattr(target, "overloadpacket") else str(target)
    return name[:-1] if name.endswith("_") and not name.endswith("__") else name


def _largest(args, out) -> int:
    sizes = [numel(a) for a in _flat(args)] + [numel(o) for o in _flat(out)]
    return max(sizes, default=0)


def _flat(x):
    if isinstance(x, list | tuple):
        for y in x:
            yield from _flat(y)
    elif isinstance(x, dict):
        for y in x.values():
            yield from _flat(y)
    else:
        yield x


def _argument(target, args, kwargs, key: str):
    """The value of argument ``key`` in a call of ``target``, by its schema (None if it has none)."""
    if key in kwargs:
        return kwargs[key]
    schema = getattr(target, "_schema", None)
    names = [a.name for a in schema.arguments] if schema is not None else []
    if key not in names:
        return None
    k = names.index(key)
    return args[k] if k < len(args) else schema.arguments[k].default_value


def _pool_flops(name: str, args, out) -> float:
    # window size from the kernel_size argument (int or pair); the backward's output is grad_input,
    # its window count is the number of forward output (= grad_output) elements
    kernel = args[2] if name.endswith("backward") else args[1]
    k = kernel if isinstance(kernel, list | tuple) else [kernel, kernel]
    window = math.prod(k) if len(k) > 1 else k[0] * k[0]
    outs = numel(args[0]) if name.endswith("backward") else numel(out[0] if isinstance(out, tuple) else out)
    return float(outs * window)


def op_flops(target, args, kwargs, out) -> float:
    """FLOPs of one aten call ``target(*args, **kwargs) -> out``; tensors may be fake (shapes only)."""
    packet = getattr(target, "overloadpacket", None)
    name = base_name(target)
    half = 0.5 if "scaled_dot_product" in name and _argument(target, args, kwargs, "is_causal") else 1.0
    if packet is not None and packet in flop_registry:
        return half * float(flop_registry[packet](*args, **kwargs, out_val=out))
    if name in _SAME_FORMULA:
        return half * float(flop_registry[_SAME_FORMULA[name]](*args, **kwargs, out_val=out))
    if name in ZERO_FLOP_OPS or name.endswith("_copy"):
        return 0.0
    if name in _POOLS:
        return _pool_flops(name, args, out)
    if name in ("adaptive_avg_pool2d", "_adaptive_avg_pool2d", "_adaptive_avg_pool2d_backward"):
        return float(max(numel(args[0]), numel(args[-1])))
    if name.startswith("nll_loss"):
        target_t = args[2] if name == "nll_loss_backward" else args[1]
        return float(numel(target_t))
    if name == "embedding_dense_backward":
        return float(numel(args[0]))
    return FACTORS.get(name, 1.0) * _largest(args, out)
