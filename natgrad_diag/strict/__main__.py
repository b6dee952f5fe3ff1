"""``python -m natgrad_diag.strict SCRIPT [ARGS ...]``: run a script under PyTorch's seed rules, exit 1 on a violation."""

import sys

from natgrad_diag.strict.runner import run_command

if __name__ == "__main__":
    raise SystemExit(run_command(sys.argv[1:]))
