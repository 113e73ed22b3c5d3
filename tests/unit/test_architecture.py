"""The layout's promises, checked on the source: data flows one way, so no module of the library
imports, even only for type checking, a module that imports it back, nor a module of a layer
above its own; and the library never imports its test package (`tito_agents.testing`)."""

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
    for stage in ("_capture", "episodes", "export", "assembly", "sinks"):
        for name, path in modules.items():
            if path.suffix == ".py" and (
                name == f"tito_agents.{stage}" or name.startswith(f"tito_agents.{stage}.")
            ):
                assert "tito_agents.collector" not in _imports(name, path, modules), name


LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("tools", ("cli", "convert", "trainer_check", "gateway", "rl")),
    ("user API and wiring", ("", "collector", "integration")),
    ("capture", ("_capture", "sessions")),
    ("episodes", ("episodes",)),
    ("export", ("export", "rescore")),
    ("assembly", ("assembly",)),
    ("sinks", ("sinks",)),
    (
        "records",
        (
            "config",
            "calls",
            "samples",
            "sampling",
            "errors",
            "token_codec",
            "_state_dirs",
            "_speedups",
            "_worker",
            "_values",
        ),
    ),
)
"""Top to bottom (docs/architecture.md): a module imports modules of its own layer or of layers
below it, never above. The records are plain data and leaf helpers every layer shares (importing
nothing above them); "" is the package itself (`tito_agents/__init__.py`, the user API)."""

TEST_PACKAGE = "tito_agents.testing"


def _in(name: str, package: str) -> bool:
    return name == package or name.startswith(f"{package}.")


def _layer_of(name: str) -> int | None:
    for index, (_, members) in enumerate(LAYERS):
        for member in members:
            if name == "tito_agents" if member == "" else _in(name, f"tito_agents.{member}"):
                return index
    return None


def _library() -> dict[str, Path]:
    return {
        name: path
        for name, path in _modules().items()
        if path.suffix == ".py" and not _in(name, TEST_PACKAGE)
    }


def test_every_library_module_has_a_layer() -> None:
    """A new module is placed in the layer order (LAYERS) before it is checked against it."""
    unplaced = sorted(name for name in _library() if _layer_of(name) is None)
    assert unplaced == [], f"modules outside LAYERS: {unplaced}"


def test_layers_import_only_their_own_layer_or_below() -> None:
    """capture -> episodes -> export -> assembly -> sinks, tools above them all: a stage knows the
    next one, never the one before it (an episode holds no token-in session state: capture does)."""
    modules = _modules()
    upward = set()
    for name, path in _library().items():
        layer = _layer_of(name)
        assert layer is not None, name
        for target in _imports(name, path, modules):
            target_layer = _layer_of(target)
            if target_layer is not None and target_layer < layer:
                upward.add((name, target))
    assert sorted(upward) == [], "imports of a layer above: " + "; ".join(
        f"{a} ({LAYERS[_layer_of(a) or 0][0]}) -> {b} ({LAYERS[_layer_of(b) or 0][0]})"
        for a, b in sorted(upward)
    )


def _protocol_members(modules: dict[str, Path]) -> set[str]:
    """The names every `Protocol` class of the library declares (methods and attributes)."""
    names: set[str] = set()
    for path in modules.values():
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.ClassDef):
                continue
            bases = {ast.unparse(base) for base in node.bases}
            if not bases & {"Protocol", "typing.Protocol"}:
                continue
            for item in node.body:
                if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef):
                    names.add(item.name)
                elif isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
                    names.add(item.target.id)
    return names


def test_what_stages_call_on_an_episode_is_a_named_protocol() -> None:
    """No hidden second interface: every underscored method of `Episode` that another module
    calls is declared by a protocol (capture's `CapturedEpisode`, export's `EpisodeView`), where
    its contract is written."""
    library = _library()
    source = library["tito_agents.episodes"].read_text()
    (episode,) = [
        node
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.ClassDef) and node.name == "Episode"
    ]
    own = {  # what Episode calls on itself is its own business, not an interface
        node.attr
        for node in ast.walk(episode)
        if isinstance(node, ast.Attribute)
        and isinstance(node.value, ast.Name)
        and node.value.id == "self"
    }
    private = {
        item.name
        for item in episode.body
        if isinstance(item, ast.FunctionDef)
        and item.name.startswith("_")
        and not item.name.startswith("__")
        and item.name not in own
    }
    declared = _protocol_members(library)
    called = set()
    for name, path in library.items():
        if name == "tito_agents.episodes":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.Attribute)
                and node.attr in private
                and not (isinstance(node.value, ast.Name) and node.value.id == "self")
            ):
                called.add((name, node.attr))
    assert called, "the check found no call into an episode: it no longer sees them"
    hidden = sorted(f"{name} calls Episode.{attr}" for name, attr in called if attr not in declared)
    assert hidden == [], "; ".join(hidden)


def test_library_never_imports_the_test_package() -> None:
    """`tito_agents.testing` (the fake vLLM, the test tokenizer) is for tests: the library works
    without it, and what both need lives in the library (e.g. `tito_agents.token_codec`)."""
    modules = _modules()
    offenders = sorted(
        f"{name} -> {target}"
        for name, path in _library().items()
        for target in _imports(name, path, modules)
        if _in(target, TEST_PACKAGE)
    )
    assert offenders == []
