"""The ``natgrad-diag`` command: ``explain`` (the default), ``outer``, ``check``, ``gradcheck``, ``bench`` and ``strict``.

Exit codes: see :func:`main`. Only argparse is imported at start-up; each command imports what it needs when it runs.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import sys
from collections.abc import Sequence
from typing import Any, NoReturn

from natgrad_diag.cli.streams import prepare_streams

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_INTERRUPTED = 0, 1, 2, 130
COMMANDS = ("explain", "outer", "check", "gradcheck", "bench", "strict")  # build_parser's, in its order


def _number(cast: Any, accept: Any, expected: str, *, many: bool = False) -> Any:
    """An argparse type: ``cast`` of the text (or of each comma-separated item), refused unless ``accept`` holds."""

    def parse(text: str) -> Any:
        items = [v.strip() for v in text.split(",")] if many else [text]
        refused = f"expected {expected}, got {text!r}" + (" (an empty item)" if many and "" in items else "")
        try:
            values = [cast(v) for v in items]
        except ValueError:
            raise argparse.ArgumentTypeError(refused) from None
        if not all(accept(v) for v in values):
            raise argparse.ArgumentTypeError(refused)
        return values if many else values[0]

    return parse


def _gamma_steps(text: str) -> int:
    """``--gamma-steps K``: an integer from 1 to MAX_GAMMA_STEPS (read when K is given: ``--help`` stays light).

    Examples:
        >>> _gamma_steps("0")
        Traceback (most recent call last):
        ...
        argparse.ArgumentTypeError: expected an integer from 1 to 1000 (steps per gamma tried), got '0'
    """
    from natgrad_diag.checks.api import MAX_GAMMA_STEPS

    expected = f"an integer from 1 to {MAX_GAMMA_STEPS} (steps per gamma tried)"
    return int(_number(int, lambda v: 1 <= v <= MAX_GAMMA_STEPS, expected)(text))


_seed = _number(int, lambda v: 0 <= v < 2**32, "an integer seed from 0 to 2**32 - 1")
_positive_int = _number(int, lambda v: v >= 1, "a positive integer")
_nonnegative_float = _number(float, lambda v: 0 <= v < float("inf"), "a finite number ≥ 0")
_positive_float = _number(float, lambda v: 0 < v < float("inf"), "a finite positive number")
_float_list = _number(float, lambda v: True, "comma-separated numbers such as 1,2,3,4", many=True)
_int_list = _number(int, lambda v: v >= 1, "comma-separated positive integers such as 50,200", many=True)


def _report_path(text: str) -> str:
    from natgrad_diag.exceptions import InputError
    from natgrad_diag.report.files import report_format

    try:
        report_format(text, argument="--report")
    except InputError:
        message = f"expected a path ending in .html, .htm or .md (the extension chooses the format), got {text!r}"
        raise argparse.ArgumentTypeError(message) from None
    return text


def _output_options(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("output")
    g.add_argument("--json", action="store_true", help="print one JSON object instead of the text report")
    g.add_argument("--plain", action="store_true", help="plain text, no colour or table borders")
    g.add_argument(
        "--report", metavar="PATH", type=_report_path,
        help="also write a report: .html (self-contained, pictures embedded) or .md (pictures beside it)",
    )  # fmt: skip


class UsageError(Exception):
    """A command line argparse refused (the usage line of its sub-command is already on stderr)."""


class _HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """"(default: X)" for options that have a value by default, not for flags or None; at most 80 columns."""

    def __init__(self, prog: str, **kwargs: Any) -> None:
        import shutil

        kwargs.setdefault("width", min(shutil.get_terminal_size().columns, 80) - 2)
        super().__init__(prog, **kwargs)

    def _get_help_string(self, action: argparse.Action) -> str:
        plain = action.default is None or isinstance(action.default, bool) or action.default is argparse.SUPPRESS
        return (action.help if plain else super()._get_help_string(action)) or ""


class _Parser(argparse.ArgumentParser):
    """argparse that prints the usage, then raises :class:`UsageError` instead of exiting (so ``--json`` reports it)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", _HelpFormatter)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        sys.stderr.write(self.format_usage())
        raise UsageError(message)


def build_parser() -> argparse.ArgumentParser:
    from natgrad_diag import __version__
    from natgrad_diag.demo import CHECK_MAX_MINUTES, LIKELIHOODS, MODELS
    from natgrad_diag.gradcheck.structures import GPFLOW_MAPS, STRUCTURES

    parser = _Parser(prog="natgrad-diag", description="What output_gradients computes in GPflow's natural-gradient "
                     "step, and checks for it. With no command, runs 'explain' on the seed scenario.")  # fmt: skip
    parser.add_argument("--version", action="version", version=f"natgrad-diag {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    p = sub.add_parser("explain", help="why dL/deta1 != dtheta_deta1 * q_mu_grad, with numbers (default)")
    p.add_argument("--xi", choices=("nat", "meanvar"), default="nat", help="the ξ transform: nat (XiNat) or meanvar (XiSqrtMeanVar)")
    p.add_argument("--gamma", type=_positive_float, default=1.0, help="the natural-gradient step length γ")
    _output_options(p)
    p = sub.add_parser("outer", help="torch.outer's grad_outputs example, in TensorFlow (and torch if installed)")
    p.add_argument("--x", type=_float_list, default=None, help="comma-separated x (default: 1,2,3,4, PyTorch's example)")
    _output_options(p)
    p = sub.add_parser("check", help="natural-gradient checks on a small GPflow SVGP or VGP model")
    p.add_argument("--model", choices=MODELS, default="svgp", help="the demo GPflow model")
    p.add_argument("--likelihood", choices=LIKELIHOODS, default="gaussian", help="the demo model's likelihood")
    p.add_argument("--num-inducing", type=_positive_int, default=None, metavar="M", help="the SVGP's inducing points M (default: 10)")
    p.add_argument("--num-latent", type=_positive_int, default=1, metavar="L", help="latent GPs L")
    p.add_argument("--num-data", type=_positive_int, default=50, metavar="N", help="data points N")
    p.add_argument("--xi", choices=("nat", "meanvar"), default="nat", help="the ξ transform: nat (XiNat) or meanvar (XiSqrtMeanVar)")
    p.add_argument("--gamma", type=_positive_float, default=1.0, help="the natural-gradient step length γ")
    p.add_argument("--dtype", choices=("float64", "float32"), default="float64", help="float dtype of the model")
    p.add_argument("--whiten", action=argparse.BooleanOptionalAction, default=None, help="the SVGP's whitening (default: on)")
    p.add_argument("--mode", choices=("auto", "full", "fast"), default="auto", help="full: explicit Jacobians; fast: matrix-free; auto: full when small")
    p.add_argument("--seed", type=_seed, default=0, help="random seed of the demo data and point")
    p.add_argument("--gamma-steps", type=_gamma_steps, default=5, metavar="K", help="steps that judge each γ")
    p.add_argument("--optimizer", default=None, metavar="MODULE:NAME", help="check your optimizer's step: module:Class or path.py:Class (built with gamma, xi_transform), or an update function")
    p.add_argument("--max-minutes", type=_nonnegative_float, default=CHECK_MAX_MINUTES, metavar="T", help="refuse sizes estimated to take longer than T minutes (0: no limit)")
    _output_options(p)
    p = sub.add_parser("gradcheck", help="structure-aware gradient check of one of GPflow's natgrad maps")
    maps = sorted(GPFLOW_MAPS)
    p.add_argument("--map", choices=maps, default="expectation_to_meanvarsqrt", metavar="NAME", help="the GPflow map to check: " + ", ".join(maps))
    p.add_argument("--num-inducing", type=_positive_int, default=8, metavar="M", help="inducing points M")
    p.add_argument("--num-latent", type=_positive_int, default=2, metavar="L", help="latent GPs L")
    p.add_argument("--mode", choices=("full", "fast"), default="full", help="full: every Jacobian entry; fast: random directions")
    p.add_argument(
        "--structure", choices=("auto", *STRUCTURES), default="auto", metavar="S",
        help="structure of the map's matrix input: auto (eta2/nat2 symmetric, varsqrt lower-triangular), general, symmetric or lower_triangular",
    )  # fmt: skip
    p.add_argument("--dtype", choices=("float64", "float32"), default="float64", help="float dtype of the point")
    p.add_argument("--seed", type=_seed, default=0, help="random seed of the demo data and point")
    p.add_argument("--eps", type=_positive_float, default=None, help="finite-difference step (default: from the dtype, ∛ε)")
    p.add_argument("--rtol", type=_nonnegative_float, default=None, help="relative tolerance (default: from the dtype)")
    p.add_argument("--atol", type=_nonnegative_float, default=None, help="absolute tolerance (default: from the dtype)")
    _output_options(p)
    p = sub.add_parser("bench", help="time natgrad-diag against TensorFlow and GPflow; prints ratios")
    p.add_argument("--sizes", type=_int_list, default=None, help="comma-separated M values (default: 50,200,1000)")
    p.add_argument("--repeats", type=_positive_int, default=5, help="timed calls of each side")
    p.add_argument("--quick", action="store_true", help="small sizes only (a smoke run)")
    _output_options(p)
    p = sub.add_parser(
        "strict", help="run a Python script under PyTorch's seed rules for tape.gradient; exit 1 on a violation",
        usage="natgrad-diag strict [-h] -- python SCRIPT [ARGS ...]",
        description="Run SCRIPT in this process with every tf.GradientTape.gradient call checked as PyTorch would: "
        "a target of more than one element needs output_gradients, and each seed must have its target's shape and "
        "dtype. Every violation is reported with its file and line; the exit code is 1 if there was one, the script's "
        "own code if it failed, 0 otherwise.",
    )  # fmt: skip
    p.add_argument("script_command", nargs=argparse.REMAINDER, metavar="COMMAND", help="python SCRIPT [ARGS ...] or python -m MODULE [ARGS ...]")
    return parser


def _run(args: argparse.Namespace) -> Any:
    options = {k: v for k, v in vars(args).items() if k not in ("command", "json", "plain", "report")}
    if args.command == "explain":
        from gpflow.optimizers import XiNat, XiSqrtMeanVar

        from natgrad_diag.lessons.explain import explain_output_gradients

        return explain_output_gradients(gamma=args.gamma, xi_transform=XiNat() if args.xi == "nat" else XiSqrtMeanVar())
    if args.command == "outer":
        from natgrad_diag.lessons.outer import outer_example

        return outer_example(args.x)
    if args.command == "check":
        from natgrad_diag.cli.check import check_natgrad_cli

        return check_natgrad_cli(**options)
    if args.command == "gradcheck":
        from natgrad_diag.cli.gradcheck import gradcheck_cli

        return gradcheck_cli(**options)
    from natgrad_diag.bench.runner import run_bench  # command == "bench" (the last; "strict" never gets here)

    return run_bench(**options, progress=True)


def _fail(argv: Sequence[str], command: str, message: str, code: int) -> int:
    """One line (or the error's aligned lines) on stderr, and under ``--json`` one JSON object on stdout."""
    print(f"natgrad-diag {command}: {message}".rstrip(), file=sys.stderr)
    if "--json" in argv:
        import json

        print(json.dumps({"error": message, "command": command, "exit_code": code}, indent=2))
    return code


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``natgrad-diag``; returns the exit code (0 pass, 0 and a warning line on stderr when a check
    is inconclusive (WARN), 1 a check failed or the report file could not be written, 2 bad input, 130 Ctrl-C)."""
    own_process = argv is None
    argv = list(sys.argv[1:] if argv is None else argv)
    named = [a for a in argv if a in COMMANDS]
    if named and argv[0].startswith("-"):  # `--json gradcheck ...`: the options are the command's, not explain's
        argv.insert(0, argv.pop(argv.index(named[0])))
    if not argv or argv[0].startswith("-") and argv[0] not in ("-h", "--help", "--version"):
        argv = ["explain", *argv]
    command = argv[0] if not argv[0].startswith("-") else "explain"
    # not under `strict`: the user's script runs in this process and owns Ctrl-C, as under plain python
    if own_process and command != "strict" and signal.getsignal(signal.SIGINT) is signal.default_int_handler:
        signal.signal(signal.SIGINT, _note_ctrl_c)
    try:
        if not prepare_streams():
            return _fail([], command, "standard output is closed; redirect it to a file or /dev/null instead.", EXIT_USAGE)
        code = _command(argv, command)
        if _CTRL_C:  # a library caught the KeyboardInterrupt (some imports do) and the command went on: honour it
            raise KeyboardInterrupt
        return code
    except BrokenPipeError:  # `natgrad-diag ... | head`: the reader left; nothing more to say
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_FAILED
    except (KeyboardInterrupt, Exception) as e:
        if not _interrupted(e):
            raise
        if own_process:  # a second Ctrl-C while TensorFlow shuts down stays quiet too, and so do the objects an
            signal.signal(signal.SIGINT, signal.SIG_IGN)  # interrupt left half-built (TFP's cache refs) at teardown
            sys.unraisablehook = lambda unraisable: None
            # CPython marks a KeyboardInterrupt that left an exec() of a string (dataclasses and namedtuple build
            # their methods so, also while TensorFlow imports) as unhandled for good, and under `python -m` then
            # ends the process by SIGINT whatever it returns; a clean exec() clears the mark, so the exit code is 130
            exec("None")  # noqa: S102
        return _fail([], command, "interrupted (Ctrl-C)", EXIT_INTERRUPTED)


_CTRL_C: list[int] = []


def _note_ctrl_c(signum: int, frame: Any) -> None:
    """Python's own SIGINT handler, which also notes the signal, so that a Ctrl-C a library swallowed is not lost."""
    _CTRL_C.append(signum)
    signal.default_int_handler(signum, frame)


def _interrupted(error: BaseException | None) -> bool:
    """True for Ctrl-C, also when wrapped (Python 3.11 turns it into a RuntimeError inside ``__set_name__``)."""
    seen = set()
    while error is not None and id(error) not in seen and not isinstance(error, KeyboardInterrupt):
        seen.add(id(error))
        error = error.__cause__ or error.__context__
    return isinstance(error, KeyboardInterrupt)


def _preflight(args: argparse.Namespace) -> None:
    """The argument checks that need no TensorFlow, so that a bad value is refused before it loads."""
    from natgrad_diag.demo import check_model_memory, check_model_work, svgp_options

    if args.report:
        _check_report_folder(args.report)
    if args.command == "outer":
        from natgrad_diag.lessons.outer import validate_x

        validate_x(args.x)
    elif args.command == "check":
        M = svgp_options(args.model, args.num_inducing, args.whiten, flags=True)[0]
        check_model_memory(args.model, M=M, N=args.num_data, L=args.num_latent, itemsize=8 if args.dtype == "float64" else 4)
        check_model_work(args.model, M=M, N=args.num_data, L=args.num_latent,
                         gamma_steps=args.gamma_steps, max_minutes=args.max_minutes)  # fmt: skip
    elif args.command == "gradcheck":
        from natgrad_diag.cli.gradcheck import check_gradcheck_size

        check_gradcheck_size(args.num_inducing, args.num_latent, mode=args.mode, dtype=args.dtype)
    elif args.command == "bench":
        from natgrad_diag.bench.runner import validate_sizes

        validate_sizes(args.sizes)


def _check_report_folder(path: str) -> None:
    """InputError unless a file can be made in the report's folder or, when that is missing, in its nearest existing
    ancestor: tried with a temporary file (os.access misjudges root, /proc and read-only mounts)."""
    import tempfile

    from natgrad_diag._validate import input_error

    folder = existing = os.path.dirname(os.path.abspath(path))
    while not os.path.exists(existing):
        existing = os.path.dirname(existing)
    if os.path.isdir(path):
        raise input_error("the --report path is a folder.", "--report", "a file path (missing folders are created)",
                          f"{path!r}, a folder", "name the report file, e.g. --report report.html.")
    try:
        tempfile.TemporaryFile(dir=existing).close()
    except OSError as e:
        what = (f"report cannot be written in {folder}" if os.path.isdir(folder)
                else f"report's folder cannot be created under {existing}")
        raise input_error(f"the {what}.", "--report",
                          "a path in a folder you can write to (missing folders are created)",
                          f"{path!r}; making a file in {existing}: {type(e).__name__}: {e.strerror or e}",
                          "choose a --report path in a folder you can write to.")  # fmt: skip


def _command(argv: list[str], command: str) -> int:
    """Parse, check the arguments, run the command and print its report; the exit code."""
    try:
        args = build_parser().parse_args(argv)
    except UsageError as e:
        return _fail(argv, command, f"error: {e}", EXIT_USAGE)
    from natgrad_diag.exceptions import InputError, MemoryLimitError, NatGradDiagError, UnsupportedModelError

    if command == "strict":
        from natgrad_diag.strict.runner import run_command

        return run_command(args.script_command, prog="natgrad-diag strict")
    try:
        _preflight(args)
        from natgrad_diag._tf import import_tensorflow_quietly

        import_tensorflow_quietly(force=True)
        report = _run(args)
    except (InputError, UnsupportedModelError, MemoryLimitError) as e:
        return _fail(argv, command, str(e), EXIT_USAGE)
    except NatGradDiagError as e:
        return _fail(argv, command, str(e), EXIT_FAILED)
    from natgrad_diag.report.emit import emit

    if args.report:  # a folder that cannot be made now fails the write below, which says why (ReportWriteError)
        with contextlib.suppress(OSError):
            os.makedirs(os.path.dirname(os.path.abspath(args.report)), exist_ok=True)
    written = emit(report, as_json=args.json, plain=args.plain, report_path=args.report)
    if not report.passed or (args.report and written is None):
        return EXIT_FAILED
    if warned := [c.name for c in report.checks if getattr(c, "status", "pass") == "warn"]:
        print(f"natgrad-diag {command}: warning: {len(warned)} check(s) inconclusive (WARN): {', '.join(warned)}", file=sys.stderr)
    return EXIT_OK
