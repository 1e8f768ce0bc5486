"""Tests of the assembled decoder (`mlperf_tf.lm.DecoderModel`): per-layer sliding windows against
keras-hub's `MistralBackbone` with the same weights, Megatron's window pattern, tied embeddings,
the clamped SwiGLU against keras-hub's `GptOssExperts`, top-k-then-softmax routing against
keras-hub's `GptOssTopKRouter`, and parameter counts from the config for every option."""

import dataclasses

import keras
import numpy as np
import pytest
import tensorflow as tf

from mlperf_tf.layers import moe
from mlperf_tf.layers.moe import MoEConfig
from mlperf_tf.lm import DecoderConfig, FeedForward, build_decoder, clamped_swiglu
from tests.keras_hub_weights import copy_decoder_into
from tests.numerics import assert_close

pytestmark = pytest.mark.numerics

TINY = DecoderConfig(
    vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
    num_key_value_heads=2, head_dim=8, intermediate_size=48, rope_theta=10_000.0,
    max_position_embeddings=64,
)  # fmt: skip


def _tokens(batch=2, seq=16, vocab=64, seed=0):
    return tf.constant(np.random.default_rng(seed).integers(0, vocab, (batch, seq)), tf.int32)


def _scales_off_one(model, seed=1):
    rng = np.random.default_rng(seed)
    for v in model.weights:
        if v.path.endswith("/scale"):
            v.assign(rng.uniform(0.5, 1.5, v.shape))


@pytest.mark.peers
def test_sliding_window_model_equals_keras_hub_mistral_backbone():
    """Mistral is Llama with a window on every layer: keras-hub's `MistralBackbone` (window W:
    query i sees keys with i - j < W) with our weights gives our final hidden states."""
    keras_hub = pytest.importorskip("keras_hub")
    window = 5
    config = dataclasses.replace(TINY, sliding_window=window)
    keras.utils.set_random_seed(2)
    ours = build_decoder(config)
    _scales_off_one(ours)
    hub = keras_hub.models.MistralBackbone(
        vocabulary_size=64, num_layers=2, num_query_heads=4, hidden_dim=32, intermediate_dim=48,
        num_key_value_heads=2, rope_max_wavelength=10_000.0, layer_norm_epsilon=1e-5,
        sliding_window=window, dtype="float32",
    )  # fmt: skip
    copy_decoder_into(hub, ours, hidden_size=32, head_dim=8)
    tokens = _tokens(seq=20, seed=3)
    expected = hub({"token_ids": tokens, "padding_mask": tf.ones_like(tokens)})
    assert_close(ours.hidden_states(tokens), expected, rtol=1e-5)
    # The window matters here: without it the states differ.
    full = build_decoder(TINY)
    full.set_weights(ours.get_weights())
    assert np.max(np.abs(full.hidden_states(tokens) - expected)) > 1e-3


def test_layer_windows_follow_megatrons_skip_frequency():
    """Megatron `is_layer_window_attention(window, skip_freq, layer_number)` (1-based): a layer is
    full when its number is a multiple of the int frequency."""
    config = dataclasses.replace(TINY, num_hidden_layers=6, sliding_window=9, window_skip_freq=2)
    assert [config.layer_window(i) for i in range(6)] == [9, 0, 9, 0, 9, 0]
    every3 = dataclasses.replace(config, window_skip_freq=3)
    assert [every3.layer_window(i) for i in range(6)] == [9, 9, 0, 9, 9, 0]
    everywhere = dataclasses.replace(config, window_skip_freq=0)
    assert {everywhere.layer_window(i) for i in range(6)} == {9}
    assert {TINY.layer_window(i) for i in range(2)} == {0}
    listed = dataclasses.replace(config, window_pattern=(0, 1, 1))  # Megatron's list form
    assert [listed.layer_window(i) for i in range(6)] == [0, 9, 9, 0, 9, 9]
    with pytest.raises(ValueError, match="model.window_pattern"):
        dataclasses.replace(config, window_pattern=(2,))
    model = build_decoder(config)
    assert [layer.attention.sliding_window for layer in model.decoder_layers] == [9, 0] * 3


def test_tied_embeddings_project_with_the_embedding_and_count_once():
    tied = dataclasses.replace(TINY, tie_word_embeddings=True)
    keras.utils.set_random_seed(4)
    model = build_decoder(tied)
    assert not hasattr(model, "lm_head")
    assert model.count_params() == tied.parameter_count() == TINY.parameter_count() - 64 * 32
    tokens = _tokens(seed=5)
    states = model.hidden_states(tokens).numpy()
    table = model.token_embedding.embeddings.numpy()
    assert_close(model(tokens), states @ table.T, rtol=1e-5)


@pytest.mark.parametrize(
    "options",
    [
        {},
        {"attention_bias": True, "mlp_bias": True},
        {"qk_norm": True, "attention_sinks": True, "fused_qkv": True},
        {"feed_forward": "swiglu_clamped", "tie_word_embeddings": True},
        {"moe": MoEConfig(num_experts=4, every=1, top_k=2, router_softmax="after")},
        {"moe": MoEConfig(num_experts=4, every=2, top_k=2, router_softmax="sigmoid")},
        {
            "moe": MoEConfig(num_experts=4, every=1, top_k=2, router_softmax="after"),
            "feed_forward": "swiglu_clamped",
            "mlp_bias": True,
        },
    ],
    ids=[
        "plain", "biases", "qknorm_sinks_fused", "clamped_tied", "moe_after", "moe_sigmoid",
        "moe_clamped_biases",
    ],
)  # fmt: skip
def test_parameter_count_from_the_config_equals_the_built_model(options):
    config = dataclasses.replace(TINY, **options)
    model = build_decoder(config)
    assert model.count_params() == config.parameter_count()
    logits = model(_tokens(), training=False, aux=moe.Collector())
    assert logits.shape == (2, 16, 64)
    if config.moe.enabled:
        active = config.active_parameter_count()
        f, k, e = config.intermediate_size, config.moe.top_k, config.moe.num_experts
        moe_layers = config.moe.count(config.num_hidden_layers)
        expert = 3 * 32 * f + ((2 * f + 32) if config.mlp_bias else 0)
        assert config.parameter_count() - active == moe_layers * (e - k) * expert + (
            moe_layers * e if config.moe.router_softmax == "sigmoid" else 0
        )


def test_config_errors_name_the_setting():
    with pytest.raises(ValueError, match="model.rope_type"):
        dataclasses.replace(TINY, rope_type="ntk")
    with pytest.raises(ValueError, match="model.feed_forward"):
        dataclasses.replace(TINY, feed_forward="gelu")
    with pytest.raises(ValueError, match="model.sliding_window"):
        dataclasses.replace(TINY, sliding_window=-1)


@pytest.mark.peers
def test_clamped_swiglu_equals_keras_hub_gpt_oss_experts():
    """One keras-hub GPT-OSS expert (interleaved gate/up columns, biases, alpha 1.702, limit 7)
    against our dense clamped block with the same weights, on inputs large enough to clamp."""
    pytest.importorskip("keras_hub")
    from keras_hub.src.models.gpt_oss.gpt_oss_decoder import GptOssExperts  # noqa: PLC0415

    keras.utils.set_random_seed(6)
    ours = FeedForward(hidden_size=16, intermediate_size=24, stddev=0.5, output_stddev=0.5,
                       use_bias=True, activation="swiglu_clamped")  # fmt: skip
    ours.build((None, None, 16))
    rng = np.random.default_rng(7)
    for proj in (ours.gate_proj, ours.up_proj, ours.down_proj):
        proj.bias.assign(rng.normal(0, 0.5, proj.bias.shape))
    hub = GptOssExperts(num_experts=1, hidden_dim=16, intermediate_dim=24, dtype="float32")
    hub.build(None)
    gate_up = np.zeros((16, 48), np.float32)
    gate_up[:, ::2], gate_up[:, 1::2] = ours.gate_proj.kernel.numpy(), ours.up_proj.kernel.numpy()
    bias = np.zeros(48, np.float32)
    bias[::2], bias[1::2] = ours.gate_proj.bias.numpy(), ours.up_proj.bias.numpy()
    hub.gate_up_proj.assign(gate_up[None])
    hub.gate_up_proj_bias.assign(bias[None])
    hub.down_proj.assign(ours.down_proj.kernel.numpy()[None])
    hub.down_proj_bias.assign(ours.down_proj.bias.numpy()[None])
    x = tf.constant(rng.normal(0, 3.0, (30, 16)), tf.float32)
    gate = ours.gate_proj(x).numpy()
    assert (gate > 7).any() and (np.abs(ours.up_proj(x).numpy()) > 7).any()  # both clamps bind
    assert_close(ours(x), hub(x)[0], rtol=1e-5)


@pytest.mark.peers
def test_clamped_biased_moe_experts_equal_keras_hub_gpt_oss_sparse_moe_block():
    """GPT-OSS's MoE block (`GptOssSparseMoeBlock`: top-k-then-softmax router, clamped SwiGLU
    experts with biases, interleaved gate/up columns) against our dropless `MoEFeedForward` of a
    `DecoderConfig` with `feed_forward="swiglu_clamped"` and `mlp_bias`, the same weights, on
    inputs large enough that both clamps bind; the sorted dispatch gives the same."""
    pytest.importorskip("keras_hub")
    from keras_hub.src.models.gpt_oss.gpt_oss_decoder import GptOssSparseMoeBlock  # noqa: PLC0415

    from mlperf_tf.lm import moe_feed_forward  # noqa: PLC0415

    d, f, e, k = 16, 24, 4, 2
    rng = np.random.default_rng(9)
    x = rng.normal(0, 3.0, (2, 15, d)).astype(np.float32)
    hub = GptOssSparseMoeBlock(hidden_dim=d, intermediate_dim=f, num_experts=e, top_k=k,
                               dtype="float32")  # fmt: skip
    hub.build((None, d))
    for dispatch in ("buffer", "sorted"):
        config = dataclasses.replace(
            TINY, hidden_size=d, intermediate_size=f, feed_forward="swiglu_clamped",
            mlp_bias=True, initializer_range=0.5, scaled_output_init=False,
            moe=MoEConfig(num_experts=e, every=1, top_k=k, router_softmax="after",
                          capacity_factor=0.0, eval_capacity_factor=0.0, dispatch=dispatch),
        )  # fmt: skip
        keras.utils.set_random_seed(10)
        ours = moe_feed_forward(config, group_size=None)
        ours.build((None, None, d))
        assert [w.path.rsplit("/", 1)[-1] for w in ours.expert_weights] == [
            "w_gate", "w_up", "w_down", "b_gate", "b_up", "b_down"
        ]  # fmt: skip
        for w in ours.expert_weights[3:]:
            w.assign(rng.normal(0, 0.5, w.shape))
        w_gate, w_up, w_down, b_gate, b_up, b_down = (w.numpy() for w in ours.expert_weights)
        gate_up = np.zeros((e, d, 2 * f), np.float32)
        gate_up[..., ::2], gate_up[..., 1::2] = w_gate, w_up
        bias = np.zeros((e, 2 * f), np.float32)
        bias[:, ::2], bias[:, 1::2] = b_gate, b_up
        hub.experts.gate_up_proj.assign(gate_up)
        hub.experts.gate_up_proj_bias.assign(bias)
        hub.experts.down_proj.assign(w_down)
        hub.experts.down_proj_bias.assign(b_down)
        hub.router.router_dense.kernel.assign(ours.router_kernel.numpy())
        hub.router.router_dense.bias.assign(np.zeros(e, np.float32))
        gate = np.einsum("td,edf->etf", x.reshape(-1, d), w_gate) + b_gate[:, None]
        up = np.einsum("td,edf->etf", x.reshape(-1, d), w_up) + b_up[:, None]
        assert (gate > 7).any() and (np.abs(up) > 7).any()  # both clamps bind
        y, _ = ours(tf.constant(x))
        expected, _ = hub(x)
        assert_close(y, expected, rtol=1e-5)


def test_clamped_swiglu_formula():
    gate = tf.constant([-9.0, -1.0, 0.5, 8.0])
    up = tf.constant([-8.0, 2.0, 0.3, 9.0])
    g = np.minimum(gate.numpy(), 7.0)
    u = np.clip(up.numpy(), -7.0, 7.0)
    expected = (u + 1) * g / (1 + np.exp(-1.702 * g))
    assert_close(clamped_swiglu(gate, up, limit=7.0, alpha=1.702), expected, rtol=1e-6)


@pytest.mark.peers
def test_top_k_then_softmax_routing_equals_keras_hub_gpt_oss_router():
    pytest.importorskip("keras_hub")
    from keras_hub.src.models.gpt_oss.gpt_oss_decoder import GptOssTopKRouter  # noqa: PLC0415

    rng = np.random.default_rng(8)
    router = GptOssTopKRouter(num_experts=8, top_k=4, dtype="float32")
    router.build((None, 16))
    kernel = rng.normal(size=(16, 8)).astype(np.float32)
    router.router_dense.kernel.assign(kernel)
    x = rng.normal(size=(40, 16)).astype(np.float32)
    routing = moe.route(tf.constant(x @ kernel), top_k=4, capacity=40, router_softmax="after")
    ours = np.zeros((40, 8), np.float32)
    np.put_along_axis(ours, routing.expert.numpy(), routing.gates.numpy(), axis=1)
    assert_close(ours, router(x), rtol=1e-6)


def test_a_fused_projection_refuses_replicated_key_value_heads_in_one_line():
    from mlperf_tf.errors import UserError  # noqa: PLC0415
    from mlperf_tf.parallel import DeviceMesh, use_mesh  # noqa: PLC0415

    fused = dataclasses.replace(TINY, fused_qkv=True)
    with use_mesh(DeviceMesh(model=4)), pytest.raises(UserError, match="fused") as error:
        build_decoder(fused)
    assert "\n" not in str(error.value)
    with use_mesh(DeviceMesh(model=3)), pytest.raises(UserError, match="num_attention_heads"):
        build_decoder(TINY)


def test_whole_experts_scopes_every_moe_layer_for_the_call_and_no_layer_of_a_dense_model():
    """`moe.whole_experts(model)`, the eval scope of the LM benchmarks and the Transformer: each
    MoE layer's `whole_experts()` is entered before the call and left after it."""
    import contextlib
    from unittest import mock

    model = build_decoder(dataclasses.replace(TINY, moe=MoEConfig(num_experts=4, every=1)))
    events = []

    @contextlib.contextmanager
    def scoped(layer):
        events.append(("enter", layer.name))
        yield
        events.append(("exit", layer.name))

    with mock.patch.object(moe.MoEFeedForward, "whole_experts", scoped):
        with moe.whole_experts(model):
            events.append(("call", None))
        with moe.whole_experts(build_decoder(TINY)):  # dense: no layer to scope
            events.append(("dense", None))
    names = [layer.name for layer in model.moe_layers]
    assert len(names) == 2
    assert events == [
        *[("enter", n) for n in names], ("call", None), *[("exit", n) for n in reversed(names)],
        ("dense", None),
    ]  # fmt: skip
