"""Provides `token_matmul`: a projection of every token's features as one 2-D MatMul."""

from __future__ import annotations

import tensorflow as tf


def token_matmul(x: tf.Tensor, matrix: tf.Tensor, *, transpose_b: bool = False) -> tf.Tensor:
    """`x` [..., k] times `matrix` [k, m] ([m, k] with `transpose_b`): [..., m].

    The leading axes are flattened into one, so forward and both gradients are plain 2-D
    `MatMul`s. Why not `keras.ops.einsum` or `EinsumDense`: Keras' TF backend rewrites
    "abc,cd->abd"-like products as a batch matmul that broadcasts the matrix over the batch,
    and the matrix's gradient then needs a `Sum` over it. Profiled on these CPUs that was the
    Transformer's attention projections (1.1 s of `BatchMatMulV2` and 0.2 s of `Sum` per base
    step) and BERT's tied masked-LM projection (gradients 5x its forward) — issue 14.
    """
    out_features = matrix.shape[0] if transpose_b else matrix.shape[1]
    flat = tf.reshape(x, [-1, x.shape[-1]])
    product = tf.matmul(flat, matrix, transpose_b=transpose_b)
    return tf.reshape(product, tf.concat([tf.shape(x)[:-1], [out_features]], 0))
