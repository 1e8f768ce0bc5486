"""Provides what the benchmarks' end-to-end tests share: reading MLPerf logs, running a mini preset
through the CLI to success, a run with gradient accumulation, and checking a log with the official
rules with the quality target set aside."""

import json
import os
import subprocess
import sys
import time

from mlperf_logging.mllog import constants as C

from compliance import checker
from compliance.runner import stock_command

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def log_records(path) -> list[dict]:
    """The JSON records of an MLPerf log's `:::MLLOG` lines, in order."""
    with open(path, encoding="utf-8") as f:
        return [json.loads(line.split(":::MLLOG", 1)[1]) for line in f if ":::MLLOG" in line]


def run_mini(benchmark: str, tmp_path, timeout_s: float = 3600) -> tuple[str, float]:
    """Runs `mlperf-tf run --benchmark=B --preset=mini` in a subprocess with its data under tmp_path
    (killed after `timeout_s`).

    Returns the MLPerf log path and the wall time in minutes (data preparation included).
    """
    env = dict(os.environ, MLPERF_TF_DATA=str(tmp_path / "data"), PYTHONPATH=REPO)
    model_dir = tmp_path / "run"
    begin = time.monotonic()
    subprocess.run(
        [sys.executable, "-m", "mlperf_tf.cli", "run", f"--benchmark={benchmark}",
         "--preset=mini", f"--model_dir={model_dir}"],
        check=True, env=env, cwd=REPO, timeout=timeout_s,
    )  # fmt: skip
    return str(model_dir / "mlperf_log.txt"), (time.monotonic() - begin) / 60


def run_mini_to_success(
    benchmark: str, tmp_path, timeout_s: float = 3600
) -> tuple[str, float, list]:
    """`run_mini`, asserting that the run stopped with status success.

    Returns the MLPerf log path, the wall time in minutes and the `eval_accuracy` values in order.
    """
    log, minutes = run_mini(benchmark, tmp_path, timeout_s)
    records = log_records(log)
    stops = [r for r in records if r["key"] == C.RUN_STOP]
    assert stops[0]["metadata"][C.STATUS] == C.SUCCESS, stops
    return log, minutes, [r["value"] for r in records if r["key"] == C.EVAL_ACCURACY]


def assert_accumulation_logged(benchmark, tmp_path, **run_settings) -> None:
    """Runs `benchmark` (a smoke config) with two micro batches a step over 16 examples; asserts
    the runner accumulated (2 steps of the 8-sequence batch) and logged it."""
    import dataclasses  # noqa: PLC0415

    from mlperf_tf import runner  # noqa: PLC0415

    config = dataclasses.replace(benchmark.config, gradient_accumulation_steps=2, train_examples=16)
    result = runner.run(
        type(benchmark)(config),
        runner.RunConfig(model_dir=str(tmp_path), distribution="one_device", **run_settings),
    )
    values = {line["key"]: line["value"] for line in log_records(result.mlperf_log)}
    assert values[C.GRADIENT_ACCUMULATION_STEPS] == 2
    assert result.steps == 2


def run_two_steps_on_two_replicas(benchmark, tmp_path, **run_settings):
    """Runs `benchmark` through the runner for 2 steps (one loop) on 2 mirrored logical CPUs
    with `run_settings`; returns the runner's result (its log at `result.mlperf_log`)."""
    from mlperf_tf import runner  # noqa: PLC0415

    return runner.run(
        benchmark,
        runner.RunConfig(
            model_dir=str(tmp_path), distribution="mirrored", num_cpu_devices=2, steps_per_loop=2,
            max_train_steps=2, **run_settings,
        ),
    )  # fmt: skip


def assert_official_pass(log_path, rulesets) -> None:
    """The stock official checker (its own command line) passes the log for every ruleset."""
    for ruleset in rulesets:
        official = subprocess.run(
            stock_command(log_path, ruleset), capture_output=True, text=True, timeout=300
        )
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
