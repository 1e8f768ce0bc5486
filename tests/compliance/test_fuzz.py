"""Hypothesis fuzzing of the log-reading path, and of the whole check against the official CLI.

Examples: a few hundred by default; MLPERF_TF_FUZZ_EXAMPLES=10000 (or pytest --fuzz-examples=10000
once the root conftest defines it) runs a long fuzz.
"""

import json
import os
import subprocess
import tempfile
from unittest import mock

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from compliance import checker, logfile
from compliance.runner import stock_command
from compliance.suite_checks import suite_checks
from mlperf_tf.errors import UserError
from tests.compliance import logs
from tests.compliance.conftest import fuzz_examples

KEYS = [
    "run_start",
    "run_stop",
    "init_start",
    "init_stop",
    "block_start",
    "block_stop",
    "epoch_start",
    "epoch_stop",
    "eval_start",
    "eval_stop",
    "eval_accuracy",
    "submission_benchmark",
    "submission_division",
    "global_batch_size",
    "opt_name",
]

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=12)
    | st.sampled_from(["resnet", "bert", "ssd", "closed", "open", "../x", "success"]),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3)
    ),
    max_leaves=6,
)
metadata = st.dictionaries(
    st.sampled_from(["epoch_num", "first_epoch_num", "epoch_count", "status", "file"]),
    json_values,
    max_size=3,
)


@st.composite
def mllog_lines(draw):
    record = {
        "time_ms": draw(st.one_of(st.integers(-5, 2**45), st.floats(), st.text(max_size=5))),
        "key": draw(st.sampled_from(KEYS) | st.text(max_size=8)),
        "value": draw(json_values),
        "metadata": draw(metadata | json_values),
    }
    if draw(st.booleans()):
        del record[draw(st.sampled_from(sorted(record)))]
    prefix = draw(st.sampled_from(["", "[1,0]<stdout>:", "\ufeff", "x :::MLL "]))
    return prefix + ":::MLLOG " + json.dumps(record)


@st.composite
def v06_lines(draw):
    time = draw(st.sampled_from(["1.5", "0.0", "1.2.3", "", "1e9"]))
    key = draw(st.sampled_from(KEYS) | st.text(max_size=6))
    return f":::MLL {time} {key}: {json.dumps({'value': draw(json_values), 'metadata': draw(metadata)})}"


noise = st.text(max_size=60) | st.sampled_from(
    [":::MLL", ":::MLLOG ", ":::MLLOG {", ":::MLLOG {}", "\x00\x01", "\udcff"]
)
any_line = st.one_of(mllog_lines(), v06_lines(), noise)
line_ends = st.sampled_from(["\n", "\r\n", "\r"])


@st.composite
def log_bytes(draw):
    lines = draw(st.lists(st.tuples(any_line, line_ends), max_size=25))
    text = "".join(line + end for line, end in lines)
    if draw(st.booleans()):
        text = text[: draw(st.integers(0, len(text)))]  # cut anywhere, even mid-line
    data = text.encode("utf-8", "surrogateescape")
    if draw(st.booleans()):
        data += draw(st.binary(max_size=40))
    return data


def _official_reading(path):
    """The lines the official parser reads: Latin-1, universal newlines, those with ':::MLL'."""
    with open(path, encoding="latin-1") as handle:
        return [(n, line) for n, line in enumerate(handle, 1) if ":::MLL" in line]


@settings(
    max_examples=fuzz_examples(300),
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(
    data=log_bytes(),
    chunk=st.integers(1, 64),
    max_line=st.integers(10, 400),
    max_log=st.integers(10, 4000),
)
def test_reading_path_never_crashes_and_reads_what_the_official_parser_reads(
    data, chunk, max_line, max_log
):
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "log.txt")
        with open(path, "wb") as handle:
            handle.write(data)
        official = _official_reading(path)
        too_long = any(len(line.rstrip("\n")) > max_line for _, line in official)
        too_big = sum(len(line) for _, line in official) > max_log
        # Small read pieces: tokens and line ends get cut between pieces.
        with mock.patch.object(logfile, "_READ_CHUNK_CHARS", chunk):
            try:
                scan = logfile.scan_log(path, max_log_bytes=max_log, max_line_bytes=max_line)
            except UserError as error:
                assert too_long or too_big
                assert "\n" not in str(error)
                return
        assert not too_long and not too_big
        assert list(zip(scan.line_numbers, scan.lines)) == official
        assert len(scan.official_line_numbers("1.0.0")) == sum(
            ":::MLLOG " in line for _, line in official
        )
        ruleset, reason = checker.choose_ruleset(scan)
        assert ruleset in checker.available_rulesets() and reason
        for rules in ("0.6.0", "1.0.0"):
            records = logfile.parse_records(scan, rules)
            assert all(1 <= r.line <= scan.total_lines for r in records)
            for strict in (False, True):
                findings = suite_checks(
                    records, benchmark="resnet", ruleset=rules, target=None, strict=strict
                )
                assert all(f.level in ("error", "warning", "info") for f in findings)


@st.composite
def mutated_runs(draw):
    records = logs.resnet_records()
    for _ in range(draw(st.integers(1, 4))):
        action = draw(st.sampled_from(["drop", "duplicate", "swap", "value", "insert", "cut"]))
        i = draw(st.integers(0, len(records) - 1))
        if action == "drop" and len(records) > 1:
            records.pop(i)
        elif action == "duplicate":
            records.insert(i, records[i])
        elif action == "swap":
            j = draw(st.integers(0, len(records) - 1))
            records[i], records[j] = records[j], records[i]
        elif action == "value" and records[i].startswith(":::MLLOG "):
            try:  # an earlier mutation may have cut or replaced this line
                payload = json.loads(records[i][len(":::MLLOG ") :])
            except json.JSONDecodeError:
                continue
            if isinstance(payload, dict):
                payload["value"] = draw(json_values)
                records[i] = ":::MLLOG " + json.dumps(payload)
        elif action == "insert":
            records.insert(i, draw(any_line).replace("\n", " ").replace("\r", " "))
        elif action == "cut":
            records[i] = records[i][: draw(st.integers(0, len(records[i])))]
    return records


@settings(
    max_examples=max(5, fuzz_examples(300) // 25),
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(records=mutated_runs())
def test_verdict_equals_the_official_command_line_on_mutated_logs(records):
    """Our official verdict (on the token lines we hand over) is the stock CLI's on the file."""
    with tempfile.TemporaryDirectory() as tmp:
        path = logs.write_log(os.path.join(tmp, "log.txt"), records)
        try:
            report = checker.check_log(path, ruleset="1.0.0")
        except UserError as error:
            assert "\n" not in str(error)
            return
        done = subprocess.run(
            stock_command(path, "1.0.0", log_output=os.path.join(tmp, "cc.log")),
            capture_output=True,
            text=True,
            cwd=tmp,
            timeout=120,
        )
        assert report.official_passed == (done.returncode == 0), (records, done.stderr[-2000:])
        assert report.official_crashed == ("Traceback" in done.stderr)
