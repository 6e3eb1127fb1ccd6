"""A pipeline cut is a chain even when the top module calls ops of its own at both ends of the model (a CNN's
stem max pool and final mean, as ResNet-50's): 1F1B orders it, simulated and launched (issue 31)."""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from postplace.cluster import load_cluster
from postplace.graph import PHASES
from postplace.graph.trace_torch import trace
from postplace.placers.practitioner import pipeline_stages, plan_devices, plan_step
from postplace.plans import parse_plan
from postplace.runtime.launcher import RandomBatches, launch_plan
from postplace.runtime.pipeline import pipeline_plan
from postplace.runtime.placed import apply

K80X4 = load_cluster("k80x4")  # cpu, gpu0..gpu3


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(4, 4, 3, padding=1)

    def forward(self, x):
        return torch.relu(self.conv(x)) + x


class TinyCNN(nn.Module):
    """ResNet-50's shape in small: the pooling after the stem and the global mean before the head are the
    top module's own calls, so the cut's layer order holds them as one layer at the stem's end."""

    def __init__(self):
        super().__init__()
        self.stem = nn.Conv2d(3, 4, 3, padding=1)
        self.layers = nn.Sequential(*[Block() for _ in range(4)])
        self.fc = nn.Linear(4, 3)

    def forward(self, x):
        x = nn.functional.max_pool2d(torch.relu(self.stem(x)), 2)
        x = self.layers(x)
        return self.fc(torch.flatten(nn.functional.adaptive_avg_pool2d(x, 1), 1))


def cnn_step():
    torch.manual_seed(0)
    x, y = torch.randn(8, 3, 8, 8), torch.randint(0, 3, (8,))
    torch.manual_seed(1)
    return trace(TinyCNN(), (x,), nn.functional.cross_entropy, "adamw", microbatches=4, targets=(y,))


def test_a_cnn_with_top_module_pooling_at_both_ends_is_cut_into_a_chain_and_1f1b_runs_it_bit_for_bit():
    """The stem's max pool stays on stage 0 and the final mean (with its backward) goes to stage 1, where the
    blocks it reads end: no forward data goes from stage 1 back to stage 0, so 1F1B is simulated and
    launched (stage 0 sends and receives F0 F1 B0 F2 B1 F3 B2 B3), equal to one process bit for bit."""
    spec = parse_plan("ddp:pp=2,m=4,dp=1,schedule=1f1b")
    traced = cnn_step()
    g = traced.graph
    devices = plan_devices(K80X4, spec)
    stage = pipeline_stages(g, K80X4, spec, devices)
    at = {name: int(s) for name, s in zip(g.names, stage.tolist(), strict=True)}
    assert at["mb0_max_pool2d_with_indices"] == 0 and at["mb0_max_pool2d_with_indices_backward"] == 0
    assert at["mb0_mean"] == 1 and at["mb0_addmm"] == 1
    assert {at[f"mb0_convolution_{k}"] for k in range(1, 5)} == {0, 1}  # a real cut through the blocks
    forward = PHASES.index("forward")
    for s, d in zip(g.edge_src.tolist(), g.edge_dst.tolist(), strict=True):
        if g.phase[s] == g.phase[d] == forward and g.microbatch[s] >= 0 and stage[s] >= 0:
            assert stage[d] >= stage[s], (g.names[s], g.names[d])

    assert plan_step(g, K80X4, spec, devices).step_time_s > 0  # refused before: not a chain
    plan = pipeline_plan(traced, spec, K80X4, devices)
    res = launch_plan(traced, str(spec), K80X4, steps=2, batches=RandomBatches(0))
    acts = [x for act in res.plan.programs[0].actions for x in (act[1] if act[0] == "batch" else (act,))]
    assert "".join(kind[0] for kind, _ in acts if kind in ("send", "recv")) == "ssrsrsrr"
    assert res.bytes_sent == plan.bytes_sent()

    ref = cnn_step()
    step = apply(ref.model, ref, np.zeros(ref.graph.num_ops, dtype=np.int64), K80X4, device_map="cpu")
    batches = RandomBatches(0)
    torch.manual_seed(0)
    assert res.losses == [float(step(*batches(ref))) for _ in range(2)]
    for name, p in step.parameters().items():
        assert torch.equal(res.parameters[name], p.cpu()), name
