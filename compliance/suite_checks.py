"""Provides `Finding` and `suite_checks`: this suite's checks of a log, beyond the official rules.

The official checker (run by `compliance.checker`) judges the MLPerf rules; these checks add what
it does not look at (cf. mlcommons/logging issue 79): the evaluation cadence against the rules'
quality-measure table, timestamps and epoch numbers that never go back, `run_stop` status against
the accuracy reached, start/stop pairing of blocks, epochs and evals, and a run that never logged
`run_stop` (a crash). They are warnings unless the caller asks for `strict`.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

from mlperf_logging.mllog import constants as C

from compliance.logfile import Record
from mlperf_tf import rules

ERROR = "error"
WARNING = "warning"
INFO = "info"  # said for the reader's sake, e.g. a check that could not run; never fails a log

# How many lines one finding lists, and how many findings of one kind one log gets: a log with
# 10,000 unpaired blocks needs one message, not 10,000.
_MAX_LINES = 20
_MAX_FINDINGS_PER_CHECK = 5


@dataclasses.dataclass(frozen=True)
class Finding:
    """One message about a log.

    Attributes:
      level: "error" (fails the log), "warning", or "info" (e.g. a check that could not run).
      source: "official" (the MLCommons checker said it) or "suite" (this module).
      check: what produced it: "official", "parse", "crash", "target" (the official accuracy
        target), or a suite check name ("eval_cadence", "monotonic", "run_stop_status",
        "pairing", "crashed_run").
      message: the text; official messages are the checker's own words (its "line N" counts log
        records from 0, see `lines` for the file's line numbers).
      lines: the 1-based line numbers in the log file the message is about, first the main one.
    """

    level: str
    source: str
    check: str
    message: str
    lines: tuple[int, ...] = ()

    @property
    def line(self) -> int | None:
        """The main line number in the log file, or None when the message has no line."""
        return self.lines[0] if self.lines else None

    def to_dict(self) -> dict[str, Any]:
        return {
            "level": self.level,
            "source": self.source,
            "check": self.check,
            "line": self.line,
            "lines": list(self.lines),
            "message": self.message,
        }


@dataclasses.dataclass(frozen=True)
class Target:
    """An accuracy target read from the official rule file.

    Attributes:
      value: the quality the run must reach.
      higher_is_better: True for accuracies, False for error rates (e.g. RNN-T's WER).
      expression: the rule file's check, verbatim.
    """

    value: float
    higher_is_better: bool
    expression: str

    def reached(self, quality: float) -> bool:
        return quality >= self.value if self.higher_is_better else quality <= self.value


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    value = float(value)
    return value if math.isfinite(value) else None


def _lines(records: Sequence[Record]) -> tuple[int, ...]:
    return tuple(dict.fromkeys(r.line for r in records))[:_MAX_LINES]


def _epoch_of(record: Record) -> float | None:
    key = "first_epoch_num" if record.key in (C.BLOCK_START, C.BLOCK_STOP) else "epoch_num"
    return _number(record.metadata.get(key))


def _bert_eval_interval_samples(ruleset: str, global_batch_size: float | None) -> float | None:
    # Training rules v0.7: "Starting at 3M samples, then every 500K samples"; v1.0 and later:
    # a formula of the global batch. The benchmark schedules its evals by the same function.
    rule = "v0.7" if ruleset == "0.7.0" else "v1.0"
    if rule == "v1.0" and global_batch_size is None:
        return None
    return float(rules.bert_eval_interval_samples(rule, int(global_batch_size or 1)))


def _cadence(benchmark: str | None, ruleset: str, global_batch_size: float | None):
    """The evaluation cadence the rules ask of `benchmark` in `ruleset`, or None if unchecked.

    Returns:
      (first, steps, unit, slack): the first eval by `first` (None: unchecked); `steps` a list of
      (up_to, max_gap) pairs: while the previous eval is below `up_to`, the next one must come
      within `max_gap`; `unit` names what epoch_num counts; `slack` is added to every bound
      (epoch numbering from 0 or 1; BERT evals rounded up to a whole step).
    """
    if benchmark == "resnet":
        # Every 4 epochs with an offset of 0-3 (training rules, quality measure table).
        return 4.0, [(math.inf, 4.0)], "epochs", 1.0
    if benchmark == "ssd" and ruleset == "0.7.0":
        # v0.7: evaluations fixed at epochs 40, 50, 55, 60, ... 80.
        return 40.0, [(50.0, 10.0), (math.inf, 5.0)], "epochs", 1.0
    if benchmark == "ssd" and ruleset != "0.6.0":
        return 5.0, [(math.inf, 5.0)], "epochs", 1.0  # v1.0 and later: every 5 epochs
    if benchmark in ("transformer", "gnmt", "maskrcnn"):
        return 1.0, [(math.inf, 1.0)], "epochs", 0.0  # every epoch
    if benchmark == "bert":
        interval = _bert_eval_interval_samples(ruleset, global_batch_size)
        if interval is None:
            return None
        slack = global_batch_size or 0.0
        return None, [(math.inf, interval)], "samples", slack
    return None


def _check_eval_cadence(records, benchmark, ruleset, global_batch_size, emit):
    spec = _cadence(benchmark, ruleset, global_batch_size)
    evals = [r for r in records if r.key == C.EVAL_ACCURACY]
    if spec is None or not evals:
        return
    first, steps, unit, slack = spec
    if any(_epoch_of(r) is None for r in evals):
        return  # the official checker reports eval_accuracy lines without epoch_num
    # In epoch order: evals logged out of order are the monotonic check's business.
    evals = sorted(evals, key=_epoch_of)
    epochs = [_epoch_of(r) for r in evals]
    if unit == "samples" and len(set(epochs)) == 1 and len(epochs) > 1:
        emit(
            "eval_cadence",
            f"eval cadence not checked: every eval_accuracy has epoch_num {epochs[0]:g}, not the "
            f"number of training samples seen",
            evals[:1],
            level=INFO,
        )
        return
    if first is not None and epochs[0] > first + slack:
        emit(
            "eval_cadence",
            f"first evaluation at {unit[:-1]} {epochs[0]:g}; the {benchmark} rules ({ruleset}) "
            f"evaluate by {unit[:-1]} {first:g}",
            evals[:1],
        )
    late = []
    for (previous, _), (current, record) in zip(zip(epochs, evals), zip(epochs[1:], evals[1:])):
        max_gap = next(gap for up_to, gap in steps if previous < up_to)
        if current - previous > max_gap + slack:
            late.append((previous, current, max_gap, record))
    if late:
        previous, current, max_gap, record = late[0]
        emit(
            "eval_cadence",
            f"{len(late)} evaluation(s) later than the {benchmark} rules ({ruleset}) allow: e.g. "
            f"{unit} {previous:g} -> {current:g}, more than {max_gap:g} {unit} apart",
            [item[3] for item in late],
        )


def _check_monotonic(records, emit):
    backwards = []
    latest = None
    for record in records:
        if not record.time_s or record.time_s <= 0:
            continue  # no time, or a placeholder 0 (some logs write it for submission_* keys)
        if latest is not None and record.time_s < latest.time_s:
            backwards.append((latest, record))
        if latest is None or record.time_s >= latest.time_s:
            latest = record
    if backwards:
        before, record = backwards[0]
        emit(
            "monotonic",
            f"{len(backwards)} timestamp(s) go back in time: e.g. line {record.line} "
            f"({record.key}) is {before.time_s - record.time_s:.3f} s before line {before.line}",
            [r for _, r in backwards],
        )
    families = {
        "epoch_start": (C.EPOCH_START,),
        "epoch_stop": (C.EPOCH_STOP,),
        "block_start": (C.BLOCK_START,),
        "block_stop": (C.BLOCK_STOP,),
        "eval": (C.EVAL_START, C.EVAL_STOP, C.EVAL_ACCURACY),
    }
    for name, keys in families.items():
        decreasing = []
        last = None
        for record in records:
            if record.key not in keys:
                continue
            epoch = _epoch_of(record)
            if epoch is None:
                continue
            if last is not None and epoch < last[0]:
                decreasing.append((last, record, epoch))
            if last is None or epoch >= last[0]:
                last = (epoch, record)
        if decreasing:
            (before_epoch, before), record, epoch = decreasing[0]
            emit(
                "monotonic",
                f"{len(decreasing)} {name} epoch number(s) go back: e.g. line {record.line} has "
                f"{epoch:g} after {before_epoch:g} on line {before.line}",
                [r for _, r, _ in decreasing],
            )


def _check_pairing(records, emit):
    pairs = (
        ("block", C.BLOCK_START, C.BLOCK_STOP),
        ("epoch", C.EPOCH_START, C.EPOCH_STOP),
        ("eval", C.EVAL_START, C.EVAL_STOP),
    )
    for name, start_key, stop_key in pairs:
        problems: list[tuple[str, Record]] = []
        open_record: Record | None = None
        for record in records:
            if record.key == start_key:
                if open_record is not None:
                    problems.append(
                        (f"{start_key} while the {name} of line {open_record.line} is open", record)
                    )
                open_record = record
            elif record.key == stop_key:
                if open_record is None:
                    problems.append((f"{stop_key} without an open {start_key}", record))
                elif _epoch_of(open_record) != _epoch_of(record):
                    problems.append(
                        (
                            f"{stop_key} for epoch {_epoch_of(record)} closes the {start_key} of "
                            f"epoch {_epoch_of(open_record)} (line {open_record.line})",
                            record,
                        )
                    )
                    open_record = None
                else:
                    open_record = None
        if open_record is not None:
            problems.append((f"{start_key} never stopped", open_record))
        if problems:
            text, record = problems[0]
            emit(
                "pairing",
                f"{len(problems)} unpaired {name} start/stop(s): e.g. line {record.line}: {text}",
                [r for _, r in problems],
            )


def _check_run_stop(records, target, quality, emit):
    starts = [r for r in records if r.key == C.RUN_START]
    stops = [r for r in records if r.key == C.RUN_STOP]
    if starts and not stops:
        last = records[-1]
        emit(
            "crashed_run",
            f"no run_stop: the run crashed or was cut short (run_start on line {starts[0].line}, "
            f"last record on line {last.line}: {last.key})",
            starts[:1] + [last],
        )
        return
    if not stops:
        return
    stop = stops[0]
    status = stop.metadata.get("status")
    accuracies = [
        (record, _number(record.value)) for record in records if record.key == C.EVAL_ACCURACY
    ]
    accuracies = [(record, value) for record, value in accuracies if value is not None]
    if quality == "skip":
        return  # the run's own target is not in the log: nothing to compare the status with
    if target is None:
        return
    reached = [record for record, value in accuracies if target.reached(value)]
    if status == C.SUCCESS and not reached:
        best = max((value for _, value in accuracies), default=None)
        emit(
            "run_stop_status",
            f"run_stop status is '{C.SUCCESS}' but no eval_accuracy reached the target "
            f"{target.value:g} (best {'none' if best is None else f'{best:g}'})",
            [stop],
        )
    elif status != C.SUCCESS and reached:
        emit(
            "run_stop_status",
            f"run_stop status is {status!r} but eval_accuracy reached the target {target.value:g} "
            f"on line {reached[0].line}",
            [stop, reached[0]],
        )


def suite_checks(
    records: Sequence[Record],
    *,
    benchmark: str | None,
    ruleset: str,
    target: Target | None,
    quality: str = "enforce",
    strict: bool = False,
) -> list[Finding]:
    """Runs this suite's checks on the parsed records of one log.

    Args:
      records: the log's records in file order (`compliance.logfile.parse_records`).
      benchmark: the log's `submission_benchmark`, or None.
      ruleset: the ruleset it is checked against, e.g. "0.7.0".
      target: the official accuracy target, or None where the rules have none.
      quality: "enforce", or "skip" when the run's target is not the MLPerf one (the run_stop
        status is then not compared with the MLPerf target).
      strict: report the findings as errors instead of warnings.

    Returns:
      The findings, at most a few per check.
    """
    default_level = ERROR if strict else WARNING
    findings: list[Finding] = []
    counts: dict[str, int] = {}

    def emit(check: str, message: str, about: Sequence[Record], level: str | None = None) -> None:
        counts[check] = counts.get(check, 0) + 1
        if counts[check] <= _MAX_FINDINGS_PER_CHECK:
            findings.append(
                Finding(level or default_level, "suite", check, message, _lines(list(about)))
            )

    records = list(records)
    global_batch_size = next(
        (_number(r.value) for r in records if r.key == C.GLOBAL_BATCH_SIZE), None
    )
    _check_run_stop(records, target, quality, emit)
    _check_eval_cadence(records, benchmark, ruleset, global_batch_size, emit)
    _check_monotonic(records, emit)
    _check_pairing(records, emit)
    return findings
