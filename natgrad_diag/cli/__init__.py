"""Internal: the ``natgrad-diag`` command line and its sub-commands (argument parsing and glue only)."""

from natgrad_diag.cli.app import main

__all__ = ["main"]
