"""Defects 34: a Ctrl-C in the first batch, devices outside the cluster (train --placement, compare
--expert-split), a cpu-only op on a cluster without a cpu, a graph with no op, and report's paper.json."""

import json

import pytest

import postplace
import postplace.search.checkpoint as checkpoint
import postplace.search.progress as progress
import postplace.search.runner as runner
from postplace.errors import PostplaceError
from postplace.graph import OpGraph
from tests.clihelp import cli_error, run_cli

# --- 1. a Ctrl-C during the first batch leaves a checkpoint of no sample; it must resume ---------------------


class _StopInTell:
    """A strategy seen by the runner's batch step: its ``tell`` is Ctrl-C (the batch evaluated and cached, the
    strategy not yet told)."""

    def tell(self, *args):
        raise KeyboardInterrupt


def _interrupt_first_batch(monkeypatch, where: str, plans: bool = False) -> None:
    """Ctrl-C in the first batch of the run's search: in the evaluator (before it returns) or in the strategy's
    tell. ``plans``: in the first batch of Post's search over per-unit plans instead (it runs first, through
    the same runner, and writes no checkpoint)."""
    from postplace.placers.practitioner import PlanChoices

    one_batch, calls = runner._one_batch, []

    def interrupted(strategy, evaluator, state, history, placements):
        if isinstance(evaluator, PlanChoices) != plans:
            return one_batch(strategy, evaluator, state, history, placements)
        calls.append(1)
        if len(calls) > 1:
            return one_batch(strategy, evaluator, state, history, placements)
        if where == "evaluate":
            raise KeyboardInterrupt
        one_batch(_StopInTell(), evaluator, state, history, placements)

    monkeypatch.setattr(runner, "_one_batch", interrupted)


def _lines(folder):
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("history.jsonl")), [
        p.read_text() for p in sorted(folder.rglob("history.jsonl"))
    ]


@pytest.mark.parametrize("where", ["evaluate", "tell"])
@pytest.mark.parametrize("microbatches", [1, None])  # one search, and the search over micro-batch counts
def test_ctrl_c_in_the_first_batch_resumes_to_the_uninterrupted_result(tmp_path, monkeypatch, where, microbatches):
    cut, whole = tmp_path / "cut", tmp_path / "whole"
    args = {"size": "small", "budget": 16, "report": False, "microbatches": microbatches}
    with monkeypatch.context() as mp:
        _interrupt_first_batch(mp, where)
        with pytest.raises(KeyboardInterrupt):
            postplace.place("gpt2", "k80x2", out=cut, **args)
    assert not (cut / "placement.json").exists()
    assert checkpoint.checkpoint_samples(next(cut.rglob(checkpoint.CHECKPOINT)).parent) == 0  # the defect's state
    resumed = postplace.resume(cut, report=False)
    clean = postplace.place("gpt2", "k80x2", out=whole, **args)
    a, b = resumed.summary, clean.summary
    assert a["samples"] == b["samples"] and a["search_best_step_time_s"] == b["search_best_step_time_s"]
    assert resumed.step_time_s == clean.step_time_s
    assert _lines(cut) == _lines(whole) and _lines(cut)[0]


@pytest.mark.parametrize("where", ["evaluate", "tell"])
def test_ctrl_c_in_the_plan_search_stops_place_and_the_folder_resumes(tmp_path, monkeypatch, where):
    """Ctrl-C in Post's search over per-unit plans (before the main search writes anything) stops ``place``
    instead of being swallowed by its runner, and resuming the folder gives the uninterrupted answer."""
    cut, whole = tmp_path / "cut", tmp_path / "whole"
    args = {"size": "small", "budget": 16, "report": False}
    with monkeypatch.context() as mp:
        _interrupt_first_batch(mp, where, plans=True)
        with pytest.raises(KeyboardInterrupt):
            postplace.place("gpt2", "k80x2", out=cut, **args)
    assert not (cut / "placement.json").exists()
    resumed = postplace.resume(cut, report=False)
    clean = postplace.place("gpt2", "k80x2", out=whole, **args)
    assert resumed.step_time_s == clean.step_time_s and resumed.summary["plan_search"] == clean.summary["plan_search"]
    assert _lines(cut) == _lines(whole)


def test_a_checkpoint_of_no_sample_resumes_through_the_cli(tmp_path, monkeypatch):
    cut = tmp_path / "cut"
    with monkeypatch.context() as mp:
        _interrupt_first_batch(mp, "evaluate")
        r = run_cli(
            "place",
            "gpt2",
            "--size",
            "small",
            "-c",
            "k80x2",
            "--budget",
            "8",
            "--microbatches",
            "1",
            "--no-report",
            "--json",
            "--out",
            cut,
        )
    assert r.returncode == 130 and "--resume" in r.stderr and "Traceback" not in r.stderr, r.stderr
    r = run_cli("place", "--resume", cut, "--json", "--no-report")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["samples"] == 8


# --- 2. train --placement single:DEVICE names a device the cluster lacks --------------------------------------


def test_train_on_a_device_the_cluster_lacks_is_one_line(tmp_path, capsys):
    err = cli_error(
        [
            "train",
            "rnnlm",
            "--size",
            "small",
            "--placement",
            "single:gpu9",
            "--cluster",
            "k80x4",
            "--steps",
            "1",
            "--map-all-to",
            "cpu",
        ],
        capsys,
    )
    assert "gpu9" in err and "cpu, gpu0, gpu1, gpu2, gpu3" in err
    (tmp_path / "p.json").write_text(json.dumps({"param:embed.weight": "gpu9"}))
    err = cli_error(
        [
            "train",
            "rnnlm",
            "--size",
            "small",
            "--placement",
            str(tmp_path / "p.json"),
            "--cluster",
            "k80x4",
            "--steps",
            "1",
            "--map-all-to",
            "cpu",
        ],
        capsys,
    )
    assert "gpu9" in err and "cpu, gpu0, gpu1, gpu2, gpu3" in err


# --- 3. compare --expert-split: a split that is unused, malformed or names devices the cluster lacks -----------


def _workload(tmp_path):
    node = {"fpgaLatency": 1.0, "cpuLatency": 10.0, "size": 1.0, "isBackwardNode": 0}
    w = {
        "maxSizePerFPGA": 1e9,
        "maxFPGAs": 2,
        "maxCPUs": 1,
        "nodes": [{"id": i, "name": f"n{i}", **node} for i in range(4)],
        "edges": [{"sourceId": i, "destId": i + 1, "size": 10.0} for i in range(3)],
    }
    (tmp_path / "w.json").write_text(json.dumps(w))
    return tmp_path / "w.json"


def _compare_split(tmp_path, split, strategies="single,expert"):
    (tmp_path / "split.json").write_text(json.dumps(split))
    return [
        "compare",
        str(_workload(tmp_path)),
        "-c",
        "k80x2",
        "--strategies",
        strategies,
        "--budget",
        "8",
        "--seeds",
        "1",
        "--out",
        str(tmp_path / "cmp"),
        "--no-report",
        "--json",
        "--expert-split",
        str(tmp_path / "split.json"),
    ]


@pytest.mark.parametrize(
    ("split", "fragment"),
    [
        (
            {"cpus": [{"nodes": [0]}, {"nodes": [1]}], "fpgas": [{"nodes": [2]}]},
            "no device 'cpu1'; its devices are cpu, gpu0",
        ),
        ({"cpus": 3}, "field 'cpus' must be a list"),
        ({"cpus": [3]}, "cpus[0] must be an object whose 'nodes' is a list"),
        ({"fpgas": [{"nodes": 5}]}, "fpgas[0] must be an object whose 'nodes' is a list"),
        ({"fpgas": [{"nodes": [[1]]}]}, "node ids are integers"),
        ({"fpgas": [{"nodes": [True]}]}, "node ids are integers"),
        ({"fpgas": {"a": 1}}, "field 'fpgas' must be a list"),
        ([], "one JSON object"),
    ],
)
def test_compare_expert_split_errors_are_one_line(tmp_path, capsys, split, fragment):
    err = cli_error(_compare_split(tmp_path, split), capsys)
    assert fragment in err and "split.json" in err


def test_compare_expert_split_is_checked_before_any_row_and_must_be_used(tmp_path, capsys):
    split = {"cpus": [{"nodes": [0]}, {"nodes": [1]}], "fpgas": [{"nodes": [2]}]}  # a second cpu: beyond k80x2
    err = cli_error(_compare_split(tmp_path, split, strategies="post,expert"), capsys)
    assert "cpu1" in err and not (tmp_path / "cmp" / "runs").exists()  # the search before the expert row never ran
    err = cli_error(_compare_split(tmp_path, {"fpgas": [{"nodes": [2]}]}, strategies="single"), capsys)
    assert "--expert-split" in err and "add expert to --strategies" in err
    # more accelerators than GPUs is still folded onto them (place_expert's documented rule)
    r = run_cli(*_compare_split(tmp_path, {"fpgas": [{"nodes": [1]}, {"nodes": [2]}, {"nodes": [3]}]}))
    assert r.returncode == 0, r.stderr
    rows = {row["strategy"]: row for row in json.loads(r.stdout)["rows"]}
    assert rows["expert"]["best_step_time_s"] is not None


# --- 4. a cpu-only op on a cluster without a cpu; a graph with no op ------------------------------------------

GPUS_ONLY = """name = "gpus2"
description = "two GPUs and no CPU device"

[[device]]
names = ["gpu0", "gpu1"]
kind = "gpu"
model = "K80"
peak_flops = 2.8e12
memory_bandwidth = 2.4e11
memory = 12e9

[[switch]]
name = "board"

[[link]]
a = "gpu0"
b = "board"
bandwidth = 1.575e10

[[link]]
a = "gpu1"
b = "board"
bandwidth = 1.575e10
"""


@pytest.fixture
def no_cpu(tmp_path):
    g = OpGraph.build(
        ["a", "b", "c"],
        [(0, 1, 1e6), (1, 2, 1e6)],
        flops=[1e9, 1e9, 1e9],
        allowed_kinds=[["cpu", "gpu"], ["cpu"], ["cpu", "gpu"]],
        name="cpuop",
    )
    g.save(tmp_path / "g.json")
    (tmp_path / "gpus.toml").write_text(GPUS_ONLY)
    return tmp_path


@pytest.mark.parametrize(
    "command",
    [
        ["simulate", "{g}", "-c", "{c}", "-p", "single:gpu0"],
        ["simulate", "{g}", "-c", "{c}", "-p", "single:gpu1", "--json"],
        ["place", "{g}", "-c", "{c}", "--budget", "8", "--out", "{out}", "--no-report"],
        [
            "compare",
            "{g}",
            "-c",
            "{c}",
            "--strategies",
            "single,post",
            "--budget",
            "8",
            "--seeds",
            "1",
            "--out",
            "{out}",
            "--no-report",
        ],
    ],
)
def test_a_cpu_only_op_on_a_cluster_without_a_cpu_is_one_line(no_cpu, capsys, command):
    argv = [a.format(g=no_cpu / "g.json", c=no_cpu / "gpus.toml", out=no_cpu / "out") for a in command]
    err = cli_error(argv, capsys)
    assert "op 'b' may only run on a cpu device" in err and "gpus2" in err and "gpu0 (gpu), gpu1 (gpu)" in err
    assert not (no_cpu / "out" / "run.json").exists()


def test_a_cpu_only_op_without_a_cpu_in_the_api(no_cpu):
    from postplace.cluster import load_cluster
    from postplace.cluster.placement import single_device

    g, c = OpGraph.load(no_cpu / "g.json"), load_cluster(no_cpu / "gpus.toml")
    with pytest.raises(PostplaceError, match="may only run on a cpu device"):
        single_device(g, c, "gpu0")
    with pytest.raises(PostplaceError, match="may only run on a cpu device"):
        postplace.place(g, c, budget=8, report=False)


@pytest.mark.parametrize(
    "command",
    [
        ["place", "{g}", "-c", "k80x2", "--budget", "8", "--out", "{out}", "--no-report"],
        ["simulate", "{g}", "-c", "k80x2", "-p", "single:gpu0"],
        ["simulate", "{g}", "-c", "k80x2", "-p", "single:gpu0", "--json"],
        [
            "compare",
            "{g}",
            "-c",
            "k80x2",
            "--strategies",
            "single,post",
            "--budget",
            "8",
            "--seeds",
            "1",
            "--out",
            "{out}",
            "--no-report",
        ],
    ],
)
def test_a_graph_with_no_op_is_one_line(tmp_path, capsys, command):
    OpGraph.build([], [], name="empty").save(tmp_path / "empty.json")
    argv = [a.format(g=tmp_path / "empty.json", out=tmp_path / "out") for a in command]
    err = cli_error(argv, capsys)
    assert "graph 'empty' has no op" in err
    with pytest.raises(PostplaceError, match="has no op"):
        postplace.place(OpGraph.build([], [], name="empty"), "k80x2", budget=8, report=False)


# --- 5. report reads paper.json with the checks every other file gets ------------------------------------------


def _paper():
    """A paper.json as ``postplace paper`` writes it (one pair, both tables), without running the experiment."""
    head = {
        "model": "rnnlm",
        "cluster": "k80x2",
        "post_s": 0.01,
        "hp_seeds": 1,
        "reduction": {"ce": 0.1, "hp": None},
        "rival_s": {"ce": 0.011, "hp": None},
        "post": "post",
    }
    summary = {"ce": {"pairs": 1, "post_faster": 1, "median": 0.1, "max": 0.1, "min": 0.1}}
    tables = {
        key: {"start": key, "post": "post", "rivals": ["ce", "hp"], "headline": [dict(head)], "summary": summary}
        for key in ("uniform", "probe")
    }
    return {
        "config": {"size": "small", "seeds": 1, "budget": 24, "planner_budget": 8, "planner_seeds": 1},
        "paper_claim": {"max_reduction_vs_rl": 0.637, "source": "the abstract"},
        "evaluator": "simulator",
        "pairs": ["rnnlm-k80x2"],
        "tables": tables,
        "headline": [head],
        "summary": summary,
        "starts": {
            "rnnlm-k80x2": {
                "strategies": {
                    "post": {
                        "start_name": "fastest",
                        "start_step_time_s": 0.02,
                        "final_step_time_s": 0.01,
                        "gap_closed": 0.5,
                    }
                }
            }
        },
        "wall_time_s_this_call": 1.0,
        "missing": {},
    }


def test_a_whole_paper_json_reports(tmp_path):
    from postplace.report import write_report

    (tmp_path / "paper.json").write_text(json.dumps(_paper()))
    assert write_report(tmp_path).exists()


@pytest.mark.parametrize(
    ("edit", "fragment"),
    [
        (lambda d: d.pop("config"), "field 'config' is null, not an object"),
        (lambda d: d["config"].update(seeds="3"), "field 'config.seeds' is \"3\", not an integer"),
        (lambda d: d["config"].update(size=None), "field 'config.size'"),
        (lambda d: d["paper_claim"].update(max_reduction_vs_rl=None), "paper_claim.max_reduction_vs_rl"),
        (lambda d: d.update(pairs="rnnlm-k80x2"), "field 'pairs'"),
        (lambda d: d.pop("headline"), "field 'headline' is null, not a list"),
        (lambda d: d["headline"][0].update(model=3), "field 'headline[0].model' is 3, not a name"),
        (lambda d: d["headline"][0].update(model="../x"), "field 'headline[0].model'"),
        (lambda d: d["headline"][0].update(post_s="fast"), "field 'headline[0].post_s'"),
        (
            lambda d: d["tables"]["probe"]["headline"][0]["reduction"].update(ce="10%"),
            "tables.probe.headline[0].reduction.ce",
        ),
        (lambda d: d["tables"]["uniform"].update(rivals="ce"), "tables.uniform.rivals"),
        (lambda d: d["tables"]["uniform"]["summary"]["ce"].update(median=None), "tables.uniform.summary.ce.median"),
        (lambda d: d.update(tables=[]), "field 'tables' is [], not an object"),
        (lambda d: d["starts"]["rnnlm-k80x2"]["strategies"]["post"].update(start_step_time_s=-1), "start_step_time_s"),
        (lambda d: d.update(missing={"rnnlm-k80x2": "ce"}), "missing.rnnlm-k80x2"),
    ],
)
def test_a_damaged_paper_json_is_one_line(tmp_path, capsys, edit, fragment):
    data = json.loads(json.dumps(_paper()))  # no dict shared between tables, as read from the file
    edit(data)
    (tmp_path / "paper.json").write_text(json.dumps(data))
    err = cli_error(["report", str(tmp_path)], capsys)
    assert "paper.json" in err and fragment in err and "`postplace paper`" in err, err


def test_a_paper_json_that_is_not_an_object_or_not_json_is_one_line(tmp_path, capsys):
    (tmp_path / "paper.json").write_text("[]")
    assert "paper.json: not a JSON object" in cli_error(["report", str(tmp_path)], capsys)
    (tmp_path / "paper.json").write_text("{")
    assert "paper.json: not valid JSON" in cli_error(["report", str(tmp_path)], capsys)


def test_help_shows_flags_as_flags():
    """Issue 34 item 10: ``postplace --help`` showed ``--help <bool>``, as if the flag took a value."""
    from tests.clihelp import run_cli

    for args in (["--help"], ["clusters", "--help"], ["simulate", "--help"]):
        r = run_cli(*args)
        assert r.returncode == 0 and "--help" in r.stdout, r.stderr
        assert "<bool>" not in r.stdout and "BOOLEAN" not in r.stdout, r.stdout


def test_a_search_whose_stderr_is_not_a_terminal_prints_plain_progress_lines(monkeypatch, capsys):
    """Issue 34 item 3: progress where no bar can be drawn (a log, CI), at most every PLAIN_EVERY_S seconds."""
    from postplace.search import Budget, make_problem, make_strategy, run
    from postplace.testing import star_cluster

    chain = OpGraph.build([f"op{i}" for i in range(8)], [(i, i + 1, 1e3) for i in range(7)], flops=[1e9] * 8)
    problem = make_problem(chain, star_cluster(("gpu", "gpu")))
    monkeypatch.setattr(progress, "PLAIN_EVERY_S", 0.0)
    run(make_strategy("random", problem.space, seed=0), problem.simulator, Budget(samples=32), progress=True)
    err = capsys.readouterr().err
    lines = [x for x in err.splitlines() if x.startswith("search: ")]
    assert lines and all("/32 samples, best" in x for x in lines)
    monkeypatch.setattr(progress, "PLAIN_EVERY_S", 3600.0)
    run(make_strategy("random", problem.space, seed=1), problem.simulator, Budget(samples=32), progress=True)
    assert "search: " not in capsys.readouterr().err  # a short run stays quiet


def test_batch_norm_under_micro_batches_is_warned_and_noted():
    """Issue 34 item 7: a step split into micro-batches changes what batch norm normalises over: tracing it
    warns, and an answer at m > 1 says so in its note; a model without batch norm gets neither."""
    import warnings

    import torch
    from torch import nn

    from postplace.graph import from_torch
    from postplace.graph.trace_torch import MicrobatchNormWarning

    def mse(o, t):
        return ((o - t) ** 2).mean()

    torch.manual_seed(0)
    x, y = torch.randn(32, 16), torch.randn(32, 4)
    with_bn = nn.Sequential(nn.Linear(16, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Linear(16, 4)).train()
    with pytest.warns(MicrobatchNormWarning, match="1 batch-norm layer"):
        g = from_torch(with_bn, (x,), mse, targets=(y,), microbatches=4)
    assert g.metadata["microbatch_norms"] == ["1"]
    plain = nn.Sequential(nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 4)).train()
    with warnings.catch_warnings():
        warnings.simplefilter("error", MicrobatchNormWarning)
        assert "microbatch_norms" not in from_torch(plain, (x,), mse, targets=(y,), microbatches=4).metadata
        from_torch(with_bn, (x,), mse, targets=(y,))  # one micro-batch: the whole batch, nothing to say


def test_every_command_defaults_to_the_full_size():
    """Issue 34 item 10: ``place`` defaulted to full, ``profile`` and ``calibrate`` to small, ``train`` to small
    where no run recorded one: one rule now (full, unless a run recorded its size)."""
    import typer.main

    from postplace.cli import app
    from postplace.runtime.cli import _size_for

    commands = typer.main.get_command(app).commands
    sized = {name: p.default for name, c in commands.items() for p in c.params if p.name == "size"}
    assert {"place", "profile", "calibrate", "compare", "simulate", "train", "report"} <= set(sized)
    assert {name: d for name, d in sized.items() if d is not None} == dict.fromkeys(
        [n for n, d in sized.items() if d is not None], "full"
    )
    assert sized["train"] is None and sized["report"] is None  # the run's own size where it recorded one
    assert _size_for("rnnlm", "single:cpu", None) == "full"
