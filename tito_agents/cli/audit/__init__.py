"""`tito-agents audit-template`: does a chat template let multi-turn samples merge?

`command` (the subcommand: cases run, results judged), `cases` (the conversations rendered),
`hints` (known failure patterns and their fixes), `tokens` (special-token-shaped markers the
tokenizer splits), `report` (the results) and `format` (the report as text). Nothing is imported
here, so a module of the package can be imported on its own.
"""
