"""Provides token layouts: a sequence batch kept padded, [batch, length, ...], or packed,
[tokens, ...] with only its real (non-pad) slots.

Why: padded slots weigh nothing in an attention model's loss and are masked out of every
attention, yet a padded batch runs every per-token layer (projections, feed-forward, layer norm,
dropout) on them. Packed, those layers run on the real tokens only; attention `unpack`s its
queries, keys and values into [batch, length, ...] (zeros where padded, which its mask hides)
and `pack`s its output. Real positions compute exactly what they compute padded, so loss and
gradients are the same, and the work saved is the batch's padding (issue 14: the Transformer
and BERT steps). Packed shapes depend on the data, which XLA cannot compile: under
`Benchmark.static_shapes` (`--xla`, TPUs) a model keeps `PADDED`.
"""

from __future__ import annotations

import tensorflow as tf


class PaddedTokens:
    """Every slot of [batch, length, ...] is kept: `pack` and `unpack` are the identity."""

    def pack(self, x):
        return x

    def unpack(self, x):
        return x


class PackedTokens:
    """Only the real slots of a [batch, length] batch: [tokens, ...], in row-major order (the
    order of `tf.boolean_mask(x, real)`)."""

    def __init__(self, real: tf.Tensor):
        """`real`: bool [batch, length], True at the real (non-pad) slots."""
        self.real = real
        self.positions = tf.where(real)  # [tokens, 2]
        self.slots = tf.shape(real, out_type=tf.int64)

    def pack(self, x):
        """[batch, length, ...] -> [tokens, ...]."""
        return tf.gather_nd(x, self.positions)

    def unpack(self, x):
        """[tokens, ...] -> [batch, length, ...], zeros in the padded slots."""
        shape = tf.concat([self.slots, tf.shape(x, out_type=tf.int64)[1:]], 0)
        padded = tf.scatter_nd(self.positions, x, shape)
        padded.set_shape(self.real.shape.concatenate(x.shape[1:]))
        return padded


PADDED = PaddedTokens()
