"""One registry of placers and one of strategies (issue 34 item 17): each registers where it is defined.

A throwaway placer and a throwaway strategy are registered here, checked in every derived list, and
taken out again; duplicates are refused; and the modules of ``postplace.search`` and
``postplace.placers`` import each other without a cycle (imports under ``if TYPE_CHECKING:`` aside).
"""

from __future__ import annotations

import ast
import dataclasses
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from postplace.errors import PostplaceError
from postplace.placers import PLACERS, REGISTRY, place, register_placer
from postplace.placers import registry as placer_registry
from postplace.search import CONFIGS, STRATEGIES, VARIANTS, SearchSpace, config_class, make_strategy
from postplace.search import registry as strategy_registry
from postplace.search.config import build_config
from postplace.search.random_search import RandomStrategy

SRC = Path(__file__).resolve().parents[1] / "src"

# The order every list of names had when each lived in its package's __init__: order decides ties
# between candidates and the order of compare's rows, so registering where defined must keep it.
PLACER_ORDER = ["single", "pipeline", "m-topo", "m-etf", "m-sct", "metis", "expert", "cpu", "heft"]
CANDIDATES = ("single", "pipeline", "m-topo", "m-etf", "m-sct", "metis", "expert")
QUADRATIC = ("m-etf", "m-sct")
HEURISTICS = ("m-topo", "m-etf", "m-sct", "metis", "expert", "heft")
STRATEGY_ORDER = ["post", "ce", "ppo", "post-start", "reinforce", "random", "anneal", "hp", "local"]
VARIANT_ORDER = [
    "post-paper",
    "ce-paper",
    "ppo-paper",
    "reinforce-paper",
    "post-probe",
    "ce-probe",
    "ppo-probe",
    "reinforce-probe",
    "hp-probe",
    "reinforce-local",
    "hp-local",
]


@pytest.fixture
def placer_sandbox():
    """Put REGISTRY and PLACERS back as they were after the test."""
    saved = dict(REGISTRY), dict(PLACERS)
    yield
    REGISTRY.clear(), REGISTRY.update(saved[0])
    PLACERS.clear(), PLACERS.update(saved[1])


@pytest.fixture
def strategy_sandbox():
    """Put the strategy registry back as it was after the test."""
    r = strategy_registry
    saved = [dict(t) for t in (r.STRATEGIES, r.CONFIGS, r.VARIANTS, r._RANKS)], set(r._ON_LAYERS)
    yield
    for table, old in zip((r.STRATEGIES, r.CONFIGS, r.VARIANTS, r._RANKS), saved[0], strict=True):
        table.clear(), table.update(old)
    r._ON_LAYERS.clear(), r._ON_LAYERS.update(saved[1])


def test_the_registries_keep_the_order_of_the_old_lists():
    from postplace.api.candidates import CANDIDATE_PLACERS, QUADRATIC_PLACERS
    from postplace.comparison import PLACER_NAMES
    from postplace.paper import HEURISTICS as PAPER_HEURISTICS
    from postplace.search import ON_LAYERS

    assert list(REGISTRY) == list(PLACERS) == PLACER_ORDER
    assert CANDIDATE_PLACERS == CANDIDATES == placer_registry.names("candidate")
    assert QUADRATIC_PLACERS == QUADRATIC == placer_registry.names("quadratic")
    assert PAPER_HEURISTICS == HEURISTICS == placer_registry.names("heuristic")
    assert PLACER_NAMES == (*PLACER_ORDER, "data-parallel")
    assert list(STRATEGIES) == STRATEGY_ORDER + VARIANT_ORDER
    assert list(CONFIGS) == STRATEGY_ORDER
    assert list(VARIANTS) == VARIANT_ORDER
    assert VARIANTS["reinforce-probe"] == ("reinforce", {"init": "probe", "use_local": False})
    assert VARIANTS["post-paper"] == ("post", {"init": "uniform", "use_local": False})
    assert ON_LAYERS == ("reinforce", "random", "anneal")


def test_a_new_placer_is_registered_where_it_is_defined(placer_sandbox):
    @register_placer("throwaway", candidate=True, heuristic=True, rank=15)
    def place_throwaway(graph, cluster, **kw):
        return np.zeros(graph.num_ops, dtype=np.int64)

    assert REGISTRY["throwaway"].fn is place_throwaway and PLACERS["throwaway"] is place_throwaway
    assert list(REGISTRY)[:3] == ["single", "throwaway", "pipeline"]  # its rank's place
    assert "throwaway" in placer_registry.names("candidate") and "throwaway" in placer_registry.names("heuristic")
    assert "throwaway" not in placer_registry.names("quadratic")

    from postplace.graph import OpGraph
    from postplace.testing import star_cluster

    assert place("throwaway", OpGraph.build(["a", "b"]), star_cluster()).tolist() == [0, 0]

    def place_other(graph, cluster, **kw):
        return np.ones(graph.num_ops, dtype=np.int64)

    with pytest.raises(ValueError, match="placer 'throwaway' is registered twice"):
        register_placer("throwaway")(place_other)  # another function under a taken name
    register_placer("throwaway", candidate=True, heuristic=True, rank=15)(place_throwaway)  # itself again: a reload
    assert REGISTRY["throwaway"].fn is place_throwaway
    with pytest.raises(ValueError, match="placer 'metis' is registered twice"):
        register_placer("metis")(place_throwaway)
    assert REGISTRY["metis"].fn.__name__ == "place_metis"


def test_a_placer_without_a_rank_comes_last(placer_sandbox):
    register_placer("last")(lambda graph, cluster, **kw: None)
    assert list(REGISTRY)[-1] == "last" and list(PLACERS)[-1] == "last"


def test_the_derived_placer_lists_take_a_placer_registered_before_they_are_made():
    """What a new placer module does: register, then every list derived from REGISTRY names it
    (run in a fresh interpreter, since the lists are made once, on import)."""
    code = textwrap.dedent("""
        import numpy as np
        from postplace.placers import register_placer

        @register_placer("throwaway", candidate=True, heuristic=True, quadratic=True, rank=65)
        def place_throwaway(graph, cluster, **kw):
            return np.zeros(graph.num_ops, dtype=np.int64)

        from postplace.api.candidates import CANDIDATE_PLACERS, QUADRATIC_PLACERS
        from postplace.comparison import PLACER_NAMES
        from postplace.paper import HEURISTICS
        print(CANDIDATE_PLACERS.index("throwaway"), QUADRATIC_PLACERS, PLACER_NAMES.index("throwaway"),
              "throwaway" in HEURISTICS)
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["6", "('m-etf',", "'m-sct',", "'throwaway')", "6", "True"]


@dataclasses.dataclass(frozen=True)
class ThrowawayConfig:
    width: int = 3
    use_local: bool = False


def test_a_new_strategy_is_registered_where_it_is_defined(strategy_sandbox):
    @strategy_registry.register_strategy("throwaway", config=ThrowawayConfig, rank=65, on_layers=True)
    class ThrowawayStrategy(RandomStrategy):
        name = "throwaway"

        def __init__(self, space, *, seed=0, config=None):
            self.throwaway_config = config or ThrowawayConfig()
            super().__init__(space, seed=seed)

    strategy_registry.register_variant("throwaway-wide", "throwaway", rank=5, width=9)

    assert list(STRATEGIES)[5:8] == ["random", "throwaway", "anneal"]  # its rank's place
    assert list(CONFIGS)[5:8] == ["random", "throwaway", "anneal"]
    assert list(STRATEGIES)[len(STRATEGY_ORDER) + 1] == "throwaway-wide"  # first of the named starts
    assert list(VARIANTS)[0] == "throwaway-wide"
    assert "throwaway" in strategy_registry.on_layers_names()
    assert config_class("throwaway") == (ThrowawayConfig, ThrowawayConfig())
    assert config_class("throwaway-wide") == (ThrowawayConfig, ThrowawayConfig(width=9))
    assert build_config("throwaway", {"width": "5"}) == ThrowawayConfig(width=5)

    space = SearchSpace(np.ones((3, 2), dtype=bool), failure_step_time=10.0)
    s = make_strategy("throwaway-wide", space)
    inner = s.inner if hasattr(s, "inner") else s  # on_layers wraps it only on a micro-batched step
    assert s.name == "throwaway-wide" and inner.throwaway_config.width == 9
    assert make_strategy("throwaway", space).ask(4).shape == (4, 3)


def test_duplicate_strategies_and_named_starts_are_refused(strategy_sandbox):
    def make(space, *, seed=0, config=None):
        raise AssertionError("never made")

    with pytest.raises(ValueError, match="'post' is already registered as a strategy"):
        strategy_registry.register_strategy("post", config=ThrowawayConfig)(make)
    with pytest.raises(ValueError, match="'hp-probe' is already registered as a named start"):
        strategy_registry.register_strategy("hp-probe", config=ThrowawayConfig)(make)
    with pytest.raises(ValueError, match="'ce-paper' is already registered as a named start"):
        strategy_registry.register_variant("ce-paper", "ce", init="uniform")
    with pytest.raises(ValueError, match="its strategy 'nothing' is not registered"):
        strategy_registry.register_variant("nothing-paper", "nothing")
    assert STRATEGIES["post"].__name__ == "PostStrategy" and "nothing-paper" not in STRATEGIES
    with pytest.raises(PostplaceError, match="unknown strategy 'nothing'"):
        config_class("nothing")


def test_the_hp_registration_needs_no_torch():
    code = "import sys, postplace.search as s; print('hp' in s.STRATEGIES, 'torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["True", "False"]


# ----------------------------------------------------------------------------------- import cycles
def _module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(tree: ast.AST, package: str, modules: set[str]) -> set[str]:
    """Every module ``tree`` imports, at the top or inside a function, but not under ``if TYPE_CHECKING:``
    (its ``else`` counts). ``from pkg import name`` is an import of ``pkg.name`` when that is a module."""
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(parts + ([base] if base else []))
            found.update(f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return found


def _import_graph() -> dict[str, set[str]]:
    paths = sorted([*SRC.glob("postplace/search/*.py"), *SRC.glob("postplace/placers/*.py")])
    modules = {_module_name(p): p for p in paths}
    graph = {}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
        tree = ast.parse(path.read_text(encoding="utf-8"))
        graph[name] = {m for m in _imports(tree, package, set(modules)) if m in modules and m != name}
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []

    def connect(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            connect(v)
    return out


def test_the_cycle_finder_finds_a_cycle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    tree = ast.parse(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import p.x\nelse:\n    import p.y\n"
        "def f():\n    from p import z\n"
    )
    assert _imports(tree, "p", {"p.x", "p.y", "p.z"}) == {"typing", "p.y", "p.z"}


def test_no_import_cycle_among_search_and_placer_modules():
    graph = _import_graph()
    assert {"postplace.search", "postplace.search.registry", "postplace.placers.registry"} <= set(graph)
    assert graph["postplace.search.registry"] == set() and graph["postplace.placers.registry"] == set()
    assert "postplace.search.registry" in graph["postplace.search.post"]  # it registers where it is defined
    assert _cycles(graph) == []


def test_a_module_reloaded_registers_again_without_complaint():
    """``importlib.reload`` of a placer's or a strategy's module registers the same functions again: kept,
    not refused as a duplicate (a different function under a taken name still is)."""
    import importlib

    import postplace.placers.heft as heft
    import postplace.search.anneal as anneal
    import postplace.search.reinforce as reinforce
    from postplace.placers import REGISTRY
    from postplace.search import STRATEGIES

    before = (list(REGISTRY), list(STRATEGIES))
    for module in (heft, anneal, reinforce):
        importlib.reload(module)
    assert (list(REGISTRY), list(STRATEGIES)) == before
