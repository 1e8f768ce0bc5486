"""Tests of the token layouts: packing keeps the real slots in row-major order, unpacking
restores them and zeroes the padding, and gradients flow through both."""

import numpy as np
import pytest
import tensorflow as tf

from mlperf_tf.layers import PADDED, PackedTokens

pytestmark = pytest.mark.numerics


def test_packed_tokens_unpack_what_they_pack_and_zero_the_padding():
    real = tf.constant([[True, True, False], [False, False, False], [True, False, False]])
    tokens = PackedTokens(real)
    x = tf.reshape(tf.range(18, dtype=tf.float32), [3, 3, 2])
    packed = tokens.pack(x)
    np.testing.assert_array_equal(packed, [[0, 1], [2, 3], [12, 13]])  # row-major real slots
    np.testing.assert_array_equal(packed, tf.boolean_mask(x, real))
    unpacked = tokens.unpack(packed)
    assert unpacked.shape == (3, 3, 2)
    np.testing.assert_array_equal(unpacked.numpy()[real.numpy()], packed)
    assert not unpacked.numpy()[~real.numpy()].any()


def test_gradients_reach_the_real_slots_only():
    real = tf.constant([[True, False], [True, True]])
    tokens = PackedTokens(real)
    x = tf.random.normal([2, 2, 3])
    with tf.GradientTape() as tape:
        tape.watch(x)
        y = tf.reduce_sum(tokens.unpack(tokens.pack(x) * 2.0))
    grad = tape.gradient(y, x).numpy()
    np.testing.assert_array_equal(grad[real.numpy()], 2.0)
    np.testing.assert_array_equal(grad[~real.numpy()], 0.0)


def test_unpack_keeps_static_shapes_in_a_graph():
    @tf.function
    def roundtrip(x, real):
        tokens = PackedTokens(real)
        packed = tokens.pack(x)
        assert packed.shape.as_list() == [None, 4]  # data-dependent token count
        unpacked = tokens.unpack(packed)
        assert unpacked.shape.as_list() == [2, 5, 4]  # the batch's static shape
        return unpacked

    x = tf.ones([2, 5, 4])
    real = tf.sequence_mask([3, 5], 5)
    np.testing.assert_array_equal(roundtrip(x, real).numpy().sum(axis=(1, 2)), [12, 20])


def test_padded_layout_is_the_identity():
    x = tf.random.normal([2, 3, 4])
    assert PADDED.pack(x) is x and PADDED.unpack(x) is x
