"""``postplace simulate --plan`` (issue 29): a named plan timed without a search, and its bad inputs as
one error line each."""

from __future__ import annotations

import json

import pytest

from tests.clihelp import cli_error, run_cli


def plan_json(*args):
    r = run_cli("simulate", "gpt2", "--size", "small", *args, "--json")
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def test_plan_json_fields_and_numbers_that_cannot_drift():
    ddp = plan_json("--cluster", "k80x2", "--plan", "ddp")
    fsdp = plan_json("--cluster", "k80x2", "--plan", "fsdp")
    for out in (ddp, fsdp):
        assert {"step_time_s", "peak_memory_bytes", "bytes_moved", "oom", "collective_bytes"} <= set(out)
        assert out["evaluator"] == "simulator" and out["microbatches"] == 2
    assert set(ddp["collective_bytes"]) == {"all_reduce"}
    assert set(fsdp["collective_bytes"]) == {"all_gather", "reduce_scatter"}
    # fp32 step: FSDP gathers twice and reduce-scatters once what DDP all-reduces (2 x (k-1)/k each way)
    assert sum(fsdp["collective_bytes"].values()) == pytest.approx(1.5 * sum(ddp["collective_bytes"].values()))
    assert fsdp["peak_memory_bytes"]["gpu0"] < ddp["peak_memory_bytes"]["gpu0"]
    assert fsdp["bytes_moved"] >= sum(fsdp["collective_bytes"].values())
    ddp_m2 = plan_json("--cluster", "k80x2", "--plan", "ddp:m=2,dp=2")
    assert ddp_m2["step_time_s"] == ddp["step_time_s"]


def test_plan_table():
    r = run_cli("simulate", "gpt2", "--size", "small", "--cluster", "k80x2", "--plan", "zero2+recompute")
    assert r.returncode == 0, r.stderr
    assert "plan: zero2 over 2 GPUs (gpu0, gpu1), 2 micro-batches, recompute" in r.stdout
    assert "(simulated)" in r.stdout and "reduce-scatter" in r.stdout


@pytest.mark.parametrize(("args", "words"), [
    (["--plan", "ddp+"], "only '+recompute'"),
    (["--plan", "zero3"], "unknown plan 'zero3'"),
    (["--plan", "ddp:m=3"], "m=3 is not a multiple of its 2 replicas"),
    (["--plan", "ddp:m=4"], "pick m dividing 2"),
    (["--plan", "ddp:dp=3"], "dp=3 needs 3 GPUs"),
    (["--plan", "ddp", "--pin", "^mm$=gpu1"], "--pin puts it on gpu1"),
    (["--plan", "ddp", "--exclude", "gpu0", "--exclude", "gpu1"], "no GPU left"),
    (["--plan", "ddp", "--placement", "single:gpu0"], "exactly one of --placement"),
    (["--plan", "ddp", "--microbatches", "2"], "write the count into the plan"),
])  # fmt: skip
def test_bad_plans_are_one_line(args, words, capsys):
    line = cli_error(["simulate", "gpt2", "--size", "small", "--cluster", "k80x2", *args], capsys)
    assert words in line, line
