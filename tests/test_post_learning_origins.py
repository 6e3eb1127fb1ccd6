"""Issue 32: local moves are an add-on, not Post; every sample records its origin.

(a) On an instance whose optimum is far from every probe start and out of reach of one or two moves,
Post without local moves finds it and local moves alone (``local``) do not; on an instance made for
hill-climbing, ``local`` does. (b) Every line of ``history.jsonl`` has an origin, and the new bests per
origin in ``summary.json`` and ``compare.json`` add up to the new bests after the probe. (c) The
strategies named after the paper draw no local move. Plus the add-on on every other strategy, and the
start recorded as the probe's fastest candidate with the anchored start beside it.
"""

import dataclasses
import itertools
import json
from collections import Counter

import numpy as np
import pytest

import postplace
from postplace.cluster import load_cluster
from postplace.comparison import compare, parse_strategies
from postplace.search import Budget, SearchSpace, config_class, make_problem, make_strategy, run
from postplace.search.config import build_config
from postplace.search.history import HISTORY
from postplace.search.local import WithLocalMoves
from postplace.search.origins import origin_stats
from postplace.search.starts import StartProbe, start_record
from postplace.testing.contracts import check_strategy_contract, drive, toy_score
from tests.test_search_start import layered_graph

pytestmark = pytest.mark.usefixtures("torch_one_thread")

# ------------------------------------------------------------------------------ (a) two instances
G, B = 24, 6  # 24 units in 4 blocks of 6, on two devices (the second 3x slower: the probe starts on the first)
SPACE = SearchSpace(np.ones((G, 2), dtype=bool), failure_step_time=1e3, unit_time=np.tile([1.0, 3.0], (G, 1)))
# each block's target has three units on either device: three changes from either device alone
_rng = np.random.default_rng(0)
TARGET = np.concatenate([_rng.permutation([1, 0] * (B // 2)) for _ in range(G // B)])


def blocks(placements: np.ndarray):
    """A royal road: 1 s plus 1 s per block not exactly on its target; nothing in between (a block three
    units from its target costs what one six away does)."""
    hit = (placements.reshape(len(placements), G // B, B) == TARGET.reshape(G // B, B)).all(axis=2).sum(axis=1)
    return 1.0 + (G // B - hit), np.ones(len(placements), dtype=bool)


HILL_TARGET = np.random.default_rng(1).integers(0, 2, G)


def hill(placements: np.ndarray):
    """Made for hill-climbing: 1 s plus 0.1 s per unit off its device, every unit on its own."""
    return 1.0 + 0.1 * (placements != HILL_TARGET).sum(axis=1), np.ones(len(placements), dtype=bool)


def best_of(name: str, score, budget: int, seed: int) -> float:
    return float(min(score(p)[0].min() for p in drive(make_strategy(name, SPACE, seed=seed), SPACE, budget, score)))


def test_the_royal_road_is_far_from_every_probe_start_and_out_of_reach_of_one_or_two_moves():
    homes = [h for _, h in StartProbe(SPACE).candidates]
    assert homes
    for home in homes:
        start = blocks(home[None])[0][0]
        assert start == 1.0 + G // B  # no block on its target
        assert (home.reshape(-1, B) != TARGET.reshape(-1, B)).sum(axis=1).min() >= 3  # every block 3 units away
        near = []
        for k in (1, 2):  # every placement one or two decisions away...
            for units in itertools.combinations(range(G), k):
                p = home.copy()
                p[list(units)] = 1 - p[list(units)]
                near.append(p)
        for a in range(G):  # ...and every run of decisions set to one device (a segment move)
            for b in range(a + 1, G + 1):
                for d in (0, 1):
                    p = home.copy()
                    p[a:b] = d
                    near.append(p)
        assert (blocks(np.array(near))[0] == start).all()  # none is better than the start


def test_post_without_local_moves_finds_the_joint_optimum_that_local_moves_alone_miss():
    # the paper's Post (uniform start, no local moves): its samples hit blocks, the cross-entropy elite and
    # PPO keep them; local moves change one or two decisions of the incumbent and never complete a block
    # (over seeds 0-19: post-paper reached 1.0 in 19, local in 2, each with 2,400 samples)
    for seed in range(4):
        assert best_of("post-paper", blocks, 2400, seed) == 1.0, seed
        assert best_of("local", blocks, 2400, seed) > 1.0, seed


def test_local_moves_alone_climb_an_instance_made_for_hill_climbing():
    for seed in range(3):
        assert best_of("local", hill, 600, seed) == 1.0, seed
        assert best_of("random", hill, 600, seed) > 1.0, seed  # the optimum is no accident of sampling


# ------------------------------------------------------------------------------ (b) origins
def history(folder):
    return [json.loads(line) for line in (folder / HISTORY).read_text().splitlines()]


def new_bests_after_probe(rows) -> tuple[float | None, Counter]:
    """The probe's fastest feasible step time, and the new bests per origin after it, from a history."""
    feasible = [r for r in rows if not (r["oom"] or r["failed"])]
    probe = [r["step_time_s"] for r in feasible if r["origin"].startswith("probe:")]
    best = min(probe) if probe else None
    counts = Counter()
    for r in feasible:
        if r["origin"].startswith("probe:"):
            continue
        if best is None:
            best = r["step_time_s"]  # no probe: measured from the first feasible sample
        elif r["step_time_s"] < best:
            counts[r["origin"]] += 1
            best = r["step_time_s"]
    return (min(probe) if probe else None), counts


def test_every_history_line_has_an_origin_and_the_summary_counts_add_up(tmp_path):
    g, out = layered_graph(), tmp_path / "run"
    r = postplace.place(g, "k80x4", budget=240, groups=None, out=out, report=False)
    rows = history(out)
    assert len(rows) == 240
    probe = StartProbe(make_problem(g, load_cluster("k80x4"), groups=None, seed=0).space)
    names = {f"probe:{n}" for n, _ in probe.candidates}
    assert {row["origin"] for row in rows} <= names | {"policy", "local"}
    assert [row["origin"] for row in rows[: len(names)]] == [f"probe:{n}" for n, _ in probe.candidates]
    start, counts = new_bests_after_probe(rows)
    assert counts["policy"] + counts["local"] > 0  # the search improved on its start: the counts mean something
    summary = json.loads((out / "summary.json").read_text())
    s = summary["search_origins"]
    assert s == r.summary["search_origins"]
    assert s["start_step_time_s"] == start == summary["search_start"]["step_time_s"]
    assert s["final_step_time_s"] == summary["search_best_step_time_s"]
    searched = {k: v for k, v in s["new_bests"].items() if k != "candidate"}
    assert searched == {"policy": counts["policy"], "local": counts["local"], "warm": 0}
    shares = [v for k, v in s["gap_closed"].items() if k != "candidate"]
    lb = summary["lower_bound_s"]
    assert sum(shares) == pytest.approx((start - s["final_step_time_s"]) / (start - lb))
    candidate = summary["returned"] != "search" and summary["best_step_time_s"] < s["final_step_time_s"]
    assert s["new_bests"].get("candidate", 0) == int(candidate)
    assert summary["local_moves"] is True
    # a resumed run reads the origins of its first part back from the history
    again = postplace.resume(out, budget=336, report=False)
    rows = history(out)
    assert len(rows) == 336
    times = [np.inf if row["oom"] or row["failed"] else row["step_time_s"] for row in rows]
    assert searched_only(again.summary["search_origins"]) == searched_only(
        origin_stats([row["origin"] for row in rows], times, lb)
    )
    assert sum(searched_only(again.summary["search_origins"])["new_bests"].values()) == sum(
        new_bests_after_probe(rows)[1].values()
    )


def searched_only(stats: dict) -> dict:
    """Origin stats without the ``candidate`` entries (a ``place`` answer, not a sample of the search)."""
    return {
        k: ({o: n for o, n in v.items() if o != "candidate"} if isinstance(v, dict) else v) for k, v in stats.items()
    }


def test_a_warm_start_is_recorded_as_one(tmp_path):
    p = make_problem(layered_graph(), load_cluster("k80x4"), groups=None)
    warm = np.zeros(p.space.num_units, dtype=np.int64)
    r = run(make_strategy("post", p.space, seed=0), p.simulator, Budget(samples=60), out_dir=tmp_path, warm_start=warm)
    origins = [row["origin"] for row in history(tmp_path)]
    assert origins[0] == "warm" and origins[1].startswith("probe:") and r.origins == origins
    assert len(r.step_times) == 60 and r.step_times[0] == history(tmp_path)[0]["step_time_s"]


def test_compare_records_the_origins_and_whether_local_moves_were_on(tmp_path):
    names = ["post", "post-paper", "local", "reinforce"]
    rep = compare(layered_graph(), load_cluster("k80x4"), names, budget=96, seeds=2, out=tmp_path)
    rows = {r["strategy"]: r for r in rep["rows"]}
    assert {n: rows[n]["local_moves"] for n in names} == {
        "post": True,
        "post-paper": False,
        "local": True,
        "reinforce": False,
    }
    for name in names:
        total = Counter()
        for seed in rows[name]["per_seed"]:
            hist = history(tmp_path / "runs" / name / f"seed{seed['seed']}")
            start, counts = new_bests_after_probe(hist)
            o = seed["origins"]
            assert {k: v for k, v in o["new_bests"].items() if v} == {k: v for k, v in counts.items() if v}, name
            assert o["start_step_time_s"] == start and o["final_step_time_s"] == seed["best_step_time_s"]
            assert ("local" in {h["origin"] for h in hist}) == rows[name]["local_moves"], name
            total.update(o["new_bests"])
        assert rows[name]["new_bests"] == dict(total)
    for name in ("post", "local"):  # the same probe, its fastest candidate the start
        assert rows[name]["start_step_time_s"] == rows[name]["per_seed"][0]["origins"]["start_step_time_s"]
    assert "local" in parse_strategies("all")


def test_the_start_is_the_probes_fastest_candidate_with_the_anchored_start_beside_it():
    sp = make_problem(layered_graph(), load_cluster("k80x4")).space
    s = make_strategy("post", sp, seed=0)
    p = s.ask(100)
    assert s.last_origins[0] == "probe:fastest" and len(p) >= 2
    times = np.full(len(p), 2.0)
    times[:2] = [1.0, 0.95]  # the second is faster, but not by the probe's margin: the policy anchors on fastest
    s.tell(p, times, np.ones(len(p), dtype=bool), np.zeros(len(p)))
    assert s.start_name == "fastest" and s.start_step_time == 1.0
    second = s.probe.candidates[1][0]
    assert start_record(s) == {"name": second, "step_time_s": 0.95, "anchor_name": "fastest"}
    times[1] = 1.5  # now fastest is the fastest too: nothing beside it
    t = make_strategy("post", sp, seed=0)
    t.tell(t.ask(100), times, np.ones(len(p), dtype=bool), np.zeros(len(p)))
    assert start_record(t) == {"name": "fastest", "step_time_s": 1.0}
    assert start_record(make_strategy("post-paper", sp)) == {"name": "uniform", "step_time_s": None}


# ------------------------------------------------------------------------------ (c) paper strategies
PAPER = ["post-paper", "ce-paper", "ppo-paper", "reinforce-paper", "reinforce", "hp"]


@pytest.mark.parametrize("name", PAPER)
def test_the_strategies_named_after_the_paper_draw_no_local_move(name, tmp_path):
    cfg = config_class(name)[1]
    assert cfg.use_local is False
    if name == "hp":
        cfg = dataclasses.replace(cfg, grouper_hidden=8, placer_hidden=16, device_embedding=8)
    p = make_problem(layered_graph(), load_cluster("k80x4"), groups=None)
    s = make_strategy(name, p.space, seed=0, config=cfg)
    assert not isinstance(s, WithLocalMoves) and not s.config.use_local
    run(s, p.simulator, Budget(samples=120), out_dir=tmp_path)
    origins = {row["origin"].split(":")[0] for row in history(tmp_path)}
    assert "local" not in origins and "policy" in origins


def test_post_and_the_add_on_do_draw_local_moves_and_they_stay_near_the_incumbent():
    """The check above can fail: Post's default and any strategy given the add-on label moves as such, and
    those are the incumbent changed in a few decisions (or a run of them), never a placement told before."""
    for name in ("post", "reinforce", "anneal", "random", "hp"):
        cfg = build_config(name, {"use_local": True})
        if name == "hp":
            cfg = dataclasses.replace(cfg, grouper_hidden=8, placer_hidden=16, device_embedding=8)
        s = make_strategy(name, SPACE, seed=1, config=cfg)
        assert (name == "post") != isinstance(s, WithLocalMoves)
        told, moves, own = set(), 0, 0
        best, best_t = None, np.inf
        for _ in range(12):
            p = np.atleast_2d(s.ask(200))
            origins = s.last_origins
            assert len(origins) == len(p) and set(origins) <= {"policy", "local"} | {
                o for o in origins if o.startswith("probe:")
            }
            n_local = origins.count("local")
            if best is not None and not any(o.startswith("probe:") for o in origins):
                assert n_local <= 0.5 * len(p) + 1, (name, n_local, len(p))  # the same share, or fewer once
                if not moves:  # the incumbent's neighbourhood is spent; the first batch gets them all
                    assert n_local == pytest.approx(0.5 * len(p), abs=1), (name, n_local, len(p))
            for row, o in zip(p, origins, strict=True):
                if o == "local":
                    assert row.tobytes() not in told
                    changed = np.flatnonzero(row != best)  # a few decisions, or a run set to one device
                    assert changed.size and (changed.size <= 6 or np.unique(row[changed]).size == 1), name
                    moves += 1
                else:
                    own += 1
            t = hill(p)[0]
            s.tell(p, t, np.ones(len(p), dtype=bool), np.zeros(len(p)))
            told |= {row.tobytes() for row in p}
            if t.min() < best_t:
                best, best_t = p[int(np.argmin(t))].copy(), float(t.min())
        assert moves > 0 and own > 0, name


@pytest.mark.parametrize("name", ["reinforce", "anneal", "random", "hp"])
def test_the_add_on_keeps_every_strategys_contract(name):
    cfg = build_config(name, {"use_local": True})
    if name == "hp":
        cfg = dataclasses.replace(cfg, grouper_hidden=8, placer_hidden=16, device_embedding=8)
    space = SearchSpace(
        np.array([[True, True, True], [True, False, True], [False, True, False]] * 4), failure_step_time=1e3
    )
    check_strategy_contract(lambda sp, seed: make_strategy(name, sp, seed=seed, config=cfg), space)
    s = make_strategy(name, space, seed=0, config=cfg)
    drive(s, space, 96, toy_score(space))
    assert s.local.best_placement is not None and s.told == 96
