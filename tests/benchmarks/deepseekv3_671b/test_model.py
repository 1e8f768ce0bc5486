"""Tests of the DeepSeek-V3 model at tiny shapes: parameter counts against a built model, and
multi-head latent attention, sigmoid + bias group-limited routing, the sequence-wise balance
loss and multi-token prediction against NumPy transcriptions of DeepSeek's formulas
(`deepseek-ai/DeepSeek-V3` `inference/model.py` `MLA.forward`, `Gate.forward`,
`precompute_freqs_cis`, `apply_rotary_emb`; arXiv 2412.19437 eqs. 17-23) written here."""

import dataclasses
import math

import keras
import numpy as np
import pytest
import tensorflow as tf

from benchmarks.deepseekv3_671b import config as config_lib
from benchmarks.deepseekv3_671b import model as model_lib
from mlperf_tf.config import ConfigError
from mlperf_tf.layers import moe
from mlperf_tf.lm.mla import MultiHeadLatentAttention, yarn_mscale
from mlperf_tf.lm.rope import RotaryEmbedding
from tests.numerics import assert_close


def _model(config=None, seed=0):
    keras.utils.set_random_seed(seed)
    return model_lib.build_model(config or config_lib.tiny())


def _count(model) -> int:
    return sum(int(np.prod(v.shape)) for v in model.weights)


# ---- NumPy transcriptions of DeepSeek's inference/model.py --------------------------------------


def _rms(x, w, eps):
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w


def _freqs_cis(dim, seqlen, *, base, factor, original, beta_fast=32, beta_slow=1):
    """`precompute_freqs_cis` (YaRN when seqlen > original, as DeepSeek's code decides; the
    training run always scales, so the test passes its seqlen as the table's length)."""
    freqs = 1.0 / base ** (np.arange(0, dim, 2, dtype=np.float64) / dim)
    if factor > 1:

        def corr(rot):
            return dim * math.log(original / (rot * 2 * math.pi)) / (2 * math.log(base))

        low = max(math.floor(corr(beta_fast)), 0)
        high = min(math.ceil(corr(beta_slow)), dim - 1)
        if low == high:
            high += 0.001
        ramp = np.clip((np.arange(dim // 2) - low) / (high - low), 0, 1)
        smooth = 1 - ramp
        freqs = freqs / factor * (1 - smooth) + freqs * smooth
    return np.exp(1j * np.outer(np.arange(seqlen), freqs))  # [seq, dim/2] complex


def _rotary(x, freqs_cis):
    """`apply_rotary_emb`: adjacent pairs (2i, 2i+1) as complex numbers, x [b, s, h, d]."""
    z = x[..., 0::2] + 1j * x[..., 1::2]
    z = z * freqs_cis[None, :, None, :]
    out = np.empty_like(x)
    out[..., 0::2], out[..., 1::2] = z.real, z.imag
    return out


def _mla_reference(x, w, *, heads, nope, rope, v_dim, kv_lora, eps, freqs, softmax_scale):
    """`MLA.forward`, "naive" path, one call from position 0, causal mask; weights [in, out]."""
    b, s, _ = x.shape
    q = _rms(x @ w["q_a"], w["q_norm"], eps) @ w["q_b"]
    q = q.reshape(b, s, heads, nope + rope)
    q_nope, q_pe = q[..., :nope], _rotary(q[..., nope:], freqs)
    kv = x @ w["kv_a"]
    kv, k_pe = kv[..., :kv_lora], _rotary(kv[..., kv_lora:][:, :, None, :], freqs)
    q = np.concatenate([q_nope, q_pe], -1)
    kv = (_rms(kv, w["kv_norm"], eps) @ w["kv_b"]).reshape(b, s, heads, nope + v_dim)
    k_nope, v = kv[..., :nope], kv[..., nope:]
    k = np.concatenate([k_nope, np.broadcast_to(k_pe, (b, s, heads, rope))], -1)
    scores = np.einsum("bshd,bthd->bsht", q, k) * softmax_scale
    mask = np.triu(np.full((s, s), -np.inf), 1)
    scores = scores + mask[None, :, None, :]
    scores = np.exp(scores - scores.max(-1, keepdims=True))
    scores /= scores.sum(-1, keepdims=True)
    out = np.einsum("bsht,bthd->bshd", scores, v).reshape(b, s, heads * v_dim)
    return out @ w["o"]


def _gate_reference(x, weight, bias, *, topk, n_groups, topk_groups, route_scale):
    """`Gate.forward` with score_func "sigmoid" and a bias; weight [dim, E]."""
    scores = 1 / (1 + np.exp(-(x @ weight)))
    original = scores
    scores = scores + bias
    t = x.shape[0]
    grouped = scores.reshape(t, n_groups, -1)
    group_scores = np.sort(grouped, axis=-1)[..., -2:].sum(-1)
    keep = np.argsort(-group_scores, axis=-1, kind="stable")[:, :topk_groups]
    mask = np.ones((t, n_groups), bool)
    np.put_along_axis(mask, keep, False, axis=1)
    grouped = np.where(mask[..., None], -np.inf, grouped)
    indices = np.argsort(-grouped.reshape(t, -1), axis=-1, kind="stable")[:, :topk]
    weights = np.take_along_axis(original, indices, axis=1)
    weights = weights / weights.sum(-1, keepdims=True) * route_scale
    return weights, indices


# ---- sizes --------------------------------------------------------------------------------------


def test_parameter_counts_from_the_config_equal_the_built_model():
    config = config_lib.tiny()
    model = _model(config)
    assert config.parameter_count() == _count(model)
    m = config.moe
    per_expert = 3 * config.hidden_size * m.filter_size
    moe_layers = len(model.moe_layers)
    assert moe_layers == config.num_hidden_layers - m.first_dense + config.mtp_layers == 3
    # Active: everything but the idle experts and the non-trainable selection biases.
    idle = moe_layers * ((m.num_experts - m.top_k) * per_expert + m.num_experts)
    assert config.active_parameter_count() == _count(model) - idle
    mtp = sum(_count(module) for module in model.mtp)
    assert config.mtp_parameters() == mtp


def test_the_mlperf_model_is_671b_and_37b_active():
    config = config_lib.deepseek_v3_671b()
    total, active = config.parameter_count(), config.active_parameter_count()
    main = total - config.mtp_parameters()
    # DeepSeek's 671B (its vocabulary, 129,280) less the 1,024 rows fewer of embedding and head.
    deepseek_vocab = dataclasses.replace(config, vocab_size=129_280, mtp_layers=0)
    assert 670e9 < deepseek_vocab.parameter_count() < 672e9
    assert deepseek_vocab.parameter_count() - main == 2 * 1024 * 7168
    assert 11e9 < config.mtp_parameters() < 12e9
    assert 36e9 < active - (config.mtp_parameters() - 11.3e9) < 39e9 and active < 39e9
    assert config.attention_parameters() == 187_107_328  # per layer, incl. the latent norms


# ---- numerics -----------------------------------------------------------------------------------


@pytest.mark.numerics
def test_mla_equals_a_numpy_transcription_of_deepseeks_mla_forward():
    config = dataclasses.replace(config_lib.tiny(), rope_scaling_factor=40.0)
    keras.utils.set_random_seed(3)
    layer = MultiHeadLatentAttention.from_config(config)
    layer.build((None, None, config.hidden_size))
    rng = np.random.default_rng(0)
    for v in layer.weights:  # larger than the init so the softmax is far from uniform
        v.assign(rng.normal(0, 0.3, v.shape).astype(np.float32) + (1 if "norm" in v.path else 0))
    b, s = 2, 12
    x = rng.normal(0, 1, (b, s, config.hidden_size)).astype(np.float32)
    rotary = RotaryEmbedding.from_config(config)
    cos, sin = rotary.tables(s)
    got = layer(tf.constant(x), cos, sin).numpy()
    w = {
        "q_a": layer.q_a_proj.kernel.numpy(), "q_norm": layer.q_a_layernorm.scale.numpy(),
        "q_b": layer.q_b_proj.kernel.numpy(), "kv_a": layer.kv_a_proj_with_mqa.kernel.numpy(),
        "kv_norm": layer.kv_a_layernorm.scale.numpy(), "kv_b": layer.kv_b_proj.kernel.numpy(),
        "o": layer.o_proj.kernel.numpy(),
    }  # fmt: skip
    w = {k: v.astype(np.float64) for k, v in w.items()}
    mscale = 0.1 * math.log(40.0) + 1.0
    freqs = _freqs_cis(
        config.qk_rope_head_dim, s, base=config.rope_theta, factor=40.0,
        original=config.rope_original_max_position,
    )  # fmt: skip
    want = _mla_reference(
        x.astype(np.float64), w, heads=config.num_attention_heads, nope=config.qk_nope_head_dim,
        rope=config.qk_rope_head_dim, v_dim=config.v_head_dim, kv_lora=config.kv_lora_rank,
        eps=config.rms_norm_eps, freqs=freqs,
        softmax_scale=(config.qk_nope_head_dim + config.qk_rope_head_dim) ** -0.5 * mscale**2,
    )  # fmt: skip
    assert yarn_mscale("yarn", 40.0) == pytest.approx(mscale)
    assert_close(got, want, rtol=2e-5)
    # The temperature matters here (a different scale would miss): the test can fail.
    wrong = _mla_reference(
        x.astype(np.float64), w, heads=config.num_attention_heads, nope=config.qk_nope_head_dim,
        rope=config.qk_rope_head_dim, v_dim=config.v_head_dim, kv_lora=config.kv_lora_rank,
        eps=config.rms_norm_eps, freqs=freqs,
        softmax_scale=(config.qk_nope_head_dim + config.qk_rope_head_dim) ** -0.5,
    )  # fmt: skip
    assert np.max(np.abs(wrong - want)) > 1e-3


@pytest.mark.numerics
@pytest.mark.parametrize("groups, topk_groups, top_k", [(4, 2, 2), (8, 4, 8), (1, 1, 3)])
def test_group_limited_sigmoid_routing_equals_deepseeks_gate(groups, topk_groups, top_k):
    rng = np.random.default_rng(groups + top_k)
    t, d, e = 64, 16, 32
    x = rng.normal(0, 1, (t, d))
    weight = rng.normal(0, 0.5, (d, e))
    bias = rng.normal(0, 0.3, e)
    routing = moe.route(
        tf.constant(x @ weight, tf.float32), top_k=top_k, capacity=t, router_softmax="sigmoid",
        bias=tf.constant(bias, tf.float32), num_groups=groups, topk_groups=topk_groups,
        routed_scaling=2.5,
    )  # fmt: skip
    weights, indices = _gate_reference(
        x, weight, bias, topk=top_k, n_groups=groups, topk_groups=topk_groups, route_scale=2.5
    )
    np.testing.assert_array_equal(np.sort(routing.expert.numpy(), -1), np.sort(indices, -1))
    order = np.argsort(routing.expert.numpy(), -1)
    got = np.take_along_axis(routing.gates.numpy(), order, -1)
    want = np.take_along_axis(weights, np.argsort(indices, -1), -1)
    assert_close(got, want, rtol=1e-5)
    if groups > 1:  # the group limit changed some choice (else this would not test it)
        _, free = _gate_reference(
            x, weight, bias, topk=top_k, n_groups=1, topk_groups=1, route_scale=2.5
        )
        assert (np.sort(free, -1) != np.sort(indices, -1)).any()


@pytest.mark.numerics
def test_sequence_balance_loss_is_the_papers_eqs_17_to_20():
    rng = np.random.default_rng(5)
    b, s, e, k = 3, 10, 8, 2
    scores = 1 / (1 + np.exp(-rng.normal(0, 1, (b * s, e))))
    expert = np.argsort(-scores, -1)[:, :k]
    probs = scores / scores.sum(-1, keepdims=True)
    got = float(moe.sequence_balance_loss(tf.constant(probs, tf.float32), tf.constant(expert), s))
    want = []
    for i in range(b):
        rows = slice(i * s, (i + 1) * s)
        f = np.zeros(e)
        for row in expert[rows]:
            f[row] += 1
        f *= e / (k * s)  # eq. 18
        p = probs[rows].mean(0)  # eqs. 19-20
        want.append(np.sum(f * p))  # eq. 17 without alpha
    assert got == pytest.approx(np.mean(want), rel=1e-5)


@pytest.mark.numerics
def test_mtp_depth_equals_the_papers_eqs_21_to_23():
    config = config_lib.tiny()
    model = _model(config, seed=4)
    tokens = np.random.default_rng(1).integers(0, config.vocab_size, (2, 9)).astype(np.int32)
    main, (mtp,) = model.with_mtp(tf.constant(tokens))
    assert_close(main, model(tf.constant(tokens)), rtol=1e-6)
    module = model.mtp[0]
    eps = config.rms_norm_eps
    states = model.hidden_states(tf.constant(tokens)).numpy().astype(np.float64)
    emb = model.token_embedding.embeddings.numpy().astype(np.float64)
    shifted = np.concatenate([tokens[:, 1:], np.zeros((2, 1), np.int32)], 1)  # t_{i+1}
    h_in = np.concatenate(
        [_rms(emb[shifted], module.enorm.scale.numpy(), eps),
         _rms(states, module.hnorm.scale.numpy(), eps)], -1,
    ) @ module.eh_proj.kernel.numpy()  # fmt: skip
    cos, sin = model.rotary_tables(9)
    block_out = module.block(tf.constant(h_in, tf.float32), cos, sin).numpy()
    head = model.lm_head.kernel.numpy()
    want = _rms(block_out, module.shared_head_norm.scale.numpy(), eps) @ head
    assert_close(mtp, want, rtol=1e-5)


# ---- bad input ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "changes, match",
    [
        ({"num_groups": 4, "topk_groups": 5}, "topk_groups"),
        ({"top_k": 9}, "top_k"),
        ({"num_groups": 3}, "num_groups"),
    ],
)
def test_bad_routing_settings_are_one_line_errors(changes, match):
    with pytest.raises(ConfigError, match=match) as e:
        dataclasses.replace(config_lib.REFERENCE_MOE, **{"num_experts": 8, "top_k": 2, **changes})
    assert "\n" not in str(e.value)
