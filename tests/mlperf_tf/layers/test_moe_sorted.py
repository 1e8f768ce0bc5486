"""Tests of the sorted dropless dispatch (`moe.sorted_expert_outputs`, `SortedMoEFeedForward`):
the same outputs and gradients as the capacity-buffer path at capacity factor 0."""

import numpy as np
import pytest
import tensorflow as tf

from mlperf_tf.layers import moe


def _layers(expert_mlp, router_softmax, top_k, num_experts=6):
    kwargs = dict(
        hidden_size=8, filter_size=12, num_experts=num_experts, top_k=top_k,
        capacity_factor=0.0, eval_capacity_factor=0.0, router_softmax=router_softmax,
        expert_mlp=expert_mlp, seed=3,
    )  # fmt: skip
    buffer, ordered = moe.MoEFeedForward(**kwargs), moe.SortedMoEFeedForward(**kwargs)
    buffer.build((None, 8))
    ordered.build((None, 8))
    for a, b in zip(buffer.weights, ordered.weights, strict=True):
        b.assign(a)
    return buffer, ordered


@pytest.mark.parametrize(
    "expert_mlp,router_softmax,top_k", [("swiglu", "after", 2), ("relu", "before", 3)]
)
def test_sorted_dispatch_equals_the_buffer_path(expert_mlp, router_softmax, top_k):
    buffer, ordered = _layers(expert_mlp, router_softmax, top_k)
    x = tf.random.stateless_normal([3, 7, 8], [1, 2])
    with tf.GradientTape(persistent=True) as tape:
        tape.watch(x)
        y_buffer, stats_buffer = buffer(x, training=True)
        y_sorted, stats_sorted = ordered(x, training=True)
        loss_buffer = tf.reduce_sum(tf.square(y_buffer))
        loss_sorted = tf.reduce_sum(tf.square(y_sorted))
    scale = float(tf.reduce_max(tf.abs(y_buffer)))
    np.testing.assert_allclose(y_sorted, y_buffer, atol=1e-6 * scale, rtol=0)
    np.testing.assert_array_equal(stats_sorted.load, stats_buffer.load)
    assert float(stats_sorted.dropped) == float(stats_buffer.dropped) == 0.0
    grads_buffer = tape.gradient(loss_buffer, [x, *buffer.weights])
    grads_sorted = tape.gradient(loss_sorted, [x, *ordered.weights])
    for a, b in zip(grads_buffer, grads_sorted, strict=True):
        a = tf.convert_to_tensor(a)
        np.testing.assert_allclose(b, a, atol=1e-5 * float(tf.reduce_max(tf.abs(a))), rtol=0)


def test_an_expert_with_no_rows_and_the_gates():
    """Every token routed to expert 0 and 1 (others get no row): gate-weighted sum by hand."""
    tokens = tf.random.stateless_normal([5, 4], [0, 1])
    expert = tf.constant([[0, 1]] * 5)
    gates = tf.random.stateless_uniform([5, 2], [0, 2])
    scales = tf.constant([2.0, -3.0, 5.0, 7.0])

    def expert_fn(e, rows):
        return rows * scales[e]

    y = moe.sorted_expert_outputs(tokens, expert, gates, 4, expert_fn)
    want = tokens * (2.0 * gates[:, :1] - 3.0 * gates[:, 1:])
    np.testing.assert_allclose(y, want, rtol=1e-6)


def test_sorted_layer_refuses_a_capacity_limit():
    with pytest.raises(ValueError, match="dropless"):
        moe.SortedMoEFeedForward(hidden_size=4, filter_size=4, num_experts=2, capacity_factor=1.0)
