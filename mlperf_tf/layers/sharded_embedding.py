"""Provides `ShardedEmbeddings`: embedding tables sharded over the mesh's `expert` axis, row-wise
or table-wise per table, looked up by an ids all-to-all, a local gather and an embeddings
all-to-all back.

Recommendation models keep most of their parameters in embedding tables far larger than one
device (DLRMv4's eleven tables hold 600 GB); TorchRec shards them over the ranks, choosing per
table how (`torchrec/distributed/planner/`: an enumerator of options, a storage-aware greedy
partitioner). This is that idea on the suite's one mesh, reduced to the two placements that
matter at these sizes:

* **row-wise** (`torchrec/distributed/sharding/rw_sharding.py`): a table larger than a replica's
  even share of all rows is cut into blocks of ceil(rows / E) rows; id i lives on replica
  i // block, row i % block of its block;
* **table-wise** (`tw_sharding.py`): a smaller table lives whole on one replica, the tables
  placed largest first on the least-loaded replica (`partitioners.py GreedyPerfPartitioner`,
  sorting by storage).

Why the `expert` axis (`plan_tables`, README): its replicas read different batches, hold
different parts of a weight and exchange rows by all-to-all, the expert layer's pattern, so the
input routing, the gradient summer (a table's gradient is summed over `data`, never over
`expert`: each owner receives every member's gradient of its rows through the backward
all-to-all), the whole-tensor checkpoints and `whole_value` work for it unchanged.

Storage: one variable per layer, each replica's component `[capacity, dim]` holding its
row-wise blocks (at the same offset on every replica) and then its table-wise tables; split over
`expert` (`EXPERT_SPLIT`), so `whole_value` gives `[E x capacity, dim]` in that placement. The
checkpoint entry is the placement-free *canonical* tensor, every table whole, in the order
given, `[sum of rows, dim]` (permuted at save and restore), so a checkpoint written at any E
restores at any other. The same for a per-row optimizer slot (`attach_row_slot`).

The all-to-alls have fixed shapes (TF fixes a collective instance's shape): each replica sends
every member all its n ids (-1 where that member is not the owner) and gets back `[E, n, dim]`
rows, zero except from the owner, summed (x + 0 is exact): E times the bytes of an exchange of
only the owned ids, the price of no capacity and no dropping (TorchRec's variable splits would
need a first all-to-all of counts and dynamic shapes).
"""

from __future__ import annotations

import dataclasses
import math

import keras
import numpy as np
import tensorflow as tf

from mlperf_tf.collectives.axis_group import AxisGroup
from mlperf_tf.collectives.rows import ids_to_pairs, pairs_to_ids
from mlperf_tf.errors import UserError
from mlperf_tf.parallel import layout as layout_lib
from mlperf_tf.parallel.context import resolve
from mlperf_tf.parallel.layout import EXPERT_SPLIT

ROW_WISE = "row_wise"
TABLE_WISE = "table_wise"
ROW_ALIGN = 8  # capacity rounded up to this many rows
INIT_BLOCK = 1024  # initial values are drawn in blocks of this many rows of a table


@dataclasses.dataclass(frozen=True)
class Placement:
    """Where one table's rows are: id i lives on replica `first + i // block`, at local row
    `base + i % block` (row-wise: `first` 0, `block` ceil(rows / E); table-wise: `block` =
    rows, `first` its replica)."""

    kind: str
    rows: int
    first: int
    block: int
    base: int


@dataclasses.dataclass(frozen=True)
class TablePlan:
    """A placement of every table on `shards` replicas, `capacity` rows each."""

    shards: int
    capacity: int
    tables: dict[str, Placement]

    @property
    def total_rows(self) -> int:
        """Rows of the canonical tensor (every table whole, in the plan's order)."""
        return sum(p.rows for p in self.tables.values())

    def storage_rows(self) -> np.ndarray:
        """`[total_rows]` int64: the row of `[shards x capacity]` storage holding each
        canonical row (table after table, in order)."""
        parts = []
        for p in self.tables.values():
            i = np.arange(p.rows, dtype=np.int64)
            parts.append((p.first + i // p.block) * self.capacity + p.base + i % p.block)
        return np.concatenate(parts)

    def loads(self) -> list[int]:
        """Rows each replica holds (padding excluded)."""
        out = [0] * self.shards
        for p in self.tables.values():
            for r in range(self.shards if p.kind == ROW_WISE else 1):
                out[p.first + r] += max(0, min(p.block, p.rows - r * p.block))
        return out


def plan_tables(rows: dict[str, int], shards: int) -> TablePlan:
    """Chooses row-wise or table-wise per table by size and places them on `shards` replicas.

    A table with more rows than a replica's even share of all rows (sum / E) cannot be placed
    whole without unbalancing the replicas: row-wise, in E blocks. The others go whole,
    largest first, to the replica with the fewest rows so far (ties: the lowest id). With one
    shard every table is table-wise on replica 0 in the given order: the storage is the
    canonical tensor itself.

    Args:
      rows: table name -> rows, in the canonical order.
      shards: replicas of the axis the tables split over (E >= 1).
    """
    share = sum(rows.values()) / shards
    row_wise = [n for n, r in rows.items() if shards > 1 and r > share]
    blocks = {n: math.ceil(rows[n] / shards) for n in row_wise}
    base, offset = {}, 0
    for n in row_wise:  # the same offset on every replica
        base[n], offset = offset, offset + blocks[n]
    load = [offset] * shards
    placed = {}
    for n in sorted((n for n in rows if n not in blocks), key=lambda n: (-rows[n], n)):
        replica = min(range(shards), key=lambda r: (load[r], r))
        placed[n], base[n] = replica, load[replica]
        load[replica] += rows[n]
    capacity = max(ROW_ALIGN, -(-max(load) // ROW_ALIGN) * ROW_ALIGN)
    tables = {
        n: Placement(ROW_WISE, r, 0, blocks[n], base[n]) if n in blocks
        else Placement(TABLE_WISE, r, placed[n], r, base[n])
        for n, r in rows.items()
    }  # fmt: skip
    return TablePlan(shards, capacity, tables)


class ShardedEmbeddings(keras.layers.Layer):
    """Tables of one width, sharded over the ambient mesh's `expert` axis (`plan_tables`).

    `call(ids, tables=(name, ...))` looks up each `ids[k]` (any int shape) in table
    `tables[k]`, all requests in one exchange, and returns their embeddings (`ids[k].shape +
    [dim]`). Without a mesh, or with E = 1, it is a plain gather from the canonical tensor.

    Initial values: table k (in the canonical order) is U(-bounds[name], bounds[name]), drawn
    in blocks of `INIT_BLOCK` rows, block b by `tf.random.stateless_uniform` at seed (seed + k,
    b) (`draw_rows`): each replica draws only the blocks its rows fall in, and a row's value
    depends on neither E nor the placement, so every E starts from bit-identical tables
    without any replica drawing (or holding) a whole table.

    Args:
      rows: table name -> rows (the canonical order).
      dim: the tables' width.
      bounds: table name -> the bound b of its uniform initial values U(-b, b).
      seed: the first table's seed (table k: seed + k).
      memory_limit_bytes: the most one replica may hold of the tables and a per-row fp32 slot
        (0: no limit); more is a one-line `UserError` naming `limit_setting`.
      limit_setting: the setting to name in that error.
      timeout_s: the least timeout of the all-to-alls (0: the replica context's).
    """

    def __init__(
        self, rows: dict[str, int], dim: int, *, bounds: dict[str, float], seed: int = 0,
        memory_limit_bytes: int = 0, limit_setting: str = "memory_limit_bytes",
        timeout_s: float = 0.0, **kwargs,
    ):  # fmt: skip
        super().__init__(**kwargs)
        self.rows, self.dim = dict(rows), int(dim)
        self.bounds, self.seed = {n: float(bounds[n]) for n in self.rows}, int(seed)
        self.mesh = resolve(None)
        self.group = AxisGroup("expert", owner=self, mesh=self.mesh, timeout_s=timeout_s)
        self.plan = plan_tables(self.rows, self.group.size)
        need = self.plan.capacity * (self.dim + 1) * 4
        if memory_limit_bytes and need > memory_limit_bytes:
            raise UserError(
                f"`{limit_setting}` ({memory_limit_bytes / 2**30:g} GiB): the embedding tables "
                f"need {need / 2**30:.3g} GiB per replica split over --expert_parallel="
                f"{self.group.size} ({self.plan.capacity} rows x {self.dim} and a row-wise "
                "slot); split them over more replicas"
            )
        # Built now, once: the storage depends on no input shape, and a second build (Keras'
        # symbolic build attempt of an enclosing model) would make a second, orphaned table.
        self.build()

    def build(self, input_shape=None):
        if self.built:
            return
        self.embeddings = self.add_weight(
            name="embeddings", shape=(self.plan.capacity, self.dim), initializer="zeros",
        )  # fmt: skip
        if self.plan.shards > 1:
            layout_lib.set_layout(self.embeddings, EXPERT_SPLIT)
        # Each replica draws its own shard's rows (`shard_initial_value`), never the whole.
        split = self.mesh if self.plan.shards > 1 else None
        layout_lib.assign_shards(self.embeddings, self.shard_initial_value, split)
        layout_lib.declare_layout(self.embeddings, EXPERT_SPLIT)
        self._save_canonical(self.embeddings)
        self.embeddings.attach_row_slot = self.attach_row_slot
        super().build(input_shape)

    def _draw(self, name: str, start: int, stop: int):
        """Rows [start, stop) of table `name`'s initial value (`draw_rows`)."""
        k = list(self.rows).index(name)
        return draw_rows(self.seed + k, self.bounds[name], start, stop, self.dim,
                         self.variable_dtype)  # fmt: skip

    def shard_initial_value(self, shard: int):
        """`[capacity, dim]`: replica `shard`'s storage at the start, drawn for its own rows
        alone (its row-wise blocks and table-wise tables at their offsets; padding zero)."""
        pieces = []  # (local offset, [n, dim] values)
        for name, p in self.plan.tables.items():
            if p.kind == ROW_WISE:
                start, stop = shard * p.block, min((shard + 1) * p.block, p.rows)
            elif p.first == shard:
                start, stop = 0, p.rows
            else:
                continue
            if stop > start:
                pieces.append((p.base, self._draw(name, start, stop)))
        parts, filled = [], 0
        for base, values in sorted(pieces, key=lambda piece: piece[0]):
            parts += [tf.zeros([base - filled, self.dim], self.variable_dtype), values]
            filled = base + int(values.shape[0])
        parts.append(tf.zeros([self.plan.capacity - filled, self.dim], self.variable_dtype))
        return tf.concat(parts, axis=0)

    # ---- whole tables --------------------------------------------------------------------------
    def canonical(self, storage_whole):
        """The canonical `[total_rows, ...]` of a whole storage tensor `[E x capacity, ...]`
        (NumPy or TF)."""
        index = self.plan.storage_rows()
        if isinstance(storage_whole, np.ndarray):
            return storage_whole[index]
        return tf.gather(storage_whole, index)

    def tables(self) -> dict[str, np.ndarray]:
        """Table name -> its whole value (cross-replica context)."""
        whole = self.canonical(np.asarray(layout_lib.whole_value(self.embeddings, self.mesh)))
        bounds = np.cumsum([0, *self.rows.values()])
        return {n: whole[a:b] for n, a, b in zip(self.rows, bounds[:-1], bounds[1:])}

    def attach_row_slot(self, slot) -> None:
        """Gives an optimizer slot of one value per storage row (`[capacity]`, row-wise
        Adagrad's accumulator) the storage's layout and a canonical checkpoint entry
        (call in cross-replica context after the optimizer made it)."""
        if self.plan.shards > 1:
            layout_lib.set_layout(slot, EXPERT_SPLIT)
        self._save_canonical(slot)

    def _save_canonical(self, variable) -> None:
        """Makes `variable`'s checkpoint entry its canonical whole (`layout.save_whole`), the
        tables' rows gathered from their shards at save and scattered back at restore."""
        index = self.plan.storage_rows()
        storage = [self.plan.shards * self.plan.capacity, *variable.shape[1:]]
        layout_lib.save_whole(
            variable, self.mesh, (self.plan.total_rows, *variable.shape[1:]),
            to_whole=lambda stored: tf.gather(stored, index),
            from_whole=lambda whole: tf.scatter_nd(index[:, None], whole, storage),
        )  # fmt: skip

    # ---- lookup --------------------------------------------------------------------------------
    def call(self, ids, tables=()):
        """Embeddings of `ids[k]` in table `tables[k]`, each `ids[k].shape + [dim]`."""
        if len(ids) != len(tables):
            raise ValueError(f"{len(ids)} id tensors for {len(tables)} tables")
        flat = [tf.reshape(tf.cast(i, tf.int64), [-1]) for i in ids]
        owner, local = [], []
        for f, name in zip(flat, tables, strict=True):
            p = self.plan.tables[name]
            owner.append(p.first + f // p.block)
            local.append(p.base + f % p.block)
        owner, local = tf.concat(owner, 0), tf.concat(local, 0)  # [n]
        if self.plan.shards == 1:
            rows = tf.gather(self.embeddings, local)  # [n, dim]
        elif tf.distribute.in_cross_replica_context() and not tf.executing_eagerly():
            # Keras' symbolic build of an enclosing model (its first call, under the strategy's
            # scope) traces this once for the output shapes alone; the shards cannot be joined
            # in a graph (`whole_value` is eager), and the values are discarded.
            rows = tf.zeros([tf.size(owner), self.dim], self.variable_dtype)  # [n, dim]
        elif tf.distribute.in_cross_replica_context():
            # Outside the replicas' step (the model built by a call on a dummy batch): from the
            # joined shards, at [E x capacity] storage rows.
            whole = layout_lib.whole_value(self.embeddings, self.mesh)
            rows = tf.gather(whole, owner * self.plan.capacity + local)
        else:
            rows = self._exchange(owner, local)
        sizes = [tf.size(f) for f in flat]
        return [
            tf.reshape(r, tf.concat([tf.shape(i), [self.dim]], 0))
            for r, i in zip(tf.split(rows, sizes), ids, strict=True)
        ]

    def _exchange(self, owner, local):
        """ids all-to-all -> local gather -> embeddings all-to-all back: `[n, dim]` rows of the
        `[n]` requests (each owned by replica `owner`, at its row `local`)."""
        e = self.plan.shards
        dest = tf.range(e, dtype=tf.int64)[:, None]  # [E, 1]
        send = tf.where(tf.equal(owner[None, :], dest), local[None, :], -1)  # [E, n]
        # As float32 pairs (`collectives.rows`), exact below 2^36 rows: the exchange the
        # expert layer's tokens take (float32 all-to-alls; an int32 one waited forever here).
        pair = ids_to_pairs(send)  # [E, n, 2]
        pair = self.group.all_to_all(tf.stop_gradient(pair), "ids")  # [E, n, 2]: from rank i
        received = pairs_to_ids(pair)  # [E, n]
        valid = received >= 0
        table = tf.convert_to_tensor(self.embeddings)  # [capacity, dim]: this replica's shard
        rows = tf.gather(table, tf.reshape(tf.maximum(received, 0), [-1]))  # [E n, dim]
        rows = tf.reshape(rows, [e, -1, self.dim]) * tf.cast(valid, rows.dtype)[..., None]
        back = self.group.all_to_all(rows, "embeddings")  # [E, n, dim]: from owner i
        return tf.reduce_sum(back, axis=0)  # [n, dim]: one owner's row, zeros elsewhere


def draw_rows(seed: int, bound: float, start: int, stop: int, dim: int, dtype="float32"):
    """Rows [start, stop) of a table whose initial value is U(-bound, bound) `[rows, dim]`,
    drawn by row blocks: block b (rows [b B, (b + 1) B), B = `INIT_BLOCK`) is
    `tf.random.stateless_uniform([B, dim], seed=(seed, b))`, so any range of rows is drawn
    without the others, the same values whoever draws them (counter-based: Philox keyed by
    the seed pair, named rather than TF's per-device `auto_select`, so a TPU host draws what
    a CPU does). Costs at most two blocks more than the range."""
    if stop <= start:
        return tf.zeros([0, dim], dtype)
    first, last = start // INIT_BLOCK, (stop - 1) // INIT_BLOCK
    blocks = [_block(seed, bound, b, dim) for b in range(first, last + 1)]
    drawn = tf.concat(blocks, axis=0)  # [(last - first + 1) B, dim]
    offset = first * INIT_BLOCK
    return tf.cast(drawn[start - offset : stop - offset], dtype)  # [stop - start, dim]


def draw_rows_at(seed: int, bound: float, index, dim: int, dtype="float32"):
    """Rows `index` (`[m]` ints; -1: a zero row) of the table `draw_rows` draws, `[m, dim]`.

    For a set of rows that is no range (a SparseCore shard holds every n-th row of a table):
    each block holding some of them is drawn once and only those rows kept, so the peak is the
    rows asked for and one block, never the whole table; the time is that of the blocks
    touched (for every n-th row, all of them)."""
    index = np.asarray(index, np.int64)
    valid = np.nonzero(index >= 0)[0]  # positions of real rows
    rows = index[valid]
    order = np.argsort(rows, kind="stable")
    sorted_rows = rows[order]
    blocks, starts = np.unique(sorted_rows // INIT_BLOCK, return_index=True)  # one grouping
    ends = np.append(starts[1:], len(sorted_rows))
    parts = []
    for b, start, end in zip(blocks, starts, ends):
        wanted = sorted_rows[start:end] - b * INIT_BLOCK
        parts.append(tf.gather(_block(seed, bound, int(b), dim), wanted))
    values = tf.concat(parts, axis=0) if parts else tf.zeros([0, dim])  # rows, sorted
    positions = valid[order][:, None]  # where each sorted row goes
    out = tf.scatter_nd(positions, values, [len(index), dim])  # [m, dim], -1 rows zero
    return tf.cast(out, dtype)


def _block(seed: int, bound: float, block: int, dim: int):
    """Block `block` of a table's initial value: `[INIT_BLOCK, dim]` float32."""
    return tf.random.stateless_uniform([INIT_BLOCK, dim], seed=[seed, block], minval=-bound,
                                       maxval=bound, dtype=tf.float32, alg="philox")  # fmt: skip


__all__ = [
    "ROW_WISE",
    "TABLE_WISE",
    "Placement",
    "ShardedEmbeddings",
    "TablePlan",
    "draw_rows",
    "draw_rows_at",
    "plan_tables",
]
