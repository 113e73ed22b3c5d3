"""The `tito-agents` command: template audit, drift report, sample inspector, stats, the
trainer-view comparison and the capture gateway (docs/cli.md).

    tito-agents audit-template MODEL_DIR_OR_FILE [--tokenizer DIR] [--json]
    tito-agents drift SAMPLES_FILE --tokenizer DIR [--json]
    tito-agents show SAMPLES_FILE [--sample ID | --index N] [--tokenizer DIR] [--html OUT]
    tito-agents stats SAMPLES_FILE [--json]
    tito-agents compare COMPARISON_JSON [--html OUT]
    tito-agents serve --upstream URL [--sink PATH_OR_URL]

`main(argv)` runs it in-process (tests use that). What the commands compute over samples is the
library's (`tito_agents.read_samples`, `assembly.report.SamplesSummary`,
`assembly.sampling_report`, `token_codec.TemplateRenderer`); this package parses arguments, checks
inputs (one-line errors, exit 2) and prints. `audit/` and `drift/` are the two larger commands.
"""

__all__ = ["main"]


def main(argv: list[str] | None = None) -> int:
    """Run the command (see `tito_agents.cli.main.main`); imported lazily to keep imports light."""
    from tito_agents.cli.main import main as _main

    return _main(argv)
