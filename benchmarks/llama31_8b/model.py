"""Provides the Llama 3.1 decoder (RMSNorm, RoPE with Llama 3.1 scaling, GQA, SwiGLU) in Keras 3.

The layout is Meta's Llama 3.1 (Hugging Face `LlamaForCausalLM`, NeMo's `Llama31Config8B`):
pre-norm residual blocks `x + attention(norm(x))`, `x + mlp(norm(x))`, a final RMSNorm and an
output projection untied from the input embedding. Attention and the MLP are separate layers
whose projections (q/k/v/o, gate/up/down) are separate sublayers, so that tensor parallelism can
swap them for column- and row-parallel layers (`mlperf_tf/layers/`). Norms, the softmax and the
loss compute in float32 under a mixed policy, as keras-hub's Llama does.

Mixture of experts (`config.moe`, the settings the Transformer takes too): every `moe.every`-th
block's MLP is an `mlperf_tf.layers.MoEFeedForward` of SwiGLU experts (Mixtral's block; its
gates `router_softmax="after"` are Mixtral's, "before" ST-MoE's), split over the mesh's `expert`
axis under `--expert_parallel`; its router and auxiliary losses are those of the Transformer's
MoE blocks.
"""

from __future__ import annotations

import math

import keras
import numpy as np
import tensorflow as tf

from benchmarks.llama31_8b.config import ModelConfig
from mlperf_tf.errors import UserError
from mlperf_tf.layers import moe as moe_lib
from mlperf_tf.layers import token_matmul
from mlperf_tf.layers.tensor_parallel import ModelAxis, VocabParallelEmbedding
from mlperf_tf.parallel.layout import REPLICATED, add_split_weight, check_divides, model_split
from mlperf_tf.parallel.mesh import DeviceMesh

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

    Its kernel is [in, units] (Keras' Dense layout). Under tensor parallelism (`mesh.model` =
    M > 1) `parallel` says how it is split over `model`:

    - "column": kernel [in, units/M]; the output is this shard's [..., units/M]; no collective
      (the block applies f to the input once: one all-reduce of its gradient backward).
    - "row": kernel [in/M, units]; the input is this shard's [..., in/M]; g: one all-reduce of
      the [..., units] partial sums forward, none backward.
    - "replicated": the whole kernel on every shard, read through f (identity forward, an
      all-reduce of its gradient backward: each shard uses part of its output, e.g. the
      key/value heads of its query heads when there are fewer than M, and the sum is the whole
      gradient, the same on every shard).
    - None: not split (and no collective).
    """

    def __init__(self, units: int, *, stddev: float, mesh: DeviceMesh | None = None,
                 parallel: str | None = None, **kwargs):  # fmt: skip
        super().__init__(**kwargs)
        self.units = units
        self.stddev = stddev
        self.mesh = mesh
        self.parallel = parallel
        self.axis = ModelAxis(mesh, self)

    def build(self, input_shape):
        layout = {"column": model_split(1), "row": model_split(0)}.get(self.parallel, REPLICATED)
        self.kernel = add_split_weight(
            self, name="kernel", shape=(input_shape[-1], self.units),
            initializer=keras.initializers.RandomNormal(stddev=self.stddev), layout=layout,
            mesh=self.mesh,
        )  # fmt: skip

    def call(self, x):
        kernel = tf.cast(self.kernel, self.compute_dtype)
        if self.parallel == "replicated":
            kernel = self.axis.copy(kernel)
        y = token_matmul(x, kernel)
        return self.axis.reduce(y) if self.parallel == "row" else y


class Attention(keras.layers.Layer):
    """Causal grouped-query self-attention with rotary positions.

    `num_attention_heads` query heads share `num_key_value_heads` key/value heads in groups of
    `num_attention_heads / num_key_value_heads`; the groups are a reshape of the queries
    ([batch, seq, kv_heads, group, head_dim]), so keys and values are never repeated.

    Tensor parallelism (M shards): each shard holds heads/M query heads (q_proj column-parallel,
    o_proj row-parallel: f on the input, g on the output). With at least M key/value heads they
    are split alike (kv_heads/M per shard, the ones its query heads use); with fewer, k_proj
    and v_proj are replicated and each shard keeps the one key/value head its query heads share
    (M must then be a multiple of kv_heads).
    """

    def __init__(self, config: ModelConfig, mesh: DeviceMesh | None = None, **kwargs):
        super().__init__(**kwargs)
        self.config = config
        c = config
        std = c.initializer_range
        self.axis = ModelAxis(mesh, self)
        m = self.axis.size
        split_kv = c.num_key_value_heads % m == 0
        kv_kind = "column" if split_kv else "replicated"
        # Megatron's output-layer init: std / sqrt(2 * layers).
        out_std = std / math.sqrt(2.0 * c.num_hidden_layers)

        def linear(units, stddev, name, parallel):
            return Linear(units, stddev=stddev, mesh=mesh, parallel=parallel, name=name)

        self.q_proj = linear(c.num_attention_heads * c.head_dim, std, "q_proj", "column")
        self.k_proj = linear(c.num_key_value_heads * c.head_dim, std, "k_proj", kv_kind)
        self.v_proj = linear(c.num_key_value_heads * c.head_dim, std, "v_proj", kv_kind)
        self.o_proj = linear(c.hidden_size, out_std, "o_proj", "row")
        self.local_heads = c.num_attention_heads // m
        self.local_kv = c.num_key_value_heads // m if split_kv else 1

    def _local_kv(self, t):
        """With replicated key/value heads: the one this shard's query heads use."""
        c = self.config
        if self.axis.size == 1 or c.num_key_value_heads % self.axis.size == 0:
            return t
        group = c.num_attention_heads // c.num_key_value_heads
        head = self.axis.index() * self.local_heads // group
        return t[:, :, head : head + 1]

    def call(self, x, cos, sin):
        """x [batch, seq, hidden]; cos, sin [seq, head_dim] -> [batch, seq, hidden]."""
        c = self.config
        kv, d = self.local_kv, c.head_dim  # this shard's
        group = self.local_heads // kv
        batch, seq = tf.shape(x)[0], tf.shape(x)[1]
        x = self.axis.copy(x)  # f: one all-reduce of the input gradient for q, k and v
        q = tf.reshape(self.q_proj(x), [batch, seq, kv, group, d])
        k = self._local_kv(tf.reshape(self.k_proj(x), [batch, seq, -1, d]))
        v = self._local_kv(tf.reshape(self.v_proj(x), [batch, seq, -1, d]))
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
        out = tf.reshape(out, [batch, seq, self.local_heads * d])
        return self.o_proj(out)


class MLP(keras.layers.Layer):
    """SwiGLU feed-forward: down(silu(gate(x)) * up(x)) (Shazeer 2020).

    Tensor parallelism: gate and up column-parallel (f once on the input), down row-parallel
    (g): intermediate/M units per shard.
    """

    def __init__(self, config: ModelConfig, mesh: DeviceMesh | None = None, **kwargs):
        super().__init__(**kwargs)
        c = config
        out_std = c.initializer_range / math.sqrt(2.0 * c.num_hidden_layers)
        f = c.intermediate_size
        std = c.initializer_range
        self.axis = ModelAxis(mesh, self)
        self.gate_proj = Linear(f, stddev=std, mesh=mesh, parallel="column", name="gate_proj")
        self.up_proj = Linear(f, stddev=std, mesh=mesh, parallel="column", name="up_proj")
        self.down_proj = Linear(
            c.hidden_size, stddev=out_std, mesh=mesh, parallel="row", name="down_proj"
        )

    def call(self, x):
        x = self.axis.copy(x)
        return self.down_proj(tf.nn.silu(self.gate_proj(x)) * self.up_proj(x))


def moe_mlp(config: ModelConfig, *, mesh: DeviceMesh | None, group_size: int | None,
            collective_timeout_s: float = 0.0) -> moe_lib.MoEFeedForward:  # fmt: skip
    """An MoE block's feed-forward layer: `config.moe`'s router over SwiGLU experts of width
    `moe.filter_size` (0: `intermediate_size`), started as Llama's MLP is (gate/up normal with
    `initializer_range`, down with Megatron's output std), experts split over `mesh.expert`.
    Under model parallelism its input is replicated over the model group and every shard runs
    the whole layer (no model-axis collective); its weights are not split over `model`."""
    c = config
    out_std = c.initializer_range / math.sqrt(2.0 * c.num_hidden_layers)
    expert_parallel = mesh.expert if mesh is not None else 1
    return c.moe.layer(
        hidden_size=c.hidden_size, filter_size=c.intermediate_size, expert_mlp="swiglu",
        kernel_initializer=keras.initializers.RandomNormal(stddev=c.initializer_range),
        output_initializer=keras.initializers.RandomNormal(stddev=out_std),
        group_size=group_size, expert_parallel=expert_parallel,
        mesh=mesh if expert_parallel > 1 else None,
        collective_timeout_s=collective_timeout_s, name="moe",
    )  # fmt: skip


class DecoderLayer(keras.layers.Layer):
    """One pre-norm block: x + attention(norm(x)), then + mlp(norm(x)).

    Block `index` has an MoE feed-forward layer when `config.moe.is_moe(index)` (`moe_mlp`);
    its stats go to the call's `aux` (a `moe.Collector`, or None).
    """

    def __init__(self, config: ModelConfig, mesh: DeviceMesh | None = None, *, index: int = 0,
                 moe_group_size: int | None = None, collective_timeout_s: float = 0.0,
                 **kwargs):  # fmt: skip
        super().__init__(**kwargs)
        self.attention_norm = RMSNorm(config.rms_norm_eps, name="attention_norm")
        self.attention = Attention(config, mesh=mesh, name="attention")
        self.mlp_norm = RMSNorm(config.rms_norm_eps, name="mlp_norm")
        if config.moe.is_moe(index):
            self.mlp = moe_mlp(
                config, mesh=mesh, group_size=moe_group_size,
                collective_timeout_s=collective_timeout_s,
            )  # fmt: skip
        else:
            self.mlp = MLP(config, mesh=mesh, name="mlp")

    @property
    def is_moe(self) -> bool:
        return isinstance(self.mlp, moe_lib.MoEFeedForward)

    def call(self, x, cos, sin, training=False, aux=None):
        x = x + self.attention(self.attention_norm(x), cos, sin)
        if not self.is_moe:
            return x + self.mlp(self.mlp_norm(x))
        y, stats = self.mlp(self.mlp_norm(x), training=training)
        if aux is not None:
            aux.add(self.mlp, stats)
        return x + y


class LlamaModel(keras.Model):
    """Token ids [batch, seq] (int) -> next-token logits [batch, seq, vocab] (compute dtype).

    Tensor parallelism (`mesh.model` = M > 1): vocabulary-parallel embedding, attention and MLP
    split as Megatron splits them, and a column-parallel `lm_head` whose logits are this shard's
    [batch, seq, vocab/M] (the loss is `vocab_parallel_cross_entropy`; the 128k-id logits are
    never gathered). The RMS norms are replicated.

    Args:
      config: the model's shape (and its `moe` settings).
      mesh: the run's mesh (None: one replica).
      moe_group_size: static tokens per replica for the MoE training capacity (None: each
        batch's count; expert parallelism needs it).
      collective_timeout_s: seconds an expert-parallel MoE layer's all-to-all may wait (0: no
        limit; the runner's `--collective_timeout`).
    """

    def __init__(self, config: ModelConfig, mesh: DeviceMesh | None = None, *,
                 moe_group_size: int | None = None, collective_timeout_s: float = 0.0,
                 **kwargs):  # fmt: skip
        super().__init__(**kwargs)
        self.config = config
        self.mesh = mesh
        c = config
        if mesh is not None:
            check_divides(
                mesh, **{"model.num_attention_heads": c.num_attention_heads,
                         "model.intermediate_size": c.intermediate_size,
                         "model.vocab_size": c.vocab_size}
            )  # fmt: skip
            kv = c.num_key_value_heads
            if kv % mesh.model and mesh.model % kv:
                raise UserError(
                    f"--model_parallel={mesh.model} must divide model.num_key_value_heads "
                    f"({kv}) or be a multiple of it (key/value heads are split or replicated)"
                )
        self.axis = ModelAxis(mesh, self)
        self.token_embedding = VocabParallelEmbedding(
            c.vocab_size,
            c.hidden_size,
            mesh=mesh,
            embeddings_initializer=keras.initializers.RandomNormal(stddev=c.initializer_range),
            name="token_embedding",
        )
        self.decoder_layers = [
            DecoderLayer(
                c,
                mesh=mesh,
                index=i,
                moe_group_size=moe_group_size,
                collective_timeout_s=collective_timeout_s,
                name=f"decoder_{i}",
            )  # fmt: skip
            for i in range(c.num_hidden_layers)
        ]
        self.final_norm = RMSNorm(c.rms_norm_eps, name="final_norm")
        self.lm_head = Linear(
            c.vocab_size, stddev=c.initializer_range, mesh=mesh, parallel="column",
            name="lm_head",
        )  # fmt: skip
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

    @property
    def moe_layers(self) -> list:
        """The MoE feed-forward layers, in block order (the order of a `moe.Collector`)."""
        return [layer.mlp for layer in self.decoder_layers if layer.is_moe]

    def hidden_states(self, token_ids, training=False, aux=None):
        """The final-norm output [batch, seq, hidden]. No dropout in Llama pretraining;
        `training` sets the MoE layers' capacity factor. `aux`: a `moe.Collector`, or None."""
        x = self.token_embedding(token_ids)
        seq = token_ids.shape[1] if token_ids.shape[1] is not None else tf.shape(token_ids)[1]
        cos, sin = self.rotary_tables(seq)
        for layer in self.decoder_layers:
            x = layer(x, cos, sin, training=training, aux=aux)
        return self.final_norm(x)

    def call(self, token_ids, training=False, aux=None):
        """Logits [batch, seq, vocab] (this shard's [..., vocab/M] under model parallelism);
        the MoE layers' stats go to `aux` (a `moe.Collector`, or None)."""
        states = self.hidden_states(token_ids, training=training, aux=aux)
        return self.lm_head(self.axis.copy(states))


def build_model(config: ModelConfig, *, seq_length: int = 2, mesh: DeviceMesh | None = None,
                moe_group_size: int | None = None,
                collective_timeout_s: float = 0.0) -> LlamaModel:  # fmt: skip
    """A built `LlamaModel` (its variables created by `build` on [1, seq_length] ids; under
    model or expert parallelism by building each layer, since a call needs replica context)."""
    model = LlamaModel(
        config, mesh=mesh, moe_group_size=moe_group_size,
        collective_timeout_s=collective_timeout_s, name="llama",
    )  # fmt: skip
    if mesh is None or (mesh.model == 1 and mesh.expert == 1):
        model(tf.zeros([1, seq_length], tf.int32))
        return model
    c = config
    hidden = (None, None, c.hidden_size)
    model.token_embedding.build((None, None))
    for layer in model.decoder_layers:
        layer.attention_norm.build(hidden)
        attention = layer.attention
        for proj in (attention.q_proj, attention.k_proj, attention.v_proj):
            proj.build(hidden)
        attention.o_proj.build((None, None, c.num_attention_heads * c.head_dim))
        attention.built = True
        layer.mlp_norm.build(hidden)
        if layer.is_moe:
            layer.mlp.build(hidden)
        else:
            layer.mlp.gate_proj.build(hidden)
            layer.mlp.up_proj.build(hidden)
            layer.mlp.down_proj.build((None, None, c.intermediate_size))
            layer.mlp.built = True
        layer.built = True
    model.final_norm.build(hidden)
    model.lm_head.build(hidden)
    model.built = True
    return model
