"""What only a CUDA machine can check: a step split across the CPU and a GPU computes what eager CPU
training computes, TorchEvaluator measures GPU memory, calibration sees the GPU. Skipped without CUDA
(benchmarks/gpu_check.sh runs them on a GPU machine)."""

import numpy as np
import pytest
import torch

from postplace.graph.trace_torch import trace
from postplace.runtime import TorchEvaluator, apply
from tests.test_runtime import assert_same_state, eager_reference, random_placement, toy

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@pytest.fixture(autouse=True)
def no_tf32():
    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved


@pytest.mark.parametrize("seed", range(3))
def test_a_step_split_across_cpu_and_gpu_matches_eager_cpu_training(seed):
    model, inputs, loss_fn = toy()
    tr = trace(model, inputs, loss_fn)
    step = apply(model, tr, random_placement(tr.graph, seed, 2), ["cpu", "gpu0"])  # gpu0 -> cuda:0
    assert step.summary["transfers"] > 0
    losses = []
    for _ in range(2):
        torch.manual_seed(123)
        losses.append(step().item())
    ref, ref_inputs, ref_loss = toy()
    np.testing.assert_allclose(losses, eager_reference(ref, ref_inputs, ref_loss, 2), rtol=1e-4)
    assert_same_state(_OnCpu(step), ref)


class _OnCpu:
    def __init__(self, step):
        self.step = step

    def parameters(self):
        return {k: v.detach().cpu() for k, v in self.step.parameters().items()}

    def buffers(self):
        return {k: v.detach().cpu() for k, v in self.step.buffers().items()}


def test_torch_evaluator_measures_gpu_memory():
    model, inputs, loss_fn = toy()
    tr = trace(model, inputs, loss_fn)
    ev = TorchEvaluator(tr, ["cpu", "gpu0"], steps=4, discard=2)
    n = tr.graph.num_ops
    res = ev.evaluate(np.stack([np.zeros(n, dtype=int), np.ones(n, dtype=int)]))
    assert res.feasible.all() and np.all(res.step_time > 0)
    assert res.extra["peak_mem_measured"] == [False, True]
    assert res.peak_mem[1, 1] > res.peak_mem[0, 1] >= 0  # the step on gpu0 allocated there


def test_calibration_sees_the_gpu_and_its_link():
    from postplace.runtime import calibrate as cal

    devices = cal.devices_present()
    assert [n for n, _ in devices][:2] == ["cpu", "gpu0"]
    bw, lat = cal.measure_link(devices[0][1], devices[1][1], sizes=(2**16, 2**20, 2**22))
    assert bw > 1e8 and lat >= 0
