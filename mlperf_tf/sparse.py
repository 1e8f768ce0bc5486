"""Provides `merge_duplicate_rows`: a sparse gradient (`IndexedSlices`) with each row listed
once. It lives below the optimizers, the collectives and the runner, which all need it: the
optimizers before their moments, the collectives before and after they move rows, the trainer
and base-training loops before a clip (`tests/test_layering.py` keeps the collectives from
importing the optimizers)."""

from __future__ import annotations

import tensorflow as tf


def merge_duplicate_rows(gradient):
    """`gradient` with each row listed once: an `IndexedSlices`' values of equal indices summed
    (`tf.unique` + `unsorted_segment_sum`, rows in order of first appearance); any other
    gradient unchanged.

    Why: an embedding's sparse gradient lists a row once per lookup (and the runner's joins of
    micro-batches and replicas list it again), and Keras 3's sparse-aware `ops.square` squares
    each listed value before the duplicates are summed, so Adam's (and Adagrad's, RMSprop's)
    second moment of that row gets sum(g_i^2) instead of (sum g_i)^2 and its first step moves
    it by up to sqrt(n) x lr; a global norm (`tf.clip_by_global_norm`) of such a gradient adds
    the duplicates' squares too.
    """
    if not isinstance(gradient, tf.IndexedSlices):
        return gradient
    rows, position = tf.unique(gradient.indices)  # [n], [lookups]
    values = tf.math.unsorted_segment_sum(gradient.values, position, tf.shape(rows)[0])
    return tf.IndexedSlices(values, rows, gradient.dense_shape)  # values [n, ...]
