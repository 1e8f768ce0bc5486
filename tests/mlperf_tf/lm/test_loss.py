"""Tests of the masked token loss (`mlperf_tf.lm.loss`) and of `LanguageModelBenchmark`'s loss,
eval sums and log perplexity with ignored labels, end-of-document positions and a loss mask."""

import dataclasses

import numpy as np
import pytest
import tensorflow as tf

from benchmarks.llama31_8b.benchmark import Llama31Benchmark
from mlperf_tf.lm import loss as loss_lib
from tests.numerics import assert_close

pytestmark = pytest.mark.numerics


def _log_softmax(z):
    z = z - z.max(-1, keepdims=True)
    return z - np.log(np.exp(z).sum(-1, keepdims=True))


def test_token_cross_entropy_is_zero_at_ignored_labels():
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(2, 5, 7)).astype(np.float32)
    labels = rng.integers(0, 7, (2, 5))
    labels[0, 1] = labels[1, 4] = loss_lib.IGNORE_INDEX
    got = loss_lib.token_cross_entropy(tf.constant(logits), tf.constant(labels), vocab_size=7)
    safe = np.where(labels < 0, 0, labels)
    expected = -np.take_along_axis(_log_softmax(logits.astype(np.float64)), safe[..., None], -1)
    expected = np.where(labels < 0, 0.0, expected[..., 0])
    assert_close(got, expected, rtol=1e-6)


def test_loss_weights_mask_ignored_labels_end_of_document_and_the_given_mask():
    labels = tf.constant([[5, -100, 3, 2], [1, 2, 3, 4]])
    ids = tf.constant([[9, 5, 0, 3], [0, 1, 2, 3]])  # 0: end of document
    mask = tf.constant([[1.0, 1.0, 1.0, 1.0], [1.0, 1.0, 0.0, 1.0]])
    got = loss_lib.loss_weights(labels, input_ids=ids, eod_token=0, mask=mask)
    assert_close(got, [[1, 0, 0, 1], [0, 1, 0, 1]], rtol=0)
    assert_close(loss_lib.loss_weights(labels), [[1, 0, 1, 1], [1, 1, 1, 1]], rtol=0)
    with pytest.raises(ValueError, match="input_ids"):
        loss_lib.loss_weights(labels, eod_token=0)
    assert float(loss_lib.weighted_mean(tf.ones([3]), tf.zeros([3]))) == 0.0


class _EodLlama(Llama31Benchmark):
    eod_token = 0


def _batch(bench, seed=0):
    seq, vocab = bench.config.data.max_sequence_length, bench.config.model.vocab_size
    ids = np.random.default_rng(seed).integers(0, vocab, (2, seq + 1))
    return {"input_ids": tf.constant(ids[:, :-1], tf.int32), "labels": ids[:, 1:].copy()}


def test_benchmark_loss_and_eval_count_only_weighted_tokens():
    bench = Llama31Benchmark(Llama31Benchmark.preset("smoke"))
    model = bench.build_model()
    batch = _batch(bench)
    per_token = bench.token_losses(model, {**batch, "labels": tf.constant(batch["labels"])}, False)
    labels = batch["labels"].copy()
    labels[0, :10] = loss_lib.IGNORE_INDEX  # a prompt
    masked = {"input_ids": batch["input_ids"], "labels": tf.constant(labels)}
    kept = labels >= 0
    expected = float(np.sum(per_token.numpy() * kept) / kept.sum())
    share = 2 / bench.micro_batch_size
    assert_close(bench.compute_loss(model, masked, training=False), expected * share, rtol=1e-5)
    sums = bench.eval_step(model, {**masked, "valid": tf.constant([1.0, 0.0])})
    assert_close(sums["tokens"], [kept[0].sum(), 0.0], rtol=0)
    assert_close(sums["loss"][0], np.sum(per_token.numpy()[0] * kept[0]), rtol=1e-5)
    state = {k: float(np.sum(v)) for k, v in sums.items()}
    assert bench.eval_result(state) == pytest.approx(state["loss"] / kept[0].sum())
    # A loss mask and an end-of-document id mask positions alike.
    mask = np.ones(labels.shape, np.float32)
    mask[1, 3:] = 0.0
    got = bench.loss_weights({**masked, "loss_mask": tf.constant(mask)}).numpy()
    assert_close(got, kept * mask, rtol=0)
    eod = _EodLlama(bench.config)
    ids = batch["input_ids"].numpy()
    ids[1, 5] = 0
    weights = eod.loss_weights({"input_ids": tf.constant(ids), "labels": tf.constant(labels)})
    assert float(weights[1, 5]) == 0.0 and float(weights[1, 6]) == 1.0
    with pytest.raises(ValueError, match="no tokens"):
        bench.eval_result({"loss": 0.0, "tokens": 0.0})


def test_benchmark_base_sizes_and_disclosure_keys():
    bench = Llama31Benchmark(Llama31Benchmark.preset("smoke"))
    assert bench.parameter_count() == bench.config.model.parameter_count()
    assert bench.active_parameter_count() == bench.parameter_count()  # dense
    assert bench.tokens_per_sample() == bench.config.data.max_sequence_length
    keys = bench.round_hparams()  # the runner's, for every benchmark
    assert keys["tensor_parallelism"] == 1 and keys["expert_parallelism"] == 1
    assert keys["config_filename"] == "benchmarks/llama31_8b/config.py"
    assert bench.moe_group_size() is None
    moe_model = dataclasses.replace(
        bench.config.model,
        moe=dataclasses.replace(bench.config.model.moe, num_experts=4, every=1),
    )
    moe_bench = Llama31Benchmark(dataclasses.replace(bench.config, model=moe_model))
    assert moe_bench.parallel_axes == ("data", "model", "pipeline", "context", "expert")
    assert moe_bench.active_parameter_count() < moe_bench.parameter_count()
