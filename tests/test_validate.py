"""Inputs validated at the edge: each malformed graph, cluster, placement or flag is one clear error."""

import json
import math

import numpy as np
import pytest

from postplace.cluster import load_cluster
from postplace.cluster.cluster import Cluster
from postplace.cluster.placement import load_placement
from postplace.errors import PostplaceError
from postplace.graph import OpGraph, load_graph
from postplace.sim import Simulator
from postplace.testing import fuzz
from tests.clihelp import cli_error


def one_line_error(fn, *match):
    with pytest.raises(PostplaceError) as err:
        fn()
    msg = str(err.value)
    assert "\n" not in msg
    for m in match:
        assert m in msg, msg
    return msg


def graph_doc():
    return fuzz.base_graph().to_dict()


def write(tmp_path, name, data):
    p = tmp_path / name
    p.write_bytes(data if isinstance(data, bytes) else data.encode())
    return p


@pytest.mark.parametrize(
    "mutate,match",
    [
        (lambda d: d.update(version=True), "version True"),
        (lambda d: d.update(version=1.0), "version 1.0"),
        (lambda d: d["ops"]["flops"].__setitem__(2, "2e9"), "ops.flops[2]' must be a number, not the string"),
        (lambda d: d["ops"]["output_bytes"].__setitem__(0, True), "must be a number, not the boolean true"),
        (lambda d: d["ops"]["inplace"].__setitem__(3, "false"), "ops.inplace[3]' must be true or false"),
        (lambda d: d["ops"]["colocation"].__setitem__(0, 1.5), "ops.colocation[0]' must be an integer"),
        (lambda d: d["edges"]["src"].__setitem__(0, "0"), "edges.src[0]' must be an integer"),
        (lambda d: d["ops"]["name"].__setitem__(1, 7), "ops.name[1]' must be a string"),
        (lambda d: d["ops"]["inplace_base"].__setitem__(3, 4), "field 'inplace_base' is 4"),
        (lambda d: d["ops"]["colocation"].__setitem__(0, 2**70), "too large for a 64-bit integer"),
    ],
)
def test_graph_file_fields_are_strict(tmp_path, mutate, match):
    d = graph_doc()
    mutate(d)
    p = write(tmp_path, "g.json", json.dumps(d))
    one_line_error(lambda: load_graph(p), str(p), match)


@pytest.mark.parametrize(
    "text,match",
    [
        ('"flops": [NaN', "NaN is not allowed"),
        ('"flops": [1e400', "too large for a float"),
        ('"flops": [' + "9" * 400, "too large"),
    ],
)
def test_graph_file_numbers_must_be_finite_floats(tmp_path, text, match):
    raw = json.dumps(graph_doc()).replace('"flops": [0.0', text, 1)
    assert raw != json.dumps(graph_doc())
    p = write(tmp_path, "g.json", raw)
    one_line_error(lambda: load_graph(p), match)


def test_deep_nesting_and_non_utf8_are_errors_not_tracebacks(tmp_path):
    deep = write(tmp_path, "deep.json", "[" * 200_000 + "]" * 200_000)
    one_line_error(lambda: load_graph(deep), "nested too deeply")
    raw = json.dumps(graph_doc()).encode()
    bad = write(tmp_path, "bad.json", raw[:50] + b"\xff\xfe" + raw[50:])
    one_line_error(lambda: load_graph(bad), "not UTF-8", "byte 50")
    one_line_error(lambda: load_graph(tmp_path), "is a folder")


def cluster_doc():
    return json.loads(json.dumps(fuzz.CLUSTER_DOC))


@pytest.mark.parametrize(
    "mutate,match",
    [
        (lambda d: d["link"][1].update(latency=math.nan), "link[1] field 'latency' is nan; it must be finite"),
        (lambda d: d["link"][1].update(latency=-1e-6), "must be >= 0"),
        (lambda d: d["link"][2].update(bandwidth=math.inf), "link[2] field 'bandwidth' is inf"),
        (lambda d: d["link"][2].update(bandwidth=0.0), "must be positive"),
        (lambda d: d["link"][0].update(bandwidth="7.7e10"), "must be a number, not the string '7.7e10'"),
        (lambda d: d["device"][1].update(memory=True), "device[1] field 'memory' must be a number, not the boolean"),
        (lambda d: d["device"][0].update(peak_flops=math.nan), "field 'peak_flops' is nan"),
        (lambda d: d["device"][1].update(reserve=2e10), "usable memory (memory - reserve)"),
        (lambda d: d["link"][3].update(a="gpu9"), "a link names 'gpu9'"),
        (lambda d: d["link"][3].update(a=3), "link[3] field 'a' must be a string"),
        (lambda d: d["device"][0].update(kind="tpu"), "has kind 'tpu'"),
        (lambda d: d.update(device=3), "'device' must be a list of tables"),
        (lambda d: d["device"][1].update(names="gpu0"), "'names' must be a non-empty list"),
    ],
)
def test_cluster_file_fields_are_strict(tmp_path, mutate, match):
    d = cluster_doc()
    mutate(d)
    p = write(tmp_path, "c.toml", fuzz.base_cluster_toml(d))
    one_line_error(lambda: load_cluster(p), match)


def test_cluster_file_non_utf8(tmp_path):
    p = write(tmp_path, "c.toml", b'name = "\xff"\n' + fuzz.base_cluster_toml().encode())
    one_line_error(lambda: load_cluster(p), "not UTF-8", "line 1")


def test_a_nan_latency_is_refused_before_it_can_hang_the_cli(tmp_path, capsys):
    from postplace.cli import main

    d = cluster_doc()
    d["link"][2]["latency"] = math.nan
    write(tmp_path, "c.toml", fuzz.base_cluster_toml(d))
    fuzz.base_graph().save(tmp_path / "g.json")
    argv = [
        "postplace",
        "simulate",
        str(tmp_path / "g.json"),
        "--cluster",
        str(tmp_path / "c.toml"),
        "--placement",
        "single:gpu0",
    ]
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr("sys.argv", argv)
        with pytest.raises(SystemExit) as ex:
            main()
    assert ex.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and "latency" in err[0]


@pytest.mark.parametrize(
    "mapping,match",
    [
        ({"nope": "gpu0"}, "op 'nope' is not in graph 'tiny'"),
        ({"conv": "gpu9"}, "no device 'gpu9'"),
        ({"conv": 0}, "maps to 0"),
        ({"conv": "gpu0", "conv_bw": "gpu1"}, "splits a colocation set"),
        ({"input:0": "gpu0"}, "may only run on cpu"),
    ],
)
def test_placement_files_are_strict(tmp_path, mapping, match):
    g = fuzz.base_graph()
    c = Cluster.from_toml_text(fuzz.base_cluster_toml())
    p = write(tmp_path, "p.json", json.dumps({**fuzz.base_placement(), **mapping}))
    one_line_error(lambda: load_placement(p, g, c), match)


def test_train_placement_without_a_cluster_names_only_ops_of_the_graph(tmp_path):
    from postplace.runtime.cli import _placement

    g = fuzz.base_graph()
    every = {n: "cpu" for n in g.names}
    ok = write(tmp_path, "ok.json", json.dumps(every))
    dev, names = _placement(str(ok), g, None, mapped=set())
    assert dev.tolist() == [0] * g.num_ops and names == ["cpu"]
    extra = write(tmp_path, "x.json", json.dumps({**every, "not_an_op": "cpu"}))
    one_line_error(lambda: _placement(str(extra), g, None, mapped=set()), "op 'not_an_op' is not in graph")
    odd = write(tmp_path, "y.json", json.dumps({**every, "conv": "tpu0"}))
    one_line_error(lambda: _placement(str(odd), g, None, mapped=set()), "'tpu0', which is not cpu or gpuK")
    assert _placement(str(odd), g, None, mapped={"tpu0"})[1] == ["cpu", "tpu0"]  # --device tpu0=cpu maps it


def test_costs_that_overflow_are_an_error_not_an_infinite_step_time():
    d = cluster_doc()
    for dev in d["device"]:
        dev["peak_flops"] = 1.0
    slow = Cluster.from_toml_text(fuzz.base_cluster_toml(d))
    g = OpGraph.build(["a", "b"], [(0, 1, 1.0)], flops=[1.7e308, 1.7e308])  # each 1.7e308 s; their sum is inf
    one_line_error(lambda: Simulator(g, slow), "add up past the largest float")
    d = cluster_doc()
    d["device"][0]["peak_flops"] = 1e-300
    tiny = Cluster.from_toml_text(fuzz.base_cluster_toml(d))
    g = OpGraph.build(["a"], flops=[1e10])
    one_line_error(lambda: Simulator(g, tiny), "op 'a' on cpu takes inf s")
    gpus = Cluster.from_toml_text(fuzz.base_cluster_toml(d).replace('kind = "cpu"', 'kind = "gpu"'))
    one_line_error(lambda: Simulator(OpGraph.build(["x"], allowed_kinds=["cpu"]), gpus), "has no such device")


def test_a_valid_graph_round_trips_with_its_inplace_base(tmp_path):
    g = fuzz.base_graph()
    g.save(tmp_path / "g.json")
    back = load_graph(tmp_path / "g.json")
    assert back.inplace_base.tolist() == [-1, -1, -1, 2, -1, -1, 0]
    assert np.isfinite(Simulator(back, load_cluster("k80x4")).lower_bound)


def test_an_out_path_that_is_a_file_is_one_error_for_every_command(tmp_path, capsys):
    fuzz.base_graph().save(tmp_path / "g.json")
    a_file = write(tmp_path, "notes.txt", "mine")
    g = str(tmp_path / "g.json")
    for argv in (
        ["place", g, "--cluster", "k80x2", "--budget", "4", "--out", str(a_file)],
        ["place", g, "--cluster", "k80x2", "--budget", "4", "--out", str(a_file / "run")],
        ["compare", g, "--cluster", "k80x2", "--budget", "4", "--strategies", "random", "--out", str(a_file)],
        ["paper", "--quick", "--out", str(a_file)],
        ["report", str(a_file)],
    ):
        assert str(a_file) in cli_error(argv, capsys), argv
    assert a_file.read_text() == "mine"


def test_paper_collect_with_nothing_to_collect_is_an_error_and_writes_nothing(tmp_path, capsys):
    assert "no runs under" in cli_error(["paper", "--quick", "--collect", "--out", str(tmp_path / "typo")], capsys)
    assert not (tmp_path / "typo").exists()


def test_report_out_that_is_a_folder_is_an_error(tmp_path, capsys):
    from postplace.api import place

    place(fuzz.base_graph(), "k80x2", budget=4, out=tmp_path / "run")
    assert "give the HTML file" in cli_error(["report", str(tmp_path / "run"), "--out", str(tmp_path)], capsys)
