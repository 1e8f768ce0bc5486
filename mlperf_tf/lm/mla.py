"""Provides `MultiHeadLatentAttention`: DeepSeek-V2/V3's multi-head latent attention (MLA),
causal, over a decoupled rotary part, tensor-parallel over heads as Megatron splits it.

The formulas are DeepSeek's (`deepseek-ai/DeepSeek-V3` `inference/model.py` `MLA.forward`, its
"naive" path; arXiv 2412.19437 eqs. 1-11), with Hugging Face's weight names:

    c_q = q_a_layernorm(x W_qa)                      # [b, s, q_lora]   (W_q when q_lora = 0)
    [q_nope, q_pe] = c_q W_qb                        # per head: [nope], [rope]
    [c_kv, k_pe] = x W_kva                           # [kv_lora], [rope] (one k_pe for all heads)
    [k_nope, v] = kv_a_layernorm(c_kv) W_kvb         # per head: [nope], [v_head]
    q = [q_nope, rope(q_pe)], k = [k_nope, rope(k_pe)]
    o = softmax(q k^T * scale + causal) v W_o        # scale = (nope + rope)^-1/2 * mscale^2

RoPE rotates *adjacent* pairs (2i, 2i + 1) as DeepSeek's complex view does (the layout of its
checkpoints' `q_b_proj` and `kv_a_proj_with_mqa` rows); this module gathers the even then the
odd channels of q_pe and k_pe and applies the suite's "rotate half" `apply_rope`, which rotates
the same pairs (the dot products, all that attention reads, are DeepSeek's). With YaRN scaling
the temperature `mscale = 0.1 ln(factor) + 1` multiplies the softmax scale twice, over all of
q.k (DeepSeek's `softmax_scale * mscale * mscale`), not the rotary tables: the model passes
unscaled tables (`RotaryEmbedding(scale_tables=False)`).

Tensor parallelism (the ambient mesh's `model` axis, M > 1): f on the input once; the down
projections `q_a_proj`, `kv_a_proj_with_mqa` and their norms are replicated, read through f
(each shard's gradient is its heads' part, summed by one all-reduce each backward); `q_b_proj`
and `kv_b_proj` are column-parallel (H/M heads per shard), `o_proj` row-parallel (g: one
all-reduce forward). M must divide the heads.

Context parallelism (the ambient mesh's `context` axis, C > 1,
`mlperf_tf.layers.context_parallel`): each member holds 2 of every sequence's 2C zig-zag chunks,
and `cos`, `sin` are the tables of its tokens' true positions. What the keys and values of the
whole sequence need is per token and small: the normalized latent and the rotated shared `k_pe`,
[kv_lora + rope] a token (DeepSeek-V3: 576 values, against 128 x (192 + 128) for the heads' k
and v), gathered over the axis in one all-gather; each member then up-projects the gathered latent through `kv_b_proj` (C x that matmul's FLOPs,
the price of gathering 1/71 of the bytes) and masks by true positions. The gather's backward
returns each member its own rows of the summed gradient; `kv_b_proj`'s gradient is the member's
queries' part, summed over the axis with the other replicated weights'.
"""

from __future__ import annotations

import math

import keras
import numpy as np
import tensorflow as tf

from mlperf_tf.errors import UserError
from mlperf_tf.layers.context_parallel import ContextAxis
from mlperf_tf.layers.tensor_parallel import ModelAxis
from mlperf_tf.lm.attention import NEG_INF
from mlperf_tf.lm.layers import Linear, RMSNorm
from mlperf_tf.lm.rope import apply_rope


def yarn_mscale(rope_type: str, factor: float) -> float:
    """DeepSeek's attention temperature: `0.1 ln(factor) + 1` under YaRN scaling (its `mscale`
    and `mscale_all_dim` are 1), else 1."""
    return 0.1 * math.log(factor) + 1.0 if rope_type == "yarn" and factor > 1.0 else 1.0


def interleaved_to_halves(rope_dim: int) -> np.ndarray:
    """Channel order [0, 2, 4, ..., 1, 3, ...]: adjacent pairs (2i, 2i + 1) become (i, i + d/2),
    the pairs `apply_rope` rotates."""
    return np.concatenate([np.arange(0, rope_dim, 2), np.arange(1, rope_dim, 2)])


class MultiHeadLatentAttention(keras.layers.Layer):
    """Causal multi-head latent attention (see the module docstring).

    Args:
      hidden_size: the model width.
      num_heads: H.
      q_lora_rank: the query latent width (0: one projection `q_proj`, no latent).
      kv_lora_rank: the key/value latent width.
      qk_nope_head_dim, qk_rope_head_dim: a head's position-free and rotary query/key widths.
      v_head_dim: a head's value width.
      stddev: init std of every projection but o; output_stddev: of o.
      norm_epsilon: the latent norms' epsilon.
      mscale: the attention temperature (`yarn_mscale`).

    Call: `layer(x, cos, sin)`: x [batch, seq, hidden], cos/sin [seq, qk_rope_head_dim].
    """

    def __init__(self, *, hidden_size: int, num_heads: int, q_lora_rank: int, kv_lora_rank: int,
                 qk_nope_head_dim: int, qk_rope_head_dim: int, v_head_dim: int, stddev: float,
                 output_stddev: float, norm_epsilon: float = 1e-6, mscale: float = 1.0,
                 **kwargs):  # fmt: skip
        super().__init__(**kwargs)
        self.hidden_size = hidden_size
        self.num_heads = num_heads
        self.q_lora_rank = q_lora_rank
        self.kv_lora_rank = kv_lora_rank
        self.nope = qk_nope_head_dim
        self.rope = qk_rope_head_dim
        self.v_head_dim = v_head_dim
        self.axis = ModelAxis(None, self)
        m = self.axis.size
        if num_heads % m:
            raise UserError(
                f"--model_parallel={m} must divide `model.num_attention_heads` ({num_heads})"
            )
        self.local_heads = num_heads // m
        self.context = ContextAxis(self)
        self.scale = (qk_nope_head_dim + qk_rope_head_dim) ** -0.5 * mscale * mscale
        self.order = tf.constant(interleaved_to_halves(qk_rope_head_dim), tf.int32)
        qk = qk_nope_head_dim + qk_rope_head_dim

        def linear(units, name, parallel, std=stddev):
            return Linear(units, stddev=std, parallel=parallel, name=name)

        if q_lora_rank:
            self.q_a_proj = linear(q_lora_rank, "q_a_proj", "replicated")
            self.q_a_layernorm = RMSNorm(norm_epsilon, sharded_input=True, name="q_a_layernorm")
            self.q_b_proj = linear(num_heads * qk, "q_b_proj", "column")
        else:
            self.q_proj = linear(num_heads * qk, "q_proj", "column")
        self.kv_a_proj_with_mqa = linear(
            kv_lora_rank + qk_rope_head_dim, "kv_a_proj_with_mqa", "replicated"
        )
        self.kv_a_layernorm = RMSNorm(norm_epsilon, sharded_input=True, name="kv_a_layernorm")
        self.kv_b_proj = linear(num_heads * (qk_nope_head_dim + v_head_dim), "kv_b_proj", "column")
        self.o_proj = linear(hidden_size, "o_proj", "row", output_stddev)

    @classmethod
    def from_config(cls, config, **kwargs) -> MultiHeadLatentAttention:
        """The MLA of a `DecoderConfig` (`attention="mla"`)."""
        c = config
        return cls(
            hidden_size=c.hidden_size, num_heads=c.num_attention_heads,
            q_lora_rank=c.q_lora_rank, kv_lora_rank=c.kv_lora_rank,
            qk_nope_head_dim=c.qk_nope_head_dim, qk_rope_head_dim=c.qk_rope_head_dim,
            v_head_dim=c.v_head_dim, stddev=c.initializer_range,
            output_stddev=c.output_init_std, norm_epsilon=c.rms_norm_eps,
            mscale=yarn_mscale(c.rope_type, c.rope_scaling_factor), **kwargs,
        )  # fmt: skip

    def build(self, input_shape):
        hidden = (None, None, input_shape[-1])
        if self.q_lora_rank:
            self.q_a_proj.build(hidden)
            self.q_a_layernorm.build((None, self.q_lora_rank))
            self.q_b_proj.build((None, None, self.q_lora_rank))
        else:
            self.q_proj.build(hidden)
        self.kv_a_proj_with_mqa.build(hidden)
        self.kv_a_layernorm.build((None, self.kv_lora_rank))
        self.kv_b_proj.build((None, None, self.kv_lora_rank))
        self.o_proj.build((None, None, self.num_heads * self.v_head_dim))
        self.built = True

    def _rotate(self, t, cos, sin):
        """Rotary part [batch, seq, heads, rope] with DeepSeek's adjacent pairs."""
        return apply_rope(tf.gather(t, self.order, axis=-1), cos, sin)

    def _scores_mask(self, length):
        """bool [queries, keys] of this member's queries over the (gathered) keys: causal by
        true positions (`length`: the member's tokens, static under context parallelism)."""
        if self.context.size == 1:
            return tf.linalg.band_part(tf.ones([length, length], tf.bool), -1, 0)
        query, key = self.context.positions(length), self.context.key_positions(length)
        return tf.constant(key[None, :] <= query[:, None])

    def call(self, x, cos, sin):
        """x [batch, seq, hidden]; cos, sin [seq, rope] -> [batch, seq, hidden]."""
        h, nope, rope, dv = self.local_heads, self.nope, self.rope, self.v_head_dim
        batch, seq = tf.shape(x)[0], tf.shape(x)[1]
        length = x.shape[1] if self.context.size > 1 else seq
        x = self.axis.copy(x)  # f: one all-reduce of the input gradient backward
        if self.q_lora_rank:
            q = self.q_b_proj(self.q_a_layernorm(self.q_a_proj(x)))
        else:
            q = self.q_proj(x)
        q = tf.reshape(q, [batch, seq, h, nope + rope])
        q_nope, q_pe = tf.split(q, [nope, rope], axis=-1)
        latent, k_pe = tf.split(self.kv_a_proj_with_mqa(x), [self.kv_lora_rank, rope], axis=-1)
        latent = self.kv_a_layernorm(latent)  # [batch, seq, kv_lora]
        q_pe = self._rotate(q_pe, cos, sin)  # [batch, seq, h, rope]
        k_pe = self._rotate(k_pe[:, :, None, :], cos, sin)[:, :, 0]  # [batch, seq, rope]
        if self.context.size > 1:
            # The whole sequence's latents and rotated k_pe, in the members' rank order:
            # [batch, seq, kv_lora + rope] -> [batch, C seq, kv_lora + rope].
            both = self.context.gather_sequence(tf.concat([latent, k_pe], axis=-1), axis=1)
            latent, k_pe = tf.split(both, [self.kv_lora_rank, rope], axis=-1)
        keys = tf.shape(latent)[1]  # seq, or C seq gathered
        kv = tf.reshape(self.kv_b_proj(latent), [batch, keys, h, nope + dv])
        k_nope, v = tf.split(kv, [nope, dv], axis=-1)
        k_pe = tf.broadcast_to(k_pe[:, :, None, :], tf.stack([batch, keys, h, rope]))
        q = tf.concat([q_nope, q_pe], axis=-1)  # [batch, seq, h, nope + rope]
        k = tf.concat([k_nope, k_pe], axis=-1)  # [batch, keys, h, nope + rope]
        q = tf.transpose(q, [0, 2, 1, 3])  # [batch, h, seq, qk]
        k = tf.transpose(k, [0, 2, 1, 3])  # [batch, h, keys, qk]
        v = tf.transpose(v, [0, 2, 1, 3])  # [batch, h, keys, dv]
        scores = tf.cast(tf.matmul(q, k, transpose_b=True), tf.float32) * self.scale
        probs = tf.nn.softmax(tf.where(self._scores_mask(length), scores, NEG_INF), axis=-1)
        out = tf.matmul(tf.cast(probs, v.dtype), v)  # [batch, h, seq, dv]
        out = tf.reshape(tf.transpose(out, [0, 2, 1, 3]), [batch, seq, h * dv])
        return self.o_proj(out)
