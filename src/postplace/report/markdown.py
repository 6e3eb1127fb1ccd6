"""The paper experiment's headline table as fixed-width text: ``paper.md``, what ``postplace paper``
prints, and the table of the paper report's HTML page, all drawn from the data
:func:`postplace.paper.run_paper` writes to ``paper.json``.

It lives in ``report/`` so that the report draws the table without importing :mod:`postplace.paper`
(DESIGN.md section 1: a lower box never imports a higher one); :mod:`postplace.paper` takes the table
and its column order from here.
"""

from __future__ import annotations

__all__ = ["COLUMNS", "EFFECTS", "OTHERS", "RIVALS", "TABLES", "format_table", "method"]

TABLES = {
    "uniform": {
        "start": "the paper's uniform start, no local moves",
        "post": "post-paper",
        "rivals": ("ce-paper", "ppo-paper", "reinforce-paper", "hp"),
    },
    "probe": {
        "start": "Post's probe start, no local moves",
        "post": "post-probe",
        "rivals": ("post-start", "ce-probe", "ppo-probe", "reinforce-probe", "hp-probe"),
    },
    "local": {
        "start": "Post's probe start, with local moves",
        "post": "post",
        "rivals": ("local", "ce", "ppo", "reinforce-local", "hp-local"),
    },
}
"""Post against each rival three times, every strategy of a table from the same start and with local
moves alike: the paper's uniform start without local moves (the paper's algorithms; ``hp`` starts as the
paper's, from its random weights), Post's default probe start without them (``post-start``: that start
sampled with no learning), and that start with them (``local``: the moves alone, no policy). Per table:
what the start is, Post's strategy name, and its rivals' names, in column order."""
EFFECTS = {
    "local moves": (
        ("post-probe", "post"),
        ("post-start", "local"),
        ("ce-probe", "ce"),
        ("ppo-probe", "ppo"),
        ("reinforce-probe", "reinforce-local"),
        ("hp-probe", "hp-local"),
    ),
    "the probe start": (
        ("post-paper", "post-probe"),
        ("ce-paper", "ce-probe"),
        ("ppo-paper", "ppo-probe"),
        ("reinforce-paper", "reinforce-probe"),
        ("hp", "hp-probe"),
    ),
}
"""What one mechanism adds to each method, read across two tables that differ only in it: per
``(without, with)`` pair of strategies, ``1 - with / without`` on each model x machine (positive: the
mechanism shortens the step). ``post-start`` -> ``local`` is what local moves add to the start alone."""
OTHERS = ("best heuristic", "single", "data-parallel", "pipeline")
"""Columns every table has after its rivals: the best one-shot heuristic that fits, the fastest single
device, data parallelism and the pipeline."""
RIVALS = ("post-paper", "ce", "ppo", "reinforce", "hp")
"""The rivals of a ``paper.json`` from before the two tables (Post's default against each, whatever its
start), so that such a folder still reports."""
COLUMNS = (*dict.fromkeys((*RIVALS, *(r for t in TABLES.values() for r in t["rivals"]))), *OTHERS)
"""Every column a headline may have, in table order."""


def method(name: str) -> str:
    """The method behind a strategy name, its named start dropped: ``hp-probe`` -> ``hp``,
    ``ce-paper`` -> ``ce``, ``reinforce-local`` -> ``reinforce`` (``post-start`` and ``local`` stay: they
    are no learning method)."""
    for suffix in ("-paper", "-probe", "-local"):
        if name.endswith(suffix):
            return name[: -len(suffix)]
    return name


def _pct(v: float | None) -> str:
    return "-" if v is None else f"{v * 100:+.1f}%"


def format_table(data: dict) -> str:
    """The headline tables of ``data`` (a ``paper.json``) as fixed-width text (also valid inside a
    Markdown code block): per start (:data:`TABLES`) one line per model x machine with Post's step-time
    reduction against each rival present, then Post against the RL methods next to the paper's claim,
    naming the start; then each search's start and the share of the gap to the lower bound learning
    closed; then what a collected experiment left out. A ``paper.json`` from before the two tables
    gives its one table."""
    cfg = data["config"]
    lines = [
        f"Post's step-time reduction 1 - post/rival (median of {cfg['seeds']} seeds; {cfg['budget']} samples per "
        f"search; hp {cfg['planner_budget']} samples x {cfg.get('planner_seeds', cfg['seeds'])} seeds; "
        f"{cfg['size']} models; simulated)"
        + ("; collected: finished runs only, see the last lines" if any((data.get("missing") or {}).values()) else ""),
    ]
    claim = data["paper_claim"]["max_reduction_vs_rl"] * 100
    tables = data.get("tables")
    if not isinstance(tables, dict):  # a paper.json from before: Post's default against every rival
        lines += _table(data["headline"], "post", COLUMNS)
        for s in (s for s in ("hp", "reinforce") if s in data["summary"]):
            lines.append(_rl_line(f"vs {s}: Post", data["summary"][s], claim))
    for t in (tables or {}).values():
        lines += ["", f"From {t['start']}: {t['post']} against {', '.join(t['rivals'])}"]
        lines += _table(t["headline"], t["post"], (*t["rivals"], *OTHERS))
        for s in sorted(
            (s for s in t["rivals"] if method(s) in ("hp", "reinforce") and s in t["summary"]),
            key=lambda s: method(s) != "hp",
        ):
            lines.append(_rl_line(f"From {t['start']}, Post ({t['post']}) vs {s}:", t["summary"][s], claim))
    for mechanism, e in (data.get("effects") or {}).items():
        lines += ["", f"What {mechanism} add to each method: 1 - with/without, per pair (positive: shorter step)"]
        lines += _effect_table(e)
    lines += _starts(data.get("starts") or {})
    for pair, names in (data.get("missing") or {}).items():
        if names:
            lines.append(f"{pair}: not finished, left out: {', '.join(names)}")
    return "\n".join(lines)


def _table(heads: list[dict], post: str, columns) -> list[str]:
    """One line per model x machine: Post's time and its reduction against each of ``columns`` present."""
    cols = [r for r in columns if any(r in h["reduction"] for h in heads)]
    lines = [
        f"{'model':<13} {'cluster':<7} {post + ' ms':>10} "
        + " ".join(f"{'vs ' + c:>{max(9, len(c) + 3)}}" for c in cols)
        + "  hp seeds"
    ]
    for h in heads:
        ms = "-" if h["post_s"] is None else f"{h['post_s'] * 1e3:.2f}"
        lines.append(
            f"{h['model']:<13} {h['cluster']:<7} {ms:>{max(10, len(post) + 3)}} "
            + " ".join(f"{_pct(h['reduction'].get(c)):>{max(9, len(c) + 3)}}" for c in cols)
            + f"  {h.get('hp_seeds') or '-':>8}"
        )
    return lines


def _effect_table(e: dict) -> list[str]:
    """One line per model x machine, a column per ``without -> with`` pair, then each column's median."""
    cols = list(e["summary"])
    width = [max(9, len(c)) for c in cols]
    lines = [f"{'pair':<24} " + " ".join(f"{c:>{w}}" for c, w in zip(cols, width, strict=True))]
    for pair, vals in e["pairs"].items():
        lines.append(f"{pair:<24} " + " ".join(f"{_pct(vals.get(c)):>{w}}" for c, w in zip(cols, width, strict=True)))
    lines.append(
        f"{'median':<24} "
        + " ".join(f"{_pct(e['summary'][c]['median']):>{w}}" for c, w in zip(cols, width, strict=True))
    )
    return lines


def _rl_line(who: str, v: dict, claim: float) -> str:
    return (
        f"{who} faster on {v['post_faster']}/{v['pairs']} pairs, median {_pct(v['median'])}, largest "
        f"{_pct(v['max'])}; the paper: up to {claim:.1f}% vs the RL state of the art"
    )


def _starts(starts: dict) -> list[str]:
    """Per pair, each search that recorded a start: its name and step time, the final step time and
    the share of the gap to the lower bound learning closed, ``(start - final) / (start - LB)``."""
    rows = [
        (pair, name, r)
        for pair, d in starts.items()
        for name, r in (d.get("strategies") or {}).items()
        if r.get("start_step_time_s") is not None
    ]
    if not rows:
        return []
    lines = [
        "",
        "Each search's start (where probed) and the share of the gap to the lower bound the search closed, "
        "(start - final) / (start - lower bound); post-start's is what sampling the start alone closes",
        f"{'pair':<24} {'strategy':<16} {'start':<12} {'start ms':>10} {'final ms':>10} {'gap closed':>10}",
    ]
    for pair, name, r in rows:
        final = "-" if r.get("final_step_time_s") is None else f"{r['final_step_time_s'] * 1e3:.2f}"
        gap = "-" if r.get("gap_closed") is None else f"{r['gap_closed'] * 100:.1f}%"
        lines.append(
            f"{pair:<24} {name:<16} {str(r.get('start_name')):<12} "
            f"{r['start_step_time_s'] * 1e3:>10.2f} {final:>10} {gap:>10}"
        )
    return lines
