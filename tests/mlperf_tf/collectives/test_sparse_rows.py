"""An embedding table's sparse gradient through the gradient summer travels as rows
(`collectives.rows.all_gather_rows`) and ends where the dense sum of the whole table ends.

Three steps of a table lookup and a dense weight, each replica with its own ids (rows repeated
in a batch and across replicas), row-wise Adagrad on the table and Adam on the weight (dense
clip binding), the summer's global clip binding in one case: the rows path's table, weight and
row accumulators equal the dense path's (the gradient made dense before the summer) at 1e-5 of
their scale. The traced step of the rows path holds no `[rows, dim]` tensor but the table's
reads; the dense path's does (so the check can fail). The ids' float pairs are exact.
"""

from __future__ import annotations

import keras
import numpy as np
import pytest
import tensorflow as tf

from mlperf_tf.collectives import GradientSummer, Settings
from mlperf_tf.collectives.rows import ids_to_pairs, pairs_to_ids
from mlperf_tf.optimizers.rowwise_adagrad import AdamWRowWiseAdagrad
from mlperf_tf.parallel.mesh import DeviceMesh
from tests import strategies
from tests.graph_ops import dense_tensors
from tests.numerics import assert_close

pytestmark = pytest.mark.numerics

ROWS, DIM, BATCH, LOOKUPS, STEPS = 4096, 4, 4, 3, 3


def _batches(replicas: int):
    """Per step, per replica: ids [BATCH, LOOKUPS] (row 7 in every batch, rows 0-63 shared by
    the replicas: duplicates within and across them) and targets [BATCH]."""
    rng = np.random.default_rng(5)
    out = []
    for _ in range(STEPS):
        ids = rng.integers(0, 64, size=[replicas, BATCH, LOOKUPS])
        ids[:, :, 0] = 7
        ids[:, 0, 1] = rng.integers(64, ROWS, size=replicas)  # a row one replica alone reads
        out.append((ids.astype(np.int32), rng.normal(size=[replicas, BATCH]).astype(np.float32)))
    return out


def _train(replicas: int, algorithm: str, pack_mb: float, clip_norm, *, dense: bool):
    """The table, weight and accumulator after `STEPS` steps, and the traced step."""
    strategy = strategies.mirrored(replicas)
    rng = np.random.default_rng(0)
    with strategy.scope():
        table = keras.Variable(rng.uniform(-0.1, 0.1, [ROWS, DIM]).astype(np.float32),
                               name="embedding_table")  # fmt: skip
        weight = keras.Variable(rng.normal(size=[DIM, 1]).astype(np.float32), name="w")
        variables = [table, weight]
        optimizer = AdamWRowWiseAdagrad(0.05, sparse_variables=("embedding",),
                                        dense_clipnorm=0.05)  # fmt: skip
        optimizer.build(variables)
    settings = Settings(all_reduce=algorithm, pack_mb=pack_mb, timeout_s=60)
    summer = GradientSummer(strategy, settings, DeviceMesh(data=replicas))
    with strategy.scope():
        summer.build(optimizer, variables)

    def replica(ids, y):
        with tf.GradientTape() as tape:
            logits = tf.matmul(tf.gather(table, ids), weight)[..., 0]  # [BATCH, LOOKUPS]
            loss = tf.reduce_sum(tf.square(tf.reduce_sum(logits, -1) - y)) / (BATCH * replicas)
        grads = tape.gradient(loss, variables)
        assert isinstance(grads[0], tf.IndexedSlices)
        if dense:
            grads = [tf.convert_to_tensor(g) for g in grads]
        summer.apply(optimizer, grads, variables, clip_norm=clip_norm)
        return loss

    @tf.function
    def step(ids, y):
        return strategy.run(replica, args=(ids, y))

    def per_replica(x):
        return strategy.experimental_distribute_values_from_function(
            lambda context: tf.constant(x[context.replica_id_in_sync_group])
        )

    for ids, y in _batches(replicas):
        step(per_replica(ids), per_replica(y))
    traced = step.get_concrete_function(per_replica(ids), per_replica(y))
    (accumulator,) = [v for v in optimizer.variables if "row_accumulator" in v.name]
    values = [np.asarray(v) for v in (table, weight, accumulator)]
    return values, dense_tensors(traced, [ROWS, DIM])


@pytest.mark.parametrize(
    ("replicas", "algorithm", "pack_mb", "clip_norm"),
    [(2, "ring", 0.0, None), (4, "torus2d", 0.001, 0.05)],
)
def test_a_tables_gradient_summed_as_rows_ends_where_the_dense_sum_ends(
    replicas, algorithm, pack_mb, clip_norm
):
    rows, rows_graph = _train(replicas, algorithm, pack_mb, clip_norm, dense=False)
    dense, dense_graph = _train(replicas, algorithm, pack_mb, clip_norm, dense=True)
    for name, got, want in zip(("table", "weight", "accumulator"), rows, dense, strict=True):
        assert_close(got, want, rtol=1e-5, err_msg=name)
    initial = np.random.default_rng(0).uniform(-0.1, 0.1, [ROWS, DIM]).astype(np.float32)
    moved = np.any(rows[0] != initial, axis=1)
    assert 10 < moved.sum() < 100, moved.sum()  # the touched rows moved, the others not
    assert not rows_graph, rows_graph
    assert any(op.startswith("UnsortedSegmentSum") for op in dense_graph), dense_graph


def test_ids_cross_as_exact_float_pairs():
    ids = tf.constant([-1, 0, 4095, 4096, 2**35 + 12345, 2**36 - 1], tf.int64)
    pairs = ids_to_pairs(ids)
    assert pairs.dtype == tf.float32
    np.testing.assert_array_equal(np.asarray(pairs_to_ids(pairs)), np.asarray(ids))
