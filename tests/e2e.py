"""Provides what the benchmarks' end-to-end tests share: reading MLPerf logs, running a mini preset
through the CLI, and checking a log with the official rules with the quality target set aside."""

import json
import os
import subprocess
import sys
import time

from compliance import checker

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def log_records(path) -> list[dict]:
    """The JSON records of an MLPerf log's `:::MLLOG` lines, in order."""
    with open(path, encoding="utf-8") as f:
        return [json.loads(line.split(":::MLLOG", 1)[1]) for line in f if ":::MLLOG" in line]


def run_mini(benchmark: str, tmp_path) -> tuple[str, float]:
    """Runs `mlperf-tf run --benchmark=B --preset=mini` in a subprocess with its data under tmp_path.

    Returns the MLPerf log path and the wall time in minutes (data preparation included).
    """
    env = dict(os.environ, MLPERF_TF_DATA=str(tmp_path / "data"), PYTHONPATH=REPO)
    model_dir = tmp_path / "run"
    begin = time.monotonic()
    subprocess.run(
        [sys.executable, "-m", "mlperf_tf.cli", "run", f"--benchmark={benchmark}",
         "--preset=mini", f"--model_dir={model_dir}"],
        check=True, env=env, cwd=REPO, timeout=3600,
    )  # fmt: skip
    return str(model_dir / "mlperf_log.txt"), (time.monotonic() - begin) / 60


def assert_official_pass(log_path, rulesets) -> None:
    """The stock official checker (its own command line) passes the log for every ruleset."""
    for ruleset in rulesets:
        official = subprocess.run(
            [sys.executable, "-m", "mlperf_logging.compliance_checker", "--usage", "training",
             "--ruleset", ruleset, str(log_path)],
            capture_output=True, text=True, timeout=300,
        )  # fmt: skip
        assert official.returncode == 0, official.stdout + official.stderr


def assert_passes_quality_aside(log_path, rulesets, rule_file: str | None = None):
    """`check --quality=skip` passes (loading `rule_file`, when given); the official verdict
    fails, if at all, only on the accuracy target (smoke runs train on random data).

    A ruleset of None lets the checker pick the round, as `mlperf-tf check` does. Returns the
    last ruleset's `checker.Report`.
    """
    report = None
    for ruleset in rulesets:
        report = checker.check_log(log_path, ruleset=ruleset, quality="skip")
        assert report.passed, (ruleset, [str(f) for f in report.errors])
        assert report.rule_files
        assert rule_file is None or any(rule_file in f for f in report.rule_files)
        assert not report.official_crashed
        failures = [m for m in report.official_messages if "ERROR" in m or "TRACEBACK" in m]
        assert all("eval_accuracy" in m or "FAILED" in m for m in failures), failures
    return report
