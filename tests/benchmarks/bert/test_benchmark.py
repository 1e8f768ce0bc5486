"""Tests of BertBenchmark: loss, eval metric, schedule, MLPerf hparams, presets, XLA, replicas."""

import dataclasses
import os

import keras
import numpy as np
import pytest
import tensorflow as tf
import yaml
from mlperf_logging.mllog import constants as Ck

from benchmarks.bert import BertBenchmark
from benchmarks.bert import benchmark as B
from benchmarks.bert import config as C
from mlperf_tf import config as config_base
from mlperf_tf.benchmark import RunContext
from tests import padding, strategies
from tests.numerics import assert_close


def smoke_bench(**overrides):
    return BertBenchmark(dataclasses.replace(C.smoke(), **overrides))


def first_batch(bench, batch_size=None):
    ctx = tf.distribute.InputContext()
    batch = next(iter(bench.train_dataset(ctx)))
    return batch


def log_softmax(x):
    x = x - x.max(-1, keepdims=True)
    return x - np.log(np.exp(x).sum(-1, keepdims=True))


@pytest.mark.numerics
def test_loss_matches_the_reference_formula():
    bench = smoke_bench()
    model = bench.build_model()
    batch = first_batch(bench)
    out = model(batch, training=False)
    mlm_logits = out["mlm_logits"].numpy()
    ids = batch["masked_lm_ids"].numpy()
    w = batch["masked_lm_weights"].numpy()
    per_token = -np.take_along_axis(log_softmax(mlm_logits), ids[..., None], -1)[..., 0]
    mlm = (per_token * w).sum() / (w.sum() + 1e-5)  # run_pretraining.py get_masked_lm_output
    nsp_lp = log_softmax(out["nsp_logits"].numpy())
    nsp = -nsp_lp[np.arange(8), batch["next_sentence_labels"].numpy()].mean()
    loss = bench.compute_loss(model, batch, training=False).numpy()
    assert_close(loss, mlm + nsp, rtol=1e-5)  # replica batch = micro batch
    # With 2 replicas each holds half the micro batch and scales its mean by 1/2.
    bench = bench.with_context(RunContext(num_replicas=2))
    half = {k: v[:4] for k, v in batch.items()}
    parts = bench.losses(model, half, training=False)
    assert_close(
        bench.compute_loss(model, half, training=False).numpy(),
        0.5 * (parts["mlm"] + parts["nsp"]).numpy(),
        rtol=1e-6,
    )


def test_eval_step_weighs_by_masked_lm_weights_and_valid():
    bench = smoke_bench()
    model = bench.build_model()
    batch = dict(first_batch(bench))
    batch["valid"] = tf.constant([1.0] * 6 + [0.0] * 2)
    out = bench.eval_step(model, batch)
    preds = np.argmax(model(batch)["mlm_logits"].numpy(), -1)
    w = batch["masked_lm_weights"].numpy() * batch["valid"].numpy()[:, None]
    correct = ((preds == batch["masked_lm_ids"].numpy()) * w).sum(1)
    np.testing.assert_allclose(out["correct"], correct)
    np.testing.assert_allclose(out["weight"], w.sum(1))
    assert out["weight"].numpy()[6:].sum() == 0
    state = bench.eval_reduce(bench.eval_begin(), {k: v.numpy() for k, v in out.items()})
    state = bench.eval_reduce(state, {"correct": np.array([3.0]), "weight": np.array([4.0])})
    assert bench.eval_result(state) == pytest.approx((correct.sum() + 3) / (w.sum() + 4))
    with pytest.raises(ValueError, match="no masked tokens"):
        bench.eval_result({})


def test_sample_eval_schedule_in_samples():
    points = B.sample_eval_schedule(global_batch_size=8192, train_steps=560, every_samples=500_000)
    # v0.7 Google TPU v3-8192 log: evals every 62 steps.
    assert [p.step for p in points[:3]] == [62, 124, 186]
    assert points[-1].step == 560
    assert points[0].epoch_num == 62 * 8192 and points[0].first_epoch_num == 0
    assert points[1].first_epoch_num == 62 * 8192 and points[1].epoch_count == 62 * 8192
    assert points[-1].epoch_count == (560 - 558) * 8192
    assert all(p.epoch_count > 0 for p in points)
    with pytest.raises(ValueError, match="every_samples"):
        B.sample_eval_schedule(global_batch_size=8, train_steps=5, every_samples=0)


def test_benchmark_eval_schedule_uses_rule_or_override():
    mlperf = BertBenchmark(C.mlperf())
    assert mlperf.eval_every_samples() == 500_000
    assert mlperf.eval_schedule()[0].step == 62
    v1 = BertBenchmark(dataclasses.replace(C.mlperf(), eval_rule="v1.0"))
    assert v1.eval_schedule()[0].step == 28  # ceil(225000 / 8192)
    smoke = smoke_bench()
    assert [p.step for p in smoke.eval_schedule()] == [3, 6]


def _required_bert_keys(ruleset):
    import mlperf_logging

    path = os.path.join(
        os.path.dirname(mlperf_logging.__file__),
        "compliance_checker",
        f"training_{ruleset}",
        "closed_bert.yaml",
    )
    with open(path) as f:
        entries = yaml.safe_load(f)
    return {e["KEY"]["NAME"] for e in entries if "KEY" in e}


@pytest.mark.parametrize("ruleset", ["0.7.0", "1.0.0"])
def test_mlperf_hparams_cover_closed_bert(ruleset):
    hparams = smoke_bench().mlperf_hparams()
    # The runner logs global_batch_size; eval_accuracy comes from evaluation.
    required = _required_bert_keys(ruleset) - {Ck.GLOBAL_BATCH_SIZE, Ck.EVAL_ACCURACY}
    assert required <= set(hparams), required - set(hparams)


def test_mlperf_preset_is_the_v07_reference():
    config = C.mlperf()
    hp = BertBenchmark(config).mlperf_hparams()
    assert config.global_batch_size == 8192
    assert hp[Ck.OPT_BASE_LR] == 0.00288293
    assert hp[Ck.OPT_LAMB_BETA_1] == hp[Ck.OPT_LAMB_BETA_2] == 0.88
    assert hp[Ck.OPT_LAMB_WEIGHT_DECAY] == 0.0166629
    assert hp[Ck.NUM_WARMUP_STEPS] == hp[Ck.OPT_LR_WARMUP_STEPS] == 287
    assert hp[Ck.START_WARMUP_STEP] == -76
    assert hp[B.OPT_EPSILON] == 1e-6
    assert hp[Ck.OPT_LR_TRAINING_STEPS] == 560
    assert hp[Ck.MAX_SEQUENCE_LENGTH] == 512 and hp[B.MAX_PREDICTIONS_PER_SEQ] == 76
    assert config.model == C.bert_large()
    assert config.quality_target == 0.712 and config.eval_examples == 10000


def test_learning_rate_schedule_matches_reference():
    """optimization.py: poly decay from step 0 over num_train_steps; while
    step - start_warmup_step < num_warmup_steps, lr = init_lr * (step - start) / warmup."""
    bench = BertBenchmark(C.mlperf())
    schedule = bench.learning_rate_schedule(bench.train_steps)
    lr, start, warm, total = 0.00288293, -76, 287, 560

    def reference(step):
        if step - start < warm:
            return lr * (step - start) / warm
        return lr * (1 - min(step, total) / total)

    for step in (0, 1, 100, 210, 211, 212, 400, 559, 560, 600):
        assert float(schedule(step)) == pytest.approx(reference(step), rel=1e-5, abs=1e-9)


def test_lamb_excludes_layer_norm_and_biases():
    bench = smoke_bench()
    model = bench.build_model()
    opt = bench.build_optimizer(bench.train_steps)
    opt.build(model.trainable_variables)
    decayed = {v.path: d for v, d in zip(model.trainable_variables, opt._decay)}
    names = model.tf1_variables()
    by_tf1 = {tf1: decayed[var.path] for tf1, var in names.items()}
    for tf1, decays in by_tf1.items():
        excluded = "LayerNorm" in tf1 or tf1.endswith("bias")
        assert decays == (not excluded), tf1


@pytest.mark.slow  # 60 s of XLA compiling; default covers: BERT smoke through the runner under
# --xla (test_end_to_end.py's accumulation run) and the transformer's XLA step that learns.
def test_train_step_compiles_under_xla():
    # No dropout and a longer schedule than smoke's 6 steps: the loss must fall on one batch.
    model_config = dataclasses.replace(
        C.smoke().model, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0
    )
    # Bound as the runner binds it under --xla: static shapes, the padded encoder.
    bench = smoke_bench(model=model_config).with_context(RunContext(static_shapes=True))
    model = bench.build_model()
    opt = bench.build_optimizer(100)
    opt.build(model.trainable_variables)
    batch = first_batch(bench)

    @tf.function(jit_compile=True)
    def step(batch):
        with tf.GradientTape() as tape:
            loss = bench.compute_loss(model, batch, training=True)
        grads = tape.gradient(loss, model.trainable_variables)
        grads, _ = tf.clip_by_global_norm(grads, bench.gradient_clip_norm())
        opt.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    losses = [float(step(batch)) for _ in range(6)]
    assert all(np.isfinite(losses))
    assert losses[-1] < losses[0]  # the same batch: loss goes down
    eval_batch = next(iter(bench.eval_dataset(tf.distribute.InputContext())))
    out = tf.function(bench.eval_step, jit_compile=True)(model, eval_batch)
    assert out["correct"].shape == (8,)


# Extended (CI runs it after README's default run); the default run covers its case by
# bert/test_tensor_parallel.py (a split run equals the unsplit run) and resnet50's two replicas.
@pytest.mark.extended
def test_two_replicas_train_step_with_dropout():
    """Mirrored over 2 CPUs: the step runs in replica context (dropout seeds included)."""
    bench = smoke_bench()
    strategy = strategies.mirrored(2)
    bench = bench.with_context(RunContext(num_replicas=2))
    with strategy.scope():
        model = bench.build_model()
        opt = bench.build_optimizer(bench.train_steps)
        opt.build(model.trainable_variables)
    dataset = strategy.distribute_datasets_from_function(bench.train_dataset)
    batch = next(iter(dataset))

    @tf.function
    def step(batch):
        def replica(batch):
            with tf.GradientTape() as tape:
                loss = bench.compute_loss(model, batch, training=True)
            grads = tape.gradient(loss, model.trainable_variables)
            opt.apply_gradients(zip(grads, model.trainable_variables))
            return loss

        return strategy.reduce("SUM", strategy.run(replica, args=(batch,)), axis=None)

    first = float(step(batch))
    assert np.isfinite(first) and float(step(batch)) < first + 1.0


def test_presets_validate_and_override():
    for preset in ("mlperf", "mini", "smoke"):
        config = BertBenchmark.preset(preset)
        assert isinstance(config, C.BertConfig)
    config = config_base.override(C.smoke(), {"optimizer.start_warmup_step": "-3"})
    assert config.optimizer.start_warmup_step == -3
    with pytest.raises(config_base.ConfigError, match="opt_lamb_beta_1"):
        config_base.override(C.smoke(), {"optimizer.opt_lamb_beta_1": "1.5"})
    with pytest.raises(config_base.ConfigError, match="eval_rule"):
        config_base.override(C.smoke(), {"eval_rule": "v3"})
    with pytest.raises(config_base.ConfigError, match="max_position_embeddings"):
        config_base.override(C.smoke(), {"data.max_seq_length": "64"})


def test_bert_config_file_replaces_model(tmp_path):
    path = tmp_path / "bert_config.json"
    path.write_text(
        '{"attention_probs_dropout_prob": 0.1, "hidden_act": "gelu", "hidden_dropout_prob": 0.1,'
        ' "hidden_size": 16, "initializer_range": 0.02, "intermediate_size": 32,'
        ' "max_position_embeddings": 64, "num_attention_heads": 2, "num_hidden_layers": 1,'
        ' "type_vocab_size": 2, "vocab_size": 99}'
    )
    bench = smoke_bench(bert_config_file=str(path))
    model = bench.build_model()
    assert model.encoder.embeddings.word_embeddings.shape == (99, 16)
    assert len(model.encoder.blocks) == 1
    path.write_text('{"hidden_act": "relu"}')
    with pytest.raises(config_base.ConfigError, match="hidden_act"):
        smoke_bench(bert_config_file=str(path)).build_model()
    with pytest.raises(config_base.ConfigError, match="cannot read"):
        smoke_bench(bert_config_file=str(tmp_path / "none.json")).build_model()


def test_registry_finds_the_benchmark():
    from mlperf_tf import registry

    assert registry.get("bert") is BertBenchmark
    assert BertBenchmark.mlperf_benchmark == "bert"


@pytest.mark.bfloat16
def test_keras_policy_mixed_bf16_loss_is_float32():
    keras.mixed_precision.set_dtype_policy("mixed_bfloat16")
    try:
        bench = smoke_bench()
        model = bench.build_model()
        loss = bench.compute_loss(model, first_batch(bench), training=True)
    finally:
        keras.mixed_precision.set_dtype_policy("float32")
    assert loss.dtype == tf.float32 and np.isfinite(loss.numpy())


@pytest.mark.numerics
def test_gradient_clip_norm_is_the_reference_one():
    assert smoke_bench().gradient_clip_norm() == 1.0
    assert BertBenchmark(C.mlperf()).gradient_clip_norm() == 1.0
    config = config_base.override(C.smoke(), {"gradient_clip_norm": "0"})
    assert BertBenchmark(config).gradient_clip_norm() is None


@pytest.mark.numerics
def test_skipping_the_padding_gives_the_same_loss_and_gradients():
    bench = smoke_bench()
    model = bench.build_model()
    batch = first_batch(bench)
    assert not batch["input_mask"].numpy().all()  # the synthetic batch has padding to skip
    # The encoder blocks' products run on the real tokens (a data-dependent count) unless static.
    padding.assert_packed_step_equals_padded(bench, model, batch)
