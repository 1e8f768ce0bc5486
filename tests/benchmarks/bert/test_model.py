"""Tests of the Keras BERT pretrainer: shapes, names, masking, the gathered MLM head, dtypes."""

import dataclasses
import math
import os

import keras
import numpy as np
import pytest
import tensorflow as tf
import yaml

from benchmarks.bert import config as C
from benchmarks.bert import model as M
from tests.numerics import assert_close

pytestmark = pytest.mark.numerics

TINY = dataclasses.replace(
    C.bert_tiny(40),
    hidden_size=16,
    intermediate_size=32,
    max_position_embeddings=12,
    hidden_dropout_prob=0.0,
    attention_probs_dropout_prob=0.0,
)


def batch(b=2, s=12, p=3, vocab=40, seed=0):
    rng = np.random.default_rng(seed)
    mask = np.ones((b, s), np.int32)
    mask[0, 8:] = 0
    return {
        "input_ids": tf.constant(rng.integers(5, vocab, (b, s)) * mask, tf.int32),
        "input_mask": tf.constant(mask),
        "segment_ids": tf.constant((np.arange(s) >= 4).astype(np.int32)[None].repeat(b, 0) * mask),
        "masked_lm_positions": tf.constant(rng.integers(1, 8, (b, p)), tf.int32),
    }


def count_params(model):
    return sum(int(np.prod(v.shape)) for v in model.trainable_variables)


def expected_params(c):
    """Parameter count of google-research BERT with both pretraining heads."""
    h, i, n = c.hidden_size, c.intermediate_size, c.num_hidden_layers
    embeddings = (c.vocab_size + c.max_position_embeddings + c.type_vocab_size) * h + 2 * h
    layer = 4 * (h * h + h) + 2 * h + (h * i + i) + (i * h + h) + 2 * h
    pooler = h * h + h
    mlm = h * h + h + 2 * h + c.vocab_size  # transform, its LayerNorm, output bias (tied)
    nsp = 2 * h + 2
    return embeddings + n * layer + pooler + mlm + nsp


def test_output_shapes_and_parameter_count():
    model = M.build_pretrainer(TINY)
    out = model(batch())
    assert out["mlm_logits"].shape == (2, 3, 40)
    assert out["nsp_logits"].shape == (2, 2)
    assert count_params(model) == expected_params(TINY)


def test_bert_base_parameter_count():
    """BERT-base: 110M parameters as published (108.9M encoder + heads, tied MLM output)."""
    base = C.bert_base()
    assert expected_params(base) == 110_106_428
    model = M.build_pretrainer(base)
    assert count_params(model) == 110_106_428


def test_tf1_names_match_mlperf_weight_list():
    """The 24-layer model's TF1 names are exactly the tensors MLPerf's BERT rules (training
    1.1.0 closed_bert.yaml) list for `weights_initialization` (BERT-large's variables)."""
    import mlperf_logging

    rules = os.path.join(
        os.path.dirname(mlperf_logging.__file__),
        "compliance_checker",
        "training_1.1.0",
        "closed_bert.yaml",
    )
    with open(rules) as f:
        entries = yaml.safe_load(f)
    end_check = next(e["END"]["CHECK"] for e in entries if "END" in e)
    expected = eval(end_check[end_check.index("sorted([") + 7 : end_check.rindex("])") + 1])
    # Names do not depend on widths: a narrow 24-layer model keeps the test cheap.
    narrow = dataclasses.replace(C.bert_large(), hidden_size=16, intermediate_size=16, vocab_size=8)
    names = M.build_pretrainer(narrow).tf1_variables()
    assert sorted(names) == sorted(expected)
    assert len({id(v) for v in names.values()}) == len(names)


def test_tf1_shapes_are_tf1_layouts():
    names = M.build_pretrainer(TINY).tf1_variables()
    assert tuple(names["bert/encoder/layer_0/attention/self/query/kernel"].shape) == (16, 16)
    assert tuple(names["bert/encoder/layer_1/intermediate/dense/kernel"].shape) == (16, 32)
    assert tuple(names["bert/encoder/layer_1/output/dense/kernel"].shape) == (32, 16)
    assert tuple(names["cls/seq_relationship/output_weights"].shape) == (2, 16)
    assert tuple(names["cls/predictions/output_bias"].shape) == (40,)
    assert tuple(names["bert/embeddings/position_embeddings"].shape) == (12, 16)


def test_padding_does_not_change_real_positions():
    model = M.build_pretrainer(TINY)
    x = batch()
    y = dict(x)
    ids = x["input_ids"].numpy()
    ids[0, 8:] = 33  # change only the padded tokens of example 0
    y["input_ids"] = tf.constant(ids)
    a, b = model(x), model(y)
    assert_close(a["mlm_logits"][0], b["mlm_logits"][0], rtol=1e-5)
    assert_close(a["nsp_logits"][0], b["nsp_logits"][0], rtol=1e-5)


def test_mlm_head_gathers_the_same_logits_as_a_full_sequence_head():
    """Gathering first == computing the head at every position and then picking (reference)."""
    model = M.build_pretrainer(TINY)
    x = batch()
    seq, _ = model.encoder(x["input_ids"], x["input_mask"], x["segment_ids"])
    head = model.mlm_head
    table = model.encoder.embeddings.word_embeddings
    full_positions = tf.tile(tf.range(12)[None], [2, 1])
    full = head(seq, full_positions, table).numpy()  # [2, 12, vocab]
    gathered = model(x)["mlm_logits"].numpy()
    positions = x["masked_lm_positions"].numpy()
    for i in range(2):
        assert_close(gathered[i], full[i, positions[i]], rtol=1e-5)


def test_mlm_output_is_tied_to_word_embeddings():
    model = M.build_pretrainer(TINY)
    x = batch()
    seq, _ = model.encoder(x["input_ids"], x["input_mask"], x["segment_ids"])
    gathered = tf.gather(seq, x["masked_lm_positions"], batch_dims=1)
    head = model.mlm_head
    h = head.layer_norm(head.transform(gathered))
    expected = (
        tf.einsum("bph,vh->bpv", h, model.encoder.embeddings.word_embeddings) + head.output_bias
    )
    assert_close(model(x)["mlm_logits"], expected, rtol=1e-5)


def test_mlm_projection_gradient_is_plain_matmuls():
    """The tied projection is one 2-D MatMul: no batch matmul broadcasting the [vocab, hidden]
    table, whose gradient would sum over the batch (the profile's cost, issue 14)."""
    model = M.build_pretrainer(TINY)
    x = batch()
    seq, _ = model.encoder(x["input_ids"], x["input_mask"], x["segment_ids"])
    table = model.encoder.embeddings.word_embeddings

    @tf.function
    def table_gradient(seq):
        with tf.GradientTape() as tape:
            logits = model.mlm_head(seq, x["masked_lm_positions"], table)
        return tape.gradient(logits, table.value, output_gradients=tf.ones_like(logits))

    ops = {op.type for op in table_gradient.get_concrete_function(seq).graph.get_operations()}
    assert "MatMul" in ops
    assert not ops & {"BatchMatMulV2", "BatchMatMulV3", "Einsum"}, ops


def test_gelu_is_the_tanh_approximation():
    x = np.linspace(-4, 4, 17).astype(np.float32)
    ref = 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)))
    assert_close(M.gelu(tf.constant(x)), ref, rtol=1e-6)


def test_initializers_follow_the_reference():
    model = M.build_pretrainer(dataclasses.replace(TINY, vocab_size=4000))
    emb = model.encoder.embeddings.word_embeddings.numpy()
    assert abs(emb.std() - 0.02 * 0.88) < 0.002  # truncated at 2 std: std shrinks to 0.88 x
    assert np.abs(emb).max() <= 0.04 + 1e-6
    assert np.all(model.mlm_head.output_bias.numpy() == 0)
    assert np.all(model.encoder.blocks[0].output_layer_norm.gamma.numpy() == 1)


@pytest.mark.parametrize(
    "policy", [pytest.param("mixed_bfloat16", marks=pytest.mark.bfloat16), "mixed_float16"]
)
def test_mixed_precision_policy(policy):
    keras.mixed_precision.set_dtype_policy(policy)
    try:
        model = M.build_pretrainer(TINY)
        out = model(batch())
    finally:
        keras.mixed_precision.set_dtype_policy("float32")
    compute = policy.split("_")[1]
    assert out["mlm_logits"].dtype.name == compute
    assert all(v.dtype == "float32" for v in model.trainable_variables)
    assert np.all(np.isfinite(tf.cast(out["mlm_logits"], tf.float32).numpy()))


def test_dropout_only_in_training():
    model = M.build_pretrainer(
        dataclasses.replace(TINY, hidden_dropout_prob=0.5, attention_probs_dropout_prob=0.5)
    )
    x = batch()
    np.testing.assert_array_equal(model(x)["mlm_logits"], model(x)["mlm_logits"])
    assert not np.allclose(model(x, training=True)["mlm_logits"], model(x)["mlm_logits"])


@pytest.mark.peers
def test_same_outputs_as_model_garden_bert_from_the_same_tf1_checkpoint(tmp_path):
    """Our weights, saved under the google-research TF1 names and converted by the Model Garden's
    own TF1 -> V2 converter into its `BertPretrainerV2`, give the same outputs."""
    pytest.importorskip("official.nlp.modeling")
    import tf_keras
    from official.nlp.modeling import models
    from official.nlp.tools import tf1_bert_checkpoint_converter_lib as converter

    from tests.benchmarks.bert.test_checkpoint import write_tf1_checkpoint
    from tools.peers.bench_bert import garden_encoder

    config = dataclasses.replace(TINY, num_attention_heads=4)
    ours = M.build_pretrainer(config)
    values = {name: var.numpy() for name, var in ours.tf1_variables().items()}
    v1 = write_tf1_checkpoint(str(tmp_path / "v1" / "model.ckpt-1"), values)
    renamed = str(tmp_path / "renamed" / "ckpt")
    converter.convert(
        checkpoint_from_path=v1,
        checkpoint_to_path=renamed,
        num_heads=config.num_attention_heads,
        name_replacements=converter.BERT_V2_NAME_REPLACEMENTS,
        permutations=converter.BERT_V2_PERMUTATIONS,
        exclude_patterns=["adam", "Adam"],
    )
    encoder = garden_encoder(config, output_dropout=0.0, attention_dropout=0.0)
    garden = models.BertPretrainerV2(
        encoder_network=encoder,
        mlm_activation=lambda x: tf.nn.gelu(x, approximate=True),
        mlm_initializer=tf_keras.initializers.TruncatedNormal(stddev=0.02),
    )
    garden(garden.inputs)
    garden.load_weights(renamed).assert_existing_objects_matched()

    x = batch()
    theirs = garden(
        {
            "input_word_ids": x["input_ids"],
            "input_mask": x["input_mask"],
            "input_type_ids": x["segment_ids"],
            "masked_lm_positions": x["masked_lm_positions"],
        }
    )
    seq, pooled = ours.encoder(x["input_ids"], x["input_mask"], x["segment_ids"])
    mine = ours(x)
    real = x["input_mask"].numpy().astype(bool)  # padded positions may differ; real ones not
    assert_close(seq.numpy()[real], theirs["sequence_output"].numpy()[real], rtol=1e-4)
    assert_close(pooled, theirs["pooled_output"], rtol=1e-4)
    assert_close(mine["mlm_logits"], theirs["mlm_logits"], rtol=1e-4)


def test_packed_encoder_gives_the_padded_outputs_at_every_real_position():
    keras.utils.set_random_seed(0)
    model = M.build_pretrainer(TINY)
    inputs = batch()
    real = inputs["input_mask"].numpy() > 0
    assert not real.all()  # the batch has padding to skip
    padded = model.encoder(inputs["input_ids"], inputs["input_mask"], inputs["segment_ids"])
    packed = model.encoder(
        inputs["input_ids"], inputs["input_mask"], inputs["segment_ids"], packed=True
    )
    assert_close(packed[0].numpy()[real], padded[0].numpy()[real], rtol=1e-5)
    assert not packed[0].numpy()[~real].any()  # padded slots are zeros, not computed
    assert_close(packed[1], padded[1], rtol=1e-5)  # the [CLS] pooler
    outputs = model(inputs, packed=True)
    assert_close(outputs["mlm_logits"], model(inputs)["mlm_logits"], rtol=1e-4)


def test_packed_encoder_runs_its_block_matmuls_on_the_real_tokens_only():
    model = M.build_pretrainer(TINY)
    inputs = batch()  # [2, 12]

    def block_matmul_rows(packed):
        graph = (
            tf.function(lambda x: model.encoder(*x, training=True, packed=packed))
            .get_concrete_function(
                (inputs["input_ids"], inputs["input_mask"], inputs["segment_ids"])
            )
            .graph
        )
        return {
            op.outputs[0].shape[0]
            for op in graph.get_operations()
            if op.type == "MatMul" and "layer_" in op.name
        }

    assert block_matmul_rows(packed=False) == {2 * 12}
    assert block_matmul_rows(packed=True) == {None}
