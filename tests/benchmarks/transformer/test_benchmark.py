"""Tests of TransformerBenchmark: loss, MLPerf hparams against the rules, XLA steps, BLEU eval."""

import dataclasses
import os

import mlperf_logging
import numpy as np
import pytest
import tensorflow as tf
import yaml
from mlperf_logging.mllog import constants as C

from benchmarks.transformer import config as config_lib
from benchmarks.transformer import prepare
from benchmarks.transformer.benchmark import TransformerBenchmark, label_smoothed_cross_entropy
from mlperf_tf.benchmark import RunContext
from mlperf_tf.config import ConfigError, override
from tests import padding, strategies
from tests.benchmarks.transformer.test_prepare import corpus

RULES = os.path.join(os.path.dirname(mlperf_logging.__file__), "compliance_checker")


def smoke_benchmark(**overrides):
    return TransformerBenchmark(override(config_lib.smoke(), overrides))


def reference_loss(logits, targets, smoothing):
    """Numpy label-smoothed cross-entropy with explicit soft targets (Model Garden's formula)."""
    vocab = logits.shape[-1]
    shifted = logits - logits.max(-1, keepdims=True)
    log_probs = shifted - np.log(np.exp(shifted).sum(-1, keepdims=True))
    confidence, low = 1.0 - smoothing, smoothing / (vocab - 1)
    soft = np.full(logits.shape, low)
    np.put_along_axis(soft, targets[..., None], confidence, axis=-1)
    xent = -(soft * log_probs).sum(-1)
    entropy = -(confidence * np.log(confidence) + (vocab - 1) * low * np.log(low + 1e-20))
    weights = (targets != 0).astype(np.float64)
    return ((xent - entropy) * weights).sum(), weights.sum()


@pytest.mark.numerics
def test_label_smoothed_loss_matches_the_formula_and_masks_padding():
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(2, 5, 11))
    targets = np.array([[3, 4, 1, 0, 0], [5, 6, 7, 8, 1]])
    total, count = label_smoothed_cross_entropy(tf.constant(logits), tf.constant(targets), 0.1)
    expected_total, expected_count = reference_loss(logits, targets, 0.1)
    assert float(count) == expected_count == 8
    assert float(total) == pytest.approx(expected_total, rel=1e-5)
    # Padded positions contribute nothing, whatever their logits.
    changed = logits.copy()
    changed[0, 3:] += 100.0
    total2, _ = label_smoothed_cross_entropy(tf.constant(changed), tf.constant(targets), 0.1)
    assert float(total2) == pytest.approx(float(total), rel=1e-6)
    # A confident correct prediction scores ~0 (the smoothed target's entropy is subtracted).
    perfect = np.where(np.arange(11) == targets[..., None], 50.0, 0.0)
    loss, _ = label_smoothed_cross_entropy(tf.constant(perfect), tf.constant(targets), 0.0)
    assert float(loss) == pytest.approx(0.0, abs=1e-4)


@pytest.mark.numerics
@pytest.mark.peers
def test_loss_matches_model_garden_transformer_loss():
    metrics = pytest.importorskip("official.legacy.transformer.metrics")
    rng = np.random.default_rng(1)
    logits = tf.constant(rng.normal(size=(3, 4, 9)), tf.float32)
    targets = tf.constant([[2, 3, 1, 0], [4, 1, 0, 0], [5, 6, 7, 1]])
    total, count = label_smoothed_cross_entropy(logits, targets, 0.1)
    expected = metrics.transformer_loss(logits, targets, 0.1, 9)
    assert float(total / count) == pytest.approx(float(expected), rel=1e-5)


def rule_checks(ruleset, benchmark):
    with open(os.path.join(RULES, f"training_{ruleset}", f"closed_{benchmark}.yaml")) as f:
        rules = yaml.safe_load(f)
    return {r["KEY"]["NAME"]: r["KEY"] for r in rules if "KEY" in r}


@pytest.mark.parametrize("preset", ["mlperf", "mini", "smoke"])
def test_hparams_satisfy_the_closed_transformer_rules(preset):
    bench = TransformerBenchmark(TransformerBenchmark.preset(preset))
    hparams = bench.mlperf_hparams()
    rules = rule_checks("0.7.0", "transformer")
    logged_by_runner = {C.GLOBAL_BATCH_SIZE, C.EVAL_ACCURACY, C.SUBMISSION_BENCHMARK}
    assert set(rules) - logged_by_runner == set(hparams)
    for key, value in hparams.items():
        value, metadata = value if isinstance(value, tuple) else (value, {})
        v = {"value": value, "metadata": metadata}  # the name the rule expressions use
        checks = rules[key].get("CHECK", [])
        for check in [checks] if isinstance(checks, str) else checks:
            assert eval(check, {}, {"v": v}), (key, check, v)  # noqa: S307 (the official rules)
    assert eval(
        rules[C.GLOBAL_BATCH_SIZE]["CHECK"], {}, {"v": {"value": bench.config.global_batch_size}}
    )


def test_mlperf_preset_has_the_reference_hyperparameters():
    cfg = config_lib.mlperf()
    m, o, d = cfg.model, cfg.optimizer, cfg.data
    assert (m.hidden_size, m.num_layers, m.num_heads, m.filter_size) == (1024, 6, 16, 4096)
    assert (m.dropout, m.attention_dropout, m.relu_dropout) == (0.1, 0.1, 0.1)
    assert (m.beam_size, m.alpha) == (4, 0.6)
    assert (o.opt_base_learning_rate, o.opt_learning_rate_warmup_steps) == (2.0, 16000)
    assert (o.opt_adam_beta_1, o.opt_adam_beta_2, o.opt_adam_epsilon) == (0.9, 0.997, 1e-9)
    assert o.label_smoothing == 0.1
    assert (d.max_sequence_length, d.max_length_method) == (256, "discard")
    assert cfg.quality_target == 0.25 and cfg.eval_examples == 3003


def test_config_validation_and_overrides():
    cfg = override(config_lib.smoke(), {"data.max_length_method": "truncate"})
    assert cfg.data.max_length_method == "truncate"
    with pytest.raises(ConfigError):
        override(config_lib.smoke(), {"data.max_length_method": "cut"})
    # Buckets are capped by the max length, so either can change alone.
    assert override(config_lib.mini(), {"data.bucket_lengths": "(8,16)"}).data.buckets == (
        8,
        16,
        32,
    )
    assert override(config_lib.mini(), {"data.max_sequence_length": "20"}).data.buckets == (
        8,
        12,
        16,
        20,
    )
    with pytest.raises(ConfigError, match="increasing"):
        override(config_lib.mini(), {"data.bucket_lengths": "(16,8,32)"})
    with pytest.raises(ConfigError, match="global_batch_size"):
        override(config_lib.mini(), {"global_batch_size": "16"})


def test_learning_rate_schedule_is_warmup_then_rsqrt():
    bench = TransformerBenchmark(config_lib.mlperf())
    schedule = bench.learning_rate_schedule()
    peak = 2.0 * 1024**-0.5 / 16000**0.5
    assert float(schedule(16000)) == pytest.approx(peak, rel=1e-5)
    assert float(schedule(8000)) == pytest.approx(peak / 2, rel=1e-5)
    assert float(schedule(64000)) == pytest.approx(peak / 2, rel=1e-5)
    optimizer = bench.build_optimizer(100)
    assert (optimizer.beta_1, optimizer.beta_2, optimizer.epsilon) == (0.9, 0.997, 1e-9)


def test_train_step_compiles_under_xla_and_learns():
    # Bound as the runner binds it under --xla: static shapes, logits over every target slot.
    bench = smoke_benchmark(**{"model.num_layers": "1"}).with_context(
        RunContext(static_shapes=True)
    )
    model = bench.build_model()
    optimizer = bench.build_optimizer(bench.train_steps)
    batch = next(iter(bench.train_dataset(tf.distribute.InputContext())))
    assert batch["inputs"].shape == (8, 8)

    # As the runner does: XLA compiles the forward/backward pass, apply_gradients stays outside.
    @tf.function(jit_compile=True)
    def gradients(batch):
        with tf.GradientTape() as tape:
            loss = bench.compute_loss(model, batch, training=True)
        return loss, tape.gradient(loss, model.trainable_variables)

    @tf.function
    def step(batch):
        loss, grads = gradients(batch)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    first = float(step(batch))
    for _ in range(20):
        last = float(step(batch))
    assert np.isfinite(first) and last < first


# Extended (CI runs it after README's default run); the default run covers its case by
# bert/test_benchmark.py's padding skipped (the same loss and gradients) and test_model.py's
# packed streams.
@pytest.mark.extended
@pytest.mark.numerics
def test_skipping_the_padding_gives_the_same_loss_and_gradients():
    bench = smoke_benchmark()
    model = bench.build_model()
    batch = next(iter(bench.train_dataset(tf.distribute.InputContext())))
    real = int(tf.reduce_sum(tf.cast(batch["targets"] > 0, tf.int32)))
    assert 0 < real < batch["targets"].shape.num_elements()  # the batch has padding to skip
    losses = padding.assert_packed_step_equals_padded(bench, model, batch)
    # The tied vocabulary projection (states times the [vocab, hidden] matrix): every target
    # slot when static, the real targets only (a data-dependent count) otherwise.
    vocab = bench.config.model.vocab_size
    for static, rows in ((True, batch["targets"].shape.num_elements()), (False, None)):
        bound = bench.with_context(RunContext(static_shapes=static))
        projections = [
            op.outputs[0].shape[0]
            for op in padding.traced_matmuls(bound, model, batch)
            if op.get_attr("transpose_b") and op.outputs[0].shape[-1] == vocab
        ]
        assert projections == [rows]
    # And the loss is the formula's over the real tokens of the full logits.
    total, count = reference_loss(model(batch).numpy(), batch["targets"].numpy(), 0.1)
    assert count == real
    assert losses[False] == pytest.approx(total / count, rel=1e-4)


@pytest.mark.numerics
def test_loss_is_the_token_mean_over_replicas():
    bench = smoke_benchmark()
    model = bench.build_model()
    batch = next(iter(bench.train_dataset(tf.distribute.InputContext())))
    logits = model(batch, training=False)
    total, count = label_smoothed_cross_entropy(logits, batch["targets"], 0.1)
    loss = bench.compute_loss(model, batch, training=False)
    assert float(loss) == pytest.approx(float(total / count), rel=1e-5)
    # Under a 2-replica strategy the runner binds a context of 2 replicas (mesh data=2): each
    # replica's loss is its share of the global token mean, so the replicas' sum is that mean.
    two = bench.with_context(RunContext(num_replicas=2))
    strategy = strategies.mirrored(2)
    with strategy.scope():
        per_replica = strategy.run(lambda: two.compute_loss(model, batch, training=False))
    values = [float(v) for v in strategy.experimental_local_results(per_replica)]
    assert values == pytest.approx([float(total / count) / 2] * 2, rel=1e-5)


# Extended (CI runs it after README's default run); the default run covers its case by
# test_train_step_compiles_under_xla_and_learns (the same model under XLA) and the contract's eval
# of the smoke run.
@pytest.mark.extended
def test_eval_step_compiles_under_xla_and_scores_synthetic_copies():
    # As the runner binds it under --xla: static shapes (the whole-batch search, fixed caches).
    bench = smoke_benchmark(**{"model.num_layers": "1"})
    bench = bench.with_context(dataclasses.replace(bench.context, static_shapes=True))
    model = bench.build_model()
    batch = next(iter(bench.eval_dataset(tf.distribute.InputContext())))
    outputs = tf.function(lambda b: bench.eval_step(model, b), jit_compile=True)(batch)
    assert outputs["hypotheses"].shape == (8, bench.max_decode_length)
    numpy_outputs = {k: v.numpy() for k, v in outputs.items()}
    state = bench.eval_reduce(bench.eval_begin(), numpy_outputs)
    assert sorted(state) == list(range(8))
    assert 0.0 <= bench.eval_result(state) < 1.0
    # Perfect hypotheses (the targets themselves) score BLEU 1.
    numpy_outputs["hypotheses"] = numpy_outputs["targets"]
    state = bench.eval_reduce(bench.eval_begin(), numpy_outputs)
    assert bench.eval_result(state) == pytest.approx(1.0)
    # Padding rows are ignored.
    numpy_outputs["valid"][3:] = 0.0
    assert sorted(bench.eval_reduce(bench.eval_begin(), numpy_outputs)) == [0, 1, 2]


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    out = tmp_path_factory.mktemp("transformer") / "data"
    pairs = corpus()
    prepare.prepare(pairs[:280], pairs[280:], str(out), vocab_size=60, seed=0, num_train_shards=2)
    return str(out), pairs[280:]


def real_benchmark(data_dir, **overrides):
    settings = {
        "data_dir": data_dir,
        "model.vocab_size": "60",
        "global_batch_size": "96",
        "eval_batch_size": "8",
        "eval_examples": "20",
        "data.max_sequence_length": "24",
        "data.bucket_lengths": "(8,16,24)",
        "data.batch_multiple": "1",
        "data.eval_max_length": "24",
        **overrides,
    }
    return TransformerBenchmark(override(config_lib.smoke(), settings))


def test_real_data_sizes_come_from_metadata(prepared):
    data_dir, eval_pairs = prepared
    bench = real_benchmark(data_dir)
    assert bench.train_samples() == 280 and bench.eval_samples() == 20
    assert bench.eval_steps(1) == 3
    metadata = prepare.load_metadata(data_dir)
    histogram = {int(k): v for k, v in metadata["train_length_histogram"].items()}
    sizes = {8: 12, 16: 6, 24: 4}  # 96 tokens per batch
    expected = sum(
        n / sizes[min(b for b in sizes if b >= k)] for k, n in histogram.items() if k <= 24
    )
    assert bench.steps_per_epoch == max(1, round(expected))
    with pytest.raises(ConfigError, match="vocab_size"):
        real_benchmark(data_dir, **{"model.vocab_size": "64"}).build_model()


def test_eval_result_detokenizes_and_scores_against_raw_references(prepared):
    data_dir, eval_pairs = prepared
    bench = real_benchmark(data_dir)
    vocab = prepare.load_vocab(os.path.join(data_dir, prepare.VOCAB_MODEL))
    state = bench.eval_begin()
    for index, (_, target) in enumerate(eval_pairs):
        ids = np.array(prepare.encode(vocab, target) + [0, 0])
        state = bench.eval_reduce(
            state,
            {"hypotheses": ids[None], "targets": ids[None], "index": [index], "valid": [1.0]},
        )
    references, hypotheses = bench.translations(state)
    assert references == [t for _, t in eval_pairs] == hypotheses
    assert bench.eval_result(state) == pytest.approx(1.0)


def test_real_data_pipelines_and_eval_step(prepared):
    data_dir, _ = prepared
    bench = real_benchmark(data_dir)
    context = tf.distribute.InputContext()
    batch = next(iter(bench.train_dataset(context)))
    assert batch["inputs"].shape[1] in (8, 16, 24)
    assert batch["inputs"].shape[0] == 96 // batch["inputs"].shape[1]
    eval_batches = list(bench.eval_dataset(context))
    assert len(eval_batches) == 3
    assert sum(float(b["valid"].numpy().sum()) for b in eval_batches) == 20
