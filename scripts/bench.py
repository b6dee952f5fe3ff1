#!/usr/bin/env python
"""Benchmark natgrad-diag against TensorFlow and GPflow (the same code as ``natgrad-diag bench``).

    python scripts/bench.py                    # M = 50, 200, 1000; a few minutes on 2 cores
    python scripts/bench.py --quick            # a smoke run at small sizes (~30 s)
    python scripts/bench.py --sizes 50,200 --repeats 7 --json > bench.json

Prints the machine, then one table per comparison with ours / baseline ratios and their targets.
Targets are reported, not enforced: the exit code is 0 unless a correctness check of what was timed
fails (or the arguments are bad).
"""

from __future__ import annotations

import argparse
import json
import os
import sys


def _sizes(text: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if not values or any(v < 2 for v in values):
        raise argparse.ArgumentTypeError(f"expected integers M >= 2, got {text!r}")
    return values


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value}")
    return value


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="bench.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes", type=_sizes, default=None, help="comma-separated M for the natgrad_trace rows (default 50,200,1000)")
    p.add_argument("--repeats", type=_positive, default=5, help="timed calls per measurement; the median is reported (default 5)")
    p.add_argument("--quick", action="store_true", help="small sizes only (a smoke run)")
    p.add_argument("--json", action="store_true", help="print one JSON object (with the ratios) instead of the tables")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    from natgrad_diag.bench import run_bench

    report = run_bench(sizes=args.sizes, repeats=args.repeats, quick=args.quick, progress=not args.json)
    if args.json:
        print(json.dumps(report.to_dict(), indent=2))
    else:
        print(report)
    return 0 if report.passed else 1


if __name__ == "__main__":
    sys.exit(main())
