"""The report as one self-contained HTML page: inline CSS, the PNG figures embedded as base64 (and
linked beside the page), tables from the report data; no script, nothing fetched from the network."""

from __future__ import annotations

import base64
import html
import json
from pathlib import Path

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
"""

FIGURE_TEXT = {
    "curves_samples": ("Learning curves against samples",
                       "Best feasible step time found so far; line: median over seeds, band: min to max."),
    "curves_wall": ("Learning curves against wall time", "One line per seed; log time axis."),
    "bars": ("Best step time per strategy",
             "Search rows: median over seeds with the min-max range; hatched: one-shot placers (//) and data "
             "parallelism (xx: micro-batch k on GPU k, simulated where the model can be traced again, else an "
             "analytic estimate)."),
    "gantt": ("Schedule of the returned placement (simulated)",
              "One lane per device (ops coloured by phase) and one per port or link that carried a transfer "
              "(coloured by the phase of the op that produced the tensor)."),
    "memory_peak": ("Peak memory per device", "Bars: peak of the returned placement; black marks: capacity."),
    "memory_time": ("Memory over the step", "Bytes held on each device, every change of the simulation."),
    "placement_map": ("Placement map (picture)", "Ops of each module per device, one panel per phase."),
    "paper_reductions": ("Post's step-time reduction against each rival", "1 - post / rival; blue: Post faster."),
}  # fmt: skip


def esc(x) -> str:
    return html.escape(str(x), quote=True)


def _ms(v) -> str:
    return "-" if not isinstance(v, int | float) else f"{v * 1e3:.3f}"


def _figure(folder: Path, name: str, fig: dict) -> str:
    title, caption = FIGURE_TEXT.get(name, (name, ""))
    b64 = base64.b64encode((folder / fig["file"]).read_bytes()).decode("ascii")
    return (f'<figure id="fig-{esc(name)}"><h3>{esc(title)}</h3>'
            f'<img alt="{esc(title)}" width="{fig["width_px"]}" height="{fig["height_px"]}" '
            f'src="data:image/png;base64,{b64}">'
            f'<figcaption>{esc(caption)} File: <a href="{esc(fig["file"])}">{esc(fig["file"])}</a></figcaption>'
            "</figure>")  # fmt: skip


def _kv_table(d: dict) -> str:
    rows = []
    for k, v in d.items():
        if isinstance(v, dict | list):
            v = json.dumps(v)
        rows.append(f"<tr><th>{esc(k)}</th><td>{esc(v)}</td></tr>")
    return "<table>" + "".join(rows) + "</table>"


def _bars_table(data: dict) -> str:
    lines = data["lines"]
    single, lb = lines.get("single_device_s"), lines.get("lower_bound_s")
    out = ["<table><tr><th>strategy</th><th>kind</th><th>best ms</th><th>range ms</th><th>/single</th>"
           "<th>/LB</th><th>OOM</th><th>note</th></tr>"]  # fmt: skip
    for b in data["bars"]:
        v = b.get("best_s")
        rng = "" if b.get("min_s") is None or b["kind"] != "search" else f"{_ms(b['min_s'])} - {_ms(b['max_s'])}"
        r1 = f"{v / single:.3f}" if isinstance(v, int | float) and isinstance(single, int | float) and single else "-"
        r2 = f"{v / lb:.3f}" if isinstance(v, int | float) and isinstance(lb, int | float) and lb else "-"
        out.append(f"<tr><td>{esc(b['label'])}</td><td>{esc(b['kind'])}</td><td class=num>{_ms(v)}</td>"
                   f"<td class=num>{rng}</td><td class=num>{r1}</td><td class=num>{r2}</td>"
                   f"<td class=num>{esc(b.get('oom', ''))}</td><td>{esc(b.get('note', ''))}</td></tr>")  # fmt: skip
    out.append(f"<tr><td>best single device</td><td>reference</td><td class=num>{_ms(single)}</td>"
               "<td></td><td></td><td></td><td></td><td></td></tr>")  # fmt: skip
    out.append(f"<tr><td>lower bound</td><td>reference</td><td class=num>{_ms(lb)}</td>"
               "<td></td><td></td><td></td><td></td><td></td></tr></table>")  # fmt: skip
    return "".join(out)


def _map_table(pm: dict) -> str:
    phases = pm["phases"]
    out = ["<table><tr><th>module</th>" + "".join(f"<th>{esc(p)}</th>" for p in phases) + "</tr>"]
    for r in pm["modules"]:
        cells = []
        for p in phases:
            cnt = r["counts"].get(p)
            if not cnt:
                cells.append("-")
            elif len(cnt) == 1:
                cells.append(next(iter(cnt)))
            else:
                cells.append(" / ".join(f"{d} {k}" for d, k in sorted(cnt.items())))
        out.append(f"<tr><td>{esc(r['module'])}</td>" + "".join(f"<td>{esc(c)}</td>" for c in cells) + "</tr>")
    out.append("</table>")
    return "".join(out)


def _memory_table(m: dict) -> str:
    out = ["<table><tr><th>device</th><th>peak GB</th><th>capacity GB</th><th>used</th><th></th></tr>"]
    for d, p, c in zip(m["devices"], m["peak_bytes"], m["capacity_bytes"], strict=True):
        out.append(f"<tr><td>{esc(d)}</td><td class=num>{p / 1e9:.3f}</td><td class=num>{c / 1e9:.3f}</td>"
                   f"<td class=num>{p / c * 100:.1f}%</td>"
                   f"<td>{'OOM' if d in m['oom_devices'] else ''}</td></tr>")  # fmt: skip
    return "".join(out) + "</table>"


def render_html(data: dict, folder: Path) -> str:
    """The page of a place or compare report (figures already written into ``folder``)."""
    figs = data["figures"]
    prov = dict(data["provenance"])
    configs = prov.pop("strategy_configs", {})
    s = data["schedule"]
    parts = [
        "<!DOCTYPE html><html lang=en><head><meta charset=utf-8>",
        f"<title>postplace report: {esc(data['title'])}</title><style>{CSS}</style></head><body>",
        f"<h1>{esc(data['title'])}</h1>",
        f"<p><span class=tag>{esc(data['kind'])} run</span> <span class=tag>evaluator: "
        f"{esc(prov.get('evaluator'))}</span> Schedule, memory and trace of {esc(s['source'])}, simulated: step "
        f"{_ms(s['step_time_s'])} ms, lower bound {_ms(s['lower_bound_s'])} ms. Data: "
        '<a href="report.json">report.json</a>; Chrome trace (opens in Perfetto): '
        '<a href="trace.json">trace.json</a>.</p>',
        "<h2>Step times</h2>", _bars_table(data),
        _figure(folder, "bars", figs["bars"]),
        "<h2>Learning curves</h2>",
        _figure(folder, "curves_samples", figs["curves_samples"]),
        _figure(folder, "curves_wall", figs["curves_wall"]),
        "<h2>Schedule</h2>", _figure(folder, "gantt", figs["gantt"]),
        "<h2>Memory</h2>", _memory_table(data["memory"]),
        _figure(folder, "memory_peak", figs["memory_peak"]),
        _figure(folder, "memory_time", figs["memory_time"]),
        "<h2>Placement map</h2>",
        f"<p>Module of each op from {esc(data['placement_map']['module_source'])}; a cell names the device, or the "
        "op count per device where a module is split.</p>",
        _figure(folder, "placement_map", figs["placement_map"]),
        _map_table(data["placement_map"]),
        "<h2>Provenance</h2>", _kv_table(prov),
        "<details><summary>strategy configurations</summary><pre>" + esc(json.dumps(configs, indent=1))
        + "</pre></details>",
        f"<p>Report written {esc(data['created_utc'])} by postplace report.</p></body></html>",
    ]  # fmt: skip
    return "\n".join(parts)


def render_paper_html(data: dict, folder: Path, table_text: str) -> str:
    """The paper experiment's page: the headline table, its figure, links to each pair's report."""
    fig = data["figures"]["paper_reductions"]
    links = "".join(f'<li><a href="{esc(p)}/report.html">{esc(p)}</a></li>' for p in data["pairs"]
                    if (folder / p / "report.html").exists())  # fmt: skip
    cfg = data["config"]
    return "\n".join([
        "<!DOCTYPE html><html lang=en><head><meta charset=utf-8>",
        f"<title>postplace paper</title><style>{CSS}</style></head><body>",
        "<h1>The Post paper's comparison, reproduced by postplace paper</h1>",
        f"<p><span class=tag>evaluator: {esc(data.get('evaluator'))}</span> {esc(data['paper_claim']['source'])}.</p>",
        "<h2>Headline</h2><pre>" + esc(table_text) + "</pre>",
        _figure(folder, "paper_reductions", fig),
        "<h2>Each model and machine</h2><ul>" + links + "</ul>",
        "<h2>Provenance</h2>", _kv_table({**cfg, "wall_time_s (last call)": data.get("wall_time_s_this_call"),
                                          "versions": data.get("versions", {})}),
        f"<p>Data: <a href=\"paper.json\">paper.json</a>. Written {esc(data.get('created_utc', ''))}.</p>",
        "</body></html>",
    ])  # fmt: skip
