"""How the screenshots in docs/ were made: headless Chromium (Debian's ``chromium`` package) opens the
report page of the README's demo run, and the tall screenshot is cut into the sections shown.

    postplace compare rnnlm --size small --cluster k80x4 \
        --strategies single,expert,metis,m-etf,data-parallel,random,anneal,reinforce,ce,ppo,post \
        --budget 480 --seeds 3 --out runs/demo-compare
    python docs/screenshots.py runs/demo-compare/report.html

The crop boxes are pixel rows of that page at 1300 px wide (another run may need other rows).
"""

import subprocess
import sys
from pathlib import Path

from PIL import Image

CROPS = {"report-top.png": (0, 1310), "report-curves.png": (1300, 1990), "report-gantt.png": (2530, 3600)}


def main() -> None:
    page = Path(sys.argv[1]).resolve()
    full = Path("/tmp/postplace-report-full.png")
    subprocess.run(["chromium", "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                    "--virtual-time-budget=3000", f"--screenshot={full}", "--window-size=1300,9000",
                    f"file://{page}"], check=True, capture_output=True)  # fmt: skip
    im = Image.open(full)
    out = Path(__file__).parent
    for name, (top, bottom) in CROPS.items():
        im.crop((0, top, im.size[0], bottom)).save(out / name)
        print(out / name)


if __name__ == "__main__":
    main()
