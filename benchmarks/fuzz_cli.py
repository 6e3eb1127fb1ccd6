"""Throw seeded malformed inputs at the ``postplace`` CLI and at the library; print a table of outcomes.

    python benchmarks/fuzz_cli.py [--seed 0] [--per-kind 300] [--timeout 20] [--real 0] [--show 3]

Cases come from :mod:`postplace.testing.fuzz`: graph, cluster and placement files (structured
mutations and format-agnostic corruptions), CLI flags, placement files for ``train``, and run folders
made by a real tiny ``postplace place`` run, then corrupted (flipped bytes, truncation, deletion,
garbage). Each CLI case runs in its own forked process (the parent has imported postplace and warmed
the compiled simulator, so a case costs tens of milliseconds instead of seconds) calling the CLI's
``main`` with the case's arguments, killed after ``--timeout`` seconds (a hang). ``--real N`` also
runs the first N cases through a real ``python -m postplace.cli`` subprocess and insists the outcome
class is the same. The library half loads every graph/cluster/placement file with
``load_graph`` / ``load_cluster`` / ``load_placement`` (in a fork as well, to catch hangs).

Outcomes: clean (exit 2, one ``error:`` line), usage (exit 2 from the argument parser, naming the
flag), internal (exit 3 or a traceback), hang, accepted (exit 0 and the answer checks out: every
number finite, and for ``simulate`` the step time equals the library's for the same files),
accepted-wrong (exit 0 on an input that is certainly invalid, or an answer that does not check out).
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch  # noqa: E402

torch.set_num_threads(1)

from postplace.testing import fuzz  # noqa: E402

ORDER = ["clean", "usage", "internal", "hang", "accepted", "accepted-wrong"]


def forked(fn, timeout: float) -> tuple[int | None, str, str]:
    """Run ``fn()`` (returns an exit status or raises SystemExit) in a forked child; (rc, out, err)."""
    with tempfile.TemporaryFile() as fo, tempfile.TemporaryFile() as fe:
        pid = os.fork()
        if pid == 0:  # the child
            rc = 1
            try:
                os.dup2(fo.fileno(), 1)
                os.dup2(fe.fileno(), 2)
                signal.signal(signal.SIGINT, signal.SIG_DFL)
                rc = fn() or 0
            except SystemExit as exc:
                rc = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
            except BaseException:
                import traceback

                traceback.print_exc()
                rc = 99
            finally:
                try:
                    sys.stdout.flush()
                    sys.stderr.flush()
                finally:
                    os._exit(rc)
        deadline = time.monotonic() + timeout
        rc = None
        while time.monotonic() < deadline:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                rc = os.waitstatus_to_exitcode(status)
                break
            time.sleep(0.005)
        if rc is None:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        fo.seek(0)
        fe.seek(0)
        return rc, fo.read().decode(errors="replace"), fe.read().decode(errors="replace")


def cli(argv: list[str], cwd: Path):
    def go():
        os.chdir(cwd)
        sys.argv = ["postplace", *argv]
        from postplace.cli import main

        main()
        return 0

    return go


def library_load(case: fuzz.Case, cwd: Path):
    """The library readers on the case's files, as a function for :func:`forked`."""

    def go():
        from postplace.cluster import load_cluster
        from postplace.cluster.placement import load_placement
        from postplace.errors import PostplaceError
        from postplace.graph import load_graph

        os.chdir(cwd)
        try:
            g = load_graph(fuzz.GRAPH)
            c = load_cluster(fuzz.CLUSTER)
            load_placement(fuzz.PLACEMENT, g, c)
            from postplace.sim import Simulator

            sim = Simulator(g, c)
            print(json.dumps({"lower_bound_s": sim.lower_bound}))
        except PostplaceError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        return 0

    return go


def simulate_check(cwd: Path, argv: list[str]):
    """For an accepted ``simulate``: the CLI's step time equals the library's on the same files."""

    def check(out: str) -> bool:
        from postplace.cli import parse_placement
        from postplace.cluster import load_cluster
        from postplace.graph import load_graph
        from postplace.sim import Simulator

        doc = json.loads(out.strip().splitlines()[-1])
        g = load_graph(cwd / argv[1])
        name = argv[argv.index("--cluster") + 1]
        c = load_cluster(str(cwd / name) if (cwd / name).exists() else name)
        spec = doc["placement"]
        dev = parse_placement(spec if spec.startswith("single:") else str(cwd / spec), g, c)
        sched = Simulator(g, c).schedule(dev)
        return sched.step_time == doc["step_time_s"] and doc["step_time_s"] >= doc["lower_bound_s"] * (1 - 1e-9)

    return check


def make_run_template(root: Path, timeout: float) -> Path:
    """A real tiny ``place`` run on the base graph and cluster, to corrupt."""
    tpl = root / "template"
    tpl.mkdir()
    fuzz.base_graph().save(tpl / fuzz.GRAPH)
    (tpl / fuzz.CLUSTER).write_text(fuzz.base_cluster_toml())
    argv = ["place", fuzz.GRAPH, "--cluster", fuzz.CLUSTER, "--budget", "48", "--groups", "none", "--out", "run",
            "--json"]  # fmt: skip
    rc, out, err = forked(cli(argv, tpl), timeout * 3)
    if rc != 0:
        raise SystemExit(f"the template run failed (rc {rc}): {err.strip()[-500:]}")
    return tpl


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--per-kind", type=int, default=300, help="graph, cluster and placement files each")
    ap.add_argument("--train", type=int, default=15, help="placement files given to `postplace train`")
    ap.add_argument("--run-folder", type=int, default=60, help="corrupted run folders resumed with place")
    ap.add_argument("--timeout", type=float, default=20.0, help="seconds per case before it counts as a hang")
    ap.add_argument("--real", type=int, default=0, help="also run the first N cases as real subprocesses")
    ap.add_argument("--show", type=int, default=3, help="examples to print per bad outcome class")
    args = ap.parse_args()

    # warm the compiled kernels and the zoo cache in the parent, so forks start warm
    from postplace.cluster.cluster import Cluster
    from postplace.sim import Simulator

    g = fuzz.base_graph()
    Simulator(g, Cluster.from_toml_text(fuzz.base_cluster_toml())).evaluate_ops(
        __import__("numpy").zeros((1, g.num_ops), dtype="int64")
    )
    root = Path(tempfile.mkdtemp(prefix="postplace-fuzz-"))
    tpl = make_run_template(root, args.timeout)
    rng = random.Random(args.seed + 1)
    counts: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    examples: dict[str, list[str]] = collections.defaultdict(list)
    t0 = time.perf_counter()
    n_cli = n_lib = 0
    all_cases = list(fuzz.cases(args.seed, per_kind=args.per_kind, train=args.train, run_folder=args.run_folder))
    for k, case in enumerate(all_cases):
        cwd = root / f"case{k}"
        if case.copy_run:
            shutil.copytree(tpl, cwd)
            for rel, label in case.files.items():
                p = next(iter(sorted(cwd.glob(rel))), cwd / rel)
                p.write_bytes(fuzz.corrupt_run_file(rng, p.read_bytes(), label.decode()))
        else:
            cwd.mkdir()
            for rel, data in case.files.items():
                (cwd / rel).write_bytes(data)
        rc, out, err = forked(cli(case.argv, cwd), args.timeout)
        check = simulate_check(cwd, case.argv) if case.argv[0] == "simulate" and rc == 0 else None
        try:
            outcome = fuzz.classify(case, rc, out, err, check)
        except Exception as exc:  # the check itself failed: the CLI accepted what the library refuses
            outcome, err = "accepted-wrong", f"check failed: {type(exc).__name__}: {exc}"
        n_cli += 1
        counts[f"CLI: {case.category}"][outcome] += 1
        if outcome not in ("clean", "accepted", "usage") and len(examples[outcome]) < args.show * 4:
            last = (err.strip().splitlines() or [""])[-1][:200]
            examples[outcome].append(f"[{case.category}] {case.label} -> rc {rc}: {last}")
        if k < args.real:
            real = subprocess.run(
                [sys.executable, "-m", "postplace.cli", *case.argv], cwd=cwd, capture_output=True, text=True,
                timeout=args.timeout * 3, env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
            )  # fmt: skip
            again = fuzz.classify(case, real.returncode, real.stdout, real.stderr, None)
            same = again == outcome or {again, outcome} <= {"accepted", "accepted-wrong"}
            counts["real subprocess agrees"]["yes" if same else "no"] += 1
        if case.category in ("graph file", "cluster file", "placement file"):
            rc, out, err = forked(library_load(case, cwd), args.timeout)
            lib_case = fuzz.Case(case.category, case.label, ["library"], must_fail=case.must_fail)
            counts[f"library: {case.category}"][fuzz.classify(lib_case, rc, out, err)] += 1
            n_lib += 1
        shutil.rmtree(cwd, ignore_errors=True)
    wall = time.perf_counter() - t0
    shutil.rmtree(root, ignore_errors=True)

    print(f"seed {args.seed}: {n_cli} CLI cases + {n_lib} library cases in {wall:.0f} s")
    print(f"{'category':28s} " + " ".join(f"{c:>14s}" for c in ORDER))
    total = collections.Counter()
    for cat in sorted(counts):
        if cat.startswith("real"):
            continue
        print(f"{cat:28s} " + " ".join(f"{counts[cat][c]:14d}" for c in ORDER))
        if cat != "CLI: run folder":
            total.update(counts[cat])
    print(f"{'all but run folders':28s} " + " ".join(f"{total[c]:14d}" for c in ORDER))
    if "real subprocess agrees" in counts:
        print(f"real subprocess agrees with the fork: {dict(counts['real subprocess agrees'])}")
    for outcome, lines in examples.items():
        print(f"\n{outcome}:")
        for line in lines:
            print("  " + line)


if __name__ == "__main__":
    main()
