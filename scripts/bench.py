#!/usr/bin/env python
"""Benchmark natgrad-diag against TensorFlow and GPflow: the same command as ``natgrad-diag bench``.

    python scripts/bench.py                    # M = 50, 200, 1000; a few minutes on 2 cores
    python scripts/bench.py --quick            # a smoke run at small sizes (~30 s)
    python scripts/bench.py --sizes 50,200 --repeats 7 --json > bench.json

Prints the machine, then one table per comparison with ours / baseline ratios and their targets.
Targets are reported, not enforced: the exit code is 0 unless a correctness check of what was timed
fails (or the arguments are bad). The options are those of ``natgrad-diag bench --help``.
"""

from __future__ import annotations

import sys

from natgrad_diag.cli.app import main


if __name__ == "__main__":
    sys.exit(main(["bench", *sys.argv[1:]]))
