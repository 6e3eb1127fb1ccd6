"""Run folders through the CLI: data not pickle, resume from anywhere, extend, refuse damage and changed flags."""

import json
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from postplace.graph import OpGraph
from tests.clihelp import run_cli
from tests.test_cli import assert_one_error_line


def run(*args, cwd=None):
    """The CLI in this process (tests/clihelp.py); the Ctrl-C test below runs its own process."""
    return run_cli(*args, cwd=cwd)


@pytest.fixture
def work(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    g = OpGraph.build(
        ["a", "b", "c"],
        [(0, 1, 1e6), (1, 2, 1e6)],
        flops=[1e9, 2e9, 1e9],
        bytes_accessed=[1e6] * 3,
        output_bytes=[1e6] * 3,
        persistent_bytes=[4e6, 0, 0],
        colocation=[0, -1, 0],
        name="tiny",
    )
    g.save(tmp_path / "a" / "tiny.json")
    return tmp_path


def place(work, *args, out="run", budget="96"):
    return run(
        "place",
        "tiny.json",
        "-c",
        "k80x2",
        "--budget",
        budget,
        "--out",
        str(work / out),
        "--json",
        *args,
        cwd=work / "a",
    )


def lines(path):
    return path.read_text().splitlines()


def test_data_not_pickle_resume_from_another_directory_and_extend(work):
    r = place(work)
    assert r.returncode == 0, r.stderr
    folder = work / "run"
    assert not list(folder.glob("*.pkl"))
    settings = json.loads((folder / "run.json").read_text())
    assert settings["target"]["path"] == str(work / "a" / "tiny.json")  # resolved, not as typed
    ck = json.loads((folder / "checkpoint.json").read_text())
    with np.load(folder / ck["arrays"], allow_pickle=False) as z:
        assert len(z.files) > 0
    # resume from elsewhere, extending the finished run to 144 samples
    r2 = run("place", "--resume", str(folder), "--budget", "144", "--json", cwd=work / "b")
    assert r2.returncode == 0, r2.stderr
    s = json.loads(r2.stdout)
    assert s["samples"] == 144 and len(lines(folder / "history.jsonl")) == 144
    assert [json.loads(x)["sample"] for x in lines(folder / "history.jsonl")] == list(range(144))
    assert json.loads((folder / "run.json").read_text())["budget"] == "144"


def test_resume_refuses_changed_flags_and_damage(work):
    import postplace
    from postplace.errors import PostplaceError

    assert place(work).returncode == 0
    folder = work / "run"
    assert_one_error_line(run("place", "--resume", str(folder), "--seed", "4"), "seed", "drop the flag")
    for given, fragment in [
        ({"seed": 4}, "seed"),
        ({"config": {"lr": "0.2"}}, "lr=0.1"),
        ({"budget": 10}, "already has 96 samples"),
        ({"strategy": "ce"}, "strategy"),
    ]:
        with pytest.raises(PostplaceError, match=fragment):
            postplace.resume(folder, **given)

    def damaged(fragment, where=folder):
        with pytest.raises(PostplaceError, match=fragment):
            postplace.resume(where)

    ck = json.loads((folder / "checkpoint.json").read_text())
    npz = folder / ck["arrays"]
    data = bytearray(npz.read_bytes())
    data[len(data) // 2] ^= 0xFF  # a flipped byte in the arrays
    npz.write_bytes(bytes(data))
    damaged("checksum")
    ck["body"]["runner"]["samples"] = 5  # an edited checkpoint body
    (folder / "checkpoint.json").write_text(json.dumps(ck))
    assert_one_error_line(run("place", "--resume", str(folder)), "checksum")
    settings = json.loads((folder / "run.json").read_text())
    settings["seed"] = 5  # an edited settings file
    (folder / "run.json").write_text(json.dumps(settings))
    damaged("checksum")
    (work / "junk").mkdir()
    damaged("not a postplace run folder", work / "junk")
    (work / "junk" / "run.json").write_text('{"format": 1}')
    damaged("not a postplace run settings file", work / "junk")
    (work / "junk" / "run.json").write_bytes(b"\xff\xfe{")
    damaged("damaged run settings", work / "junk")


def test_short_history_is_an_error(work):
    assert place(work).returncode == 0
    hist = work / "run" / "history.jsonl"
    hist.write_text("\n".join(lines(hist)[:10]) + "\n")
    assert_one_error_line(run("place", "--resume", str(work / "run")), "shorter", "damaged")
    assert b"\0" not in hist.read_bytes()


def test_killed_before_the_first_checkpoint_starts_over(work):
    assert place(work).returncode == 0
    folder = work / "run"
    for f in [folder / "checkpoint.json", *folder.glob("checkpoint-*.npz"), folder / "placement.json"]:
        f.unlink()
    (folder / "history.jsonl").write_text('{"sample": 0}\n')  # a partial line from the killed run
    r = run("place", "--resume", str(folder), "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["samples"] == 96 and len(lines(folder / "history.jsonl")) == 96


# The interrupted run: the CLI with the runner's batch step wrapped so that, once ``at`` samples are done,
# it writes ``ready`` and waits (sleeping) for the test's Ctrl-C. The run cannot finish before the signal,
# however loaded the machine, and it is cut at the same sample every time.
_BLOCKED_PLACE = """
import faulthandler, pathlib, signal, sys, time
faulthandler.register(signal.SIGUSR1)  # the test asks for every thread's stack when the run does not stop
# Ctrl-C as a terminal gives it: under the parallel suite the worker that starts this process may pass
# on SIGINT ignored or blocked (the run then slept on for 120 s after the signal, at load 4)
signal.signal(signal.SIGINT, signal.default_int_handler)
signal.pthread_sigmask(signal.SIG_UNBLOCK, [signal.SIGINT])
import postplace.search.runner as runner
ready, at = pathlib.Path(sys.argv[1]), int(sys.argv[2])
one_batch, blocked = runner._one_batch, []

def blocking(strategy, evaluator, state, history, placements):
    one_batch(strategy, evaluator, state, history, placements)
    if state.samples >= at and not blocked:
        blocked.append(state.samples)
        ready.write_text(str(state.samples))
        while True:
            time.sleep(0.5)

runner._one_batch = blocking
sys.argv = ["postplace", *sys.argv[3:]]
from postplace.cli import main
main()
"""


def test_ctrl_c_exits_non_zero_and_the_resumed_run_equals_an_uninterrupted_one(work):
    budget, cut_at = 2000, 1000  # cut past a checkpoint (every 240 samples), between two of them
    args = ["place", "tiny.json", "-c", "k80x2", "--budget", str(budget), "--json", "--no-report", "--out"]
    ready = work / "ready"
    proc = subprocess.Popen(
        [sys.executable, "-c", _BLOCKED_PLACE, str(ready), str(cut_at), *args, str(work / "cut")],
        cwd=work / "a",
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 120
        while not ready.exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert ready.exists(), f"the run never reached sample {cut_at}: {proc.poll()=}"
        assert proc.poll() is None  # blocked: it cannot have finished
        proc.send_signal(signal.SIGINT)
        try:
            _, err = proc.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGUSR1)
            time.sleep(2)
            proc.kill()
            pytest.fail(f"the run did not stop within 120 s of Ctrl-C; its threads:\n{proc.communicate()[1]}")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 130, err
    assert "interrupted" in err and "--resume" in err and "Traceback" not in err
    assert not (work / "cut" / "placement.json").exists()  # an incomplete run writes no answer
    ck = json.loads((work / "cut" / "checkpoint.json").read_text())
    assert 0 < ck["body"]["runner"]["samples"] < cut_at  # saved on Ctrl-C: the last batch before the cut
    resumed = run("place", "--resume", str(work / "cut"), "--json", "--no-report")
    assert resumed.returncode == 0, resumed.stderr
    whole = run(*args, str(work / "whole"), cwd=work / "a")
    assert whole.returncode == 0, whole.stderr
    a, b = json.loads(resumed.stdout), json.loads(whole.stdout)
    assert a["samples"] == b["samples"] == budget and a["search_best_step_time_s"] == b["search_best_step_time_s"]
    assert lines(work / "cut" / "history.jsonl") == lines(work / "whole" / "history.jsonl")


def test_time_budget_and_its_resume(work):
    r = place(work, budget="1s")
    assert r.returncode == 0, r.stderr
    first = json.loads(r.stdout)
    assert first["budget"] == "1s" and first["samples"] > 0 and first["wall_time_s"] >= 1.0
    r2 = run("place", "--resume", str(work / "run"), "--budget", "2s", "--json")
    assert r2.returncode == 0, r2.stderr
    second = json.loads(r2.stdout)
    assert second["samples"] > first["samples"] and second["wall_time_s"] >= 2.0


def test_set_and_config_file(work):
    assert_one_error_line(place(work, "--set", "lr=nan", out="x"), "lr", "finite")
    (work / "c.toml").write_text("[post]\nlr = 0.05\nbatch_size = 24\nce_every = 240\n")
    r = place(work, "--config", str(work / "c.toml"), "--set", "lr=0.02", out="cfg")
    assert r.returncode == 0, r.stderr
    cfg = json.loads((work / "cfg" / "run.json").read_text())["config"]
    assert (cfg["lr"], cfg["batch_size"], cfg["ce_every"], cfg["clip"]) == (0.02, 24, 240, 0.1)
    assert json.loads(r.stdout)["config"] == cfg


def test_pin_exclude_and_warm_start_through_the_cli(work):
    r = place(work, "--pin", "^b$=gpu1", "--exclude", "gpu0", "--warm-start", "m-etf", "--groups", "none", out="pin")
    assert r.returncode == 0, r.stderr
    s = json.loads(r.stdout)
    placement = json.loads((work / "pin" / "placement.json").read_text())
    assert placement["b"] == "gpu1" and "gpu0" not in placement.values()
    assert "warm-start:m-etf" in s["candidates"] and s["returned"] in s["candidates"]
    assert_one_error_line(place(work, "--warm-start", "single:gpu0", "--exclude", "gpu0", out="bad"), "forbid")


def test_a_flipped_byte_in_the_history_the_checkpoint_covers_is_refused(tmp_path):
    """The checkpoint records a hash of the history it covers: a resume of a folder whose history was
    changed inside that span (here one byte, made non-UTF-8) is one clear error, not a silent resume."""
    import postplace
    from postplace.errors import PostplaceError
    from tests.test_runner import problem

    p = problem()
    out = tmp_path / "run"
    postplace.place(p.graph, p.cluster, budget=48, out=out, groups=None)
    hist = out / "history.jsonl"
    data = bytearray(hist.read_bytes())
    data[10] = 0xFF
    hist.write_bytes(bytes(data))
    with pytest.raises(PostplaceError, match="not the ones the checkpoint recorded"):
        postplace.resume(out, budget=96, cluster=p.cluster, graph=p.graph)
