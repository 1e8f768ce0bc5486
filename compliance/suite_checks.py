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

from compliance import keys as C
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
        "pairing", "crashed_run", "timing", "resumed"; "empty" and "ruleset" from the checker).
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


BERT_EVAL_GRID_SAMPLES = 25_000  # the rounding unit of the v1.0+ BERT eval-interval formula


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
        # The rule rounds down to a multiple of 25,000 samples; published logs (which the official
        # checker passes) evaluate up to one such unit plus a step or two later (NVIDIA's packed
        # steps carry a varying number of samples). So the bound is the interval rounded up.
        slack = BERT_EVAL_GRID_SAMPLES + (global_batch_size or 0.0)
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


# Clock skew between the ranks that write one log: records of the timed phase stamped this much
# before run_start are still taken as written after it.
_CLOCK_SKEW_S = 1.0


def _check_timing(records, emit):
    """The time to train covers the work: run_stop after run_start, no training before it.

    These are errors under --strict. Other timestamps that go back (ranks logging with skewed
    clocks, evaluations logged when they finish) are normal in published logs: a warning.
    """
    starts = [r for r in records if r.key == C.RUN_START and r.time_s and r.time_s > 0]
    stops = [r for r in records if r.key == C.RUN_STOP and r.time_s and r.time_s > 0]
    if starts and stops and stops[0].time_s < starts[0].time_s:
        emit(
            "timing",
            f"run_stop (line {stops[0].line}) is {starts[0].time_s - stops[0].time_s:.3f} s "
            f"before run_start (line {starts[0].line})",
            [stops[0], starts[0]],
        )
    if starts:
        begin = starts[0].time_s
        early = [
            r
            for r in records
            if r.key in _TIMED_KEYS and r.time_s and 0 < r.time_s < begin - _CLOCK_SKEW_S
        ]
        if early:
            emit(
                "timing",
                f"{len(early)} training/eval record(s) stamped before run_start: e.g. line "
                f"{early[0].line} ({early[0].key}) is {begin - early[0].time_s:.3f} s before "
                f"run_start (line {starts[0].line}): work outside the timed run",
                early,
            )


_TIMED_KEYS = frozenset(
    (C.BLOCK_START, C.BLOCK_STOP, C.EPOCH_START, C.EPOCH_STOP, C.EVAL_START, C.EVAL_STOP)
)


def _check_monotonic(records, emit):
    """Timestamps and epoch numbers that go back: warnings only, never errors.

    Published logs that the official checker passes do both legitimately: several ranks write one
    log with slightly skewed clocks, and asynchronous evaluations are logged when they finish.
    """
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
            level=WARNING,
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
                level=WARNING,
            )


def _check_pairing(records, emit):
    """Starts and stops of blocks, epochs and evals.

    Errors under --strict: a stop with nothing open to close although starts of its kind were
    logged before it (more stops than starts), or one that closes a later epoch than its own
    (numbers going back). Warnings: what published logs do legitimately: a start while another
    is open (asynchronous evals, a start logged per epoch of a block), a stop whose epoch number
    is past its start's (BERT counts samples, fractional epochs), the last start left open when
    the run stopped at the target (the rules allow it), and stops before any start of their kind
    was logged (an implementation that does not log those starts: NVIDIA's NeMo `llama31_405b`
    of v5.0 logs `eval_stop` and never `eval_start`; Google's MaxText `gpt3` and several
    `llama2_70b_lora` logs of v4.0 log no `block_start` for the first block, which `run_start`
    opens). The official checker passes all of these.

    Not a finding at all: a fractional stop inside its start's epoch. The GNN (`gnn`, `rgat`)
    logs of v4.0-v5.1 open `epoch_start` with `epoch_num` 1 and, stopping at the target part of
    the way through, close it with `epoch_stop` at the fraction of epochs done (e.g. 0.85): the
    stop belongs to the epoch counted from 1 (ceil) or from 0 (floor) as its start.
    """
    pairs = (
        ("block", C.BLOCK_START, C.BLOCK_STOP),
        ("epoch", C.EPOCH_START, C.EPOCH_STOP),
        ("eval", C.EVAL_START, C.EVAL_STOP),
    )
    for name, start_key, stop_key in pairs:
        hard: list[tuple[str, Record]] = []
        soft: list[tuple[str, Record]] = []
        open_records: list[Record] = []
        started = False  # a start of this kind logged yet
        for record in records:
            if record.key == start_key:
                started = True
                if open_records:
                    soft.append(
                        (
                            f"{start_key} while the {name} of line {open_records[-1].line} is open",
                            record,
                        )
                    )
                open_records.append(record)
            elif record.key == stop_key:
                epoch = _epoch_of(record)
                same = [r for r in open_records if _same_epoch(_epoch_of(r), epoch)]
                if same:
                    open_records.remove(same[0])
                elif not open_records:
                    text = f"{stop_key} without an open {start_key}"
                    if started:
                        hard.append((text, record))
                    else:
                        soft.append((f"{text} (none logged before it)", record))
                else:
                    opened = open_records.pop()
                    text = (
                        f"{stop_key} for epoch {epoch} closes the {start_key} of epoch "
                        f"{_epoch_of(opened)} (line {opened.line})"
                    )
                    goes_back = (
                        epoch is not None
                        and _epoch_of(opened) is not None
                        and epoch < _epoch_of(opened)
                    )
                    (hard if goes_back else soft).append((text, record))
        for record in open_records:
            soft.append((f"{start_key} never stopped", record))
        for problems, level in ((hard, None), (soft, WARNING)):
            if problems:
                text, record = problems[0]
                emit(
                    "pairing",
                    f"{len(problems)} unpaired {name} start/stop(s): e.g. line {record.line}: "
                    f"{text}",
                    [r for _, r in problems],
                    level=level,
                )


def _same_epoch(started: float | None, stopped: float | None) -> bool:
    """Whether a stop numbered `stopped` closes the start numbered `started`.

    Equal numbers do; so does a fractional stop (progress in epochs, as the GNN logs count it)
    inside the start's epoch, whether the start counts from 1 (ceil) or from 0 (floor).
    """
    if started == stopped:
        return True
    if started is None or stopped is None or float(stopped).is_integer():
        return False
    return started in (math.ceil(stopped), math.floor(stopped))


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
    if not stops or target is None:
        return
    stop = stops[0]
    status = stop.metadata.get("status")
    accuracies = [
        (record, _number(record.value)) for record in records if record.key == C.EVAL_ACCURACY
    ]
    accuracies = [(record, value) for record, value in accuracies if value is not None]
    reached = [record for record, value in accuracies if target.reached(value)]
    if status == C.SUCCESS and not reached:
        # An error in every mode: --quality=skip is for runs that did not reach the target and
        # say so (status aborted), never for a log that claims a success it did not have.
        pick = max if target.higher_is_better else min
        best = pick((value for _, value in accuracies), default=None)
        emit(
            "run_stop_status",
            f"run_stop status is '{C.SUCCESS}' but no eval_accuracy reached the target "
            f"{target.value:g} (best {'none' if best is None else f'{best:g}'})",
            [stop],
            level=ERROR,
        )
    elif status != C.SUCCESS and reached and quality != "skip":
        emit(
            "run_stop_status",
            f"run_stop status is {status!r} but eval_accuracy reached the target {target.value:g} "
            f"on line {reached[0].line}",
            [stop, reached[0]],
        )


def _check_resumed(records, resumed, emit):
    """A run resumed from a checkpoint is a valid timed run only with its first `run_start`.

    The runner marks a resumed log with `# mlperf-tf resumed {"step": N,
    "original_run_start_ms": T}` and re-emits run_start at T; without T (or with another
    run_start) the time to train leaves out the work before the restart: an error in every mode.
    """
    start = next((r for r in records if r.key == C.RUN_START), None)
    for line, mark in resumed:
        mark = mark if isinstance(mark, dict) else {}
        step = mark.get("step", "?")
        original = mark.get("original_run_start_ms")
        about = [Record("resumed", None, {}, None, line)]
        if (
            isinstance(original, int)
            and not isinstance(original, bool)
            and start is not None
            and start.timestamp == original
        ):
            emit(
                "resumed",
                f"resumed from step {step}; run_start is the first attempt's, so the time to "
                f"train covers the whole run",
                about,
                level=INFO,
            )
        else:
            emit(
                "resumed",
                f"resumed from step {step} without the original run_start (the mark gives "
                f"{original!r}, run_start is {None if start is None else start.timestamp!r}): "
                f"its time to train leaves out the work before the restart; not a valid timed run",
                about + ([start] if start is not None else []),
                level=ERROR,
            )


def suite_checks(
    records: Sequence[Record],
    *,
    benchmark: str | None,
    ruleset: str,
    target: Target | None,
    quality: str = "enforce",
    strict: bool = False,
    resumed: Sequence[tuple[int, Any]] = (),
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
      resumed: (line, mark) of the runner's `# mlperf-tf resumed {...}` lines (see
        `compliance.logfile.suite_notes`).

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
    _check_resumed(records, resumed, emit)
    _check_run_stop(records, target, quality, emit)
    _check_eval_cadence(records, benchmark, ruleset, global_batch_size, emit)
    _check_timing(records, emit)
    _check_monotonic(records, emit)
    _check_pairing(records, emit)
    return findings
