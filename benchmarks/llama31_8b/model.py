"""Provides the Llama 3.1 decoder (RMSNorm, RoPE with Llama 3.1 scaling, GQA, SwiGLU) in Keras 3.

The layout is Meta's Llama 3.1 (Hugging Face `LlamaForCausalLM`, NeMo's `Llama31Config8B`):
pre-norm residual blocks `x + attention(norm(x))`, `x + mlp(norm(x))`, a final RMSNorm and an
output projection untied from the input embedding. Attention and the MLP are separate layers
whose projections (q/k/v/o, gate/up/down) are separate sublayers, so that tensor parallelism can
swap them for column- and row-parallel layers (`mlperf_tf/layers/`). Norms, the softmax and the
loss compute in float32 under a mixed policy, as keras-hub's Llama does.
"""

from __future__ import annotations

import math

import keras
import numpy as np
import tensorflow as tf

from benchmarks.llama31_8b.config import ModelConfig
from mlperf_tf.layers import token_matmul

# Logit of masked (future) attention positions, added to float32 scores.
NEG_INF = -1e9


def rope_inverse_frequencies(
    head_dim: int,
    *,
    theta: float,
    factor: float,
    low_freq_factor: float,
    high_freq_factor: float,
    original_max_position: int,
) -> np.ndarray:
    """The rotary inverse frequencies [head_dim / 2] with Llama 3.1's scaling (float64).

    Plain RoPE is `theta ** (-2i / head_dim)`. Llama 3.1 (Meta's `apply_scaling`, Hugging
    Face's "llama3" rope type) divides the low frequencies (wavelength above
    `original_max_position / low_freq_factor`) by `factor`, keeps the high ones (wavelength
    below `original_max_position / high_freq_factor`), and interpolates between the two with
    `smooth = (original_max_position / wavelength - low) / (high - low)`. `factor` 1 is plain.
    """
    inv = 1.0 / theta ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
    if factor == 1.0:
        return inv
    wavelength = 2 * math.pi / inv
    low_wavelength = original_max_position / low_freq_factor
    high_wavelength = original_max_position / high_freq_factor
    smooth = (original_max_position / wavelength - low_freq_factor) / (
        high_freq_factor - low_freq_factor
    )
    smoothed = (1 - smooth) * inv / factor + smooth * inv
    scaled = np.where(wavelength > low_wavelength, inv / factor, inv)
    medium = (wavelength >= high_wavelength) & (wavelength <= low_wavelength)
    return np.where(medium, smoothed, scaled)


def apply_rope(x: tf.Tensor, cos: tf.Tensor, sin: tf.Tensor) -> tf.Tensor:
    """Rotates `x` [batch, seq, ..., head_dim] by position: x cos + rotate_half(x) sin.

    Pairs are (i, i + head_dim/2), the Hugging Face / keras-hub layout ("rotate half").
    `cos`, `sin` are [seq, head_dim] (each half repeats the frequencies), broadcast over the
    axes between seq and head_dim.
    """
    extra = len(x.shape) - 3  # axes between seq and head_dim
    shape = [cos.shape[0] if cos.shape[0] is not None else -1] + [1] * extra + [cos.shape[-1]]
    cos = tf.reshape(tf.cast(cos, x.dtype), shape)
    sin = tf.reshape(tf.cast(sin, x.dtype), shape)
    x1, x2 = tf.split(x, 2, axis=-1)
    return x * cos + tf.concat([-x2, x1], axis=-1) * sin


class RMSNorm(keras.layers.Layer):
    """RMS normalization x / sqrt(mean(x^2) + eps) * scale, in float32 (Zhang & Sennrich 2019)."""

    def __init__(self, epsilon: float, **kwargs):
        super().__init__(**kwargs)
        self.epsilon = epsilon

    def build(self, input_shape):
        self.scale = self.add_weight(name="scale", shape=(input_shape[-1],), initializer="ones")

    def call(self, x):
        x = tf.cast(x, tf.float32)
        variance = tf.reduce_mean(tf.square(x), axis=-1, keepdims=True)
        x = x * tf.math.rsqrt(variance + self.epsilon)
        return tf.cast(x * tf.cast(self.scale, tf.float32), self.compute_dtype)


class Linear(keras.layers.Layer):
    """A bias-free projection [..., in] -> [..., units] as one 2-D MatMul (`token_matmul`).

    Its kernel is [in, units] (Keras' Dense layout). Tensor parallelism replaces it with a
    column- or row-parallel layer of the same kernel path.
    """

    def __init__(self, units: int, *, stddev: float, **kwargs):
        super().__init__(**kwargs)
        self.units = units
        self.stddev = stddev

    def build(self, input_shape):
        self.kernel = self.add_weight(
            name="kernel",
            shape=(input_shape[-1], self.units),
            initializer=keras.initializers.RandomNormal(stddev=self.stddev),
        )

    def call(self, x):
        return token_matmul(x, tf.cast(self.kernel, self.compute_dtype))


class Attention(keras.layers.Layer):
    """Causal grouped-query self-attention with rotary positions.

    `num_attention_heads` query heads share `num_key_value_heads` key/value heads in groups of
    `num_attention_heads / num_key_value_heads`; the groups are a reshape of the queries
    ([batch, seq, kv_heads, group, head_dim]), so keys and values are never repeated.
    """

    def __init__(self, config: ModelConfig, **kwargs):
        super().__init__(**kwargs)
        self.config = config
        c = config
        std = c.initializer_range
        # Megatron's output-layer init: std / sqrt(2 * layers).
        out_std = std / math.sqrt(2.0 * c.num_hidden_layers)
        self.q_proj = Linear(c.num_attention_heads * c.head_dim, stddev=std, name="q_proj")
        self.k_proj = Linear(c.num_key_value_heads * c.head_dim, stddev=std, name="k_proj")
        self.v_proj = Linear(c.num_key_value_heads * c.head_dim, stddev=std, name="v_proj")
        self.o_proj = Linear(c.hidden_size, stddev=out_std, name="o_proj")

    def call(self, x, cos, sin):
        """x [batch, seq, hidden]; cos, sin [seq, head_dim] -> [batch, seq, hidden]."""
        c = self.config
        kv, d = c.num_key_value_heads, c.head_dim
        group = c.num_attention_heads // kv
        batch, seq = tf.shape(x)[0], tf.shape(x)[1]
        q = tf.reshape(self.q_proj(x), [batch, seq, kv, group, d])
        k = tf.reshape(self.k_proj(x), [batch, seq, kv, d])
        v = tf.reshape(self.v_proj(x), [batch, seq, kv, d])
        q = apply_rope(q, cos, sin)
        k = apply_rope(k, cos, sin)
        q = tf.transpose(q, [0, 2, 3, 1, 4])  # [batch, kv, group, seq, d]
        k = tf.transpose(k, [0, 2, 3, 1])  # [batch, kv, d, seq]
        v = tf.transpose(v, [0, 2, 1, 3])  # [batch, kv, seq, d]
        q = tf.reshape(q, [batch, kv, group * seq, d]) * tf.cast(1.0 / math.sqrt(d), q.dtype)
        scores = tf.matmul(q, k)  # [batch, kv, group * seq, seq]
        scores = tf.reshape(tf.cast(scores, tf.float32), [batch, kv, group, seq, seq])
        causal = tf.linalg.band_part(tf.ones([seq, seq], tf.bool), -1, 0)
        scores = tf.where(causal, scores, NEG_INF)
        probs = tf.cast(tf.nn.softmax(scores, axis=-1), x.dtype)
        probs = tf.reshape(probs, [batch, kv, group * seq, seq])
        out = tf.matmul(probs, v)  # [batch, kv, group * seq, d]
        out = tf.reshape(out, [batch, kv, group, seq, d])
        out = tf.transpose(out, [0, 3, 1, 2, 4])  # [batch, seq, kv, group, d]
        out = tf.reshape(out, [batch, seq, c.num_attention_heads * d])
        return self.o_proj(out)


class MLP(keras.layers.Layer):
    """SwiGLU feed-forward: down(silu(gate(x)) * up(x)) (Shazeer 2020)."""

    def __init__(self, config: ModelConfig, **kwargs):
        super().__init__(**kwargs)
        c = config
        out_std = c.initializer_range / math.sqrt(2.0 * c.num_hidden_layers)
        f = c.intermediate_size
        self.gate_proj = Linear(f, stddev=c.initializer_range, name="gate_proj")
        self.up_proj = Linear(f, stddev=c.initializer_range, name="up_proj")
        self.down_proj = Linear(c.hidden_size, stddev=out_std, name="down_proj")

    def call(self, x):
        return self.down_proj(tf.nn.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(keras.layers.Layer):
    """One pre-norm block: x + attention(norm(x)), then + mlp(norm(x))."""

    def __init__(self, config: ModelConfig, **kwargs):
        super().__init__(**kwargs)
        self.attention_norm = RMSNorm(config.rms_norm_eps, name="attention_norm")
        self.attention = Attention(config, name="attention")
        self.mlp_norm = RMSNorm(config.rms_norm_eps, name="mlp_norm")
        self.mlp = MLP(config, name="mlp")

    def call(self, x, cos, sin):
        x = x + self.attention(self.attention_norm(x), cos, sin)
        return x + self.mlp(self.mlp_norm(x))


class LlamaModel(keras.Model):
    """Token ids [batch, seq] (int) -> next-token logits [batch, seq, vocab] (compute dtype)."""

    def __init__(self, config: ModelConfig, **kwargs):
        super().__init__(**kwargs)
        self.config = config
        c = config
        self.token_embedding = keras.layers.Embedding(
            c.vocab_size,
            c.hidden_size,
            embeddings_initializer=keras.initializers.RandomNormal(stddev=c.initializer_range),
            name="token_embedding",
        )
        self.decoder_layers = [
            DecoderLayer(c, name=f"decoder_{i}") for i in range(c.num_hidden_layers)
        ]
        self.final_norm = RMSNorm(c.rms_norm_eps, name="final_norm")
        self.lm_head = Linear(c.vocab_size, stddev=c.initializer_range, name="lm_head")
        inverse = rope_inverse_frequencies(
            c.head_dim,
            theta=c.rope_theta,
            factor=c.rope_scaling_factor,
            low_freq_factor=c.rope_low_freq_factor,
            high_freq_factor=c.rope_high_freq_factor,
            original_max_position=c.rope_original_max_position,
        )
        self._inverse_frequencies = inverse.astype(np.float32)

    def rotary_tables(self, seq: int | tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
        """(cos, sin) [seq, head_dim] in float32 for positions 0..seq-1."""
        positions = tf.cast(tf.range(seq), tf.float32)
        angles = positions[:, None] * tf.constant(self._inverse_frequencies)[None, :]
        angles = tf.concat([angles, angles], axis=-1)
        return tf.cos(angles), tf.sin(angles)

    def hidden_states(self, token_ids, training=False):
        """The final-norm output [batch, seq, hidden]."""
        del training  # no dropout in Llama pretraining
        x = self.token_embedding(token_ids)
        seq = token_ids.shape[1] if token_ids.shape[1] is not None else tf.shape(token_ids)[1]
        cos, sin = self.rotary_tables(seq)
        for layer in self.decoder_layers:
            x = layer(x, cos, sin)
        return self.final_norm(x)

    def call(self, token_ids, training=False):
        return self.lm_head(self.hidden_states(token_ids, training=training))


def build_model(config: ModelConfig, *, seq_length: int = 2) -> LlamaModel:
    """A built `LlamaModel` (its variables created by one call on [1, seq_length] zeros)."""
    model = LlamaModel(config, name="llama")
    model(tf.zeros([1, seq_length], tf.int32))
    return model
