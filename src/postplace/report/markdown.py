"""The paper experiment's headline table as fixed-width text: ``paper.md``, what ``postplace paper``
prints, and the table of the paper report's HTML page, all drawn from the data
:func:`postplace.paper.run_paper` writes to ``paper.json``.

It lives in ``report/`` so that the report draws the table without importing :mod:`postplace.paper`
(DESIGN.md section 1: a lower box never imports a higher one); :mod:`postplace.paper` takes the table
and its column order from here.
"""

from __future__ import annotations

__all__ = ["COLUMNS", "RIVALS", "format_table"]

RIVALS = ("post-paper", "ce", "ppo", "reinforce", "hp")
"""The search strategies Post is measured against (its own ablations and the RL methods), in column order."""
COLUMNS = (*RIVALS, "best heuristic", "single", "data-parallel", "pipeline")
"""Every column a headline may have, in table order: the rivals, the best one-shot heuristic that fits,
the fastest single device, data parallelism and the pipeline."""


def _pct(v: float | None) -> str:
    return "-" if v is None else f"{v * 100:+.1f}%"


def format_table(data: dict) -> str:
    """The headline table of ``data`` (a ``paper.json``) as fixed-width text (also valid inside a
    Markdown code block): one line per model x machine with Post's step-time reduction against each
    rival present, then Post against the RL methods next to the paper's claim, then what a collected
    experiment left out."""
    cfg = data["config"]
    cols = [r for r in COLUMNS if any(r in h["reduction"] for h in data["headline"])]
    lines = [
        f"Post's step-time reduction 1 - post/rival (median of {cfg['seeds']} seeds; {cfg['budget']} samples per "
        f"search; hp {cfg['planner_budget']} samples x {cfg.get('planner_seeds', cfg['seeds'])} seeds; "
        f"{cfg['size']} models; simulated)"
        + ("; collected: finished runs only, see the last lines" if any((data.get("missing") or {}).values()) else ""),
        f"{'model':<13} {'cluster':<7} {'post ms':>9} " + " ".join(f"{'vs ' + c:>{max(9, len(c) + 3)}}" for c in cols)
        + "  hp seeds",
    ]  # fmt: skip
    for h in data["headline"]:
        post = "-" if h["post_s"] is None else f"{h['post_s'] * 1e3:.2f}"
        lines.append(f"{h['model']:<13} {h['cluster']:<7} {post:>9} "
                     + " ".join(f"{_pct(h['reduction'].get(c)):>{max(9, len(c) + 3)}}" for c in cols)
                     + f"  {h.get('hp_seeds') or '-':>8}")  # fmt: skip
    rl = [s for s in ("hp", "reinforce") if s in data["summary"]]
    for s in rl:
        v = data["summary"][s]
        claim = data["paper_claim"]["max_reduction_vs_rl"] * 100
        lines.append(f"vs {s}: Post faster on {v['post_faster']}/{v['pairs']} pairs, median {_pct(v['median'])}, "
                     f"largest {_pct(v['max'])}; the paper: up to {claim:.1f}% vs the RL state of the art")  # fmt: skip
    for pair, names in (data.get("missing") or {}).items():
        if names:
            lines.append(f"{pair}: not finished, left out: {', '.join(names)}")
    return "\n".join(lines)
