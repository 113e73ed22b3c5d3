"""The `tito-agents` command: template audit, drift report, sample inspector and stats.

    tito-agents audit-template MODEL_DIR_OR_FILE [--tokenizer DIR] [--json]
    tito-agents drift SAMPLES_FILE --tokenizer DIR [--json]
    tito-agents show SAMPLES_FILE [--sample ID] [--tokenizer DIR] [--html OUT]
    tito-agents stats SAMPLES_FILE [--json]

`main(argv)` runs it in-process (tests use that). The commands read samples with the library's
reader, `tito_agents.read_samples`.
"""

__all__ = ["main"]


def main(argv: list[str] | None = None) -> int:
    """Run the command (see `tito_agents.cli.main.main`); imported lazily to keep imports light."""
    from tito_agents.cli.main import main as _main

    return _main(argv)
