"""The layout's promises, checked on the source: data flows one way, so no module of the library
imports, even only for type checking, a module that imports it back."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "tito_agents"


def _modules() -> dict[str, Path]:
    found: dict[str, Path] = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        found[name] = path
    for path in PACKAGE.glob("*.pyi"):  # compiled helpers: importable modules without source
        found.setdefault(f"tito_agents.{path.stem}", path)
    return found


def _imports(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The library modules `name` imports anywhere in its source (TYPE_CHECKING blocks too)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    targets: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module is not None:
            base = node.module
            if node.level:
                base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1])
                base = f"{base}.{node.module}"
            subs = [f"{base}.{alias.name}" for alias in node.names]
            modules_named = [s for s in subs if s in modules]
            targets.update(modules_named)
            if len(modules_named) < len(subs):
                targets.add(base)
    edges = set()
    for target in targets:
        while target and target not in modules:
            target = target.rpartition(".")[0]
        if target.startswith("tito_agents") and target != name:
            edges.add(target)
    return edges


def test_no_import_cycles_even_for_type_checking() -> None:
    modules = _modules()
    graph = {
        name: _imports(name, path, modules)
        for name, path in modules.items()
        if path.suffix == ".py"
    }
    cycles = []
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                cycles.append(path[path.index(nxt) :] + [nxt])
            elif nxt not in state:
                visit(nxt)
        path.pop()
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node)
    assert cycles == [], "import cycles: " + "; ".join(" -> ".join(c) for c in cycles)


def test_stages_do_not_know_the_collector() -> None:
    """Capture, episodes and export depend on settings and protocols, never on the collector
    that wires them (it is the only module that imports them all)."""
    modules = _modules()
    for stage in ("_capture", "_transport", "_wire", "episodes", "export", "assembly", "sinks"):
        for name, path in modules.items():
            if path.suffix == ".py" and (
                name == f"tito_agents.{stage}" or name.startswith(f"tito_agents.{stage}.")
            ):
                assert "tito_agents.collector" not in _imports(name, path, modules), name
