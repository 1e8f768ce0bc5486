"""Provides the GPT-OSS decoder as the MLPerf reference trains it, in Keras 3.

Megatron's GPT model with the reference's options (README.md of this package): pre-norm blocks
`x + attention(norm(x))`, `x + moe(norm(x))`, a final RMSNorm and an output projection untied
from the input embedding. Attention is grouped-query, bias-free, with a per-head RMSNorm of
queries and keys before plain RoPE (Megatron's `qk_layernorm`; "rotate half" pairs (i, i + d/2),
`rotary_interleaved` false), no sinks, and on the layers `ModelConfig.layer_window` names a
sliding window (a query sees itself and the `sliding_window - 1` tokens before it). Every
feed-forward block is a dropless mixture of bias-free SwiGLU experts (`mlperf_tf.layers.moe`,
top-k then softmax). Norms, the softmax and the router compute in float32 under a mixed policy.

Initialization is Megatron's: every weight normal with `initializer_range` (0.008), the
attention output and the experts' down projections with `initializer_range / sqrt(2 layers)`
(`output_layer_init_method`, the scaled default).
"""

from __future__ import annotations

import math

import keras
import numpy as np
import tensorflow as tf

from benchmarks.gpt_oss_20b.config import ModelConfig
from mlperf_tf.layers import moe as moe_lib
from mlperf_tf.parallel import current_mesh

# Logit of masked attention positions, added to float32 scores.
NEG_INF = -1e9


def rope_tables(seq: int, head_dim: int, theta: float) -> tuple[tf.Tensor, tf.Tensor]:
    """(cos, sin) float32 [seq, head_dim] of plain RoPE, frequencies repeated over both halves."""
    inv = 1.0 / theta ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
    angles = np.arange(seq, dtype=np.float64)[:, None] * inv[None, :]
    angles = np.concatenate([angles, angles], axis=-1)
    return tf.constant(np.cos(angles), tf.float32), tf.constant(np.sin(angles), tf.float32)


def apply_rope(x: tf.Tensor, cos: tf.Tensor, sin: tf.Tensor) -> tf.Tensor:
    """Rotates x [batch, seq, heads, d] by position: x cos + rotate_half(x) sin (float32)."""
    dtype = x.dtype
    x = tf.cast(x, tf.float32)
    half = x.shape[-1] // 2
    rotated = tf.concat([-x[..., half:], x[..., :half]], axis=-1)
    return tf.cast(x * cos[:, None, :] + rotated * sin[:, None, :], dtype)


def attention_bias(seq: int, window: int) -> tf.Tensor:
    """float32 [seq, seq] additive mask: 0 where query i may see key j (j <= i, and i - j <
    window when window > 0), NEG_INF elsewhere."""
    i = np.arange(seq)[:, None]
    j = np.arange(seq)[None, :]
    allowed = j <= i
    if window:
        allowed &= i - j < window
    return tf.constant(np.where(allowed, 0.0, NEG_INF), tf.float32)


class RMSNorm(keras.layers.Layer):
    """x / sqrt(mean(x^2) + eps) * scale over the last axis, in float32."""

    def __init__(self, epsilon: float, **kwargs):
        super().__init__(**kwargs)
        self.epsilon = epsilon

    def build(self, input_shape):
        self.scale = self.add_weight(name="scale", shape=(input_shape[-1],), initializer="ones")

    def call(self, x):
        x = tf.cast(x, tf.float32)
        x = x * tf.math.rsqrt(tf.reduce_mean(tf.square(x), axis=-1, keepdims=True) + self.epsilon)
        return tf.cast(x * tf.cast(self.scale, tf.float32), self.compute_dtype)


def _dense(units: int, std: float, name: str) -> keras.layers.Dense:
    return keras.layers.Dense(
        units,
        use_bias=False,
        kernel_initializer=keras.initializers.RandomNormal(stddev=std),
        name=name,
    )


class Attention(keras.layers.Layer):
    """Grouped-query self-attention with QK-norm, RoPE and an optional sliding window."""

    def __init__(self, config: ModelConfig, *, window: int, **kwargs):
        super().__init__(**kwargs)
        c = config
        self.config = c
        self.window = window
        std, out_std = c.initializer_range, c.initializer_range / math.sqrt(2 * c.num_hidden_layers)
        self.q_proj = _dense(c.num_attention_heads * c.head_dim, std, "q_proj")
        self.k_proj = _dense(c.num_key_value_heads * c.head_dim, std, "k_proj")
        self.v_proj = _dense(c.num_key_value_heads * c.head_dim, std, "v_proj")
        self.o_proj = _dense(c.hidden_size, out_std, "o_proj")
        if c.qk_norm:
            self.q_norm = RMSNorm(c.rms_norm_eps, name="q_norm")
            self.k_norm = RMSNorm(c.rms_norm_eps, name="k_norm")

    def call(self, x, cos, sin):
        c = self.config
        batch, seq = tf.shape(x)[0], x.shape[1]
        kv, group, d = (
            c.num_key_value_heads,
            c.num_attention_heads // c.num_key_value_heads,
            c.head_dim,
        )
        q = tf.reshape(self.q_proj(x), [batch, seq, c.num_attention_heads, d])
        k = tf.reshape(self.k_proj(x), [batch, seq, kv, d])
        v = tf.reshape(self.v_proj(x), [batch, seq, kv, d])
        if c.qk_norm:  # Megatron: q/k layernorm before the rotary embedding
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        q = tf.reshape(q, [batch, seq, kv, group, d])  # query heads grouped by their kv head
        scores = tf.einsum("bqhgd,bkhd->bhgqk", q, k)  # [batch, kv, group, seq, seq]
        scores = tf.cast(scores, tf.float32) / math.sqrt(d) + attention_bias(seq, self.window)
        probs = tf.cast(tf.nn.softmax(scores, axis=-1), v.dtype)
        context = tf.einsum("bhgqk,bkhd->bqhgd", probs, v)
        return self.o_proj(tf.reshape(context, [batch, seq, c.num_attention_heads * d]))


class DecoderLayer(keras.layers.Layer):
    """`x + attention(norm(x))`, then `x + moe(norm(x))`."""

    def __init__(self, config: ModelConfig, *, index: int, group_size, sorted_dispatch, **kwargs):
        super().__init__(**kwargs)
        c = config
        self.input_norm = RMSNorm(c.rms_norm_eps, name="input_norm")
        self.attention = Attention(c, window=c.layer_window(index), name="attention")
        self.post_attention_norm = RMSNorm(c.rms_norm_eps, name="post_attention_norm")
        mesh = current_mesh()
        expert_parallel = mesh.expert if mesh is not None else 1
        std, out_std = c.initializer_range, c.initializer_range / math.sqrt(2 * c.num_hidden_layers)
        layer_class = moe_lib.SortedMoEFeedForward if sorted_dispatch else moe_lib.MoEFeedForward
        m = c.moe
        self.moe = layer_class(
            hidden_size=c.hidden_size, filter_size=m.filter_size or c.intermediate_size,
            num_experts=m.num_experts, top_k=m.top_k, capacity_factor=m.capacity_factor,
            eval_capacity_factor=m.eval_capacity_factor, router_softmax=m.router_softmax,
            z_loss_coef=m.z_loss_coef, balance_loss_coef=m.balance_loss_coef, jitter=m.jitter,
            group_size=group_size if expert_parallel > 1 else None,
            expert_parallel=expert_parallel, mesh=mesh if expert_parallel > 1 else None,
            expert_mlp="swiglu", kernel_initializer=keras.initializers.RandomNormal(stddev=std),
            output_initializer=keras.initializers.RandomNormal(stddev=out_std), name="moe",
        )  # fmt: skip

    def call(self, x, cos, sin, training=False, aux=None):
        x = x + self.attention(self.input_norm(x), cos, sin)
        y, stats = self.moe(self.post_attention_norm(x), training=training)
        if aux is not None:
            aux.add(self.moe, stats)
        return x + tf.cast(y, x.dtype)


class GptOssModel(keras.Model):
    """Token ids [batch, seq] -> logits [batch, seq, vocab] (compute dtype)."""

    def __init__(self, config: ModelConfig, *, group_size=None, sorted_dispatch=True, **kwargs):
        super().__init__(**kwargs)
        c = config
        self.config = c
        std = c.initializer_range
        self.embed = keras.layers.Embedding(
            c.vocab_size, c.hidden_size,
            embeddings_initializer=keras.initializers.RandomNormal(stddev=std), name="embed",
        )  # fmt: skip
        self.decoder_layers = [
            DecoderLayer(c, index=i, group_size=group_size, sorted_dispatch=sorted_dispatch,
                         name=f"layer_{i}")
            for i in range(c.num_hidden_layers)
        ]  # fmt: skip
        self.final_norm = RMSNorm(c.rms_norm_eps, name="final_norm")
        self.lm_head = _dense(c.vocab_size, std, "lm_head")

    @property
    def moe_layers(self) -> list:
        return [layer.moe for layer in self.decoder_layers]

    def call(self, token_ids, training=False, aux=None):
        seq = token_ids.shape[1]
        cos, sin = rope_tables(seq, self.config.head_dim, self.config.rope_theta)
        x = self.embed(token_ids)
        for layer in self.decoder_layers:
            x = layer(x, cos, sin, training=training, aux=aux)
        return self.lm_head(self.final_norm(x))


def build_model(
    config: ModelConfig, *, seq_length: int = 2, group_size=None, sorted_dispatch: bool = True
) -> GptOssModel:
    """A built `GptOssModel` (weights made by one call on [1, seq_length] zeros)."""
    model = GptOssModel(config, group_size=group_size, sorted_dispatch=sorted_dispatch)
    model(tf.zeros([1, min(seq_length, 8)], tf.int32))
    return model
