"""Model FLOPs utilisation (MFU) and tokens per second: what lets a reader hold a row against a published run.

MFU is the model's FLOPs per step over what the devices could do in the step time:
``model FLOPs / (step seconds x sum of the peaks of the devices the plan uses)``, each peak at the step's
precision. The model FLOPs are counted as PaLM's appendix B counts them (Chowdhery et al. 2022), for
the zoo's language models: ``6 N + 12 L H Q T`` per token (N the parameters that multiply, so without
the input embedding table, as torchtitan counts them; L layers, H heads of size Q, T the sequence);
for any other step, the FLOPs of its forward and backward ops, recomputation left out. Recomputed work
and the update never count: MFU measures useful work, and a plan that recomputes pays for it in time.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from postplace.graph import PHASES, OpGraph

__all__ = ["Utilisation", "model_flops", "peak_of_devices_used", "utilisation"]

_FWD_BWD = (PHASES.index("forward"), PHASES.index("backward"))


def model_flops(graph: OpGraph) -> tuple[float, float | None, str]:
    """``(FLOPs per step, tokens per step or None, how they were counted)`` of a step.

    >>> from postplace.graph import OpGraph
    >>> g = OpGraph.build(["a", "rc:a"], [], flops=[3e9, 3e9], phase=["forward", "backward"])
    >>> model_flops(g)
    (3000000000.0, None, 'forward and backward ops')
    """
    zoo = graph.metadata.get("zoo") or {}
    cfg = zoo.get("config") or {}
    if zoo.get("name") in ("llama", "gpt2") and "param_bytes" in graph.metadata:
        params = float(graph.metadata["param_bytes"]) / 4.0  # the zoo's parameters are fp32
        lookup = cfg["vocab"] * cfg["d"] if zoo["name"] == "llama" else cfg["context"] * cfg["d"]  # gpt2's head is tied
        tokens = float(cfg["batch"] * cfg["seq"])
        per_token = 6.0 * (params - lookup) + 12.0 * cfg["layers"] * cfg["d"] * cfg["seq"]
        return per_token * tokens, tokens, "PaLM: 6N + 12LHQT per token"
    useful = np.isin(graph.phase, _FWD_BWD) & ~np.array([n.startswith("rc:") for n in graph.names], dtype=bool)
    return float(graph.flops[useful].sum()), None, "forward and backward ops"


@dataclass(frozen=True)
class Utilisation:
    """What a step time means against the hardware.

    Parameters
    ----------
    mfu : float
        Model FLOPs utilisation, 0..1.
    model_flops : float
        Per step.
    tokens_per_s_per_device : float or None
        For a language model: tokens per second per device used.
    devices : int
        Devices the plan uses.
    counted : str
        How the model FLOPs were counted.
    """

    mfu: float
    model_flops: float
    tokens_per_s_per_device: float | None
    devices: int
    counted: str

    def to_dict(self) -> dict:
        return {
            "mfu": self.mfu,
            "model_flops": self.model_flops,
            "tokens_per_s_per_device": self.tokens_per_s_per_device,
            "devices": self.devices,
            "model_flops_counted": self.counted,
        }


def peak_of_devices_used(cluster, placement, precision: str) -> tuple[float, int]:
    """``(FLOP/s, devices)``: the summed peak, at ``precision``, of the devices ``placement`` uses."""
    used = sorted(set(np.asarray(placement, dtype=np.int64).tolist()))
    peak = 0.0
    for d in used:
        dev = cluster.devices[d]
        peak += dev.peak_for(precision) or dev.peak_flops
    return peak, len(used)


def utilisation(graph: OpGraph, cluster, placement, step_time_s: float | None) -> Utilisation | None:
    """MFU and tokens/s of ``graph`` placed by ``placement`` (``int[n]`` device per op) taking ``step_time_s``.

    None when the step time is not a positive finite number.
    """
    if step_time_s is None or not np.isfinite(step_time_s) or step_time_s <= 0:
        return None
    flops, tokens, how = model_flops(graph)
    peak, used = peak_of_devices_used(cluster, placement, str(graph.metadata.get("precision", "fp32")))
    per_device = tokens / step_time_s / used if tokens else None
    return Utilisation(flops / (step_time_s * peak), flops, per_device, used, how)
