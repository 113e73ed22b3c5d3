"""`make bench`: every benchmark, one after the other, each printing its figures and PASS/FAIL.

Each benchmark measures ratios side by side in one run (these machines are noisy), never absolute
times. `--check` makes the run fail when any target is missed.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
BENCHMARKS = [
    ("capture overhead", "bench_capture.py", []),
    ("merged assembly", "bench_assembly.py", []),
    ("token-in sessions", "bench_sessions.py", []),
    ("sinks", "bench_sinks.py", []),
    ("delivery from a CPU-bound producer", "bench_delivery.py", []),
    ("stats command", "bench_stats.py", []),
    ("trainer converters", "bench_convert.py", []),
    ("capture gateway", "bench_gateway.py", []),
    ("re-scoring constrained calls", "bench_rescore.py", []),
    ("tito's share of an RL loop step", "bench_rl_share.py", []),
]


def main() -> int:
    check = "--check" in sys.argv[1:]
    failed = []
    for title, script, args in BENCHMARKS:
        path = HERE / script
        if not path.exists():
            continue
        print(f"\n##### {title}: {script}", flush=True)
        start = time.time()
        result = subprocess.run(
            [sys.executable, str(path), *args, *(["--check"] if check else [])], check=False
        )
        print(f"##### {script}: exit {result.returncode} in {time.time() - start:.0f}s", flush=True)
        if result.returncode != 0:
            failed.append(script)
    if failed:
        print(f"\nmissed targets or errors: {', '.join(failed)}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
