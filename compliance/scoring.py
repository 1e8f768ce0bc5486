"""Provides `time_to_train` and `score_directory`: MLPerf run times and the benchmark result.

A run's time to train is run_stop - run_start, found as `mlperf_logging.result_summarizer` finds
them; a benchmark result is the olympic mean of a result directory's runs as the MLPerf training
rules define it: drop the fastest and the slowest run, average the rest, where one non-converging
run may count as the slowest (two or more make the result invalid), given the number of runs the
benchmark needs in the ruleset.
"""

from __future__ import annotations

import dataclasses
import glob
import logging
import os
import warnings
from collections.abc import Sequence
from typing import Any

from compliance import keys as C
from compliance import logfile
from compliance.checker import USAGE, Report, check_logs, version_key
from mlperf_tf import time_breakdown
from mlperf_tf.errors import UserError

# Runs per benchmark result, from the training rules of each round ("Benchmark Results" table).
_RUNS_PER_RESULT = {
    "0.6.0": {"resnet": 5, "ssd": 5, "maskrcnn": 5, "gnmt": 10, "transformer": 10, "minigo": 10},
    "0.7.0": {
        "resnet": 5,
        "ssd": 5,
        "maskrcnn": 5,
        "gnmt": 10,
        "transformer": 10,
        "bert": 10,
        "dlrm": 5,
        "minigo": 10,
    },
    "1.0.0": {
        "resnet": 5,
        "ssd": 5,
        "maskrcnn": 5,
        "bert": 10,
        "dlrm": 5,
        "minigo": 10,
        "rnnt": 10,
        "unet3d": 40,
    },
}


def required_runs(benchmark: str | None, ruleset: str) -> int | None:
    """How many runs a benchmark result needs, or None for an unknown benchmark."""
    table = _RUNS_PER_RESULT.get(ruleset)
    if table and benchmark in table:
        return table[benchmark]
    from mlperf_logging.benchmark_meta import get_result_file_counts

    return get_result_file_counts("training").get(benchmark)


def max_dropped_runs(benchmark: str | None) -> int:
    """How many runs olympic scoring drops at each end (as result_summarizer does)."""
    return 4 if benchmark == "unet3d" else 1


def olympic_mean(minutes: Sequence[float], *, non_converged: int, max_dropped: int = 1):
    """The MLPerf mean of the converged runs' times, or None when nothing is left to average.

    Drops the `max_dropped` fastest runs and as many slowest ones, where each non-converged run
    (not in `minutes`) already counts as one of the slowest.

    Args:
      minutes: the times to train of the converged runs.
      non_converged: how many runs did not converge (at most `max_dropped` for a valid result).
      max_dropped: runs dropped at each end.
    """
    if non_converged < 0 or max_dropped < 0:
        raise ValueError(f"`non_converged` ({non_converged}) and `max_dropped` must be >= 0.")
    times = sorted(minutes)
    kept = times[max_dropped : len(times) - max(0, max_dropped - non_converged)]
    return sum(kept) / len(kept) if kept else None


@dataclasses.dataclass(frozen=True)
class RunTime:
    """run_start and run_stop of one log.

    Attributes:
      run_start, run_stop: their timestamps as logged (None when absent).
      units_per_second: 1 for 0.6.0 logs (seconds), 1000 later (milliseconds).
      status: run_stop's status ("success", "aborted"), or None.
    """

    run_start: float | None
    run_stop: float | None
    units_per_second: float
    status: str | None

    @property
    def seconds(self) -> float | None:
        """The time to train in seconds, or None without both timestamps."""
        if self.run_start is None or self.run_stop is None:
            return None
        return (self.run_stop - self.run_start) / self.units_per_second

    @property
    def minutes(self) -> float | None:
        """The time to train in minutes, computed in result_summarizer's order (same rounding)."""
        if self.run_start is None or self.run_stop is None:
            return None
        return (self.run_stop - self.run_start) / 60 / self.units_per_second


def run_time(records: Sequence[logfile.Record]) -> RunTime:
    """Finds run_start and run_stop as result_summarizer's `_query_run_start_stop` does.

    It keeps the latest of each key until both have been seen.
    """
    start = stop = None
    status = None
    units = records[0].units_per_second if records else 1.0
    for record in records:
        if record.key == C.RUN_START:
            start = record.timestamp
        if record.key == C.RUN_STOP:
            stop = record.timestamp
            status = record.metadata.get("status")
        if start is not None and stop is not None:
            break
    return RunTime(start, stop, units, status if isinstance(status, str) else None)


def time_to_train(path: str, *, ruleset: str | None = None) -> RunTime:
    """The time to train of one log (no compliance check).

    Args:
      path: the log file.
      ruleset: the format to parse it as; None guesses ("0.6.0" logs write seconds, later ones
        milliseconds, both handled).
    """
    scan = logfile.scan_log(path)
    if ruleset is None:
        ruleset = "0.6.0" if logfile.guess_format(scan) == "0.6" else "1.0.0"
    return run_time(logfile.parse_records(scan, ruleset))


@dataclasses.dataclass(frozen=True)
class ScoredRun:
    """One run of a result directory.

    Attributes:
      path: its log.
      report: its compliance Report.
      time: its run_start/run_stop.
      converged: it counts towards the result: it passes the check and run_stop says success.
      breakdown: where its time went, as the runner recorded it (`mlperf_tf.time_breakdown`), or
        None for a log without one.
    """

    path: str
    report: Report
    time: RunTime
    converged: bool
    breakdown: dict[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "passed": self.report.passed,
            "status": self.time.status,
            "converged": self.converged,
            "minutes": self.time.minutes,
            "time_breakdown": self.breakdown,
        }


@dataclasses.dataclass(frozen=True)
class RcpResult:
    """The official `rcp_checker`'s verdict on a result directory.

    Attributes:
      checked: the check ran (False: the round or benchmark has no RCPs, or nothing to check).
      passed: its verdict (None when not checked).
      message: its message ("RCP found", "RCP Interpolation", "Insufficient convergence", ...), or
        why it did not run.
      norm_factor: the factor result_summarizer multiplies a passing result by (RCP mean over the
        runs' mean epochs to converge, when they converge faster within the allowed speedup; else
        1).
      log: the checker's own log lines (the RCP record used, the runs' mean epochs).
    """

    checked: bool
    passed: bool | None
    message: str
    norm_factor: float = 1.0
    log: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self) | {"log": list(self.log)}


class _LogLines(logging.Handler):
    def __init__(self):
        super().__init__(level=logging.INFO)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(f"{record.levelname} - {record.getMessage().strip()}")


def rcp_check(directory: str, benchmark: str | None, ruleset: str | None) -> RcpResult:
    """Runs the official `mlperf_logging.rcp_checker` of `ruleset` over the runs in `directory`.

    The same call as the package checker makes (pruned RCPs, no bypass); scaling.json is not
    written. MLPerf has required RCPs since v1.0; the checker reads the directory's
    `result_*.txt` files.
    """
    if benchmark is None or ruleset is None:
        return RcpResult(False, None, "no RCP check: the runs' benchmark or round is not known")
    if version_key(ruleset) < version_key("1.0.0"):
        return RcpResult(
            False, None, f"no RCP check: RCPs exist from round 1.0.0 on; these runs are {ruleset}"
        )
    from mlperf_logging import rcp_checker as rcp_package

    rcp_root = os.path.dirname(rcp_package.__file__)

    def has_rcps(round_name: str) -> bool:
        return os.path.isfile(
            os.path.join(rcp_root, f"training_{round_name}", f"rcps_{benchmark}.json")
        )

    if not has_rcps(ruleset):
        have = [
            name[len("training_") :]
            for name in sorted(os.listdir(rcp_root))
            if name.startswith("training_") and has_rcps(name[len("training_") :])
        ]
        return RcpResult(
            False,
            None,
            f"no RCP check: round {ruleset} has no RCPs for '{benchmark}' (rounds with them: "
            f"{', '.join(have) if have else 'none'})",
        )
    if not glob.glob(os.path.join(glob.escape(directory), "result_*.txt")):
        return RcpResult(
            False, None, "no RCP check: the rcp_checker reads result_*.txt files, none here"
        )
    from mlperf_logging.rcp_checker import rcp_checker

    handler = _LogLines()
    root = logging.getLogger()
    level = root.level
    root.addHandler(handler)
    root.setLevel(logging.INFO)
    try:
        with warnings.catch_warnings(record=True) as caught:  # numpy's, e.g. a mean of no runs
            warnings.simplefilter("always")
            passed, message, norm_factor = rcp_checker.check_directory(
                directory, USAGE, ruleset, False, False, rcp_pass="pruned_rcps"
            )
        handler.lines += [f"WARNING - {w.message}" for w in caught]
    except Exception as error:  # noqa: BLE001 - the official code's failure is its verdict
        return RcpResult(
            True, False, f"the rcp_checker failed: {type(error).__name__}: {error}", 1.0,
            tuple(handler.lines),
        )  # fmt: skip
    finally:
        root.removeHandler(handler)
        root.setLevel(level)
    return RcpResult(True, bool(passed), str(message), float(norm_factor), tuple(handler.lines))


@dataclasses.dataclass(frozen=True)
class DirectoryScore:
    """The benchmark result of a result directory.

    Attributes:
      directory: the folder.
      benchmark, ruleset: of its runs.
      runs: every run, in file-name order.
      required_runs: runs the rules ask for (None if unknown).
      score_minutes: the MLPerf result in minutes, or None when it is not valid.
      mean_minutes: the plain mean of the converged runs (what result_summarizer prints when
        there are too few runs for olympic scoring), or None.
      problems: why the result is not valid, if it is not.
      input_errors: logs that could not be checked, as "path: message".
      rcp: the official RCP check of the runs (a failed check makes the result not valid).
    """

    directory: str
    benchmark: str | None
    ruleset: str | None
    runs: tuple[ScoredRun, ...]
    required_runs: int | None
    score_minutes: float | None
    mean_minutes: float | None
    problems: tuple[str, ...]
    input_errors: tuple[str, ...] = ()
    rcp: RcpResult | None = None

    @property
    def valid(self) -> bool:
        return self.score_minutes is not None and not self.problems

    @property
    def normalized_minutes(self) -> float | None:
        """The result as result_summarizer reports it: times the RCP factor when RCPs pass."""
        if not self.valid:
            return None
        factor = self.rcp.norm_factor if self.rcp is not None and self.rcp.passed else 1.0
        return self.score_minutes * factor

    def to_dict(self) -> dict[str, Any]:
        return {
            "directory": self.directory,
            "benchmark": self.benchmark,
            "ruleset": self.ruleset,
            "required_runs": self.required_runs,
            "valid": self.valid,
            "score_minutes": self.score_minutes,
            "mean_minutes": self.mean_minutes,
            "problems": list(self.problems),
            "input_errors": list(self.input_errors),
            "rcp": None if self.rcp is None else self.rcp.to_dict(),
            "normalized_minutes": self.normalized_minutes,
            "runs": [run.to_dict() for run in self.runs],
        }

    def format_text(self) -> str:
        head = (
            f"{self.directory}: benchmark {self.benchmark or '?'}, ruleset {self.ruleset or '?'}, "
            f"{len(self.runs)} run(s) ({self.required_runs or '?'} required)"
        )
        out = [head]
        for run in self.runs:
            minutes = "-" if run.time.minutes is None else f"{run.time.minutes:.3f} min"
            verdict = "PASS" if run.report.passed else "FAIL"
            counted = "counted" if run.converged else "not converged"
            out.append(
                f"  {os.path.basename(run.path)}: {minutes}  {verdict}, status "
                f"{run.time.status or '-'}, {counted}"
            )
            if run.breakdown:
                out.append(f"    {time_breakdown.one_line(run.breakdown)}")
        out += [f"  error: {message}" for message in self.input_errors]
        if self.rcp is not None:
            verdict = "PASS" if self.rcp.passed else "FAIL" if self.rcp.checked else "-"
            out.append(f"  RCP check ({self.ruleset}): {verdict}: {self.rcp.message}")
        if self.valid:
            out.append(f"  result: {self.score_minutes:.3f} min (olympic mean)")
            if self.rcp is not None and self.rcp.passed:
                out.append(
                    f"  RCP-normalised result: {self.normalized_minutes:.3f} min (x "
                    f"{self.rcp.norm_factor:.4f}, as result_summarizer scales it)"
                )
        else:
            out.append("  result: not valid: " + "; ".join(self.problems))
            if self.mean_minutes is not None:
                out.append(f"  mean of the converged runs: {self.mean_minutes:.3f} min")
        return "\n".join(out)


def result_files(directory: str) -> list[str]:
    """The logs of a result directory: its result_*.txt files (the MLPerf layout), else *.txt/.log.

    Raises:
      UserError: not a directory, or no log in it.
    """
    if not os.path.isdir(directory):
        raise UserError(f"{directory}: not a directory (score takes a result directory)")
    files = sorted(glob.glob(os.path.join(glob.escape(directory), "result_*.txt")))
    if not files:
        files = sorted(
            path
            for pattern in ("*.txt", "*.log")
            for path in glob.glob(os.path.join(glob.escape(directory), pattern))
        )
    files = [path for path in files if os.path.isfile(path)]
    if not files:
        raise UserError(f"{directory}: no result_*.txt (or *.txt, *.log) log in it")
    return files


def score_directory(directory: str, *, jobs: int = 2, **check_kwargs: Any) -> DirectoryScore:
    """Scores the runs of one result directory.

    Args:
      directory: a folder of one benchmark's run logs (result_0.txt ... as in MLPerf results).
      jobs: logs checked at once.
      **check_kwargs: passed to `compliance.checker.check_log` (ruleset, quality, ...).

    Returns:
      The DirectoryScore.

    Raises:
      UserError: the directory is missing or empty, or its logs are of several benchmarks.
    """
    paths = result_files(directory)
    checked = check_logs(paths, jobs=jobs, **check_kwargs)
    runs = []
    input_errors = []
    for path, report in zip(paths, checked):
        if isinstance(report, UserError):
            input_errors.append(str(report))
            continue
        records = logfile.parse_records(logfile.scan_log(path), report.ruleset)
        time = run_time(records)
        converged = report.passed and time.seconds is not None and time.status == C.SUCCESS
        breakdown = time_breakdown.from_log(path)
        runs.append(ScoredRun(path, report, time, converged, breakdown))
    # A log without submission_benchmark fails its check; it does not make a second benchmark.
    benchmarks = sorted({run.report.benchmark for run in runs if run.report.benchmark})
    if len(benchmarks) > 1:
        raise UserError(f"{directory}: logs of several benchmarks ({', '.join(benchmarks)})")
    rulesets = sorted({run.report.ruleset for run in runs}, key=version_key)
    benchmark = benchmarks[0] if benchmarks else None
    ruleset = rulesets[-1] if runs else None
    problems = []
    if len(rulesets) > 1:
        problems.append(f"runs checked against different rulesets ({', '.join(rulesets)})")
    if input_errors:
        problems.append(f"{len(input_errors)} log(s) could not be checked")
    needed = required_runs(benchmark, ruleset) if ruleset else None
    minutes = [run.time.minutes for run in runs if run.converged]
    non_converged = len(runs) - len(minutes)
    max_dropped = max_dropped_runs(benchmark)
    if needed is None:
        problems.append(f"the number of runs '{benchmark}' needs is not known")
    elif len(runs) < needed:
        problems.append(f"{len(runs)} run(s), the rules need {needed}")
    if non_converged > max_dropped:
        problems.append(
            f"{non_converged} runs did not converge (fail the check, no run_stop, or status not "
            f"'{C.SUCCESS}'); at most {max_dropped} may be dropped"
        )
    rcp = rcp_check(directory, benchmark, ruleset)
    if rcp.checked and not rcp.passed:
        problems.append(f"the official RCP check failed: {rcp.message}")
    score = None
    if non_converged <= max_dropped:
        score = olympic_mean(minutes, non_converged=non_converged, max_dropped=max_dropped)
        if score is None:
            problems.append("no run left after dropping the fastest and slowest")
    return DirectoryScore(
        directory=directory,
        benchmark=benchmark,
        ruleset=ruleset,
        runs=tuple(runs),
        required_runs=needed,
        score_minutes=None if problems else score,
        mean_minutes=sum(minutes) / len(minutes) if minutes else None,
        problems=tuple(problems),
        input_errors=tuple(input_errors),
        rcp=rcp,
    )
