"""Tests of compliance.checker on small synthetic logs (no corpus needed)."""

import glob
import json
import os
import subprocess
import sys

import pytest
import yaml

from compliance import checker, logfile, official_worker
from compliance.cli import main as cli_main
from compliance.runner import stock_command
from mlperf_tf.errors import UserError
from tests.compliance import logs

WORKER = os.path.join(os.path.dirname(checker.__file__), "official_worker.py")


def _replace(records, key, value):
    out = []
    for record in records:
        if f'"key": "{key}"' in record:
            payload = json.loads(record[len(":::MLLOG ") :])
            payload["value"] = value
            record = ":::MLLOG " + json.dumps(payload)
        out.append(record)
    return out


@pytest.mark.parametrize("optimizer", ["sgd", "lars"])
@pytest.mark.parametrize("ruleset", ["0.7.0", "1.0.0"])
def test_synthetic_run_passes_the_official_rules(tmp_path, optimizer, ruleset):
    path = logs.write_log(tmp_path / "log.txt", logs.resnet_records(optimizer=optimizer))
    report = checker.check_log(path, ruleset=ruleset)
    assert report.passed and report.official_passed, report.format_text()
    assert report.benchmark == "resnet" and report.ruleset == ruleset
    assert f"training_{ruleset}/closed_resnet_{optimizer}.yaml" in report.rule_files
    assert report.findings == ()


def test_default_ruleset_is_named_with_its_reason(tmp_path):
    path = logs.write_log(tmp_path / "log.txt", logs.resnet_records())
    report = checker.check_log(path)
    assert report.ruleset == "1.0.0"  # a JSON resnet log dated 2020-09: the v1.0 round
    assert "2020-09-13" in report.ruleset_reason and "resnet" in report.ruleset_reason
    old = logs.write_log(tmp_path / "old.txt", logs.resnet_records(t0_ms=1_590_000_000_000))
    assert checker.check_log(old).ruleset == "0.7.0"  # dated 2020-05-20: the v0.7 round


def test_many_logs_in_one_call_give_the_verdicts_of_each_alone(tmp_path):
    """The official checker's module state leaks between logs checked in one interpreter.

    A crash while rule files are still queued leaves them in `enqueued_configs`: the next log
    checked in the same interpreter is then judged by the previous log's optimizer rules.
    """
    crashing = _replace(logs.resnet_records(optimizer="sgd"), "eval_accuracy", "0.8")
    crash_path = logs.write_log(tmp_path / "crash.txt", crashing)
    lars_path = logs.write_log(tmp_path / "lars.txt", logs.resnet_records(optimizer="lars"))
    alone = [checker.check_log(p, ruleset="0.7.0") for p in (crash_path, lars_path)]
    together = checker.check_logs([crash_path, lars_path, crash_path, lars_path], ruleset="0.7.0")
    assert [r.official_crashed for r in alone] == [True, False]
    assert [r.passed for r in alone] == [False, True]
    assert [(r.passed, r.official_crashed) for r in together] == 2 * [
        (r.passed, r.official_crashed) for r in alone
    ]
    # The same two logs checked naively, one after the other in one interpreter: the lars log
    # fails on the sgd rules left queued by the crash. This is what the isolation prevents.
    naive = subprocess.run(
        [
            sys.executable,
            "-c",
            "import json, runpy, sys; w = runpy.run_path(sys.argv[1]);"
            "results = [w['run'](p, '0.7.0') for p in sys.argv[2:]];"
            "print(json.dumps([bool(r['crashed']) or any(m['fatal'] for m in r['messages'])"
            " for r in results]))",
            WORKER,
            crash_path,
            lars_path,
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    assert json.loads(naive.stdout) == [True, True]  # lars log failed: state leaked


def test_new_interpreter_per_log_gives_the_same_results_as_the_fork_server(tmp_path):
    crashing = _replace(logs.resnet_records(optimizer="sgd"), "eval_accuracy", "0.8")
    paths = [
        logs.write_log(tmp_path / "crash.txt", crashing),
        logs.write_log(tmp_path / "lars.txt", logs.resnet_records(optimizer="lars")),
        logs.write_log(tmp_path / "low.txt", logs.resnet_records(accuracies=(0.5,))),
    ]
    results = {}
    for use_fork in (True, False):
        with checker.OfficialRunner(use_fork=use_fork) as runner:
            results[use_fork] = [
                runner.run(logfile.scan_log(p), "0.7.0", timeout=60) for p in paths
            ]
    assert results[True] == results[False]
    assert [bool(r["crashed"]) for r in results[True]] == [True, False, False]


_CHECK_HERE = """
import json, sys
from compliance import checker, runner
reports = []
with runner.OfficialRunner(in_process=True, final_check_here=True) as here:
    for path in sys.argv[3:]:
        try:
            reports.append(checker.check_log(path, ruleset=sys.argv[1],
                                             timeout=float(sys.argv[2]), runner=here).to_dict())
        except Exception as error:
            reports.append(repr(error))
print(json.dumps([reports, sorted(sys.modules)]))
"""


def test_a_check_run_in_the_commands_own_process_gives_the_forked_verdict(tmp_path):
    """`final_check_here`: the first log is checked in the (exiting) process itself.

    It crashes the checker and leaves rule files queued; the next log must still get the
    verdict it gets alone, so checks after it run in new interpreters, not in forks of a process
    that is no longer pristine.
    """
    crashing = _replace(logs.resnet_records(optimizer="sgd"), "eval_accuracy", "0.8")
    paths = [
        logs.write_log(tmp_path / "crash.txt", crashing),
        logs.write_log(tmp_path / "lars.txt", logs.resnet_records(optimizer="lars")),
        logs.write_log(tmp_path / "low.txt", logs.resnet_records(accuracies=(0.5,))),
    ]
    done = subprocess.run(
        [sys.executable, "-c", _CHECK_HERE, "0.7.0", "60", *paths],
        capture_output=True,
        text=True,
        check=True,
        timeout=300,
    )
    here, modules = json.loads(done.stdout)
    assert "mlperf_logging.compliance_checker.mlp_compliance" in modules  # checked here
    forked = [checker.check_log(p, ruleset="0.7.0").to_dict() for p in paths]
    assert here == forked
    assert [r["official_crashed"] for r in here] == [True, False, False]
    assert [r["passed"] for r in here] == [False, True, False]


def test_a_check_run_in_the_commands_own_process_keeps_its_time_limit(tmp_path):
    path = logs.write_log(tmp_path / "log.txt", logs.resnet_records())
    done = subprocess.run(
        [sys.executable, "-c", _CHECK_HERE, "1.0.0", "0.001", path],
        capture_output=True,
        text=True,
        check=True,
        timeout=300,
    )
    ((message,), _) = json.loads(done.stdout)
    assert "UserError" in message and "did not finish within 0.001 s" in message


def test_line_numbers_are_file_lines(tmp_path):
    records = _replace(logs.resnet_records(), "sgd_opt_end_learning_rate", 0.001)
    text = []
    for i, record in enumerate(records):
        text.append(f"noise line {i} without the token")
        text.append(f"[rank 0] {record}")  # a prefix the parser strips
    path = tmp_path / "log.txt"
    path.write_bytes(("\r\n".join(text) + "\r\n").encode())
    report = checker.check_log(str(path), ruleset="0.7.0")
    assert not report.passed
    (finding,) = report.errors
    assert "CHECK for 'sgd_opt_end_learning_rate' failed in line" in finding.message
    record_index = int(finding.message.split("failed in line ")[1].split(":")[0])
    assert finding.line == 2 * record_index + 2
    assert "sgd_opt_end_learning_rate" in text[finding.line - 1]


def test_repeated_key_warning_lists_every_occurrence(tmp_path):
    records = logs.resnet_records()
    records.insert(10, records[5])  # a second, identical submission line: a warning only
    path = logs.write_log(tmp_path / "log.txt", records)
    report = checker.check_log(path, ruleset="1.0.0")
    assert report.passed and report.official_passed
    (warning,) = [f for f in report.warnings if f.source == "official"]
    assert "Required EXACTLY_ONE occurrence of" in warning.message
    assert warning.lines == (6, 11)


@pytest.mark.parametrize("quality", ["enforce", "skip"])
def test_quality_skip_reports_the_missed_target_without_failing(tmp_path, quality):
    records = logs.resnet_records(accuracies=(0.3, 0.5, 0.6), status="aborted")
    path = logs.write_log(tmp_path / "log.txt", records)
    report = checker.check_log(path, ruleset="0.7.0", quality=quality)
    assert not report.official_passed
    target = [f for f in report.findings if f.check == "target"]
    assert len(target) == 1 and "0.7590" in target[0].message
    assert report.passed is (quality == "skip")
    assert target[0].level == ("warning" if quality == "skip" else "error")
    assert not [f for f in report.findings if f.check == "run_stop_status"]


@pytest.mark.parametrize("strict", [False, True])
@pytest.mark.parametrize("quality", ["enforce", "skip"])
def test_success_without_reaching_the_target_fails_in_every_mode(tmp_path, quality, strict):
    records = logs.resnet_records(accuracies=(0.3, 0.5, 0.6), status="success")
    path = logs.write_log(tmp_path / "log.txt", records)
    report = checker.check_log(path, ruleset="0.7.0", quality=quality, strict=strict)
    assert not report.passed
    (status,) = [f for f in report.findings if f.check == "run_stop_status"]
    assert status.level == "error" and "best 0.6" in status.message
    # The same run, honest about its status, passes with --quality=skip.
    honest = logs.write_log(
        tmp_path / "honest.txt", [r.replace('"success"', '"aborted"') for r in records]
    )
    assert checker.check_log(honest, ruleset="0.7.0", quality="skip", strict=strict).passed


def test_quality_skip_still_fails_other_errors(tmp_path):
    records = _replace(logs.resnet_records(accuracies=(0.3,)), "sgd_opt_momentum", None)
    records = [r for r in records if '"key": "model_bn_span"' not in r]
    path = logs.write_log(tmp_path / "log.txt", records)
    report = checker.check_log(path, ruleset="0.7.0", quality="skip")
    assert not report.passed
    assert any("model_bn_span" in f.message for f in report.errors)


def test_suite_findings_are_warnings_unless_strict(tmp_path):
    # Evals every 8 epochs: ResNet must evaluate every 4.
    path = logs.write_log(tmp_path / "log.txt", logs.resnet_records(epochs_per_eval=8))
    relaxed = checker.check_log(path, ruleset="1.0.0")
    strict = checker.check_log(path, ruleset="1.0.0", strict=True)
    assert relaxed.official_passed and strict.official_passed
    assert relaxed.passed and not strict.passed
    # The first eval (epoch 8) is late, and so is every next one (8 epochs apart).
    assert [f.check for f in relaxed.warnings] == ["eval_cadence", "eval_cadence"]
    assert [f.check for f in strict.errors] == ["eval_cadence", "eval_cadence"]
    assert "first evaluation at epoch 8" in relaxed.warnings[0].message


def test_a_log_without_run_stop_is_a_crashed_run(tmp_path):
    path = logs.write_log(tmp_path / "log.txt", logs.resnet_records(run_stop=False))
    report = checker.check_log(path, ruleset="1.0.0")
    assert not report.passed
    assert any("'run_stop' but found 0" in f.message for f in report.errors)
    (crashed,) = [f for f in report.warnings if f.check == "crashed_run"]
    assert "crashed" in crashed.message


def test_empty_and_garbage_files_get_a_verdict(tmp_path):
    empty = tmp_path / "empty.txt"
    empty.write_bytes(b"")
    garbage = tmp_path / "garbage.bin"
    garbage.write_bytes(bytes(range(256)) * 1000 + b":::MLLOG \x00\xff{\n" + os.urandom(10000))
    for path in (empty, garbage):
        report = checker.check_log(str(path))
        assert not report.passed and not report.official_passed
        assert report.format_text().startswith("FAIL")
    assert any("No log lines detected" in f.message for f in checker.check_log(str(empty)).errors)


def test_invalid_utf8_and_a_10mb_line_get_a_verdict(tmp_path):
    records = logs.resnet_records()
    path = tmp_path / "log.txt"
    with open(path, "wb") as handle:
        handle.write(b"\xff\xfe\xc3\x28 invalid UTF-8 before the log\n")
        handle.write(b"x" * (10 * 2**20) + b"\n")  # a 10 MB line without the token
        for record in records:
            handle.write(
                record.replace("tests", "t\xe9sts \udcff").encode("utf-8", "surrogateescape")
                + b"\n"
            )
        # A 10 KB record the rules do not know: parsed, and ignored.
        handle.write(logs.line("my_blob", "y" * 10_000, time_ms=logs.T0_MS).encode() + b"\n")
    report = checker.check_log(str(path), ruleset="1.0.0")
    assert report.passed, report.format_text()


def test_a_10mb_log_line_is_refused_with_one_line(tmp_path):
    """The official parser's time is quadratic in a line's length: a 10 MB record would hang it."""
    records = logs.resnet_records()
    records.insert(5, logs.line("my_blob", "y" * (10 * 2**20), time_ms=logs.T0_MS))
    path = logs.write_log(tmp_path / "log.txt", records)
    with pytest.raises(UserError, match=r"line 6 is a ':::MLL' log line longer than 16 KiB"):
        checker.check_log(path)


@pytest.mark.parametrize(
    "make, expected",
    [
        (lambda tmp: str(tmp), "is a directory"),
        (lambda tmp: str(tmp / "missing.txt"), "does not exist"),
    ],
)
def test_bad_paths_are_one_line_user_errors(tmp_path, make, expected):
    with pytest.raises(UserError, match=expected) as caught:
        checker.check_log(make(tmp_path))
    assert "\n" not in str(caught.value)


def test_bad_arguments_are_user_errors(tmp_path):
    path = logs.write_log(tmp_path / "log.txt", logs.resnet_records())
    with pytest.raises(UserError, match="not a training ruleset"):
        checker.check_log(path, ruleset="9.9.9")
    with pytest.raises(UserError, match="--quality"):
        checker.check_log(path, quality="maybe")


def test_timeout_is_a_one_line_error(tmp_path):
    path = logs.write_log(tmp_path / "log.txt", logs.resnet_records())
    with pytest.raises(UserError, match="did not finish within"):
        checker.check_log(path, ruleset="1.0.0", timeout=0.001)


def test_no_log_value_is_run_as_code(tmp_path):
    """Values are data: Python in them is not run, nor a rule file a value points to.

    The official rule files build rule-file names from log values; a division such as
    '../../x' makes the stock checker load (and execute the Python of) any YAML file on disk.
    """
    marker = tmp_path / "pwned"
    evil = tmp_path / "evil_common.yaml"
    evil.write_text(f"- BEGIN:\n    CODE: \"open({str(marker)!r}, 'w').write('x')\"\n")
    rules = checker.rules_dir()
    escape = os.path.relpath(str(tmp_path / "evil"), os.path.join(rules, "training_1.0.0"))
    records = logs.resnet_records()
    records = _replace(records, "submission_division", escape)
    records = _replace(
        records, "submission_org", "__import__('os').system('touch " + str(marker) + "')"
    )
    path = logs.write_log(tmp_path / "log.txt", records)
    report = checker.check_log(path, ruleset="1.0.0")
    assert not marker.exists()
    assert not report.passed
    assert any("outside the checker's package refused" in f.message for f in report.errors)
    # The stock command line on the same log does run the YAML's code: the guard is needed.
    subprocess.run(
        stock_command(path, "1.0.0", log_output=tmp_path / "cc.log"),
        capture_output=True,
        cwd=tmp_path,
        check=False,
    )
    assert marker.exists()


# Peak resident memory of this process since exec (VmHWM; ru_maxrss would include the pytest
# process it was forked from).
_PRINT_PEAK_MB = (
    "print(next(int(l.split()[1]) for l in open('/proc/self/status') if l.startswith('VmHWM'))"
    " // 1024)\n"
)
_needs_proc = pytest.mark.skipif(
    not os.path.exists("/proc/self/status"), reason="reads peak memory from /proc (Linux)"
)


def _lines_and_peak_mb(code: str, path) -> tuple[list[str], int]:
    """Runs `code` on `path` (sys.argv[1]) in a fresh Python from the repository; returns its
    printed lines but the last and that last one, the process's peak memory in MB."""
    done = subprocess.run(
        [sys.executable, "-c", code + _PRINT_PEAK_MB, str(path)],
        capture_output=True,
        text=True,
        check=True,
        cwd=os.path.dirname(os.path.dirname(checker.__file__)),
    )
    *lines, peak_mb = done.stdout.strip().splitlines()
    return lines, int(peak_mb)


@_needs_proc
def test_log_over_the_size_limit_is_refused_in_bounded_memory(tmp_path):
    """A 200 MB log of MLLOG lines: refused with one line, after reading only up to the limit."""
    path = tmp_path / "big.txt"
    record = logs.line("eval_accuracy", 0.5, time_ms=logs.T0_MS, metadata={"epoch_num": 1})
    block = ((record + "\n") * 1000).encode()
    with open(path, "wb") as handle:
        for _ in range(200 * 2**20 // len(block)):
            handle.write(block)
    assert path.stat().st_size > 190 * 2**20
    code = (
        "import sys\n"
        "from compliance.checker import check_log\n"
        "from mlperf_tf.errors import UserError\n"
        "try:\n"
        "    check_log(sys.argv[1])\n"
        "except UserError as error:\n"
        "    print(error)\n"
    )
    (message,), peak_mb = _lines_and_peak_mb(code, path)
    assert "more than 64 MiB of ':::MLL' log lines" in message
    assert peak_mb < 250  # the whole file as Python objects would take gigabytes


@_needs_proc
def test_big_log_of_noise_is_checked_in_bounded_memory(tmp_path):
    """200 MB of non-log output around a run: streamed past, the run's verdict given."""
    path = tmp_path / "big.txt"
    noise = (b"step 123 loss 0.1234 some framework chatter " * 23 + b"\n") * 1000
    records = logs.resnet_records()
    with open(path, "wb") as handle:
        for i in range(200 * 2**20 // len(noise)):
            if i % 20 == 0 and records:
                handle.write(records.pop(0).encode() + b"\n")
            handle.write(noise)
        for record in records:
            handle.write(record.encode() + b"\n")
    code = (
        "import sys\n"
        "from compliance.checker import check_log\n"
        "print(check_log(sys.argv[1], ruleset='1.0.0').passed)\n"
    )
    (passed,), peak_mb = _lines_and_peak_mb(code, path)
    assert passed == "True"
    assert peak_mb < 200


def test_scan_keeps_the_official_parsers_lines(tmp_path):
    path = tmp_path / "log.txt"
    path.write_bytes(b'a\r:::MLLOG {}\rb\n:::MLL 1.0 x: {}\r\nlast :::MLLOG {"k": 1}')
    scan = logfile.scan_log(str(path))
    with open(path, encoding="latin-1") as handle:
        official = [(n, line) for n, line in enumerate(handle, 1) if ":::MLL" in line]
    assert list(zip(scan.line_numbers, scan.lines)) == official
    assert scan.total_lines == 5
    assert scan.official_line_numbers("1.0.0") == (2, 5)
    assert scan.official_line_numbers("0.6.0") == (2, 4, 5)


def _yaml_target_expressions(path):
    import yaml

    with open(path) as handle:
        entries = yaml.load(handle, Loader=yaml.BaseLoader) or []
    return [
        entry["KEY"]["ATLEAST_ONE_CHECK"].strip()
        for entry in entries
        if isinstance(entry, dict)
        and isinstance(entry.get("KEY"), dict)
        and entry["KEY"].get("NAME") == "eval_accuracy"
        and "ATLEAST_ONE_CHECK" in entry["KEY"]
    ]


def test_targets_read_from_the_rule_text_equal_a_yaml_parse_of_every_rule_file():
    compared = 0
    for ruleset in checker.available_rulesets():
        if ruleset == "0.6.0":
            continue
        folder = os.path.join(checker.rules_dir(), f"training_{ruleset}")
        for name in sorted(os.listdir(folder)):
            division, _, rest = name.partition("_")
            if division not in ("closed", "open") or rest == "common.yaml":
                continue
            benchmark = rest[: -len(".yaml")]
            expressions = _yaml_target_expressions(os.path.join(folder, name))
            target = checker.quality_target(
                ruleset, benchmark, division=division, global_batch_size=1024
            )
            if not expressions:
                assert target is None, (ruleset, name)
                continue
            compared += 1
            assert target is None or target.expression == expressions[0], (ruleset, name)
    assert compared > 100
    resnet = checker.quality_target("4.0.0", "resnet")
    assert (resnet.value, resnet.higher_is_better) == (0.759, True)


def test_a_resumed_log_counts_only_with_its_first_run_start(tmp_path):
    records = logs.resnet_records()
    start_ms = json.loads(next(r for r in records if '"run_start"' in r)[len(":::MLLOG ") :])[
        "time_ms"
    ]
    honest = logs.write_log(
        tmp_path / "honest.txt",
        [f'# mlperf-tf resumed {{"step": 120, "original_run_start_ms": {start_ms}}}', *records],
    )
    report = checker.check_log(honest, ruleset="1.0.0")
    assert report.passed
    assert [(f.check, f.level, f.line) for f in report.notes] == [("resumed", "info", 1)]
    for mark in ('{"step": 120, "original_run_start_ms": null}', '{"step": 120}', "{oops"):
        path = logs.write_log(tmp_path / "resumed.txt", [f"# mlperf-tf resumed {mark}", *records])
        for quality in ("enforce", "skip"):
            report = checker.check_log(path, ruleset="1.0.0", quality=quality)
            assert report.official_passed and not report.passed  # the official rules cannot tell
            (error,) = report.errors
            assert error.check == "resumed" and error.line == 1
            assert "without the original run_start" in error.message


def _with_one_tensor(records):
    at = next(i for i, r in enumerate(records) if '"init_stop"' in r)
    time_ms = json.loads(records[at][len(":::MLLOG ") :])["time_ms"]
    tensor = logs.line(
        "weights_initialization", time_ms=time_ms, metadata={"tensor": "conv0_weight"}
    )
    return [*records[:at], tensor, *records[at:]]


def test_when_fitting_rounds_disagree_the_check_asks_for_the_ruleset(tmp_path):
    # weights_initialization with one tensor: rounds 1.1.0-2.1.0 want all 161 of them, the others
    # ignore the key; dated after every round, the log fits them all.
    late = logs.write_log(
        tmp_path / "late.txt", _with_one_tensor(logs.resnet_records(t0_ms=1_800_000_000_000))
    )
    with pytest.raises(UserError, match=r"cannot tell the round.*verdicts differ.*give --ruleset"):
        checker.check_log(late)
    assert cli_main(["check", late]) == 2
    assert checker.check_log(late, ruleset="4.0.0").passed
    assert not checker.check_log(late, ruleset="2.0.0").passed
    # Dated in the v1.1 window (2021-09), the round is 1.1.0: no guess, its verdict.
    dated = logs.write_log(
        tmp_path / "dated.txt", _with_one_tensor(logs.resnet_records(t0_ms=1_631_000_000_000))
    )
    report = checker.check_log(dated)
    assert report.ruleset == "1.1.0" and not report.passed
    assert "submission window" in report.ruleset_reason
    # Without the key the log fits the rounds that do not ask for it, whose verdicts agree.
    plain = logs.write_log(tmp_path / "plain.txt", logs.resnet_records(t0_ms=1_800_000_000_000))
    report = checker.check_log(plain)
    assert report.ruleset == "4.0.0" and report.passed
    assert "same verdict under" in report.ruleset_reason


def test_a_round_without_the_benchmark_and_an_empty_log_say_so_first(tmp_path):
    transformer = [
        r.replace('"value": "resnet"', '"value": "transformer"') for r in logs.resnet_records()
    ]
    path = logs.write_log(tmp_path / "transformer.txt", transformer)
    report = checker.check_log(path, ruleset="1.0.0")
    assert not report.passed and report.official_crashed
    first = report.errors[0]
    assert first.check == "ruleset"
    assert first.message == (
        "round 1.0.0 has no 'transformer' benchmark; rounds with it: 0.6.0, 0.7.0"
    )
    assert not any("FileNotFoundError" in f.message for f in report.findings)
    empty = tmp_path / "empty.txt"
    empty.write_text("")
    report = checker.check_log(str(empty))
    assert report.errors[0].check == "empty" and report.errors[0].message == "empty log (0 bytes)"
    text = tmp_path / "text.txt"
    text.write_text("hello\nworld\n")
    assert checker.check_log(str(text)).errors[0].message.startswith("no MLPerf log line")


@pytest.mark.parametrize("division", ["open", "closed"])
def test_a_benchmark_no_round_has_is_judged_as_an_open_division_log(tmp_path, division):
    """A plug-in's log (here 'effnet'): the round's common rules run without crashing, the name
    check is expected, and only the open division is possible."""
    records = [
        r.replace('"value": "resnet"', '"value": "effnet"').replace(
            '"value": "closed"', f'"value": "{division}"'
        )
        for r in logs.resnet_records()
    ]
    path = logs.write_log(tmp_path / "effnet.txt", records)
    report = checker.check_log(path, ruleset="1.0.0")
    assert not report.official_crashed
    assert report.rule_files == (
        "training_1.0.0/common.yaml",
        f"training_1.0.0/{division}_common.yaml",
    )
    assert "not an MLPerf benchmark" in report.findings[0].message
    assert report.passed == (division == "open"), [str(f) for f in report.errors]
    # A structural fault is still caught by the official common rules.
    broken = logs.write_log(
        tmp_path / "broken.txt", [r for r in records if '"key": "run_start"' not in r]
    )
    assert not checker.check_log(broken, ruleset="1.0.0").passed


def _loaded(load, path, loader):
    """The document as JSON (key order included), or the error as the checker would report it."""
    with open(path) as handle:
        try:
            return json.dumps(load(handle, Loader=loader))
        except Exception as error:  # noqa: BLE001 - compared, not hidden
            return f"{type(error).__name__}: {error}"


@pytest.mark.skipif(not hasattr(yaml, "CBaseLoader"), reason="PyYAML without libyaml")
def test_the_worker_reads_every_installed_rule_file_as_the_checker_does():
    """The worker has the checker parse its rule files with CBaseLoader instead of BaseLoader."""
    paths = sorted(glob.glob(os.path.join(checker.rules_dir(), "*", "*.yaml")))
    assert len(paths) > 100
    broken = 0
    for path in paths:
        official = _loaded(yaml.load, path, yaml.BaseLoader)
        assert _loaded(official_worker.load_yaml, path, yaml.BaseLoader) == official, path
        broken += official.startswith(("ParserError", "ScannerError"))
    assert broken >= 1  # e.g. training_0.7.0_warn/bert.yaml: the error path is compared too


_NATIVE_THREADS = """
import json, threading
from compliance import runner
alone = runner.single_threaded()
import tensorflow as tf
tf.constant(1.0) + 1.0  # TensorFlow's native thread pools start; Python sees no new thread
python_threads = threading.active_count()
with runner.OfficialRunner(in_process=True) as official:
    print(json.dumps([alone, python_threads, runner.single_threaded(), official._standby is None]))
"""


def test_a_process_with_native_threads_never_forks_the_checker():
    """A fork of a process with native threads is unsound (the full suite once saw the forked
    checker fail with "SystemError: error return without exception set" after TensorFlow was
    imported): such a process checks through a fresh server interpreter instead."""
    done = subprocess.run(
        [sys.executable, "-c", _NATIVE_THREADS],
        capture_output=True,
        text=True,
        check=True,
        timeout=300,
    )
    alone, python_threads, single, no_standby = json.loads(done.stdout.splitlines()[-1])
    assert alone and python_threads == 1  # Python's own count cannot tell the two apart
    assert not single and no_standby


def test_the_checks_address_space_limit_is_counted_beyond_what_the_process_maps():
    """A fork starts with its parent's mappings; the backstop must leave the check its own room."""
    with open("/proc/self/statm") as statm:
        mapped = int(statm.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
    limit = official_worker.address_space_limit(1 << 30)
    assert limit - (1 << 30) >= mapped * 0.9  # what is mapped now (it may grow a little)
    assert limit - (1 << 30) <= mapped * 1.1 + (64 << 20)


@pytest.mark.parametrize("optimizer", ["kfac", "nlcg", "neumann"])
def test_a_closed_log_with_an_optimizer_the_rules_forbid_is_explained_not_a_crash(
    tmp_path, optimizer
):
    """closed_resnet.yaml allows opt_name sgd or lars and then loads closed_resnet_<opt>.yaml,
    which does not exist for K-FAC: the verdict stays FAIL, the reason is the rule."""
    records = _replace(logs.resnet_records(optimizer="sgd"), "opt_name", optimizer)
    report = checker.check_log(logs.write_log(tmp_path / "log.txt", records), ruleset="1.0.0")
    assert not report.passed
    (finding,) = [f for f in report.errors if f.check == "division"]
    assert f"not '{optimizer}'" in finding.message and "open division" in finding.message
    assert "'sgd' or 'lars'" in finding.message
    assert not any("crashed" in f.message for f in report.errors), report.format_text()
    # The same log in the open division has no such finding.
    records = _replace(records, "submission_division", "open")
    report = checker.check_log(logs.write_log(tmp_path / "open.txt", records), ruleset="1.0.0")
    assert not [f for f in report.findings if f.check == "division"]
