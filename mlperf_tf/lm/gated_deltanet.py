"""Provides `GatedDeltaNet`, the gated delta-rule linear-attention layer of Qwen3.5 / Qwen3-Next,
with its chunked form for training and prefill and its recurrent form for decoding.

The gated delta rule (Yang, Kautz & Hatamizadeh 2024, "Gated Delta Networks"): per head, a state
S [d_k, d_v] decays by exp(g_t), then moves toward writing v_t at key k_t with strength beta_t,
and the output reads it at q_t:

    S_t = exp(g_t) S_{t-1} + beta_t k_t (v_t - exp(g_t) S_{t-1}^T k_t)^T,    o_t = S_t^T q_t

with q, k L2-normalized and q scaled by 1/sqrt(d_k). `recurrent_gated_delta_rule` runs it a
token at a time (decoding: O(1) state per layer instead of a growing key/value cache);
`chunked_gated_delta_rule` computes the same outputs in chunks of C tokens with matrix products
(the WY form: inside a chunk the updates are the triangular solve (I + L)^-1, L the strictly
lower beta k k^T decay products; across chunks the state is carried), which is what training and
prefill run. Both follow Hugging Face's `torch_chunk_gated_delta_rule` /
`torch_recurrent_gated_delta_rule` (`transformers/models/qwen3_5/modeling_qwen3_5.py`), whose
keras-hub port (`keras_hub/src/models/qwen3_5/qwen3_5_gated_delta_net.py`) the tests compare with.

The layer around it (Hugging Face's `Qwen3_5GatedDeltaNet`): one projection to q, k, v, a
depthwise causal convolution (kernel 4) and SiLU over them, the gates beta = sigmoid(b) and
g = -exp(A_log) softplus(a + dt_bias) per value head, key heads repeated to the value heads,
the core above, a gated RMSNorm per head (`norm(o) * silu(z)`), and the output projection.
Weights are float32 math throughout the core (the reference's fp32 state).

Tensor parallelism (the ambient mesh's `model` axis, M shards, M dividing the key heads): each
shard computes its 1/M of the key heads and of the value heads they serve (key head i serves
value heads [i r, (i + 1) r)), so the core, the gates and the gated norm run on its heads only,
with no collective between the projections and `out_proj`: f once on the input, z, b and a
column-parallel, `dt_bias` and `A_log` split alike, `out_proj` row-parallel (g: one all-reduce
forward), the norm's scale (shared by the heads) read through f. The fused `in_proj_qkv` and the
convolution's kernel, whose channels are Hugging Face's [q | k | v] (a shard's heads are three
column ranges, not one), are held whole on every shard and read through f; each shard multiplies
and convolves only its own heads' three ranges (the work is split, those two weights' memory is
not; their gradient is the all-reduce of the shards' parts).
"""

from __future__ import annotations

import keras
import tensorflow as tf

from mlperf_tf.errors import UserError
from mlperf_tf.layers.matmul import token_matmul
from mlperf_tf.layers.tensor_parallel import ModelAxis
from mlperf_tf.lm.layers import Linear, RMSNorm
from mlperf_tf.parallel.layout import add_split_weight, model_split


def _l2norm(x, eps: float = 1e-6):
    """x / sqrt(sum(x^2) + eps) over the last axis (Hugging Face's `l2norm`)."""
    return x * tf.math.rsqrt(tf.reduce_sum(x * x, axis=-1, keepdims=True) + eps)


def _prepare(query, key, value, g, beta):
    """float32, q/k normalized, q scaled; [B, T, H, D] -> [B, H, T, D], [B, T, H] -> [B, H, T]."""
    query = _l2norm(tf.cast(query, tf.float32))
    key = _l2norm(tf.cast(key, tf.float32))
    query = query * (1.0 / float(query.shape[-1]) ** 0.5)
    heads = [0, 2, 1, 3]
    return (
        tf.transpose(query, heads),
        tf.transpose(key, heads),
        tf.transpose(tf.cast(value, tf.float32), heads),
        tf.transpose(tf.cast(g, tf.float32), [0, 2, 1]),
        tf.transpose(tf.cast(beta, tf.float32), [0, 2, 1]),
    )


def _initial_state(initial_state, batch, heads, dk, dv):
    if initial_state is None:
        return tf.zeros([batch, heads, dk, dv], tf.float32)
    return tf.cast(initial_state, tf.float32)


def recurrent_gated_delta_rule(query, key, value, g, beta, initial_state=None):
    """The gated delta rule one token at a time (decoding).

    Args:
      query, key: `[batch, length, heads, d_k]` (normalized here).
      value: `[batch, length, heads, d_v]`.
      g: `[batch, length, heads]` log decay (<= 0).
      beta: `[batch, length, heads]` write strength in (0, 1).
      initial_state: `[batch, heads, d_k, d_v]` or None (zeros).

    Returns:
      (`[batch, length, heads, d_v]` float32 outputs, `[batch, heads, d_k, d_v]` final state).
    """
    q, k, v, g, beta = _prepare(query, key, value, g, beta)
    batch, heads, _, dk = q.shape
    state = _initial_state(initial_state, tf.shape(q)[0], heads, dk, v.shape[-1])
    outputs = []
    for t in range(q.shape[2]):
        state = state * tf.exp(g[:, :, t])[..., None, None]
        memory = tf.einsum("bhkv,bhk->bhv", state, k[:, :, t])
        delta = (v[:, :, t] - memory) * beta[:, :, t, None]  # [B, H, d_v]
        state = state + k[:, :, t, :, None] * delta[:, :, None, :]
        outputs.append(tf.einsum("bhkv,bhk->bhv", state, q[:, :, t]))
    out = tf.stack(outputs, axis=1)  # [B, T, H, d_v]
    return out, state


def chunked_gated_delta_rule(query, key, value, g, beta, *, chunk_size=64, initial_state=None):
    """The gated delta rule over whole sequences in chunks (training, prefill).

    Same arguments and results as `recurrent_gated_delta_rule`; `chunk_size` C pads the length
    to a multiple of C (the padding has beta = 0 and g = 0: it leaves the state unchanged, so
    the final state is the last real token's).
    """
    q, k, v, g, beta = _prepare(query, key, value, g, beta)
    _, heads, length, dk = q.shape
    dv = v.shape[-1]
    batch = tf.shape(q)[0]
    pad = (-length) % chunk_size
    if pad:
        q, k, v = (tf.pad(x, [[0, 0], [0, 0], [0, pad], [0, 0]]) for x in (q, k, v))
        g, beta = (tf.pad(x, [[0, 0], [0, 0], [0, pad]]) for x in (g, beta))
    n = (length + pad) // chunk_size

    def chunks(x):  # [B, H, T, ...] -> [N, B, H, C, ...] (the scan runs over N)
        shape = [batch, heads, n, chunk_size] + x.shape[3:].as_list()
        x = tf.reshape(x, shape)
        return tf.transpose(x, [2, 0, 1, 3] + list(range(4, len(shape))))

    q, k, v, g, beta = (chunks(x) for x in (q, k, v, g, beta))
    g = tf.cumsum(g, axis=-1)  # [N, B, H, C] log decay from the chunk's start
    lower = tf.linalg.band_part(tf.ones([chunk_size, chunk_size]), -1, 0)  # j <= i
    strict = lower - tf.eye(chunk_size)
    decay = tf.exp((g[..., :, None] - g[..., None, :]) * lower) * lower  # [N, B, H, C, C]
    k_beta = k * beta[..., None]
    v_beta = v * beta[..., None]
    # WY form: T = (I + L)^-1 with L = strictly-lower(k_beta k^T * decay).
    system = tf.eye(chunk_size) + tf.einsum("...id,...jd->...ij", k_beta, k) * decay * strict
    eye = tf.broadcast_to(tf.eye(chunk_size), tf.shape(system))
    wy = tf.linalg.triangular_solve(system, eye, lower=True)  # [N, B, H, C, C]
    u = tf.einsum("...ij,...jd->...id", wy, v_beta)  # pseudo-values [N, B, H, C, d_v]
    w = tf.einsum("...ij,...jd->...id", wy, k_beta * tf.exp(g)[..., None])  # [.., C, d_k]
    intra = tf.einsum("...id,...jd->...ij", q, k) * decay  # [N, B, H, C, C], j <= i

    def step(carry, xs):
        state, _ = carry
        q_c, k_c, u_c, w_c, g_c, intra_c = xs
        v_new = u_c - tf.einsum("bhid,bhdv->bhiv", w_c, state)  # [B, H, C, d_v]
        out = tf.einsum("bhid,bhdv->bhiv", q_c * tf.exp(g_c)[..., None], state)
        out = out + tf.einsum("bhij,bhjv->bhiv", intra_c, v_new)
        g_last = g_c[..., -1:]  # [B, H, 1]
        k_decayed = k_c * tf.exp(g_last - g_c)[..., None]
        state = state * tf.exp(g_last)[..., None] + tf.einsum("bhid,bhiv->bhdv", k_decayed, v_new)
        return state, out

    state0 = _initial_state(initial_state, batch, heads, dk, dv)
    out0 = tf.zeros([batch, heads, chunk_size, dv], tf.float32)
    states, outs = tf.scan(step, (q, k, u, w, g, intra), initializer=(state0, out0))
    # outs: [N, B, H, C, d_v] -> [B, T, H, d_v]
    out = tf.reshape(tf.transpose(outs, [1, 0, 3, 2, 4]), [batch, n * chunk_size, heads, dv])
    return out[:, :length], states[-1]


def causal_conv(x, kernel, state=None, counts=None):
    """Depthwise causal convolution over time.

    Args:
      x: `[batch, length, channels]`.
      kernel: `[channels, K]` (Hugging Face's conv1d weight [channels, 1, K] squeezed).
      state: `[batch, K - 1, channels]`, the previous K - 1 inputs (decoding), or None (zeros).
      counts: None, or int32 `[batch]`: row b's first counts[b] inputs are real, the rest
        right padding; the state returned is then each row's last K - 1 real inputs (the
        state given, for a row of none).

    Returns:
      (`[batch, length, channels]` outputs, `[batch, K - 1, channels]` the last K - 1 inputs).
    """
    size = kernel.shape[-1]
    if state is None:
        state = tf.zeros([tf.shape(x)[0], size - 1, x.shape[-1]], x.dtype)
    window = tf.concat([tf.cast(state, x.dtype), x], axis=1)  # [B, K - 1 + T, C]
    length = tf.shape(x)[1]
    kernel = tf.cast(kernel, x.dtype)
    out = tf.add_n([window[:, i : i + length] * kernel[:, i] for i in range(size)])
    if counts is None:
        return out, window[:, -(size - 1) :]
    last = counts[:, None] + tf.range(size - 1)[None, :]  # [batch, K - 1] window indices
    return out, tf.gather(window, last, batch_dims=1)


class GatedDeltaNet(keras.layers.Layer):
    """Qwen3.5's linear-attention mixer: [batch, length, hidden] -> [batch, length, hidden].

    Weights (Hugging Face's names): `in_proj_qkv` [hidden, 2 key_dim + value_dim] (q, k, v in
    that order), `in_proj_z` [hidden, value_dim], `in_proj_b`, `in_proj_a` [hidden, v_heads],
    `conv_kernel` [2 key_dim + value_dim, K], `dt_bias`, `A_log` [v_heads], `norm` (its scale
    [d_v], shared by the heads), `out_proj` [value_dim, hidden].

    `call(x)` runs the chunked form; `call(x, cache=(conv_state, recurrent_state))` continues
    from a cache and returns `(y, new_cache)`: one token takes the recurrent form, more (a
    prefill or a tool's output) the chunked one from the cached state. `empty_cache(batch)`
    makes the cache of a fresh sequence. `real` (bool [batch, length], each row's real tokens
    first, then right padding) makes padding leave the cache as it was: g = 0 and beta = 0
    there (the state is neither decayed nor written) and the convolution's state is each
    row's last real inputs, so rows of different lengths continue their own caches (a row
    of no real token keeps its cache exactly).
    """

    def __init__(self, *, hidden_size: int, num_key_heads: int, num_value_heads: int,
                 key_head_dim: int, value_head_dim: int, conv_kernel_size: int = 4,
                 chunk_size: int = 64, norm_epsilon: float = 1e-6, stddev: float = 0.02,
                 **kwargs):  # fmt: skip
        super().__init__(**kwargs)
        if num_value_heads % num_key_heads:
            raise ValueError(
                f"num_value_heads ({num_value_heads}) must be a multiple of num_key_heads "
                f"({num_key_heads})"
            )
        self.hidden_size = hidden_size
        self.num_key_heads = num_key_heads
        self.num_value_heads = num_value_heads
        self.key_head_dim = key_head_dim
        self.value_head_dim = value_head_dim
        self.conv_kernel_size = conv_kernel_size
        self.chunk_size = chunk_size
        self.key_dim = num_key_heads * key_head_dim
        self.value_dim = num_value_heads * value_head_dim
        self.conv_dim = 2 * self.key_dim + self.value_dim
        self.axis = ModelAxis(None, self)
        m = self.axis.size
        if num_key_heads % m:
            raise UserError(
                f"--model_parallel={m} must divide `model.linear_num_key_heads` ({num_key_heads})"
            )
        # This shard's heads (all of them at M = 1).
        self.local_key_heads, self.local_value_heads = num_key_heads // m, num_value_heads // m
        self.local_key_dim = self.local_key_heads * key_head_dim
        self.local_value_dim = self.local_value_heads * value_head_dim
        self.local_conv_dim = 2 * self.local_key_dim + self.local_value_dim
        whole = "replicated" if m > 1 else None  # [q | k | v]: read whole, used by parts
        column = "column" if m > 1 else None
        self.in_proj_qkv = Linear(self.conv_dim, stddev=stddev, parallel=whole,
                                  name="in_proj_qkv")  # fmt: skip
        self.in_proj_z = Linear(self.value_dim, stddev=stddev, parallel=column, name="in_proj_z")
        self.in_proj_b = Linear(num_value_heads, stddev=stddev, parallel=column, name="in_proj_b")
        self.in_proj_a = Linear(num_value_heads, stddev=stddev, parallel=column, name="in_proj_a")
        self.norm = RMSNorm(norm_epsilon, sharded_input=m > 1, name="norm")
        self.out_proj = Linear(hidden_size, stddev=stddev, parallel="row" if m > 1 else None,
                               name="out_proj")  # fmt: skip

    @staticmethod
    def parameter_count(*, hidden_size, num_key_heads, num_value_heads, key_head_dim,
                        value_head_dim, conv_kernel_size=4) -> int:  # fmt: skip
        """Weights of one layer of this shape, without building it."""
        key_dim, value_dim = num_key_heads * key_head_dim, num_value_heads * value_head_dim
        conv_dim = 2 * key_dim + value_dim
        return (
            hidden_size * (conv_dim + value_dim + 2 * num_value_heads)  # qkv, z, b, a
            + conv_dim * conv_kernel_size
            + 2 * num_value_heads  # dt_bias, A_log
            + value_head_dim  # norm
            + value_dim * hidden_size  # out_proj
        )

    def build(self, input_shape):
        hidden = (None, None, self.hidden_size)
        for proj in (self.in_proj_qkv, self.in_proj_z, self.in_proj_b, self.in_proj_a):
            proj.build(hidden)
        self.conv_kernel = self.add_weight(
            name="conv_kernel", shape=(self.conv_dim, self.conv_kernel_size),
            initializer=keras.initializers.RandomUniform(-0.5, 0.5),
        )  # fmt: skip
        heads = model_split(0)  # one value per value head: this shard's
        self.dt_bias = add_split_weight(self, name="dt_bias", shape=(self.num_value_heads,),
                                        initializer="ones", layout=heads)  # fmt: skip
        # A = exp(A_log) in [1, 16] as Hugging Face initializes it (log of uniform(0, 16)).
        self.A_log = add_split_weight(
            self, name="A_log", shape=(self.num_value_heads,),
            initializer=keras.initializers.RandomUniform(0.0, 2.77), layout=heads,
        )  # fmt: skip
        self.norm.build((None, self.value_head_dim))
        self.out_proj.build((None, None, self.value_dim))
        self.built = True

    def empty_cache(self, batch: int):
        """(conv_state [batch, K - 1, conv_dim], recurrent_state [batch, v_heads, d_k, d_v]):
        this shard's channels and heads under tensor parallelism."""
        return (
            tf.zeros([batch, self.conv_kernel_size - 1, self.local_conv_dim], self.compute_dtype),
            tf.zeros(
                [batch, self.local_value_heads, self.key_head_dim, self.value_head_dim],
                tf.float32,
            ),
        )

    def _own_channels(self, t, axis: int):
        """`t` (whole [q | k | v] channels along `axis`, read through f) -> this shard's heads'
        [q_s | k_s | v_s] (`t` itself at M = 1): three contiguous ranges, concatenated."""
        if self.axis.size == 1:
            return t
        shard = self.axis.index()
        parts = []
        for start, width in ((0, self.local_key_dim), (self.key_dim, self.local_key_dim),
                             (2 * self.key_dim, self.local_value_dim)):  # fmt: skip
            first = start + shard * width
            parts.append(t[first : first + width] if axis == 0 else t[:, first : first + width])
        return tf.concat(parts, axis=axis)

    def project_qkv(self, x):
        """This shard's q, k, v channels [..., local conv_dim] of `x` (already through f)."""
        if self.axis.size == 1:
            return self.in_proj_qkv(x)
        kernel = self._own_channels(self.in_proj_qkv.read(self.in_proj_qkv.kernel), axis=1)
        return token_matmul(x, kernel)

    def call(self, x, cache=None, real=None):
        batch, length = tf.shape(x)[0], x.shape[1]
        conv_state, recurrent_state = (None, None) if cache is None else cache
        counts = None if real is None else tf.reduce_sum(tf.cast(real, tf.int32), axis=1)
        x = self.axis.copy(x)  # f: one all-reduce of the input gradient for every projection
        kernel = self._own_channels(self.axis.copy(self.conv_kernel), axis=0)
        mixed, conv_state = causal_conv(self.project_qkv(x), kernel, conv_state, counts)
        mixed = tf.nn.silu(mixed)  # [B, T, 2 local key_dim + local value_dim]
        kd, hk, hv = self.local_key_dim, self.local_key_heads, self.local_value_heads
        query = tf.reshape(mixed[..., :kd], [batch, -1, hk, self.key_head_dim])
        key = tf.reshape(mixed[..., kd : 2 * kd], [batch, -1, hk, self.key_head_dim])
        value = tf.reshape(mixed[..., 2 * kd :], [batch, -1, hv, self.value_head_dim])
        beta = tf.sigmoid(tf.cast(self.in_proj_b(x), tf.float32))  # [B, T, v_heads]
        a = tf.cast(self.in_proj_a(x), tf.float32) + tf.cast(self.dt_bias, tf.float32)
        g = -tf.exp(tf.cast(self.A_log, tf.float32)) * tf.nn.softplus(a)
        if real is not None:  # padding: no decay (g = 0), no write (beta = 0)
            kept = tf.cast(real, tf.float32)[..., None]  # [B, T, 1]
            g, beta = g * kept, beta * kept
        if hv > hk:  # key head i serves value heads [i * r, (i + 1) * r)
            query = tf.repeat(query, hv // hk, axis=2)
            key = tf.repeat(key, hv // hk, axis=2)
        if cache is not None and length == 1:
            core, recurrent_state = recurrent_gated_delta_rule(
                query, key, value, g, beta, recurrent_state
            )
        else:
            core, recurrent_state = chunked_gated_delta_rule(
                query, key, value, g, beta, chunk_size=self.chunk_size,
                initial_state=recurrent_state,
            )  # fmt: skip
        z = tf.cast(tf.reshape(self.in_proj_z(x), [batch, -1, hv, self.value_head_dim]), tf.float32)
        core = tf.cast(self.norm(core), tf.float32) * tf.nn.silu(z)  # [B, T, v_heads, d_v]
        y = self.out_proj(
            tf.cast(tf.reshape(core, [batch, -1, self.local_value_dim]), self.compute_dtype)
        )
        if cache is None:
            return y
        return y, (conv_state, recurrent_state)
