"""Tests of the runner on the tiny benchmark: replica equivalence, XLA, non-finite loss, schedule."""

import dataclasses
import json

import keras
import numpy as np
import pytest
from mlperf_logging.mllog import constants as C

from mlperf_tf import config as config_lib
from mlperf_tf import runner
from tests.tiny_benchmark import TinyBenchmark, smoke, weights


def _run(tmp_path, name, cfg=None, **run_kwargs):
    benchmark = TinyBenchmark(cfg or smoke())
    run_config = runner.RunConfig(model_dir=str(tmp_path / name), steps_per_loop=3, **run_kwargs)
    return runner.run(benchmark, run_config)


def _log_lines(path):
    with open(path, encoding="utf-8") as f:
        return [json.loads(line.split(":::MLLOG ", 1)[1]) for line in f if ":::MLLOG" in line]


def test_two_replicas_equal_one_device_on_the_same_global_batch(tmp_path):
    one = _run(tmp_path, "one", distribution="one_device", max_train_steps=4)
    two = _run(tmp_path, "two", distribution="mirrored", num_cpu_devices=2, max_train_steps=4)
    assert one.steps == two.steps == 4
    for a, b in zip(weights(one.model), weights(two.model), strict=True):
        np.testing.assert_allclose(a, b, atol=1e-5, rtol=1e-5)
    # And the weights did move: equality is not the trivial "nothing trained".
    untrained = TinyBenchmark(smoke()).build_model()
    moved = [np.abs(a - b).max() for a, b in zip(weights(one.model), weights(untrained))]
    assert max(moved) > 1e-3


def test_gradient_accumulation_equals_the_full_batch(tmp_path):
    full = _run(tmp_path, "full", distribution="one_device", max_train_steps=3)
    accumulated_cfg = dataclasses.replace(smoke(), gradient_accumulation_steps=2)
    accumulated = _run(
        tmp_path, "acc", cfg=accumulated_cfg, distribution="one_device", max_train_steps=3
    )
    for a, b in zip(weights(full.model), weights(accumulated.model), strict=True):
        np.testing.assert_allclose(a, b, atol=1e-5, rtol=1e-5)


def test_train_step_compiles_with_xla(tmp_path):
    result = _run(tmp_path, "xla", distribution="one_device", xla=True, max_train_steps=2)
    assert result.steps == 2
    assert all(np.isfinite(w).all() for w in weights(result.model))


def test_non_finite_loss_aborts_with_a_clear_reason(tmp_path):
    cfg = config_lib.override(smoke(), {"learning_rate": "1e30"})
    result = _run(tmp_path, "nan", cfg=cfg, distribution="one_device")
    assert result.status == C.ABORTED
    assert "non-finite loss" in result.reason
    run_stop = [e for e in _log_lines(result.mlperf_log) if e["key"] == C.RUN_STOP]
    assert run_stop[-1]["metadata"]["status"] == C.ABORTED
    # No eval ran on the diverged weights: the block was closed and the run stopped.
    assert result.evals == []


def test_reaching_the_target_stops_with_success(tmp_path):
    cfg = dataclasses.replace(smoke(), quality_target=0.0, max_epochs=5)
    result = _run(tmp_path, "ok", cfg=cfg, distribution="one_device")
    assert result.status == C.SUCCESS
    assert len(result.evals) == 1  # stopped at the first eval, not at the budget
    assert result.steps == TinyBenchmark(cfg).steps_per_epoch


def test_log_has_the_full_event_sequence_in_order(tmp_path):
    result = _run(tmp_path, "log", distribution="one_device")
    keys = [e["key"] for e in _log_lines(result.mlperf_log)]
    required = [C.CACHE_CLEAR, C.INIT_START, C.SUBMISSION_BENCHMARK, C.SEED, C.GLOBAL_BATCH_SIZE,
                C.TRAIN_SAMPLES, C.EVAL_SAMPLES, C.INIT_STOP, C.RUN_START, C.BLOCK_START,
                C.BLOCK_STOP, C.EVAL_START, C.EVAL_ACCURACY, C.EVAL_STOP, C.RUN_STOP]  # fmt: skip
    positions = [keys.index(k) for k in required]
    assert positions == sorted(positions), keys
    for key in (C.SUBMISSION_ORG, C.SUBMISSION_PLATFORM, C.SUBMISSION_DIVISION,
                C.SUBMISSION_STATUS):  # fmt: skip
        assert keys.count(key) == 1
    # Two epochs, eval every epoch: two blocks with MLPerf's 1-based epoch numbering.
    blocks = [e["metadata"] for e in _log_lines(result.mlperf_log) if e["key"] == C.BLOCK_START]
    assert [(b["first_epoch_num"], b["epoch_count"]) for b in blocks] == [(1, 1), (2, 1)]


def test_restarted_run_keeps_the_previous_log(tmp_path):
    first = _run(tmp_path, "again", distribution="one_device", max_train_steps=2)
    with open(first.mlperf_log, encoding="utf-8") as f:
        first_text = f.read()
    _run(tmp_path, "again", distribution="one_device", max_train_steps=4)
    with open(first.mlperf_log + ".1", encoding="utf-8") as f:
        assert f.read() == first_text


def test_bad_run_settings_are_user_errors(tmp_path):
    from mlperf_tf.errors import UserError

    with pytest.raises(UserError, match="steps_per_loop"):
        runner.RunConfig(model_dir=str(tmp_path), steps_per_loop=0)
    with pytest.raises(UserError, match="model_dir"):
        runner.RunConfig(model_dir="")
    with pytest.raises(UserError, match="resume_input"):
        runner.RunConfig(model_dir=str(tmp_path), resume_input="rewind")


def test_global_norm_clipping_applies_to_the_summed_gradient(tmp_path, monkeypatch):
    # With a clip far below the gradient norm, SGD moves each weight by lr * clip * g/|g|: one
    # replica and two replicas (each clipping its own half would differ) end the same.
    monkeypatch.setattr(TinyBenchmark, "gradient_clip_norm", lambda self: 1e-3)
    one = _run(tmp_path, "one", distribution="one_device", max_train_steps=2)
    two = _run(tmp_path, "two", distribution="mirrored", num_cpu_devices=2, max_train_steps=2)
    for a, b in zip(weights(one.model), weights(two.model), strict=True):
        np.testing.assert_allclose(a, b, atol=1e-6, rtol=1e-5)
    keras.utils.set_random_seed(0)  # the runner's seed: the same initial weights
    initial = TinyBenchmark(smoke()).build_model()
    # Each step's gradient has global norm 1e-3 after clipping; with momentum 0.9 two steps of
    # SGD(lr) move the weights by at most lr * 1e-3 * (1 + 1.9) in global norm.
    moved = [a - b for a, b in zip(weights(one.model), weights(initial))]
    distance = np.sqrt(sum(float(np.sum(d**2)) for d in moved))
    assert 0.05 * 1e-3 * 0.9 < distance <= 0.05 * 1e-3 * 2.9 * (1 + 1e-4)


def test_grouped_cross_replica_batch_norm_trains_through_the_runner(tmp_path):
    # The forward pass all-reduces BN statistics in replica context: the runner must keep it in
    # the loop's graph (a nested tf.function refuses the merge_call).
    from benchmarks.resnet50 import config as resnet_config
    from benchmarks.resnet50.benchmark import ResNet50Benchmark

    cfg = config_lib.override(resnet_config.smoke(), {"model.bn_group_size": "2"})
    result = runner.run(
        ResNet50Benchmark(cfg),
        runner.RunConfig(
            model_dir=str(tmp_path),
            distribution="mirrored",
            num_cpu_devices=2,
            steps_per_loop=2,
            max_train_steps=2,
        ),  # fmt: skip
    )
    assert result.steps == 2
    spans = [e["value"] for e in _log_lines(result.mlperf_log) if e["key"] == C.MODEL_BN_SPAN]
    assert spans == [2 * cfg.global_batch_size // 2]
