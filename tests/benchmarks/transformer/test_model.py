"""Tests of the Transformer model: masks, shared weights, positions, cached decoding."""

import math

import keras
import numpy as np
import pytest
import tensorflow as tf

from benchmarks.transformer import model as model_lib
from tests.numerics import assert_close

pytestmark = pytest.mark.numerics

VOCAB = 40


def tiny_model(seed=0, scale=1.0, **overrides):
    keras.utils.set_random_seed(seed)
    params = model_lib.TransformerParams(
        **{
            "vocab_size": VOCAB,
            "hidden_size": 16,
            "num_layers": 2,
            "num_heads": 2,
            "filter_size": 32,
            **overrides,
        }
    )
    model = model_lib.Transformer(params)
    model.build()
    if scale != 1.0:  # larger weights make the outputs depend strongly on every input
        for variable in model.trainable_variables:
            variable.assign(variable * scale)
    return model


def random_pairs(seed=0, batch=3, src_len=6, tgt_len=5):
    rng = np.random.default_rng(seed)
    inputs = rng.integers(3, VOCAB, size=(batch, src_len)).astype(np.int32)
    targets = rng.integers(3, VOCAB, size=(batch, tgt_len)).astype(np.int32)
    inputs[1, 4:] = 0  # a padded source
    targets[2, 3:] = 0  # a padded target
    return tf.constant(inputs), tf.constant(targets)


def test_logits_shape_and_dtype():
    model = tiny_model()
    inputs, targets = random_pairs()
    logits = model({"inputs": inputs, "targets": targets})
    assert logits.shape == (3, 5, VOCAB)
    assert logits.dtype == tf.float32


def test_embedding_is_shared_with_the_softmax():
    model = tiny_model()
    matrices = [v for v in model.trainable_variables if tuple(v.shape) == (VOCAB, 16)]
    assert len(matrices) == 1  # no separate softmax or target embedding
    x = tf.random.normal([2, 3, 16])
    expected = tf.einsum("blh,vh->blv", x, matrices[0])
    assert_close(model.embedding(x, mode="linear"), expected, rtol=1e-5)
    ids = tf.constant([[5, 7]])
    assert_close(model.embedding(ids), tf.gather(matrices[0], ids) * math.sqrt(16), rtol=1e-6)


def test_position_encoding_matches_the_formula():
    length, hidden = 7, 10
    signal = model_lib.position_encoding(length, hidden).numpy()
    half = hidden // 2
    for pos in (0, 3, 6):
        timescales = [1.0e4 ** (i / (half - 1)) for i in range(half)]
        assert_close(signal[pos, :half], [math.sin(pos / t) for t in timescales], rtol=1e-5)
        assert_close(signal[pos, half:], [math.cos(pos / t) for t in timescales], rtol=1e-5)


def test_decoder_is_causal():
    model = tiny_model(scale=3.0)
    inputs, targets = random_pairs()
    logits = model({"inputs": inputs, "targets": targets}).numpy()
    changed = targets.numpy().copy()
    changed[:, 3:] = 7  # change the future from position 3 on
    new_logits = model({"inputs": inputs, "targets": tf.constant(changed)}).numpy()
    # Position t sees targets < t (the input is shifted right), so 0..3 are unchanged.
    assert_close(new_logits[:, :4], logits[:, :4], rtol=1e-4)
    assert np.abs(new_logits[:, 4] - logits[:, 4]).max() > 1e-2 * np.abs(logits).max()


def test_source_padding_is_masked():
    model = tiny_model(scale=3.0)
    inputs, targets = random_pairs()
    logits = model({"inputs": inputs, "targets": targets}).numpy()
    longer = tf.pad(inputs, [[0, 0], [0, 4]])  # more pad positions change nothing
    # A longer source runs other matmul shapes (so other oneDNN kernels and summation orders):
    # logits of ~28 move by up to 1.5e-4 between CPUs; an unmasked pad moves them by ~25.
    assert_close(model({"inputs": longer, "targets": targets}).numpy(), logits, rtol=1e-4)
    # A real token does change the output.
    other = inputs.numpy().copy()
    other[0, 0] = (other[0, 0] + 1 - 3) % (VOCAB - 3) + 3
    moved = model({"inputs": tf.constant(other), "targets": targets}).numpy() - logits
    assert np.abs(moved).max() > 1e-2 * np.abs(logits).max()


def test_all_pad_source_stays_finite():
    model = tiny_model()
    logits = model({"inputs": tf.zeros([2, 4], tf.int32), "targets": tf.zeros([2, 3], tf.int32)})
    assert np.isfinite(logits.numpy()).all()


def test_cached_incremental_decoding_equals_full_decoding():
    model = tiny_model(scale=2.0)
    inputs, targets = random_pairs(tgt_len=6)
    encoder_outputs, mask = model.encode(inputs)
    full = model.decode(targets, encoder_outputs, mask).numpy()  # [b, 6, vocab]
    cache, static = model.init_cache(encoder_outputs, mask, max_decode_length=8)
    previous = tf.zeros([3, 1], tf.int32)
    for step in range(6):
        logits, cache = model.decode_step(previous, tf.constant(step), cache, static)
        assert_close(logits.numpy(), full[:, step], rtol=1e-4)
        previous = targets[:, step : step + 1]


def test_decode_step_compiles_under_xla():
    model = tiny_model()
    inputs, _ = random_pairs()
    encoder_outputs, mask = model.encode(inputs)
    cache, static = model.init_cache(encoder_outputs, mask, max_decode_length=4)
    ids = tf.fill([3, 1], 5)
    eager, _ = model.decode_step(ids, tf.constant(0), cache, static)
    compiled = tf.function(model.decode_step, jit_compile=True)
    xla, new_cache = compiled(ids, tf.constant(0), cache, static)
    assert_close(xla.numpy(), eager.numpy(), rtol=1e-4)
    assert new_cache["layer_0"]["k"].shape == cache["layer_0"]["k"].shape


def test_training_dropout_is_active_only_in_training():
    model = tiny_model(dropout=0.5, attention_dropout=0.5, relu_dropout=0.5)
    inputs, targets = random_pairs()
    batch = {"inputs": inputs, "targets": targets}
    np.testing.assert_allclose(model(batch).numpy(), model(batch).numpy())
    assert np.abs(model(batch, training=True).numpy() - model(batch).numpy()).max() > 1e-4


@pytest.mark.bfloat16
def test_mixed_bfloat16_policy():
    previous = keras.config.dtype_policy()
    keras.config.set_dtype_policy("mixed_bfloat16")
    try:
        model = tiny_model()
        inputs, targets = random_pairs()
        logits = model({"inputs": inputs, "targets": targets})
        assert logits.dtype == tf.bfloat16
        assert all(v.dtype == "float32" for v in model.trainable_variables)
        assert np.isfinite(tf.cast(logits, tf.float32).numpy()).all()
    finally:
        keras.config.set_dtype_policy(previous)


def test_variants_and_validation():
    big = model_lib.big(33708)
    assert (big.hidden_size, big.num_layers, big.num_heads, big.filter_size) == (1024, 6, 16, 4096)
    assert big.dropout == 0.1
    base = model_lib.base(100)
    assert (base.hidden_size, base.num_heads, base.filter_size) == (512, 8, 2048)
    assert model_lib.tiny(10).hidden_size == 32
    with pytest.raises(ValueError, match="num_heads"):
        model_lib.TransformerParams(
            vocab_size=10, hidden_size=30, num_layers=1, num_heads=4, filter_size=8
        )
    with pytest.raises(ValueError, match="dropout"):
        model_lib.TransformerParams(
            vocab_size=10, hidden_size=8, num_layers=1, num_heads=2, filter_size=8, dropout=1.0
        )


def test_parameter_count_matches_the_architecture():
    model = tiny_model()
    h, f, v, n = 16, 32, VOCAB, 2
    attention = 4 * h * h  # q, k, v and output kernels, no biases (as in the reference)
    ffn = h * f + f + f * h + h
    norm = 2 * h
    encoder = n * (attention + ffn + 2 * norm) + norm
    decoder = n * (2 * attention + ffn + 3 * norm) + norm
    total = sum(int(np.prod(w.shape)) for w in model.trainable_variables)
    assert total == v * h + encoder + decoder


@pytest.mark.parametrize("to_heads", [True, False])
def test_heads_projection_equals_the_einsum_dense_it_replaces(to_heads):
    """Same kernel shape, Glorot fans and seed as Keras' EinsumDense; same product; plain MatMuls."""
    hidden, heads = 12, 3
    equation, in_shape, out_shape = (
        ("bte,enh->btnh", (None, None, hidden), (None, heads, hidden // heads))
        if to_heads
        else ("btnh,nhe->bte", (None, None, heads, hidden // heads), (None, hidden))
    )
    keras.utils.set_random_seed(7)
    einsum = keras.layers.EinsumDense(equation, output_shape=out_shape)
    einsum.build(in_shape)
    keras.utils.set_random_seed(7)
    ours = model_lib.HeadsProjection(hidden, heads, to_heads)
    ours.build()
    np.testing.assert_array_equal(ours.kernel.numpy(), einsum.kernel.numpy())

    x = tf.random.stateless_normal((2, 5, *in_shape[2:]), seed=(1, 2))
    assert_close(ours(x).numpy(), einsum(x).numpy(), rtol=1e-5)

    @tf.function
    def kernel_gradient(x):
        with tf.GradientTape() as tape:
            y = ours(x)
        return tape.gradient(y, ours.kernel, output_gradients=tf.ones_like(y))

    graph = kernel_gradient.get_concrete_function(x).graph
    op_types = {op.type for op in graph.get_operations()}
    assert "MatMul" in op_types
    assert not op_types & {"BatchMatMulV2", "BatchMatMulV3", "Einsum", "Sum"}, op_types


def test_packed_streams_give_the_padded_states_of_every_real_target():
    model = tiny_model(scale=2.0)
    inputs, targets = random_pairs(src_len=7, tgt_len=6)
    batch = {"inputs": inputs, "targets": targets}
    padded = model.teacher_forced_states(batch)  # [b, l, hidden]
    packed = model.teacher_forced_states(batch, packed=True)  # [tokens, hidden]
    real = targets.numpy() != model_lib.PAD_ID
    assert packed.shape == (real.sum(), 16)
    assert_close(packed, padded.numpy()[real], rtol=1e-4)
    # Not trivially equal: the padded source changes what its real targets see.
    other = dict(batch, inputs=tf.where(inputs == 0, 9, inputs))
    moved = model.teacher_forced_states(other, packed=True).numpy() - packed.numpy()
    assert np.abs(moved).max() > 1e-2 * np.abs(packed.numpy()).max()


def test_packed_streams_run_every_per_token_matmul_on_the_real_tokens_only():
    model = tiny_model()
    inputs, targets = random_pairs()  # [3, 6] and [3, 5]

    def matmul_rows(packed):
        graph = (
            tf.function(lambda batch: model.teacher_forced_states(batch, True, packed))
            .get_concrete_function({"inputs": inputs, "targets": targets})
            .graph
        )
        return {op.outputs[0].shape[0] for op in graph.get_operations() if op.type == "MatMul"}

    # Projections and feed-forward are 2-D MatMuls over the tokens: every slot when padded,
    # the real tokens only (a data-dependent count) when packed.
    assert matmul_rows(packed=False) == {3 * 6, 3 * 5}
    assert matmul_rows(packed=True) == {None}
