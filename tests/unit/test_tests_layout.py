"""The test tree's own rules: every shared helper module lives in `tests/support/`, a conftest
holds only fixtures and pytest hooks, and no test module, conftest included, is imported by
another module.

One home for helpers means a reader looks in one place for what a test calls. A test that imports
another test's module also collects its tests twice and couples two files that should change
alone."""

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


def _python_modules(tests: Path) -> list[Path]:
    """The Python files of the test tree (npm packages the Node.js tests install excluded)."""
    return sorted(p for p in tests.rglob("*.py") if "node_modules" not in p.parts)


def _misplaced_helpers(tests: Path) -> list[Path]:
    """Modules that are neither tests, conftests, package markers, nor in `support/`."""
    support = tests / "support"
    return [
        path
        for path in _python_modules(tests)
        if support not in path.parents
        and path.name not in ("conftest.py", "__init__.py")
        and not path.name.startswith("test_")
    ]


def _plain_helpers_in_conftest(path: Path) -> list[str]:
    """Top-level functions and classes of a conftest that are neither fixtures nor pytest hooks."""
    found = []
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.ClassDef):
            found.append(node.name)
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            decorators = [ast.unparse(d) for d in node.decorator_list]
            if not node.name.startswith("pytest_") and not any("fixture" in d for d in decorators):
                found.append(node.name)
    return found


def test_no_test_module_imports_another_test_module() -> None:
    offenders = []
    for path in _python_modules(TESTS):
        for name in _imported(path):
            if _is_test_module(name) or name.startswith(".test_"):
                offenders.append(f"{path.relative_to(ROOT)} imports {name}")
    assert not offenders, "move shared helpers into tests/support/:\n" + "\n".join(offenders)


def test_every_helper_module_lives_in_tests_support() -> None:
    misplaced = [str(path.relative_to(ROOT)) for path in _misplaced_helpers(TESTS)]
    assert not misplaced, "move these helper modules into tests/support/:\n" + "\n".join(misplaced)


def test_conftests_hold_only_fixtures_and_hooks() -> None:
    plain = [
        f"{path.relative_to(ROOT)}: {name}"
        for path in _python_modules(TESTS)
        if path.name == "conftest.py"
        for name in _plain_helpers_in_conftest(path)
    ]
    assert not plain, "move these helpers into tests/support/:\n" + "\n".join(plain)


def test_the_check_sees_a_plain_helper_in_a_conftest(tmp_path: Path) -> None:
    conftest = tmp_path / "conftest.py"
    conftest.write_text(
        "import pytest\n\n"
        "def pytest_configure(config): ...\n\n"
        "@pytest.fixture\ndef server(): ...\n\n"
        "@pytest_asyncio.fixture(scope='session')\nasync def client(): ...\n\n"
        "def free_port(): ...\n\n"
        "class Harness: ...\n"
    )
    assert _plain_helpers_in_conftest(conftest) == ["free_port", "Harness"]


def test_the_check_sees_an_import_of_a_test_module(tmp_path: Path) -> None:
    probe = tmp_path / "test_probe.py"
    probe.write_text(
        "from tests.integration.test_sinks_redis import drain\nimport tests.e2e.conftest\n"
    )
    assert {"tests.integration.test_sinks_redis", "tests.e2e.conftest"} <= {
        n for n in _imported(probe) if _is_test_module(n)
    }


def test_the_check_sees_a_helper_module_outside_support(tmp_path: Path) -> None:
    for name in (
        "support/helpers.py",
        "unit/test_x.py",
        "unit/conftest.py",
        "unit/__init__.py",
        "node/node_modules/pkg/tool.py",
        "helpers.py",
        "unit/factories.py",
    ):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("")
    assert _misplaced_helpers(tmp_path) == [tmp_path / "helpers.py", tmp_path / "unit/factories.py"]
