"""The layout's promises, checked on the source: data flows one way, so no module of the library
imports, even only for type checking, a module that imports it back, nor a module of a layer
above its own; no package imports another's private (underscored) modules; and the library never
imports its test package (`tito_agents.testing`)."""

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
            "_http",
            "_frameworks",
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


def _is_private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _receiver_is_own(node: ast.Attribute) -> bool:
    """`self._x` / `cls._x`: a class reaching its own members."""
    return isinstance(node.value, ast.Name) and node.value.id in ("self", "cls")


def _private_members(tree: ast.Module) -> set[str]:
    """The underscored names the classes of a module define: methods, class attributes and
    attributes set on `self`."""
    names: set[str] = set()
    for cls in (node for node in ast.walk(tree) if isinstance(node, ast.ClassDef)):
        for node in ast.walk(cls):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                names.add(node.name)
            elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                names.add(node.target.id)
            elif (
                isinstance(node, ast.Attribute)
                and isinstance(node.ctx, ast.Store)
                and _receiver_is_own(node)
            ):
                names.add(node.attr)
    return {name for name in names if _is_private(name)}


OWN_MODULE = {"episode": "tito_agents.episodes", "processor": "tito_agents.export"}
"""Receivers named after these objects (`episode`, `pending.episode`, `self._processor`, ...):
their underscored members are reached only in the module of their class."""


def _foreign_private_uses(sources: dict[str, str]) -> list[str]:
    """Every `obj._x` in a module where `_x` belongs to another module's class: a member no class
    of the reaching module defines but one of another module does, or any underscored member of a
    receiver named `episode` / `processor` outside its own module (`OWN_MODULE`)."""
    trees = {name: ast.parse(source) for name, source in sources.items()}
    members = {name: _private_members(tree) for name, tree in trees.items()}
    found = []
    for name, tree in trees.items():
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Attribute) and _is_private(node.attr)):
                continue
            if _receiver_is_own(node):
                continue
            receiver = ast.unparse(node.value).rpartition(".")[2].lstrip("_")
            named = OWN_MODULE.get(receiver.rpartition("_")[2])
            owners = sorted(m for m, names in members.items() if m != name and node.attr in names)
            if (named is not None and named != name) or (owners and node.attr not in members[name]):
                found.append(f"{name}:{node.lineno}: {ast.unparse(node)} (of {named or owners})")
    return found


def test_no_module_reaches_into_another_modules_objects() -> None:
    """Stages talk through public names and values (an episode hands its processor frozen records
    and keeps what comes back), never through each other's underscored members."""
    library = {name: path.read_text() for name, path in _library().items()}
    assert _foreign_private_uses(library) == []


def test_the_private_member_check_sees_what_it_forbids() -> None:
    """The check above is not vacuous: it finds a processor reaching into an episode, capture
    reaching into an episode by a member name, and an episode reaching into its processor."""
    sources = {
        "tito_agents.episodes": (
            "class Episode:\n"
            "    def _take_calls(self):\n"
            "        self._calls = []\n"
            "    def end(self):\n"
            "        self._processor._queue.clear()\n"
        ),
        "tito_agents.export": (
            "class SampleProcessor:\n"
            "    def on_end(self, episode):\n"
            "        episode._take_calls()\n"
            "        self._queue = []\n"
        ),
        "tito_agents._capture.core": (
            "class CaptureCore:\n"
            "    def finish(self, pending):\n"
            "        pending.episode._add_calls([])\n"
            "        self.default._calls.clear()\n"
        ),
    }
    found = _foreign_private_uses(sources)
    assert [f.partition(" (")[0] for f in found] == [
        "tito_agents.episodes:5: self._processor._queue",
        "tito_agents.export:3: episode._take_calls",
        "tito_agents._capture.core:3: pending.episode._add_calls",
        "tito_agents._capture.core:4: self.default._calls",
    ]


SHARED_LEAF_HELPERS: dict[str, str] = {
    "tito_agents._values": "user values made storable once (ids as text, JSON any sink writes), "
    "for every layer that takes them",
    "tito_agents._worker": "the one worker thread, which export and delivery both start",
    "tito_agents._speedups": "the compiled id parser behind capture's fast path",
    "tito_agents._state_dirs": "where state lives on disk (spill folders, the gateway's journal "
    "and token), for the sinks and the CLI alike",
    "tito_agents._http": "the HTTP library (httpx2 or httpx) picked in one place, so capture, "
    "re-scoring, the logprobs-mode probe and the gateway speak the one the openai SDK uses",
    "tito_agents._frameworks": "the frameworks that build their own clients and each one's fix, "
    "read from sys.modules, for the export stage's warnings about calls capture did not see",
}
"""Records-layer private modules: leaf helpers with no public face of their own, private so that
users do not build on them, importable by any layer (each says why it is shared)."""

WIRING: dict[str, tuple[str, str]] = {
    "tito_agents.collector": (
        "tito_agents._capture",
        "the collector wires the stages: it builds CaptureCore and installs capture's transports",
    ),
    "tito_agents.sessions": (
        "tito_agents._capture",
        "capture's public surface for sessions names what capture's own package defines",
    ),
    "tito_agents.integration": (
        "tito_agents._capture",
        "the adapters' hook API sits in the wiring layer: `captures(client)` asks whether the "
        "transport the collector installed is capture's, for the host the client talks to",
    ),
}
"""Importer -> the private package it may reach into, and why: the modules of the wiring layer
that install or inspect capture, and capture's own public face."""


def _private_module(name: str) -> bool:
    """Its own name, or a package on its path below `tito_agents`, starts with `_`."""
    return any(_is_private(part) for part in name.split(".")[1:])


def _top_package(name: str) -> str:
    """`tito_agents.convert._arrays` -> `tito_agents.convert`; `tito_agents` for the package."""
    return ".".join(name.split(".")[:2])


def _private_imports_across(edges: dict[str, set[str]]) -> list[str]:
    """Every `importer -> private module` of `edges` where the private module belongs to another
    top-level package (so another package or layer), is no shared leaf helper, and is not what
    the importer wires (`WIRING`)."""
    found = []
    for name, targets in sorted(edges.items()):
        for target in sorted(targets):
            if not _private_module(target) or _top_package(target) == _top_package(name):
                continue
            if any(_in(target, leaf) for leaf in SHARED_LEAF_HELPERS):
                continue
            wired = WIRING.get(name)
            if wired is not None and _in(target, wired[0]):
                continue
            found.append(f"{name} -> {target}")
    return found


def test_no_module_imports_another_packages_private_module() -> None:
    """A package's underscored modules are its own business: another package or layer uses what
    it exports (`from tito_agents.convert import needs_behaviour_logprobs`, not
    `convert._sampling_arrays`), so a package can reshape its insides without breaking a
    neighbour. Exceptions are named, with their reason: `SHARED_LEAF_HELPERS`, `WIRING`."""
    modules = _modules()
    edges = {name: _imports(name, path, modules) for name, path in _library().items()}
    assert _private_imports_across(edges) == []


def test_the_private_import_check_sees_what_it_forbids() -> None:
    """The check above is not vacuous: it finds a private module of another package reached by
    its own name or through a private package, and lets a package's own private modules, the
    shared leaf helpers and the collector's wiring through."""
    edges = {
        "tito_agents.trainer_check.side_by_side": {
            "tito_agents.convert",
            "tito_agents.convert._sampling_arrays",
        },
        "tito_agents.convert.batch": {"tito_agents.convert._sampling_arrays"},
        "tito_agents.export": {"tito_agents.sinks._delivery", "tito_agents._worker"},
        "tito_agents.gateway._app": {
            "tito_agents._capture.sessions.reasons",
            "tito_agents.gateway._routes",
        },
        "tito_agents.sinks.registry": {"tito_agents._state_dirs"},
        "tito_agents.collector": {"tito_agents._capture.transport"},
        "tito_agents.integration": {"tito_agents._capture"},
        "tito_agents.rl.trl_engine": {"tito_agents._capture.flow"},
    }
    assert _private_imports_across(edges) == [
        "tito_agents.export -> tito_agents.sinks._delivery",
        "tito_agents.gateway._app -> tito_agents._capture.sessions.reasons",
        "tito_agents.rl.trl_engine -> tito_agents._capture.flow",
        "tito_agents.trainer_check.side_by_side -> tito_agents.convert._sampling_arrays",
    ]


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
