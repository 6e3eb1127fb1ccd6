"""Reports of run folders: the data computed once (``report.json``), then drawn as PNG figures and
one self-contained HTML page (Optuna's split of visualisation "info" objects from their renderers).

``write_report(run_dir)`` reads a ``place``, ``compare`` or ``paper`` folder and writes its
``report.html`` with, beside it in the run folder: ``report.json`` (every number the figures show), the
PNG figures, and ``trace.json`` (the returned placement's simulated schedule as Chrome trace-event JSON,
for Perfetto). A page written elsewhere (``out=.../NAME.html``) keeps those files in ``NAME_files/``
beside it, as a browser saves a page, so that generic names (``bars.png``, ``trace.json``) never land
among the user's own files::

    from postplace.report import write_report
    path = write_report("runs/resnet50")          # runs/resnet50/report.html
    write_report("runs/resnet50", "out/r50.html")  # out/r50.html, out/r50_files/report.json, ...
"""

from __future__ import annotations

import json
from pathlib import Path

from postplace.errors import PostplaceError
from postplace.report._build import build_report_data_for as build_report_data
from postplace.report._folder import run_kind
from postplace.validate import make_folder

__all__ = ["build_report_data", "files_folder", "run_kind", "write_report"]


def files_folder(run_dir, out) -> Path:
    """Where the page ``out`` of ``run_dir`` keeps its figures, ``report.json`` and ``trace.json``.

    Parameters
    ----------
    run_dir : str or path
        The run folder drawn.
    out : str or path
        The HTML page.

    Returns
    -------
    pathlib.Path
        The page's own folder when it is the run folder's ``report.html``; else ``NAME_files`` beside
        the page ``NAME.html`` (a browser's layout of a saved page), so that the files' generic names
        never land among other files.

    Examples
    --------
    >>> from pathlib import Path
    >>> files_folder("runs/r50", "runs/r50/report.html") == Path("runs/r50")
    True
    >>> files_folder("runs/r50", "out/r50.html") == Path("out/r50_files")
    True
    """
    out, run_dir = Path(out), Path(run_dir)
    if out.name == "report.html" and out.parent.resolve() == run_dir.resolve():
        return out.parent
    return out.parent / f"{out.stem}_files"


def write_report(run_dir, out=None, *, graph=None, cluster=None, size: str | None = None) -> Path:
    """Write the report of ``run_dir`` to ``out`` (default ``run_dir/report.html``); return its path.

    Parameters
    ----------
    run_dir : str or path
        A folder written by ``postplace place``, ``compare`` or ``paper``.
    out : str or path, optional
        The HTML file. The figures, ``report.json`` and ``trace.json`` go beside the run folder's own
        ``report.html``, and into ``NAME_files/`` beside any other page ``NAME.html``
        (:func:`files_folder`).
    graph, cluster, size : optional
        The run's graph (an OpGraph, a file or a zoo name, with the zoo ``size``) and cluster (a
        Cluster or a name), where the folder does not record them.

    Returns
    -------
    pathlib.Path
        The HTML file written.

    Raises
    ------
    PostplaceError
        When ``run_dir`` is not a folder of a run, ``out`` is a folder, a file of the run cannot be
        read, or the run's graph or cluster cannot be found.
    """
    from postplace.report import _html, _png

    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise PostplaceError(f"{run_dir}: not a folder; give a folder written by place, compare or paper")
    kind = run_kind(run_dir)
    out = Path(out) if out is not None else run_dir / "report.html"
    if out.is_dir():
        raise PostplaceError(f"--out {out}: a folder; give the HTML file to write, e.g. {out / 'report.html'}")
    files = files_folder(run_dir, out)
    link = "" if files == out.parent else f"{files.name}/"
    make_folder(out.parent)
    folder = make_folder(files)
    if kind == "paper":
        return _write_paper(run_dir, out, folder, link)
    data, sched = build_report_data(run_dir, graph=graph, cluster=cluster, size=size)
    sched.save_chrome_trace(folder / "trace.json")
    data["figures"] = _png.render_all(data, folder)
    (folder / "report.json").write_text(json.dumps(data))
    out.write_text(_html.render_html(data, folder, link))
    return out


def _write_paper(run_dir: Path, out: Path, folder: Path, link: str) -> Path:
    import os

    from postplace.report import _html, _png
    from postplace.report._checks import check_paper
    from postplace.report._folder import read_run_json
    from postplace.report._provenance import stamp, versions
    from postplace.report.markdown import format_table

    data = check_paper(read_run_json(run_dir / "paper.json"), run_dir)
    for h in data["headline"]:
        pair = run_dir / f"{h['model']}-{h['cluster']}"
        if (pair / "compare.json").exists():
            write_report(pair, graph=h["model"], cluster=h["cluster"], size=data["config"]["size"])
    data = stamp(data)
    data["versions"] = versions()
    data["figures"] = _png.paper_figure(data, folder)
    (folder / "report.json").write_text(json.dumps(data))
    runs = os.path.relpath(run_dir.resolve(), out.parent.resolve()).replace(os.sep, "/")
    runs = "" if runs == "." else runs + "/"
    out.write_text(_html.render_paper_html(data, folder, format_table(data), link=link, run_dir=run_dir, runs=runs))
    return out
