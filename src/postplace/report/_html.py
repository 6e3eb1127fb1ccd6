"""The report as one self-contained HTML page: inline CSS, the PNG figures embedded as base64 (and
linked beside the page), tables from the report data; no script, nothing fetched from the network."""

from __future__ import annotations

import base64
import html
import math
from pathlib import Path

from postplace.report._build import seeds_of
from postplace.report.text import clip

NOTE_CELL = 80
"""Characters of a note in a cell of the per-m table (cut at a word; the step-time table holds it whole)."""

CSS = """
body { font-family: system-ui, sans-serif; margin: 1.5em auto; max-width: 1250px; color: #222; }
h1 { font-size: 1.45em; } h2 { font-size: 1.15em; margin-top: 1.6em; border-bottom: 1px solid #ddd; }
table { border-collapse: collapse; font-size: 0.85em; margin: 0.5em 0; }
th, td { border: 1px solid #ccc; padding: 2px 7px; text-align: left; }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
figure { margin: 0.8em 0; } figcaption { font-size: 0.85em; color: #555; }
img { max-width: 100%; height: auto; border: 1px solid #eee; }
.tag { background: #eef; border-radius: 3px; padding: 0 4px; font-size: 0.85em; }
pre { background: #f7f7f7; padding: 0.6em; font-size: 0.8em; overflow-x: auto; }
table.inner { font-size: 1em; margin: 0; } table.inner th { font-weight: 600; background: #fafafa; }
th { background: #f3f3f3; } p.note { font-size: 0.85em; color: #555; margin-top: 0; }
"""

FIGURE_TEXT = {
    "curves_samples": (
        "Learning curves against samples",
        "Best feasible step time found so far; line: median over seeds, band: min to max.",
    ),
    "curves_wall": ("Learning curves against wall time", "One line per seed; log time axis."),
    "bars": (
        "Best step time per strategy",
        "Search rows: median over seeds with the min-max range; hatched: one-shot placers (//) and data "
        "parallelism (xx: micro-batch k on GPU k, simulated where the model can be traced again, else an "
        "analytic estimate).",
    ),
    "gantt": (
        "Schedule of the returned placement (simulated)",
        "One lane per device (ops coloured by phase) and one per port or link that carried a transfer "
        "(coloured by the phase of the op that produced the tensor).",
    ),
    "memory_peak": ("Peak memory per device", "Bars: peak of the returned placement; black marks: capacity."),
    "memory_time": ("Memory over the step", "Bytes held on each device, every change of the simulation."),
    "placement_map": ("Placement map (picture)", "Ops of each module per device, one panel per phase."),
    "paper_reductions": ("Post's step-time reduction against each rival", "1 - post / rival; blue: Post faster."),
}


def esc(x) -> str:
    return html.escape(str(x), quote=True)


def _ms(v) -> str:
    return "-" if not isinstance(v, int | float) else f"{v * 1e3:.3f}"


def sig(v: float, n: int = 3) -> str:
    """``v`` to ``n`` significant digits, in plain notation from 1e-4 to 1e9 (0.0351, 12.3, 45600)."""
    if not math.isfinite(v) or v == 0:
        return f"{v:g}"
    mag = math.floor(math.log10(abs(v)))
    if mag < -4 or mag >= 9:
        return f"{v:.{n - 1}e}"
    r = round(v, n - 1 - mag)
    mag = math.floor(math.log10(abs(r)))  # 0.9996 rounds up to 1.00
    return f"{r:.{max(n - 1 - mag, 0)}f}"


def human_bytes(v: float) -> str:
    """Bytes to 3 significant digits in B, kB, MB, GB or TB (decimal units, as the CLI prints GB)."""
    if not v:
        return "0 B"
    for unit, scale in (("B", 1.0), ("kB", 1e3), ("MB", 1e6), ("GB", 1e9)):
        if abs(float(sig(v / scale))) < 1000:  # 999.6 B is 1.00 kB
            return f"{v:.0f} B" if unit == "B" else f"{sig(v / scale)} {unit}"
    return f"{sig(v / 1e12)} TB"


def _flops(v: float) -> str:
    for unit, scale in (("TFLOP", 1e12), ("GFLOP", 1e9), ("MFLOP", 1e6), ("kFLOP", 1e3)):
        if abs(v) >= scale:
            return f"{sig(v / scale)} {unit}"
    return f"{sig(v)} FLOP"


def percent(v: float) -> str:
    return f"{v:.1f}%" if v >= 10 else f"{sig(v, 2)}%"


def _label(key: str) -> str:
    """A provenance key as a person reads it: ``wall_time_s`` -> ``wall time``."""
    for suffix in ("_s", "_bytes"):
        if key.endswith(suffix):
            key = key[: -len(suffix)]
    return key.replace("_", " ")


def _scalar(key: str, v) -> str:
    """One provenance value as text: seconds to 3 significant digits, bytes and FLOPs in units, other
    floats to 4 significant digits."""
    if isinstance(v, bool):
        return "yes" if v else "no"
    if v is None:
        return "none"
    if isinstance(v, int | float):
        if key.endswith("_s"):
            return f"{sig(float(v))} s"
        if key.endswith("_bytes"):
            return human_bytes(float(v))
        if key.endswith("flops"):
            return _flops(float(v))
        return str(v) if isinstance(v, int) else _trim(sig(v, 4))
    return str(v)


def _trim(text: str) -> str:
    """``0.1250`` -> ``0.125``, ``2.000`` -> ``2`` (a setting is read as written, not as a measurement)."""
    return text.rstrip("0").rstrip(".") if "." in text and "e" not in text else text


def _is_scalar(v) -> bool:
    return v is None or isinstance(v, bool | int | float | str)


def _scalar_list(v) -> bool:
    return isinstance(v, list | tuple) and len(v) <= 8 and all(_is_scalar(x) for x in v)


def _inline(key: str, v) -> str:
    return "[" + ", ".join(_scalar(key, x) for x in v) + "]" if isinstance(v, list | tuple) else _scalar(key, v)


def _value_html(key: str, v) -> str:
    """A provenance value as HTML: scalars as text, a list of scalars joined, a small dict of scalars as
    ``key: value`` pairs on one line, a list of dicts as a table, any other dict as a nested table."""
    if _is_scalar(v):
        return esc(_scalar(key, v))
    if isinstance(v, list | tuple):
        if key == "seeds" and v and all(_is_scalar(x) for x in v):
            return esc(f"{len(v)} ({', '.join(str(x) for x in v)})")
        if all(_is_scalar(x) for x in v):
            return esc(", ".join(_scalar(key, x) for x in v)) if v else "none"
        if all(isinstance(x, dict) for x in v):
            cols = list(dict.fromkeys(k for x in v for k in x))
            head = "".join(f"<th>{esc(_label(k))}</th>" for k in cols)
            body = "".join("<tr>" + "".join(f"<td>{_value_html(k, x.get(k))}</td>" for k in cols) + "</tr>" for x in v)
            return f"<table class=inner><tr>{head}</tr>{body}</table>"
        return esc(", ".join(str(x) for x in v))
    if isinstance(v, dict):
        if not v:
            return "none"
        if len(v) <= 10 and all(_is_scalar(x) or _scalar_list(x) for x in v.values()):
            return esc(", ".join(f"{_label(k)}: {_inline(k, x)}" for k, x in v.items()))
        return kv_table(v, inner=True)
    return esc(v)


def kv_table(d: dict, *, inner: bool = False) -> str:
    """A dict as a two-column table, one ``key | value`` row per entry (:func:`_value_html`)."""
    rows = "".join(f"<tr><th>{esc(_label(k))}</th><td>{_value_html(k, v)}</td></tr>" for k, v in d.items())
    return f"<table{' class=inner' if inner else ''}>{rows}</table>"


def table(headers: list[str], rows: list[list[str]], num: set[int] = frozenset()) -> str:
    """An HTML table of text cells; a column none of whose cells holds anything is left out (so every
    column shown has a header and a value). ``num``: indices of right-aligned numeric columns."""
    keep = [j for j in range(len(headers)) if any(r[j] not in ("", None) for r in rows)]
    out = ["<table><tr>" + "".join(f"<th>{esc(headers[j])}</th>" for j in keep) + "</tr>"]
    for r in rows:
        out.append("<tr>" + "".join(f"<td{' class=num' if j in num else ''}>{esc(r[j])}</td>" for j in keep) + "</tr>")
    out.append("</table>")
    return "".join(out)


KIND_TEXT = {
    "returned": "returned",
    "search": "search",
    "placer": "one-shot placer",
    "single": "single device",
    "data-parallel": "data parallelism",
    "warm start": "warm start",
    "bound": "reference",
}


def _within_error_text(data: dict) -> str:
    """The candidates the cost model cannot rank apart from the answer, as the run recorded them."""
    prov = data.get("provenance") or {}
    names, err = prov.get("within_error") or [], prov.get("cost_model_error")
    if not names or not isinstance(err, int | float):
        return ""
    return (
        f"<p class=note>Within the cost model's error of the returned one ({err:.0%}: how far its rates were off a "
        f"published run): {esc(', '.join(names))}; the simulator cannot rank these apart from it.</p>"
    )


def _bars_table(data: dict) -> str:
    lines = data["lines"]
    single, lb = lines.get("single_device_s"), lines.get("lower_bound_s")
    n_seeds = seeds_of(data)
    rows = list(data["bars"])
    if not any(b["kind"] == "single" for b in rows) and isinstance(single, int | float):
        rows.append({"label": "best single device", "kind": "bound", "best_s": single, "note": ""})
    if isinstance(lb, int | float):
        which = (data.get("lower_bound") or {}).get("which", "")
        rows.append({"label": "lower bound", "kind": "bound", "best_s": lb, "note": which})
    any_oom = any(b.get("oom") for b in rows)
    body = []
    for b in rows:
        v = b.get("best_s")
        many = b["kind"] == "search" and (b.get("seeds") or 1) > 1 and b.get("min_s") is not None
        rng = f"{_ms(b['min_s'])} - {_ms(b['max_s'])}" if many else ""
        r1 = f"{v / single:.3f}" if isinstance(v, int | float) and isinstance(single, int | float) and single else "-"
        r2 = f"{v / lb:.3f}" if isinstance(v, int | float) and isinstance(lb, int | float) and lb else "-"
        oom = str(b.get("oom") or 0) if any_oom and b["kind"] != "bound" else ""
        body.append(
            [
                b["label"],
                KIND_TEXT.get(b["kind"], b["kind"]),
                _ms(v),
                rng,
                r1,
                r2,
                oom,
                start_text(b.get("start")),
                b.get("note", ""),
            ]
        )
    best = f"best ms (search: median of {n_seeds} seeds)" if n_seeds > 1 else "best ms"
    headers = [
        "strategy",
        "kind",
        best,
        f"range ms (min - max over {n_seeds} seeds)",
        "/ single",
        "/ LB",
        "OOM seeds",
        "search start (ms)",
        "note",
    ]
    return table(headers, body, num={2, 3, 4, 5, 6})


def start_text(start: dict | None) -> str:
    """A search's start as a cell: ``part4-work, 123.4 ms``, or its name alone when it was not probed."""
    if not isinstance(start, dict) or start.get("name") is None:
        return ""
    t = start.get("step_time_s")
    return start["name"] + (f", {sig(t * 1e3, 4)} ms" if isinstance(t, int | float) else " (not probed)")


def start_line(data: dict) -> str:
    """The place report's line on the search's start: ``Search start: part4-work, 123.4 ms
    (simulated)``; per micro-batch count where the run searched several; empty when none was recorded."""
    st = data.get("search_start")
    if not isinstance(st, dict):
        return ""
    kind = (
        f" ({st['kind']})"
        if st.get("kind") and any(isinstance(x.get("step_time_s"), int | float) for x in [st, *st.get("per_m", [])])
        else ""
    )
    if len(st.get("per_m", [])) > 1:
        text = "; ".join(f"m={x['m']}: {start_text(x)}" for x in st["per_m"])
    elif st.get("name") is not None:
        text = start_text(st)
    else:
        return ""
    return f"<p>Search start: {esc(text)}{esc(kind)}.</p>"


def _by_m_table(data: dict) -> str:
    """A place run over several micro-batch counts: every candidate's step time at each count."""
    cands = [c for c in data.get("candidates", []) if c["m"] is not None]
    ms = sorted({c["m"] for c in cands})
    if len(ms) < 2:
        return ""
    names = list(dict.fromkeys(c["name"] for c in cands))
    at = {(c["name"], c["m"]): c for c in cands}
    body = []
    for name in names:
        row = [name]
        for m in ms:
            c = at.get((name, m))
            if c is None:
                row.append("not tried")
            elif c["best_s"] is None:
                row.append(clip(c["note"] or "none", NOTE_CELL))
            else:
                row.append(_ms(c["best_s"]))
        body.append(row)
    return (
        "<p>Every candidate at each micro-batch count m (ms; the table above keeps each one's fastest m; "
        "summary.json holds them all):</p>"
        + table(["candidate"] + [f"m={m} ms" for m in ms], body, num=set(range(1, len(ms) + 1)))
    )


def _map_table(pm: dict) -> str:
    phases = pm["phases"]
    body = []
    for r in pm["modules"]:
        cells = [r["module"]]
        for p in phases:
            cnt = r["counts"].get(p)
            if not cnt:
                cells.append("-")
            elif len(cnt) == 1:
                cells.append(next(iter(cnt)))
            else:
                cells.append(" / ".join(f"{d} {k}" for d, k in sorted(cnt.items())))
        body.append(cells)
    return table(["module"] + phases, body)


def _memory_table(m: dict) -> str:
    body = []
    for d, p, c in zip(m["devices"], m["peak_bytes"], m["capacity_bytes"], strict=True):
        body.append(
            [
                d,
                human_bytes(p),
                human_bytes(c),
                percent(p / c * 100) if c else "-",
                "OOM" if d in m["oom_devices"] else "",
            ]
        )
    return table(["device", "peak", "capacity", "used", "OOM"], body, num={1, 2, 3})


def _figure(folder: Path, name: str, fig: dict, text: dict | None = None, link: str = "") -> str:
    """A figure embedded, with a link to its file (``link``: the files' folder as the page reaches it)."""
    title, caption = (text or FIGURE_TEXT).get(name, (name, ""))
    b64 = base64.b64encode((folder / fig["file"]).read_bytes()).decode("ascii")
    path = link + fig["file"]
    return (
        f'<figure id="fig-{esc(name)}"><h3>{esc(title)}</h3>'
        f'<img alt="{esc(title)}" width="{fig["width_px"]}" height="{fig["height_px"]}" '
        f'src="data:image/png;base64,{b64}">'
        f'<figcaption>{esc(caption)} File: <a href="{esc(path)}">{esc(path)}</a></figcaption>'
        "</figure>"
    )


def captions(data: dict) -> dict:
    """The figures' titles and captions, worded for the report's number of seeds, naming what a figure drew
    off scale."""
    text = dict(FIGURE_TEXT)
    kinds = {b["kind"] for b in data.get("bars", [])}
    hatched = [
        what
        for kind, what in (
            ("placer", "one-shot placers (//)"),
            (
                "data-parallel",
                "data parallelism (xx: micro-batch k on GPU k, simulated "
                "where the model can be traced again, else an analytic "
                "estimate)",
            ),
            ("warm start", "the warm start (..)"),
        )
        if kind in kinds
    ]
    n = seeds_of(data)
    bars = "Search rows: " + (f"median over {n} seeds with the min-max range" if n > 1 else "the best of one seed")
    bars += ("; hatched: " + " and ".join(hatched) if hatched else "") + ". Labels: step time in ms."
    text["bars"] = (text["bars"][0], bars)
    if n == 1:
        text["curves_samples"] = ("Learning curves against samples", "Best feasible step time found so far (one seed).")
        text["curves_wall"] = ("Learning curves against wall time", "Log time axis.")
    for name, (title, caption) in list(text.items()):
        off = (data.get("figures") or {}).get(name, {}).get("off_scale")
        if off:
            text[name] = (
                title,
                f"{caption} Off scale (far past the rest, so the axis stops short of it, to keep "
                f"the others readable): {'; '.join(off)}.",
            )
    return text


def _map_text(pm: dict) -> str:
    depth = ""
    if pm.get("depth") is not None:
        depth = (
            f", grouped at module depth {pm['depth']} of {pm['max_depth']} (paths cut to their first "
            f"{pm['depth']} dotted levels, the deepest that keeps the map readable)"
        )
    return (
        f"<p>Module of each op from {esc(pm['module_source'])}{esc(depth)}; a cell names the device, or the op "
        "count per device where a module is split.</p>"
    )


def _utilisation(data: dict) -> str:
    """`` Returned: MFU 33.7%, 5,762 tokens/s per device; priced by the ...``, from what the run recorded."""
    num = data.get("numbers") or {}
    mfu, tokens = num.get("mfu"), num.get("tokens_per_s_per_device")
    how = (data.get("provenance") or {}).get("cost_model")
    words = f" Returned: MFU {mfu:.1%}" if isinstance(mfu, int | float) else ""
    words += f", {tokens:,.0f} tokens/s per device" if words and isinstance(tokens, int | float) else ""
    words += f"; priced by the {how}" if isinstance(how, str) and how != "not recorded" else ""
    return words + "." if words else ""


def bound_text(data: dict) -> str:
    """The header's lower bound: the table's, saying which bound it is, and the drawn step's own where it
    differs (``Lower bound 0.396 ms (the least over m = 1, 2 of ...); the returned count's step (m = 1) has
    its own bound, 0.402 ms.``)."""
    b = data.get("lower_bound")
    if not isinstance(b, dict):  # a report.json from before it said which bound
        return f"Lower bound {_ms(data['schedule']['lower_bound_s'])} ms."
    text = f"Lower bound {_ms(b['lower_bound_s'])} ms ({b['which']})"
    own = b.get("drawn_s")
    if isinstance(own, int | float) and not math.isclose(own, b["lower_bound_s"], rel_tol=1e-9, abs_tol=0.0):
        text += f"; {b['drawn']} has its own bound, {_ms(own)} ms"
    return text + "."


def render_html(data: dict, folder: Path, link: str = "") -> str:
    """The page of a place or compare report (figures, report.json and trace.json already written into
    ``folder``, which the page reaches as ``link``: empty beside it, else ``NAME_files/``)."""
    figs = data["figures"]
    text = captions(data)
    prov = dict(data["provenance"])
    configs = prov.pop("strategy_configs", {})
    s = data["schedule"]

    def figure(name):
        return _figure(folder, name, figs[name], text, link)

    parts = [
        "<!DOCTYPE html><html lang=en><head><meta charset=utf-8>",
        f"<title>postplace report: {esc(data['title'])}</title><style>{CSS}</style></head><body>",
        f"<h1>{esc(data['title'])}</h1>",
        f"<p><span class=tag>{esc(data['kind'])} run</span> <span class=tag>evaluator: "
        f"{esc(prov.get('evaluator'))}</span> Schedule, memory and trace of {esc(s['source'])}, simulated: step "
        f"{_ms(s['step_time_s'])} ms. {esc(bound_text(data))}{esc(_utilisation(data))} Data: "
        f'<a href="{esc(link)}report.json">{esc(link)}report.json</a>; Chrome trace (opens in Perfetto): '
        f'<a href="{esc(link)}trace.json">{esc(link)}trace.json</a>.</p>',
        "<h2>Step times</h2>",
        start_line(data),
        _bars_table(data),
        _within_error_text(data),
        "<p class=note>/ single: the step time over the best single device's; / LB: over the lower bound.</p>",
        _by_m_table(data),
        figure("bars"),
        "<h2>Learning curves</h2>",
        figure("curves_samples"),
        figure("curves_wall"),
        "<h2>Schedule</h2>",
        figure("gantt"),
        "<h2>Memory</h2>",
        _memory_table(data["memory"]),
        figure("memory_peak"),
        figure("memory_time"),
        "<h2>Placement map</h2>",
        _map_text(data["placement_map"]),
        figure("placement_map"),
        _map_table(data["placement_map"]),
        "<h2>Provenance</h2>",
        kv_table(prov),
        "<details><summary>strategy configurations</summary>" + kv_table(configs) + "</details>",
        f"<p>Report written {esc(data['created_utc'])} by postplace report.</p></body></html>",
    ]
    return "\n".join(parts)


def render_paper_html(
    data: dict, folder: Path, table_text: str, *, link: str = "", run_dir: Path | None = None, runs: str = ""
) -> str:
    """The paper experiment's page: the headline table, its figure, links to each pair's report.
    ``folder``: where its figure and report.json were written, reached from the page as ``link``;
    ``run_dir``: the paper folder (default ``folder``), reached from the page as ``runs``."""
    fig = data["figures"]["paper_reductions"]
    run_dir = folder if run_dir is None else run_dir
    links = "".join(
        f'<li><a href="{esc(runs + p)}/report.html">{esc(p)}</a></li>'
        for p in data["pairs"]
        if (run_dir / p / "report.html").exists()
    )
    cfg = data["config"]
    return "\n".join(
        [
            "<!DOCTYPE html><html lang=en><head><meta charset=utf-8>",
            f"<title>postplace paper</title><style>{CSS}</style></head><body>",
            "<h1>The Post paper's comparison, reproduced by postplace paper</h1>",
            f"<p><span class=tag>evaluator: {esc(data.get('evaluator'))}</span> "
            f"{esc(data['paper_claim']['source'])}.</p>",
            "<h2>Headline</h2><pre>" + esc(table_text) + "</pre>",
            _figure(folder, "paper_reductions", fig, link=link),
            "<h2>Each model and machine</h2><ul>" + links + "</ul>",
            "<h2>Provenance</h2>",
            kv_table(
                {
                    **cfg,
                    "wall_time_of_the_last_call_s": data.get("wall_time_s_this_call"),
                    "versions": data.get("versions", {}),
                }
            ),
            f'<p>Data: <a href="{esc(runs)}paper.json">{esc(runs)}paper.json</a>, '
            f'<a href="{esc(link)}report.json">{esc(link)}report.json</a>. '
            f"Written {esc(data.get('created_utc', ''))}.</p>",
            "</body></html>",
        ]
    )
