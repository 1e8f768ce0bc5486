"""Tests of the llama31_8b benchmark: RCP hyperparameters, schedule, optimizer, eval value, and the
MLPerf keys of the `mlperf` preset under the official checker of 5.1.0, 6.0.0 and 6.1.0."""

import dataclasses
import json
import math

import keras
import numpy as np
import pytest
import tensorflow as tf
from mlperf_logging.mllog import constants as C

from benchmarks.llama31_8b import config as config_lib
from benchmarks.llama31_8b.benchmark import Llama31Benchmark
from mlperf_tf.benchmark import RunContext, sample_eval_schedule
from mlperf_tf.config import ConfigError
from mlperf_tf.optimizers import AdamW, WarmupCosineDecay
from tests.closed_rules import logged_hparams
from tests.numerics import assert_close

RULESETS = ("5.1.0", "6.0.0", "6.1.0")


def _bench(preset="mlperf", **changes):
    config = dataclasses.replace(Llama31Benchmark.preset(preset), **changes)
    return Llama31Benchmark(config).with_context(RunContext(num_replicas=1))


def test_a_sequence_the_model_cannot_take_is_a_config_error():
    with pytest.raises(ConfigError, match="max_sequence_length"):
        dataclasses.replace(
            config_lib.smoke(), data=config_lib.DataConfig(max_sequence_length=1024)
        )


def test_schedule_is_nemos_warmup_then_cosine():
    schedule = WarmupCosineDecay(1.0, warmup_steps=4, decay_steps=10, end_learning_rate=0.1)
    steps = np.arange(20)
    expected = [
        (s + 1) / 5 if s <= 4 else 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(s - 4, 10) / 10))
        for s in steps
    ]
    assert_close([float(schedule(s)) for s in steps], expected, rtol=1e-6)
    assert (
        keras.optimizers.schedules.deserialize(
            keras.optimizers.schedules.serialize(schedule)
        ).get_config()
        == schedule.get_config()
    )


@pytest.mark.numerics
def test_adamw_is_pytorchs_formula_and_skips_norm_scales():
    """Three steps against a NumPy transcription of `torch.optim.AdamW`; the `/scale` variable
    (a norm) gets no decay."""
    rng = np.random.default_rng(0)
    w0 = rng.normal(size=(3, 4)).astype(np.float32)
    s0 = rng.normal(size=(4,)).astype(np.float32)
    grads = [rng.normal(size=(3, 4)).astype(np.float32) for _ in range(3)]
    lr, b1, b2, eps, wd = 0.01, 0.9, 0.95, 1e-5, 0.1
    kernel = keras.Variable(w0, name="kernel")
    scale = keras.Variable(s0, name="scale")
    optimizer = AdamW(
        lr, beta_1=b1, beta_2=b2, epsilon=eps, weight_decay=wd, exclude_from_weight_decay=["scale"]
    )
    expected = {"kernel": w0.astype(np.float64), "scale": s0.astype(np.float64)}
    moments = {k: [np.zeros_like(v), np.zeros_like(v)] for k, v in expected.items()}
    for t, g in enumerate(grads, 1):
        optimizer.apply([tf.constant(g), tf.constant(g[0])], [kernel, scale])
        for name, grad, decay in (("kernel", g, wd), ("scale", g[0], 0.0)):
            w = expected[name] * (1 - lr * decay)
            m, v = moments[name]
            m[:] = b1 * m + (1 - b1) * grad
            v[:] = b2 * v + (1 - b2) * grad**2
            w = w - lr / (1 - b1**t) * m / (np.sqrt(v) / math.sqrt(1 - b2**t) + eps)
            expected[name] = w
    assert_close(kernel.numpy(), expected["kernel"], rtol=1e-5)
    assert_close(scale.numpy(), expected["scale"], rtol=1e-5)


def test_the_registry_adamw_decays_kernels_and_embeddings_not_norm_scales():
    keras.utils.set_random_seed(0)
    bench = _bench("smoke")
    model = bench.build_model()
    optimizer = bench.build_optimizer(bench.train_steps)
    optimizer.build(model.trainable_variables)
    decayed = {
        v.path for v, d in zip(model.trainable_variables, optimizer._decay, strict=True) if d
    }
    assert decayed == {v.path for v in model.trainable_variables if len(v.shape) == 2}
    assert isinstance(optimizer, AdamW) and optimizer.beta_2 == 0.95 and optimizer.epsilon == 1e-5


def test_eval_schedule_is_every_12288_sequences_with_samples_count():
    bench = _bench()
    points = sample_eval_schedule(
        global_batch_size=32, train_steps=1000, every_samples=12288, log_samples_count=True
    )
    assert [p.step for p in points] == [384, 768, 1000]
    assert [p.samples_count for p in points] == [12288, 24576, 32000]
    assert bench.eval_schedule()[0].samples_count == 12288
    # BERT's rules do not log it.
    assert (
        sample_eval_schedule(global_batch_size=32, train_steps=1000, every_samples=12288)[
            0
        ].samples_count
        is None
    )


def test_eval_result_is_the_mean_token_loss_and_padding_does_not_count():
    keras.utils.set_random_seed(0)
    bench = _bench("smoke")
    model = bench.build_model()
    tokens = tf.random.uniform([3, 9], 0, 128, tf.int32, seed=1)
    batch = {
        "input_ids": tokens[:, :-1],
        "labels": tokens[:, 1:],
        "valid": tf.constant([1.0, 1.0, 0.0]),
    }
    state = bench.eval_reduce({}, {k: v.numpy() for k, v in bench.eval_step(model, batch).items()})
    logits = model(batch["input_ids"]).numpy().astype(np.float64)[:2]
    log_probs = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    labels = batch["labels"].numpy()[:2]
    expected = -np.take_along_axis(log_probs, labels[..., None], -1).mean()
    assert bench.eval_result(state) == pytest.approx(expected, rel=1e-5)


def test_parameter_count_is_listed_by_mlperf_tf_list_json(capsys):
    from mlperf_tf import cli

    assert cli.main(["list", "--json"]) == 0
    listed = {entry["name"]: entry for entry in json.loads(capsys.readouterr().out)}
    assert listed["llama31_8b"]["parameters"] == 8_030_261_248
    assert listed["llama31_8b"]["mlperf_benchmark"] == "llama31_8b"


@pytest.mark.parametrize("ruleset", RULESETS)
def test_mlperf_preset_logs_every_key_the_closed_rules_require(ruleset):
    bench = _bench()
    hparams = logged_hparams(bench, ruleset)
    assert hparams[C.MAX_SEQUENCE_LENGTH] == 8192 and hparams["max_steps"] == 1_200_000
    assert hparams[C.OPT_NAME] == "adamw" and hparams[C.OPT_GRADIENT_CLIP_NORM] == 1.0
    assert hparams[C.OPT_LR_DECAY_STEPS] + hparams[C.OPT_LR_WARMUP_STEPS] == 1_200_000
    assert bench.eval_samples() == 1024
    assert ("tensor_parallelism" in hparams) == (ruleset == "6.1.0")


def test_analytic_training_flops_equal_the_traced_count_attention_included():
    from mlperf_tf import flops

    bench = _bench("smoke")
    traced = flops.TRAINING_FLOPS_PER_FORWARD_FLOP * flops.forward_flops_per_sample(bench).total
    assert bench.training_flops_per_sample() == pytest.approx(traced, rel=1e-9)
    assert flops.training_flops_per_sample(bench) == bench.training_flops_per_sample()
    c, seq = bench.config.model, bench.config.data.max_sequence_length
    attention = 3 * 4 * seq * seq * c.num_attention_heads * c.head_dim * c.num_hidden_layers
    assert attention > 0.1 * traced  # attention is a visible part at this shape
    # 8B at 8,192 tokens: 6 x the 7.5 B projection weights (all but norms and the embedding)
    # x 8,192 + attention.
    mlperf = _bench().training_flops_per_sample()
    assert mlperf == pytest.approx(6 * 7_504_658_432 * 8192 + 12 * 8192**2 * 4096 * 32, rel=1e-12)
    assert _bench().tokens_per_sample() == 8192
