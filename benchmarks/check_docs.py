"""The README's quoted outputs, checked: each quoted command is run again and compared with its quoted block.

    python benchmarks/check_docs.py                 # check: a table, exit status 1 on any mismatch
    python benchmarks/check_docs.py --fix           # also rewrite every stale quoted block in place
    python benchmarks/check_docs.py --list          # the blocks found and their commands; nothing run
    python benchmarks/check_docs.py --fresh-cache   # trace every graph again (an empty $POSTPLACE_CACHE)

**The convention** (README.md). An *output block* is a fenced block with no language. The line right
before its opening fence is a marker naming the command that prints it and, optionally, which lines of
the output the block quotes: ``from`` and ``to`` are Python regular expressions searched in the output's
lines (as quoted, see below); the block is the first line ``from`` matches through the first line at or
after it that ``to`` matches, both kept (default: the whole output)::

    <!-- check: postplace place resnet50 --cluster k80x4 --budget 2400 --out runs/resnet50
         from: step time \\(simulated\\)
         to: ^lower bound -->

The command must appear verbatim in a ```bash block earlier in the same section (the nearest ``#`` or
``##`` heading above), so the command a reader is told to run is the one checked, with the same seed,
budget and flags. It is run as an argument list (no shell) from a new temporary folder that links every
top-level entry of the clone except ``runs/`` (so ``src/...`` paths resolve and each ``--out runs/X`` is
a clean run folder), with the graphs traced before taken from the cache (``--fresh-cache``: none).

**As quoted.** What the command prints on stdout when stdout is not a terminal (rich's width 140),
with rich's tables drawn without borders: border lines dropped, column rules turned into spaces, a
table line's two-character left margin removed; every line loses its trailing blanks, and a line
outside a table its leading ones (rich centres titles). Stderr (``report: ...``) is not quoted.

**Compared exactly**, character for character: on the simulator every number is deterministic for a
given seed and budget. **Compared loosely** (every number masked, every absolute path replaced, runs
of blanks collapsed): a line that depends on wall time or on where it ran, i.e. one that says ``wall``,
``took`` or ``elapsed``, or names an absolute path. No block quoted today has such a line.

**Prose.** The lines after a block up to the next marker or heading are its prose; a section's lines
before its first block are its lead. Each figure there in ms or GB (``101.3 ms``, ``1.3-1.9 GB``), each
``sample N`` and each ``m=K T`` (a step time per micro-batch count) must be, rounded half up to the
figure's decimals, a number with that unit that the command printed or that its run folder's
``summary.json`` records (a ``*_s`` field as ms, a ``*bytes*`` field as GB, the figures written in its
notes), or one of an earlier block of the same section (for a lead: of any block of its section).
**Not checked**, and listed with each block: percentages, figures in seconds (wall times; the CPU's
45.4 s, which ``info`` prints in ms), counts without a unit (transfers, ops), the figures in
NOT_FROM_OUTPUT (each with where it comes from), and every figure outside a block's prose and its
section's lead (a section with no block; text after a ``###`` heading that no block follows).
``--fix`` rewrites quoted blocks only: a stale prose figure is for a person to rewrite, since the
sentence around it may no longer be true.
"""

from __future__ import annotations

import argparse
import bisect
import itertools
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from decimal import ROUND_HALF_UP, Decimal
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"

# Prose figures known not to come from a command's output or summary.json: figure -> where it comes from.
NOT_FROM_OUTPUT: dict[str, str] = {
    "3.5 ms": "ResNet-50's update on one K80 (the update-phase ops' times in RooflineCostModel's table), not printed",
    "3 GB": "the shipped cluster file's memory per device; commands print what is usable (2.5 GB)",
}

FENCE = re.compile(r"^```(\S*)\s*$")
HEADING = re.compile(r"^(#{1,6}) ")
MARKER_START = "<!-- check:"
BOX = re.compile(r"[\u2500-\u257f]")  # box drawing: rich's table borders and column rules
LOOSE = re.compile(r"\b(wall|took|elapsed)\b|(?<![\w.])/(?:tmp|home|root|Users|var|private)/")
PATH = re.compile(r"(?<![\w.])/[^\s'\"]+")
NUMBER = re.compile(r"\d+(?:[.,]\d+)*")
UNIT_FIGURE = re.compile(r"(?<![\w.=/-])(\d+(?:\.\d+)?)(?:\s*-\s*(\d+(?:\.\d+)?))?\s*(ms|GB)\b")
SAMPLE_FIGURE = re.compile(r"\bsample (\d+)\b")
COUNT_FIGURE = re.compile(r"\bm=\d+ (\d+\.\d+)(?!\d| ?(?:ms|GB)\b)")
UNCHECKED_FIGURE = re.compile(r"(?<![\w.-])\d+(?:\.\d+)?(?:-\d+(?:\.\d+)?)?(?:%| s\b)")


@dataclass
class Block:
    """One quoted output block: where it is, the command that prints it, and what it quotes."""

    number: int
    line: int  # README line (1-based) of the opening fence
    command: str
    start: str | None  # the ``from`` regex
    end: str | None  # the ``to`` regex
    quoted: list[str]
    span: tuple[int, int]  # README line indices (0-based) of the quoted lines, [a, b)
    section: str
    prose: list[tuple[int, str]] = field(default_factory=list)  # (README line, text) after the block
    lead: list[tuple[int, str]] = field(default_factory=list)  # the section's prose before its first block


@dataclass
class Run:
    """What one command printed, and the numbers its run folder's summary.json records."""

    rc: int
    stdout: str
    stderr: str
    wall_s: float
    summary_numbers: list[tuple[str, str]]  # (unit, value)


def parse(text: str) -> tuple[list[Block], list[str]]:
    """The README's output blocks and every way the text breaks the convention (empty when it keeps it)."""
    lines = text.splitlines()
    blocks: list[Block] = []
    problems: list[str] = []
    bash: list[tuple[str, str]] = []  # (section, text) of each ```bash block so far
    section, section_at, i = "", -1, 0
    while i < len(lines):
        line = lines[i]
        h = HEADING.match(line)
        if h and len(h.group(1)) <= 2:
            section, section_at = line, i
        if line.startswith(MARKER_START):
            j = i
            while "-->" not in lines[j] and j + 1 < len(lines):
                j += 1
            marker = "\n".join(lines[i : j + 1])
            fence = FENCE.match(lines[j + 1]) if j + 1 < len(lines) else None
            if fence is None or fence.group(1):
                problems.append(f"line {i + 1}: a check marker must stand right before a ``` block with no language")
                i = j + 1
                continue
            block, why = _block(marker, lines, i + 1, j + 1, section, len(blocks) + 1)
            problems += why
            if block is not None:
                if not any(s == section and block.command in b for s, b in bash):
                    problems.append(
                        f"line {i + 1}: '{block.command}' is not in a ```bash block above it in its section"
                    )
                if not any(b.section == section for b in blocks):
                    block.lead = _prose(lines, section_at + 1, stop=i)
                blocks.append(block)
            i = _closing(lines, j + 1) + 1
            continue
        fence = FENCE.match(line)
        if fence:
            end = _closing(lines, i)
            if not fence.group(1):
                problems.append(
                    f"line {i + 1}: an output block (``` with no language) without a check marker before it"
                )
            elif fence.group(1) in ("bash", "sh", "shell", "console"):
                bash.append((section, "\n".join(lines[i + 1 : end])))
            i = end + 1
            continue
        i += 1
    if not blocks:
        problems.append("no check marker: the README quotes no checked output")
    for b in blocks:
        b.prose = _prose(lines, b.span[1] + 1)
    return blocks, problems


def _closing(lines: list[str], i: int) -> int:
    j = i + 1
    while j < len(lines) and not FENCE.match(lines[j]):
        j += 1
    return j


def _block(marker: str, lines: list[str], line: int, fence: int, section: str, number: int):
    """The block a marker (README lines ``line``..) stands before, and what is wrong with it."""
    body = marker.removeprefix(MARKER_START).rsplit("-->", 1)[0]
    fields = [f.strip() for f in body.strip().splitlines()]
    command, start, end, problems = fields[0], None, None, []
    for f in fields[1:]:
        key, _, value = f.partition(":")
        if key not in ("from", "to") or not value.strip():
            problems.append(f"line {line}: marker field '{f}': give 'from: REGEX' or 'to: REGEX'")
            continue
        try:
            re.compile(value.strip())
        except re.error as exc:
            problems.append(f"line {line}: {key} '{value.strip()}' is not a regular expression ({exc})")
            continue
        start, end = (value.strip(), end) if key == "from" else (start, value.strip())
    close = _closing(lines, fence)
    quoted = [q.rstrip() for q in lines[fence + 1 : close]]
    if not command:
        return None, problems + [f"line {line}: a check marker with no command"]
    if not quoted:
        problems.append(f"line {fence + 1}: an empty output block")
    elif not problems:
        if start and not re.search(start, quoted[0]):
            problems.append(f"line {fence + 2}: the block's first line does not match its 'from: {start}'")
        if end and not re.search(end, quoted[-1]):
            problems.append(f"line {close}: the block's last line does not match its 'to: {end}'")
    return Block(number, fence + 1, command, start, end, quoted, (fence + 1, close), section), problems


def _prose(lines: list[str], i: int, stop: int | None = None) -> list[tuple[int, str]]:
    """The lines from ``i`` up to ``stop``, the next marker or the next heading, fenced blocks left out."""
    out = []
    stop = len(lines) if stop is None else stop
    while i < stop and not lines[i].startswith(MARKER_START) and not HEADING.match(lines[i]):
        if FENCE.match(lines[i]):
            i = _closing(lines, i) + 1
            continue
        out.append((i + 1, lines[i]))
        i += 1
    return out


def plain(text: str) -> list[str]:
    """Output as quoted: rich's tables without their borders, trailing blanks dropped (see the module doc)."""
    out = []
    for line in text.splitlines():
        if BOX.search(line):
            if not BOX.sub("", line).strip():
                continue  # a border line
            out.append(BOX.sub(" ", line)[2:].rstrip())
        else:
            out.append(line.strip())
    return out


def select(lines: list[str], start: str | None, end: str | None) -> list[str] | None:
    """The lines a block quotes (None when ``from`` or ``to`` matches nothing)."""
    i = 0 if start is None else next((k for k, x in enumerate(lines) if re.search(start, x)), None)
    if i is None:
        return None
    j = len(lines) - 1 if end is None else next((k for k in range(i, len(lines)) if re.search(end, lines[k])), None)
    return None if j is None else lines[i : j + 1]


def _mask(line: str) -> str:
    return " ".join(NUMBER.sub("#", PATH.sub("<path>", line)).split())


def same_line(quoted: str, now: str) -> bool:
    """Equal, or (a line that depends on wall time or paths) equal once numbers and paths are masked."""
    if quoted == now:
        return True
    return bool(LOOSE.search(quoted) or LOOSE.search(now)) and _mask(quoted) == _mask(now)


def first_difference(quoted: list[str], now: list[str]) -> tuple[int, str, str] | None:
    """``(index, quoted line, line now)`` of the first line that differs; None when none does."""
    for k in range(max(len(quoted), len(now))):
        q = quoted[k] if k < len(quoted) else "(no line)"
        n = now[k] if k < len(now) else "(no line)"
        if not same_line(q, n):
            return k, q, n
    return None


def _figures(text: str) -> list[tuple[str, str, int]]:
    """The checked figures of prose, as ``(unit, value, position)``; unit 'sample' for a sample number."""
    found = []
    for m in UNIT_FIGURE.finditer(text):
        found += [(m.group(3), v, m.start()) for v in (m.group(1), m.group(2)) if v]
    found += [("ms", m.group(1), m.start(1)) for m in COUNT_FIGURE.finditer(text)]
    found += [("sample", m.group(1), m.start(1)) for m in SAMPLE_FIGURE.finditer(text)]
    return sorted(found, key=lambda f: f[2])


def output_numbers(lines: list[str]) -> list[tuple[str, str]]:
    """Every number a command printed with a unit (ms, GB) or as a sample number."""
    text = "\n".join(lines)
    found = [(m.group(3), v) for m in UNIT_FIGURE.finditer(text) for v in (m.group(1), m.group(2)) if v]
    return found + [("sample", m.group(1)) for m in SAMPLE_FIGURE.finditer(text)]


def summary_numbers(summary, key: str = "") -> list[tuple[str, str]]:
    """The numbers of a summary.json: ``*_s`` fields as ms, ``*bytes*`` as GB, ``*sample`` as sample numbers,
    and the figures written in its strings; a field inside another (a dict per device) takes the outer
    field's unit unless its own name gives one."""
    if isinstance(summary, dict):
        return [x for k, v in summary.items() for x in summary_numbers(v, k if _unit(k) else key)]
    if isinstance(summary, list):
        return [x for v in summary for x in summary_numbers(v, key)]
    if isinstance(summary, str):
        return output_numbers([summary])
    if isinstance(summary, bool) or not isinstance(summary, int | float) or not _unit(key):
        return []
    unit = _unit(key)
    value = summary / 1e9 if unit == "GB" else summary * 1e3 if unit == "ms" else summary
    return [(unit, repr(value))]


def _unit(key: str) -> str:
    return "GB" if "bytes" in key else "ms" if key.endswith("_s") else "sample" if key.endswith("sample") else ""


def rounds_to(value: str, figure: str) -> bool:
    """``value`` rounded half up to ``figure``'s decimals is ``figure``."""
    places = len(figure.partition(".")[2])
    try:
        return Decimal(value).quantize(Decimal(1).scaleb(-places), ROUND_HALF_UP) == Decimal(figure)
    except ArithmeticError:
        return False


def stale_prose(prose: list[tuple[int, str]], known: list[tuple[str, str]]) -> tuple[list[str], list[str]]:
    """The figures of prose that match no known number, and its figures not checked (the prose is read as
    one text, so a figure broken over two lines is still found)."""
    text = " ".join(t for _, t in prose)
    starts = list(itertools.accumulate((len(t) + 1 for _, t in prose), initial=0))
    stale, unchecked = [], []
    for unit, value, at in _figures(text):
        figure = f"{value} {unit}" if unit != "sample" else f"sample {value}"
        if figure in NOT_FROM_OUTPUT:
            unchecked.append(f"{figure} ({NOT_FROM_OUTPUT[figure]})")
        elif not any(u == unit and rounds_to(v, value) for u, v in known):
            stale.append(f"line {prose[bisect.bisect_right(starts, at) - 1][0]}: {figure}")
    unchecked += [m.group(0) for m in UNCHECKED_FIGURE.finditer(UNIT_FIGURE.sub("", text))]
    return stale, unchecked


def _postplace() -> str:
    beside = Path(sys.executable).with_name("postplace")
    return str(beside) if beside.exists() else (shutil.which("postplace") or "postplace")


def run(command: str, *, fresh_cache: bool, timeout: float) -> Run:
    """Run a quoted command from a clean temporary folder beside the clone's files (see the module doc)."""
    argv = shlex.split(command)
    if argv[0] == "postplace":
        argv[0] = _postplace()
    with tempfile.TemporaryDirectory(prefix="check_docs-") as tmp:
        for entry in ROOT.iterdir():
            if entry.name != "runs" and not entry.name.startswith("."):
                os.symlink(entry, Path(tmp) / entry.name)
        env = dict(os.environ)
        if fresh_cache:
            env["POSTPLACE_CACHE"] = str(Path(tmp) / ".cache")
        t0 = time.perf_counter()
        try:
            p = subprocess.run(argv, cwd=tmp, env=env, capture_output=True, text=True, timeout=timeout)
            rc, out, err = p.returncode, p.stdout, p.stderr
        except subprocess.TimeoutExpired:
            rc, out, err = -1, "", f"timed out after {timeout:.0f} s"
        wall = time.perf_counter() - t0
        numbers = []
        if "--out" in argv[:-1]:
            summary = Path(tmp) / argv[argv.index("--out") + 1] / "summary.json"
            if summary.is_file():
                numbers = summary_numbers(json.loads(summary.read_text()))
    return Run(rc, out, err, wall, numbers)


def _short(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 3] + "..."


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--readme", type=Path, default=README)
    ap.add_argument("--fix", action="store_true", help="rewrite every stale quoted block with the output now")
    ap.add_argument("--list", action="store_true", help="list the blocks and their commands; run nothing")
    ap.add_argument("--fresh-cache", action="store_true", help="trace every graph again (an empty cache)")
    ap.add_argument("--timeout", type=float, default=900.0, help="seconds one command may take")
    args = ap.parse_args(argv)
    text = args.readme.read_text()
    blocks, problems = parse(text)
    for p in problems:
        print(f"{args.readme.name}: {p}")
    if problems:
        return 2
    if args.list:
        for b in blocks:
            sel = "".join(f" {k} /{v}/" for k, v in (("from", b.start), ("to", b.end)) if v)
            print(f"block {b.number} (line {b.line}, {len(b.quoted)} lines{sel}): {b.command}")
        return 0

    runs: dict[str, Run] = {}
    for b in blocks:
        if b.command not in runs:
            print(f"running block {b.number}: {b.command}", flush=True)
            runs[b.command] = run(b.command, fresh_cache=args.fresh_cache, timeout=args.timeout)
    rows, details, fixes = [], [], {}
    numbers: dict[int, list[tuple[str, str]]] = {}  # per block, what its command printed and recorded
    for b in blocks:
        r = runs[b.command]
        now_all = plain(r.stdout)
        now = select(now_all, b.start, b.end) if r.rc == 0 else None
        numbers[b.number] = output_numbers(now_all) + r.summary_numbers
        status, first = "ok", ""
        if r.rc != 0:
            status = "FAILED"
            first = f"exit status {r.rc}: {(r.stderr.strip().splitlines() or [''])[-1]}"
        elif now is None:
            status, first = "FAILED", f"from /{b.start}/ to /{b.end}/ matches nothing in the output"
        elif (diff := first_difference(b.quoted, now)) is not None:
            status = "STALE"
            first = f"line {b.line + 1 + diff[0]}: {diff[1].strip()!r} -> now {diff[2].strip()!r}"
            details.append(
                f"block {b.number}, README line {b.line + 1 + diff[0]}:\n  quoted: {diff[1]}\n  now:    {diff[2]}"
            )
            fixes[b.span] = now
        rows.append([f"{b.number} (line {b.line})", b.command, status, f"{r.wall_s:.1f}", first])
    for row, b in zip(rows, blocks, strict=True):
        # the prose after a block: the numbers of its section's blocks so far; the section's lead: of all of them
        section = [c for c in blocks if c.section == b.section]
        stale, unchecked = stale_prose(b.prose, [x for c in section if c.number <= b.number for x in numbers[c.number]])
        lead_stale, lead_unchecked = stale_prose(b.lead, [x for c in section for x in numbers[c.number]])
        stale, unchecked = lead_stale + stale, lead_unchecked + unchecked
        if stale:
            row[2] = row[2] if row[2] != "ok" else "PROSE"
            row[4] = row[4] or f"prose {stale[0]} matches no number printed"
            details.append(f"block {b.number}: prose figures that match no number printed: {'; '.join(stale)}")
        if unchecked:
            details.append(f"block {b.number}: prose figures not checked: {', '.join(unchecked)}")

    head = ("block", "command", "status", "wall s", "first differing line")
    widths = [max(len(head[0]), *(len(r[0]) for r in rows)), 60, 6, 6]
    print()
    print("  ".join(h.ljust(w) for h, w in zip(head, widths, strict=False)) + "  " + head[4])
    for r in rows:
        cells = (r[0], _short(r[1], 60), r[2], r[3])
        print("  ".join(c.ljust(w) for c, w in zip(cells, widths, strict=False)) + "  " + _short(r[4], 110))
    print(f"(wall s: each command's wall time, graphs {'traced afresh' if args.fresh_cache else 'from the cache'})")
    for d in details:
        print(d)
    if args.fix and fixes:
        lines = text.splitlines()
        for (a, b_), now in sorted(fixes.items(), reverse=True):
            lines[a:b_] = now
        args.readme.write_text("\n".join(lines) + ("\n" if text.endswith("\n") else ""))
        print(f"rewrote {len(fixes)} quoted block(s) in {args.readme}; prose is for a person to rewrite")
    return 0 if all(r[2] == "ok" for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
