"""`python -m tito_agents.cli`: the `tito-agents` command without the console-script entry point."""

from tito_agents.cli.main import main

raise SystemExit(main())
