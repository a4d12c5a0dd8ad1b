"""`python -m rstar.cli`: the library's commands (the installed `rstar` adds the pipeline's:
flows/cli.py)."""

from rstar.cli import main

main()
