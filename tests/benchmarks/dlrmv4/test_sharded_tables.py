"""DLRMv4 with its tables split over 2 (and, slow, 4) replicas of the mesh's `expert` axis ends
where the unsplit run of the same batch shards does: losses, first gradients and final weights,
tables compared whole (the split run's storage permuted back to the canonical tables), the
row-wise Adagrad accumulators too; a checkpoint written split restores unsplit and the reverse."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import tensorflow as tf

from benchmarks.dlrmv4.benchmark import DlrmV4Benchmark
from benchmarks.dlrmv4.config import CROSS_FEATURES
from benchmarks.dlrmv4.model import TABLES_LAYER
from mlperf_tf.collectives import GradientSummer, Settings
from mlperf_tf.errors import UserError
from mlperf_tf.layers.sharded_embedding import (
    INIT_BLOCK,
    ROW_WISE,
    TABLE_WISE,
    draw_rows,
    plan_tables,
)
from mlperf_tf.parallel import layout as layout_lib
from mlperf_tf.parallel.context import use_mesh
from mlperf_tf.parallel.input import for_mesh
from mlperf_tf.runner.trainer import Trainer
from tests import tensor_parallel
from tests.graph_ops import dense_tensors

pytestmark = pytest.mark.numerics

TABLES = "sparse_tables/embeddings"


def _benchmark() -> DlrmV4Benchmark:
    """The smoke preset, dropout off, 600 items, a clip that binds (dense gradient norm > 0.05)."""
    bench = tensor_parallel.smoke(
        DlrmV4Benchmark, input_dropout=0.0, linear_dropout=0.0, item_rows=600
    )  # the item table row-wise at E = 2 and 4, the rest table-wise
    c = bench.config
    return DlrmV4Benchmark(
        dataclasses.replace(
            c, optimizer=dataclasses.replace(c.optimizer, opt_gradient_clip_norm=0.05)
        )
    )


def _canonical(result, benchmark, shards: int):
    """`result` with the tables' weight, first gradient and row slot as canonical whole tables."""
    plan = plan_tables(benchmark.config.model.table_rows(), shards)
    index = plan.storage_rows()
    (i,) = [k for k, name in enumerate(result.names) if name.endswith(TABLES)]
    result.weights[i] = result.weights[i][index]
    result.grads[i] = result.grads[i][index]
    for name, value in result.slots.items():
        if name.endswith("row_accumulator"):
            result.slots[name] = value[index]
    return result


def _train(benchmark, devices: int, expert: int, **kwargs):
    got = tensor_parallel.train(
        benchmark, num_devices=devices, model_parallel=1, expert_parallel=expert,
        optimizer="own", **{"steps": 3, **kwargs},
    )  # fmt: skip
    return _canonical(got, benchmark, expert)


def _assert_same(got, ref):
    tensor_parallel.assert_same_run(got, ref, rtol=1e-5)
    for name, want in ref.slots.items():
        scale = max(1e-6, float(np.abs(want).max()))
        np.testing.assert_allclose(got.slots[name], want, rtol=1e-5, atol=1e-5 * scale,
                                   err_msg=name)  # fmt: skip


def test_the_planner_splits_large_tables_by_rows_and_places_small_ones_whole():
    rows = {"big": 1000, "mid": 300, "a": 100, "b": 90, "c": 10}
    plan = plan_tables(rows, 4)  # even share: 375 rows
    assert plan.tables["big"].kind == ROW_WISE and plan.tables["big"].block == 250
    assert {n for n, p in plan.tables.items() if p.kind == TABLE_WISE} == {"mid", "a", "b", "c"}
    # Largest first onto the least-loaded replica: mid -> 0, a -> 1, b -> 2, c -> 3.
    assert [plan.tables[n].first for n in ("mid", "a", "b", "c")] == [0, 1, 2, 3]
    assert plan.loads() == [550, 350, 340, 260]
    assert plan.capacity == 552
    # Every canonical row has its own storage row.
    index = plan.storage_rows()
    assert len(np.unique(index)) == len(index) == 1500 and index.max() < 4 * plan.capacity
    # One shard: the storage is the canonical tensor.
    np.testing.assert_array_equal(plan_tables(rows, 1).storage_rows(), np.arange(1500))


def test_the_smoke_tables_are_both_row_and_table_wise_at_two_shards():
    plan = plan_tables(_benchmark().config.model.table_rows(), 2)
    kinds = {p.kind for p in plan.tables.values()}
    assert kinds == {ROW_WISE, TABLE_WISE}, plan
    assert len(CROSS_FEATURES) + 4 == len(plan.tables)


@pytest.mark.parametrize("expert", [2, pytest.param(4, marks=pytest.mark.slow)])
def test_tables_split_over_replicas_end_with_the_unsplit_runs_weights(expert):
    """3 steps (Adam + row-wise Adagrad, the dense clip binding) at E = 2 (4) on as many
    logical CPUs, each batch shard reading its own synthetic samples, against data = 2 (4)
    with whole tables: same losses, first gradients, weights and accumulators at 1e-5 of their
    scale."""
    b = _benchmark()
    ref = _train(b, expert, 1)
    got = _train(b, expert, expert)
    _assert_same(got, ref)
    assert got.losses[-1] != got.losses[0]


@pytest.mark.slow  # 2 x 3 steps of 4 traced models: ~100 s at load 8
@pytest.mark.parametrize(("devices", "expert"), [(2, 1), (4, 2)], ids=["data2", "data2_expert2"])
def test_the_tables_gradient_summed_as_rows_ends_where_the_dense_sum_ends(devices, expert):
    """3 steps of the summer (ring) with each table gradient summed as rows against the same
    made dense first (the summer's old path), each batch shard its own samples: losses,
    weights and accumulators at 1e-5 of their scale, the tables summed over data = 2."""
    b = _benchmark()
    rows = _train(b, devices, expert)
    dense = _train(b, devices, expert, dense_gradients=True)
    _assert_same(rows, dense)


def _table_entries(path: str, shape) -> int:
    """How many tensors of `shape` the checkpoint at `path` holds."""
    reader = tf.train.load_checkpoint(path)
    return sum(tuple(s) == tuple(shape) for s in reader.get_variable_to_shape_map().values())


@pytest.mark.slow  # 8 short trainings: 183 s at load 8
def test_a_checkpoint_written_split_restores_unsplit_and_the_reverse(tmp_path):
    """2 steps at E = 2 and at E = 1 (data = 2), each saved: both checkpoints hold the tables
    whole (`[sum of rows, dim]`, and their accumulators `[sum of rows]`), no storage layout.
    Restored at the other E, 2 more steps end where resuming at the same E does."""
    b = _benchmark()
    c = b.config.model
    rows = sum(c.table_rows().values())
    paths = {e: str(tmp_path / f"e{e}") for e in (1, 2)}
    for e, path in paths.items():
        _train(b, 2, e, steps=2, save_to=path)
        assert _table_entries(path, (rows, c.embedding_dim)) == 1
        assert _table_entries(path, (rows,)) == 1
    for e, other in ((1, 2), (2, 1)):
        ref = _train(b, 2, e, steps=2, restore_from=paths[e])
        got = _train(b, 2, e, steps=2, restore_from=paths[other])
        _assert_same(got, ref)


def test_tables_larger_than_a_replica_can_hold_are_one_line():
    """`model.embedding_memory_gb` below what one replica's share of the tables and their
    row-wise slot needs: a one-line error naming it, before anything is allocated."""
    b = _benchmark()
    c = b.config
    small = dataclasses.replace(c.model, embedding_memory_gb=1e-5)  # 10 KiB < 1,128 x 17 x 4 B
    bench = DlrmV4Benchmark(dataclasses.replace(c, model=small))
    with pytest.raises(
        UserError, match=r"`model.embedding_memory_gb` \([0-9.e-]+ GiB\): .*expert_parallel=1"
    ):
        bench.build_model()


def _built(b, devices: int, expert: int, *, summer: bool):
    """(strategy, mesh, benchmark in its context, model, optimizer built, Trainer) at `devices`
    logical CPUs split as `expert` x data; `summer`: the collectives' sum (`--all_reduce=ring`,
    the runner's choice whenever `--expert_parallel` > 1), else Keras' own."""
    strategy, mesh, bench = tensor_parallel.on_mesh(b, devices, expert_parallel=expert)
    with strategy.scope(), use_mesh(mesh):
        model = bench.build_model()
        optimizer = bench.build_optimizer(100)
        variables = model.trainable_variables
        optimizer.build(variables)
        trainer = Trainer(strategy=strategy, benchmark=bench, model=model, optimizer=optimizer,
                          xla=False)  # fmt: skip
        if summer:
            trainer.summer = GradientSummer(strategy, Settings(all_reduce="ring", timeout_s=60),
                                            mesh)  # fmt: skip
            trainer.summer.build(optimizer, variables)
        layout_lib.split_slots(optimizer, mesh)
    return strategy, mesh, bench, model, trainer


@pytest.mark.parametrize(
    ("devices", "expert", "summer"),
    [(2, 2, True), pytest.param(2, 1, False, marks=pytest.mark.slow),
     pytest.param(1, 1, False, marks=pytest.mark.slow),
     pytest.param(2, 1, True, marks=pytest.mark.slow)],
    ids=["expert2", "data2_keras_sum", "one_device", "data2_summer"],
)  # fmt: skip
def test_a_train_step_never_makes_the_tables_gradient_dense(devices, expert, summer):
    """The runner's train step (`Trainer.loop`), traced: no tensor of a replica's table storage
    shape `[capacity, dim]` but the table's reads (a dense gradient would be one, and the
    clip, sum and update computed from it more). The split tables' lookup and its backward
    all-to-all, Keras' sum (`_summed_shares`) and the collectives' sum all keep it as rows."""
    b = _benchmark()
    strategy, mesh, bench, model, trainer = _built(b, devices, expert, summer=summer)
    data = iter(strategy.distribute_datasets_from_function(for_mesh(bench.train_dataset, mesh)))
    traced = trainer.loop.get_concrete_function(data, tf.constant(1, tf.int32))
    tables = model.get_layer(TABLES_LAYER)
    assert dense_tensors(traced, [tables.plan.capacity, tables.dim]) == []


def test_every_layout_starts_from_the_same_tables():
    """The tables built at E = 1, 2 and 4 (on 4 logical CPUs) are bit-identical whole, each
    table the row-block draw of its seed (`draw_rows`) within U(+-sqrt(1 / rows)); a replica's
    shard is drawn for its own rows alone (`shard_initial_value` equals the whole draw's rows
    it holds)."""
    b = _benchmark()
    whole = {}
    for expert in (1, 2, 4):
        strategy, mesh, bench = tensor_parallel.on_mesh(b, 4, expert_parallel=expert)
        with strategy.scope(), use_mesh(mesh):
            tables = bench.build_model().get_layer(TABLES_LAYER)
            whole[expert] = tables.tables()
        storage = np.asarray(layout_lib.whole_value(tables.embeddings, mesh))
        for shard in range(expert):
            part = storage[shard * tables.plan.capacity : (shard + 1) * tables.plan.capacity]
            np.testing.assert_array_equal(np.asarray(tables.shard_initial_value(shard)), part)
    rows = b.config.model.table_rows()
    for k, (name, n) in enumerate(rows.items()):
        for expert in (2, 4):
            np.testing.assert_array_equal(whole[expert][name], whole[1][name], err_msg=name)
        want = draw_rows(bench.seed + k, np.sqrt(1.0 / n), 0, n, b.config.model.embedding_dim)
        np.testing.assert_array_equal(whole[1][name], np.asarray(want), err_msg=name)
        assert np.abs(whole[1][name]).max() <= np.sqrt(1.0 / n)
    assert len({float(w[0, 0]) for w in whole[1].values()}) == len(rows)  # seeds differ


def test_a_range_of_rows_is_drawn_as_the_whole_tables_rows():
    """`draw_rows` over any range (inside a block, across blocks) is that range of the whole
    draw, bit for bit, and differs with the seed."""
    rows, dim = 3 * INIT_BLOCK + 17, 3
    whole = np.asarray(draw_rows(7, 0.5, 0, rows, dim))
    assert whole.shape == (rows, dim) and 0.45 < np.abs(whole).max() <= 0.5
    for start, stop in ((0, 1), (5, 900), (INIT_BLOCK - 2, INIT_BLOCK + 3), (1500, rows)):
        np.testing.assert_array_equal(np.asarray(draw_rows(7, 0.5, start, stop, dim)),
                                      whole[start:stop])  # fmt: skip
    assert not np.array_equal(np.asarray(draw_rows(8, 0.5, 0, rows, dim)), whole)
