"""The code is as ``ruff format`` writes it (issue 34 item 18): one style, kept by the formatter rather
than by hand, with no formatter-skip marker left to hold a line apart."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CODE = ["src", "tests", "benchmarks"]


def _ruff() -> list[str]:
    exe = shutil.which("ruff")
    if exe is None:
        pytest.skip("ruff is not installed (pip install -e '.[test]')")
    return [exe]


def test_the_code_is_as_ruff_format_writes_it():
    done = subprocess.run([*_ruff(), "format", "--check", *CODE], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr


def test_no_line_is_held_apart_from_the_formatter():
    markers = ("fmt: " + "skip", "fmt: " + "off")  # spelled apart, so this file holds no marker itself
    held = [
        f"{path.relative_to(ROOT)}:{i}"
        for folder in CODE
        for path in sorted((ROOT / folder).rglob("*.py"))
        for i, line in enumerate(path.read_text().splitlines(), 1)
        if any(m in line for m in markers)
    ]
    assert held == []


def test_lint_is_clean():
    done = subprocess.run([*_ruff(), "check", *CODE], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
