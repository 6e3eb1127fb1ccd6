"""Issue 34 item 16: a run's settings are one frozen, typed object, checked once where they enter
(``place``'s arguments or ``run.json``) and written back byte-equal; the api's modules share them
through public names only."""

from __future__ import annotations

import ast
import dataclasses
import json
from pathlib import Path

import pytest

import postplace
from postplace.api.settings import SETTINGS, RunSettings, read_settings, write_settings
from postplace.errors import PostplaceError
from postplace.graph import OpGraph
from postplace.search.checkpoint import read_meta


def chain():
    return OpGraph.build(["a", "b", "c"], [(0, 1, 1e6), (1, 2, 1e6)], flops=[1e9, 4e9, 1e9], name="chain")


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    out = tmp_path_factory.mktemp("typed") / "run"
    postplace.place(chain(), "k80x2", budget=48, groups=None, pins=["a=gpu1"], out=out, report=False)
    return out


def test_settings_read_back_equal_what_was_written(run, tmp_path):
    s = read_settings(run)
    assert isinstance(s, RunSettings) and s.pins == ("a=gpu1",) and s.budget == "48" and not s.over_m
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.budget = "96"  # type: ignore[misc]
    recorded = json.loads((run / SETTINGS).read_text())
    body = {k: v for k, v in recorded.items() if k not in ("checksum", "search_start")}
    assert s.to_json() == body  # every key, none added: the checkpoint's checksum is this body's
    assert read_meta(run)["settings_checksum"] == s.checksum()  # what resume checks the checkpoint against
    copy = tmp_path / "copy"
    copy.mkdir()
    write_settings(copy, s)
    assert read_settings(copy) == s


def test_an_extension_keeps_the_checksums_of_the_budgets_before(run):
    s = read_settings(run)
    once = s.extended("96")
    twice = once.extended("144")
    assert twice.budgets_before == ("48", "96") and twice.budget == "144"
    assert {s.checksum(), once.checksum(), twice.checksum()} == twice.accepted_checksums()
    assert s.extended("48") is s


def test_a_field_run_json_does_not_know_is_refused_in_one_line(run, tmp_path):
    from postplace.api.settings import _checksum

    d = json.loads((run / SETTINGS).read_text())
    d.pop("checksum")
    d["budgett"] = "96"
    d["checksum"] = _checksum(d)
    (tmp_path / SETTINGS).write_text(json.dumps(d))
    with pytest.raises(PostplaceError, match="unknown field 'budgett'") as err:
        read_settings(tmp_path)
    assert "\n" not in str(err.value)


def test_api_modules_share_only_public_names():
    """The api's modules import no underscored name from one another (21 did): what one module uses of
    another is that module's interface, and says so by its name."""
    api = Path(postplace.__file__).parent / "api"
    private = []
    for path in sorted(api.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("postplace.api"):
                private += [f"{path.name}: {node.module}.{a.name}" for a in node.names if a.name.startswith("_")]
    assert private == []


def test_no_module_imports_another_modules_private_names():
    """Across the whole package: a name one module uses of another is public (an underscored module, a
    package's private part such as ``postplace.report._html``, may be imported as a whole)."""
    import importlib

    root = Path(postplace.__file__).parent
    private = []
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if not (isinstance(node, ast.ImportFrom) and (node.module or "").startswith("postplace")):
                continue
            for alias in node.names:
                if not alias.name.startswith("_") or alias.name.startswith("__"):
                    continue
                try:
                    importlib.import_module(f"{node.module}.{alias.name}")  # a module: allowed
                except ImportError:
                    private.append(f"{path.relative_to(root)}: {node.module}.{alias.name}")
    assert private == []


def test_a_zoo_run_resumes_after_its_graph_is_traced_again(tmp_path, monkeypatch):
    """The graph's fingerprint leaves out how long tracing took: a run started with one graph cache resumes
    with another (a fresh trace: another trace_seconds), as it must after any change that re-traces; a
    folder that recorded the old, whole-metadata fingerprint still resumes on the very graph it traced."""
    from postplace.search.state_io import fingerprint, fingerprints
    from postplace.zoo import cached_graph

    monkeypatch.setenv("POSTPLACE_CACHE", str(tmp_path / "a"))
    first = cached_graph("rnnlm", "small")
    out = tmp_path / "run"
    postplace.place("rnnlm", "k80x2", size="small", budget=8, microbatches=1, out=out, report=False)
    monkeypatch.setenv("POSTPLACE_CACHE", str(tmp_path / "b"))
    again = cached_graph("rnnlm", "small")
    assert again.metadata["trace_seconds"] != first.metadata["trace_seconds"]
    assert fingerprint(again) == fingerprint(first) == read_settings(out).graph_sha
    assert postplace.resume(out, budget=16, report=False).summary["samples"] == 16
    legacy = fingerprints(first) - {fingerprint(first)}
    assert len(legacy) == 1 and legacy != fingerprints(again) - {fingerprint(again)}


def test_grouped_arguments_given_where_they_do_not_apply_or_again_on_resume(run):
    """compare takes Step, not Measure; resume checks a Step or Measure field set away from its default
    against the recorded run, and names a recorded list as a list."""
    with pytest.raises(PostplaceError, match="Measure's fields do not apply to compare") as err:
        postplace.compare(chain(), "k80x2", confirm=2)
    assert "\n" not in str(err.value)
    with pytest.raises(PostplaceError, match="started with precision fp32, not bf16"):
        postplace.resume(run, step=postplace.Step(precision="bf16"))
    with pytest.raises(PostplaceError, match="started with evaluator 'simulator', not 'torch'"):
        postplace.resume(run, measure=postplace.Measure(evaluator="torch"))
    with pytest.raises(PostplaceError, match=r"started with pins \['a=gpu1'\], not \['b=gpu0'\]"):
        postplace.resume(run, pins=["b=gpu0"])
    with pytest.raises(PostplaceError, match="part of measure="):
        postplace.resume(run, confirm=2)
