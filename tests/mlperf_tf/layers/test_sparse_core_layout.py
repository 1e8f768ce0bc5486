"""The SparseCore layout of TPU embedding tables (`mlperf_tf.layers.sparse_core_layout`) on a
CPU: the stacked layout against TF's own checkpoint adapter (`_shard_from_cpu_to_sc`,
`_unshard_from_sc_to_cpu`) and serving restore (`TPUEmbeddingForServing` reading a checkpoint
written in it), whole -> stacked -> whole the identity; the id buffers against a NumPy
transcription of the engine's count (`sparse_core_preprocess_ops.cc`
`SortListOfSparseCoreCooTensorsOp`) over generated batches; the initial values drawn one
SparseCore shard at a time against the whole draw, bit for bit."""

import dataclasses
import math
from unittest import mock

import numpy as np
import pytest
import tensorflow as tf

from mlperf_tf.errors import UserError
from mlperf_tf.layers import sharded_embedding
from mlperf_tf.layers import sparse_core_layout as scl
from mlperf_tf.layers import tpu_embedding as te
from tests.mlperf_tf.layers.test_tpu_embedding import BOUNDS, DIM, FEATURES, ROWS

BATCH = 8


def _plan(chips: int, rows=ROWS, batch=BATCH, features=FEATURES, dim=DIM):
    bounds = {n: math.sqrt(1.0 / r) for n, r in rows.items()}
    tables = te.table_configs(rows, dim, bounds=bounds, seed=3)
    return te.plan_engine(te.feature_configs(tables, features), batch=batch, chips=chips)


def _tables(rng, rows=ROWS, dim=DIM):
    return {n: rng.normal(size=(r, dim)).astype(np.float32) for n, r in rows.items()}


@pytest.mark.parametrize("chips", [1, 2])
def test_whole_tables_map_to_the_engines_stacked_layout_and_back(chips):
    from tensorflow.python.tpu import tpu_embedding_v3_checkpoint_adapter as adapter
    from tensorflow.python.trackable import base

    plan = _plan(chips)
    ((stack, members),) = scl.stacks(plan.layouts).items()  # one width, one optimizer: one stack
    assert [m.table_name for m in members] == sorted(ROWS)
    assert members[0].num_sparse_cores == 4 * chips
    whole = _tables(np.random.default_rng(chips))
    stacked = scl.to_stacked(whole, members)
    assert tuple(stacked.shape) == scl.stack_shape(members)
    # TF's adapter (its resharding of a CPU checkpoint into SparseCores) makes the same tensor.
    shape = list(stacked.shape)
    spec = adapter._shard_info_str(shape, base.ShardInfo(offset=[0, 0], shape=shape))
    want = adapter._shard_from_cpu_to_sc([whole[m.table_name] for m in members], spec, members)
    np.testing.assert_array_equal(stacked.numpy(), want.numpy())
    # ... and back: ours and TF's unsharding give the tables.
    back = scl.from_stacked(stacked, members)
    tf_back = adapter._unshard_from_sc_to_cpu([stacked], members)
    for m, value in zip(members, tf_back, strict=True):
        np.testing.assert_array_equal(back[m.table_name].numpy(), whole[m.table_name])
        np.testing.assert_array_equal(value.numpy(), whole[m.table_name])
        # A row's place (`stacked_rows`) holds it.
        ids = np.arange(ROWS[m.table_name])
        rows = tf.gather(stacked, scl.stacked_rows(m, ids))
        np.testing.assert_array_equal(rows.numpy(), whole[m.table_name])
    # A per-row slot ([rows]) is kept in every column of its row.
    slots = {n: np.arange(r, dtype=np.float32) + 0.5 for n, r in ROWS.items()}
    per_row = scl.from_stacked(scl.to_stacked(slots, members), members, per_row=True)
    for n, value in slots.items():
        np.testing.assert_array_equal(per_row[n].numpy(), value)


def test_tf_serving_restores_a_checkpoint_written_in_the_stacked_layout(tmp_path):
    """What a TPU run's TPUEmbeddingV2 checkpoint holds (its layouts and each stacked table),
    written from `to_stacked`: TF's CPU serving object restores the tables whole from it."""
    from tensorflow.core.tpu.kernels import sparse_core_layout_pb2
    from tensorflow.python.tpu import tpu_embedding_v3_utils as utils

    plan = _plan(2)
    whole = _tables(np.random.default_rng(5))
    saved = tf.Module()
    protos = sparse_core_layout_pb2.SparseCoreTableLayouts()
    protos.tables.extend(plan.layouts.values())
    setattr(saved, utils.SPARSECORE_LAYOUTS_CHECKPOINT_KEY,
            tf.Variable(protos.SerializeToString()))  # fmt: skip
    for stack, members in scl.stacks(plan.layouts).items():
        setattr(saved, stack, tf.Variable(scl.to_stacked(whole, members)))
    path = tf.train.Checkpoint(embedding=saved).write(str(tmp_path / "tpu"))
    tables = te.table_configs(ROWS, DIM, bounds=BOUNDS, seed=99)  # other initial values
    serving = tf.tpu.experimental.embedding.TPUEmbeddingForServing(
        te.feature_configs(tables, FEATURES), None
    )
    tf.train.Checkpoint(embedding=serving).restore(path)
    serving.build()
    for config, variable in serving.embedding_tables.items():
        np.testing.assert_array_equal(variable.numpy(), whole[config.name])


def test_a_sequence_fed_one_position_a_row_is_its_sequence_lookup():
    """`position_rows`: each position its own row of one id (none past the length); looked
    up with the `sum` combiner (TF's CPU lookup) it is the sequence's lookup, zero past each
    length: what TPUEmbeddingV2 returns for `output_shape` [B, T]."""
    from tensorflow.python.tpu.tpu_embedding_for_serving import cpu_embedding_lookup

    ids = np.array([[1, 2, 3, 0, 0], [4, 4, 1, 7, 0], [49, 0, 0, 0, 0], [8, 9, 8, 9, 8]])
    lengths = np.array([3, 4, 1, 5])
    ragged = tf.RaggedTensor.from_tensor(tf.constant(ids, tf.int32), lengths=lengths)
    table = te.table_configs({"item": 50}, DIM, bounds={"item": 0.1}, seed=1)["item"]
    variable = tf.Variable(table.initializer((50, DIM)))
    flat = tf.tpu.experimental.embedding.FeatureConfig(table=table)
    rows = scl.position_rows(ragged, 5)
    assert rows.nrows() == 4 * 5 and int(tf.reduce_max(rows.row_lengths())) == 1
    got = cpu_embedding_lookup({"x": rows}, None, {table: variable}, {"x": flat})["x"]
    want = np.where((np.arange(5) < lengths[:, None])[..., None], variable.numpy()[ids], 0.0)
    np.testing.assert_array_equal(tf.reshape(got, [4, 5, DIM]).numpy(), want)


def sparse_core_counts(feeds: dict, layouts: dict, sc_per_chip: int = scl.SC_PER_CHIP) -> dict:
    """NumPy transcription of the engine's per-step count (`SortListOfSparseCoreCooTensorsOp`):
    stacked table -> (the most ids, the most distinct ids) one of a chip's SparseCores sends
    one receiver.

    A chip's rows of feature f go to its SparseCore row // (S_f / sc_per_chip); (row, id)
    pairs are counted once (duplicates merged), distinct ids once per table; the receiver of
    id i of a table is (i + rotation) mod n (the stacked column's low bits: `WriteToOutputTensor`
    adds the rotation below n and the table's offset, a multiple of n, above).

    Args:
      feeds: feature -> (table, rows `[m]` of its ids, ids `[m]`, S_f rows per replica).
      layouts: table name -> layout.
    """
    n = next(iter(layouts.values())).num_sparse_cores
    out = {}
    for stack, members in scl.stacks(layouts).items():
        ids_count = np.zeros((sc_per_chip, n), np.int64)
        unique_count = np.zeros((sc_per_chip, n), np.int64)
        for m in members:
            mine = [(k, v) for k, v in enumerate(feeds.values()) if v[0] == m.table_name]
            for core in range(sc_per_chip):
                keys = []  # one int64 a (feature, row, id): feature << 55 | row << 31 | id
                for k, (_, rows, ids, samples) in mine:
                    sel = rows // (samples // sc_per_chip) == core
                    keys.append((k << 55) | (rows[sel].astype(np.int64) << 31) | ids[sel])
                if not keys:
                    continue
                ids = np.unique(np.concatenate(keys)) & (2**31 - 1)  # each pair once
                np.add.at(ids_count[core], (ids + m.sparse_core_shard_rotation) % n, 1)
                distinct = np.unique(ids)
                np.add.at(unique_count[core], (distinct + m.sparse_core_shard_rotation) % n, 1)
        out[stack] = (int(ids_count.max()), int(unique_count.max()))
    return out


def worst_ids(count: int, rows: int, layout) -> np.ndarray:
    """`count` ids of a table all owned by SparseCore 0 (id i is on (i + rotation) mod n), as
    many distinct as the table has such rows."""
    n = layout.num_sparse_cores
    first = (-layout.sparse_core_shard_rotation) % n
    owned = np.arange(first, rows, n)
    return owned[np.arange(count) % len(owned)]


def _feeds(rng, batch, *, worst: bool, layouts):
    """One replica's feeds of `FEATURES` (sequences one position a row); `worst`: every history
    full, every id on one receiver (`worst_ids`)."""
    feeds = {}
    for name, f in FEATURES.items():
        rows, length = ROWS[f.table], max(1, f.sequence_length)
        if worst:
            lengths = np.full(batch, length)
            ids = worst_ids(batch * length, rows, layouts[f.table])
        else:
            lengths = rng.integers(1, length + 1, batch)
            ids = rng.integers(0, rows, batch * length)
        valid = (np.arange(length) < lengths[:, None]).reshape(-1)
        positions = np.arange(batch * length)[valid]
        feeds[name] = (f.table, positions, ids[valid], batch * length)
    return feeds


@pytest.mark.parametrize("chips", [1, 2])
def test_the_buffers_hold_every_batch_of_the_shape(chips):
    """The engine's count (NumPy) of random batches and of the worst batch (every id on one
    receiver, full histories): never above the limits; the worst reaches the ids' limit."""
    plan = _plan(chips)
    n = 4 * chips
    limits = plan.buffers
    rng = np.random.default_rng(chips)
    for worst in (False, False, True):
        counts = sparse_core_counts(_feeds(rng, BATCH, worst=worst, layouts=plan.layouts),
                                    plan.layouts)  # fmt: skip
        for stack, (ids, unique) in counts.items():
            assert ids <= limits.max_ids[stack] and unique <= limits.max_unique_ids[stack]
            if worst:
                assert ids == limits.max_ids[stack]
    # Per sender: a quarter of each feature's rows, one id a row.
    ((stack, want),) = limits.max_ids.items()
    assert want == sum(BATCH * max(1, f.sequence_length) // 4 for f in FEATURES.values())
    config = limits.config()
    assert config.max_ids_per_table == limits.max_ids
    assert config.max_unique_ids_per_table == limits.max_unique_ids
    # A chip's buffer (ids per output row x rows) holds its ids and each run's padding to 8.
    rows = sum(BATCH * max(1, f.sequence_length) for f in FEATURES.values())
    per_sample = limits.ids_per_chip_per_sample
    assert per_sample * rows >= rows + 4 * n * 7 and (per_sample * rows) % 8 == 0


def test_shapes_the_engine_cannot_take_are_one_line_errors():
    with pytest.raises(UserError, match=r"power-of-two number of SparseCores; 12 \(3 chips"):
        _plan(3)
    with pytest.raises(
        UserError, match="the batch: feature item_history has 30 rows per replica, not "
    ):
        _plan(1, batch=6)


@pytest.mark.numerics
@pytest.mark.parametrize("chips", [1, 2])
def test_initial_shards_drawn_alone_assemble_to_the_whole_draw(chips):
    """Each SparseCore shard drawn by its table's initializer as TPUEmbeddingV2 calls it (with
    `shard_info`: `initial_stack`), assembled (`from_stacked`), is `draw_rows`' whole table,
    bit for bit; one shard's draw touches each block of its table once and returns the shard
    alone."""
    rows = {"item": 3000, "artist": 9, "uid": 700}  # the item table 3 blocks of 1,024 rows
    plan = _plan(chips, rows=rows)
    ((_, members),) = scl.stacks(plan.layouts).items()
    inits = {n: f.table.initializer for n, f in
             {f.table.name: f for f in plan.features.values()}.items()}  # fmt: skip
    assert inits["item"].rotation == plan.layouts["item"].sparse_core_shard_rotation
    # TPUEmbeddingV2 takes it for sharding-aware by its arguments (`_create_variables`).
    from tensorflow.python.util import tf_inspect

    assert "shard_info" in tf_inspect.getfullargspec(inits["item"]).args
    stacked = scl.initial_stack(members, inits, chips=chips)
    whole = scl.from_stacked(stacked, members)
    for name, init in inits.items():
        want = sharded_embedding.draw_rows(init.seed, init.bound, 0, rows[name], DIM)
        np.testing.assert_array_equal(whole[name].numpy(), want.numpy())
    # The padding is zero: the stacked value is exactly the whole tables' layout.
    np.testing.assert_array_equal(stacked.numpy(), scl.to_stacked(whole, members).numpy())
    # A chip's 4 shards of the item table, asked one after another as TF asks: the 3 blocks
    # drawn once in all (in the first call), each call its shard's rows alone.
    layout = plan.layouts["item"]
    padded = layout.unsharded_padded_shape[0]
    size = padded // layout.num_sparse_cores
    from tensorflow.python.trackable import base

    init = dataclasses.replace(inits["item"])  # nothing kept from the draws above
    with mock.patch.object(sharded_embedding, "_block", wraps=sharded_embedding._block) as block:
        shards = [init((padded, DIM), shard_info=base.ShardInfo([size, DIM], [k * size, 0]))
                  for k in range(4)]  # fmt: skip
    assert [tuple(s.shape) for s in shards] == [(size, DIM)] * 4 and block.call_count == 3
    assert not init._kept  # handed out, not held
    index = scl.shard_rows(rows=3000, padded_rows=padded, shard_size=size, shard_offset=size,
                           rotation=layout.sparse_core_shard_rotation)  # fmt: skip
    want = sharded_embedding.draw_rows(init.seed, init.bound, 0, 3000, DIM).numpy()
    np.testing.assert_array_equal(shards[1].numpy(), np.where(index[:, None] >= 0, want[index], 0))


def test_rows_drawn_at_any_index_are_the_whole_draws_rows():
    """`draw_rows_at` on rows in no order, repeated, across blocks, with -1 padding: each row is
    the whole draw's row (bit for bit), -1 rows zero, each block drawn once."""
    want = sharded_embedding.draw_rows(7, 0.5, 0, 3000, DIM).numpy()
    index = np.array([2999, -1, 5, 1024, 5, 2048, 1023, -1, 0, 2047, 1500])
    with mock.patch.object(sharded_embedding, "_block", wraps=sharded_embedding._block) as block:
        got = sharded_embedding.draw_rows_at(7, 0.5, index, DIM).numpy()
    assert block.call_count == 3
    np.testing.assert_array_equal(got, np.where(index[:, None] >= 0, want[index], 0))
