"""What ``benchmarks/fuzz_cli.py`` found over the families added since its first version (issue 22), one
test per finding, each failing before its fix: run folders edited with their checksums recomputed,
workload files with numbers past 64 bits and machines of a million devices, ``--ray`` at an address
nothing listens at, ``--set``/``--config`` values that exhaust memory or time, ``simulate
--microbatches 0``. Every bad input must end as one error line, quickly."""

import json
import random
import shutil
import sys
import time

import numpy as np
import pytest

import postplace
from postplace.errors import PostplaceError
from postplace.testing import fuzz
from postplace.testing.fuzz import Edit


# ------------------------------------------------------------------------------------ helpers
@pytest.fixture(scope="module")
def template(tmp_path_factory):
    """A finished tiny run (the fuzz's base graph and cluster, 48 samples, op level)."""
    root = tmp_path_factory.mktemp("tpl")
    fuzz.base_graph().save(root / fuzz.GRAPH)
    (root / fuzz.CLUSTER).write_text(fuzz.base_cluster_toml())
    postplace.place(
        str(root / fuzz.GRAPH), str(root / fuzz.CLUSTER), budget=48, groups=None, out=root / "run", report=False
    )
    return root


@pytest.fixture
def run(template, tmp_path):
    shutil.copytree(template, tmp_path / "t")
    return tmp_path / "t" / "run"


def edited(run, *edits) -> None:
    for e in edits:
        fuzz.apply_edit(run, e, random.Random(0))


def refused(run, *words) -> str:
    with pytest.raises(PostplaceError) as exc:
        postplace.resume(run, report=False)
    text = str(exc.value)
    assert "\n" not in text and all(w in text for w in words), text
    return text


def cli(argv, tmp_path, monkeypatch, capsys) -> tuple[int, str]:
    from postplace.cli import main

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "argv", ["postplace", *argv])
    with pytest.raises(SystemExit) as ex:
        main()
        raise SystemExit(0)
    return ex.value.code, capsys.readouterr().err


def workload(tmp_path, **changes):
    d = fuzz.base_workload()
    for key, value in changes.items():
        if key.startswith("node_"):
            d["nodes"][1][key[5:]] = value
        else:
            d[key] = value
    p = tmp_path / "w.json"
    p.write_text(json.dumps(d))
    return p


# ------------------------------------------------------------------------------------ run folders
def test_the_template_resumes(run):
    assert postplace.resume(run, report=False).summary["samples"] == 48


@pytest.mark.parametrize(
    ("path", "value", "words"),
    [
        ("seed", "0", ["'seed'", "integer"]),
        ("seed", -1, ["'seed'"]),
        ("groups", 0, ["'groups'"]),
        ("budget", 48, ["'budget'", "text"]),
        ("version", 2, ["'version'"]),
        ("microbatches", 3, ["'microbatches'"]),
        ("microbatches", "auto", ["'microbatches'"]),
        ("pins", "conv=gpu0", ["'pins'"]),
        ("target", None, ["'target'"]),
        ("graph_sha", 3, ["'graph_sha'"]),
        ("microbatch_colocation", "x", ["'microbatch_colocation'"]),
    ],
)
def test_run_json_fields_are_checked_even_with_a_valid_checksum(run, path, value, words):
    edited(run, Edit("run.json", "set", path, value))
    refused(run, "run.json", *words)


@pytest.mark.parametrize(("path", "value"), [("seed", 7), ("config.lr", 0.05), ("strategy", "ce")])
def test_a_checkpoint_written_under_other_settings_is_not_continued(run, path, value):
    """A checksum-valid run.json whose seed changed would continue the old seed's checkpoint (over
    another grouping) as if it were the new one's: a silently wrong answer before."""
    edited(run, Edit("run.json", "set", path, value))
    refused(run, "other settings")


def test_a_budget_extension_killed_before_its_first_checkpoint_still_resumes(run):
    from postplace.api.settings import read_settings, write_settings

    write_settings(run, read_settings(run).extended("96"))  # what an extension writes first
    assert postplace.resume(run, report=False).summary["samples"] == 96
    assert postplace.resume(run, budget=120, report=False).summary["samples"] == 120


@pytest.mark.parametrize(
    ("path", "value", "words"),
    [
        ("runner.best_step_time", 0.0, ["best placement"]),  # before: returned as a 0 s search best
        ("runner.best_step_time", 1e-9, ["best placement"]),
        ("runner.samples", 0, ["runner"]),
        ("runner.elapsed", 1e308, ["elapsed"]),
        ("runner.history_bytes", 2**70, ["history_bytes"]),
        ("strategy.config.lr", -1, ["config differs"]),
        ("strategy.name", "random", ["strategy 'random'"]),
        ("strategy.adam.t", "x", ["adam.t"]),
        ("cache_reasons", [3] * 30, ["cache_reasons"]),
        ("", [], ["not a search checkpoint"]),  # before: AttributeError
        ("", None, ["not a search checkpoint"]),
    ],
)
def test_checkpoint_fields_are_checked_even_with_a_valid_checksum(run, path, value, words):
    edited(run, Edit("checkpoint.json", "set", path, value))
    refused(run, "checkpoint.json", *words)


@pytest.mark.parametrize(
    ("path", "how"),
    [
        ("strategy.recent.0.0", "nan"),
        ("strategy.recent.0.0", "str"),
        ("strategy.recent.0.0", "huge"),
        ("strategy.recent.0.0", "shorter"),
        ("strategy.logits", "nan"),
        ("runner.best_placement", "other"),
        ("cache_keys", "huge"),
    ],
)
def test_checkpoint_arrays_are_checked_even_with_a_valid_checksum(run, path, how):
    edited(run, Edit("checkpoint.json", "npz", path, how))
    refused(run, "checkpoint.json")


def test_a_history_line_removed_with_its_digest_recomputed_is_damage(run):
    import hashlib

    lines = (run / "history.jsonl").read_bytes().splitlines(keepends=True)
    kept = b"".join(lines[:3] + lines[4:])  # sample 3 gone, the checkpoint's byte count and digest made to fit
    (run / "history.jsonl").write_bytes(kept)
    edited(
        run,
        Edit("checkpoint.json", "set", "runner.history_bytes", len(kept)),
        Edit("checkpoint.json", "set", "history_digest", hashlib.blake2b(kept, digest_size=16).hexdigest()),
    )
    refused(run, "history.jsonl", "47 lines", "48 samples")


def test_plans_counts_must_be_integers():
    from postplace.api.over_m import read_plans

    def plans(tmp, counts):
        (tmp / "plans.json").write_text(json.dumps({"format": "postplace-plans", "counts": counts, "rounds": [[1, 2]]}))
        return read_plans(tmp, [1, 2], [2, 1])

    import tempfile
    from pathlib import Path

    tmp = Path(tempfile.mkdtemp())
    assert plans(tmp, [1, 2]) == [[1, 2]]
    for counts in ([1, 2.0], [True, 2]):
        with pytest.raises(PostplaceError, match="plans.json"):
            plans(tmp, counts)


def test_a_run_over_m_whose_plans_file_was_deleted_is_refused(tmp_path):
    """Found by the fuzz (zoo run folder, plans.json deleted): resume redid the halving from round 1 over
    searches that had run further, and answered (rc 0)."""
    out = tmp_path / "run"
    postplace.place(*fuzz.ZOO[:1], "k80x2", size="small", budget=16, out=out, report=False)
    assert (out / "m2" / "history.jsonl").exists()
    (out / "plans.json").unlink()
    with pytest.raises(PostplaceError) as exc:
        postplace.resume(out, report=False)
    text = str(exc.value)
    assert "\n" not in text and "plans.json: missing" in text and "m1, m2" in text, text


def test_read_meta_of_a_checkpoint_whose_meta_is_not_an_object(run):
    from postplace.search.checkpoint import read_meta

    edited(run, Edit("checkpoint.json", "set", "meta", "x"))
    with pytest.raises(PostplaceError, match="meta"):
        read_meta(run)  # before: AttributeError in the answer path's check of each m folder


# ------------------------------------------------------------------------------------ workload files
@pytest.mark.parametrize(
    "change",
    [
        {"node_size": 10**30},
        {"node_id": 10**30},
        {"node_colorClass": 10**30},
        {"maxFPGAs": 10**30},
        {"maxSizePerFPGA": 1e308},
    ],
)
def test_workload_numbers_past_64_bits_or_float_sense_are_one_line(tmp_path, change):
    from postplace.graph import load_graph

    with pytest.raises(PostplaceError) as exc:  # before: TypeError from numpy on a 31-digit integer
        load_graph(workload(tmp_path, **change))
    assert "\n" not in str(exc.value)


@pytest.mark.parametrize("machine", [{"maxFPGAs": 10**6}, {"maxCPUs": 10**6}, {"maxFPGAs": 100, "maxCPUs": 100}])
def test_a_workload_claiming_a_million_devices_is_refused_at_once(tmp_path, machine):
    from postplace.cluster.from_workload import resolve_cluster
    from postplace.graph import load_graph

    g = load_graph(workload(tmp_path, **machine))
    t0 = time.perf_counter()
    with pytest.raises(PostplaceError, match="up to 128 devices"):  # before: hours building the routes
        resolve_cluster("workload:k80x4", g)
    assert time.perf_counter() - t0 < 2


def test_a_graph_files_own_machine_is_checked(tmp_path):
    from postplace.cluster.from_workload import resolve_cluster
    from postplace.graph import OpGraph

    g = OpGraph.build(["a", "b"], [(0, 1, 1.0)], flops=[1e9, 1e9], metadata={"max_accelerators": "2"})
    with pytest.raises(PostplaceError, match="max_accelerators"):
        resolve_cluster("workload:k80x2", g)


# ------------------------------------------------------------------------------------ flags
def test_ray_at_an_address_nothing_listens_at_fails_in_seconds():
    from postplace.distributed.ray_evaluator import check_address, parse_address

    t0 = time.perf_counter()
    with pytest.raises(PostplaceError, match="no Ray cluster answers at 127.0.0.1:1"):
        check_address("127.0.0.1:1")  # before: ray.init retried for minutes
    assert time.perf_counter() - t0 < 5
    assert parse_address("ray://10.1.2.3:6379") == ("10.1.2.3", 6379)
    assert parse_address("[::1]:10001") == ("::1", 10001)
    for bad in ("", "x", "127.0.0.1:99999", "127.0.0.1:1:2", "h:0"):
        with pytest.raises(PostplaceError, match="--ray"):
            parse_address(bad)


def test_place_with_ray_at_a_dead_port_is_one_line(tmp_path, monkeypatch, capsys):
    (tmp_path / fuzz.GRAPH).write_text(json.dumps(fuzz.base_graph().to_dict()))
    (tmp_path / fuzz.CLUSTER).write_text(fuzz.base_cluster_toml())
    t0 = time.perf_counter()
    rc, err = cli([*fuzz.PLACE_G, "--ray", "127.0.0.1:1"], tmp_path, monkeypatch, capsys)
    assert rc == 2 and err.startswith("error: ") and len(err.strip().splitlines()) == 1, err
    assert time.perf_counter() - t0 < 30
    assert not (tmp_path / "out").exists()  # a bad --ray writes no run folder: the same command runs again


def test_simulate_microbatches_zero_is_refused(tmp_path, monkeypatch, capsys):
    rc, err = cli([*fuzz.SIMULATE_Z, "--microbatches", "0"], tmp_path, monkeypatch, capsys)
    assert rc == 2 and "--microbatches 0" in err, err  # before: read as 1 and simulated


@pytest.mark.parametrize(
    ("strategy", "key", "value"),
    [
        ("post", "ppo_epochs", "99999999999999999999"),  # before: ran for ever
        ("hp", "grouper_hidden", "99999999999999999999"),  # before: MemoryError
        ("hp", "lr", "1e300"),  # before: torch's float32 overflow
        ("hp", "tanh_constant", "1e300"),  # before: NaN probabilities
    ],
)
def test_config_values_that_exhaust_memory_or_time_are_refused(strategy, key, value):
    from postplace.search.config import build_config

    with pytest.raises(PostplaceError, match=f"{key} must be at most"):
        build_config(strategy, {key: value})
    assert build_config(strategy, {key: "3"}) is not None


def test_a_nested_table_in_a_config_file_is_refused(tmp_path):
    from postplace.search.config import read_config_file

    p = tmp_path / "c.toml"
    p.write_text("[post.sub]\nx = 1\n")
    with pytest.raises(PostplaceError, match=r"\[post.sub\] is a table"):  # before: silently ignored
        read_config_file(p, "post")
    p.write_text("lr = 0.05\n[anneal]\ncooling = 0.9\n")  # another strategy's table: fine
    assert read_config_file(p, "post") == {"lr": 0.05}
    p.write_text("lr = 0.05\n[nosuch]\nx = 1\n")
    with pytest.raises(PostplaceError, match=r"\[nosuch\]"):
        read_config_file(p, "post")


def test_every_fuzz_edit_applies(template, tmp_path):
    """The harness itself: every run-folder edit of the pool applies to a real folder."""
    pool = [c for c in fuzz.run_edit_pool() if c.template == "file"]
    assert len(pool) > 200
    for k, case in enumerate(pool[::7]):
        shutil.copytree(template, tmp_path / f"c{k}")
        for e in case.edits:
            fuzz.apply_edit(tmp_path / f"c{k}" / "run", e, random.Random(k))
    assert np.isfinite(len(pool))


def test_history_and_timing_lines_that_are_not_samples_are_left_out(tmp_path):
    """A report reads them: a line of the wrong shape (a list, a text step time, a 400-digit time) was an
    AttributeError, TypeError or OverflowError there."""
    from postplace.search.history import best_so_far, read_history, read_timing, sample_times

    big = "1" + "0" * 400
    (tmp_path / "h.jsonl").write_text(
        "\n".join(
            [
                '{"step_time_s": "x"}',
                "[1]",
                '{"step_time_s": NaN}',
                '{"step_time_s": 1, "oom": "yes"}',
                "3",
                '{"step_time_s": 0.5}',
                f'{{"step_time_s": {big}}}',
                '{"step_time_s": 0.25, "failed": false}',
            ]
        )
        + "\n"
    )
    rows = read_history(tmp_path / "h.jsonl")
    assert [r["step_time_s"] for r in rows] == [0.5, 0.25]
    assert best_so_far(rows).tolist() == [0.5, 0.25]
    (tmp_path / "t.jsonl").write_text(
        "\n".join(
            [
                f'{{"samples": 1, "time_s": {big}}}',
                "[1]",
                '"x"',
                f'{{"samples": {10**30}, "time_s": 1}}',
                '{"samples": 3, "time_s": NaN}',
                '{"samples": 2, "time_s": 2}',
            ]
        )
        + "\n"
    )
    timing = read_timing(tmp_path / "t.jsonl")
    assert timing == [{"samples": 2, "time_s": 2.0}]
    assert sample_times(timing, 2).tolist() == [2.0, 2.0]
    with pytest.raises(PostplaceError, match="cannot read"):
        read_history(tmp_path)  # a folder: one error line, not IsADirectoryError


@pytest.mark.parametrize("text", ["\u00b2", "\u0661\u0662", "99999999999999999999", "1" + "0" * 400 + "s", "0"])
def test_budgets_that_are_not_ascii_counts_or_run_for_ever_are_refused(text):
    from postplace.search import Budget

    with pytest.raises(PostplaceError, match="--budget"):  # '²' was a ValueError, 1e400 s an endless run
        Budget.parse(text)
    assert Budget.parse("2400").samples == 2400 and Budget.parse("0.5m").seconds == 30.0


# ------------------------------------------------------------------------------------ reports of edited folders
def report_refused(run, *words) -> str:
    """The report entry point the CLI uses refuses the folder with one line holding ``words``."""
    from postplace.report import write_report

    with pytest.raises(PostplaceError) as exc:
        write_report(run)
    text = str(exc.value)
    assert "\n" not in text and all(w in text for w in words), text
    assert not (run / "report.html").exists()
    return text


@pytest.mark.parametrize(
    ("path", "value", "words"),
    [
        ("strategy", None, ["'strategy' is null"]),  # before: AttributeError
        ("strategy", 3, ["'strategy' is 3"]),
        ("strategy", [], ["'strategy' is []"]),  # before: TypeError (unhashable)
        ("best_step_time_s", "x", ["'best_step_time_s' is \"x\", not a number"]),  # before: TypeError
        ("best_step_time_s", fuzz.NAN, ["'best_step_time_s' is NaN"]),  # before: ValueError from matplotlib
        ("best_step_time_s", 1e308, ["'best_step_time_s' is 1e+308 s", "1e+300"]),
        ("best_step_time_s", -1, ["'best_step_time_s' is -1, negative"]),  # before: drawn as a time
        ("best_step_time_s", True, ["'best_step_time_s' is true"]),  # before: drawn as 1 s
        ("search_best_step_time_s", "x", ["'search_best_step_time_s'"]),
        ("lower_bound_s", 1e308, ["'lower_bound_s'"]),
        ("wall_time_s", "x", ["'wall_time_s'"]),
        ("candidates", {"random": fuzz.NAN}, ["candidate 'random' is NaN"]),
        ("candidates", [1], ["'candidates' is [1]"]),
        ("search_start", {"name": "fastest", "step_time_s": "y"}, ["'search_start.step_time_s'"]),
        ("", [], ["a list, not a JSON object"]),  # before: AttributeError
        ("", 3, ["a number, not a JSON object"]),
        ("", None, ["null, not a JSON object"]),
    ],
)
def test_report_of_an_edited_summary_is_one_line(run, path, value, words):
    edited(run, Edit("summary.json", "set", path, value))
    text = report_refused(run, "summary.json", *words, "edited or damaged")
    if "1e+300" in text:  # a finite number a run of an absurd graph writes too: resuming would write it again
        assert "graph or cluster has figures no hardware has" in text and "--resume" not in text, text
    else:
        assert f"`postplace place --resume {run}` writes summary.json again" in text, text


def test_the_fix_the_summary_error_gives_works(run):
    from postplace.report import write_report

    edited(run, Edit("summary.json", "set", "strategy", None))
    report_refused(run, "'strategy'")
    assert postplace.resume(run, report=False).summary["strategy"] == "post"  # what the message says to run
    assert write_report(run).is_file()


def test_harmless_summary_edits_still_draw(run):
    from postplace.report import write_report

    edited(run, Edit("summary.json", "set", "samples", "x"), Edit("summary.json", "set", "candidate_notes", 3))
    path = write_report(run)
    data = json.loads((run / "report.json").read_text())
    assert path.is_file() and data["provenance"]["cluster"]["name"] == "tiny" and ", x samples" in data["title"]


@pytest.mark.parametrize(
    ("key", "value", "words"),
    [
        ("cluster", "nosuch", ["field 'cluster' says 'nosuch'", "records cluster 'tiny'"]),  # before: drawn on tiny
        ("best_step_time_s", None, ["field 'best_step_time_s' is missing"]),  # before: drawn without an answer
        ("returned", 3, ["field 'returned' is 3, not a name"]),
    ],
)
def test_a_summary_that_names_no_answer_or_another_cluster_is_refused(run, key, value, words):
    """Issue 34 item 12: the report drew whatever summary.json said."""
    edited(run, Edit("summary.json", "set", key, value))
    report_refused(run, "summary.json", *words)


def test_a_history_step_time_of_1e308_is_one_line(run):
    edited(run, Edit("history.jsonl", "line", 3, {"step_time_s": 1e308}))  # before: matplotlib's axis limits
    report_refused(run, "history.jsonl", "sample 3", "1e+308", "edited or damaged")


def test_the_largest_step_times_a_report_reads_are_drawn(run):
    from postplace.report import write_report
    from postplace.report._data import MAX_STEP_S

    lines = [json.loads(x) for x in (run / "history.jsonl").read_text().splitlines()]
    lines[0]["step_time_s"] = MAX_STEP_S
    (run / "history.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    edited(
        run,
        Edit("summary.json", "set", "single_device_step_time_s", MAX_STEP_S),
        Edit("summary.json", "set", "candidates", {"search": MAX_STEP_S, "m-topo": 0.0}),
    )
    write_report(run)
    data = json.loads((run / "report.json").read_text())
    assert data["curves"][0]["median_s"][0] == MAX_STEP_S and {b["best_s"] for b in data["bars"]} >= {MAX_STEP_S, 0.0}


def test_the_cli_report_of_an_edited_summary_is_one_error_line(run, tmp_path, monkeypatch, capsys):
    edited(run, Edit("summary.json", "set", "best_step_time_s", "x"))
    rc, err = cli(["report", str(run)], tmp_path, monkeypatch, capsys)
    assert rc == 2 and err.startswith("error: ") and len(err.strip().splitlines()) == 1, err
    assert "summary.json" in err and "'best_step_time_s'" in err and "internal error" not in err


@pytest.fixture(scope="module")
def compare_template(tmp_path_factory):
    """A finished tiny comparison (the fuzz's graph and cluster, random search over 2 seeds, m-topo)."""
    root = tmp_path_factory.mktemp("cmp")
    fuzz.base_graph().save(root / fuzz.GRAPH)
    (root / fuzz.CLUSTER).write_text(fuzz.base_cluster_toml())
    postplace.compare(
        str(root / fuzz.GRAPH),
        str(root / fuzz.CLUSTER),
        strategies=["random", "m-topo"],
        budget=8,
        seeds=2,
        out=root / "cmp",
    )
    return root


@pytest.mark.parametrize(
    ("path", "value", "words"),
    [
        ("", [], ["not a JSON object"]),  # before: AttributeError
        ("rows", None, ["'rows' is null"]),  # before: TypeError
        ("rows.0.strategy", None, ["rows[0] field 'strategy' is null"]),  # before: TypeError (a path of None)
        ("rows.0.strategy", "../../x", ["'strategy' is \"../../x\""]),  # before: a folder outside runs/ was read
        ("rows.0.best_step_time_s", fuzz.NAN, ["row 'random' field 'best_step_time_s' is NaN"]),
        ("rows.0.best_step_time_s", 1.0, ["row 'random': best_step_time_s 1 is not between"]),  # before: xerr < 0
        ("rows.0.seeds", "x", ["row 'random' field 'seeds'"]),
        ("rows.0.wall_time_s", "x", ["row 'random' field 'wall_time_s'"]),  # before: ValueError
        ("rows.0.per_seed", [1], ["per_seed[0] is 1"]),
        ("rows.0.per_seed.0.best_step_time_s", "x", ["per_seed[0] field 'best_step_time_s'"]),  # before: TypeError
        ("seeds", 10**30, ["'seeds' is 1000000000000000000000000000000"]),  # before: OverflowError
        ("lower_bound_s", 1e308, ["'lower_bound_s' is 1e+308 s"]),
    ],
)
def test_report_of_an_edited_comparison_is_one_line(compare_template, tmp_path, path, value, words):
    from postplace.report import write_report

    shutil.copytree(compare_template, tmp_path / "t")
    folder = tmp_path / "t" / "cmp"
    doc = fuzz.set_path(json.loads((folder / "compare.json").read_text()), path, value)
    (folder / "compare.json").write_text(json.dumps(doc))
    with pytest.raises(PostplaceError) as exc:
        write_report(folder, cluster=str(tmp_path / "t" / fuzz.CLUSTER))
    text = str(exc.value)
    assert "\n" not in text and "compare.json" in text and "edited or damaged" in text, text
    assert all(w in text for w in words), text


@pytest.mark.parametrize(
    "edit",
    [
        lambda doc: {**doc, "best_placement": [9] * len(doc["best_placement"])},  # before: IndexError
        lambda doc: {**doc, "best_placement": [0.5] * len(doc["best_placement"])},
        lambda doc: {**doc, "best_placement": "x"},  # before: a placement of the wrong length was skipped in silence
        lambda doc: [],  # before: AttributeError
    ],
)
def test_a_search_runs_edited_best_placement_is_one_line(compare_template, tmp_path, edit):
    from postplace.report import write_report

    shutil.copytree(compare_template, tmp_path / "t")
    folder = tmp_path / "t" / "cmp"
    for seed in (0, 1):
        res = folder / "runs" / "random" / f"seed{seed}" / "result.json"
        res.write_text(json.dumps(edit(json.loads(res.read_text()))))
    with pytest.raises(PostplaceError) as exc:
        write_report(folder, cluster=str(tmp_path / "t" / fuzz.CLUSTER))
    text = str(exc.value)
    assert "\n" not in text and "result.json" in text and "edited or damaged" in text, text


def test_the_unedited_comparison_draws(compare_template, tmp_path):
    from postplace.report import write_report

    shutil.copytree(compare_template, tmp_path / "t")
    path = write_report(tmp_path / "t" / "cmp", cluster=str(tmp_path / "t" / fuzz.CLUSTER))
    data = json.loads(path.with_name("report.json").read_text())
    assert [b["label"] for b in data["bars"]] == ["random", "m-topo"]
    assert data["schedule"]["source"].startswith(("random seed", "m-topo"))


# ------------------------------------------------------------------------------------ paths the system refuses
@pytest.mark.parametrize(
    "argv",
    [
        ["simulate", "resnet50", "--cluster", "x" * 5000, "--placement", "single:gpu0"],
        ["simulate", "x" * 5000, "--cluster", "k80x2", "--placement", "single:gpu0"],
        ["place", "x" * 5000 + ".json", "--cluster", "k80x2", "--no-report"],
    ],
)
def test_a_path_too_long_for_the_file_system_is_one_short_error_line(argv, tmp_path, monkeypatch, capsys):
    """An OSError (ENAMETOOLONG) from a path the user named was an internal error printing 5,000 characters."""
    from tests.clihelp import cli_error

    monkeypatch.chdir(tmp_path)
    line = cli_error(argv, capsys)
    assert "File name too long" in line and ("(5000 characters)" in line or "(5005 characters)" in line), line
    assert len(line) < 300


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (["profile", "rnnlm", "--size", "small", "--runs", "1000000000000"], "--runs 1000000000000: give 1 to 10,000"),
        (["calibrate", "rnnlm", "--runs", "1000000000000"], "--runs 1000000000000: give 1 to 10,000"),
        (
            ["compare", "g.json", "-c", "c.toml", "--seeds", "1000000000", "--strategies", "random", "--budget", "8"],
            "--seeds 1000000000: give a positive integer, at most 1,000",
        ),
        (
            [
                "compare",
                "g.json",
                "-c",
                "c.toml",
                "--seeds",
                "1",
                "--strategies",
                "random",
                "--budget",
                "10000000000000",
            ],
            "--budget 10000000000000: give a positive integer, at most 1,000,000,000,000",
        ),
    ],
)
def test_counts_past_any_use_are_one_line(argv, words, tmp_path, monkeypatch, capsys):
    """profile/calibrate --runs 10^12 allocated petabytes (internal MemoryError); compare --seeds 10^9 or a
    budget past place's cap ran for ever."""
    from tests.clihelp import cli_error

    fuzz.base_graph().save(tmp_path / "g.json")
    (tmp_path / "c.toml").write_text(fuzz.base_cluster_toml())
    monkeypatch.chdir(tmp_path)
    assert words in cli_error(argv, capsys)


# ------------------------------------------------------------------------------ files that never end, empty values
@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (["info", "/dev/zero"], "/dev/zero: holds NUL bytes"),  # killed for memory before
        (["simulate", "g.json", "-c", "/dev/zero", "--placement", "single:gpu0"], "/dev/zero: holds NUL bytes"),
        (["simulate", "g.json", "-c", "c.toml", "--placement", "/dev/zero"], "/dev/zero: holds NUL bytes"),  # hung
        (["simulate", "/dev/urandom", "-c", "c.toml", "--placement", "single:gpu0"], "/dev/urandom: holds NUL bytes"),
        (
            ["place", "g.json", "-c", "c.toml", "--budget", "8", "--config", "/dev/zero"],
            "--config /dev/zero: holds NUL",
        ),
        (
            [
                "compare",
                "g.json",
                "-c",
                "c.toml",
                "--strategies",
                "random",
                "--seeds",
                "1",
                "--budget",
                "8",
                "--out",
                "",
            ],
            "--out '': empty",
        ),  # wrote its run into the current folder
        (["graph", "rnnlm", "--size", "small", "--out="], "--out '': empty"),
        (["graph", "rnnlm", "--size", "small", "--out", "."], ".: is a folder, not a file"),  # internal error before
        (["report", ""], "the argument after 'report' is empty"),
        (
            ["train", "rnnlm", "--size", "small", "--placement", "single:cpu", "--steps", "1", "--threads", "100000"],
            "--threads 100000: give 1 to 1,024 threads",
        ),  # a segmentation fault before
    ],
)
def test_endless_files_empty_values_and_absurd_thread_counts_are_one_line(argv, words, tmp_path, monkeypatch, capsys):
    from tests.clihelp import cli_error

    fuzz.base_graph().save(tmp_path / "g.json")
    (tmp_path / "c.toml").write_text(fuzz.base_cluster_toml())
    monkeypatch.chdir(tmp_path)
    assert words in cli_error(argv, capsys)
    assert not (tmp_path / "compare.json").exists()


def test_a_file_past_the_size_limit_is_refused_without_reading_it_all(tmp_path, monkeypatch):
    from postplace import validate

    monkeypatch.setattr(validate, "MAX_FILE_BYTES", 1000)
    (tmp_path / "big.json").write_text("[" + "0," * 600 + "0]")
    with pytest.raises(PostplaceError, match="big.json: larger than"):
        validate.read_json(tmp_path / "big.json")
    (tmp_path / "ok.json").write_text("[" + "0," * 400 + "0]")
    assert len(validate.read_json(tmp_path / "ok.json")) == 401
