"""``python -m xylent``: the command line (xylent/cli.py)."""

from xylent.cli import entry

entry()
