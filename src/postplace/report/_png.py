"""The report's figures as PNG files, drawn with matplotlib (Agg backend) from the report data only.

Every figure has a fixed size in pixels (``figsize x DPI``, no tight cropping), recorded beside its
file name so a reader (or a test) can check what was written.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from postplace.report.text import clip

DPI = 100
PHASE_COLOURS = {"forward": "#4C72B0", "backward": "#DD8452", "update": "#55A868", "other": "#8C8C8C"}
KIND_STYLE = {  # bar colour and hatch per kind of row
    "search": ("#4C72B0", ""),
    "placer": ("#9A9A9A", "//"),
    "data-parallel": ("#E1A340", "xx"),
    "returned": ("#55A868", ""),
    "single": ("#9A9A9A", ""),
    "warm start": ("#8172B2", ".."),
}
LEGEND_KINDS = ("search", "placer", "data-parallel", "returned", "single", "warm start")
"""The bar chart's legend order."""
MAX_MAP_ROWS = 60


def _plt():
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    return plt


def _ms(v):
    return None if v is None else v * 1e3


def _save(fig, folder: Path, name: str, extra: dict | None = None) -> dict:
    path = folder / f"{name}.png"
    w, h = fig.get_size_inches()
    fig.savefig(path, dpi=DPI)
    _plt().close(fig)
    return {"file": path.name, "width_px": int(round(w * DPI)), "height_px": int(round(h * DPI)), **(extra or {})}


OUTLIER = 10.0
"""A value more than this many times the median of a figure's values is drawn off scale: the axis stops
at the largest of the rest, and the outlier is marked with its value (a 53-second CPU row beside 0.2-0.9 s
candidates flattened every bar and curve that mattered)."""


def off_scale_limit(values_ms) -> float | None:
    """The axis's top value when some of a figure's values are outliers (more than :data:`OUTLIER` times the
    median of its finite positive values): the largest of the others; None when none is an outlier.

    Why an axis cut and not a log scale: the candidates that matter stay on a linear axis, where a bar 20%
    longer is a step 20% slower (on a log axis from 0.2 ms to 50 s, 240 against 290 ms is a hair), and the
    outlier's value is printed where it is marked."""
    v = np.array([x for x in values_ms if x is not None and np.isfinite(x) and x > 0], dtype=float)
    if v.size < 2:
        return None
    rest = v[v <= OUTLIER * float(np.median(v))]
    return float(rest.max()) if rest.size < v.size else None


def _fmt_ms(v: float) -> str:
    """A step time in ms as the figures print one: 3 significant digits, whole ms with commas from 1,000
    to 9,999,999, powers of ten past them (a label that fits beside the axes)."""
    return f"{v:,.0f} ms" if 1000 <= v < 1e7 else f"{v:.3g} ms"


REFERENCE = (("single_device_s", "best single device", "--"), ("lower_bound_s", "lower bound", ":"))


def _reference_lines(ax, lines: dict, *, vertical: bool = False, limit: float | None = None) -> list[str]:
    """The best single device and the lower bound as lines; one past ``limit`` (ms, an axis cut by
    :func:`off_scale_limit`) keeps its legend entry, saying it is off scale, and is named with its value
    in the axes' top corner (the bar chart's legend gives the value). Returns those off scale, with
    their values."""
    off = []
    for key, label, style in REFERENCE:
        v = lines.get(key)
        if not (isinstance(v, int | float) and np.isfinite(v)):
            continue
        if limit is not None and v * 1e3 > limit:
            ax.plot([], [], color="black", ls=style, lw=1, label=f"{label} (off scale)")
            off.append(f"{label} {_fmt_ms(v * 1e3)}")
            continue
        (ax.axvline if vertical else ax.axhline)(v * 1e3, color="black", ls=style, lw=1, label=label)
    if off and not vertical:  # the bar chart's legend gives their values
        ax.text(
            0.99,
            0.97,
            "off scale \u2191 " + "; ".join(off),
            transform=ax.transAxes,
            ha="right",
            va="top",
            fontsize=8,
            bbox={"facecolor": "white", "edgecolor": "#C44E52", "pad": 2},
        )
    return off


def _colours(n: int):
    cmap = _plt().get_cmap("tab10" if n <= 10 else "tab20")
    return [cmap(i % cmap.N) for i in range(n)]


def _nan_ms(values) -> np.ndarray:
    """Seconds (None or inf where nothing fits yet) as milliseconds, NaN where there is no value."""
    out = np.array([np.nan if v is None else v * 1e3 for v in values], dtype=float)
    out[~np.isfinite(out)] = np.nan
    return out


def _no_feasible_note(ax, curves) -> None:
    """Say which curves have no feasible sample (they draw nothing) inside the axes."""
    empty = [c["strategy"] for c in curves if not np.isfinite(_nan_ms(c["median_s"])).any()]
    if not empty:
        return
    who = "the search" if len(curves) == 1 else ", ".join(empty)
    ax.text(
        0.5,
        0.5,
        f"no feasible sample: every placement {who} tried was OOM or failed",
        ha="center",
        va="center",
        fontsize=9,
        color="#C44E52",
        wrap=True,
        transform=ax.transAxes,
    )


def _legend(ax) -> None:
    if ax.get_legend_handles_labels()[0]:  # an empty legend warns
        ax.legend(fontsize=8, ncol=2)


def curve_label(c: dict) -> str:
    """A learning curve's legend entry: the strategy, and the median's seed count where there are several."""
    n = len(c["seeds"])
    return f"{c['strategy']} (median of {n} seeds)" if n > 1 else c["strategy"]


def learning_curves(data: dict, folder: Path) -> dict:
    """Best-so-far step time against samples (median and range over seeds) and against wall time. A
    curve with no feasible sample draws nothing and is named in a note (never a failed report). A curve
    or reference line far above the rest (:func:`off_scale_limit`) is left above the axis, its legend
    entry saying so with its value, so that it does not flatten the curves that matter."""
    plt = _plt()
    curves = data["curves"]
    lo, hi, limit = _curve_scale(curves, data["lines"])
    labels = [curve_label(c) + _off_scale_words(c, limit) for c in curves]
    figs = {}
    fig, ax = plt.subplots(figsize=(9, 5.2))
    drawn = False
    for c, col, label in zip(curves, _colours(len(curves)), labels, strict=True):
        x = np.array(c["x_samples"], dtype=float)
        med, lo_s, hi_s = _nan_ms(c["median_s"]), _nan_ms(c["min_s"]), _nan_ms(c["max_s"])
        seeds = len(c["seeds"])
        if not np.isfinite(med).any():
            continue
        ax.step(x, med, where="post", color=col, lw=1.6, label=label)
        drawn = True
        if seeds > 1:
            ax.fill_between(x, lo_s, hi_s, step="post", color=col, alpha=0.18, lw=0)
    off = _reference_lines(ax, data["lines"], limit=limit)
    _no_feasible_note(ax, curves)
    if not drawn and any(c["x_samples"] for c in curves):  # the samples taken, though none fits
        ax.set_xlim(0, max(c["x_samples"][-1] for c in curves if c["x_samples"]))
    ax.set_xlabel("samples")
    ax.set_ylabel("best step time so far (ms)")
    many = any(len(c["seeds"]) > 1 for c in curves)
    ax.set_title(
        "learning curves: best feasible step time against samples"
        + (" (line: median, band: min-max over seeds)" if many else "")
    )
    if lo is not None:
        ax.set_ylim(lo, hi)
    ax.grid(alpha=0.3)
    _legend(ax)
    fig.tight_layout()
    figs["curves_samples"] = _save(fig, folder, "curves_samples", _scale_info(limit, off, curves, labels))

    fig, ax = plt.subplots(figsize=(9, 5.2))
    drawn_x = []  # wall times of points drawn (a finite step time at a finite time)
    for c, col in zip(curves, _colours(len(curves)), strict=True):
        labelled = False
        for s in c["per_seed"]:
            x = np.array([np.nan if v is None else v for v in s["wall_s"]], dtype=float)
            y = _nan_ms(s["best_s"])
            ok = np.isfinite(x) & np.isfinite(y)
            if not ok.any():
                continue
            drawn_x.extend(x[ok].tolist())
            ax.step(
                x,
                y,
                where="post",
                color=col,
                lw=1.2,
                alpha=0.85,
                label=None if labelled else c["strategy"] + _off_scale_words(c, limit),
            )
            labelled = True
    off = _reference_lines(ax, data["lines"], limit=limit)
    _no_feasible_note(ax, curves)
    log = any(v > 0 for v in drawn_x)  # a log axis with nothing positive on it cannot place its ticks
    if log:
        ax.set_xscale("log")
    ax.set_xlabel("wall time (s, log scale)" if log else "wall time (s)")
    ax.set_ylabel("best step time so far (ms)")
    src = {c["wall_source"] for c in curves}
    ax.set_title(
        "learning curves against wall time"
        + (", one line per seed" if many else "")
        + (" (time estimated from each run's total)" if any(s.startswith("estimated") for s in src) else ""),
        fontsize=10,
    )
    if lo is not None:
        ax.set_ylim(lo, hi)
    ax.grid(alpha=0.3)
    _legend(ax)
    fig.tight_layout()
    figs["curves_wall"] = _save(fig, folder, "curves_wall", _scale_info(limit, off, curves, labels))
    return figs


def _off_scale_words(curve: dict, limit: float | None) -> str:
    """`` (off scale: best 50,873 ms)`` for a curve whose best stays above the axis's cut, else nothing."""
    med = _nan_ms(curve["median_s"])
    best = float(np.nanmin(med)) if np.isfinite(med).any() else None
    return f" (off scale: best {_fmt_ms(best)})" if limit is not None and best is not None and best > limit else ""


def _scale_info(limit: float | None, lines_off: list[str], curves=(), labels=()) -> dict:
    """What a figure drew off scale, for report.json and the caption: the axis's cut (ms) and each item
    past it (a reference line, a curve or a bar, with its value)."""
    off = list(lines_off) + [label for c, label in zip(curves, labels, strict=True) if _off_scale_words(c, limit)]
    return {"axis_cut_ms": limit, "off_scale": off} if off else {}


def _curve_scale(curves, lines) -> tuple[float | None, float | None, float | None]:
    """The learning curves' y axis ``(bottom, top, cut)`` in ms: from just below the lower bound to the
    worst median after 5% of the budget (the first samples are often many times worse than the rest and
    would flatten every curve) or the best single device, whichever is higher, leaving out any of those
    far above the rest (``cut``: :func:`off_scale_limit`; None when nothing is). None, None, None when no
    curve has a feasible sample."""
    vals = []
    for c in curves:
        med = [v for v in c["median_s"] if v is not None and np.isfinite(v)]
        if med:
            vals.append(med[min(len(med) - 1, len(med) // 20)])
            vals.append(min(med))
    lb = lines.get("lower_bound_s")
    single = lines.get("single_device_s")
    extra = [v for v in (lb, single) if isinstance(v, int | float) and np.isfinite(v)]
    if not vals:
        return None, None, None
    limit = off_scale_limit([v * 1e3 for v in vals + extra])
    tops = [v * 1e3 for v in vals + ([single] if single in extra else [])]
    tops = [v for v in tops if limit is None or v <= limit] or [limit]
    lo = min([v * 1e3 for v in vals + extra] + tops)
    hi = max(tops)
    pad = (hi - lo) * 0.08 or hi * 0.05 or 1.0
    return lo - pad, hi + pad, limit


def bar_legend_labels(data: dict, limit: float | None = None) -> list[str]:
    """The bar chart's legend: the kinds of bar drawn, then the reference lines with their values (those
    past ``limit``, the axis's cut in ms, marked off scale)."""
    from postplace.report._build import seeds_of

    n = seeds_of(data)
    search = f"search (median of {n} seeds, bar: min-max)" if n > 1 else "search (best of 1 seed)"
    text = {
        "search": search,
        "placer": "one-shot placer",
        "data-parallel": "* data parallelism (micro-batch k on GPU k)",
        "returned": "returned",
        "single": "single device",
        "warm start": "warm start",
    }
    out = [text[k] for k in LEGEND_KINDS if any(b["kind"] == k for b in data["bars"])]
    for key, label, _style in REFERENCE:
        v = data["lines"].get(key)
        if isinstance(v, int | float) and np.isfinite(v):
            out.append(
                f"{label} {_fmt_ms(v * 1e3)}" + (" (off scale)" if limit is not None and v * 1e3 > limit else "")
            )
    return out


def bar_chart(data: dict, folder: Path) -> dict:
    """Best step time per strategy, each bar labelled with its value; one-shot placers and data
    parallelism hatched; the best single device and the lower bound as vertical lines. The legend sits
    below the axes, so it hides no bar and no label. A bar or line far past the rest
    (:func:`off_scale_limit`: a CPU row 100 times the others) does not set the axis: the axis stops past
    the others, the bar is broken (white strokes) at its end and labelled with its value."""
    plt = _plt()
    bars = list(data["bars"])
    fig, ax = plt.subplots(figsize=(9, max(2.6, 0.36 * len(bars) + 1.4) + 0.8))
    y = np.arange(len(bars))[::-1]
    values = (
        [_ms(b["best_s"]) for b in bars if b.get("best_s") is not None]
        + [_ms(b["max_s"]) for b in bars if b.get("max_s") is not None and b["kind"] == "search"]
        + [v * 1e3 for v in data["lines"].values() if isinstance(v, int | float) and np.isfinite(v)]
    )
    limit = off_scale_limit(values)
    top = limit if limit is not None else max(values, default=1.0)
    right = top * 1.12
    off = []
    for yi, b in zip(y, bars, strict=True):
        colour, hatch = KIND_STYLE.get(b["kind"], ("#4C72B0", ""))
        v = _ms(b.get("best_s"))
        if v is None:
            why = clip((b.get("note") or "no feasible placement").split(":")[0], 48)
            ax.text(0, yi, f"  none ({why})", va="center", fontsize=8)
            continue
        if limit is not None and v > limit:  # broken at the axis's end, its value written on it
            ax.barh(yi, right, color=colour, hatch=hatch, edgecolor="black", lw=0.5)
            for dx in (0.0, 0.018):
                x0 = top * (1.035 + dx)
                ax.plot(
                    [x0 - top * 0.008, x0 + top * 0.008],
                    [yi - 0.45, yi + 0.45],
                    color="white",
                    lw=2.5,
                    solid_capstyle="butt",
                )
            ax.text(
                top,
                yi,
                f"{_fmt_ms(v)}, off scale" + (" OOM" if b.get("oom") else ""),
                va="center",
                ha="right",
                fontsize=8,
                bbox={"facecolor": "white", "edgecolor": "#C44E52", "pad": 1},
            )
            off.append(f"{b['label']} {_fmt_ms(v)}")
            continue
        xerr = None
        if (
            b.get("min_s") is not None
            and b.get("max_s") is not None
            and b["kind"] == "search"
            and (b.get("seeds") or 1) > 1
        ):
            xerr = [[v - b["min_s"] * 1e3], [b["max_s"] * 1e3 - v]]
        ax.barh(yi, v, color=colour, hatch=hatch, edgecolor="black", lw=0.5, xerr=xerr, capsize=3)
        end = min(b["max_s"] * 1e3 if xerr is not None else v, top)
        ax.text(
            end + top * 0.01,
            yi,
            f"{v:.3g}" + (" OOM" if b.get("oom") else ""),
            va="center",
            fontsize=8,
            bbox={"facecolor": "white", "edgecolor": "none", "pad": 0.5, "alpha": 0.8},
        )
    ax.set_yticks(y, [b["label"] + (" *" if b["kind"] == "data-parallel" else "") for b in bars], fontsize=9)
    ax.set_xlim(0, right)
    off += _reference_lines(ax, data["lines"], vertical=True, limit=limit)
    from matplotlib.patches import Patch

    labels = bar_legend_labels(data, limit)
    kinds = [k for k in LEGEND_KINDS if any(b["kind"] == k for b in bars)]  # as bar_legend_labels names them
    handles = [
        Patch(facecolor=KIND_STYLE.get(k, ("#4C72B0", ""))[0], hatch=KIND_STYLE.get(k, ("", ""))[1], edgecolor="black")
        for k in kinds
    ]
    handles += ax.get_legend_handles_labels()[0]
    fig.legend(handles=handles, labels=labels, fontsize=8, loc="lower center", ncol=3, frameon=False)
    cut = f"; axis cut at {_fmt_ms(top)}: longer bars broken, their value written" if limit is not None else ""
    ax.set_xlabel(f"best step time (ms{cut})")
    ax.set_title("best step time per strategy (shorter is better)")
    ax.grid(axis="x", alpha=0.3)
    rows = (len(labels) + 2) // 3
    fig.tight_layout(rect=(0, 0.04 + 0.2 * rows / fig.get_size_inches()[1], 1, 1))
    return {"bars": _save(fig, folder, "bars", _scale_info(limit, off))}


def gantt(data: dict, folder: Path) -> dict:
    """The returned placement's schedule: a lane per device, a lane per port or link that carried data."""
    plt = _plt()
    s = data["schedule"]
    devices = s["devices"]
    ops = s["ops"]
    lanes = [f"{d} (compute)" for d in devices] + [lane["name"] for lane in s["link_lanes"]]
    fig, ax = plt.subplots(figsize=(12, max(3.0, 0.42 * len(lanes) + 1.6)))
    dev = np.array(ops["device"])
    start = np.array(ops["start_s"]) * 1e3
    dur = np.array(ops["end_s"]) * 1e3 - start
    phase = np.array(ops["phase"])
    n = len(lanes)
    for d in range(len(devices)):
        yi = n - 1 - d
        for ph, col in PHASE_COLOURS.items():
            sel = (dev == d) & (phase == ph)
            if sel.any():
                ax.broken_barh(list(zip(start[sel], dur[sel], strict=True)), (yi - 0.4, 0.8), facecolors=col)
    for k, lane in enumerate(s["link_lanes"]):
        yi = n - 1 - len(devices) - k
        for ph, col in PHASE_COLOURS.items():
            iv = [(a * 1e3, (b - a) * 1e3) for a, b, p in lane["intervals"] if p == ph]
            if iv:
                ax.broken_barh(iv, (yi - 0.3, 0.6), facecolors=col, alpha=0.8)
    ax.set_yticks(range(n)[::-1], lanes, fontsize=8)
    ax.axvline(s["step_time_s"] * 1e3, color="black", lw=1, ls="--")
    from matplotlib.patches import Patch

    present = [p for p in PHASE_COLOURS if (phase == p).any()]
    ax.legend(
        handles=[Patch(color=PHASE_COLOURS[p], label=p) for p in present],
        fontsize=8,
        loc="upper right",
        ncol=len(present),
    )
    ax.set_xlabel("time in the step (ms)")
    ax.set_title(
        f"simulated schedule of {s['source']}: step {s['step_time_s'] * 1e3:.3f} ms, "
        f"{s['transfers']} transfers, {s['bytes_moved'] / 1e6:.1f} MB moved",
        fontsize=10,
    )
    ax.grid(axis="x", alpha=0.3)
    fig.tight_layout()
    return {"gantt": _save(fig, folder, "gantt")}


def memory(data: dict, folder: Path) -> dict:
    """Peak memory per device against capacity, and memory over time for the returned placement."""
    from postplace.report._html import human_bytes, percent

    plt = _plt()
    m = data["memory"]
    figs = {}
    devs = m["devices"]
    fig, ax = plt.subplots(figsize=(8, 4))
    x = np.arange(len(devs))
    peak = np.array(m["peak_bytes"]) / 1e9
    cap = np.array(m["capacity_bytes"]) / 1e9
    colours = ["#C44E52" if d in m["oom_devices"] else "#4C72B0" for d in devs]
    ax.bar(x, peak, color=colours, label="peak")
    ax.scatter(x, cap, marker="_", s=900, color="black", label="capacity", zorder=3)
    for xi, p, c in zip(x, peak, cap, strict=True):
        ax.text(xi, p, f"{human_bytes(p * 1e9)}\n{percent(p / c * 100)}", ha="center", va="bottom", fontsize=8)
    ax.set_xticks(x, devs)
    ax.set_ylabel("GB")
    ax.set_yscale("log")
    ax.set_title(f"peak memory per device against capacity (red: OOM; memory mode {m['memory_mode']})", fontsize=10)
    ax.legend(fontsize=8)
    fig.tight_layout()
    figs["memory_peak"] = _save(fig, folder, "memory_peak")

    fig, ax = plt.subplots(figsize=(10, 4.2))
    top = max(peak.max() if peak.size else 0, 1e-9)
    for line, col in zip(m["over_time"], _colours(len(devs)), strict=True):
        t = np.array(line["time_s"]) * 1e3
        v = np.array(line["bytes"]) / 1e9
        ax.step(t, v, where="post", color=col, label=line["device"], lw=1.2)
        c = cap[devs.index(line["device"])]
        if c <= 1.5 * top:  # a capacity far above every peak would flatten the lines
            ax.axhline(c, color=col, ls="--", lw=0.8)
    ax.set_xlabel("time in the step (ms)")
    ax.set_ylabel("GB held")
    ax.set_title("memory over the step (dashed: capacity, where near the peaks)", fontsize=10)
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    figs["memory_time"] = _save(fig, folder, "memory_time")
    return figs


def map_rows(pm: dict) -> list[dict]:
    """The placement map's rows for the picture: modules, merged to their first path component when
    there are more than MAX_MAP_ROWS of them (and capped at that many)."""
    rows = pm["modules"]
    if len(rows) > MAX_MAP_ROWS:
        merged: dict[str, dict] = {}
        for r in rows:
            key = r["module"].split(".")[0]
            dst = merged.setdefault(key, {})
            for ph, cnt in r["counts"].items():
                cell = dst.setdefault(ph, {})
                for d, k in cnt.items():
                    cell[d] = cell.get(d, 0) + k
        rows = [{"module": k, "counts": v} for k, v in merged.items()]
    return rows[:MAX_MAP_ROWS]


def _short(label: str, width: int = 36) -> str:
    """A module path that fits the map's margin: its middle elided, its start and last levels kept."""
    return label if len(label) <= width else label[: width // 2 - 1] + "..." + label[-(width // 2 - 2) :]


def placement_map(data: dict, folder: Path) -> dict:
    """Which module (layer) ran on which device, one panel per phase: op counts per device."""
    plt = _plt()
    pm = data["placement_map"]
    rows = map_rows(pm)
    phases = pm["phases"]
    devs = pm["devices"]
    fig, axes = plt.subplots(
        1, len(phases), figsize=(3.2 * len(phases) + 2.5, max(3.0, 0.22 * len(rows) + 1.6)), sharey=True, squeeze=False
    )
    y = np.arange(len(rows))[::-1]
    colours = _colours(len(devs))
    for ax, ph in zip(axes[0], phases, strict=True):
        left = np.zeros(len(rows))
        for d, col in zip(devs, colours, strict=True):
            cnt = np.array([r["counts"].get(ph, {}).get(d, 0) for r in rows], dtype=float)
            if cnt.any():
                ax.barh(y, cnt, left=left, color=col, label=d, height=0.8)
            left += cnt
        ax.set_title(ph, fontsize=10)
        ax.set_xlabel("ops")
    axes[0][0].set_yticks(y, [_short(r["module"]) for r in rows], fontsize=7)
    handles = [plt.Rectangle((0, 0), 1, 1, color=c) for c in colours]
    fig.legend(handles, devs, loc="upper right", fontsize=8, ncol=len(devs))
    fig.suptitle("placement map: ops of each module per device, by phase", fontsize=10, x=0.35)
    fig.tight_layout(rect=(0, 0, 1, 0.95))
    return {"placement_map": _save(fig, folder, "placement_map")}


def render_all(data: dict, folder: Path) -> dict:
    """Every figure of a place or compare report; returns ``{name: {file, width_px, height_px}}``."""
    figs = {}
    figs.update(learning_curves(data, folder))
    figs.update(bar_chart(data, folder))
    figs.update(gantt(data, folder))
    figs.update(memory(data, folder))
    figs.update(placement_map(data, folder))
    return figs


def paper_figure(data: dict, folder: Path) -> dict:
    """The paper experiment's headline: Post's reduction against each rival, a row per pair and start
    (the uniform start's table, the probe's, then the probe's with local moves), a column per method."""
    from postplace.report.markdown import TABLES, method

    plt = _plt()
    tables = data.get("tables")
    if isinstance(tables, dict):  # a row per pair and start, a column per method (its table's strategy)
        heads = [
            (h, {method(k): v for k, v in h["reduction"].items()}, f" ({key})")
            for key in TABLES
            if key in tables
            for h in tables[key]["headline"]
        ]
    else:  # a paper.json from before the two tables
        heads = [(h, h["reduction"], "") for h in data["headline"]]
    rivals = [
        r
        for r in (
            "post-paper",
            "post-start",
            "local",
            "ce",
            "ppo",
            "reinforce",
            "hp",
            "best heuristic",
            "single",
            "data-parallel",
        )
        if any(red.get(r) is not None for _, red, _ in heads)
    ]
    grid = np.array(
        [[np.nan if red.get(r) is None else red[r] * 100 for r in rivals] for _, red, _ in heads], dtype=float
    ).reshape(len(heads), len(rivals))
    fig, ax = plt.subplots(figsize=(1.1 * len(rivals) + 3, 0.45 * len(heads) + 1.8))
    lim = min(np.nanmax(np.abs(grid)), 60.0) if np.isfinite(grid).any() else 1.0  # -195% would wash out the rest
    if grid.size:
        ax.imshow(grid, cmap="RdBu", vmin=-lim, vmax=lim, aspect="auto")
    else:  # no rival finished on any pair: an empty grid would make matplotlib warn about singular limits
        ax.text(0.5, 0.5, "no rival has a finished row yet", ha="center", va="center", transform=ax.transAxes)
    for i in range(grid.shape[0]):
        for j in range(grid.shape[1]):
            if np.isfinite(grid[i, j]):
                ax.text(
                    j,
                    i,
                    f"{grid[i, j]:+.1f}%",
                    ha="center",
                    va="center",
                    fontsize=8,
                    color="white" if abs(grid[i, j]) > 0.7 * lim else "black",
                )
    ax.set_xticks(range(len(rivals)), [f"vs {r}" for r in rivals], rotation=30, ha="right", fontsize=8)
    ax.set_yticks(range(len(heads)), [f"{h['model']} {h['cluster']}{tag}" for h, _, tag in heads], fontsize=8)
    same = "; each row's strategies from one start, the paper's or Post's probe" if isinstance(tables, dict) else ""
    ax.set_title(f"Post's step-time reduction 1 - post/rival (blue: Post faster{same})", fontsize=10)
    fig.tight_layout()
    return {"paper_reductions": _save(fig, folder, "paper_reductions")}
