"""The dlrmv4 mini acceptance run (slow). The smoke-run checks every benchmark shares are in
tests/benchmarks/test_contract.py."""

import pytest
from mlperf_logging.mllog import constants as C

from benchmarks.dlrmv4 import config as config_lib
from compliance import checker
from tests import e2e


@pytest.mark.slow
def test_mini_evaluates_on_the_rules_grid_and_the_checker_fails_only_the_data_sets_size(tmp_path):
    """`mlperf-tf run --benchmark=dlrmv4 --preset=mini` (minutes): the rules' target AUC 0.75
    (above the item-popularity baseline's 0.68 on the same eval window,
    `prepare.prepare_mini`), evals every 0.1 % of the mini's 16,384,000-sample stream (the
    rules' `eval_every_data_pct`, logged as such) with `samples_count`, and a 6.1.0 check
    whose official failures are only those that follow the data set's size: `train_samples`,
    `eval_samples`, `max_sequence_length` and `eval_accuracy`'s grid (the rules compute it, and
    the first eval, from the 2.29 B stream's size; the official checker keeps the last
    eval's message of a key) — never the eval cadence, the learning rate, its band or the
    warm-up (the rules' own)."""
    log, minutes = e2e.run_mini("dlrmv4", tmp_path)
    records = e2e.log_records(log)
    hparams = {r["key"]: r["value"] for r in records}
    assert hparams[C.EVAL_EVERY_DATA_PCT] == config_lib.EVAL_EVERY_DATA_PCT == 0.001
    stream = hparams[C.TRAIN_SAMPLES]
    assert stream == config_lib.MINI_TRAIN_SAMPLES == 16_384_000
    evals = [r for r in records if r["key"] == C.EVAL_ACCURACY]
    counts = [r["metadata"]["samples_count"] for r in evals]
    interval = round(0.001 * stream)  # 128 whole steps of 128
    assert counts == list(range(config_lib.MINI_FIRST_EVAL_SAMPLES, counts[-1] + 1, interval))
    values = [r["value"] for r in evals]
    assert values[-1] >= config_lib.MINI_TARGET_AUC == config_lib.TARGET_AUC > 0.69
    stops = [r for r in records if r["key"] == C.RUN_STOP]
    assert stops[0]["metadata"][C.STATUS] == C.SUCCESS
    report = checker.check_log(log, ruleset="6.1.0", quality="skip")
    assert report.passed, report.format_text()
    official = [f for f in report.findings if f.source == "official"]
    assert {f.check for f in official} == {"scaled"}, report.format_text()
    failed = {f.message.split(" ")[0] for f in official}
    assert failed == {C.TRAIN_SAMPLES, C.EVAL_SAMPLES, C.MAX_SEQUENCE_LENGTH, C.EVAL_ACCURACY}
    (grid,) = [f.message for f in official if f.message.startswith(C.EVAL_ACCURACY)]
    assert "% s['eval_interval_samples'] == 0" in grid
    assert hparams[C.OPT_BASE_LR] == pytest.approx(1e-6 * 128 / 8192, rel=1e-9)
    assert hparams[C.OPT_LR_WARMUP_STEPS] == 24_000
    print(f"dlrmv4 mini: {minutes:.1f} min, AUC {values} at {counts}")
