"""`--core-only`: run just the tests that need nothing beyond the core install (no extras);
`--not-core`: run all the others.

`make test` runs the core ones in a virtual environment holding `pip install .` and the test tools
alone, so a dependency that creeps into the core (an import of an extra) fails there, and every
other module in the development environment (`--not-core`): each test runs once. The list names
modules, not tests: a module is core when everything it imports ships with the core install.
"""

from __future__ import annotations

from pathlib import Path

import pytest

CORE_MODULES = frozenset(
    {
        "test_architecture",
        "test_capture",
        "test_capture_faults",
        "test_cli_stats",
        "test_collector",
        "test_constrained_samples",
        "test_constraints",
        "test_convert_advantages",
        "test_convert_samples",
        "test_convert_skyrl",
        "test_convert_trl",
        "test_episodes",
        "test_export",
        "test_merge",
        "test_merge_properties",
        "test_public_api",
        "test_samples_sinks",
        "test_sinks_codec",
        "test_sinks_jsonl_faults",
        "test_sinks_queue",
        "test_speedups",
        "test_sse_framing",
        "test_wire",
    }
)


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--core-only",
        action="store_true",
        help="collect only the test modules that run on the core install (no extras)",
    )
    parser.addoption(
        "--not-core",
        action="store_true",
        help="collect every test module but those of --core-only",
    )


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    core_only, not_core = config.getoption("--core-only"), config.getoption("--not-core")
    if not (core_only or not_core) or collection_path.suffix != ".py":
        return None
    if not collection_path.name.startswith("test_"):
        return None
    core = collection_path.stem in CORE_MODULES
    return (not core if core_only else core) or None


def pytest_collection_finish(session: pytest.Session) -> None:
    if session.config.getoption("--core-only"):
        found = {Path(str(item.path)).stem for item in session.items}
        missing = CORE_MODULES - found
        if missing:  # a renamed or deleted module must leave the list too
            raise pytest.UsageError(f"core test modules not found: {sorted(missing)}")
