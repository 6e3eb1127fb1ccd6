"""Strategy inputs checked where they enter: a bad anneal start when the run is made, a Post state
whose buffers are not what Post writes when it is loaded (issue 22)."""

import pytest

import postplace
from postplace.errors import PostplaceError
from postplace.graph import OpGraph


@pytest.mark.parametrize(
    "init, why",
    [([0, 99, 1], "name no device"), ([0, 1], "one device id per unit (3 here)"), ([0, "x", 1], "is not an integer")],
)
def test_a_bad_anneal_start_is_refused_before_the_run(tmp_path, init, why):
    g = OpGraph.build(["a", "b", "c"], [(0, 1, 1e6), (1, 2, 1e6)], flops=[1e9, 1e9, 1e9])
    out = tmp_path / "run"
    with pytest.raises(PostplaceError) as err:
        postplace.place(g, "k80x2", strategy="anneal", budget=50, groups=None, config={"init": init}, out=out)
    assert why in str(err.value) and "\n" not in str(err.value)
    assert not (out / "history.jsonl").exists()  # nothing was searched


@pytest.mark.parametrize("edit", ["float", "out of range", "short scores"])
def test_a_post_state_with_damaged_recent_samples_is_refused(edit):
    import copy

    import numpy as np

    from postplace.search import PostConfig, PostStrategy, SearchSpace

    sp = SearchSpace(np.ones((3, 2), dtype=bool), failure_step_time=10.0)
    cfg = PostConfig(init="uniform", batch_size=4, ce_every=8)
    s = PostStrategy(sp, seed=0, config=cfg)
    p = s.ask(4)
    s.tell(p, np.arange(4.0), np.ones(4, bool))
    state = copy.deepcopy(s.state_dict())
    PostStrategy(sp, seed=1, config=cfg).load_state_dict(copy.deepcopy(state))  # as written: accepted
    if edit == "float":
        state["recent"][0][0] = state["recent"][0][0].astype(float)
    elif edit == "out of range":
        state["recent"][0][0][0, 0] = 7
    else:
        state["recent"][1][0] = state["recent"][1][0][:2]
    with pytest.raises(ValueError):
        PostStrategy(sp, seed=1, config=cfg).load_state_dict(state)
