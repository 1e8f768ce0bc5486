"""Provides `main(argv)`: the `check`, `score` and `report` commands (`mlperf-tf check ...`).

`mlperf-tf check ...` calls `main(["check", ...])`; `python -m compliance check ...` does the same.
Exit codes: 0 every log passes, 1 some log fails, 2 bad input (one line `error: ...` on stderr).
"""

from __future__ import annotations

import argparse
import contextlib
import glob
import json
import math
import os
import re
import sys
from collections.abc import Sequence

from compliance import logfile
from compliance.options import DEFAULT_JOBS, DEFAULT_TIMEOUT_S, QUALITY_MODES
from mlperf_tf import paths
from mlperf_tf.errors import UserError

EXIT_PASS = 0
EXIT_FAIL = 1
EXIT_USAGE = 2


class _Parser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are one line, like the rest of the CLI's."""

    def error(self, message: str):
        raise UserError(f"{self.prog}: {message}")


_MOST = 1e9  # seconds, MiB or KiB: beyond it a limit means nothing (time_t overflows at 1e30)
_MOST_JOBS = 1024


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if not 1 <= value <= _MOST_JOBS:
        raise argparse.ArgumentTypeError(f"{text!r} must be in [1, {_MOST_JOBS}]")
    return value


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not (math.isfinite(value) and 0 < value <= _MOST):
        raise argparse.ArgumentTypeError(f"{text!r} must be a positive number (at most {_MOST:g})")
    return value


def _add_check_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--ruleset",
        default=None,
        help="official ruleset, e.g. 0.7.0 (default: one with rules for the log's format, "
        "benchmark and date; the report says which)",
    )
    parser.add_argument(
        "--round",
        default=None,
        metavar="X.Y",
        help="MLPerf round of the logs, e.g. 2.0 (the same as --ruleset 2.0.0); a log under a "
        "training_results_vX.Y folder is taken as that round",
    )
    parser.add_argument(
        "--quality",
        choices=QUALITY_MODES,
        default="enforce",
        help="skip: a missed MLPerf accuracy target is reported but does not fail the log "
        "(for mini and smoke runs)",
    )
    parser.add_argument(
        "--timeout",
        type=_positive_float,
        default=DEFAULT_TIMEOUT_S,
        help="seconds the official checker may take per log (default %(default)g)",
    )
    parser.add_argument(
        "--max-log-mb",
        type=_positive_float,
        default=logfile.DEFAULT_MAX_LOG_BYTES / 2**20,
        help="refuse logs with more MiB of ':::MLL' lines than this (default %(default)g)",
    )
    parser.add_argument(
        "--max-line-kb",
        type=_positive_float,
        default=logfile.DEFAULT_MAX_LINE_BYTES / 2**10,
        help="refuse logs with a ':::MLL' line longer than this many KiB (default %(default)g)",
    )
    parser.add_argument(
        "--jobs",
        type=_positive_int,
        default=DEFAULT_JOBS,
        help="logs checked at once (default %(default)d)",
    )


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="mlperf-tf", description="Check, score and report MLPerf logs.")
    commands = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    check = commands.add_parser(
        "check",
        help="official compliance verdict plus this suite's checks",
        description="Check MLPerf logs with the official MLCommons checker and this suite's "
        "checks. Exit 0 only if every log passes.",
    )
    check.add_argument(
        "logs",
        nargs="+",
        metavar="LOG",
        help="a log, or a folder: its result_*.txt files at any depth (a results repository), "
        "else its *.txt and *.log files",
    )
    _add_check_options(check)
    check.add_argument(
        "--strict", action="store_true", help="this suite's findings are errors, not warnings"
    )
    check.add_argument("--json", action="store_true", help="print JSON instead of text")

    score = commands.add_parser(
        "score",
        help="time to train of each run and the MLPerf result of a result directory",
        description="Score the runs in result directories: each run's time to train and the "
        "benchmark result (drop the fastest and slowest run, mean of the rest).",
    )
    score.add_argument("dirs", nargs="+", metavar="DIR")
    _add_check_options(score)
    score.add_argument("--json", action="store_true", help="print JSON instead of text")

    report = commands.add_parser(
        "report",
        help="PNG plots and a Markdown summary per run",
        description="Write, per log, a PNG (eval accuracy vs time with the target; samples/s "
        "per block) and a Markdown summary.",
    )
    report.add_argument("logs", nargs="+", metavar="LOG")
    report.add_argument("--out", required=True, help="output directory")
    _add_check_options(report)
    return parser


def _ruleset(args: argparse.Namespace) -> str | None:
    if args.round is None:
        return args.ruleset
    if not re.fullmatch(r"\d+\.\d+", args.round):
        raise UserError(f"--round {args.round!r} must be a round such as 2.0")
    ruleset = f"{args.round}.0"
    if args.ruleset is not None and args.ruleset != ruleset:
        raise UserError(f"--round {args.round} and --ruleset {args.ruleset} disagree")
    return ruleset


def _expand(paths: Sequence[str]) -> list[str]:
    """Logs named, with folders replaced by the logs in them (see the `check` help)."""
    logs = []
    for path in paths:
        if not os.path.isdir(path):
            logs.append(path)
            continue
        found = sorted(
            glob.glob(os.path.join(glob.escape(path), "**", "result_*.txt"), recursive=True)
        )
        if not found:
            found = sorted(
                p
                for pattern in ("*.txt", "*.log")
                for p in glob.glob(os.path.join(glob.escape(path), pattern))
            )
        found = [p for p in found if os.path.isfile(p)]
        if not found:
            raise UserError(f"{path}: no result_*.txt (or *.txt, *.log) log in this folder")
        logs += found
    return logs


def _check_kwargs(args: argparse.Namespace) -> dict:
    return {
        "ruleset": _ruleset(args),
        "quality": args.quality,
        "timeout": args.timeout,
        "max_log_bytes": max(1, int(args.max_log_mb * 2**20)),
        "max_line_bytes": max(1, int(args.max_line_kb * 2**10)),
    }


def _run_check(args: argparse.Namespace, exits_after: bool) -> int:
    from compliance import runner as runner_lib

    args.logs = _expand(args.logs)
    options = _check_kwargs(args)
    one_at_a_time = args.jobs == 1 or len(args.logs) <= 1
    # What a single `check LOG` costs (issue 19): with an idle core, the checker's process
    # starts now and imports the official code while this one imports the rest and reads the
    # log; on a busy machine a process that exits after its one log checks it itself.
    one_here = exits_after and len(args.logs) == 1 and not runner_lib.has_idle_core()
    with (
        runner_lib.OfficialRunner(in_process=True, final_check_here=one_here)
        if one_at_a_time
        else contextlib.nullcontext()
    ) as runner:
        from compliance.checker import check_logs

        results = check_logs(
            args.logs, jobs=args.jobs, runner=runner, strict=args.strict, **options
        )
    bad_input = any(isinstance(r, UserError) for r in results)
    failed = any(not r.passed for r in results if not isinstance(r, UserError))
    if args.json:
        document = {
            "passed": not bad_input and not failed,
            "logs": [
                {"path": path, "input_error": str(r)} if isinstance(r, UserError) else r.to_dict()
                for path, r in zip(args.logs, results)
            ],
        }
        print(json.dumps(document, indent=2))
    else:
        for result in results:
            if isinstance(result, UserError):
                print(f"error: {result}", file=sys.stderr)
            else:
                print(result.format_text())
    if bad_input:
        return EXIT_USAGE
    return EXIT_FAIL if failed else EXIT_PASS


def _run_score(args: argparse.Namespace) -> int:
    from compliance import scoring

    results = [scoring.score_directory(d, jobs=args.jobs, **_check_kwargs(args)) for d in args.dirs]
    if args.json:
        print(json.dumps([r.to_dict() for r in results], indent=2))
    else:
        print("\n\n".join(r.format_text() for r in results))
    return EXIT_PASS if all(r.valid for r in results) else EXIT_FAIL


def _run_report(args: argparse.Namespace) -> int:
    from compliance import report

    if os.path.exists(args.out) and not os.path.isdir(args.out):
        raise UserError(f"--out {args.out!r} is a file, not a folder")
    paths.try_output_dir(args.out, "--out")  # tried: as root, permission bits say yes to /proc
    written = report.write_reports(args.logs, args.out, jobs=args.jobs, **_check_kwargs(args))
    for item in written:
        if isinstance(item, UserError):
            print(f"error: {item}", file=sys.stderr)
        else:
            print(f"{item.log}: wrote {item.markdown} and {item.png}")
    try:
        breakdowns = report.write_breakdowns(args.logs, args.out)
    except UserError as error:
        print(f"error: {error}", file=sys.stderr)
        return EXIT_USAGE
    if breakdowns:
        print(f"time breakdown of every run: wrote {breakdowns}")
    return EXIT_USAGE if any(isinstance(item, UserError) for item in written) else EXIT_PASS


def main(argv: Sequence[str] | None = None, *, exits_after: bool = False) -> int:
    """Runs one command; returns the exit code (0 pass, 1 fail, 2 bad input).

    Args:
      argv: the arguments after the program name, e.g. ["check", "LOG", "--json"].
      exits_after: the process ends after this command (a command line, not a library call),
        so `check` may run one official check in this process (`OfficialRunner`).
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        try:
            args = build_parser().parse_args(argv)
        except SystemExit as done:  # --help
            return int(done.code or 0)
        if args.command == "check":
            return _run_check(args, exits_after)
        if args.command == "score":
            return _run_score(args)
        return _run_report(args)
    except UserError as error:
        print(f"error: {error}", file=sys.stderr)
        return EXIT_USAGE
