"""The test tree's own rule: shared helpers live in `tests/support/` (and `tests/factories.py`,
`tests/captures.py`, ...), so no test module, conftest included, is imported by another module.
A test that imports another test's module also collects its tests twice and couples two files
that should change alone."""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
ROOT = TESTS.parent


def _is_test_module(dotted: str) -> bool:
    last = dotted.rsplit(".", 1)[-1]
    return dotted.startswith("tests.") and (last.startswith("test_") or last == "conftest")


def _imported(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level:
            names.update(f".{alias.name}" for alias in node.names if alias.name.startswith("test_"))
            if node.module and (node.module.startswith("test_") or node.module == "conftest"):
                names.add(f"tests.{node.module}")
    return names


def test_no_test_module_imports_another_test_module() -> None:
    offenders = []
    for path in sorted(TESTS.rglob("*.py")):
        for name in _imported(path):
            if _is_test_module(name) or name.startswith(".test_"):
                offenders.append(f"{path.relative_to(ROOT)} imports {name}")
    assert not offenders, "move shared helpers into tests/support/:\n" + "\n".join(offenders)


def test_the_check_sees_an_import_of_a_test_module(tmp_path: Path) -> None:
    probe = tmp_path / "test_probe.py"
    probe.write_text(
        "from tests.integration.test_sinks_redis import drain\nimport tests.e2e.conftest\n"
    )
    assert {"tests.integration.test_sinks_redis", "tests.e2e.conftest"} <= {
        n for n in _imported(probe) if _is_test_module(n)
    }
