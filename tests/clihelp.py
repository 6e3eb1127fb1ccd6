"""Run the CLI in-process: its exit status and output as a subprocess would give them, without the
seconds each new Python process spends importing torch, scipy and numba; and insist a bad input is one
error line with exit status 2."""

import contextlib
import io
import json
import os
import subprocess
import sys
import warnings

import pytest


def run_cli(*args, cwd=None) -> subprocess.CompletedProcess:
    """``postplace ARGS`` through the CLI's ``main`` in this process, from ``cwd``: a CompletedProcess with
    the exit status ``main`` ends with (0 when it returns) and what it printed to stdout and stderr."""
    from postplace.cli import main

    out, err = io.StringIO(), io.StringIO()
    argv, here, shown = sys.argv, os.getcwd(), warnings.showwarning
    code = 0
    try:
        sys.argv = ["postplace", *map(str, args)]
        if cwd is not None:
            os.chdir(cwd)
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                main()
            except SystemExit as exc:
                code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    finally:
        sys.argv, warnings.showwarning = argv, shown
        os.chdir(here)
    return subprocess.CompletedProcess(["postplace", *map(str, args)], code, out.getvalue(), err.getvalue())


def cli_error(argv, capsys) -> str:
    from postplace.cli import main

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr("sys.argv", ["postplace", *argv])
        with pytest.raises(SystemExit) as ex:
            main()
    assert ex.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: "), err
    return err[0]


def plan_run_folder(path, plan: str, cluster: str = "k80x2"):
    """A run folder as ``postplace place`` leaves it for GPT-2 (small, AdamW) whose returned plan is ``plan``:
    what ``postplace launch RUN_FOLDER`` reads (summary.json's target and plan, run.json's cluster, a
    placement.json)."""
    path.mkdir()
    target = {"kind": "zoo", "name": "gpt2", "size": "small", "optimizer": "adamw"}
    (path / "summary.json").write_text(json.dumps({"target_spec": target, "returned_plan": plan}))
    (path / "run.json").write_text(json.dumps({"cluster_spec": cluster}))
    (path / "placement.json").write_text("{}")
    return path
