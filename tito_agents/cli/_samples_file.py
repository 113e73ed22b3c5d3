"""The samples file a command was given, opened with the library's reader (`read_samples`).

`--allow-truncated` is the command's one word for what the reader splits in two: read a file a
crash cut short up to its last complete sample (`strict=False`), and read the complete batches of
parts still being written (`include_in_progress=True`). Without it a truncated file is refused,
with the flag that reads it anyway, and parts left out are named in a warning.
"""

from __future__ import annotations

import logging

from tito_agents.cli._errors import CliInputError
from tito_agents.errors import TruncatedSamplesError
from tito_agents.sinks.reading import SampleSource, read_samples

__all__ = ["open_samples_file"]

logger = logging.getLogger("tito_agents")


def open_samples_file(spec: str, *, allow_truncated: bool) -> SampleSource:
    """Open `spec` (a file, a folder of parts, a sink's path) for a command."""
    try:
        source = read_samples(spec, strict=not allow_truncated, include_in_progress=allow_truncated)
    except TruncatedSamplesError as exc:
        raise CliInputError(
            None, f"{exc}; pass --allow-truncated to read what is complete"
        ) from exc
    if source.left_out:
        logger.warning(
            "%s: %d part(s) still being written are left out (pass --allow-truncated to read "
            "their complete batches)",
            source.path,
            len(source.left_out),
        )
    return source
