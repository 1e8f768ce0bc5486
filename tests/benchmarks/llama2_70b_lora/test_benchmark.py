"""Tests of the llama2_70b_lora benchmark: the eval schedule with the reference's skipped evals,
the RCP learning rates, the log keys every round requires, the loss over summary tokens only, and
the smoke run end to end with the official checker."""

import dataclasses

import numpy as np
import pytest
import tensorflow as tf
from mlperf_logging.mllog import constants as C

from benchmarks.llama2_70b_lora import config as config_lib
from benchmarks.llama2_70b_lora import input as input_lib
from benchmarks.llama2_70b_lora.benchmark import LoraBenchmark
from compliance import checker
from mlperf_tf import rounds, runner
from tests import e2e


def _bench(batch=8, **kwargs):
    config = dataclasses.replace(config_lib.mlperf(), global_batch_size=batch,
                                 train_examples=config_lib.MAX_STEPS * batch, **kwargs)  # fmt: skip
    return LoraBenchmark(config)


@pytest.mark.parametrize("batch, first, skipped", [(8, 1536, 3), (16, 1920, 4), (128, 7296, 18)])
def test_first_eval_after_the_reference_delay(batch, first, skipped):
    """Every 384 samples, the first int(0.125 gbs + 2) skipped (the NVIDIA 5.1 log at batch 8:
    first eval_accuracy at samples_count 1536)."""
    points = _bench(batch).eval_schedule()
    assert config_lib.reference_skipped_evals(batch) == skipped
    assert points[0].samples_count == first
    assert points[0].first_epoch_num == 0 and points[0].epoch_count == first
    gaps = {b.samples_count - a.samples_count for a, b in zip(points[:-2], points[1:-1])}
    assert gaps == {max(384, batch * -(-384 // batch))}
    assert points[-1].step == config_lib.MAX_STEPS


@pytest.mark.parametrize("batch, lr", [(8, 4e-4), (16, 4e-4), (32, 4e-4), (128, 1e-3)])
def test_learning_rate_from_the_rcps(batch, lr):
    assert _bench(batch).learning_rate() == lr


def test_batch_without_rcp_is_one_line():
    with pytest.raises(config_lib.ConfigError, match=r"`global_batch_size` \(64\) has no"):
        _bench(64).learning_rate()


def test_schedule_is_cosine_to_zero_without_warmup():
    schedule = _bench().learning_rate_schedule()
    lr = [float(schedule(s)) for s in (0, 512, 1023, 1024)]
    np.testing.assert_allclose(lr[:2], [4e-4, 2e-4], rtol=1e-6)
    assert 0 < lr[2] < 1e-8 and lr[3] == 0


def test_hparams_cover_every_required_key():
    bench = _bench()
    logged_by_runner = {C.GLOBAL_BATCH_SIZE, C.GRADIENT_ACCUMULATION_STEPS, C.TRAIN_SAMPLES,
                        C.EVAL_SAMPLES, C.SEED}  # fmt: skip
    hparams = {**bench.mlperf_hparams(), **bench.round_hparams()}  # the latter: the runner's
    assert hparams["lora_rank"] == 16 and hparams[C.LORA_ALPHA] == 32
    assert hparams[C.OPT_LR_TRAINING_STEPS] == 1024 and hparams[C.OPT_GRADIENT_CLIP_NORM] == 0.3
    for ruleset in bench.supported_rounds():
        required = rounds.required_keys(ruleset, "llama2_70b_lora")
        events = {k for k in required if k.endswith(("_start", "_stop", "_accuracy"))}
        missing = required - set(hparams) - logged_by_runner - events - {
            C.SUBMISSION_BENCHMARK, C.SUBMISSION_DIVISION, C.SUBMISSION_ORG,
            C.SUBMISSION_PLATFORM, C.SUBMISSION_STATUS, C.CACHE_CLEAR, "target_accuracy",
        }  # fmt: skip
        assert not missing, (ruleset, missing)


def test_loss_counts_summary_tokens_only():
    """Two sequences: the loss is the mean of their per-sequence means over unmasked labels;
    changing a prompt position's label (masked) changes nothing."""
    bench = LoraBenchmark(config_lib.smoke())
    logits = tf.constant(np.random.default_rng(0).normal(size=(2, 6, 5)), tf.float32)

    class Fixed:
        axis = None

        def __call__(self, ids, training=False, aux=None):
            return logits

    labels = np.array([[-100, -100, 1, 2, 3, -100], [-100, 4, -100, -100, -100, -100]])
    batch = {"input_ids": tf.zeros([2, 6], tf.int32), "labels": tf.constant(labels, tf.int32)}
    per_token = tf.nn.sparse_softmax_cross_entropy_with_logits(np.maximum(labels, 0), logits)
    per_token = per_token.numpy()
    want = (per_token[0, 2:5].mean() + per_token[1, 1]) / 2
    np.testing.assert_allclose(bench.compute_loss(Fixed(), batch).numpy() * 8 / 2, want, rtol=1e-6)
    out = bench.eval_step(Fixed(), {**batch, "valid": tf.constant([1.0, 0.0])})
    state = {k: float(np.sum(v)) for k, v in out.items()}
    np.testing.assert_allclose(bench.eval_result(state), per_token[0, 2:5].mean(), rtol=1e-6)


def test_input_shifts_labels_and_pads():
    example = input_lib.to_example(tf.constant([5, 6, 7, 8]), tf.constant([-100, -100, 7, 8]), 6)
    assert example["input_ids"].numpy().tolist() == [5, 6, 7, 8, 0, 0]
    assert example["labels"].numpy().tolist() == [-100, 7, 8, -100, -100, -100]


def test_smoke_run_log_passes_every_round_but_the_target(tmp_path):
    result = runner.run(
        LoraBenchmark(config_lib.smoke()),
        runner.RunConfig(model_dir=str(tmp_path), distribution="one_device"),
    )
    records = e2e.log_records(result.mlperf_log)
    evals = [r for r in records if r["key"] == C.EVAL_ACCURACY]
    assert [r["metadata"]["samples_count"] for r in evals] == [24, 48]
    values = {r["key"]: r["value"] for r in records}
    assert values["lora_rank"] == 16 and values[C.TRAIN_SAMPLES] == config_lib.TRAIN_SAMPLES
    for ruleset in ("5.1.0", "6.0.0", "6.1.0"):
        report = checker.check_log(result.mlperf_log, ruleset=ruleset, quality="skip")
        assert report.passed, report.format_text()
        assert [f.check for f in report.warnings if f.source == "official"] == ["target"]


def test_flops_skip_the_frozen_weight_gradients():
    """Per sequence of 8,192: frozen projections 2 x forward, adapters and attention 3 x."""
    bench = _bench()
    m, seq = bench.config.model, 8192
    projections = m.parameter_count() - m.vocab_size * m.hidden_size  # less the lookup
    projections -= (2 * m.num_hidden_layers + 1) * m.hidden_size  # less the norms
    attention = 4.0 * seq * seq * m.num_attention_heads * m.head_dim * m.num_hidden_layers
    want = 2 * (2 * seq * projections) + 3 * attention + 3 * 2 * seq * 44_564_480
    np.testing.assert_allclose(bench.training_flops_per_sample(), want, rtol=1e-12)
    assert bench.training_flops_per_sample() < m.training_flops(seq)


@pytest.mark.slow
def test_mini_preset_reaches_its_target_and_the_checker_finds_only_the_target(tmp_path):
    """The acceptance run: `mlperf-tf run --benchmark=llama2_70b_lora --preset=mini` (the first
    run writes the data and pretrains the base: minutes)."""
    log, minutes = e2e.run_mini("llama2_70b_lora", tmp_path)
    records = e2e.log_records(log)
    values = [r["value"] for r in records if r["key"] == C.EVAL_ACCURACY]
    assert values[-1] <= config_lib.mini().quality_target
    for ruleset in ("5.1.0", "6.0.0", "6.1.0"):
        report = checker.check_log(log, ruleset=ruleset, quality="skip")
        assert report.passed, report.format_text()
        assert [f.check for f in report.warnings if f.source == "official"] == ["target"]
    print(f"llama2_70b_lora mini: {minutes:.1f} min, eval loss {values}")
