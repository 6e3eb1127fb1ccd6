"""Throw seeded malformed inputs at the ``postplace`` CLI and at the library; print a table of outcomes.

    python benchmarks/fuzz_cli.py [--seed 0] [--per-kind 150] [--workload 150] [--config 150] [--run-edits 450]
                                  [--timeout 40] [--only TEXT] [--log FILE] [--real 0] [--show 3]

Cases come from :mod:`postplace.testing.fuzz`: graph, cluster and placement files (structured
mutations and format-agnostic corruptions), CLI flags, placement files for ``train``, and run folders
made by a real tiny ``postplace place`` run, then corrupted (flipped bytes, truncation, deletion,
garbage). Since issue 22 also: dnn-partitioning workload files (latencies of 1e308 or 0, integers
past 64 bits, machines of a million devices), the flag families ``--microbatches``, ``--confirm``,
``--ray`` (at 127.0.0.1:1, where nothing listens), ``--optimizer``/``--lr``/``--precision``,
``--cluster workload:``, ``--resume`` with other flags, ``--set``/``--config`` values (every
strategy's fields out of range, NaN, huge) and run folders damaged or edited file by file with their
checksums recomputed (``run.json``, ``checkpoint.json`` and its npz, ``history.jsonl``,
``timing.jsonl``, ``summary.json``, ``placement.json``, ``plans.json``, ``m{k}/``), of a graph file's
run and of a zoo model's run over micro-batch counts, through ``place --resume`` and ``report``.
The defaults take about a quarter of an hour on 2 cores. Each CLI case runs in its own forked process (the parent has imported postplace and warmed
the compiled simulator, so a case costs tens of milliseconds instead of seconds) calling the CLI's
``main`` with the case's arguments, killed after ``--timeout`` seconds (a hang). ``--real N`` also
runs the first N cases through a real ``python -m postplace.cli`` subprocess and insists the outcome
class is the same. The library half loads every graph/cluster/placement file with
``load_graph`` / ``load_cluster`` / ``load_placement`` (in a fork as well, to catch hangs).

Every case carries what the documentation promises (``expect``: certainly invalid, certainly valid,
undecided; a corrupted file is re-read with ``json``/``tomllib`` and judged by the documented rules).
Outcomes: clean (exit 2, one ``error:`` line, for an invalid or undecided input), usage (exit 2 from
the argument parser, naming the flag), refused-valid (either, for an input the documentation promises
is accepted: a defect), internal (exit 3 or a traceback), hang, accepted (exit 0 and the answer checks out: every
number finite, and for ``simulate`` the step time equals the library's for the same files),
accepted-wrong (exit 0 on an input that is certainly invalid, or an answer that does not check out:
for ``place``, the returned step time is not the simulated one of the returned placement, or a
figure is below the lower bound; or, computed by the fuzz itself apart from the simulator
(:mod:`postplace.testing.fuzz_oracle`), a ``simulate`` step time outside the documented model's bounds,
or not the sum of the op times when every op is on one device, or a ``place`` answer below what any
placement can reach). ``--log FILE`` writes one JSON line per case (its arguments and
outcome), to reproduce any one of them.
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

ORDER = list(fuzz.OUTCOMES)


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
        from postplace.api import load_target
        from postplace.cli import parse_placement
        from postplace.cluster.from_workload import resolve_cluster
        from postplace.sim import Simulator

        doc = json.loads(out.strip().splitlines()[-1])
        target = str(cwd / argv[1]) if (cwd / argv[1]).exists() else argv[1]
        size = argv[argv.index("--size") + 1] if "--size" in argv else "full"
        m = int(argv[argv.index("--microbatches") + 1]) if "--microbatches" in argv else 1
        g = load_target(target, size=size, microbatches=m).graph
        name = argv[argv.index("--cluster") + 1]
        base = name.removeprefix("workload:")
        full = str(cwd / base) if base and (cwd / base).exists() else base
        c = resolve_cluster(name[: len(name) - len(base)] + full, g)
        spec = doc["placement"]
        dev = parse_placement(spec if spec.startswith("single:") else str(cwd / spec), g, c)
        sched = Simulator(g, c).schedule(dev)
        return sched.step_time == doc["step_time_s"] and doc["step_time_s"] >= doc["lower_bound_s"] * (1 - 1e-9)

    return check


def both(*checks):
    """One check that holds when every given check (None: none) holds."""
    given = [c for c in checks if c is not None]
    return (lambda out: all(c(out) for c in given)) if given else None


def make_run_template(root: Path, timeout: float, kind: str = "file") -> Path:
    """A real tiny ``place`` run to corrupt: ``file``, the base graph file on the base cluster at one
    micro-batch count; ``zoo``, the small RNNLM on k80x2 over m = 1, 2 (``m1/``, ``m2/``, ``plans.json``)."""
    tpl = root / f"template-{kind}"
    tpl.mkdir()
    fuzz.base_graph().save(tpl / fuzz.GRAPH)
    (tpl / fuzz.CLUSTER).write_text(fuzz.base_cluster_toml())
    if kind == "file":
        argv = [
            "place",
            fuzz.GRAPH,
            "--cluster",
            fuzz.CLUSTER,
            "--budget",
            "48",
            "--groups",
            "none",
            "--out",
            "run",
            "--json",
        ]
    else:
        argv = ["place", *fuzz.ZOO, "--cluster", "k80x2", "--budget", "48", "--out", "run", "--json"]
    rc, out, err = forked(cli(argv, tpl), timeout * 3)
    if rc != 0:
        raise SystemExit(f"the template run failed (rc {rc}): {err.strip()[-500:]}")
    return tpl


def place_check(argv: list[str]):
    """For an accepted ``place``: the returned step time is the simulated one of the returned placement
    (a simulated run), and no figure is below the simulator's lower bound."""

    def check(out: str) -> bool:
        doc = json.loads(out.strip().splitlines()[-1])
        lb = doc["lower_bound_s"]
        times = [
            doc["best_step_time_s"],
            doc["search_best_step_time_s"],
            *[v for v in doc["candidates"].values() if v is not None],
        ]
        ok = all(t is None or t >= lb * (1 - 1e-9) for t in times)
        if doc["evaluator"] == "simulator" and "confirm" not in doc:
            ok = ok and abs(doc["best_step_time_s"] - doc["simulated_step_time_s"]) <= 1e-9 * doc["best_step_time_s"]
        return ok

    return check


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--per-kind", type=int, default=150, help="graph, cluster and placement files each")
    ap.add_argument("--train", type=int, default=5, help="placement files given to `postplace train`")
    ap.add_argument("--run-folder", type=int, default=20, help="corrupted run folders resumed with place")
    ap.add_argument("--workload", type=int, default=150, help="dnn-partitioning workload files")
    ap.add_argument("--flags", type=int, default=1, help="1: the flag families (--microbatches, --confirm, --ray...)")
    ap.add_argument("--config", type=int, default=150, help="generated --set/--config values (beside the fixed ones)")
    ap.add_argument(
        "--run-edits",
        type=int,
        default=450,
        help="run folders damaged or edited file by file (checksums recomputed), for --resume and report",
    )
    ap.add_argument("--log", default="", help="append one JSON line per case (category, label, outcome) here")
    ap.add_argument("--only", default="", help="run only the categories whose name contains this text")
    ap.add_argument("--timeout", type=float, default=40.0, help="seconds per case before it counts as a hang")
    ap.add_argument("--real", type=int, default=0, help="also run the first N cases as real subprocesses")
    ap.add_argument("--show", type=int, default=3, help="examples to print per bad outcome class")
    args = ap.parse_args()

    # warm the compiled kernels and the zoo cache in the parent, so forks start warm
    import postplace.api  # noqa: F401  (the CLI's modules too: a case then costs its own work only)
    import postplace.cli  # noqa: F401
    import postplace.report  # noqa: F401
    import postplace.search  # noqa: F401
    from postplace.cluster.cluster import Cluster
    from postplace.sim import Simulator

    g = fuzz.base_graph()
    Simulator(g, Cluster.from_toml_text(fuzz.base_cluster_toml())).evaluate_ops(
        __import__("numpy").zeros((1, g.num_ops), dtype="int64")
    )
    root = Path(tempfile.mkdtemp(prefix="postplace-fuzz-"))
    t0 = time.perf_counter()
    all_cases = [
        c
        for c in fuzz.cases(
            args.seed,
            per_kind=args.per_kind,
            train=args.train,
            run_folder=args.run_folder,
            workload=args.workload,
            flags=bool(args.flags),
            config=args.config,
            run_edits=args.run_edits,
        )
        if args.only in c.category
    ]
    templates = {
        kind: make_run_template(root, args.timeout, kind)
        for kind in sorted(
            {c.template for c in all_cases if c.template} | ({"file"} if any(c.copy_run for c in all_cases) else set())
        )
    }
    rng = random.Random(args.seed + 1)
    counts: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    examples: dict[str, list[str]] = collections.defaultdict(list)
    n_cli = n_lib = 0
    for k, case in enumerate(all_cases):
        cwd = root / f"case{k}"
        if case.copy_run:
            shutil.copytree(templates["file"], cwd)
            for rel, label in case.files.items():
                p = next(iter(sorted(cwd.glob(rel))), cwd / rel)
                p.write_bytes(fuzz.corrupt_run_file(rng, p.read_bytes(), label.decode()))
        elif case.template:
            shutil.copytree(templates[case.template], cwd)
            try:
                for edit in case.edits:
                    fuzz.apply_edit(cwd / "run", edit, rng)
            except Exception as exc:  # noqa: BLE001  (the harness's own failure: say so, go on)
                print(f"harness: cannot apply {case.label}: {type(exc).__name__}: {exc}", file=sys.stderr)
                shutil.rmtree(cwd, ignore_errors=True)
                continue
        else:
            cwd.mkdir()
            for rel, data in case.files.items():
                (cwd / rel).write_bytes(data)
        started = time.perf_counter()
        rc, out, err = forked(cli(case.argv, cwd), args.timeout)
        took = time.perf_counter() - started
        check = None
        if rc == 0 and case.argv[0] == "simulate":
            check = both(simulate_check(cwd, case.argv), fuzz.simulate_check(case.files, case.argv))
        elif rc == 0 and case.argv[0] == "place":
            check = both(place_check(case.argv), fuzz.place_check(case.files, case.argv))
        try:
            outcome = fuzz.classify(case, rc, out, err, check)
        except Exception as exc:  # the check itself failed: the CLI accepted what the library refuses
            outcome, err = "accepted-wrong", f"check failed: {type(exc).__name__}: {exc}"
        n_cli += 1
        counts[f"CLI: {case.category}"][outcome] += 1
        if outcome not in ("clean", "accepted", "usage") and len(examples[outcome]) < args.show * 4:
            last = (err.strip().splitlines() or [""])[-1][:200]
            why = f" ({case.why})" if case.why else ""
            examples[outcome].append(
                f"[{case.category}] {case.label}{why}: postplace {' '.join(case.argv)[:160]} -> rc {rc}: {last}"
            )
        if args.log:
            last = (err.strip().splitlines() or [""])[-1][:300]
            with open(args.log, "a") as f:
                f.write(
                    json.dumps(
                        {
                            "category": case.category,
                            "label": case.label,
                            "argv": case.argv,
                            "expect": case.expect,
                            "why": case.why,
                            "outcome": outcome,
                            "rc": rc,
                            "err": last,
                            "wall_s": round(took, 2),
                        }
                    )
                    + "\n"
                )
        if k < args.real:
            real = subprocess.run(
                [sys.executable, "-m", "postplace.cli", *case.argv],
                cwd=cwd,
                capture_output=True,
                text=True,
                timeout=args.timeout * 3,
                env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
            )
            again = fuzz.classify(case, real.returncode, real.stdout, real.stderr, None)
            same = again == outcome or {again, outcome} <= {"accepted", "accepted-wrong"}
            counts["real subprocess agrees"]["yes" if same else "no"] += 1
        if case.category in ("graph file", "cluster file", "placement file"):
            rc, out, err = forked(library_load(case, cwd), args.timeout)
            # the library reads the placement file too: judge the files as simulate reads them
            expect = fuzz.expect_files(case.files, fuzz.SIMULATE_G)[0] if case.why else case.expect
            lib_case = fuzz.Case(case.category, case.label, ["library"], expect=expect)
            counts[f"library: {case.category}"][fuzz.classify(lib_case, rc, out, err)] += 1
            n_lib += 1
        shutil.rmtree(cwd, ignore_errors=True)
    wall = time.perf_counter() - t0
    shutil.rmtree(root, ignore_errors=True)

    print(f"seed {args.seed}: {n_cli} CLI cases + {n_lib} library cases in {wall:.0f} s")
    print(f"{'category':40s} " + " ".join(f"{c:>14s}" for c in ORDER))
    total = collections.Counter()
    for cat in sorted(counts):
        if cat.startswith("real"):
            continue
        print(f"{cat:40s} " + " ".join(f"{counts[cat][c]:14d}" for c in ORDER))
        total.update(counts[cat])
    print(f"{'all':40s} " + " ".join(f"{total[c]:14d}" for c in ORDER))
    if "real subprocess agrees" in counts:
        print(f"real subprocess agrees with the fork: {dict(counts['real subprocess agrees'])}")
    for outcome, lines in examples.items():
        print(f"\n{outcome}:")
        for line in lines:
            print("  " + line)


if __name__ == "__main__":
    main()
