"""Tests of the zig-zag split of a sequence over the `context` axis (`--context_parallel`): the
chunks and positions against a NumPy transcription of Megatron's split, the refusals, and the
attention of split members equal to the unsplit attention on 2 logical CPUs."""

import numpy as np
import pytest
import tensorflow as tf

from mlperf_tf.errors import UserError
from mlperf_tf.layers import context_parallel as cp
from mlperf_tf.layers import moe
from mlperf_tf.lm.attention import Attention
from mlperf_tf.lm.mla import MultiHeadLatentAttention
from mlperf_tf.lm.rope import RotaryEmbedding
from mlperf_tf.parallel.context import use_mesh
from mlperf_tf.parallel.mesh import DeviceMesh
from tests import strategies


def _megatron_chunks(seq, size, rank):
    """Megatron-core's `get_batch_on_this_cp_rank`, transcribed: view [2 size, seq / 2 size],
    take rows rank and 2 size - 1 - rank."""
    rows = np.arange(seq).reshape(2 * size, seq // (2 * size))
    return rows[[rank, 2 * size - rank - 1]].reshape(-1)


@pytest.mark.parametrize(("seq", "size"), [(8, 2), (24, 3), (32, 4), (6, 1)])
def test_zigzag_positions_are_megatron_s_chunks(seq, size):
    held = [cp.zigzag_positions(seq, size, c) for c in range(size)]
    for c in range(size):
        np.testing.assert_array_equal(held[c], _megatron_chunks(seq, size, c))
    # Every position once; the causal work (keys each query sees) equal on every member.
    np.testing.assert_array_equal(np.sort(np.concatenate(held)), np.arange(seq))
    assert len({int(np.sum(h + 1)) for h in held}) == 1


def test_a_sequence_that_does_not_cut_in_2c_chunks_is_one_line():
    with pytest.raises(UserError, match=r"--context_parallel=3 cuts each sequence into 6") as e:
        cp.check_sequence(32, 3)
    assert "\n" not in str(e.value)
    cp.check_sequence(32, 4)
    cp.check_sequence(7, 1)


def test_without_the_axis_every_method_is_the_identity():
    axis = cp.ContextAxis("t")
    x = tf.reshape(tf.range(12), [2, 6])
    assert axis.size == 1
    np.testing.assert_array_equal(axis.split(x), x)
    np.testing.assert_array_equal(axis.gather_sequence(x), x)
    np.testing.assert_array_equal(axis.positions(5), np.arange(5))


def _assert_split_equals_whole(make_layer, rope_dim: int, hidden: int = 16):
    """Outputs and input gradients of `make_layer()` (a causal attention, called as
    `layer(x, cos, sin)`) split over C = 2 members each holding its zig-zag chunks equal the
    unsplit layer's; the weights' gradients summed over the members equal the unsplit ones."""
    batch, seq = 2, 8
    x = tf.random.stateless_normal([batch, seq, hidden], [1, 2])
    weight = tf.sin(tf.range(seq * hidden, dtype=tf.float32)).numpy().reshape(1, seq, hidden)
    whole = make_layer()
    whole.build((None, None, hidden))
    rope = RotaryEmbedding(rope_dim, theta=10000.0)
    with tf.GradientTape() as tape:
        tape.watch(x)
        y = whole(x, *rope.tables(seq))
        loss = tf.reduce_sum(y * weight)
    dx, *dw = tape.gradient(loss, [x, *whole.trainable_variables])

    mesh = DeviceMesh(context=2)
    strategy = strategies.mirrored(2)
    with strategy.scope(), use_mesh(mesh):
        split = make_layer()
        split.build((None, None, hidden))
        split_rope = RotaryEmbedding(rope_dim, theta=10000.0)
        for a, b in zip(split.trainable_variables, whole.trainable_variables, strict=True):
            a.assign(b)

    def member(_):
        axis = cp.ContextAxis("test", mesh=mesh)
        mine = axis.split(x)
        with tf.GradientTape() as tape:
            tape.watch(mine)
            out = split(mine, *split_rope.tables(seq // 2))
            part = tf.reduce_sum(out * axis.split(tf.constant(weight)))
        return out, tape.gradient(part, [mine, *split.trainable_variables])

    @tf.function
    def run():
        return strategy.run(member, args=(tf.constant(0),))

    out, grads = run()
    outs = strategy.experimental_local_results(out)
    grads = [strategy.experimental_local_results(g) for g in grads]
    got = np.zeros_like(y.numpy())
    got_dx = np.zeros_like(dx.numpy())
    for c in range(2):
        where = cp.zigzag_positions(seq, 2, c)
        got[:, where] = outs[c].numpy()
        got_dx[:, where] = grads[0][c].numpy()
    np.testing.assert_allclose(got, y.numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(got_dx, dx.numpy(), rtol=1e-5, atol=1e-6)
    for g, ref in zip(grads[1:], dw, strict=True):
        np.testing.assert_allclose(g[0].numpy() + g[1].numpy(), ref.numpy(), rtol=1e-5, atol=1e-6)


@pytest.mark.numerics
@pytest.mark.parametrize("window", [0, 3])
def test_split_attention_equals_the_whole_on_two_members(window):
    """Causal GQA attention with RoPE (and a window of 3): k and v gathered over the axis."""
    kwargs = dict(hidden_size=16, num_heads=4, num_kv_heads=2, head_dim=4, stddev=0.2,
                  output_stddev=0.2, sliding_window=window)  # fmt: skip
    _assert_split_equals_whole(lambda: Attention(**kwargs), rope_dim=4)


@pytest.mark.numerics
@pytest.mark.parametrize("q_lora_rank", [0, 8])
def test_split_latent_attention_equals_the_whole_on_two_members(q_lora_rank):
    """DeepSeek's multi-head latent attention (with and without the query latent): the
    normalized key/value latent and the rotated shared k_pe gathered over the axis, the
    up-projection run on the gathered latent, the mask by true positions."""
    kwargs = dict(hidden_size=16, num_heads=4, q_lora_rank=q_lora_rank, kv_lora_rank=8,
                  qk_nope_head_dim=4, qk_rope_head_dim=4, v_head_dim=4, stddev=0.2,
                  output_stddev=0.2)  # fmt: skip
    _assert_split_equals_whole(lambda: MultiHeadLatentAttention(**kwargs), rope_dim=4)


@pytest.mark.numerics
def test_sequence_balance_loss_is_the_whole_sequences_on_every_member():
    """DeepSeek-V3's sequence-wise balance loss split over C = 2 members: each member's value is
    the unsplit loss (the whole sequences' f and P, summed over the axis), and the members'
    gradients of their value / C are the unsplit gradient at their tokens."""
    batch, seq, experts, top_k = 2, 8, 4, 2
    logits = tf.random.stateless_normal([batch, seq, experts], [3, 4])
    expert = tf.math.top_k(logits, top_k).indices  # [batch, seq, k]

    def loss_of(logits, expert, length, context=None):
        probs = tf.reshape(tf.sigmoid(logits), [-1, experts])
        probs = probs / tf.reduce_sum(probs, axis=-1, keepdims=True)
        return moe.sequence_balance_loss(
            probs, tf.reshape(expert, [-1, top_k]), length, context=context
        )

    with tf.GradientTape() as tape:
        tape.watch(logits)
        whole = loss_of(logits, expert, seq)
    d_whole = tape.gradient(whole, logits).numpy()
    mesh = DeviceMesh(context=2)
    strategy = strategies.mirrored(2)

    def member(_):
        axis = cp.ContextAxis("test", mesh=mesh)
        mine = axis.split(logits)
        with tf.GradientTape() as tape:
            tape.watch(mine)
            value = loss_of(mine, axis.split(expert), seq // 2, context=axis)
            share = value / axis.size  # the loss adds the auxiliary losses / C
        return value, tape.gradient(share, mine)

    values, grads = tf.function(lambda: strategy.run(member, args=(tf.constant(0),)))()
    values = strategy.experimental_local_results(values)
    grads = strategy.experimental_local_results(grads)
    assert len(values) == len(grads) == 2, (values, grads)
    got = np.zeros_like(d_whole)
    for c in range(2):
        np.testing.assert_allclose(values[c].numpy(), whole.numpy(), rtol=1e-6)
        got[:, cp.zigzag_positions(seq, 2, c)] = grads[c].numpy()
    np.testing.assert_allclose(got, d_whole, rtol=1e-5, atol=1e-7)
