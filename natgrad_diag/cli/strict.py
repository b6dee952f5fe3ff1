"""``natgrad-diag strict -- python SCRIPT [ARGS]``: argument glue for natgrad_diag.strict's script runner."""

from __future__ import annotations

import argparse
from typing import Any

__all__ = ["add_strict_parser", "run_strict"]


def add_strict_parser(sub: Any) -> None:
    """Add the ``strict`` sub-command to ``natgrad-diag``'s sub-parsers."""
    p = sub.add_parser(
        "strict",
        help="run a Python script under PyTorch's seed rules for tape.gradient; exit 1 on a violation",
        description=(
            "Run SCRIPT in this process with every tf.GradientTape.gradient call checked as PyTorch would: "
            "a target of more than one element needs output_gradients, and each seed must have its target's "
            "shape and dtype. Every violation is reported with its file and line; the exit code is 1 if "
            "there was one, the script's own code if it failed, 0 otherwise."
        ),
        usage="natgrad-diag strict [-h] -- python SCRIPT [ARGS ...]",
    )
    p.add_argument("script_command", nargs=argparse.REMAINDER, metavar="COMMAND", help="python SCRIPT [ARGS ...] or python -m MODULE [ARGS ...]")


def run_strict(args: argparse.Namespace) -> int:
    """Run the command after ``--``; the exit code of :func:`natgrad_diag.strict.runner.run_command`."""
    from natgrad_diag.strict.runner import run_command

    return run_command(args.script_command, prog="natgrad-diag strict")
