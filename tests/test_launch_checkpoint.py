"""Per-rank checkpoints of a launched step (issue 33 items 2 and 4): each rank writes what it holds after
every step; a launch stopped after step 2, or killed in step 3, resumes from the last step every rank
recorded and ends bit for bit where an unbroken launch ends (its dropout's generator and its batch stream
restored as well), and a checkpoint of another plan is refused in one line."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from postplace.cluster import load_cluster
from postplace.errors import PostplaceError
from postplace.graph.trace_torch import trace
from postplace.runtime import rank_checkpoint
from postplace.runtime.launcher import RandomBatches, launch
from postplace.search.state_io import load_state
from tests.test_launch import Fault

pytestmark = pytest.mark.usefixtures("torch_one_thread")

K80X2 = load_cluster("k80x2")  # cpu, gpu0, gpu1


class Dropped(nn.Module):
    """Dropout between two layers: a resumed rank must draw the masks the unbroken run drew."""

    def __init__(self):
        super().__init__()
        self.a, self.drop, self.b = nn.Linear(6, 16), nn.Dropout(0.3), nn.Linear(16, 3)

    def forward(self, x):
        return self.b(self.drop(torch.relu(self.a(x))))


def step_and_placement():
    torch.manual_seed(0)
    tr = trace(Dropped(), (torch.randn(8, 6),), nn.functional.mse_loss, "adamw", targets=(torch.randn(8, 3),))
    placement = np.random.default_rng(4).integers(1, 3, tr.graph.num_ops)  # gpu0 and gpu1, op by op
    return tr, placement


def run(steps, folder, *, resume=False, batches=None, placement=None):
    tr, mine = step_and_placement()
    return launch(
        tr,
        mine if placement is None else placement,
        K80X2,
        steps=steps,
        batches=batches or RandomBatches(0),
        seed=3,
        checkpoint=folder,
        resume=resume,
    )


@pytest.fixture(scope="module")
def unbroken(tmp_path_factory):
    folder = tmp_path_factory.mktemp("unbroken")
    return run(3, folder), folder


def assert_same_state(a, b):
    for name, t in a.parameters.items():
        assert torch.equal(t, b.parameters[name]), name


def test_each_rank_keeps_its_last_two_steps_as_data(unbroken):
    result, folder = unbroken
    names = sorted(p.name for p in folder.iterdir())
    assert [n for n in names if n.endswith(".json")] == [f"rank{r}-step{k}.json" for r in (0, 1) for k in (2, 3)]
    assert [n.rsplit("-", 1)[0] for n in names if n.endswith(".npz")] == [
        f"rank{r}-step{k}" for r in (0, 1) for k in (2, 3)
    ]  # each record's arrays beside it, no other file
    assert len(names) == 8
    record = load_state(folder / "rank1-step3.json")
    tr, _ = step_and_placement()
    assert record["key"] == rank_checkpoint.launch_key(result.plan, tr.graph, 3, RandomBatches(0))
    assert record["step"] == 3
    held = [i for i in result.plan.programs[1].inputs if i < result.plan.n_persistent]
    assert [a["placeholder"] for a in record["tensors"]] == held  # its own state only
    assert all(isinstance(a["data"], np.ndarray) for a in record["tensors"]) and isinstance(record["rng"], np.ndarray)
    assert set(record) == {"format", "key", "rank", "step", "tensors", "rng"}  # nothing but its state and the rng


def test_a_launch_stopped_after_step_two_resumes_to_the_unbroken_state(unbroken, tmp_path):
    whole, _ = unbroken
    first = run(2, tmp_path)
    assert first.losses == whole.losses[:2]
    rest = run(3, tmp_path, resume=True)
    assert rest.start_step == 2 and rest.losses == whole.losses[2:]  # dropout masks and batch 3 as unbroken
    assert_same_state(rest, whole)


def test_a_rank_killed_in_step_three_resumes_from_step_two(unbroken, tmp_path):
    whole, _ = unbroken
    with pytest.raises(PostplaceError, match="rank 1 .* killed"):
        run(3, tmp_path, batches=Fault(1, 3, "kill"))
    assert rank_checkpoint.common_step(tmp_path, 2) == 2
    rest = run(3, tmp_path, resume=True)
    assert rest.start_step == 2 and rest.losses == whole.losses[2:]
    assert_same_state(rest, whole)


def test_another_launchs_checkpoint_or_nothing_left_to_run_is_one_line(unbroken, tmp_path):
    """Another placement, another seed or a folder that already holds a launch are refused before any step:
    a resume must continue the very launch that wrote the folder."""
    _, folder = unbroken
    tr, placement = step_and_placement()
    other = np.where(placement == 1, 2, 1)  # the same ops on the other GPU: another plan
    with pytest.raises(PostplaceError, match="written by another launch") as e:
        run(4, folder, resume=True, placement=other)
    assert "\n" not in str(e.value)
    with pytest.raises(PostplaceError, match="written by another launch"):
        run(4, folder, resume=True, batches=RandomBatches(5))  # another batch stream
    with pytest.raises(PostplaceError, match="nothing is left to run"):
        run(3, folder, resume=True)
    with pytest.raises(PostplaceError, match="holds a launch's checkpoints; pass --resume"):
        run(1, folder)  # a fresh launch would leave its step 1 beside the old steps 2 and 3


def test_a_checkpoint_loads_back_into_the_users_one_model(unbroken, tmp_path):
    """``load_into``: the ranks' checkpoints (each its own parameters) written into one fresh model give the
    launch's final parameters; FSDP's slices are joined back; another model's or no checkpoint is one line."""
    from postplace.runtime.launcher import launch_plan

    result, folder = unbroken
    torch.manual_seed(9)
    fresh = Dropped()
    assert rank_checkpoint.load_into(fresh, folder) == 3
    for name, p in fresh.named_parameters():
        assert torch.equal(p.detach(), result.parameters[name]), name
    assert rank_checkpoint.load_into(fresh, folder, step=2) == 2  # the step before, still kept
    assert not torch.equal(fresh.a.weight.detach(), result.parameters["a.weight"])

    torch.manual_seed(0)
    mlp = nn.Sequential(nn.Linear(5, 7), nn.Tanh(), nn.Linear(7, 3))  # 7 x 5 = 35 weights: padded slices
    tr = trace(mlp, (torch.randn(4, 5),), nn.functional.mse_loss, "adamw", microbatches=2, targets=(torch.randn(4, 3),))
    sharded = launch_plan(
        tr, "fsdp:m=2,dp=2", load_cluster("k80x4"), steps=2, batches=RandomBatches(1), checkpoint=tmp_path / "fsdp"
    )
    slices = [a["data"].shape for a in load_state(tmp_path / "fsdp" / "rank0-step2.json")["tensors"]]
    assert (18,) in slices and (7, 5) not in slices  # each rank holds half of the padded 35 weights, not them whole
    other = nn.Sequential(nn.Linear(5, 7), nn.Tanh(), nn.Linear(7, 3))
    rank_checkpoint.load_into(other, tmp_path / "fsdp")
    for name, p in other.named_parameters():
        assert torch.equal(p.detach(), sharded.parameters[name]), name
    with pytest.raises(PostplaceError, match="held as .* not as the model's \\(7, 4\\)"):
        rank_checkpoint.load_into(nn.Sequential(nn.Linear(4, 7), nn.Tanh(), nn.Linear(7, 3)), tmp_path / "fsdp")
    with pytest.raises(PostplaceError, match="holds no launch checkpoint"):
        rank_checkpoint.load_into(other, tmp_path)
