"""`tito-agents drift`: how much would have drifted without captured ids.

`command` (the subcommand: measuring), `report` (what was measured) and `format` (the report as
text). Nothing is imported here, so a module of the package can be imported on its own.
"""
