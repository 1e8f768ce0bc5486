"""Tests of `mlperf_tf.layers.moe` against a NumPy transcription of Flaxformer's router."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from mlperf_tf.config import ConfigError
from mlperf_tf.layers import moe
from tests.mlperf_tf.layers import moe_reference as ref
from tests.numerics import assert_close

pytestmark = pytest.mark.numerics

D, F, E, T = 8, 16, 4, 24


def _layer(**kwargs):
    settings = dict(hidden_size=D, filter_size=F, num_experts=E, top_k=2, capacity_factor=1.0)
    settings.update(kwargs)
    layer = moe.MoEFeedForward(**settings)
    layer.build((None, D))
    rng = np.random.default_rng(3)
    # Router logits of order 1, so that top-k choices are well separated from ties.
    layer.router_kernel.assign(rng.normal(0, 0.7, (D, E)).astype(np.float32))
    if layer.expert_mlp == "relu":
        layer.b_in.assign(rng.normal(0, 0.1, layer.b_in.shape).astype(np.float32))
        layer.b_out.assign(rng.normal(0, 0.1, layer.b_out.shape).astype(np.float32))
    return layer


def _weights(layer):
    return [np.asarray(w) for w in (layer.router_kernel, *layer.expert_weights)]


def _tokens(seed=0):
    return np.random.default_rng(seed).normal(size=(T, D)).astype(np.float32)


@pytest.mark.parametrize(
    "top_k, capacity_factor, router_softmax",
    [
        (1, 1.0, "before"),  # overflow past capacity (Switch)
        (2, 1.0, "before"),  # overflow, second choices dropped first
        (2, 1.25, "after"),
        (2, 0.5, "after"),  # heavy overflow: first choices dropped too
        (4, 1.0, "before"),  # k = E
        (2, 0.0, "before"),  # dropless
    ],
)
def test_routing_losses_and_outputs_match_the_reference(top_k, capacity_factor, router_softmax):
    layer = _layer(top_k=top_k, capacity_factor=capacity_factor, router_softmax=router_softmax)
    x = _tokens()
    capacity = moe.expert_capacity(T, num_experts=E, top_k=top_k, capacity_factor=capacity_factor)
    y, stats = layer(tf.constant(x), training=True)
    routing = moe.route(
        layer.router_logits(tf.constant(x), training=False),
        top_k=top_k,
        capacity=capacity,
        router_softmax=router_softmax,
    )
    dispatch, combine = moe.dispatch_and_combine(routing, E, capacity)
    want_y, want_dispatch, want_combine, want_balance, want_z = ref.moe_layer(
        x, *_weights(layer), top_k=top_k, capacity=capacity, router_softmax=router_softmax
    )
    np.testing.assert_array_equal(dispatch.numpy(), want_dispatch)
    assert_close(combine.numpy(), want_combine, rtol=1e-5)
    assert_close(stats.balance_loss.numpy(), want_balance, rtol=1e-5)
    assert_close(stats.z_loss.numpy(), want_z, rtol=1e-5)
    assert_close(y.numpy(), want_y, rtol=1e-5)
    dropped = 1.0 - want_dispatch.sum() / (T * top_k)
    assert_close(stats.dropped.numpy(), dropped, rtol=1e-6)
    if capacity_factor == 0.0:
        assert stats.dropped.numpy() == 0.0
    if capacity_factor == 1.0 and top_k < E:
        assert stats.dropped.numpy() > 0  # the case really overflows


@pytest.mark.parametrize(
    "top_k, capacity_factor, router_softmax",
    [(2, 1.0, "after"), (2, 0.0, "after"), (1, 1.0, "before")],  # Mixtral's routing first
)
def test_swiglu_experts_match_the_reference(top_k, capacity_factor, router_softmax):
    """SwiGLU experts (Mixtral's expert MLP, Llama's feed-forward form) behind the same router."""
    layer = _layer(
        top_k=top_k, capacity_factor=capacity_factor, router_softmax=router_softmax,
        expert_mlp="swiglu",
    )  # fmt: skip
    assert [w.name for w in layer.expert_weights] == ["w_gate", "w_up", "w_down"]
    x = _tokens(1)
    capacity = moe.expert_capacity(T, num_experts=E, top_k=top_k, capacity_factor=capacity_factor)
    y, stats = layer(tf.constant(x), training=True)
    want_y, want_dispatch, _, want_balance, want_z = ref.moe_layer(
        x, *_weights(layer), top_k=top_k, capacity=capacity, router_softmax=router_softmax,
        expert_mlp="swiglu",
    )  # fmt: skip
    assert_close(y.numpy(), want_y, rtol=1e-5)
    assert_close(stats.balance_loss.numpy(), want_balance, rtol=1e-5)
    assert_close(stats.z_loss.numpy(), want_z, rtol=1e-5)
    assert_close(stats.dropped.numpy(), 1.0 - want_dispatch.sum() / (T * top_k), rtol=1e-6)
    if capacity_factor == 1.0:
        assert stats.dropped.numpy() > 0  # overflow really happens


def test_layer_parameters_count_the_built_layer():
    for expert_mlp in ("relu", "swiglu"):
        config = moe.MoEConfig(num_experts=E, filter_size=F)
        layer = config.layer(hidden_size=D, filter_size=99, expert_mlp=expert_mlp)
        layer.build((None, D))
        assert layer.count_params() == config.layer_parameters(
            hidden_size=D, filter_size=99, expert_mlp=expert_mlp
        )


def test_capacity_follows_the_factor():
    assert moe.expert_capacity(24, num_experts=4, top_k=2, capacity_factor=1.0) == 12
    assert moe.expert_capacity(24, num_experts=4, top_k=2, capacity_factor=1.25) == 15
    assert moe.expert_capacity(24, num_experts=4, top_k=1, capacity_factor=0.0) == 24
    assert moe.expert_capacity(24, num_experts=4, top_k=4, capacity_factor=2.0) == 24  # <= T
    got = moe.expert_capacity(tf.constant(24), num_experts=4, top_k=2, capacity_factor=1.25)
    assert int(got) == 15


def test_a_router_that_picks_one_expert_drops_past_capacity_and_passes_the_residual():
    layer = _layer(top_k=1, capacity_factor=1.0)
    kernel = np.zeros((D, E), np.float32)
    layer.router_kernel.assign(kernel)  # every logit 0: ties go to expert 0
    x = _tokens()
    y, stats = layer(tf.constant(x), training=True)
    capacity = T // E
    assert_close(stats.dropped.numpy(), 1.0 - capacity / T, rtol=1e-6)
    assert_close(stats.load.numpy(), [1.0, 0.0, 0.0, 0.0], rtol=1e-6)
    # The first `capacity` tokens are served, the rest get 0 (the residual passes unchanged).
    assert np.all(y.numpy()[capacity:] == 0.0)
    assert np.any(y.numpy()[:capacity] != 0.0)
    assert_close(stats.balance_loss.numpy(), E * 1.0 * (1.0 / E) * E / E, rtol=1e-6)


def test_gradients_reach_the_router_and_the_experts():
    layer = _layer(top_k=2, capacity_factor=1.0)
    x = tf.constant(_tokens())
    with tf.GradientTape() as tape:
        y, stats = layer(x, training=True)
        loss = tf.reduce_sum(y**2) + layer.aux_loss(stats)
    grads = tape.gradient(loss, layer.trainable_variables)
    assert all(g is not None and np.any(np.asarray(g) != 0) for g in grads)


def test_aux_loss_weights_the_two_losses():
    layer = _layer(z_loss_coef=0.5, balance_loss_coef=0.25)
    _, stats = layer(tf.constant(_tokens()), training=True)
    want = 0.25 * stats.balance_loss.numpy() + 0.5 * stats.z_loss.numpy()
    assert_close(layer.aux_loss(stats).numpy(), want, rtol=1e-6)


def test_router_runs_in_float32_under_mixed_precision():
    layer = _layer(dtype="mixed_float16")
    assert layer.router_kernel.dtype == "float32"
    x = tf.constant(_tokens(), tf.float16)
    assert layer.router_logits(x, training=False).dtype == tf.float32
    y, stats = layer(x, training=True)
    assert y.dtype == tf.float16 and stats.z_loss.dtype == tf.float32


def test_jitter_changes_the_router_input_only_in_training():
    layer = _layer(jitter=0.5, seed=1)
    x = tf.constant(_tokens())
    plain = layer.router_logits(x, training=False).numpy()
    assert_close(layer.router_logits(x, training=False).numpy(), plain, rtol=1e-7)
    assert not np.allclose(layer.router_logits(x, training=True).numpy(), plain)


def test_packed_and_3d_inputs_agree():
    layer = _layer()
    x = _tokens()
    flat, _ = layer(tf.constant(x), training=False)
    batched, _ = layer(tf.constant(x.reshape(4, T // 4, D)), training=False)
    assert_close(batched.numpy().reshape(T, D), flat.numpy(), rtol=1e-6)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(top_k=5), "top_k"),
        (dict(capacity_factor=-1.0), "capacity_factor"),
        (dict(eval_capacity_factor=-0.5), "eval_capacity_factor"),
        (dict(router_softmax="sideways"), "router_softmax"),
        (dict(expert_parallel=3), "--expert_parallel=3"),
        (dict(num_experts=0), "num_experts"),
    ],
)
def test_bad_settings_are_one_line_errors(kwargs, message):
    with pytest.raises(ConfigError, match=message) as error:
        _layer(**kwargs)
    assert "\n" not in str(error.value)


def _deepseek_v3_reference(logits, bias, top_k):
    """Hugging Face `DeepseekV3TopkRouter` without expert groups (n_group = topk_group = 1),
    `norm_topk_prob=True`, scaling factor 1, one token at a time: the choice ranks
    sigmoid(logits) + bias, the weights are the chosen sigmoid scores, normalized."""
    experts, gates = [], []
    for row in logits.astype(np.float64):
        scores = 1 / (1 + np.exp(-row))
        chosen = np.argsort(-(scores + bias), kind="stable")[:top_k]
        experts.append(chosen)
        gates.append(scores[chosen] / scores[chosen].sum())
    return np.array(experts), np.array(gates)


@pytest.mark.parametrize("use_bias", [False, True])
def test_sigmoid_routing_with_a_bias_is_deepseek_v3s(use_bias):
    rng = np.random.default_rng(11)
    logits = rng.normal(0, 1.0, (T, E)).astype(np.float32)
    bias = rng.normal(0, 0.5, E).astype(np.float32) if use_bias else np.zeros(E, np.float32)
    routing = moe.route(
        tf.constant(logits), top_k=2, capacity=T, router_softmax="sigmoid",
        bias=tf.constant(bias) if use_bias else None,
    )  # fmt: skip
    experts, gates = _deepseek_v3_reference(logits, bias, 2)
    np.testing.assert_array_equal(routing.expert.numpy(), experts)
    assert_close(routing.gates, gates, rtol=1e-6)
    assert_close(np.sum(routing.probs.numpy(), axis=1), np.ones(T), rtol=1e-6)
    if use_bias:  # the bias moved some choice (else this test would not test it)
        plain, _ = _deepseek_v3_reference(logits, np.zeros(E), 2)
        assert (plain != experts).any()


def test_sigmoid_layer_keeps_a_non_trainable_bias_and_the_balancing_step():
    layer = _layer(router_softmax="sigmoid", capacity_factor=0)
    assert not layer.router_bias.trainable
    assert layer.router_bias.path.endswith("router_bias")
    x = tf.constant(_tokens(4))
    y, stats = layer(x, training=True)
    # A large bias on expert 3 makes it every token's choice.
    layer.router_bias.assign([0.0, 0.0, 0.0, 10.0])
    _, biased = layer(x, training=True)
    assert float(biased.load[3]) == pytest.approx(0.5)  # one of each token's two choices
    assert float(stats.load[3]) < 0.5
    # DeepSeek-V3's update: overloaded experts' biases fall, underloaded ones rise, by the rate.
    new = moe.aux_free_bias_update(tf.zeros(E), tf.constant([0.4, 0.1, 0.25, 0.25]), 1e-3)
    assert_close(new, [-1e-3, 1e-3, 0.0, 0.0], rtol=1e-6, scale=1e-3)
    with pytest.raises(ValueError, match="sigmoid"):
        moe.route(tf.zeros([2, E]), top_k=1, capacity=2, bias=tf.zeros(E))
    with pytest.raises(ConfigError, match="'sigmoid'"):
        moe.MoEConfig(num_experts=4, router_softmax="softmax")
    assert np.all(np.isfinite(y.numpy()))
