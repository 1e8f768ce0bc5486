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
    order of `tf.boolean_mask(x, real)`).

    Both directions are one `tf.gather` over the flattened slots (cheaper on CPU than
    `gather_nd`/`scatter_nd`): `pack` gathers the real slots, `unpack` gathers every slot from
    the tokens with a zero row in front, which the padded slots index.
    """

    def __init__(self, real: tf.Tensor):
        """`real`: bool [batch, length], True at the real (non-pad) slots."""
        self.real = real
        flat = tf.reshape(real, [-1])
        self.token_slots = tf.where(flat)[:, 0]  # [tokens]: the slot of each token
        # Each slot's row in [zeros; tokens]: 1 + its token index, or 0 (the zero row) if padded.
        is_real = tf.cast(flat, tf.int32)
        self.slot_rows = tf.cumsum(is_real) * is_real
        self.slots = tf.shape(real)

    def pack(self, x):
        """[batch, length, ...] -> [tokens, ...]."""

        @tf.custom_gradient
        def pack(x):
            return self._gather_tokens(x), self._scatter_tokens

        return pack(x)

    def unpack(self, x):
        """[tokens, ...] -> [batch, length, ...], zeros in the padded slots."""

        @tf.custom_gradient
        def unpack(x):
            return self._scatter_tokens(x), self._gather_tokens

        padded = unpack(x)
        padded.set_shape(self.real.shape.concatenate(x.shape[1:]))
        return padded

    # Each direction is the other's gradient, so the backward pass is gathers too (TF's own
    # gradient of a gather is a segment sum into a zeroed tensor).
    def _gather_tokens(self, x):
        flat = tf.reshape(x, tf.concat([[-1], tf.shape(x)[2:]], 0))
        return tf.gather(flat, self.token_slots)

    def _scatter_tokens(self, x):
        rows = tf.concat([tf.zeros_like(x[:1]), x], 0)
        return tf.reshape(
            tf.gather(rows, self.slot_rows), tf.concat([self.slots, tf.shape(x)[1:]], 0)
        )


PADDED = PaddedTokens()
