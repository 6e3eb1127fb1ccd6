"""``benchmarks/check_docs.py`` finds every quoted output of the README, without running a command (issue 34
item 2): a README edit that drops a marker, quotes an output with no marker, or checks another command than
the one it tells the reader to run fails here; the script itself reruns the commands."""

import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("check_docs", ROOT / "benchmarks" / "check_docs.py")
check_docs = importlib.util.module_from_spec(_spec)
sys.modules["check_docs"] = check_docs  # dataclasses look their module up while the file runs
_spec.loader.exec_module(check_docs)

DATA = "src/postplace/data"
# each quoted output block of the README, by the command that prints it
CHECKED = [
    "postplace place resnet50 --cluster k80x4 --budget 2400 --out runs/resnet50",
    f"postplace info {DATA}/resnet50_profiled.json --cluster {DATA}/epyc_k80x4_3gb.toml",
    f"postplace place {DATA}/resnet50_profiled.json --cluster {DATA}/epyc_k80x4_3gb.toml --budget 2400 "
    "--out runs/resnet50-3gb",
    f"postplace place resnet50 --cluster {DATA}/epyc_k80x4_3gb.toml --budget 2400 --out runs/resnet50-3gb-m",
    "postplace simulate llama --size 70b --batch 256 --cluster dgx8x8 --optimizer adamw --precision bf16 "
    "--plan fsdp+recompute:m=256 --layered",
    "postplace place llama --size 70b --batch 256 --cluster dgx8x8 --optimizer adamw --precision bf16 --layered",
    "postplace place llama --size 70b --batch 256 --cluster mixed8x8 --optimizer adamw --precision bf16 --layered",
]


def test_the_readme_quotes_every_checked_output_under_its_marker():
    blocks, problems = check_docs.parse((ROOT / "README.md").read_text())
    assert problems == []
    assert [b.command for b in blocks] == CHECKED
    for b in blocks:  # what the marker selects is what the block holds: the main table, the excerpts
        assert b.quoted and all(line.strip() for line in (b.quoted[0], b.quoted[-1]))
    assert blocks[0].end == "^lower bound" and any(line.startswith("plan: ") for line in blocks[0].quoted)
    assert any("ms" in text for _, text in blocks[0].prose)  # its reading is checked with it


def _refused(text: str, why: str) -> bool:
    return any(why in p for p in check_docs.parse(text)[1])


def test_a_readme_that_breaks_the_convention_is_refused():
    bash = "## Run\n\n```bash\npostplace place x --budget 9\n```\n\n"
    good = bash + "<!-- check: postplace place x --budget 9\n     to: ^lower -->\n```\nrow 1.000 ms\nlower bound\n```\n"
    assert check_docs.parse(good)[1] == []
    assert _refused(bash + "```\nrow 1.000 ms\n```\n", "without a check marker")
    assert _refused(good.replace("--budget 9\n     to", "--budget 8\n     to"), "not in a ```bash block")
    assert _refused(good.replace("\n<!--", "\n## Other\n\n<!--"), "not in a ```bash block")
    assert _refused(good.replace("lower bound", "upper bound"), "last line does not match")
    assert _refused(good.replace("-->\n```\n", "-->\n\n```\n", 1), "right before a ```")
    assert _refused(good.replace("to: ^lower", "till: ^lower"), "'from: REGEX'")
    assert _refused("no marker here\n", "no check marker")


def test_rich_tables_are_quoted_without_borders():
    printed = (
        "     title (simulated)     \n"
        "┏━━━━━━┳━━━━━━━━━━┓\n"
        "┃      ┃     time ┃\n"
        "┡━━━━━━╇━━━━━━━━━━┩\n"
        "│ ddp  │ 1.000 ms │\n"
        "└──────┴──────────┘\n"
        "  times: gpu0 (K80)\n"
    )
    assert check_docs.plain(printed) == ["title (simulated)", "           time", "ddp    1.000 ms", "times: gpu0 (K80)"]
    assert check_docs.select(["a", "plan: x", "b", "lower bound 1", "c"], "^plan:", "^lower") == [
        "plan: x",
        "b",
        "lower bound 1",
    ]
    assert check_docs.select(["a"], "^plan:", None) is None


def test_numbers_compare_exactly_and_wall_times_loosely():
    assert check_docs.first_difference(["ddp  99.123 ms"], ["ddp  99.123 ms"]) is None
    assert check_docs.first_difference(["a", "ddp  99.123 ms"], ["a", "ddp  99.124 ms"]) == (
        1,
        "ddp  99.123 ms",
        "ddp  99.124 ms",
    )
    assert check_docs.first_difference(["a"], ["a", "b"]) == (1, "(no line)", "b")
    assert check_docs.same_line("took 21.3 s of wall time", "took 19.8 s  of wall time")
    assert check_docs.same_line("wrote /tmp/a1/x.json", "wrote /tmp/b2/x.json")
    assert not check_docs.same_line("lower bound 85.826 ms", "lower bound 85.827 ms")


def test_prose_figures_are_found_even_over_a_line_break():
    prose = [(10, "wins (96.8 ms), 1.2-1.9 GB each, best at sample"), (11, "2380; m=2 185.7, 45.4 s, 2.4% behind")]
    known = [("ms", "96.773"), ("GB", "1.192"), ("GB", "1.895"), ("sample", "2380"), ("ms", "185.680")]
    assert check_docs.stale_prose(prose, known) == ([], ["45.4 s", "2.4%"])
    stale, _ = check_docs.stale_prose(prose, known[1:])
    assert stale == ["line 10: 96.8 ms"]
    assert check_docs.summary_numbers(
        {
            "bytes_moved": 558376960.0,
            "peak_memory_bytes": {"gpu0": 1.166e9},
            "best_step_time_s": 0.5,
            "search_best_sample": 7,
            "samples": 2400,
            "note": "smallest peak is 4.45 GB",
        }
    ) == [("GB", repr(0.55837696)), ("GB", repr(1.166)), ("ms", "500.0"), ("sample", "7"), ("GB", "4.45")]
