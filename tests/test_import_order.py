"""No box of ``src/postplace`` imports a higher one (issue 22).

DESIGN.md section 1: "Data flows one way, top to bottom; a lower box never imports a higher one (`sim`
knows nothing of `search`, `cost` nothing of `zoo`); where a lower box needs something from a higher
one, the higher one passes it in." ``ORDER`` below writes that order down, lowest first; every
``import`` and ``from ... import`` of every module is checked against it, wherever it stands (module
level, inside a function, under ``if TYPE_CHECKING``), relative imports resolved.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"

ORDER = (
    # Utilities every box may use (DESIGN.md names validate.py "at the top" as the checks every file and
    # flag goes through, but it is called from the bottom up: graph/ and cluster/ check their files with it).
    "_version",  # the package's version string, read by the report's provenance
    "errors",  # PostplaceError, the one-line error every box raises
    "validate",  # the checks every file and flag goes through (imports errors only)
    # The boxes of DESIGN.md section 1, in the order its data flows.
    "graph",  # OpGraph: the data model every other box reads
    "cluster",  # devices and links; placements checked against a graph
    "cost",  # time(op, device), time(bytes, a -> b): reads graph and cluster; "nothing of zoo"
    # plans: the passes practitioners' plans are made of (DDP, ZeRO, FSDP, recomputation), functions from a
    # step to a step with its collectives; they read only graph/ (DESIGN.md 4b), and api/ and benchmarks use them
    "plans",
    # zoo: the benchmark models, the "model + example batch" the flow starts from, traced by graph/ and
    # profiled with cost/. DESIGN.md lists it last among the boxes, but runtime/ (traced zoo steps,
    # calibration), report/ (a run's cached zoo graph) and testing/ (fuzz targets) read it, so it sits
    # below them; it needs nothing from sim/, search/ or placers/, and they nothing from it.
    "zoo",
    "sim",  # the evaluator; "knows nothing of search"
    "search",  # strategies and the runner, driving an evaluator
    "placers",  # one-shot baselines (the simulator scores pipelines and Baechi's steps)
    "runtime",  # a placed step run for real
    "distributed",  # Ray workers running a simulator or a runtime evaluator
    "report",  # tables, plots, HTML of run folders
    # At the top (DESIGN.md section 1), each front end above what it calls.
    "confirm",  # re-measure a run's candidates (placers, search state)
    "comparison",  # strategies and baselines side by side (search, placers, sim)
    "api",  # the product's front door: place, resume, compare, apply (and the answer over micro-batch counts)
    "paper",  # the paper's grid of comparisons (comparison, api's micro-batch counts, zoo, report's table)
    "cli",  # parses, calls api, prints
    "postplace",  # the package itself: re-exports api's names on first use
    # Above the product, like the tests it serves: fakes, contract suites and fuzz cases that may call
    # any box (the fuzz cases recompute api's run-folder checksum); no product module imports it.
    "testing",
)
RANK = {unit: rank for rank, unit in enumerate(ORDER)}

EXCEPTIONS: dict[tuple[str, str], str] = {}
"""(importing module, imported module) pairs allowed to point upward, each with its reason: none left."""


def module_name(path: Path, src: Path) -> str:
    parts = list(path.relative_to(src).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _is_module(name: str, src: Path) -> bool:
    base = src.joinpath(*name.split("."))
    return base.with_suffix(".py").is_file() or (base / "__init__.py").is_file()


def imported_modules(path: Path, src: Path = SRC) -> list[tuple[int, str]]:
    """``(line, module)`` for every import in the file, function-level ones included; ``from X import
    n`` counts as importing ``X.n`` where that is a module of ``src``, else ``X``."""
    module = module_name(path, src)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: up level - 1 packages from this module's package
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            for alias in node.names:
                sub = f"{target}.{alias.name}"
                found.append((node.lineno, sub if _is_module(sub, src) else target))
    return list(dict.fromkeys(found))  # one per (line, module), however many names it brings


def unit_of(module: str) -> str:
    """The box a module belongs to: ``postplace.graph.metis`` -> ``graph``, ``postplace.api`` -> ``api``."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def upward_imports(src: Path = SRC, exceptions: dict | None = None) -> tuple[list[str], set, set[str]]:
    """(every upward import as a message line, the exceptions that matched, modules whose box is not in ORDER)."""
    exceptions = EXCEPTIONS if exceptions is None else exceptions
    bad, used, unknown = [], set(), set()
    for path in sorted((src / "postplace").rglob("*.py")):
        module = module_name(path, src)
        here = unit_of(module)
        if here not in RANK:
            unknown.add(module)
            continue
        for line, target in imported_modules(path, src):
            if target != "postplace" and not target.startswith("postplace."):
                continue
            there = unit_of(target)
            if there not in RANK:
                unknown.add(target)
                continue
            if RANK[there] > RANK[here]:
                if (module, target) in exceptions:
                    used.add((module, target))
                    continue
                bad.append(
                    f"{path.relative_to(src.parent)}:{line}: {module} ({here}, rank {RANK[here]}) imports "
                    f"{target} ({there}, rank {RANK[there]})"
                )
    return bad, used, unknown


def test_no_box_imports_a_higher_one():
    bad, used, unknown = upward_imports()
    assert not unknown, (
        f"modules of boxes missing from ORDER in {__file__}: {sorted(unknown)}; "
        "add each box at its place in DESIGN.md section 1's flow"
    )
    assert not bad, (
        "upward imports (DESIGN.md section 1: a lower box never imports a higher one; where it needs "
        "something from a higher one, the higher one passes it in, or the thing moves down):\n  " + "\n  ".join(bad)
    )
    stale = set(EXCEPTIONS) - used
    assert not stale, f"EXCEPTIONS no longer needed (remove them): {sorted(stale)}"


def test_order_names_every_box_and_only_boxes():
    boxes = {unit_of(module_name(p, SRC)) for p in (SRC / "postplace").rglob("*.py")}
    assert set(ORDER) == boxes, f"in ORDER only: {set(ORDER) - boxes}; in src only: {boxes - set(ORDER)}"


@pytest.mark.parametrize(
    ("where", "code"),
    [
        ("graph/x.py", "from postplace.search import run\n"),
        ("graph/x.py", "def f():\n    import postplace.sim.kernel\n"),
        ("graph/x.py", "def f():\n    from ..zoo import MODELS\n"),
        ("graph/__init__.py", "from .. import api\n"),
        ("cost/x.py", "class A:\n    def f(self):\n        from postplace import zoo\n"),
    ],
)
def test_the_check_sees_every_kind_of_upward_import(tmp_path, where, code):
    """Module level, in a function or method, absolute or relative, ``import`` or ``from``: all caught."""
    root = tmp_path / "postplace"
    for box in ("graph", "cost", "search", "sim", "zoo"):
        (root / box).mkdir(parents=True)
        (root / box / "__init__.py").write_text("")
    (root / "__init__.py").write_text("")
    (root / "api.py").write_text("")
    (root / where).write_text(code)
    bad, _, _ = upward_imports(tmp_path, exceptions={})
    assert len(bad) == 1 and where.replace("/", ".").removesuffix(".py").removesuffix(".__init__") in bad[0]
    # downward and sideways imports pass
    (root / where).write_text("from postplace.errors import PostplaceError\nfrom . import x as _\n")
    assert upward_imports(tmp_path, exceptions={})[0] == []
