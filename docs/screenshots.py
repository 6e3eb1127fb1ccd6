"""How the screenshots in docs/ were made: headless Chromium (Debian's ``chromium`` package) opens the
report page of the README's demo run, and the tall screenshot is cut into the sections shown.

    postplace compare rnnlm --size small --cluster k80x4 \
        --strategies single,expert,metis,m-etf,data-parallel,random,anneal,reinforce,ce,ppo,post \
        --budget 480 --seeds 3 --out runs/demo-compare
    python docs/screenshots.py runs/demo-compare/report.html

The page is taken 1300 px wide. Each picture is cut from one of the page's section headings (``<h2>``,
found by the 1 px rule under it, ``border-bottom: 1px solid #ddd``) to the next one it names, so
another run's page, with taller or shorter figures, is cut at the same sections.
"""

import subprocess
import sys
from pathlib import Path

import numpy as np
from PIL import Image

SECTIONS = ("Step times", "Learning curves", "Schedule", "Memory", "Placement map", "Provenance")
"""The page's ``<h2>`` headings, in order (``postplace.report._html.render_html``)."""
CROPS = {"report-top.png": (None, "Learning curves"), "report-curves.png": ("Learning curves", "Schedule"),
         "report-gantt.png": ("Schedule", "Memory")}  # fmt: skip
"""Each picture: from the heading of one section (None: the page's top) to the heading of another."""
RULE = (221, 221, 221)  # #ddd
PAD = 12  # pixels kept above a heading's text


def heading_tops(im: Image.Image) -> dict[str, int]:
    """The pixel row where each section's heading text starts, from the rules under the headings: rows
    of #ddd pixels across at least 80% of the page with a white row below."""
    a = np.asarray(im.convert("RGB")).astype(int)
    width = a.shape[1]
    white = (a >= 250).all(2).all(1)
    rules = [r for r in np.flatnonzero((a == RULE).all(2).sum(1) > 0.8 * width) if white[r + 1]]
    if len(rules) != len(SECTIONS):
        raise SystemExit(f"found {len(rules)} section rules on the page, not {len(SECTIONS)} ({', '.join(SECTIONS)})")
    tops = {}
    for name, r in zip(SECTIONS, rules, strict=True):
        x = r - 1
        while white[x]:  # the gap between the heading and its rule
            x -= 1
        while not white[x]:  # the heading's text
            x -= 1
        tops[name] = int(x + 1)
    return tops


def main() -> None:
    page = Path(sys.argv[1]).resolve()
    full = Path("/tmp/postplace-report-full.png")
    subprocess.run(["chromium", "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                    "--virtual-time-budget=3000", f"--screenshot={full}", "--window-size=1300,9000",
                    f"file://{page}"], check=True, capture_output=True)  # fmt: skip
    im = Image.open(full)
    tops = heading_tops(im)
    out = Path(__file__).parent
    for name, (first, last) in CROPS.items():
        top = 0 if first is None else tops[first] - PAD
        im.crop((0, top, im.size[0], tops[last] - PAD)).save(out / name)
        print(out / name)


if __name__ == "__main__":
    main()
