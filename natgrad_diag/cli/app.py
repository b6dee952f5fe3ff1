"""The ``natgrad-diag`` command: ``explain`` (the default), ``outer``, ``check`` and ``bench``.

Exit codes: 0 when every check holds, 1 when one fails, 2 for bad usage or bad input.
Only argparse is imported at start-up; each command imports what it needs when it runs.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from typing import Any

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2

#: GPflow's conversion maps that ``natgrad-diag gradcheck --map`` can check.
GPFLOW_MAPS = (
    "expectation_to_meanvarsqrt",
    "expectation_to_natural",
    "meanvarsqrt_to_expectation",
    "meanvarsqrt_to_natural",
    "natural_to_expectation",
    "natural_to_meanvarsqrt",
)


def _float_list(text: str) -> list[float]:
    try:
        values = [float(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated numbers such as 1,2,3,4, got {text!r}") from None
    if not values:
        raise argparse.ArgumentTypeError("expected at least one number, e.g. --x 1,2,3,4")
    return values


def _int_list(text: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers such as 50,200, got {text!r}") from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"expected positive integers such as 50,200, got {text!r}")
    return values


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value}")
    return value


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}") from None
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"expected a finite positive number, got {text!r}")
    return value


def _report_path(text: str) -> str:
    from natgrad_diag.exceptions import InputError
    from natgrad_diag.report.render import report_format

    try:
        report_format(text, argument="--report")
    except InputError:
        raise argparse.ArgumentTypeError(
            f"expected a path ending in .html, .htm or .md (the extension chooses the format), got {text!r}"
        ) from None
    return text


def _output_options(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("output")
    g.add_argument("--json", action="store_true", help="print one JSON object instead of the text report")
    g.add_argument("--plain", action="store_true", help="plain text, no colour or table borders")
    g.add_argument(
        "--report", metavar="PATH", type=_report_path,
        help="also write a report: .html (self-contained, pictures embedded) or .md (pictures beside it)",
    )  # fmt: skip


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="natgrad-diag",
        description=(
            "What output_gradients computes in GPflow's natural-gradient step, and checks for it. "
            "With no command, runs 'explain' on the seed scenario."
        ),
    )
    from natgrad_diag import __version__

    parser.add_argument("--version", action="version", version=f"natgrad-diag {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    p = sub.add_parser("explain", help="why dL/deta1 != dtheta_deta1 * q_mu_grad, with numbers (default)")
    p.add_argument("--xi", choices=("nat", "meanvar"), default="nat", help="the ξ transform (default nat)")
    p.add_argument("--gamma", type=_positive_float, default=1.0, help="step length (default 1.0)")
    _output_options(p)

    p = sub.add_parser("outer", help="torch.outer's grad_outputs example, in TensorFlow (and torch if installed)")
    p.add_argument("--x", type=_float_list, default=None, help="comma-separated x (default 1,2,3,4)")
    _output_options(p)

    p = sub.add_parser("check", help="natural-gradient checks on a small GPflow SVGP or VGP model")
    p.add_argument("--model", choices=("svgp", "vgp"), default="svgp")
    p.add_argument("--likelihood", choices=("gaussian", "bernoulli", "poisson", "studentt"), default="gaussian")
    p.add_argument("--num-inducing", type=_positive_int, default=10, metavar="M")
    p.add_argument("--num-latent", type=_positive_int, default=1, metavar="L")
    p.add_argument("--num-data", type=_positive_int, default=50, metavar="N")
    p.add_argument("--xi", choices=("nat", "meanvar"), default="nat")
    p.add_argument("--gamma", type=_positive_float, default=1.0)
    p.add_argument("--dtype", choices=("float64", "float32"), default="float64")
    p.add_argument("--whiten", action=argparse.BooleanOptionalAction, default=True, help="SVGP whitening (default on)")
    p.add_argument("--mode", choices=("auto", "full", "fast"), default="auto")
    p.add_argument("--seed", type=int, default=0)
    _output_options(p)

    p = sub.add_parser("gradcheck", help="structure-aware gradient check of one of GPflow's natgrad maps")
    p.add_argument("--map", choices=GPFLOW_MAPS, default="expectation_to_meanvarsqrt", help="the GPflow map to check")
    p.add_argument("--num-inducing", type=_positive_int, default=8, metavar="M")
    p.add_argument("--num-latent", type=_positive_int, default=2, metavar="L")
    p.add_argument("--mode", choices=("full", "fast"), default="full")
    p.add_argument(
        "--structure", choices=("auto", "general", "symmetric", "lower_triangular"), default="auto",
        help="structure of the map's matrix input (auto: eta2/nat2 symmetric, varsqrt lower-triangular)",
    )  # fmt: skip
    p.add_argument("--dtype", choices=("float64", "float32"), default="float64")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--eps", type=_positive_float, default=None, help="finite-difference step (default from dtype)")
    p.add_argument("--rtol", type=_positive_float, default=None)
    p.add_argument("--atol", type=_positive_float, default=None)
    _output_options(p)

    p = sub.add_parser("bench", help="time natgrad-diag against TensorFlow and GPflow; prints ratios")
    p.add_argument("--sizes", type=_int_list, default=None, help="comma-separated M values")
    p.add_argument("--repeats", type=_positive_int, default=5)
    p.add_argument("--quick", action="store_true", help="small sizes only (a smoke run)")
    _output_options(p)
    return parser


def _xi(name: str) -> Any:
    from gpflow.optimizers import XiNat, XiSqrtMeanVar

    return XiNat() if name == "nat" else XiSqrtMeanVar()


def _import_tensorflow_quietly() -> None:
    """Import TensorFlow with the C++ start-up chatter (CUDA probing, oneDNN notes) kept off stderr.

    Those lines are written before TF_CPP_MIN_LOG_LEVEL is read, so file descriptor 2 is pointed at a
    temporary file for the import; if the import fails, what it wrote is replayed before the error.
    """
    if "tensorflow" in sys.modules:
        return
    import tempfile

    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile(mode="w+b") as sink:
        os.dup2(sink.fileno(), 2)
        try:
            import tensorflow  # noqa: F401

            tensorflow.constant(0.0) + 0.0  # device initialisation logs here too
        except BaseException:
            os.dup2(saved, 2)
            sink.seek(0)
            sys.stderr.write(sink.read().decode(errors="replace"))
            raise
        finally:
            os.dup2(saved, 2)
            os.close(saved)


def _run(args: argparse.Namespace) -> Any:
    command = args.command or "explain"
    if command == "explain":
        from natgrad_diag.lessons.explain import explain_output_gradients

        return explain_output_gradients(gamma=args.gamma, xi_transform=_xi(args.xi))
    if command == "outer":
        from natgrad_diag.lessons.outer import outer_example

        return outer_example(args.x)
    if command == "check":
        from natgrad_diag.natgrad.check import check_natgrad_cli

        return check_natgrad_cli(
            model=args.model,
            likelihood=args.likelihood,
            num_inducing=args.num_inducing,
            num_latent=args.num_latent,
            num_data=args.num_data,
            xi=args.xi,
            gamma=args.gamma,
            dtype=args.dtype,
            whiten=args.whiten,
            mode=args.mode,
            seed=args.seed,
        )
    if command == "gradcheck":
        from natgrad_diag.cli.gradcheck import gradcheck_cli

        return gradcheck_cli(
            map=args.map, num_inducing=args.num_inducing, num_latent=args.num_latent, mode=args.mode,
            structure=args.structure, dtype=args.dtype, seed=args.seed, eps=args.eps, rtol=args.rtol, atol=args.atol,
        )  # fmt: skip
    if command == "bench":
        from natgrad_diag.bench.runner import run_bench

        return run_bench(sizes=args.sizes, repeats=args.repeats, quick=args.quick, progress=not args.json)
    raise AssertionError(command)  # pragma: no cover


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``natgrad-diag``; returns the exit code."""
    parser = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0].startswith("-") and argv[0] not in ("-h", "--help", "--version"):
        argv = ["explain", *argv]
    args = parser.parse_args(argv)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # TensorFlow's start-up chatter, not ours
    if getattr(args, "json", False):
        from natgrad_diag.progress import set_enabled

        set_enabled(False)
    from natgrad_diag.exceptions import InputError, NatGradDiagError, UnsupportedModelError

    try:
        _import_tensorflow_quietly()
        report = _run(args)
    except (InputError, UnsupportedModelError) as e:
        print(f"natgrad-diag {args.command}: {e}", file=sys.stderr)
        return EXIT_USAGE
    except NatGradDiagError as e:
        print(f"natgrad-diag {args.command}: {e}", file=sys.stderr)
        return EXIT_FAILED
    from natgrad_diag.report.render import emit

    emit(report, as_json=args.json, plain=args.plain, report_path=args.report)
    return EXIT_OK if report.passed else EXIT_FAILED


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
