"""The import graph, read with ``ast`` from every module in the repository (no list to keep up to date).

Rules: packages import one another in one direction only (no cycle between modules of
different packages), and nothing the CLI runs imports the CLI package back. Imports
inside functions count: a lazy import is still a dependency, and the cycle this test
was written against (cli → commands → trainer → cli) went through one.
"""

from __future__ import annotations

import ast
import tomllib
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CLI = "onthejob"
SKIP = {".venv", ".git", "node_modules", "build", "dist"}

Graph = dict[str, set[str]]


def modules(root: Path) -> dict[str, Path]:
    """Every module under ``root`` by dotted name (``a/b.py`` → ``a.b``, ``a/__init__.py`` → ``a``)."""
    found: dict[str, Path] = {}
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root)
        if any(part in SKIP or part.startswith(".") for part in rel.parts):
            continue
        parts = list(rel.with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        if parts:
            found[".".join(parts)] = path
    return found


def _imported(tree: ast.AST, name: str, is_package: bool) -> Iterator[str]:
    """Dotted names a module imports, relative ones resolved; ``from a import b`` yields ``a.b``.

    ``a.b`` may be a function or class rather than a module: :func:`import_graph` falls back to ``a``.
    """
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = name.split(".") if is_package else name.split(".")[:-1]
                anchor = anchor[: len(anchor) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            yield from (f"{base}.{alias.name}" for alias in node.names)


def import_graph(root: Path) -> Graph:
    """Module → the modules of this repository it imports (anywhere in its body)."""
    known = modules(root)
    graph: Graph = {}
    for name, path in known.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        targets = set()
        for target in _imported(tree, name, path.name == "__init__.py"):
            # The deepest module of ours the name points into (``a.b.func`` → ``a.b``).
            parts = target.split(".")
            while parts and ".".join(parts) not in known:
                parts.pop()
            if parts and ".".join(parts) != name:
                targets.add(".".join(parts))
        graph[name] = targets
    return graph


def _package(module: str) -> str:
    return module.split(".")[0]


def cycles_across_packages(graph: Graph) -> list[list[str]]:
    """Strongly connected groups of modules that span more than one top-level package (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:  # recursion depth is bounded by the module count (a few hundred)
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                group.append(w)
                if w == v:
                    break
            if len({_package(m) for m in group}) > 1:
                found.append(sorted(group))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def cli_imports(graph: Graph, below: set[str], cli: str = CLI) -> list[str]:
    """``importer → imported`` for every module of a package below the CLI that imports the CLI package."""
    return sorted(
        f"{m} → {t}" for m, targets in graph.items() if _package(m) in below for t in targets if _package(t) == cli
    )


def product_packages(root: Path) -> set[str]:
    """The installed packages (pyproject's list): everything the CLI sits on, plus the CLI itself."""
    include = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]["find"]["include"]
    return {p.removesuffix("*") for p in include}


def test_no_cycle_between_packages() -> None:
    graph = import_graph(ROOT)
    assert len(graph) > 100 and "proxy.app" in graph and "tests.test_imports" in graph  # it did read the tree
    assert cycles_across_packages(graph) == []


def test_nothing_below_the_cli_imports_it() -> None:
    below = product_packages(ROOT) - {CLI}
    assert {"engine", "proxy", "storage", "trainer"} <= below
    assert cli_imports(import_graph(ROOT), below) == []


def test_the_engine_package_is_the_bottom_floor() -> None:
    """Model resolution and the launcher import no other package of ours: proxy, trainer and CLI sit on it."""
    graph = import_graph(ROOT)
    ours = product_packages(ROOT)
    assert {t for m, ts in graph.items() if _package(m) == "engine" for t in ts if _package(t) != "engine"} & {
        m for m in graph if _package(m) in ours
    } == set()


# docs/architecture.md's picture, as floors: a package imports only packages on lower floors, so the
# proxy, the trainer, the judge and the demo never import one another (they meet in the database and
# over HTTP), storage sits under all four, and the engine package under everything.
FLOORS = {"onthejob": 3, "examples": 2, "proxy": 2, "trainer": 2, "judge": 2, "storage": 1, "engine": 0}


def upward_imports(graph: Graph, floors: dict[str, int] = FLOORS) -> list[str]:
    """``importer → imported`` for every import between two floored packages that does not go down."""
    return sorted(
        f"{m} → {t}"
        for m, targets in graph.items()
        for t in targets
        if _package(m) in floors and _package(t) in floors and _package(m) != _package(t)
        if floors[_package(m)] <= floors[_package(t)]
    )


def test_imports_go_down_the_floors_only() -> None:
    assert set(FLOORS) == product_packages(ROOT)  # a new package must be given its floor
    assert upward_imports(import_graph(ROOT)) == []


def _write(root: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def test_a_planted_cycle_and_a_planted_cli_import_are_caught(tmp_path: Path) -> None:
    """The checks can fail: a fixture tree with a lazy cross-package cycle, a CLI import from below, and so
    two imports that go up a floor."""
    _write(
        tmp_path,
        {
            "low/__init__.py": "",
            "low/a.py": "def f():\n    from high.b import g\n    return g\n",  # lazy: still an edge
            "high/__init__.py": "",
            "high/b.py": "from low import a\n\ndef g():\n    return a\n",
            "high/c.py": "from .b import g\nfrom . import b\n",  # relative imports resolve inside the package
            "onthejob/__init__.py": "",
            "onthejob/cli.py": "import high.b\n",
            "low/uses_cli.py": "from onthejob.cli import main\n",
            "alone/x.py": "import alone.y\n",
            "alone/y.py": "import alone.x\n",  # a cycle inside one package is allowed
        },
    )
    graph = import_graph(tmp_path)
    assert graph["high.c"] == {"high.b"}
    assert cycles_across_packages(graph) == [["high.b", "low.a"]]
    assert cli_imports(graph, {"low", "high"}) == ["low.uses_cli → onthejob.cli"]
    floors = {"onthejob": 2, "high": 1, "low": 0, "alone": 1}
    assert upward_imports(graph, floors) == ["low.a → high.b", "low.uses_cli → onthejob.cli"]
