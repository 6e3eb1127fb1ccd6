"""Issue 34 item 1: a run over several micro-batch counts extends to a larger budget (``resume(out, budget=N)``,
``place --resume DIR --budget N``), the budget shared out by the run's own rule, every earlier sample kept."""

from __future__ import annotations

import json

import pytest

import postplace
from postplace.api.over_m import halving_rounds
from postplace.errors import PostplaceError
from tests.clihelp import cli_error, run_cli

MODEL, CLUSTER = "gpt2", "k80x2"  # small size: batch 2, so m in {1, 2}: rounds [2, 1]


def _shares(budget: int, rounds: list[list[int]]) -> dict[str, int]:
    """Each count's samples under the halving rule (module docstring of postplace.api.over_m), written out
    apart: round r gives each count still in ``budget // (R * len(kept))`` more."""
    got = {}
    for kept in rounds:
        for m in kept:
            got[str(m)] = got.get(str(m), 0) + budget // (len(rounds) * len(kept))
    return got


def _histories(out) -> dict[str, list[str]]:
    return {p.parent.name: p.read_text().splitlines() for p in sorted(out.glob("m*/history.jsonl"))}


@pytest.fixture(scope="module")
def extended(tmp_path_factory):
    out = tmp_path_factory.mktemp("extend") / "run"
    first = postplace.place(MODEL, CLUSTER, size="small", budget=96, groups=32, out=out, report=False)
    before = _histories(out)
    plans = json.loads((out / "plans.json").read_text())
    again = postplace.resume(out, budget=192, report=False)
    return out, first, before, plans, again


def test_resume_extends_a_run_over_m_to_the_new_budget_keeping_every_sample(extended):
    out, first, before, plans, again = extended
    rounds = first.summary["halving_rounds"]
    assert len(rounds) == len(halving_rounds(2)) and rounds[0] == [1, 2]
    assert first.summary["samples_per_microbatches"] == _shares(96, rounds)
    # the new budget shared out as the run's own rule shares it, over the rounds it decided
    assert again.summary["samples"] == 192
    assert again.summary["samples_per_microbatches"] == _shares(192, rounds)
    assert again.summary["halving_rounds"] == rounds
    assert json.loads((out / "plans.json").read_text()) == plans
    # every earlier sample kept: each count's history starts with its earlier lines, unchanged
    after = _histories(out)
    assert sorted(after) == sorted(before) == ["m1", "m2"]
    for m, lines in before.items():
        assert after[m][: len(lines)] == lines
        assert len(after[m]) == again.summary["samples_per_microbatches"][m[1:]] > len(lines)
    # the answer is no worse, and the search's own best no worse at any count
    assert again.step_time_s <= first.step_time_s
    for m, v in first.summary["best_per_microbatches"].items():
        assert again.summary["best_per_microbatches"][m] <= v
    settings = json.loads((out / "run.json").read_text())
    assert settings["budget"] == "192" and settings["budgets_before"] == ["96"]
    assert json.loads((out / "summary.json").read_text())["samples"] == 192


def test_an_extended_run_resumes_again_and_extends_again_through_the_cli(extended, tmp_path):
    import shutil

    out, _, _, _, again = extended
    copy = tmp_path / "copy"
    shutil.copytree(out, copy)
    same = postplace.resume(copy, report=False)  # nothing left to do: the same answer
    assert same.summary["samples"] == 192 and same.step_time_s == again.step_time_s
    done = run_cli("place", "--resume", copy, "--budget", "384", "--json")
    assert done.returncode == 0, done.stderr
    s = json.loads((copy / "summary.json").read_text())
    assert s["samples"] == 384 and s["samples_per_microbatches"] == _shares(384, s["halving_rounds"])
    assert s["best_step_time_s"] <= again.step_time_s


def test_an_extension_below_the_budget_or_in_other_units_is_one_line(extended, tmp_path, capsys):
    import shutil

    out = extended[0]
    copy = tmp_path / "copy"
    shutil.copytree(out, copy)
    assert "give at least that much" in cli_error(["place", "--resume", str(copy), "--budget", "100"], capsys)
    assert "extend it in samples" in cli_error(["place", "--resume", str(copy), "--budget", "60s"], capsys)
    with pytest.raises(PostplaceError, match="was given 192"):
        postplace.resume(copy, budget=150, report=False)
    assert json.loads((copy / "run.json").read_text())["budget"] == "192"  # a refused extension writes nothing


def test_an_interrupted_extension_resumes_to_the_extended_budget(tmp_path, monkeypatch):
    import postplace.search as search

    out = tmp_path / "run"
    postplace.place(MODEL, CLUSTER, size="small", budget=96, groups=32, out=out, report=False)
    real, calls = search.run, []

    def stop_in_round_two(*a, **k):  # the extension's third search call (round 2's) is interrupted before it starts
        calls.append(1)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return real(*a, **k)

    monkeypatch.setattr(search, "run", stop_in_round_two)
    with pytest.raises(KeyboardInterrupt):
        postplace.resume(out, budget=192, report=False)
    monkeypatch.setattr(search, "run", real)
    r = postplace.resume(out, report=False)  # the recorded (extended) budget, its checkpoints accepted
    assert r.summary["samples"] == 192 and r.summary["budget"] == "192"


def test_a_run_without_a_folder_answers_as_the_same_run_with_one(extended, tmp_path, monkeypatch):
    """Without ``out`` each count's search still continues from round to round (from a scratch folder, then
    removed): a search started again at every round cut its batches elsewhere, so the same seed answered
    differently (ResNet-50 on k80x4: 108.868 ms without a folder, 109.050 ms with one)."""
    _, first, _, _, _ = extended
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))
    bare = postplace.place(MODEL, CLUSTER, size="small", budget=96, groups=32, report=False)
    for key in ("search_best_step_time_s", "search_best_sample", "samples_per_microbatches", "best_per_microbatches"):
        assert bare.summary[key] == first.summary[key], key
    assert bare.step_time_s == first.step_time_s
    assert list(tmp_path.iterdir()) == []  # the scratch folder is gone
