"""Reports of runs at the edges: a search that found nothing that fits while a one-shot placer did; the
cluster a run recorded (its file, moved or changed since); step times past what a figure can draw."""

import json
import re

import numpy as np
import pytest

import postplace
from postplace.errors import PostplaceError
from postplace.graph import OpGraph
from postplace.report import write_report
from tests.clihelp import run_cli

# A CPU with room for everything and two GPUs too small for any one op: every placement that uses a GPU
# is OOM, so the random search (12 ops, 3 devices, 4 samples, seed 0) finds nothing that fits, while the
# single device (the CPU) and the one-shot placers that keep to it do.
CLUSTER_TOML = """
name = "tiny-gpus"
[[device]]
name = "cpu"
kind = "cpu"
model = "X"
peak_flops = 1e11
memory_bandwidth = 1e10
memory = 1e12
[[device]]
names = ["gpu0", "gpu1"]
kind = "gpu"
model = "G"
peak_flops = 1e12
memory_bandwidth = 1e11
memory = 1e6
[[switch]]
name = "sw"
[[link]]
a = "cpu"
b = "sw"
bandwidth = 1e10
latency = 1e-6
[[link]]
a = "gpu0"
b = "sw"
bandwidth = 1e10
latency = 1e-6
[[link]]
a = "gpu1"
b = "sw"
bandwidth = 1e10
latency = 1e-6
"""


def chain(n: int = 12) -> OpGraph:
    return OpGraph.build(
        [f"op{i}" for i in range(n)],
        [(i, i + 1, 1e6) for i in range(n - 1)],
        flops=[1e9] * n,
        bytes_accessed=[1e6] * n,
        output_bytes=[1e7] * n,
        persistent_bytes=[1e7] * n,
        name="chain",
    )


def no_feasible_sample(folder) -> bool:
    return all(
        json.loads(line)["oom"] or json.loads(line)["failed"]
        for line in (folder / "history.jsonl").read_text().splitlines()
    )


def test_a_search_with_no_feasible_sample_still_gets_its_report(tmp_path):
    (tmp_path / "c.toml").write_text(CLUSTER_TOML)
    out = tmp_path / "run"
    r = postplace.place(chain(), str(tmp_path / "c.toml"), strategy="random", budget=4, out=out, groups=None)
    assert no_feasible_sample(out) and r.summary["search_best_step_time_s"] is None
    assert (out / "placement.json").exists()  # a placer's answer
    path = write_report(out, graph=r.graph, cluster=r.cluster)
    assert path.exists() and (out / "curves_wall.png").exists() and (out / "curves_samples.png").exists()
    html = path.read_text()
    assert "no feasible sample" in html


def test_place_through_the_cli_writes_the_report_when_only_a_placer_fits(tmp_path):
    (tmp_path / "c.toml").write_text(CLUSTER_TOML)
    chain().save(tmp_path / "chain.json")
    r = run_cli(
        "place",
        "chain.json",
        "-c",
        "c.toml",
        "--strategy",
        "random",
        "--budget",
        "4",
        "--groups",
        "none",
        "--out",
        "run",
        cwd=tmp_path,
    )
    assert r.returncode == 0, r.stderr
    assert "internal error" not in r.stderr and "Traceback" not in r.stderr
    assert no_feasible_sample(tmp_path / "run")
    assert (tmp_path / "run" / "placement.json").exists() and (tmp_path / "run" / "report.html").exists()


# ------------------------------------------------------------------------------ the cluster a run recorded
def toml_run(tmp_path):
    """A finished run on a cluster TOML file (the fuzz's graph and cluster), no report yet."""
    from postplace.testing import fuzz

    (tmp_path / "c.toml").write_text(fuzz.base_cluster_toml())
    r = postplace.place(
        fuzz.base_graph(), str(tmp_path / "c.toml"), budget=40, groups=None, out=tmp_path / "run", report=False
    )
    return tmp_path / "run", r


def report_cli(argv, cwd):
    return run_cli("report", *argv, cwd=cwd)


def test_report_finds_the_cluster_file_the_run_recorded(tmp_path):
    run, r = toml_run(tmp_path)
    summary = json.loads((run / "summary.json").read_text())
    assert summary["cluster"] == "tiny"  # a name, no preset's: before, the report needed --cluster
    p = report_cli([str(run)], tmp_path)
    assert p.returncode == 0, p.stderr
    data = json.loads((run / "report.json").read_text())
    assert data["provenance"]["cluster"]["name"] == "tiny"
    assert [d["name"] for d in data["provenance"]["cluster"]["devices"]] == list(r.cluster.device_names)


def test_a_moved_cluster_file_is_one_line_naming_it_and_cluster_fixes_it(tmp_path):
    run, _ = toml_run(tmp_path)
    (tmp_path / "c.toml").rename(tmp_path / "moved.toml")
    with pytest.raises(PostplaceError) as exc:
        write_report(run)
    text = str(exc.value)
    assert "\n" not in text and str(tmp_path / "c.toml") in text and "no longer exists" in text, text
    assert "--cluster" in text and "run.json" in text
    p = report_cli([str(run)], tmp_path)
    assert p.returncode == 2 and p.stderr.startswith("error: ") and len(p.stderr.strip().splitlines()) == 1, p.stderr
    assert write_report(run, cluster=str(tmp_path / "moved.toml")).is_file()


def test_a_changed_cluster_file_is_not_drawn_as_the_runs(tmp_path):
    run, _ = toml_run(tmp_path)
    text = (tmp_path / "c.toml").read_text()
    assert text.count("bandwidth = 15750000000.0") == 3
    (tmp_path / "c.toml").write_text(text.replace("bandwidth = 15750000000.0", "bandwidth = 5e9", 1))  # a slower link
    with pytest.raises(PostplaceError, match="no longer the one the run used.*--cluster"):
        write_report(run)  # before this change a cluster file was never read back: nothing to compare
    assert write_report(run, cluster=str(tmp_path / "c.toml")).is_file()  # the user's explicit choice


def test_a_damaged_run_json_falls_back_to_the_summarys_cluster_name(tmp_path):
    run, _ = toml_run(tmp_path)
    (run / "run.json").write_text("{}")
    with pytest.raises(PostplaceError, match="cluster 'tiny' of the run: .*pass --cluster"):
        write_report(run)  # the summary records the name only
    preset = tmp_path / "p"
    postplace.place(chain(), "k80x2", budget=40, groups=None, out=preset / "run", report=False)
    (preset / "run" / "run.json").write_text("{}")
    assert write_report(preset / "run").is_file()  # a preset's name is enough


def test_a_preset_run_draws_from_its_record(tmp_path):
    postplace.place(chain(), "k80x2", budget=40, groups=None, out=tmp_path / "run", report=False)
    settings = json.loads((tmp_path / "run" / "run.json").read_text())
    assert settings["cluster_spec"] == "k80x2"
    path = write_report(tmp_path / "run")
    assert json.loads(path.with_name("report.json").read_text())["schedule"]["devices"] == ["cpu", "gpu0", "gpu1"]


def test_a_compare_on_a_cluster_file_draws_without_flags_and_a_changed_file_is_refused(tmp_path):
    from postplace.testing import fuzz

    (tmp_path / "c.toml").write_text(fuzz.base_cluster_toml())
    fuzz.base_graph().save(tmp_path / "g.json")
    postplace.compare(
        str(tmp_path / "g.json"),
        str(tmp_path / "c.toml"),
        strategies="single,random",
        budget=8,
        seeds=1,
        out=tmp_path / "cmp",
    )
    rep = json.loads((tmp_path / "cmp" / "compare.json").read_text())
    assert rep["cluster"] == "tiny" and rep["cluster_spec"] == str(tmp_path / "c.toml")
    p = report_cli([str(tmp_path / "cmp")], tmp_path)  # before: "cluster 'tiny' of the run: ... pass --cluster"
    assert p.returncode == 0, p.stderr
    data = json.loads((tmp_path / "cmp" / "report.json").read_text())
    assert data["provenance"]["cluster"]["name"] == "tiny"
    text = (tmp_path / "c.toml").read_text()
    (tmp_path / "c.toml").write_text(text.replace("bandwidth = 15750000000.0", "bandwidth = 5e9", 1))
    with pytest.raises(PostplaceError, match="compare.json: the cluster .* no longer the one the run used"):
        write_report(tmp_path / "cmp")


def test_an_edited_target_in_the_summary_does_not_override_the_checksummed_run_json(tmp_path):
    run, r = toml_run(tmp_path)
    other = tmp_path / "other.json"
    OpGraph.build(["x", "y"], [(0, 1, 1e6)], flops=[1e9, 1e9], name="other").save(other)
    summary = json.loads((run / "summary.json").read_text())
    summary["target_spec"] = {"kind": "file", "path": str(other)}
    (run / "summary.json").write_text(json.dumps(summary))
    path = write_report(run)  # before: drawn from other.json, or refused because its ops differ
    assert json.loads(path.with_name("report.json").read_text())["provenance"]["graph"]["name"] == r.graph.name


# ------------------------------------------------------------------------------ step times past what a figure draws
def test_a_simulated_step_past_what_a_figure_draws_is_one_line(tmp_path):
    """A graph and cluster whose step takes 1e306 s: the Gantt chart's axis overflowed (1e309 ms)."""
    from postplace.testing import fuzz

    run, _ = toml_run(tmp_path)
    huge = fuzz.base_graph().to_dict()
    huge["ops"]["flops"] = [f / 4e9 * 1e300 for f in huge["ops"]["flops"]]
    (tmp_path / "huge.json").write_text(json.dumps(huge))
    slow = re.sub(r"peak_flops = .*", "peak_flops = 1e-6", fuzz.base_cluster_toml())
    (tmp_path / "slow.toml").write_text(slow)
    with pytest.raises(PostplaceError) as exc:
        write_report(run, graph=str(tmp_path / "huge.json"), cluster=str(tmp_path / "slow.toml"))
    text = str(exc.value)
    assert "\n" not in text and "simulated step" in text and "1e+300" in text and "graph 'tiny'" in text, text


# ------------------------------------------------------------------------------ issue 34 item 12
def test_cluster_naming_another_machine_than_the_runs_is_one_line(tmp_path):
    """Before: ``report --cluster dgx8`` on a run made on another machine drew its placement there."""
    run, r = toml_run(tmp_path)
    with pytest.raises(PostplaceError) as exc:
        write_report(run, cluster="dgx8")
    text = str(exc.value)
    assert "\n" not in text and "--cluster dgx8" in text and ", ".join(r.cluster.device_names) in text, text
    assert not (run / "report.html").exists()


@pytest.mark.parametrize("text", ["[" * 200_000 + "]" * 200_000, '{"returned": ' + "9" * 5000 + "}"])
def test_a_run_folder_file_past_any_written_one_is_one_line(tmp_path, text):
    """Before: nesting deeper than Python's recursion limit (RecursionError) and an integer of 5,000
    digits (ValueError) ended the report in a traceback."""
    run, _ = toml_run(tmp_path)
    (run / "summary.json").write_text(text)
    with pytest.raises(PostplaceError) as exc:
        write_report(run)
    assert "\n" not in str(exc.value) and "summary.json" in str(exc.value)


@pytest.mark.parametrize("name", ["", ".", "checkpoint-0.npz\x00", "../checkpoint-1234abcd.npz", "other.npz"])
def test_a_checkpoints_arrays_file_name_is_the_one_it_writes(tmp_path, name):
    """Before: an empty name, '.' or a NUL in it raised ValueError from pathlib (a traceback)."""
    from postplace.search.state_io import load_state, save_state

    path = tmp_path / "checkpoint.json"
    save_state(path, {"x": np.arange(3)})
    assert (load_state(path)["x"] == np.arange(3)).all()
    head = json.loads(path.read_text())
    head["arrays"] = name
    path.write_text(json.dumps(head))
    with pytest.raises(PostplaceError, match="arrays file"):
        load_state(path)
