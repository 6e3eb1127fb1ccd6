"""Every strategy config field states its range; a value outside it is one error line naming both."""

import dataclasses
import math
import typing

import pytest

import postplace
from postplace.errors import PostplaceError
from postplace.search import config_class
from postplace.search.config import build_config, read_config_file
from postplace.search.ranges import field_range
from postplace.testing import fuzz
from tests.clihelp import cli_error

NAMES = [
    "post",
    "post-paper",
    "post-start",
    "ce",
    "ce-paper",
    "ppo",
    "ppo-paper",
    "reinforce",
    "reinforce-paper",
    "reinforce-probe",
    "hp",
    "hp-probe",
    "anneal",
    "random",
    "post-probe",
    "ce-probe",
    "ppo-probe",
    "reinforce-local",
    "hp-local",
]


def fields_of(name):
    cls, default = config_class(name)
    hints = typing.get_type_hints(cls)
    return [(f.name, hints[f.name], field_range(cls, f.name)) for f in dataclasses.fields(cls)], default


def all_fields():
    for name in NAMES:
        for key, hint, rng in fields_of(name)[0]:
            yield name, key, hint, rng


def refused(name, overrides, *words, source="--set"):
    with pytest.raises(PostplaceError) as err:
        build_config(name, overrides, source=source)
    msg = str(err.value)
    assert "\n" not in msg, msg
    for w in words:
        assert w in msg, msg
    return msg


def is_placement(hint) -> bool:
    """A field that takes a tuple of device ids (anneal's init)."""
    return any(typing.get_origin(t) is tuple for t in (hint, *typing.get_args(hint)))


def is_integer(hint) -> bool:
    return hint is int or int in typing.get_args(hint) or is_placement(hint)


def outside(rng, hint) -> list:
    """Values just outside each finite end of the range (ints for an int field)."""
    integer = is_integer(hint)
    out = []
    if math.isfinite(rng.lo):
        out.append(
            int(rng.lo) - 1
            if integer and rng.lo_closed
            else rng.lo
            if not rng.lo_closed
            else math.nextafter(rng.lo, -math.inf)
        )
    if math.isfinite(rng.hi):
        out.append(
            int(rng.hi) + 1
            if integer and rng.hi_closed
            else rng.hi
            if not rng.hi_closed
            else math.nextafter(rng.hi, math.inf)
        )
    return out


def inside(rng, hint) -> list:
    """Values at or just inside each finite end."""
    integer = is_integer(hint)
    out = []
    if math.isfinite(rng.lo):
        out.append(rng.lo if rng.lo_closed else (int(rng.lo) + 1 if integer else math.nextafter(rng.lo, math.inf)))
    if math.isfinite(rng.hi):
        out.append(rng.hi if rng.hi_closed else (int(rng.hi) - 1 if integer else math.nextafter(rng.hi, -math.inf)))
    return [int(v) if integer else v for v in out]


def test_every_field_but_a_boolean_states_its_range_and_why():
    for name, key, hint, rng in all_fields():
        if hint is bool:
            assert rng is None, (name, key)
            continue
        assert rng is not None, f"{name}: field {key} states no range"
        assert rng.why, f"{name}: field {key} says not what it is"
        assert rng.choices or math.isfinite(rng.lo), f"{name}: {key} has no lower end"


@pytest.mark.parametrize("name", NAMES)
def test_the_defaults_and_the_presets_pass(name):
    _, default = fields_of(name)
    cls = type(default)
    for key, _, rng in fields_of(name)[0]:
        value = getattr(default, key)
        assert rng is None or value is None or rng.holds(value), (name, key, value)
    # every field given back, as a run folder's run.json records it
    recorded = {k: list(v) if isinstance(v, tuple) else v for k, v in dataclasses.asdict(default).items()}
    assert build_config(name, recorded, source="config") == default
    if hasattr(cls, "paper"):
        paper = dataclasses.asdict(cls.paper())
        assert build_config(name, paper, source="config") == dataclasses.replace(default, **paper)
    # and as --set text
    text = {
        k: ("none" if v is None else str(v).lower() if isinstance(v, bool) else str(v))
        for k, v in recorded.items()
        if not isinstance(v, list)
    }
    assert build_config(name, text) == default


def test_paper_config_passes_through_the_api():
    from postplace.api.settings import strategy_config

    assert strategy_config("post", "paper") == build_config("post-paper")
    assert strategy_config("post", None) == build_config("post")


@pytest.mark.parametrize(
    "name,key,hint,rng",
    [f for f in all_fields() if f[3] is not None and not f[3].choices or f[0] == "anneal" and f[1] == "init"],
)
def test_a_value_just_outside_each_end_is_one_error_naming_the_field_and_the_range(name, key, hint, rng):
    bounds = rng.bounds()
    for value in outside(rng, hint):
        if is_placement(hint):
            value = (0, value)  # a placement with one device id out of range
        shown = ",".join(map(str, value)) if isinstance(value, tuple) else repr(value)
        msg = refused(name, {key: shown}, f"--set {key}=", f"{key} must be", bounds, f"({rng.why})")
        assert msg.startswith(f"--set {key}={shown}: "), msg
        refused(
            name,
            {key: list(value) if isinstance(value, tuple) else value},
            f"config {key}=",
            f"{key} must be",
            bounds,
            source="config",
        )
    for value in inside(rng, hint):
        if is_placement(hint):
            value = (0, value)
        got = getattr(build_config(name, {key: value}, source="config"), key)
        assert got == value, (name, key, value, got)


@pytest.mark.parametrize("name,key,rng", [(n, k, r) for n, k, _, r in all_fields() if r is not None and r.choices])
def test_text_fields_take_only_their_words(name, key, rng):
    for word in rng.choices:
        assert getattr(build_config(name, {key: word}), key) == word
    words = ", ".join(f"'{c}'" for c in rng.choices)
    refused(name, {key: "bogus"}, f"--set {key}=bogus: {key} must be", words, f"({rng.why})")


@pytest.mark.parametrize("name", ["post", "ce", "ppo", "post-paper"])
def test_the_six_values_of_the_report_are_refused(name):
    cls, _ = config_class(name)
    assert cls.__name__ == "PostConfig"
    msg = refused(name, {"ce_every": "0"})
    assert msg == "--set ce_every=0: ce_every must be an integer >= 1 (samples between cross-entropy steps)"
    refused(name, {"eps": "2"}, "--set eps=2: eps must be none or a number in [0, 1)")
    refused(name, {"anchor_weight": "1.5"}, "--set anchor_weight=1.5: anchor_weight must be a number in [0, 1]")
    refused(name, {"elite_fraction": "3"}, "--set elite_fraction=3: elite_fraction must be a number in (0, 1]")
    refused(name, {"clip": "5"}, "--set clip=5: clip must be a number in (0, 1)")
    refused(name, {"probe_margin": "7"}, "--set probe_margin=7: probe_margin must be a number in [0, 1]")
    # the same through a TOML file's typed values
    for typed in (
        {"ce_every": 0},
        {"eps": 2},
        {"anchor_weight": 1.5},
        {"elite_fraction": 3},
        {"clip": 5},
        {"probe_margin": 7},
    ):
        (key,) = typed
        refused(name, typed, f"--config c.toml {key}=", f"{key} must be", source="--config c.toml")


def test_anchor_weight_is_reinforces_as_well():
    refused("reinforce", {"anchor_weight": "1.5"}, "anchor_weight must be a number in [0, 1]")
    refused("reinforce", {"init": "bogus"}, "init must be one of 'uniform', 'speed', 'memory', 'probe'")
    assert build_config("reinforce", {"init": "probe"}) == build_config("reinforce-probe")


def test_each_table_of_the_paper_differs_from_the_next_in_one_mechanism():
    """The paper's tables (uniform start, probe start, probe start with local moves): a ``-probe`` variant
    is its method's default start without local moves, a ``-local`` one the same with them."""
    for name in (
        "post-paper",
        "ce-paper",
        "ppo-paper",
        "reinforce-paper",
        "post-probe",
        "ce-probe",
        "ppo-probe",
        "reinforce-probe",
        "hp-probe",
        "post-start",
    ):
        assert build_config(name).use_local is False, name
    for name in ("post", "ce", "ppo", "reinforce-local", "hp-local", "local"):
        assert build_config(name).use_local is True, name
    for method in ("post", "ce", "ppo"):
        assert build_config(f"{method}-probe") == dataclasses.replace(build_config(method), use_local=False)
    for method in ("reinforce", "hp"):
        assert build_config(f"{method}-local") == dataclasses.replace(build_config(f"{method}-probe"), use_local=True)


def test_a_toml_file_is_checked(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text("[post]\nelite_fraction = 3\n")
    refused("post", read_config_file(path, "post"), "elite_fraction=3", "in (0, 1]", source=f"--config {path}")
    path.write_text("[anneal]\ninit = [0, -1]\n")
    refused(
        "anneal",
        read_config_file(path, "anneal"),
        "init=0,-1",
        "'random' or a list of integers >= 0",
        source=f"--config {path}",
    )
    path.write_text("[anneal]\ninit = [1, 0]\n")
    assert build_config("anneal", read_config_file(path, "anneal")).init == (1, 0)


def test_anneal_init_from_set_is_a_placement():
    assert build_config("anneal", {"init": "0,1,1"}).init == (0, 1, 1)
    assert build_config("anneal", {"init": "random"}).init == "random"
    refused("anneal", {"init": "0,x"}, "init=0,x: init must be 'random' or a list of integers >= 0")


def test_integers_out_of_shape_are_one_error_not_an_internal_one():
    refused("post", {"batch_size": "-3"}, "batch_size=-3: batch_size must be an integer >= 1")
    refused("post", {"batch_size": "--3"}, "batch_size", "not an integer")
    refused("post", {"batch_size": "9" * 5000}, "batch_size", "not an integer")
    refused("post", {"batch_size": 2.0}, "batch_size", "not an integer", source="config")
    refused("post", {"lr": "inf"}, "lr", "finite")
    refused("post", {"lr": "0"}, "lr=0: lr must be a number > 0")
    refused("anneal", {"min_temperature": 0}, "min_temperature must be a number > 0", source="config")


def test_a_config_dict_given_to_place_is_checked(tmp_path):
    g = fuzz.base_graph()
    with pytest.raises(PostplaceError, match=r"config clip=5: clip must be a number in \(0, 1\)"):
        postplace.place(g, "k80x2", budget=4, config={"clip": 5}, out=tmp_path / "run")
    with pytest.raises(PostplaceError, match=r"config cooling=1.5: cooling must be a number in \(0, 1\]"):
        postplace.place(g, "k80x2", strategy="anneal", budget=4, config={"cooling": 1.5}, out=tmp_path / "run")
    assert not (tmp_path / "run" / "placement.json").exists()


def test_the_cli_refuses_ce_every_0_with_one_error_line(tmp_path, capsys):
    fuzz.base_graph().save(tmp_path / "g.json")
    base = ["place", str(tmp_path / "g.json"), "--cluster", "k80x2", "--budget", "4", "--out", str(tmp_path / "r")]
    err = cli_error([*base, "--set", "ce_every=0"], capsys)
    assert "ce_every=0: ce_every must be an integer >= 1 (samples between cross-entropy steps)" in err, err
    (tmp_path / "c.toml").write_text("[post]\neps = 2.0\n")
    err = cli_error([*base, "--config", str(tmp_path / "c.toml")], capsys)
    assert "eps must be none or a number in [0, 1)" in err, err
    assert not (tmp_path / "r" / "placement.json").exists()


def test_cli_names_the_flag_and_an_anneal_start_of_the_wrong_length_is_one_line(tmp_path, capsys):
    from postplace.testing import fuzz
    from tests.clihelp import cli_error

    fuzz.base_graph().save(tmp_path / "g.json")
    g = str(tmp_path / "g.json")
    err = cli_error(["place", g, "--cluster", "k80x2", "--budget", "4", "--set", "ce_every=0"], capsys)
    assert err.startswith("error: --set ce_every=0: ce_every must be an integer >= 1")
    err = cli_error(
        [
            "place",
            g,
            "--cluster",
            "k80x2",
            "--budget",
            "4",
            "--strategy",
            "anneal",
            "--groups",
            "none",
            "--set",
            "init=0,1",
        ],
        capsys,
    )
    assert "one device id per unit" in err
