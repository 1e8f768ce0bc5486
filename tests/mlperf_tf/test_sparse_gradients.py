"""An embedding's sparse gradient (`IndexedSlices`) through the runner's `Trainer` with Keras' own
sum: rows looked up several times (in one example, in both micro-batches, on both replicas) are
updated as the same gradient made dense would update them.

The bug these guard: the Trainer handed Keras the rows as listed (a row once per lookup, the
micro-batches' and the replicas' rows joined), and Keras 3's sparse Adam squares each listed
value before the duplicates are summed, so a repeated row's second moment was sum(g_i^2), not
(sum g_i)^2, and its first step moved it by up to sqrt(n) x lr (here, before the fix: row 1,
16 lookups on 2 replicas, moved 3.9e-3 at lr 1e-3; 2.8e-3 on one replica, 8 lookups); the
clip's global norm added the duplicates' squares too (the clipped SGD step 5.7e-5 off).
The references are NumPy transcriptions: Adam's first step (Keras' formula) and SGD's clipped
step, on the dense gradient summed with `np.add.at`.
"""

from __future__ import annotations

import dataclasses

import keras
import numpy as np
import pytest
import tensorflow as tf

from mlperf_tf.benchmark import RunContext
from mlperf_tf.optimizers.adam import FusedAdam
from mlperf_tf.optimizers.base import clipped_update
from mlperf_tf.parallel.mesh import DeviceMesh
from mlperf_tf.runner.trainer import Trainer
from mlperf_tf.sparse import merge_duplicate_rows
from tests import strategies
from tests.numerics import assert_close
from tests.tiny_benchmark import TinyBenchmark, TinyConfig

pytestmark = pytest.mark.numerics

VOCAB, WIDTH, LOOKUPS = 8, 3, 4
LR = 1e-3


def _ids(example):
    # [LOOKUPS]: row 1 twice in every example, row 2 + example % 3 once, row 6 on odd examples.
    e = tf.cast(example, tf.int32)
    return tf.stack([1, 1, 2 + e % 3, tf.where(e % 2 == 1, 6, 7)])


def _coefficients(example):
    # [LOOKUPS, WIDTH], positive: every summed gradient element is far from 0 (Adam's epsilon).
    seed = tf.stack([tf.cast(example, tf.int32), tf.constant(3, tf.int32)])
    return 0.5 + tf.random.stateless_uniform([LOOKUPS, WIDTH], seed=seed)


class _Table(keras.layers.Layer):
    """One [VOCAB, WIDTH] table read with `tf.gather` (its gradient: `IndexedSlices`)."""

    def build(self, input_shape):
        self.table = self.add_weight(shape=(VOCAB, WIDTH), initializer="zeros", name="table")

    def call(self, ids):
        return tf.gather(self.table, ids)  # [batch, LOOKUPS, WIDTH]


class _LookupBenchmark(TinyBenchmark):
    """Loss: the mean over the global batch of sum(table[ids] * coefficients)."""

    def build_model(self):
        ids = keras.Input([LOOKUPS], dtype="int32")
        return keras.Model(ids, _Table()(ids))

    def _dataset(self, input_context, offset, count):
        batch = input_context.get_per_replica_batch_size(self.micro_batch_size)
        examples = tf.data.Dataset.range(offset, 2**62)
        return examples.map(lambda e: {"ids": _ids(e), "c": _coefficients(e)}).batch(batch)

    def compute_loss(self, model, batch, training=True):
        rows = model(batch["ids"], training=training)
        return tf.reduce_sum(rows * batch["c"]) / self.micro_batch_size


def _dense_gradient(examples: int) -> np.ndarray:
    """The loss' gradient on examples [0, examples), summed with NumPy: [VOCAB, WIDTH]."""
    grad = np.zeros([VOCAB, WIDTH])
    for e in range(examples):
        np.add.at(grad, np.asarray(_ids(e)), np.asarray(_coefficients(e), np.float64))
    return grad / examples


def _adam_first_step(g: np.ndarray) -> np.ndarray:
    """Keras' Adam (beta_1 0.9, beta_2 0.999, epsilon 1e-7) at t = 1 from zero moments."""
    b1, b2, eps = 0.9, 0.999, 1e-7
    m, v = (1 - b1) * g, (1 - b2) * g**2
    alpha = LR * np.sqrt(1 - b2) / (1 - b1)
    return -m * alpha / (np.sqrt(v) + eps)


def _one_step(make_optimizer, *, replicas: int, clip_norm: float = 0.0):
    """One Trainer step (2 micro-batches of 2 examples per replica, Keras' sum); the table's
    move and the number of examples the step read."""
    strategy = strategies.mirrored(replicas)
    config = dataclasses.replace(
        TinyConfig(global_batch_size=4 * replicas, eval_batch_size=4, train_examples=64,
                   eval_examples=4, max_epochs=1),
        gradient_accumulation_steps=2, gradient_clip_norm=clip_norm,
    )  # fmt: skip
    bench = _LookupBenchmark(config).with_context(
        RunContext(num_replicas=replicas, seed=1, mesh=DeviceMesh(data=replicas))
    )
    with strategy.scope():
        model = bench.build_model()
        optimizer = make_optimizer()
        optimizer.build(model.trainable_variables)
        trainer = Trainer(strategy=strategy, benchmark=bench, model=model, optimizer=optimizer,
                          xla=False)  # fmt: skip
    batch = next(iter(bench.train_dataset(tf.distribute.InputContext())))
    with tf.GradientTape() as tape:
        loss = bench.compute_loss(model, batch)
    assert isinstance(tape.gradient(loss, model.trainable_variables[0]), tf.IndexedSlices)
    data = iter(strategy.distribute_datasets_from_function(bench.train_dataset))
    _, done, _, _ = trainer.loop(data, tf.constant(1, tf.int32))
    assert int(done) == 1
    return np.asarray(model.trainable_variables[0]), config.global_batch_size


@pytest.mark.parametrize(
    ("make", "replicas"),
    [(lambda: keras.optimizers.Adam(LR), 2), (lambda: FusedAdam(LR), 2),
     (lambda: FusedAdam(LR), 1)],
    ids=["keras_adam_r2", "fused_adam_r2", "fused_adam_r1"],
)  # fmt: skip
def test_adam_moves_a_repeated_row_by_lr_as_dense(make, replicas):
    moved, examples = _one_step(make, replicas=replicas)
    expected = _adam_first_step(_dense_gradient(examples))
    assert_close(moved, expected, rtol=1e-5, scale=LR)
    # Each row looked up (row 1 twice in every example) moved by lr, the others not at all.
    assert_close(np.abs(moved[[1, 2, 3, 4, 6, 7]]), np.full([6, WIDTH], LR), rtol=1e-3, scale=LR)


def test_the_clip_norm_of_a_sparse_gradient_counts_each_row_once():
    """SGD (step = lr x gradient) clipped to a norm below the gradient's: the scale is the
    dense gradient's norm, not that of the rows as listed."""
    clip = 0.05
    moved, examples = _one_step(lambda: keras.optimizers.SGD(LR), replicas=2, clip_norm=clip)
    g = _dense_gradient(examples)
    assert np.linalg.norm(g) > 2 * clip
    assert_close(moved, -LR * g * clip / np.linalg.norm(g), rtol=1e-5, scale=LR * clip)


def test_merge_duplicate_rows_sums_equal_indices():
    values = np.arange(15, dtype=np.float32).reshape(5, 3)
    indices = np.array([4, 0, 4, 2, 0])
    merged = merge_duplicate_rows(
        tf.IndexedSlices(tf.constant(values), tf.constant(indices), tf.constant([6, 3]))
    )
    assert sorted(np.asarray(merged.indices)) == [0, 2, 4]
    want = np.zeros([6, 3], np.float32)
    np.add.at(want, indices, values)
    np.testing.assert_array_equal(np.asarray(tf.convert_to_tensor(merged)), want)
    dense = tf.ones([2, 2])
    assert merge_duplicate_rows(dense) is dense


@pytest.mark.parametrize("clip", [0.0, 0.5])
def test_clipped_update_outside_the_runner_steps_as_the_dense_gradient(clip):
    """`clipped_update` (base-training loops in `prepare`): Keras Adam on a sparse gradient with
    duplicate rows, clipped below its norm, moves the table as on the dense sum (NumPy), and the
    returned norm is the dense gradient's, not that of the rows as listed."""
    values = (0.5 + np.arange(15, dtype=np.float32).reshape(5, 3)) / 10.0  # [lookups, WIDTH]
    indices = np.array([4, 0, 4, 2, 0])
    dense = np.zeros([6, 3], np.float32)
    np.add.at(dense, indices, values)
    table = keras.Variable(np.zeros([6, 3], np.float32))
    optimizer = keras.optimizers.Adam(LR)
    optimizer.build([table])
    grad = tf.IndexedSlices(tf.constant(values), tf.constant(indices), tf.constant([6, 3]))
    norm = clipped_update(optimizer, [grad], [table], clip)
    assert_close(float(norm), np.linalg.norm(dense), rtol=1e-6, scale=np.linalg.norm(dense))
    g = dense * (min(1.0, clip / np.linalg.norm(dense)) if clip else 1.0)
    expected = _adam_first_step(g)
    assert_close(np.asarray(table), expected, rtol=1e-5, scale=LR)
