"""Hand-computed schedules of a two-layer step traced as two micro-batches, on two GPUs.

The graph is what ``from_torch(..., microbatches=2)`` makes of a two-layer model, written out by hand
(one op per layer and pass): for each micro-batch k, ``f1_k -> f2_k -> b2_k -> b1_k`` (b2 sends the
activation gradient to b1, and makes layer 2's weight gradient), then one gradient sum per layer
(``a1 = g1_0 + g1_1``), then the updates. Parameters ``p1``, ``p2`` are read by their layer's
forward and backward ops and written by the update.

Bandwidth 10 bytes/s, no latency: an activation (10 bytes) moves in 1 s, a parameter or a gradient
(20 bytes) in 2 s. Op times: f1 1 s, f2 2 s, b2 2 s, b1 2 s, a sum 1 s, an update 1 s, parameters 0.
Every expected time is written as the sum that gives it.
"""

from postplace.testing import TableCostModel, star_cluster
from tests.goldengraph import ACT, NAMES, PARAM, op, two_layer_two_microbatches
from tests.simhelp import schedule_both


def at(sched, name):
    return tuple(float(x) for x in (sched.op_start[op(name)], sched.op_end[op(name)]))


def test_a_pipeline_overlaps_the_two_micro_batches():
    """Layer 1 (and its parameter, sum, update) on gpu0, layer 2 on gpu1."""
    g, table = two_layer_two_microbatches()
    layer2 = {"p2", "f2_0", "b2_0", "f2_1", "b2_1", "a2", "u2"}
    dev = [1 if n in layer2 else 0 for n in NAMES]
    _, s = schedule_both(g, star_cluster(("gpu", "gpu"), bandwidth=10.0), TableCostModel(table), dev)
    assert at(s, "f1_0") == (0, 1)
    assert at(s, "f1_1") == (1, 1 + 1)  # gpu0 runs micro-batch 1's forward while f1_0's output travels
    assert at(s, "f2_0") == (1 + 1, 1 + 1 + 2)  # f1_0's activation: 1 s
    # at 4 both b2_0 and f2_1 (its input arrived at 1 + 1 + 1) are ready; program order runs b2_0
    assert at(s, "b2_0") == (4, 4 + 2)
    assert at(s, "f2_1") == (6, 6 + 2)
    assert at(s, "b1_0") == (6 + 1, 6 + 1 + 2)  # overlaps f2_1 on the other device
    assert at(s, "b2_1") == (8, 8 + 2)
    assert at(s, "a2") == (10, 10 + 1)
    assert at(s, "u2") == (11, 11 + 1)
    assert at(s, "b1_1") == (10 + 1, 10 + 1 + 2)  # b2_1's activation gradient: 1 s
    assert at(s, "a1") == (13, 13 + 1)
    assert at(s, "u1") == (14, 14 + 1)
    pipelined = 1 + 1 + 2 + 2 + 2 + 2 + 1 + 2 + 1 + 1  # f1_0, send, f2_0, b2_0, f2_1, b2_1, send, b1_1, a1, u1
    assert s.step_time == pipelined == 15
    one_device = 2 * (1 + 2 + 2 + 2) + 2 * 1 + 2 * 1  # every op back to back
    _, single = schedule_both(g, star_cluster(("gpu", "gpu"), bandwidth=10.0), TableCostModel(table), [0] * len(NAMES))
    assert single.step_time == one_device == 18


def test_micro_batch_per_device_is_data_parallelism_with_parameter_sends_and_gradient_sums():
    """Micro-batch 0 on gpu0 with the parameters, sums and updates; micro-batch 1 on gpu1."""
    g, table = two_layer_two_microbatches()
    dev = [1 if n.endswith("_1") else 0 for n in NAMES]
    _, s = schedule_both(g, star_cluster(("gpu", "gpu"), bandwidth=10.0), TableCostModel(table), dev)
    # gpu0 computes micro-batch 0 at once
    assert [at(s, n) for n in ("f1_0", "f2_0", "b2_0", "b1_0")] == [(0, 1), (1, 1 + 2), (3, 3 + 2), (5, 5 + 2)]
    # the parameters go to gpu1 once each, one after the other on gpu0's egress port (p2 serves f2 and b2)
    sends = [(int(src), int(a), int(b), float(start), float(end)) for src, _, a, b, _, start, end in s.transfers]
    assert sends[:2] == [(op("p1"), 0, 1, 0, 2), (op("p2"), 0, 1, 2, 2 + 2)]
    assert at(s, "f1_1") == (2, 2 + 1)
    assert at(s, "f2_1") == (2 + 2, 2 + 2 + 2)  # waits for p2
    assert at(s, "b2_1") == (6, 6 + 2)
    assert at(s, "b1_1") == (8, 8 + 2)
    # the gradients of micro-batch 1 come back to be summed where the parameters live
    assert sends[2:] == [(op("b2_1"), 1, 0, 8, 8 + 2), (op("b1_1"), 1, 0, 10, 10 + 2)]
    assert at(s, "a2") == (10, 10 + 1)
    assert at(s, "u2") == (11, 11 + 1)
    assert at(s, "a1") == (12, 12 + 1)
    assert at(s, "u1") == (13, 13 + 1)
    data_parallel = 2 + 2 + 2 + 2 + 2 + 2 + 1 + 1  # p1, p2 sends, f2_1, b2_1, b1_1, g1 send, a1, u1
    assert s.step_time == data_parallel == 14


def test_a_pipeline_stage_holds_the_activations_of_both_micro_batches_in_flight():
    """The pipeline of the first test with 10-byte activations (f1, f2, and b2's outputs): gpu0 keeps
    f1_0's output until b1_0 is done (at 9) and f1_1's until b1_1 is done (at 13), so from 1 to 9 both
    micro-batches' activations are live there."""
    out = [ACT if n[:2] in ("f1", "f2", "b2") else 0 for n in NAMES]
    g, table = two_layer_two_microbatches(out)
    layer2 = {"p2", "f2_0", "b2_0", "f2_1", "b2_1", "a2", "u2"}
    dev = [1 if n in layer2 else 0 for n in NAMES]
    _, s = schedule_both(g, star_cluster(("gpu", "gpu"), bandwidth=10.0), TableCostModel(table), dev)
    # gpu0 from 7 to 9: p1 + f1_0 + f1_1 + b2_0's activation gradient, received for b1_0
    assert s.peak_memory[0] == PARAM + ACT + ACT + ACT
    # gpu1 from 4 to 6: p2 + f1_1 received + f2_0 (held for b2_0) + b2_0's output (held for a2)
    assert s.peak_memory[1] == PARAM + ACT + ACT + ACT
