import numpy as np
import pytest

from postplace.errors import PostplaceError
from postplace.graph import OpGraph
from postplace.graph.grouping import colocation_units, group_ops
from postplace.search import make_problem
from postplace.testing import TableCostModel, star_cluster


def chain(n=40, colocate_every=None):
    coloc = [i // colocate_every if colocate_every else -1 for i in range(n)]
    return OpGraph.build(
        [f"op{i}" for i in range(n)], [(i, i + 1, 8.0) for i in range(n - 1)], flops=np.full(n, 1e6), colocation=coloc
    )


def test_colocation_sets_become_single_units_numbered_in_program_order():
    g = chain(10, colocate_every=3)
    assert colocation_units(g).tolist() == [0, 0, 0, 1, 1, 1, 2, 2, 2, 3]


@pytest.mark.parametrize("groups", [4, 8, 16])
def test_metis_groups_respect_colocation_and_reach_about_the_target(groups):
    g = chain(200, colocate_every=2)
    gr = group_ops(g, groups)
    assert groups * 0.75 <= gr.num_groups <= groups
    assert sorted(set(gr.group_of_op.tolist())) == list(range(gr.num_groups))
    for members in g.colocation_sets:
        assert len(set(gr.group_of_op[members].tolist())) == 1
    # a balanced cut of a chain keeps groups contiguous: few edges cross groups
    cross = np.sum(gr.group_of_op[g.edge_src] != gr.group_of_op[g.edge_dst])
    assert cross <= 2 * gr.num_groups


def test_no_coarsening_below_the_target_or_with_none():
    g = chain(10)
    assert group_ops(g, 256).num_groups == 10
    assert group_ops(chain(300), None).num_groups == 300


def test_classes_never_share_a_group():
    g = chain(60)
    classes = np.array([i % 2 for i in range(60)])
    gr = group_ops(g, 8, classes=classes)
    for k in range(gr.num_groups):
        assert len(set(classes[gr.members(k)].tolist())) == 1


def test_pins_and_exclusions_become_zero_probability_devices():
    g = OpGraph.build(
        ["embed", "a", "b", "c"],
        [(0, 1, 1.0), (1, 2, 1.0), (2, 3, 1.0)],
        allowed_kinds=[["cpu", "gpu"]] * 3 + [["cpu"]],
    )
    cluster = star_cluster(("cpu", "gpu", "gpu"))
    p = make_problem(
        g, cluster, groups=None, pins=["^embed$=gpu1"], exclude=["gpu0"], cost_model=TableCostModel(np.ones((4, 3)))
    )
    assert p.space.allowed.tolist() == [
        [False, False, True],
        [True, False, True],
        [True, False, True],
        [True, False, False],
    ]
    with pytest.raises(PostplaceError, match="no op name matches"):
        make_problem(g, cluster, pins=["zzz=gpu0"])
    with pytest.raises(PostplaceError, match="no device 'tpu'"):
        make_problem(g, cluster, pins=["a=tpu"])
    with pytest.raises(PostplaceError, match="no device left"):
        make_problem(g, cluster, exclude=["cpu"])
