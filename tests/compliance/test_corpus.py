"""The checker against the official verdicts recorded for the real-log corpus (../shared).

Needs ../shared/compliance-corpus (skipped without it); with it, runs in CI.
"""

import json
import re

import pytest

from compliance import checker, logfile


def _normalize(item: str) -> str:
    # The recorded items are trimmed.
    item = "\n".join(line.rstrip() for line in item.split("\n")).strip()
    # The recorded messages were normalized this way (corpus README): the checker builds these two
    # kinds from Python sets, so their order changes from run to run.
    item = re.sub(
        r"((?:'[^']*' or )+'[^']*')",
        lambda m: " or ".join(sorted(m.group(1).split(" or "))),
        item,
    )
    item = re.sub(
        r"with different values: \[([^\]]*)\]",
        lambda m: "with different values: [" + ", ".join(sorted(m.group(1).split(", "))) + "]",
        item,
    )
    # Crash messages name the checker's install folder.
    return re.sub(r"'[^']*/mlperf_logging/", "'.../mlperf_logging/", item)


def test_verdict_equals_official_on_every_corpus_file(corpus_rows, corpus_reports):
    assert len(corpus_rows) == 122
    mismatches = [
        (row["path"], row["official_pass"], report.passed)
        for row, report in zip(corpus_rows, corpus_reports)
        if report.passed != row["official_pass"] or report.official_passed != row["official_pass"]
    ]
    assert mismatches == []
    # Both verdicts occur, in real and in mutated logs: the comparison can fail either way.
    assert {(row["kind"], row["official_pass"]) for row in corpus_rows} == {
        ("real", True),
        ("real", False),
        ("mutated", True),
        ("mutated", False),
    }


def test_crashes_of_the_official_checker_are_reported_as_failures(corpus_rows, corpus_reports):
    # The README names 4 crashing files; 3 of them are in this corpus (the BERT
    # missing_time_ms_one_line file is not).
    crashed = {row["path"] for row in corpus_rows if row["official_crashed"]}
    reported = {
        row["path"] for row, report in zip(corpus_rows, corpus_reports) if report.official_crashed
    }
    assert len(crashed) >= 3 and reported == crashed
    for row, report in zip(corpus_rows, corpus_reports):
        if row["path"] in crashed:
            assert not report.passed
            checks = [f.check for f in report.errors]
            if "opt_name" in row["path"]:
                # A closed log whose optimizer the closed rules do not list makes the official
                # checker look for a missing rule file: the suite names the rule instead (issue 31).
                assert checks == ["division"]
                assert "open division" in report.errors[0].message
            else:
                assert checks == ["crash"]


def test_every_official_message_is_reported(corpus_rows, corpus_reports):
    """Our official items, normalized as the corpus README says, equal the recorded ones."""
    differences = []
    for row, report in zip(corpus_rows, corpus_reports):
        ours = sorted({_normalize(item) for item in report.official_messages})
        recorded = sorted({_normalize(item) for item in row["official_messages_normalized"]})
        if ours != recorded:
            differences.append((row["path"], set(ours) ^ set(recorded)))
    assert differences == []


def test_warnings_only_logs_pass_with_their_warnings(corpus_rows, corpus_reports):
    warned = 0
    for row, report in zip(corpus_rows, corpus_reports):
        official_warnings = [f for f in report.warnings if f.source == "official"]
        if row["official_pass"] and official_warnings:
            warned += 1
            for finding in official_warnings:
                assert re.fullmatch(
                    r"Required EXACTLY_ONE occurrence of '\w+' but found \d+", finding.message
                )
                assert len(finding.lines) >= 2  # the repeated lines, in the file
    assert warned >= 3


def test_line_numbers_point_at_the_quoted_line(corpus_rows, corpus_reports):
    """ "CHECK ... failed in line N" counts records; our line is the file line that holds it."""
    checked = 0
    for row, report in zip(corpus_rows, corpus_reports):
        with open(report.path, encoding="latin-1") as handle:
            file_lines = handle.read().splitlines()
        for finding in report.findings:
            if finding.source != "official" or finding.line is None:
                continue
            quoted = finding.message.split("\n")[1] if "failed in line" in finding.message else None
            if finding.check == "parse":
                quoted = finding.message.split("): ", 1)[1]
            if quoted:
                assert quoted.strip() in file_lines[finding.line - 1], (row["path"], finding)
                checked += 1
    assert checked > 20


def test_default_ruleset_is_the_recorded_one(corpus_dir, corpus_rows):
    for row in corpus_rows:
        scan = logfile.scan_log(str(corpus_dir / row["path"]))
        if logfile.guess_format(scan) is None:
            continue  # e.g. Alibaba's v0.6 "log": no MLPerf line at all
        ruleset, reason = checker.choose_ruleset(scan)
        assert ruleset == row["ruleset"], (row["path"], reason)


def test_quality_skip_passes_logs_that_miss_the_target_and_say_so(corpus_dir, corpus_rows):
    only_target = []
    for row in corpus_rows:
        items = [m for m in row["official_messages_normalized"] if m != "ERROR - FAILED"]
        if items and all(m.startswith("WARNING - Failed checks for eval_accuracy") for m in items):
            only_target.append(row)
    assert len(only_target) >= 5
    paths = [str(corpus_dir / row["path"]) for row in only_target]
    outcomes = set()
    for row, report in zip(only_target, checker.check_logs(paths, quality="skip")):
        assert report.ruleset == row["ruleset"]
        assert not report.official_passed, row["path"]
        assert [f.check for f in report.warnings if f.source == "official"] == ["target"]
        # Skip is for runs that missed the target and say so; a claimed success still fails.
        records = logfile.parse_records(logfile.scan_log(report.path), report.ruleset)
        status = next(r.metadata.get("status") for r in records if r.key == "run_stop")
        assert report.passed is (status != "success"), row["path"]
        if status == "success":
            assert [f.check for f in report.errors] == ["run_stop_status"]
        outcomes.add(report.passed)
    assert outcomes == {True, False}  # both kinds are in the corpus


@pytest.mark.parametrize("strict", [False, True])
def test_strict_keeps_what_published_logs_do_legitimately_as_warnings(corpus_dir, strict):
    # A published, officially passing log whose evals are logged out of order (async eval).
    path = corpus_dir / "real/1.0.0/ssd/Google_tpu-v4-4096-TF_result_3.txt"
    report = checker.check_log(str(path), strict=strict)
    assert report.official_passed
    suite = [f for f in report.findings if f.source == "suite" and f.level != "info"]
    assert {f.check for f in suite} >= {"monotonic", "pairing"}
    assert report.passed
    assert all(f.level == "warning" for f in suite)


def test_strict_has_no_false_alarm_on_published_logs(corpus_dir, corpus_rows):
    """--strict passes every real log (v0.6-v5.0) that the official checker passes."""
    rows = [(corpus_dir, row) for row in corpus_rows]
    modern = corpus_dir / "modern" / "verdicts.jsonl"
    if modern.is_file():
        with open(modern) as handle:
            rows += [(corpus_dir / "modern", json.loads(line)) for line in handle]
    chosen = [
        (str(folder / row["path"]), row["ruleset"])
        for folder, row in rows
        if row["path"].startswith("real/")
        and row.get("official_pass", row.get("official") == "pass")
    ]
    assert len(chosen) >= 80
    alarms = []
    with checker.OfficialRunner() as runner:
        for path, ruleset in chosen:
            report = checker.check_log(path, ruleset=ruleset, strict=True, runner=runner)
            if not report.passed:
                alarms.append((path, [f.message for f in report.errors]))
    assert alarms == []
