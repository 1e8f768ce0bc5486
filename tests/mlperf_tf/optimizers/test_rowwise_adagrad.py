"""`AdamWRowWiseAdagrad` against NumPy: FBGEMM's exact row-wise Adagrad on the touched rows of a
table (duplicates summed first, untouched rows and their state left alone), PyTorch's Adam on
the dense weights, both under one learning rate."""

from __future__ import annotations

import keras
import numpy as np
import pytest
import tensorflow as tf

from mlperf_tf.optimizers.rowwise_adagrad import AdamWRowWiseAdagrad

pytestmark = pytest.mark.numerics


def numpy_rowwise_adagrad(table, acc, ids, row_grads, lr, eps):
    """EXACT_ROWWISE_ADAGRAD: per distinct id, g = sum of its rows' gradients;
    a += mean(g^2); w -= lr g / (sqrt(a) + eps)."""
    table, acc = table.copy(), acc.copy()
    for i in np.unique(ids):
        g = row_grads[ids == i].sum(0)
        acc[i] += np.mean(g * g)
        table[i] -= lr * g / (np.sqrt(acc[i]) + eps)
    return table, acc


def numpy_adam(w, m, v, g, lr, t, b1=0.9, b2=0.999, eps=1e-8):
    m = b1 * m + (1 - b1) * g
    v = b2 * v + (1 - b2) * g * g
    return w - lr / (1 - b1**t) * m / (np.sqrt(v) / np.sqrt(1 - b2**t) + eps), m, v


def test_three_steps_match_numpy_and_untouched_rows_never_change():
    rng = np.random.default_rng(0)
    table0 = rng.standard_normal((10, 4)).astype(np.float32)
    dense0 = rng.standard_normal((4,)).astype(np.float32)
    table = keras.Variable(table0, name="embedding_table")
    dense = keras.Variable(dense0, name="dense")
    opt = AdamWRowWiseAdagrad(0.05, sparse_variables=("embedding",), sparse_epsilon=1e-8)
    opt.build([table, dense])
    want_t, want_acc = table0.astype(np.float64), np.zeros(10)
    want_w, m, v = dense0.astype(np.float64), np.zeros(4), np.zeros(4)
    batches = [[1, 3, 1, 7], [3, 3, 2, 9], [0, 1, 2, 3]]
    for step, ids in enumerate(batches, start=1):
        with tf.GradientTape() as tape:
            rows = tf.gather(table, ids)  # [4, 4]
            loss = tf.reduce_sum(tf.tanh(rows * dense) * tf.range(1.0, 5.0)[:, None])
        grads = tape.gradient(loss, [table, dense])
        assert isinstance(grads[0], tf.IndexedSlices)
        # The NumPy side from the same per-lookup gradients.
        r = want_t[ids]
        d = (1 - np.tanh(r * want_w) ** 2) * np.arange(1.0, 5.0)[:, None]
        row_grads, g_dense = d * want_w, (d * r).sum(0)
        opt.apply_gradients(zip(grads, [table, dense]))
        want_t, want_acc = numpy_rowwise_adagrad(want_t, want_acc, np.array(ids), row_grads,
                                                 0.05, 1e-8)  # fmt: skip
        want_w, m, v = numpy_adam(want_w, m, v, g_dense, 0.05, step)
        np.testing.assert_allclose(table.numpy(), want_t, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(dense.numpy(), want_w, rtol=1e-5, atol=1e-6)
    untouched = sorted(set(range(10)) - {i for ids in batches for i in ids})
    np.testing.assert_array_equal(table.numpy()[untouched], table0[untouched])
    accumulator = [s for s in opt.variables if "row_accumulator" in s.path][0]
    np.testing.assert_allclose(accumulator.numpy(), want_acc, rtol=1e-5)
    # The tables carry no Adam moments: one [rows] accumulator each.
    assert accumulator.shape == (10,)
    assert not [s for s in opt.variables if "embedding_table_momentum" in s.path]


def test_a_sparse_variable_must_be_a_table():
    with pytest.raises(ValueError, match=r"must be \[rows, dim\]"):
        AdamWRowWiseAdagrad(0.1).build([keras.Variable(np.zeros(3, np.float32), name="embedding")])


def test_config_round_trips():
    opt = AdamWRowWiseAdagrad(0.1, sparse_variables=("table_",), sparse_epsilon=1e-6)
    again = AdamWRowWiseAdagrad.from_config(opt.get_config())
    assert again.sparse_patterns == ("table_",) and again.sparse_epsilon == 1e-6


def test_the_clip_scales_the_dense_gradients_only():
    rng = np.random.default_rng(2)
    table0 = rng.standard_normal((5, 3)).astype(np.float32)
    dense0 = rng.standard_normal((3,)).astype(np.float32)
    table = keras.Variable(table0, name="embedding_table")
    dense = keras.Variable(dense0, name="dense")
    opt = AdamWRowWiseAdagrad(0.1, dense_clipnorm=0.01, sparse_epsilon=0.0)
    g_table = tf.IndexedSlices(tf.constant([[3.0, 4.0, 0.0]]), tf.constant([2]), (5, 3))
    g_dense = tf.constant([30.0, 40.0, 0.0])
    opt.apply_gradients(zip([g_table, g_dense], [table, dense]))
    # Table row 2: a = mean(g^2) = 25/3, step 0.1 g / sqrt(a): the unclipped gradient.
    want_row = table0[2] - 0.1 * np.array([3.0, 4.0, 0.0]) / np.sqrt(25 / 3)
    np.testing.assert_allclose(table.numpy()[2], want_row, rtol=1e-6)
    # Dense: Adam's first step is lr * sign(g) whatever the clip, so check the moments.
    momentum = [s for s in opt.variables if s.path.endswith("dense_momentum")][0]
    np.testing.assert_allclose(momentum.numpy(), 0.1 * np.array([0.006, 0.008, 0.0]), rtol=1e-5)
