"""Provides `check_log`: the official MLCommons verdict on an MLPerf log, plus this suite's checks.

The official checker (`mlperf_logging.compliance_checker`, pinned at 4.1.68) is the judge of the
rules; it keeps module-level state and runs Python from its rule files, so every log is checked in
a fresh process (`OfficialRunner`: a fork of a server that imported the checker but never ran it,
see compliance/official_worker.py) with a time limit and a memory limit. The log is first read here
in bounded memory (`compliance.logfile`); the checker gets only its ':::MLL' lines, which is all
the official parser reads, so its verdict and its record numbers are unchanged.
"""

from __future__ import annotations

import dataclasses
import datetime
import os
import re
from collections.abc import Sequence
from typing import Any

from compliance import keys as C
from compliance import logfile
from compliance.options import (  # noqa: F401 - re-exported: the checker's public defaults
    DEFAULT_JOBS,
    DEFAULT_TIMEOUT_S,
    QUALITY_MODES,
    USAGE,
    WORKER_MEMORY_LIMIT_BYTES,
)
from compliance.runner import OfficialRunner
from compliance.suite_checks import ERROR, INFO, WARNING, Finding, Target, suite_checks
from mlperf_tf import rounds
from mlperf_tf.errors import UserError

# The day each MLPerf Training round's results were published (approximate for the last ones): a
# run logged before it belongs to that round or an earlier one.
_ROUND_PUBLISHED = {
    "0.6.0": datetime.date(2019, 7, 10),
    "0.7.0": datetime.date(2020, 7, 29),
    "1.0.0": datetime.date(2021, 6, 30),
    "1.1.0": datetime.date(2021, 12, 1),
    "2.0.0": datetime.date(2022, 6, 29),
    "2.1.0": datetime.date(2022, 11, 9),
    "3.0.0": datetime.date(2023, 6, 27),
    "3.1.0": datetime.date(2023, 11, 8),
    "4.0.0": datetime.date(2024, 6, 12),
    "4.1.0": datetime.date(2024, 11, 13),
    "5.0.0": datetime.date(2025, 6, 4),
    "5.1.0": datetime.date(2025, 11, 12),
    "6.0.0": datetime.date(2026, 6, 3),
    "6.1.0": datetime.date(2026, 11, 11),
}

_NAME = re.compile(r"^[a-z0-9_]+$")
_RESULTS_REPOSITORY = re.compile(r"training_results_v(\d+)\.(\d+)(?:[/\\]|$)")
_TARGET_CONDITIONAL = re.compile(
    r"v\['value'\]\s*>=\s*([0-9.]+)\s+if\s+s\['global_batch_size'\]\s*<\s*([0-9.]+)\s+"
    r"else\s+v\['value'\]\s*>=\s*([0-9.]+)"
)
_ACCURACY_RULE = re.compile(
    rf"NAME:\s*{C.EVAL_ACCURACY}\s*\n(?:(?!\s*- *KEY:).*\n)*?\s*ATLEAST_ONE_CHECK:\s*\"([^\"]*)\""
)
_TARGET_AT_LEAST = re.compile(r"v\['value'\]\s*>=\s*([0-9.]+)")
_TARGET_AT_MOST = re.compile(r"v\['value'\]\s*<=\s*([0-9.]+)")
_ACCURACY_CHECK_MESSAGE = f"Failed checks for {C.EVAL_ACCURACY} "


@dataclasses.dataclass(frozen=True)
class Report:
    """The verdict on one log.

    Attributes:
      path: the log file.
      passed: the verdict: the official one, except that under quality="skip" a missed accuracy
        target does not fail the log, and under strict=True suite findings do.
      official_passed: the official checker's verdict (exit code 0 of its command line).
      official_crashed: the official checker raised instead of giving a verdict (then FAIL).
      benchmark: the log's `submission_benchmark`, or None.
      ruleset: the ruleset checked against, e.g. "0.7.0".
      ruleset_reason: why that ruleset: "given", or how the default was picked.
      quality: "enforce" or "skip".
      strict: whether suite findings are errors.
      rule_files: the official rule files applied, in order.
      findings: every message, official ones first; see `errors` and `warnings`.
      official_messages: the official checker's output items as its command line prints them
        ("WARNING - ...", "ERROR - FAILED", or "TRACEBACK - <Exception>: ..." for a crash), with
        its state dumps dropped.
    """

    path: str
    passed: bool
    official_passed: bool
    official_crashed: bool
    benchmark: str | None
    ruleset: str
    ruleset_reason: str
    quality: str
    strict: bool
    rule_files: tuple[str, ...]
    findings: tuple[Finding, ...]
    official_messages: tuple[str, ...] = ()

    @property
    def errors(self) -> tuple[Finding, ...]:
        return tuple(f for f in self.findings if f.level == ERROR)

    @property
    def warnings(self) -> tuple[Finding, ...]:
        return tuple(f for f in self.findings if f.level == WARNING)

    @property
    def notes(self) -> tuple[Finding, ...]:
        """Findings for information only (e.g. a suite check that could not run)."""
        return tuple(f for f in self.findings if f.level == INFO)

    @property
    def messages(self) -> tuple[Finding, ...]:
        return self.findings

    def to_dict(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "passed": self.passed,
            "official_passed": self.official_passed,
            "official_crashed": self.official_crashed,
            "benchmark": self.benchmark,
            "ruleset": self.ruleset,
            "ruleset_reason": self.ruleset_reason,
            "quality": self.quality,
            "strict": self.strict,
            "rule_files": list(self.rule_files),
            "errors": [f.to_dict() for f in self.errors],
            "warnings": [f.to_dict() for f in self.warnings],
            "notes": [f.to_dict() for f in self.notes],
            "official_messages": list(self.official_messages),
        }

    def format_text(self) -> str:
        """A human-readable report: a verdict line, then one entry per finding."""
        verdict = "PASS" if self.passed else "FAIL"
        official = (
            "crashed" if self.official_crashed else "PASS" if self.official_passed else "FAIL"
        )
        head = (
            f"{verdict}  {self.path}  (benchmark {self.benchmark or '?'}, ruleset {self.ruleset}"
            f" [{self.ruleset_reason}], official verdict {official}"
            + (", quality=skip" if self.quality == "skip" else "")
            + (", strict" if self.strict else "")
            + f"; {len(self.errors)} error(s), {len(self.warnings)} warning(s))"
        )
        out = [head]
        for finding in self.errors + self.warnings + self.notes:
            where = f"{self.path}:{finding.line}" if finding.line else self.path
            text = finding.message.replace("\n", "\n      ")
            more = (
                f"\n      (lines {', '.join(map(str, finding.lines))})"
                if len(finding.lines) > 1
                else ""
            )
            out.append(
                f"  {where}: {finding.level} [{finding.source}:{finding.check}] {text}{more}"
            )
        return "\n".join(out)


rules_dir = rounds.rules_dir
version_key = rounds.version_key


def available_rulesets() -> list[str]:
    """The training rulesets the installed checker has, oldest first."""
    return list(rounds.available_rulesets())


def has_rules(ruleset: str, benchmark: str | None) -> bool:
    """Whether `ruleset` has closed-division rules for `benchmark`."""
    if not benchmark or not _NAME.match(benchmark):
        return False
    name = f"{benchmark}.yaml" if ruleset == "0.6.0" else f"closed_{benchmark}.yaml"
    return os.path.isfile(os.path.join(rules_dir(), f"{USAGE}_{ruleset}", name))


def quality_target(
    ruleset: str,
    benchmark: str | None,
    *,
    division: str = "closed",
    global_batch_size: float | None = None,
) -> Target | None:
    """The accuracy target of the official rule file, read (not evaluated) from its text.

    Args:
      ruleset: e.g. "0.7.0".
      benchmark: e.g. "resnet".
      division: "closed" or "open" (open rules may have no target).
      global_batch_size: needed where the target depends on it (BERT in 0.7.0).

    Returns:
      The Target, or None where the rule file has no accuracy target (all of 0.6.0, some open
      rules) or it depends on a batch size that is not known.
    """
    if not benchmark or not _NAME.match(benchmark) or division not in ("closed", "open"):
        return None
    if ruleset == "0.6.0":
        return None
    # Every rule file writes the check on one line in double quotes; a test holds this reading
    # equal to a YAML parse of every installed rule file (no YAML import on the check's path).
    text = rounds.rule_text(ruleset, f"{division}_{benchmark}.yaml")
    for rule in _ACCURACY_RULE.finditer(text):
        expression = rule.group(1).strip()
        match = _TARGET_CONDITIONAL.search(expression)
        if match:
            if global_batch_size is None:
                return None
            small, boundary, large = (float(g) for g in match.groups())
            value = small if global_batch_size < boundary else large
            return Target(value, True, expression)
        match = _TARGET_AT_LEAST.search(expression)
        if match:
            return Target(float(match.group(1)), True, expression)
        match = _TARGET_AT_MOST.search(expression)
        if match:
            return Target(float(match.group(1)), False, expression)
    return None


def logged_target(scan: logfile.LogScan) -> Target | None:
    """The run's own target, from the runner's `# mlperf-tf target {"quality_target": X}` line.

    A mini or smoke preset aims at its own target (e.g. 0.90 on the digits mini set for ResNet),
    not MLPerf's; None when the log does not say.
    """
    for _, mark in logfile.suite_notes(scan, "target"):
        value = mark.get("quality_target") if isinstance(mark, dict) else None
        if isinstance(value, int | float) and not isinstance(value, bool):
            higher = mark.get("higher_is_better", True)
            return Target(float(value), higher is not False, f"logged by the run: {value}")
    return None


def logged_scaled_settings(scan: logfile.LogScan) -> dict[str, str]:
    """Log keys the run declares scaled down from the closed rules, with why: the runner's
    `# mlperf-tf scaled {"max_sequence_length": "..."}` line (a mini preset's sequence length).

    Under `--quality=skip` the official check of such a key is a warning that says so.
    """
    scaled: dict[str, str] = {}
    for _, mark in logfile.suite_notes(scan, "scaled"):
        if isinstance(mark, dict):
            scaled.update({str(k): str(v) for k, v in mark.items()})
    return scaled


_FAILED_CHECK = re.compile(r"^CHECK for '([A-Za-z0-9_]+)' failed")
_FAILED_TEST = re.compile(r"failed test:\s*(.*)$", re.MULTILINE)


def _first_value(records: Sequence[logfile.Record], key: str) -> Any:
    return next((r.value for r in records if r.key == key), None)


def _run_date(records: Sequence[logfile.Record]) -> datetime.date | None:
    times = [r.time_s for r in records if r.key == C.RUN_START and r.time_s]
    times = times or [r.time_s for r in records if r.time_s and r.time_s > 0]
    if not times:
        return None
    try:
        return datetime.datetime.fromtimestamp(times[0], datetime.UTC).date()
    except (OverflowError, OSError, ValueError):
        return None


def _round_of_date(date: datetime.date, rulesets: Sequence[str]) -> str | None:
    """The round whose submission window holds `date`: the first published on or after it."""
    for ruleset in sorted(rulesets, key=version_key):
        if date <= _ROUND_PUBLISHED.get(ruleset, datetime.date.min):
            return ruleset
    return None


def ruleset_from_path(path: str) -> str | None:
    """The round of a log inside a results repository (`.../training_results_vX.Y/...`), or None."""
    matches = _RESULTS_REPOSITORY.findall(os.path.abspath(path))
    if not matches:
        return None
    ruleset = f"{matches[-1][0]}.{matches[-1][1]}.0"
    return ruleset if ruleset in available_rulesets() else None


@dataclasses.dataclass(frozen=True)
class RulesetChoice:
    """The ruleset picked for a log, and why.

    Attributes:
      ruleset: e.g. "3.0.0".
      reason: what decided, for the report.
      alternatives: other rounds that fit the log as well, each with different rules; the caller
        checks the log under them too and refuses to guess when the verdicts differ.
    """

    ruleset: str
    reason: str
    alternatives: tuple[str, ...] = ()


def pick_ruleset(scan: logfile.LogScan) -> RulesetChoice:
    """Picks the round a log belongs to from what the log says.

    0.6.0-format logs (':::MLL <time> <key>: ...') get 0.6.0; a log inside a results repository
    (`training_results_vX.Y`) gets that round. Otherwise the candidates are the rounds whose
    rules accept the log's `submission_benchmark` (all rounds when none does), narrowed to those
    whose required keys the log has the most of: keys only some rounds require or name
    differently (`weights_initialization` in v1.1-v2.1, BERT's `opt_epsilon` that is
    `opt_lamb_epsilon` from v2.1, SSD-ResNet34's keys against RetinaNet's `opt_name` from v2.0)
    tell rounds apart. The run's date then picks the round whose submission window holds it. If
    several candidates remain (no date, or a date no candidate's window holds), the newest is
    picked and the others with different rules are returned as `alternatives`.
    """
    log_format = logfile.guess_format(scan)
    installed = [r for r in available_rulesets() if r != "0.6.0"]
    if log_format == "0.6":
        return RulesetChoice("0.6.0", "the log is in the 0.6.0 format (':::MLL <time> <key>: ...')")
    from_path = ruleset_from_path(scan.path)
    if from_path is not None:
        return RulesetChoice(from_path, f"the log is in a results repository of round {from_path}")
    if log_format is None:
        return RulesetChoice(installed[-1], "no line parses as an MLPerf log record: newest")
    records = logfile.parse_records(scan, installed[-1])
    benchmark = _first_value(records, C.SUBMISSION_BENCHMARK)
    benchmark = benchmark if isinstance(benchmark, str) else None
    candidates = [r for r in installed if rounds.has_benchmark(r, benchmark)]
    if candidates:
        why = [f"benchmark '{benchmark}' is in rounds {_span(candidates)}"]
    else:
        candidates = installed
        why = [f"no round has benchmark {benchmark!r}" if benchmark else "no submission_benchmark"]
    date = _run_date(records)
    # A run cannot belong to a round published before it was made.
    later = [r for r in candidates if date and date <= _ROUND_PUBLISHED.get(r, datetime.date.max)]
    if later and len(later) < len(candidates):
        why.append(f"run dated {date}: rounds published before it are out")
        candidates = later
    elif date and not later:
        why.append(f"run dated {date}, after every such round")
    division = _first_value(records, C.SUBMISSION_DIVISION)
    division = division if division in ("closed", "open") else "closed"
    present = {r.key for r in records}
    missing = {r: rounds.required_keys(r, benchmark or "", division) - present for r in candidates}
    fewest = min(len(keys) for keys in missing.values())
    fitting = [r for r in candidates if len(missing[r]) == fewest]
    if len(fitting) < len(candidates):
        told = sorted(
            set().union(*(missing[r] for r in candidates))
            - set().union(*(missing[r] for r in fitting))
        )
        others = [r for r in candidates if r not in fitting]
        why.append(
            f"it lacks keys that {_span(others)} require "
            f"({', '.join(told[:3])}{', ...' if len(told) > 3 else ''}): {_span(fitting)} fit"
        )
    if len(fitting) == 1:
        return RulesetChoice(fitting[0], "; ".join(why))
    # The first round after the run (the one it was made for), else the newest.
    picked = fitting[0] if later else fitting[-1]
    if date and _round_of_date(date, available_rulesets()) == picked:
        why.append(f"in round {picked}'s submission window")
        return RulesetChoice(picked, "; ".join(why))
    fingerprints = {rounds.rules_fingerprint(picked, benchmark or "", division)}
    alternatives = []
    for ruleset in fitting:
        fingerprint = rounds.rules_fingerprint(ruleset, benchmark or "", division)
        if fingerprint not in fingerprints:
            fingerprints.add(fingerprint)
            alternatives.append(ruleset)
    if alternatives:
        why.append(f"rounds {_span(fitting)} fit: {picked}, if their verdicts agree")
    else:
        why.append(f"rounds {_span(fitting)} fit with the same rules: {picked}")
    return RulesetChoice(picked, "; ".join(why), tuple(alternatives))


def _span(rulesets: Sequence[str]) -> str:
    return ", ".join(rulesets) if len(rulesets) <= 3 else f"{rulesets[0]} ... {rulesets[-1]}"


def choose_ruleset(scan: logfile.LogScan) -> tuple[str, str]:
    """Picks a ruleset for a log: (ruleset, the reason), see `pick_ruleset`."""
    choice = pick_ruleset(scan)
    return choice.ruleset, choice.reason


def _validate_options(ruleset: str | None, quality: str, timeout: float) -> None:
    if ruleset is not None and ruleset not in available_rulesets():
        raise UserError(
            f"--ruleset {ruleset!r} is not a training ruleset of the official checker; choose one "
            f"of {', '.join(available_rulesets())}"
        )
    if quality not in QUALITY_MODES:
        raise UserError(f"--quality {quality!r} must be one of {', '.join(QUALITY_MODES)}")
    if not isinstance(timeout, int | float) or timeout <= 0:
        raise ValueError(f"`timeout` ({timeout!r}) must be a positive number of seconds.")


def _official_output(result: dict[str, Any]) -> list[str]:
    """The items the official command line prints for this result, in its order."""
    if result["crashed"]:
        return [f"TRACEBACK - {result['crashed']}"]
    items = []
    if result["parse_errors"]:
        items.append("WARNING - Found parsing errors:")
        for error in result["parse_errors"]:
            items += [f"WARNING - {error['line_text']}", f"WARNING - ^^  {error['error']}"]
    items += [f"WARNING - {message['text']}" for message in result["messages"]]
    if any(message["fatal"] for message in result["messages"]):
        items.append("ERROR - FAILED")
    return items


def _names_only_the_benchmark(text: str, benchmark: str) -> bool:
    """True for the official message that rejects `submission_benchmark`'s value (and only it)."""
    return C.SUBMISSION_BENCHMARK in text and f"'{benchmark}'" in text.replace('"', "'")


def _not_mlperf_finding(benchmark, ruleset, division, records) -> Finding:
    """What a log of a benchmark that no MLPerf round has (a plug-in's) is judged by.

    No round has rules for it, so it cannot be a closed-division result; as an open-division log
    the official checker runs the round's common rules (`common.yaml`, `open_common.yaml`:
    the event sequence, submission keys, `eval_accuracy` with `epoch_num`), skips the missing
    `open_<benchmark>.yaml`, and its one complaint about the benchmark's name is expected.
    """
    where = tuple(r.line for r in records if r.key == C.SUBMISSION_BENCHMARK)[:1]
    if division != "open":
        return Finding(
            ERROR,
            "suite",
            "division",
            f"'{benchmark}' is not an MLPerf benchmark (no round has rules for it), so its log "
            f"can only be an open-division log, but submission_division is {division!r}: run "
            "with --submission_division=open",
            where,
        )
    return Finding(
        INFO,
        "suite",
        "open",
        f"'{benchmark}' is not an MLPerf benchmark (no round has rules for it): judged as an "
        f"open-division log by round {ruleset}'s common rules; the rule file "
        f"open_{benchmark}.yaml does not exist and was skipped",
        where,
    )


def _official_findings(
    result: dict[str, Any],
    line_of: Sequence[int],
    quality: str,
    *,
    hide_crash: bool = False,
    foreign_benchmark: str | None = None,
    scaled: dict[str, str] | None = None,
) -> list[Finding]:
    """Turns the worker's result into findings with file line numbers.

    `hide_crash`: the caller already said why the checker crashed (a round without the log's
    benchmark: its rule file is missing), so the crash's traceback line is not repeated.
    `foreign_benchmark`: a benchmark that no round has; the official check of its name in
    `submission_benchmark` is expected to fail and becomes an info line.
    `scaled`: keys the run declares scaled down (`logged_scaled_settings`); under
    quality="skip" their failed CHECKs become one-line warnings saying so.
    """

    def lines(records: Sequence[int]) -> tuple[int, ...]:
        return tuple(line_of[n] for n in records if 0 <= n < len(line_of))

    findings = []
    if result["crashed"] and hide_crash:
        return findings
    if result["crashed"]:
        findings.append(
            Finding(
                ERROR,
                "official",
                "crash",
                f"the official checker crashed (verdict FAIL): {result['crashed']}",
            )
        )
        return findings
    for item in result["parse_errors"]:
        findings.append(
            Finding(
                ERROR,
                "official",
                "parse",
                f"line does not parse ({item['error']}): {item['line_text']}",
                lines([item["record"]]),
            )
        )
    for message in result["messages"]:
        findings.append(
            _message_finding(
                message["text"], lines(message["records"]), fatal=message["fatal"],
                quality=quality, foreign_benchmark=foreign_benchmark, scaled=scaled or {},
            )
        )  # fmt: skip
    return findings


def _message_finding(
    text: str,
    lines: tuple[int, ...],
    *,
    fatal: bool,
    quality: str,
    foreign_benchmark: str | None,
    scaled: dict[str, str],
) -> Finding:
    """One official checker message as a finding: a warning, an expected failure of a benchmark
    outside MLPerf (info), a scaled-down key's failed CHECK under quality="skip" (warning), the
    quality target (an error, or a warning under quality="skip"), or an error."""
    if not fatal:
        return Finding(WARNING, "official", "official", text, lines)
    if foreign_benchmark and _names_only_the_benchmark(text, foreign_benchmark):
        return Finding(
            INFO, "official", "benchmark", f"expected for a benchmark outside MLPerf: {text}", lines
        )
    if quality == "skip" and (match := _FAILED_CHECK.match(text)) and match.group(1) in scaled:
        test = _FAILED_TEST.search(text)
        rule = test.group(1).strip() if test else "its CHECK"
        return Finding(
            WARNING,
            "official",
            "scaled",
            f"{match.group(1)} scaled down by the run ({scaled[match.group(1)]}); the "
            f"closed rules want {rule} (ignored: --quality=skip)",
            lines,
        )
    if text.startswith(_ACCURACY_CHECK_MESSAGE):
        if quality == "skip":
            text = f"quality target not reached (ignored: --quality=skip): {text}"
        return Finding(WARNING if quality == "skip" else ERROR, "official", "target", text, lines)
    return Finding(ERROR, "official", "official", text, lines)


def check_log(
    path: str,
    *,
    ruleset: str | None = None,
    quality: str = "enforce",
    strict: bool = False,
    timeout: float = DEFAULT_TIMEOUT_S,
    max_log_bytes: int = logfile.DEFAULT_MAX_LOG_BYTES,
    max_line_bytes: int = logfile.DEFAULT_MAX_LINE_BYTES,
    runner: OfficialRunner | None = None,
) -> Report:
    """Checks one MLPerf log: the official verdict and messages, plus this suite's checks.

    Args:
      path: the log file.
      ruleset: the official ruleset, e.g. "0.7.0"; None picks one (see `choose_ruleset`).
      quality: "enforce"; or "skip" for runs whose target is not the MLPerf one (mini and smoke
        presets): a missed accuracy target is then reported as a warning and does not fail the log.
      strict: suite findings are errors (they are warnings by default).
      timeout: seconds the official checker may take.
      max_log_bytes: the most ':::MLL' log-line text to accept (see `logfile.scan_log`).
      max_line_bytes: the longest ':::MLL' line to accept (see `logfile.scan_log`).
      runner: the OfficialRunner to use (check_logs shares them); None starts one.

    Returns:
      The Report.

    Raises:
      UserError: bad arguments, a missing/unreadable path or a directory, a log or a line over
        the size limits, or a checker that timed out or ran out of memory; the message is one
        line.
    """
    _validate_options(ruleset, quality, timeout)
    if runner is None:
        # Started first: its child imports the official checker while this process reads the log.
        with OfficialRunner(in_process=True) as own_runner:
            return check_log(
                path,
                ruleset=ruleset,
                quality=quality,
                strict=strict,
                timeout=timeout,
                max_log_bytes=max_log_bytes,
                max_line_bytes=max_line_bytes,
                runner=own_runner,
            )
    scan = logfile.scan_log(path, max_log_bytes=max_log_bytes, max_line_bytes=max_line_bytes)
    if ruleset is None:
        choice = pick_ruleset(scan)
    else:
        choice = RulesetChoice(ruleset, "given")
    options = {"quality": quality, "strict": strict, "timeout": timeout}
    return _check_choice(scan, choice, runner, **options)


def _check_choice(scan, choice: RulesetChoice, runner, **options) -> Report:
    """Checks under the chosen ruleset; refuses to guess when an alternative's verdict differs.

    The chosen ruleset is checked last (`final`: the runner may run that check in this process).
    """
    others = [_judge(scan, r, choice.reason, runner, **options) for r in choice.alternatives]
    report = _judge(scan, choice.ruleset, choice.reason, runner, final=True, **options)
    if not choice.alternatives:
        return report
    differ = [other for other in others if other.passed != report.passed]
    if differ:
        verdicts = ", ".join(
            f"{r.ruleset} {'PASS' if r.passed else 'FAIL'}" for r in [report, *differ]
        )
        raise UserError(
            f"{scan.path}: cannot tell the round: {choice.reason}; their verdicts differ "
            f"({verdicts}): give --ruleset"
        )
    fitting = ", ".join([report.ruleset, *choice.alternatives])
    return dataclasses.replace(
        report, ruleset_reason=f"{choice.reason} (same verdict under {fitting})"
    )


def _closed_division_problem(records, ruleset, benchmark, division, no_rules) -> Finding | None:
    """A closed log whose settings the round's closed rules do not list (ResNet with K-FAC): the
    official checker would crash looking for a rule file of that optimizer; say the rule."""
    if division != "closed" or no_rules or not benchmark or ruleset == "0.6.0":
        return None
    opt_name = _first_value(records, "opt_name")
    if not isinstance(opt_name, str):
        return None
    problem = rounds.closed_division_problem(ruleset, benchmark, {"opt_name": opt_name})
    if problem is None:
        return None
    lines = tuple(r.line for r in records if r.key == "opt_name")[:1]
    return Finding(
        ERROR,
        "suite",
        "division",
        f"{problem}; log it with submission_division open (`mlperf-tf run` picks open by "
        "default for such runs)",
        lines,
    )


def _judge(scan, ruleset, reason, runner, *, quality, strict, timeout, final=False) -> Report:
    """The Report of one log under one ruleset."""
    records = logfile.parse_records(scan, ruleset)
    benchmark = _first_value(records, C.SUBMISSION_BENCHMARK)
    benchmark = benchmark if isinstance(benchmark, str) else None
    division = _first_value(records, C.SUBMISSION_DIVISION)
    first = _empty_log_findings(scan)
    no_rules, not_mlperf, rule_findings = _ruleset_findings(records, ruleset, benchmark, division)
    first += rule_findings
    closed_problem = _closed_division_problem(records, ruleset, benchmark, division, no_rules)
    if closed_problem:
        first.append(closed_problem)
    # The official check runs in another process while this one runs the suite's checks.
    wait_official = runner.submit(
        scan, ruleset, timeout=timeout, skip_missing_rules=not_mlperf, final=final
    )
    suite = suite_checks(
        records,
        benchmark=benchmark,
        ruleset=ruleset,
        target=_judged_target(scan, records, ruleset, benchmark, division, quality),
        quality=quality,
        strict=strict,
        resumed=logfile.suite_notes(scan, "resumed"),
    )
    result = wait_official()
    findings = first + _official_findings(
        result,
        scan.official_line_numbers(ruleset),
        quality,
        hide_crash=no_rules or closed_problem is not None,
        foreign_benchmark=benchmark if not_mlperf else None,
        scaled=logged_scaled_settings(scan),
    )
    findings += suite
    official_passed = not result["crashed"] and not any(m["fatal"] for m in result["messages"])
    return Report(
        path=scan.path,
        passed=not any(f.level == ERROR for f in findings),
        official_passed=official_passed,
        official_crashed=bool(result["crashed"]),
        benchmark=benchmark,
        ruleset=ruleset,
        ruleset_reason=reason,
        quality=quality,
        strict=strict,
        rule_files=tuple(result["configs"]),
        findings=tuple(findings),
        official_messages=tuple(_official_output(result)),
    )


def _empty_log_findings(scan) -> list[Finding]:
    """An error for an empty log, or one without a single MLPerf log line; else none."""
    if scan.size_bytes == 0:
        return [Finding(ERROR, "suite", "empty", "empty log (0 bytes)")]
    if not scan.lines:
        message = f"no MLPerf log line (':::MLLOG ...') in {scan.total_lines} line(s)"
        return [Finding(ERROR, "suite", "empty", message)]
    return []


def _ruleset_findings(records, ruleset: str, benchmark, division):
    """Whether the round has no rules for the log's benchmark (`no_rules`), whether no round
    has (`not_mlperf`: a benchmark outside MLPerf), and the finding that says which.

    Returns:
      (no_rules, not_mlperf, findings).
    """
    no_rules = (
        benchmark is not None
        and _NAME.match(benchmark) is not None
        and ruleset != "0.6.0"
        and not rounds.has_benchmark(ruleset, benchmark)
    )
    if not no_rules:
        return False, False, []
    have = [r for r in available_rulesets() if has_rules(r, benchmark)]
    if not have:
        return True, True, [_not_mlperf_finding(benchmark, ruleset, division, records)]
    finding = Finding(
        ERROR,
        "suite",
        "ruleset",
        f"round {ruleset} has no '{benchmark}' benchmark; rounds with it: {', '.join(have)}",
        tuple(r.line for r in records if r.key == C.SUBMISSION_BENCHMARK)[:1],
    )
    return True, False, [finding]


def _judged_target(scan, records, ruleset: str, benchmark, division, quality: str):
    """The quality target the suite's checks judge the run by: the rules' for its round,
    division and global batch; under quality="skip" the run's own logged target where it has
    one (skip is for runs aiming at their own target)."""
    global_batch_size = _first_value(records, C.GLOBAL_BATCH_SIZE)
    is_number = isinstance(global_batch_size, int | float) and not isinstance(
        global_batch_size, bool
    )
    target = quality_target(
        ruleset,
        benchmark,
        division=division if division in ("closed", "open") else "closed",
        global_batch_size=global_batch_size if is_number else None,
    )
    if quality == "skip":
        return logged_target(scan) or target
    return target


def check_logs(
    paths: Sequence[str],
    *,
    jobs: int = DEFAULT_JOBS,
    runner: OfficialRunner | None = None,
    **kwargs: Any,
) -> list[Report | UserError]:
    """Checks several logs, `jobs` at a time (each in its own checker process).

    Args:
      paths: the log files.
      jobs: how many checks run at once.
      runner: where the logs are checked one at a time (`jobs` 1 or a single log), the in-process
        OfficialRunner to use, e.g. one the CLI started before importing this module; None
        starts one.
      **kwargs: passed to `check_log`.

    Returns:
      One entry per path, in order: its Report, or the UserError that stopped its check.
    """
    if not isinstance(jobs, int) or jobs < 1:
        raise UserError(f"--jobs ({jobs!r}) must be a positive integer")

    paths = list(paths)

    def checked(path: str, runner: OfficialRunner) -> Report | UserError:
        try:
            return check_log(path, runner=runner, **kwargs)
        except UserError as error:
            return error

    if jobs == 1 or len(paths) <= 1:  # no threads: this process forks the checks itself
        if runner is not None:
            return [checked(path, runner) for path in paths]
        with OfficialRunner(in_process=True) as own_runner:
            return [checked(path, own_runner) for path in paths]
    if runner is not None:
        raise ValueError(f"`runner` is for checks made one at a time, not jobs={jobs}.")

    import concurrent.futures
    import queue

    runners: queue.SimpleQueue[OfficialRunner] = queue.SimpleQueue()
    started = [OfficialRunner() for _ in range(max(1, min(jobs, len(paths))))]
    for runner in started:
        runners.put(runner)

    def one(path: str) -> Report | UserError:
        runner = runners.get()
        try:
            return checked(path, runner)
        finally:
            runners.put(runner)

    try:
        with concurrent.futures.ThreadPoolExecutor(max_workers=len(started)) as pool:
            return list(pool.map(one, paths))
    finally:
        for runner in started:
            runner.close()
