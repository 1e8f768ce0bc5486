"""Tests for mlperf_tf.layers.token_matmul: the einsum's value, as plain 2-D MatMuls."""

import numpy as np
import pytest
import tensorflow as tf

from mlperf_tf.layers import token_matmul

pytestmark = pytest.mark.numerics


@pytest.mark.parametrize("transpose_b", [False, True])
def test_equals_the_einsum_with_plain_matmul_gradients(transpose_b):
    x = tf.random.stateless_normal((2, 3, 5, 4), seed=(1, 2))
    matrix = tf.Variable(tf.random.stateless_normal((6, 4) if transpose_b else (4, 6), seed=(3, 4)))
    equation = "abck,mk->abcm" if transpose_b else "abck,km->abcm"
    np.testing.assert_allclose(
        token_matmul(x, matrix, transpose_b=transpose_b).numpy(),
        tf.einsum(equation, x, matrix).numpy(),
        rtol=1e-5,
        atol=1e-6,
    )

    @tf.function
    def gradients(x):
        with tf.GradientTape() as tape:
            tape.watch(x)
            y = token_matmul(x, matrix, transpose_b=transpose_b)
        return tape.gradient(y, [x, matrix], output_gradients=tf.ones_like(y))

    graph = gradients.get_concrete_function(tf.TensorSpec([None, 3, 5, 4])).graph
    types = {op.type for op in graph.get_operations()}
    assert "MatMul" in types
    assert not types & {"BatchMatMulV2", "BatchMatMulV3", "Einsum", "Sum"}, types
    grad_x, grad_matrix = gradients(x)
    with tf.GradientTape() as tape:
        tape.watch(x)
        y = tf.einsum(equation, x, matrix)
    want_x, want_matrix = tape.gradient(y, [x, matrix], output_gradients=tf.ones_like(y))
    np.testing.assert_allclose(grad_x.numpy(), want_x.numpy(), rtol=1e-5)
    np.testing.assert_allclose(grad_matrix.numpy(), want_matrix.numpy(), rtol=1e-5)
