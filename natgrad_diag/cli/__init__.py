"""The command line: natgrad-diag and its sub-commands (argument parsing and glue only).

Internal: the ``natgrad-diag`` command is the interface.
"""

from natgrad_diag.cli.app import main

__all__ = ["main"]
