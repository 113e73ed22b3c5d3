"""Build hook: compile the optional C helper `tito_agents._speedups` when a C compiler is present.

The helper only speeds up reading the id arrays and the logprobs (chat, completions, Responses) of
non-streaming responses (the capture's CPU cost); everything works without it
(`tito_agents._capture.wire` falls back to numpy, and to a full parse of the logprob entries). A
failed compile is reported and the build goes on as pure Python. Editable installs compile it in
place.
"""

from __future__ import annotations

import shlex
import subprocess
import sys
import sysconfig
from pathlib import Path
from typing import Any

from hatchling.builders.hooks.plugin.interface import BuildHookInterface

SOURCE = Path("tito_agents") / "_speedups.c"


class SpeedupsBuildHook(BuildHookInterface):  # type: ignore[type-arg]
    PLUGIN_NAME = "custom"

    def initialize(self, version: str, build_data: dict[str, Any]) -> None:
        if self.target_name != "wheel":
            return
        root = Path(self.root)
        target = SOURCE.with_name("_speedups" + str(sysconfig.get_config_var("EXT_SUFFIX")))
        command = [
            *shlex.split(str(sysconfig.get_config_var("CC") or "cc")),
            "-O2",
            "-shared",
            "-fPIC",
            f"-I{sysconfig.get_paths()['include']}",
            str(SOURCE),
            "-o",
            str(target),
        ]
        try:
            subprocess.run(command, cwd=root, check=True, capture_output=True, text=True)
        except (OSError, subprocess.CalledProcessError) as exc:
            detail = getattr(exc, "stderr", "") or str(exc)
            print(
                f"tito-agents: C helper not built, using the numpy path ({detail.strip()})",
                file=sys.stderr,
            )
            return
        build_data["pure_python"] = False
        build_data["infer_tag"] = True
        if version != "editable":
            build_data["force_include"][str(root / target)] = str(target)
