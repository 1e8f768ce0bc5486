"""Provides the exchange of row ids and of sparse gradients as rows (`IndexedSlices`): ids
as exact float32 pairs, and `all_gather_rows`, the sum of an embedding table's gradient over
replicas that moves the touched rows, never the dense table.

Why rows: a table's gradient from a lookup is an `IndexedSlices` of one row per looked-up id.
Made dense (`tf.convert_to_tensor`) and all-reduced it costs the whole table's bytes a step
(DLRMv4's item table: 9.4 M rows x 512 fp32, 19 GB) where the step touched a few thousand
rows. Gathered as rows, each replica sends its k listed rows and ids, (n - 1) k (dim + 2)
values over the group of n, then sums the duplicates locally (`merge_duplicate_rows`).

Why float32 ids: TF's CPU collectives used here are float ones in practice (an int32
all-to-all waited forever in the sharded tables' lookup), so a row id crosses as the pair
(id // 4096, id % 4096), both exact in float32 below 2^36 rows.
"""

from __future__ import annotations

import tensorflow as tf

from mlperf_tf.sparse import merge_duplicate_rows

ID_RADIX = 4096  # an id crosses as float32 (id // radix, id % radix): exact below 2^36


def ids_to_pairs(ids):
    """int ids `[...]` (negative allowed: -1 marks "none") -> float32 pairs `[..., 2]`."""
    ids = tf.cast(ids, tf.int64)
    hi = tf.math.floordiv(ids, ID_RADIX)
    return tf.cast(tf.stack([hi, ids - hi * ID_RADIX], -1), tf.float32)


def pairs_to_ids(pairs):
    """`ids_to_pairs`' inverse: float32 pairs `[..., 2]` -> int64 ids `[...]`."""
    return tf.cast(pairs[..., 0], tf.int64) * ID_RADIX + tf.cast(pairs[..., 1], tf.int64)


def all_gather_rows(ops, members: list[int], gradient: tf.IndexedSlices, name: str):
    """`gradient` (an `IndexedSlices` of k rows, k static, the same on every member) summed
    over `members` as rows: every member's ids and rows all-gathered, then equal ids merged.

    Args:
      ops: this replica's `Collectives` (or a `GroupView` of them), `ops.replica` in `members`.
      members: the replicas the gradient is summed over (rank order).
      gradient: `values` [k, ...], `indices` [k], `dense_shape` the table's.
      name: the collectives' name prefix.

    Returns:
      An `IndexedSlices` whose rows are distinct (values [m, ...], m <= n k), equal on every
      member: the dense sum over `members` at those rows, zero elsewhere.
    """
    values = tf.convert_to_tensor(gradient.values)
    k = values.shape[0]
    if k is None:
        raise ValueError(f"{name}: a sparse gradient's row count must be static to gather it")
    n = len(members)
    ids = ops.all_gather(tf.reshape(ids_to_pairs(gradient.indices), [-1]), members,
                         f"{name}/ids")  # fmt: skip
    rows = ops.all_gather(tf.reshape(values, [-1]), members, f"{name}/rows")
    joined = tf.IndexedSlices(
        tf.reshape(rows, [n * k, *values.shape[1:]]),  # [n k, ...]
        tf.cast(pairs_to_ids(tf.reshape(ids, [n * k, 2])), gradient.indices.dtype),  # [n k]
        gradient.dense_shape,
    )
    return merge_duplicate_rows(joined)


__all__ = ["ID_RADIX", "all_gather_rows", "ids_to_pairs", "pairs_to_ids"]
