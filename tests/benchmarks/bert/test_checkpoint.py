"""Tests of loading TF1 (google-research / MLPerf) BERT checkpoints into the Keras model."""

import dataclasses

import numpy as np
import pytest
import tensorflow as tf

from benchmarks.bert import BertBenchmark
from benchmarks.bert import checkpoint as ckpt
from benchmarks.bert import config as C
from benchmarks.bert.model import build_pretrainer
from mlperf_tf.errors import DataError
from tests import strategies

TINY = dataclasses.replace(
    C.bert_tiny(50), hidden_size=8, intermediate_size=16, max_position_embeddings=16
)


def tf1_values(model_config, seed=0):
    """Random values for every TF1 name of a model of `model_config` (TF1 shapes)."""
    rng = np.random.default_rng(seed)
    shapes = {n: tuple(v.shape) for n, v in build_pretrainer(model_config).tf1_variables().items()}
    return {n: rng.standard_normal(s).astype(np.float32) for n, s in sorted(shapes.items())}


def write_tf1_checkpoint(prefix, values):
    """Writes `values` as a TF1 checkpoint: graph-mode variables saved by tf.compat.v1 Saver,
    so the checkpoint keys are exactly the variable names (as in model.ckpt-28252)."""
    graph = tf.Graph()
    with graph.as_default():
        variables = [
            tf.compat.v1.get_variable(name, initializer=tf.constant(value))
            for name, value in values.items()
        ]
        saver = tf.compat.v1.train.Saver(variables)
        with tf.compat.v1.Session(graph=graph) as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            return saver.save(sess, prefix, write_meta_graph=False)


def with_reference_extras(values):
    """Adds what the MLPerf checkpoint also holds: LAMB slots and the global step."""
    extra = dict(values)
    for name, value in values.items():
        extra[name + "/adam_m"] = np.zeros_like(value)
        extra[name + "/adam_v"] = np.ones_like(value)
    extra["global_step"] = np.array(28252, np.int64)
    return extra


def test_checkpoint_keys_are_the_tf1_names(tmp_path):
    values = tf1_values(TINY)
    prefix = write_tf1_checkpoint(str(tmp_path / "model.ckpt-7"), values)
    names = dict(tf.train.list_variables(prefix))
    assert "bert/encoder/layer_1/attention/self/query/kernel" in names
    assert names["cls/seq_relationship/output_weights"] == [2, 8]


def test_values_land_in_the_right_keras_variables(tmp_path):
    values = tf1_values(TINY)
    prefix = write_tf1_checkpoint(str(tmp_path / "model.ckpt-28252"), with_reference_extras(values))
    model = build_pretrainer(TINY)
    report = ckpt.load_tf1_checkpoint(model, prefix)
    targets = model.tf1_variables()
    for name, value in values.items():
        np.testing.assert_array_equal(targets[name].numpy(), value, err_msg=name)
    assert set(report.loaded) == set(values)
    assert "global_step" in report.skipped
    assert "bert/pooler/dense/kernel/adam_m" in report.skipped
    # Spot checks through the Keras structure, independent of tf1_variables():
    encoder = model.encoder
    np.testing.assert_array_equal(
        encoder.blocks[1].value.kernel.numpy(),
        values["bert/encoder/layer_1/attention/self/value/kernel"],
    )
    np.testing.assert_array_equal(
        encoder.blocks[0].output_layer_norm.gamma.numpy(),
        values["bert/encoder/layer_0/output/LayerNorm/gamma"],
    )
    np.testing.assert_array_equal(
        model.nsp_head.output_weights.numpy(), values["cls/seq_relationship/output_weights"]
    )
    np.testing.assert_array_equal(
        encoder.embeddings.word_embeddings.numpy(), values["bert/embeddings/word_embeddings"]
    )


def test_loaded_weights_drive_the_forward_pass(tmp_path):
    """The loaded checkpoint, not the random init, decides the outputs (two loads agree)."""
    values = tf1_values(TINY, seed=3)
    prefix = write_tf1_checkpoint(str(tmp_path / "m"), values)
    batch = {
        "input_ids": tf.constant([[2, 7, 9, 3, 0, 0]]),
        "input_mask": tf.constant([[1, 1, 1, 1, 0, 0]]),
        "segment_ids": tf.constant([[0, 0, 0, 1, 0, 0]]),
        "masked_lm_positions": tf.constant([[1, 2]]),
    }
    outputs = []
    for seed in (1, 2):
        tf.keras.utils.set_random_seed(seed)
        model = build_pretrainer(TINY)
        ckpt.load_tf1_checkpoint(model, prefix)
        outputs.append(model(batch)["mlm_logits"].numpy())
    np.testing.assert_allclose(outputs[0], outputs[1], rtol=1e-6)


def test_missing_variable_is_an_error_listing_it(tmp_path):
    values = tf1_values(TINY)
    del values["bert/encoder/layer_1/intermediate/dense/bias"]
    del values["cls/predictions/output_bias"]
    prefix = write_tf1_checkpoint(str(tmp_path / "m"), values)
    model = build_pretrainer(TINY)
    before = model.encoder.pooler.kernel.numpy()
    with pytest.raises(ckpt.CheckpointMismatchError) as info:
        ckpt.load_tf1_checkpoint(model, prefix)
    message = str(info.value)
    assert "2 model variables missing" in message
    assert "bert/encoder/layer_1/intermediate/dense/bias" in message
    assert "cls/predictions/output_bias" in message
    # All or nothing: no variable was assigned.
    np.testing.assert_array_equal(model.encoder.pooler.kernel.numpy(), before)


def test_shape_mismatch_and_unexpected_weights_are_listed(tmp_path):
    values = tf1_values(TINY)
    values["bert/pooler/dense/kernel"] = np.zeros((8, 9), np.float32)
    values["bert/encoder/layer_2/output/dense/kernel"] = np.zeros((16, 8), np.float32)
    prefix = write_tf1_checkpoint(str(tmp_path / "m"), values)
    with pytest.raises(ckpt.CheckpointMismatchError) as info:
        ckpt.load_tf1_checkpoint(build_pretrainer(TINY), prefix)
    message = str(info.value)
    assert "bert/pooler/dense/kernel (checkpoint (8, 9) vs model (8, 8))" in message
    assert "1 weights in it that the model lacks: bert/encoder/layer_2/output/dense/kernel" in (
        message
    )


def test_bert_base_checkpoint_into_tiny_model_lists_many(tmp_path):
    shapes = {f"bert/encoder/layer_{i}/output/dense/bias": [8] for i in range(40)}
    problems = ckpt.check_variables(shapes, {"bert/pooler/dense/bias": (8,)})
    assert problems[0].startswith("1 model variables missing")
    assert "(+15 more)" in problems[1]  # 40 unexpected, 25 listed


def test_missing_and_corrupt_checkpoint_files(tmp_path):
    model = build_pretrainer(TINY)
    with pytest.raises(DataError, match="not found"):
        ckpt.load_tf1_checkpoint(model, str(tmp_path / "nope"))
    with pytest.raises(DataError, match="holds no TF checkpoint"):
        ckpt.load_tf1_checkpoint(model, str(tmp_path))
    (tmp_path / "bad.index").write_bytes(b"not a checkpoint index")
    with pytest.raises(DataError, match="cannot read init_checkpoint"):
        ckpt.load_tf1_checkpoint(model, str(tmp_path / "bad"))


def test_directory_resolves_to_latest_checkpoint(tmp_path):
    values = tf1_values(TINY)
    write_tf1_checkpoint(str(tmp_path / "model.ckpt-5"), values)
    # A Saver writes no 'checkpoint' state file when saving with write_state=True only via
    # save(); it does here, so the directory resolves.
    model = build_pretrainer(TINY)
    report = ckpt.load_tf1_checkpoint(model, str(tmp_path))
    assert report.path.endswith("model.ckpt-5")


def test_benchmark_restores_init_checkpoint_under_mirrored_strategy(tmp_path):
    values = tf1_values(TINY)
    prefix = write_tf1_checkpoint(str(tmp_path / "model.ckpt-1"), values)
    config = dataclasses.replace(
        C.smoke(),
        model=TINY,
        data=dataclasses.replace(C.smoke().data, max_seq_length=16),
        init_checkpoint=prefix,
    )
    bench = BertBenchmark(config)
    strategy = strategies.mirrored(2)
    with strategy.scope():
        model = bench.build_model()
        bench.restore_initial_weights(model)
    kernel = model.encoder.blocks[0].query.kernel
    for replica_value in strategy.experimental_local_results(kernel):
        np.testing.assert_array_equal(
            replica_value.numpy(), values["bert/encoder/layer_0/attention/self/query/kernel"]
        )
