"""A bad anneal start is one error line when the run is made, before any sample (issue 22)."""

import pytest

import postplace
from postplace.errors import PostplaceError
from postplace.graph import OpGraph


@pytest.mark.parametrize("init, why", [([0, 99, 1], "name no device"), ([0, 1], "one device id per unit (3 here)"),
                                       ([0, "x", 1], "is not an integer")])  # fmt: skip
def test_a_bad_anneal_start_is_refused_before_the_run(tmp_path, init, why):
    g = OpGraph.build(["a", "b", "c"], [(0, 1, 1e6), (1, 2, 1e6)], flops=[1e9, 1e9, 1e9])
    out = tmp_path / "run"
    with pytest.raises(PostplaceError) as err:
        postplace.place(g, "k80x2", strategy="anneal", budget=50, groups=None, config={"init": init}, out=out)
    assert why in str(err.value) and "\n" not in str(err.value)
    assert not (out / "history.jsonl").exists()  # nothing was searched
