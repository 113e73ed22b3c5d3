"""Build the wheels of tito-agents and its integrations into one folder (a wheelhouse).

    python scripts/wheelhouse.py [--out dist]          # or: make wheels

The extras `tito-agents[langchain]` and `tito-agents[openai-agents]` name the integration packages
(`tito-agents-langchain`, `tito-agents-openai-agents`), which live in this repository, not on a
package index. Pointing pip at the wheelhouse makes them resolvable:

    pip install --find-links dist "tito-agents[langchain]"

Everything else (langgraph, openai, numpy, ...) still comes from the index. Only this repository's
packages are built (`--no-deps`), each in pip's isolated build environment.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = [ROOT, *sorted(p.parent for p in (ROOT / "integrations").glob("*/pyproject.toml"))]


def build(out: Path, python: str = sys.executable) -> list[Path]:
    """Build every package's wheel into `out`; returns the wheels there, newest build first."""
    out.mkdir(parents=True, exist_ok=True)
    command = [python, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(out)]
    subprocess.run([*command, *map(str, PACKAGES)], check=True)
    return sorted(out.glob("*.whl"), key=lambda p: p.stat().st_mtime, reverse=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=ROOT / "dist")
    args = parser.parse_args()
    for wheel in build(args.out):
        print(wheel)
    return 0


if __name__ == "__main__":
    sys.exit(main())
