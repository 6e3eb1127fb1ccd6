"""The public API's docstrings (issue 22): numpydoc sections on every exported function and class.

The public API is every name in ``__all__`` of ``postplace`` and of its subpackages below. Each exported
function or class has its own docstring with a summary line; one whose signature takes parameters has a
``Parameters`` section; a function that returns something has a ``Returns`` (or ``Yields``) section. The
``Examples`` in those docstrings run as doctests here (``postplace.api``'s modules' run in ``test_api.py``, the
placers' in ``test_placers.py`` and ``test_parallel_baselines.py``).
"""

from __future__ import annotations

import ast
import doctest
import importlib
import inspect
import textwrap

import pytest

PACKAGES = (
    "postplace",
    "postplace.api",
    "postplace.graph",
    "postplace.cluster",
    "postplace.cost",
    "postplace.sim",
    "postplace.search",
    "postplace.placers",
    "postplace.runtime",
    "postplace.distributed",
    "postplace.report",
    "postplace.zoo",
)
#: modules whose examples test_api.py, test_placers.py and test_parallel_baselines.py run
API_MODULES = {
    "postplace.api",
    *(
        f"postplace.api.{m}"
        for m in (
            "target",
            "result",
            "settings",
            "candidates",
            "summary",
            "measure",
            "run",
            "over_m",
            "folder",
            "front",
        )
    ),
}
DOCTESTED_ELSEWHERE = (
    API_MODULES
    | {"postplace.placers"}
    | {f"postplace.placers.{m}" for m in ("single", "heft", "baechi", "metis", "expert", "data_parallel", "pipeline")}
)


def exported():
    """``(qualified name, object)`` for every exported function and class, once each."""
    seen, out = set(), []
    for package in PACKAGES:
        mod = importlib.import_module(package)
        for name in mod.__all__:
            obj = getattr(mod, name)
            if (inspect.isclass(obj) or inspect.isroutine(obj)) and id(obj) not in seen:
                seen.add(id(obj))
                out.append((f"{package}.{name}", obj))
    return out


EXPORTED = exported()
IDS = [name for name, _ in EXPORTED]


def own_doc(obj) -> str:
    """The object's own docstring: not a base class's, nor the signature a dataclass or NamedTuple makes up."""
    doc = obj.__dict__.get("__doc__") if inspect.isclass(obj) else obj.__doc__
    if not doc or (inspect.isclass(obj) and doc.startswith(f"{obj.__name__}(")):
        return ""
    return inspect.cleandoc(doc)


def has_section(doc: str, title: str) -> bool:
    return f"\n{title}\n{'-' * len(title)}\n" in f"\n{doc}\n"


def parameters(obj) -> list[str]:
    """The parameters a caller passes: a function's, or a class constructor's when the package defines it."""
    if inspect.isclass(obj):
        init = next((c.__dict__["__init__"] for c in obj.__mro__ if "__init__" in c.__dict__), None)
        if init is None or not (getattr(init, "__module__", "") or "").startswith("postplace"):
            return []  # object's, an exception's or a Protocol's: nothing to document
    try:
        sig = inspect.signature(obj)
    except (TypeError, ValueError):
        return []
    return [p for p in sig.parameters if p not in ("self", "cls")]


def returns_something(fn) -> bool:
    """Its return annotation is not None; without one, its body returns a value or yields."""
    ann = inspect.signature(fn).return_annotation
    if ann is not inspect.Signature.empty:
        return ann not in (None, "None")
    tree = ast.parse(textwrap.dedent(inspect.getsource(fn)))
    body = tree.body[0]
    nodes = [n for stmt in body.body for n in ast.walk(stmt)]
    return any(
        isinstance(n, ast.Yield | ast.YieldFrom) or (isinstance(n, ast.Return) and n.value is not None) for n in nodes
    )


def test_the_public_api_is_listed():
    assert len(EXPORTED) >= 80
    assert {"postplace.place", "postplace.resume", "postplace.compare", "postplace.apply"} <= set(IDS)


@pytest.mark.parametrize(("name", "obj"), EXPORTED, ids=IDS)
def test_docstring_has_a_summary_line(name, obj):
    doc = own_doc(obj)
    assert doc, f"{name} has no docstring of its own"
    lines = doc.splitlines()
    summary = lines[0].strip()
    assert summary.endswith("."), f"{name}: the first line is not a one-line summary: {summary!r}"
    assert len(lines) == 1 or not lines[1].strip(), f"{name}: the summary runs on past its first line"


@pytest.mark.parametrize(("name", "obj"), EXPORTED, ids=IDS)
def test_docstring_has_parameters_section(name, obj):
    params = parameters(obj)
    if params:
        assert has_section(own_doc(obj), "Parameters"), f"{name} takes {params} but documents no Parameters"


@pytest.mark.parametrize(
    ("name", "obj"),
    [(n, o) for n, o in EXPORTED if inspect.isroutine(o)],
    ids=[n for n, o in EXPORTED if inspect.isroutine(o)],
)
def test_docstring_has_returns_section(name, obj):
    if returns_something(obj):
        doc = own_doc(obj)
        assert has_section(doc, "Returns") or has_section(doc, "Yields"), f"{name} returns a value, undocumented"


def test_front_door_examples_are_the_ones_test_api_runs():
    # test_api.py runs doctest.testmod on every module of postplace.api: each of these must carry examples
    # it finds in postplace.api.front, where they live
    api = importlib.import_module("postplace.api")
    front = importlib.import_module("postplace.api.front")
    found = {t.name.rsplit(".", 1)[-1] for t in doctest.DocTestFinder().find(front) if t.examples}
    for fn in ("place", "compare", "resume", "apply"):
        assert has_section(own_doc(getattr(api, fn)), "Examples"), fn
        assert fn in found, fn


EXAMPLE_MODULES = sorted(
    {inspect.getmodule(o).__name__ for _, o in EXPORTED if has_section(own_doc(o), "Examples")} - DOCTESTED_ELSEWHERE
)


@pytest.mark.parametrize("module", EXAMPLE_MODULES)
def test_docstring_examples_run(module):
    result = doctest.testmod(importlib.import_module(module), optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0 and result.failed == 0
