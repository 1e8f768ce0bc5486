"""Tests of `mlperf_tf.flops`: analytic FLOP counts against TF's profiler and hand counts."""

import json

import keras
import pytest
import tensorflow as tf

from mlperf_tf import flops


def _profiler_flops(graph) -> int:
    opts = tf.compat.v1.profiler.ProfileOptionBuilder.float_operation()
    opts["output"] = "none"
    return tf.compat.v1.profiler.profile(graph, options=opts).total_float_ops


def _tiny_conv_net():
    inputs = keras.Input((8, 8, 3), batch_size=4)
    x = keras.layers.Conv2D(5, 3, strides=1, padding="same", use_bias=False)(inputs)
    x = keras.layers.Conv2D(6, 3, strides=2, padding="valid", use_bias=False)(x)
    x = keras.layers.Flatten()(x)
    x = keras.layers.Dense(7, use_bias=False)(x)
    return keras.Model(inputs, x)


def test_conv_and_dense_match_tf_profiler_and_hand_count():
    model = _tiny_conv_net()
    spec = tf.TensorSpec((4, 8, 8, 3), tf.float32)
    concrete = tf.function(lambda x: model(x)).get_concrete_function(spec)
    count = flops.count_graph_flops(concrete.graph)
    # Hand count: conv1 8*8*5 outputs x 3*3*3 MACs; conv2 3*3*6 outputs x 3*3*5; dense 54 x 7.
    hand = 4 * 2 * (8 * 8 * 5 * 27 + 3 * 3 * 6 * 45 + 54 * 7)
    assert count.total == hand
    assert count.total == _profiler_flops(concrete.graph)
    assert set(count.by_op_type) == {"Conv2D", "MatMul"}


def test_batched_matmul_matches_tf_profiler():
    a_spec = tf.TensorSpec((3, 4, 5), tf.float32)
    b_spec = tf.TensorSpec((3, 5, 6), tf.float32)
    concrete = tf.function(lambda a, b: tf.matmul(a, b)).get_concrete_function(a_spec, b_spec)
    count = flops.count_graph_flops(concrete.graph)
    assert count.total == 2 * 3 * 4 * 5 * 6
    assert count.total == _profiler_flops(concrete.graph)


def test_transposed_matmul_counts_the_contracted_dim_once():
    a_spec = tf.TensorSpec((5, 4), tf.float32)  # used transposed: [4, 5]
    b_spec = tf.TensorSpec((6, 5), tf.float32)  # used transposed: [5, 6]
    count = flops.count_function_flops(
        lambda a, b: tf.matmul(a, b, transpose_a=True, transpose_b=True), a_spec, b_spec
    )
    assert count.total == 2 * 4 * 5 * 6


def test_einsum_dense_and_attention_hand_counts():
    # EinsumDense "abc,cde->abde": [batch 2, length 7, hidden 8] x [8, heads 2, depth 4].
    assert flops.einsum_flops("abc,cde->abde", [[2, 7, 8], [8, 2, 4]]) == 2 * 2 * 7 * 8 * 2 * 4
    # Attention scores "bqhd,bkhd->bhqk": every (b, q, k, h) sums over d.
    assert (
        flops.einsum_flops("bqhd,bkhd->bhqk", [[2, 5, 3, 4], [2, 6, 3, 4]]) == 2 * 2 * 5 * 6 * 3 * 4
    )
    # Ellipsis stands for the leading dims.
    assert flops.einsum_flops("...c,cd->...d", [[2, 7, 8], [8, 3]]) == 2 * 2 * 7 * 8 * 3
    with pytest.raises(ValueError, match="operands"):
        flops.einsum_flops("ab,bc->ac", [[2, 3]])


def test_keras_einsum_dense_is_counted_from_the_graph():
    layer = keras.layers.EinsumDense("abc,cde->abde", output_shape=(None, 2, 4), bias_axes=None)
    spec = tf.TensorSpec((2, 7, 8), tf.float32)
    count = flops.count_function_flops(lambda x: layer(x), spec)
    assert count.total == 2 * 2 * 7 * 8 * 2 * 4


def test_backward_pass_is_about_twice_the_forward():
    """The 3x convention: the gradient graph's products are ~2x the forward ones (the first
    layer needs no input gradient, so a little less)."""
    model = keras.Sequential(
        [keras.Input((16,), batch_size=8)]
        + [keras.layers.Dense(16, use_bias=False) for _ in range(6)]
    )
    spec = tf.TensorSpec((8, 16), tf.float32)

    def forward_and_backward(x):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(model(x))
        return tape.gradient(loss, model.trainable_variables)

    forward = flops.count_function_flops(lambda x: model(x), spec).total
    both = flops.count_function_flops(forward_and_backward, spec).total
    assert forward == 6 * 2 * 8 * 16 * 16
    assert both == pytest.approx(forward * (1 + 2 - 1 / 6))


def test_training_flops_per_sample_of_the_smoke_presets_match_the_committed_cache():
    with open(flops.cache_path(), encoding="utf-8") as f:
        cache = json.load(f)
    for name in ("resnet50", "bert"):
        value = flops.training_flops_per_sample(name, "smoke")
        assert value == pytest.approx(cache[name]["smoke"]["training_flops_per_sample"])
        assert value == 3 * cache[name]["smoke"]["forward_flops_per_sample"]


def test_committed_resnet50_count_is_the_published_4_1_g_multiply_adds():
    with open(flops.cache_path(), encoding="utf-8") as f:
        forward = json.load(f)["resnet50"]["mlperf"]["forward_flops_per_sample"]
    assert forward / 2 == pytest.approx(4.1e9, rel=0.02)


def test_unknown_benchmark_and_preset_are_user_errors():
    from mlperf_tf.errors import UserError

    with pytest.raises(UserError, match="unknown benchmark 'nope'"):
        flops.training_flops_per_sample("nope")
    with pytest.raises(UserError, match="no preset 'huge'"):
        flops.training_flops_per_sample("resnet50", "huge")


def _decoder(**kwargs) -> flops.DecoderShape:
    shape = dict(vocab_size=100, hidden_size=8, num_layers=4, num_attention_heads=2,
                 num_key_value_heads=1, head_dim=4, intermediate_size=16)  # fmt: skip
    return flops.DecoderShape(**{**shape, **kwargs})


def test_decoder_flops_hand_count_dense():
    # Per layer: q, o (8 x 2 x 4 each), k, v (8 x 1 x 4 each), SwiGLU 3 x 8 x 16; output 8 x 100.
    weights = 4 * (2 * 64 + 2 * 32 + 3 * 128) + 800
    attention = 4 * 2 * 2 * 10 * 2 * 4  # layers x 2 products x 2 FLOPs x keys x heads x dim
    per_token = flops.decoder_forward_flops_per_token(_decoder(), 10)
    assert per_token == {
        "dense": 2.0 * weights,
        "attention": attention,
        "total": 2.0 * weights + attention,
    }
    assert flops.decoder_training_flops_per_sample(_decoder(), 10) == 3 * 10 * per_token["total"]


def test_decoder_flops_count_active_experts_and_sliding_windows():
    dense = flops.decoder_forward_flops_per_token(_decoder(), 64)
    # Two MoE layers of 8 experts (width 6), top-2: router 8 x 8 plus two experts' 3 x 8 x 6,
    # instead of the dense 3 x 8 x 16; the other 6 experts do not count.
    moe = flops.decoder_forward_flops_per_token(
        _decoder(moe_layers=2, num_experts=8, experts_per_token=2, expert_intermediate_size=6), 64
    )
    assert moe["dense"] == dense["dense"] + 2 * 2 * (64 + 2 * 144 - 384)
    assert moe["attention"] == dense["attention"]
    # Two layers attend over a window of 16 of the 64 tokens: their attention is a quarter.
    windowed = flops.decoder_forward_flops_per_token(
        _decoder(sliding_window=16, sliding_layers=2), 64
    )
    assert windowed["attention"] == dense["attention"] * (2 + 2 * 16 / 64) / 4
    assert windowed["dense"] == dense["dense"]
    # A window longer than the sequence is the sequence.
    wide = flops.decoder_forward_flops_per_token(
        _decoder(sliding_window=1000, sliding_layers=4), 64
    )
    assert wide == dense


def test_a_benchmark_declaring_its_flops_is_not_traced():
    from mlperf_tf import registry

    cls = registry.get("llama31_8b")
    bench = cls(cls.preset("mlperf"))  # 8 B parameters: tracing would build 32 GB of weights
    counted = flops.declared_or_traced(bench)
    assert counted["training_flops_per_sample"] == bench.training_flops_per_sample()
    assert counted["trainable_parameters"] == bench.parameter_count()
    undeclared = type("Undeclared", (cls,), {"training_flops_per_sample": lambda self: None})
    with pytest.raises(ValueError, match="too many to trace"):
        flops.declared_or_traced(undeclared(cls.preset("mlperf")))
