"""Every install line in the docs and in error hints installs something that exists.

tito-agents and its integrations are on no package index: `pip install 'tito-agents[gateway]'`
alone fails for every reader. A line that names `tito-agents[...]` must use the wheelhouse
(`make wheels`, then `pip install --find-links dist 'tito-agents[...]'`); from a checkout the
extras are `pip install '.[gateway]'` / `pip install -e .`. Fast and offline (no marker): the
lines themselves run in tests/install/test_install_paths.py (marker `install`), and the lines it
runs must stay the documented ones (checked here too).
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SOURCES = [
    ROOT / "README.md",
    *sorted((ROOT / "docs").glob("*.md")),
    *sorted((ROOT / "integrations").glob("*/README.md")),
    *sorted((ROOT / "tito_agents").rglob("*.py")),
]
# `pip install [options] tito-agents...` (a bare name), and any `tito-agents[extra]` on the line
_NAMED = re.compile(r"""pip install\s+(?:-[\w-]+\s+)*['"]?tito-agents\b""")
_EXTRA = re.compile(r"tito-agents\[[\w,-]+\]")
DOCUMENTED = {
    "README.md": [
        "pip install . ./integrations/tito-agents-langchain",
        'pip install --find-links dist "tito-agents[langchain]"',
        "pip install '.[testing]'",
    ],
    "docs/gateway.md": [
        "pip install '.[gateway]'",
        "pip install --find-links dist 'tito-agents[gateway]'",
    ],
    "docs/langchain.md": ["pip install . ./integrations/tito-agents-langchain"],
}


def _install_lines() -> list[tuple[str, str]]:
    found = []
    for path in SOURCES:
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if "pip install" in line:
                found.append((f"{path.relative_to(ROOT)}:{number}", line))
    return found


def test_lines_naming_the_package_use_the_wheelhouse() -> None:
    lines = _install_lines()
    assert len(lines) > 10  # the scan sees the docs and the hints
    wrong = [
        f"{where}: {line.strip()}"
        for where, line in lines
        if (_NAMED.search(line) or _EXTRA.search(line)) and "--find-links" not in line
    ]
    assert wrong == [], "install lines naming a package that is on no index:\n" + "\n".join(wrong)


def test_the_lines_the_install_tier_runs_are_documented() -> None:
    for name, commands in DOCUMENTED.items():
        text = (ROOT / name).read_text(encoding="utf-8")
        missing = [command for command in commands if command not in text]
        assert missing == [], f"{name} no longer shows {missing}: update tests/install"


def test_the_check_recognises_a_bad_line() -> None:
    bad = [
        "pip install 'tito-agents[gateway]'",
        "pip install tito-agents",
        'pip install "tito-agents-langchain"',
    ]
    good = [
        "pip install '.[gateway]'  # in a tito-agents checkout",
        "pip install redis  (or, in a tito-agents checkout: pip install '.[redis]')",
        "pip install . ./integrations/tito-agents-langchain",
    ]
    assert all(_NAMED.search(line) or _EXTRA.search(line) for line in bad)
    assert not any(_NAMED.search(line) or _EXTRA.search(line) for line in good)
