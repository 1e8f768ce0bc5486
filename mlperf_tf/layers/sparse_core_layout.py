"""Provides the SparseCore layout of TPU embedding tables as pure functions: where TF 2.20's
`TPUEmbeddingV2` keeps each table's rows, the id buffers its input preprocessing needs for a
batch shape, whole tables to that layout and back, and a table's initial values drawn one
SparseCore shard at a time.

Read from TF 2.20's sources (`tensorflow/python/tpu/`, `T/` below) and the kernels of
`tensorflow/core/tpu/kernels/sparse_core_preprocess_ops.cc` (`K/`, the stored TensorFlow sources):

* **Stacking** (`T/tpu_embedding_v3.py` `_stack_tables_with_same_table_dim_and_optimizer`,
  l. 354-489): tables of one width and one optimizer share one *stacked* table; each table's
  rows are padded (`unsharded_padded_shape`, a multiple of 8 x the SparseCores) and its width to
  a multiple of 8. `layouts_of` calls that very function on copies of the configs (what
  `TPUEmbeddingV2.__init__` does, l. 582-588; the stacker is host code and runs on a CPU), so
  the layout here is the engine's, not a guess of it.
* **Interleave** (`T/tpu_embedding_v3_utils.py` `map_indices_in_shard`, `unshuffle_from_sc_to_cpu`;
  `T/tpu_embedding_v3_checkpoint_adapter.py` `_shard_from_cpu_to_sc`): with n SparseCores in
  all, row i of a table lives on SparseCore (i % n + rotation) % n, at row offset + i // n of
  that core's shard; the stacked variable is the n shards one after another, `[n x R, width]`
  (R = `total_rows_per_sparse_core_shard`), split evenly over the chips.
* **Buffers** (`K/` `SortListOfSparseCoreCooTensorsOp`; `T/tpu_embedding_v3.py` l. 726-767, 1805-1859):
  each chip splits every feature's rows into `sc_per_chip` equal parts, one per local
  SparseCore; each part's ids (deduplicated by (row, id)) are sent to the SparseCore owning
  them, and the op fails when one sender has more than `max_ids_per_table[stack]` ids, or more
  than `max_unique_ids_per_table[stack]` distinct ids, for one receiver ("Sparse core N gets M
  ids while the max ids per sparse core is set to be ..."); the defaults are 256
  (`DEFAULT_MAX_IDS_PER_TABLE`). The dicts are keyed by the *stacked* table's name.
  `buffer_limits` sizes them for the worst batch of a shape (`SparseCoreBuffers`).
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import tensorflow as tf

from mlperf_tf.errors import UserError

SC_PER_CHIP = 4  # TPUEmbeddingV2's count when the chip reports none (T/tpu_embedding_v3.py l. 553)
XLA_PAD = 8  # K/: each (SparseCore, receiver) run of ids is padded to a multiple of 8
MAX_INT32 = 2**31 - 1  # the preprocessing's ids, counts and buffer sizes are int32


def layouts_of(features: dict, *, chips: int, sc_per_chip: int = SC_PER_CHIP) -> dict:
    """Table name -> its `SparseCoreTableLayout` as `TPUEmbeddingV2` lays it out for `features`
    (feature name -> TF `FeatureConfig` with `output_shape`, the per-replica one) on `chips`.

    Calls TF's own stacker on copies (it rewrites the tables' sizes to the padded ones), in
    TPUEmbeddingV2's feature order (`nest.flatten_with_joined_string_paths`).
    """
    from tensorflow.python.tpu import tpu_embedding_v3  # noqa: PLC0415 (TF's internal stacker)
    from tensorflow.python.util import nest  # noqa: PLC0415

    copies = tpu_embedding_v3._clone_feature_config(features)  # noqa: SLF001
    flat = nest.flatten_with_joined_string_paths(copies)
    tables = list({id(f.table): f.table for _, f in flat}.values())
    stacking = tpu_embedding_v3._stack_tables_with_same_table_dim_and_optimizer(  # noqa: SLF001
        tables, flat, chips, sc_per_chip, None
    )
    return dict(stacking.table_to_layout)


def stacks(layouts: dict) -> dict[str, list]:
    """Stacked table name -> its tables' layouts, in their order inside each shard."""
    out = {}
    for layout in layouts.values():
        out.setdefault(layout.stacked_table_name, []).append(layout)
    return {n: sorted(ls, key=lambda t: t.sparse_core_shard_row_offset) for n, ls in out.items()}


def stack_shape(members) -> tuple[int, int]:
    """`[n x R, width]`: the stacked variable's shape (all SparseCores' shards)."""
    first = members[0]
    return (first.num_sparse_cores * first.total_rows_per_sparse_core_shard,
            first.unsharded_padded_shape[1])  # fmt: skip


def stacked_rows(layout, ids):
    """Rows of the stacked variable holding `ids` (any int shape) of the table of `layout`:
    SparseCore (i % n + rotation) % n, row offset + i // n of its shard (`map_indices_in_shard`)."""
    n = layout.num_sparse_cores
    ids = tf.cast(ids, tf.int64)
    core = (ids % n + layout.sparse_core_shard_rotation) % n
    return core * layout.total_rows_per_sparse_core_shard + (
        layout.sparse_core_shard_row_offset + ids // n
    )


# ---- whole tables <-> the stacked layout --------------------------------------------------------
def to_stacked(tables: dict, members):
    """The stacked variable `[n x R, width]` of whole tables (name -> `[rows, dim]`, or
    `[rows]` for a per-row slot, repeated over the width), zero padding in the padded rows and
    columns (as `_shard_from_cpu_to_sc` pads)."""
    n = members[0].num_sparse_cores
    rows_per_core, width = members[0].total_rows_per_sparse_core_shard, stack_shape(members)[1]
    parts, filled = [], 0
    for layout in members:
        value = tf.convert_to_tensor(tables[layout.table_name], tf.float32)
        if value.shape.rank == 1:  # a per-row slot: the row's value in every column
            value = tf.repeat(value[:, None], layout.unsharded_shape[1], axis=1)
        rows, dim = layout.unsharded_shape
        padded_rows = layout.unsharded_padded_shape[0]
        value = tf.pad(value, [[0, padded_rows - rows], [0, width - dim]])  # [P, width]
        # Row k + j n is row j of core k's part; core c holds the part (c - rotation) % n.
        shards = tf.transpose(tf.reshape(value, [padded_rows // n, n, width]), [1, 0, 2])
        shards = tf.roll(shards, layout.sparse_core_shard_rotation, axis=0)  # [n, P / n, width]
        gap = layout.sparse_core_shard_row_offset - filled
        if gap:
            parts.append(tf.zeros([n, gap, width]))
        parts.append(shards)
        filled = layout.sparse_core_shard_row_offset + padded_rows // n
    if rows_per_core > filled:
        parts.append(tf.zeros([n, rows_per_core - filled, width]))
    return tf.reshape(tf.concat(parts, axis=1), [n * rows_per_core, width])


def from_stacked(stacked, members, *, per_row: bool = False) -> dict:
    """Whole tables (name -> `[rows, dim]`; `per_row`: `[rows]`, a per-row slot's column 0)
    of a stacked variable's value `[n x R, width]` (`unshuffle_from_sc_to_cpu`, then the
    padding removed)."""
    n = members[0].num_sparse_cores
    rows_per_core, width = members[0].total_rows_per_sparse_core_shard, stack_shape(members)[1]
    cores = tf.reshape(tf.convert_to_tensor(stacked, tf.float32), [n, rows_per_core, width])
    out = {}
    for layout in members:
        padded_rows = layout.unsharded_padded_shape[0]
        start = layout.sparse_core_shard_row_offset
        shards = cores[:, start : start + padded_rows // n]  # [n, P / n, width]
        shards = tf.roll(shards, -layout.sparse_core_shard_rotation, axis=0)
        value = tf.reshape(tf.transpose(shards, [1, 0, 2]), [padded_rows, width])
        rows, dim = layout.unsharded_shape
        out[layout.table_name] = value[:rows, 0] if per_row else value[:rows, :dim]
    return out


# ---- the id buffers -----------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class SparseCoreBuffers:
    """The preprocessing's static sizes for a batch shape (`buffer_limits`).

    Attributes:
      max_ids: stacked table -> the most ids one SparseCore sends another in a step.
      max_unique_ids: stacked table -> the most distinct ids of those.
      ids_per_chip_per_sample: `max_ids_per_chip_per_sample`: a chip's id buffer of a stacked
        table holds this many ids per output row (`K/` `ConvertToSparseCoreCsrWrappedCooTensor`).
    """

    max_ids: dict[str, int]
    max_unique_ids: dict[str, int]
    ids_per_chip_per_sample: int

    def config(self):
        """The `SparseCoreEmbeddingConfig` of these sizes."""
        return tf.tpu.experimental.embedding.SparseCoreEmbeddingConfig(
            max_ids_per_table=dict(self.max_ids),
            max_unique_ids_per_table=dict(self.max_unique_ids),
            max_ids_per_chip_per_sample=self.ids_per_chip_per_sample,
        )


def buffer_limits(layouts: dict, samples: dict[str, tuple[str, int]], *,
                  sc_per_chip: int = SC_PER_CHIP, setting: str = "the batch") -> SparseCoreBuffers:  # fmt: skip
    """The buffers no batch of this shape can overflow, every row of a feature holding at most
    one id (a single id a sample, or a sequence fed one position a row: `position_rows`).

    A chip's rows of feature f (S_f = its per-replica output rows) are split into `sc_per_chip`
    equal parts; in the worst case every id of a part goes to one receiving SparseCore, so one
    sender sends at most sum_f S_f / sc_per_chip ids of a stack. The distinct ids of table t a
    receiver can get are those it owns, ceil(rows_t / n) of the n SparseCores, and at most the
    ids sent: min(ceil(rows_t / n), sum over t's features of S_f / sc_per_chip), summed over
    the stack's tables.

    Args:
      layouts: table name -> `SparseCoreTableLayout` (`layouts_of`).
      samples: feature name -> (its table, S_f output rows per replica).
      sc_per_chip: SparseCores per chip.
      setting: the setting a one-line error names.

    Raises:
      UserError: a shape the engine cannot take: SparseCores not a power of two in all, rows
        not divisible over a chip's SparseCores, or buffers beyond int32.
    """
    n = next(iter(layouts.values())).num_sparse_cores
    if n & (n - 1):
        raise UserError(
            f"the TPU embedding engine needs a power-of-two number of SparseCores; {n} "
            f"({n // sc_per_chip} chips x {sc_per_chip}): use a power-of-two number of chips"
        )
    per_table = {}  # table -> rows one sender holds, over the table's features
    stack_samples = {}  # stacked table -> a chip's output rows (the CSR buffer's samples)
    for name, (table, rows) in samples.items():
        if rows % sc_per_chip:
            raise UserError(
                f"{setting}: feature {name} has {rows} rows per replica, not divisible over "
                f"the {sc_per_chip} SparseCores of a chip"
            )
        per_table[table] = per_table.get(table, 0) + rows // sc_per_chip
        stack = layouts[table].stacked_table_name
        stack_samples[stack] = stack_samples.get(stack, 0) + rows
    max_ids, max_unique = {}, {}
    for stack, members in stacks(layouts).items():
        sent = [per_table.get(m.table_name, 0) for m in members]
        owned = [math.ceil(m.unsharded_shape[0] / n) for m in members]
        max_ids[stack] = max(1, sum(sent))
        max_unique[stack] = max(1, sum(min(s, o) for s, o in zip(sent, owned, strict=True)))
        if max_ids[stack] > MAX_INT32:
            raise UserError(f"{setting}: {max_ids[stack]} ids per SparseCore exceed int32")
    # A chip's buffer: its ids (one a row at most) and each (core, receiver) run padded to 8.
    per_sample = 1
    for rows in stack_samples.values():
        need = rows + sc_per_chip * n * (XLA_PAD - 1)
        per_sample = max(per_sample, math.ceil(need / rows))
    while any((per_sample * rows) % XLA_PAD for rows in stack_samples.values()):
        per_sample += 1
    biggest = per_sample * max(stack_samples.values(), default=0)
    if biggest > MAX_INT32:
        raise UserError(
            f"{setting}: a chip's id buffer of {biggest} ids exceeds int32; use more chips"
        )
    return SparseCoreBuffers(max_ids, max_unique, per_sample)


def position_rows(ids: tf.RaggedTensor, length: int) -> tf.RaggedTensor:
    """A sequence feature as `TPUEmbeddingV2` looks one up: `[B, (l)]` ids to `[B x length,
    (0 or 1)]`, row b length + t holding ids[b, t] when t < l_b, so that the `sum` combiner
    of each row is that position's embedding (zero past the length) and `output_shape` `[B,
    length]` reshapes them (TPUEmbeddingV2 ignores `max_sequence_length`: its sample count is
    `output_shape`'s product, `_convert_input_feature_to_list_of_coo_tensors`)."""
    mask = tf.sequence_mask(ids.row_lengths(), length)  # [B, length]
    return tf.RaggedTensor.from_row_lengths(
        ids.flat_values, tf.reshape(tf.cast(mask, tf.int64), [-1])
    )


# ---- initial values one SparseCore shard at a time ---------------------------------------------
def shard_rows(*, rows: int, padded_rows: int, shard_size: int, shard_offset: int,
               rotation: int) -> np.ndarray:  # fmt: skip
    """The table rows, in order, of the SparseCore shard TPUEmbeddingV2's initializer call
    names by `shard_info` (`_compute_sc_shard_info`: size P / n, offset g P / n for core g):
    rows k, k + n, ... with k = (g - rotation) % n (`_compute_sc_shard_idx_and_offset`); -1
    where the row is padding."""
    n = padded_rows // shard_size
    k = (shard_offset // shard_size - rotation) % n
    index = k + n * np.arange(shard_size, dtype=np.int64)
    return np.where(index < rows, index, -1)


def initial_stack(members, initializers: dict, *, chips: int):
    """A stacked table's initial value `[n x R, width]` as TPUEmbeddingV2 makes it
    (`_create_variables`' `table_initialize_fn` with `_compute_sc_shard_info`): for each chip
    and each of its SparseCores, each table's shard from its initializer called with that
    shard's `shard_info` (a sharding-aware initializer draws that shard alone).

    Args:
      members: the stack's layouts (`stacks`).
      initializers: table name -> initializer taking `shape` (padded), `dtype`, `shard_info`.
      chips: chips (TPU devices) the stacked variable is split over.
    """
    from tensorflow.python.trackable import base  # noqa: PLC0415 (TF's `ShardInfo`)

    n, width = members[0].num_sparse_cores, stack_shape(members)[1]
    per_chip_cores = n // chips
    total = sum(m.unsharded_padded_shape[0] for m in members)  # the stack's padded rows
    per_device = total // chips
    parts = []
    for device in range(chips):
        for core in range(per_chip_cores):
            for m in members:
                padded = m.unsharded_padded_shape[0]
                size = padded * per_device // total // per_chip_cores
                offset = padded * (device * per_device) // total + core * size
                info = base.ShardInfo([size, width], [offset, 0])
                parts.append(initializers[m.table_name](
                    shape=(padded, width), dtype=tf.float32, shard_info=info))  # fmt: skip
    return tf.concat(parts, axis=0)


__all__ = [
    "MAX_INT32",
    "SC_PER_CHIP",
    "SparseCoreBuffers",
    "buffer_limits",
    "from_stacked",
    "initial_stack",
    "layouts_of",
    "position_rows",
    "shard_rows",
    "stack_shape",
    "stacked_rows",
    "stacks",
    "to_stacked",
]
