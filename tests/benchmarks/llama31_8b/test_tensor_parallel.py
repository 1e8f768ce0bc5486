"""Tensor-parallel Llama (`--model_parallel`): 10 steps on a data x model mesh of logical CPUs
end at the unsplit run's losses, gradients and weights. The smoke model has 4 query and 2
key/value heads: M = 2 splits the key/value heads, M = 4 replicates them (each shard keeps the
one its query head uses)."""

import pytest
import tensorflow as tf

from benchmarks.llama31_8b import config as config_lib
from benchmarks.llama31_8b.benchmark import Llama31Benchmark
from mlperf_tf import config as mlperf_config
from tests import tensor_parallel

pytestmark = pytest.mark.numerics
RTOL = 1e-5


@pytest.mark.parametrize(
    ("devices", "model_parallel", "optimizer"),
    # Extended (CI runs it after README's default run); the default run covers its case by
    # test_every_block_option_split_equals_the_unsplit_run[2-True] (every block option split).
    [pytest.param(4, 4, "adam", marks=pytest.mark.extended),
     pytest.param(4, 2, "adam", marks=pytest.mark.slow),
     pytest.param(4, 2, "lamb", marks=pytest.mark.slow)],
)  # fmt: skip
def test_split_run_equals_the_unsplit_run(devices, model_parallel, optimizer):
    b = Llama31Benchmark(config_lib.smoke())
    ref = tensor_parallel.train(
        b, num_devices=devices // model_parallel, model_parallel=1, optimizer=optimizer
    )
    got = tensor_parallel.train(
        b, num_devices=devices, model_parallel=model_parallel, optimizer=optimizer
    )
    tensor_parallel.assert_same_run(got, ref, rtol=RTOL)


# Every option of the block library at once (`mlperf_tf.lm.DecoderConfig`): fused q/k/v in
# Megatron's grouped order, biases, QK-norm, sinks, a window on every other layer, the clamped
# SwiGLU and tied embeddings (the logits from the vocabulary-split embedding rows).
ALL_OPTIONS = {
    "model.fused_qkv": "True",
    "model.attention_bias": "True",
    "model.mlp_bias": "True",
    "model.qk_norm": "True",
    "model.attention_sinks": "True",
    "model.sliding_window": "9",
    "model.window_skip_freq": "2",
    "model.feed_forward": "swiglu_clamped",
    "model.tie_word_embeddings": "True",
}


class _MaskedLlama(Llama31Benchmark):
    """Every third label ignored (-100) and every fifth position masked by a `loss_mask`: the
    weighted loss over vocabulary-split logits."""

    def compute_loss_and_metrics(self, model, batch, training=True):
        labels = batch["labels"]
        ignored = tf.equal(labels % 3, 0)
        position = tf.range(tf.shape(labels)[1])[None, :]
        mask = tf.cast(tf.not_equal(position % 5, 0), tf.float32) * tf.ones_like(labels, tf.float32)
        batch = {**batch, "labels": tf.where(ignored, -100, labels), "loss_mask": mask}
        return super().compute_loss_and_metrics(model, batch, training)


@pytest.mark.parametrize(
    ("model_parallel", "fused"), [(2, True), pytest.param(4, False, marks=pytest.mark.slow)]
)
def test_every_block_option_split_equals_the_unsplit_run(model_parallel, fused):
    """3 Adam steps of the smoke Llama with every option on and a masked loss, M = 2 (data 2) against data 2 on 2
    devices (M = 4: the 2 key/value heads replicated, which a fused projection refuses, against
    one device): losses, first-step whole gradients, final whole weights."""
    options = {**ALL_OPTIONS, "model.fused_qkv": str(fused)}
    cfg = mlperf_config.override(config_lib.smoke(), options)
    b = _MaskedLlama(cfg)
    shards = 4 // model_parallel
    ref = tensor_parallel.train(b, num_devices=shards, model_parallel=1, optimizer="adam", steps=3)
    got = tensor_parallel.train(
        b, num_devices=4, model_parallel=model_parallel, optimizer="adam", steps=3
    )
    projection = "qkv_proj/kernel" if fused else "q_proj/kernel"
    assert any(name.endswith(projection) for name in got.names), got.names
    assert any(name.endswith("attention/sinks") for name in got.names)
    tensor_parallel.assert_same_run(got, ref, rtol=RTOL)
    assert got.losses[-1] < got.losses[0]
