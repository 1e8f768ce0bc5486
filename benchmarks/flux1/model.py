"""Provides `FluxModel`: FLUX.1-schnell's MMDiT (rectified-flow velocity model) in Keras 3.

It follows torchtitan's `experiments/flux/model/{model,layers,math}.py` at the commit the MLPerf
reference pins (9603aa83): the latent is cut into 2x2 patches (`utils.py:pack_latents`, features
ordered channel, row, column), the timestep and the pooled CLIP vector make one conditioning
vector that modulates every block (adaLN: shift, scale, gate), double-stream blocks keep
separate image and text weights and attend jointly (text first), single-stream blocks run
attention and MLP in parallel on the joined sequence, queries and keys get RMSNorm per head and
3-axis rotary positions (text at (0, 0, 0), a patch at (0, row, column)), the MLPs use GELU's
tanh form, and there is no guidance input (schnell). Initialization is the reference's
`init_weights` (DiT's): Xavier-uniform projections with zero biases (over the fused
projection's fan where the reference fuses q, k, v or q, k, v and the MLP), N(0, 0.02)
embedders, zero modulation and output layers.

Tensor parallelism (`--model_parallel=M`): in both block kinds the q, k, v and MLP input
projections are column-parallel (heads and MLP features split over `model`) and the attention
output and MLP output projections row-parallel (Megatron's layout; one all-reduce forward per
row-parallel output). The mesh is ambient (`mlperf_tf.parallel.current_mesh()`).
"""

from __future__ import annotations

import math

import keras
import tensorflow as tf

from benchmarks.flux1.config import PATCH, ModelConfig
from mlperf_tf.layers.matmul import token_matmul
from mlperf_tf.spmd import (
    REPLICATED,
    ColumnParallelDense,
    ModelAxis,
    RowParallelDense,
    add_split_weight,
    current_mesh,
    model_split,
)


def _fused_glorot(part_in: int, part_out: int, fused_in: int, fused_out: int):
    """Xavier-uniform of a fused [fused_in, fused_out] matrix for a [part_in, part_out] part of
    it (limit sqrt(6 / (fused_in + fused_out)), as `nn.init.xavier_uniform_` on the fused
    torch weight draws)."""
    scale = (part_in + part_out) / (fused_in + fused_out)
    return keras.initializers.VarianceScaling(scale=scale, mode="fan_avg", distribution="uniform")


def _normal(std: float):
    return keras.initializers.RandomNormal(stddev=std)


def layer_norm(x: tf.Tensor, epsilon: float) -> tf.Tensor:
    """LayerNorm over the last axis without affine parameters (`elementwise_affine=False`),
    computed in float32 and returned in `x`'s dtype."""
    x32 = tf.cast(x, tf.float32)
    mean, variance = tf.nn.moments(x32, axes=[-1], keepdims=True)
    return tf.cast((x32 - mean) * tf.math.rsqrt(variance + epsilon), x.dtype)


def pack_latents(latents: tf.Tensor) -> tf.Tensor:
    """[B, H, W, C] -> [B, (H/2)(W/2), C*2*2]: 2x2 patches, features ordered (c, ph, pw) as the
    reference's `b c (h ph) (w pw) -> b (h w) (c ph pw)`."""
    _, height, width, channels = latents.shape
    h, w = height // PATCH, width // PATCH
    x = tf.reshape(latents, [-1, h, PATCH, w, PATCH, channels])
    x = tf.transpose(x, [0, 1, 3, 5, 2, 4])  # [B, h, w, C, ph, pw]
    return tf.reshape(x, [-1, h * w, channels * PATCH * PATCH])


def unpack_latents(tokens: tf.Tensor, height: int, width: int) -> tf.Tensor:
    """The inverse of `pack_latents`: [B, (H/2)(W/2), C*4] -> [B, H, W, C]."""
    h, w = height // PATCH, width // PATCH
    channels = tokens.shape[-1] // (PATCH * PATCH)
    x = tf.reshape(tokens, [-1, h, w, channels, PATCH, PATCH])
    x = tf.transpose(x, [0, 1, 4, 2, 5, 3])  # [B, h, ph, w, pw, C]
    return tf.reshape(x, [-1, height, width, channels])


def position_ids(text_length: int, grid_h: int, grid_w: int) -> tf.Tensor:
    """[text_length + grid_h * grid_w, 3] float32 ids: text (0, 0, 0), then patches (0, row,
    col) in row-major order (`utils.py:create_position_encoding_for_latents`)."""
    rows, cols = tf.meshgrid(tf.range(grid_h), tf.range(grid_w), indexing="ij")
    image = tf.stack([tf.zeros_like(rows), rows, cols], axis=-1)
    image = tf.reshape(tf.cast(image, tf.float32), [grid_h * grid_w, 3])
    return tf.concat([tf.zeros([text_length, 3], tf.float32), image], axis=0)


def rope_angles(ids: tf.Tensor, axes_dim, theta: float) -> tf.Tensor:
    """[L, 3] ids -> [L, head_dim / 2] rotation angles: per axis i, ids[:, i] x theta^(-2j/a_i)
    for j < a_i / 2, the axes concatenated (`math.py:rope`, `EmbedND`)."""
    parts = []
    for axis, dim in enumerate(axes_dim):
        omega = 1.0 / (theta ** (tf.range(0, dim, 2, dtype=tf.float64) / dim))
        parts.append(ids[:, axis : axis + 1] * tf.cast(omega, tf.float32)[None, :])
    return tf.concat(parts, axis=-1)


def rope_rotation(angles: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
    """[L, D/2] angles -> float32 ([L, D] cos, [L, D] signed sin) for `apply_rope`: each cosine
    repeated for its pair, sines as (-sin, sin). Computed once per step and shared by every
    block (the angles depend only on the positions)."""
    cos, sin = tf.cos(angles), tf.sin(angles)
    length = tf.shape(angles)[0]
    cos = tf.reshape(tf.stack([cos, cos], axis=-1), [length, -1])
    sin = tf.reshape(tf.stack([-sin, sin], axis=-1), [length, -1])
    return cos, sin


def apply_rope(x: tf.Tensor, rotation: tuple[tf.Tensor, tf.Tensor]) -> tf.Tensor:
    """Rotates consecutive pairs (x[2j], x[2j+1]) of [B, H, L, D] by the angles of `rotation`
    (`rope_rotation`) in float32 (`math.py:apply_rope`), returned in `x`'s dtype:
    (x0, x1) -> (cos x0 - sin x1, sin x0 + cos x1), written as x cos + swap(x) sin with
    swap(x0, x1) = (x1, x0) and sin signed (-sin, sin): the same products and sums, in fewer
    ops (no slices and no stack on the activations)."""
    cos, sin = rotation
    shape = tf.shape(x)
    x32 = tf.cast(x, tf.float32)
    pairs = tf.reshape(x32, tf.concat([shape[:-1], [-1, 2]], 0))
    swapped = tf.reshape(tf.reverse(pairs, axis=[-1]), shape)
    return tf.cast(x32 * cos + swapped * sin, x.dtype)


def timestep_embedding(t: tf.Tensor, dim: int, max_period: float = 10_000.0,
                       time_factor: float = 1000.0) -> tf.Tensor:  # fmt: skip
    """[B] timesteps in [0, 1] -> [B, dim] float32 sinusoids [cos, sin] of 1000 t
    (`layers.py:timestep_embedding`)."""
    half = dim // 2
    freqs = tf.exp(-math.log(max_period) * tf.range(half, dtype=tf.float32) / half)
    args = time_factor * tf.cast(t, tf.float32)[:, None] * freqs[None]
    embedding = tf.concat([tf.cos(args), tf.sin(args)], axis=-1)
    if dim % 2:
        embedding = tf.pad(embedding, [[0, 0], [0, 1]])
    return embedding


def attention(q, k, v, rotation):
    """Joint attention of [B, H, L, D] q, k, v with rotary positions (`rope_rotation`);
    [B, L, H*D]. Scores and softmax in float32 (torch's fused kernel accumulates in float32)."""
    q, k = apply_rope(q, rotation), apply_rope(k, rotation)
    depth = q.shape[-1]
    scores = tf.matmul(tf.cast(q, tf.float32), tf.cast(k, tf.float32), transpose_b=True)
    weights = tf.nn.softmax(scores / math.sqrt(depth), axis=-1)
    out = tf.matmul(tf.cast(weights, v.dtype), v)  # [B, H, L, D]
    out = tf.transpose(out, [0, 2, 1, 3])
    return tf.reshape(out, [-1, out.shape[1], out.shape[2] * out.shape[3]])


class RMSNorm(keras.layers.Layer):
    """RMSNorm over the last axis with a learned scale (ones at init; `nn.RMSNorm`), in float32.

    The q/k norms run on each model shard's own heads, so the (replicated) scale's gradient on a
    shard is its heads' part: the scale passes through f (`ModelAxis.copy`: identity forward,
    one all-reduce of its [D] gradient over `model` backward), so every shard gets the sum.
    """

    def __init__(self, epsilon: float, **kwargs):
        super().__init__(**kwargs)
        self.epsilon = epsilon
        self.axis = ModelAxis(None, self)

    def build(self, input_shape):
        self.scale = self.add_weight(name="scale", shape=(input_shape[-1],), initializer="ones")

    def call(self, x):
        x32 = tf.cast(x, tf.float32)
        rms = tf.math.rsqrt(tf.reduce_mean(tf.square(x32), axis=-1, keepdims=True) + self.epsilon)
        scale = self.axis.copy(tf.cast(self.scale, tf.float32))
        return tf.cast(x32 * rms * scale, x.dtype)


class Modulation(keras.layers.Layer):
    """SiLU then a zero-initialized Dense: 3 (single) or 6 (double) [B, 1, h] modulations."""

    def __init__(self, hidden: int, count: int, **kwargs):
        super().__init__(**kwargs)
        self.count = count
        self.lin = keras.layers.Dense(count * hidden, kernel_initializer="zeros", name="lin")

    def build(self, input_shape):
        self.lin.build(input_shape)

    def call(self, vec):
        out = tf.expand_dims(self.lin(tf.nn.silu(vec)), 1)
        return tf.split(out, self.count, axis=-1)


class MLPEmbedder(keras.layers.Layer):
    """Dense, SiLU, Dense (N(0, std) kernels, zero biases)."""

    def __init__(self, hidden: int, std: float, **kwargs):
        super().__init__(**kwargs)
        self.in_layer = keras.layers.Dense(hidden, kernel_initializer=_normal(std), name="in")
        self.out_layer = keras.layers.Dense(hidden, kernel_initializer=_normal(std), name="out")

    def build(self, input_shape):
        self.in_layer.build(input_shape)
        self.out_layer.build((None, self.in_layer.units))

    def call(self, x):
        return self.out_layer(tf.nn.silu(self.in_layer(x)))


class _QKV(keras.layers.Layer):
    """Column-parallel q, k, v projections of one stream and their per-head RMSNorms.

    The f operator (`ModelAxis.copy`) runs once on the input: one all-reduce of its gradient
    over `model` backward for the three projections (and the single block's MLP input).

    The projections stay separate layers (so that each splits its own heads over `model`), but
    run as one MatMul over their concatenated kernels (this shard's parts), as the reference's
    fused `qkv` (and single blocks' `linear1`, with `extra`: the MLP input): at FLUX's small
    per-token widths the step is bound by op count, not FLOPs (`tools/peers/bench_flux.py`).
    """

    def __init__(self, config: ModelConfig, *, fused_out: int, bias: bool, **kwargs):
        super().__init__(**kwargs)
        h = config.hidden_size
        init = _fused_glorot(h, h, h, fused_out)
        self.q, self.k, self.v = (
            ColumnParallelDense(h, use_bias=bias, kernel_initializer=init, copy_input=False,
                                name=name)
            for name in ("q", "k", "v")
        )  # fmt: skip
        self.query_norm = RMSNorm(config.qk_norm_epsilon, name="query_norm")
        self.key_norm = RMSNorm(config.qk_norm_epsilon, name="key_norm")
        self.depth = config.head_dim

    def build(self, input_shape):
        for layer in (self.q, self.k, self.v):
            layer.build(input_shape)
        self.query_norm.build((None, self.depth))
        self.key_norm.build((None, self.depth))

    def call(self, x, extra: ColumnParallelDense | None = None):
        """x: the copied (f) input [B, L, h]; returns this shard's q, k, v [B, H/M, L, D] (and
        `extra`'s output [B, L, units/M] after them when given: it shares the input and the
        MatMul)."""
        layers = [self.q, self.k, self.v] + ([extra] if extra is not None else [])
        dtype = self.compute_dtype
        kernel = tf.concat([tf.cast(layer.kernel, dtype) for layer in layers], axis=1)
        y = token_matmul(x, kernel)
        biases = [tf.cast(layer.bias, dtype) if layer.use_bias else None for layer in layers]
        if any(b is not None for b in biases):
            widths = [layer.kernel.shape[1] for layer in layers]
            y = y + tf.concat(
                [b if b is not None else tf.zeros([w], dtype) for b, w in zip(biases, widths)], 0
            )
        width = self.q.kernel.shape[1]  # this shard's heads x depth
        if extra is not None:  # split, not sliced: a slice's gradient is a slow StridedSliceGrad
            qkv, rest = tf.split(y, [3 * width, y.shape[-1] - 3 * width], axis=-1)
        else:
            qkv = y
        qkv = tf.reshape(qkv, [-1, x.shape[1], 3, width // self.depth, self.depth])
        q, k, v = tf.unstack(tf.transpose(qkv, [2, 0, 3, 1, 4]))  # 3 x [B, H/M, L, D]
        out = (self.query_norm(q), self.key_norm(k), v)
        return out + (rest,) if extra is not None else out


class _Stream(keras.layers.Layer):
    """One stream (image or text) of a double block: modulation, attention projections, MLP."""

    def __init__(self, config: ModelConfig, **kwargs):
        super().__init__(**kwargs)
        h, m = config.hidden_size, config.mlp_hidden
        self.mod = Modulation(h, 6, name="mod")
        self.qkv = _QKV(config, fused_out=3 * h, bias=config.qkv_bias, name="attn")
        self.proj = RowParallelDense(h, name="proj")
        self.mlp_in = ColumnParallelDense(m, name="mlp_in")
        self.mlp_out = RowParallelDense(h, name="mlp_out")
        self.axis = ModelAxis(None, self)
        self.epsilon = config.norm_epsilon
        self.hidden, self.mlp_hidden = h, m

    def build(self, input_shape):
        vec = (None, self.hidden)
        self.mod.build(vec)
        self.qkv.build(input_shape)
        self.proj.build((None, None, self.hidden))
        self.mlp_in.build(input_shape)
        self.mlp_out.build((None, None, self.mlp_hidden))

    def prepare(self, x, vec):
        """Modulations and this shard's q, k, v of stream `x` [B, L, h]."""
        mods = self.mod(vec)
        shift, scale = mods[0], mods[1]
        modulated = (1 + scale) * layer_norm(x, self.epsilon) + shift
        return mods, self.qkv(self.axis.copy(modulated))

    def finish(self, x, mods, attn):
        """The residual updates after attention `attn` [B, L, h/M] (this shard's heads)."""
        _, _, gate1, shift2, scale2, gate2 = mods
        x = x + gate1 * self.proj(attn)
        hidden = (1 + scale2) * layer_norm(x, self.epsilon) + shift2
        return x + gate2 * self.mlp_out(tf.nn.gelu(self.mlp_in(hidden), approximate=True))


class DoubleStreamBlock(keras.layers.Layer):
    """Image and text streams with their own weights and one joint attention (text first)."""

    def __init__(self, config: ModelConfig, **kwargs):
        super().__init__(**kwargs)
        self.img = _Stream(config, name="img")
        self.txt = _Stream(config, name="txt")

    def build(self, input_shape):
        self.img.build(input_shape)
        self.txt.build(input_shape)

    def call(self, img, txt, vec, rotation):
        img_mods, (iq, ik, iv) = self.img.prepare(img, vec)
        txt_mods, (tq, tk, tv) = self.txt.prepare(txt, vec)
        joint = attention(
            tf.concat([tq, iq], 2), tf.concat([tk, ik], 2), tf.concat([tv, iv], 2), rotation
        )
        joint_txt, joint_img = tf.split(joint, [txt.shape[1], img.shape[1]], axis=1)
        img = self.img.finish(img, img_mods, joint_img)
        txt = self.txt.finish(txt, txt_mods, joint_txt)
        return img, txt


class _JointRowParallel(keras.layers.Layer):
    """The single block's `linear2` on [attention ; MLP activation]: two row-parallel kernels
    ([h/M, h] and [m/M, h] per shard) whose partial products are summed, then one all-reduce
    (g) over `model` forward; the bias is replicated and added after the sum."""

    def __init__(self, hidden: int, mlp_hidden: int, **kwargs):
        super().__init__(**kwargs)
        self.hidden, self.mlp_hidden = hidden, mlp_hidden
        self.mesh = current_mesh()
        self.axis = ModelAxis(None, self)

    def build(self, input_shape):
        h, m = self.hidden, self.mlp_hidden
        self.attn_kernel = add_split_weight(
            self, name="attn_kernel", shape=(h, h), initializer=_fused_glorot(h, h, h + m, h),
            layout=model_split(0), mesh=self.mesh,
        )  # fmt: skip
        self.mlp_kernel = add_split_weight(
            self, name="mlp_kernel", shape=(m, h), initializer=_fused_glorot(m, h, h + m, h),
            layout=model_split(0), mesh=self.mesh,
        )  # fmt: skip
        self.bias = add_split_weight(
            self, name="bias", shape=(h,), initializer="zeros", layout=REPLICATED, mesh=self.mesh
        )

    def call(self, attn, mlp):
        """One MatMul of [attention ; MLP] by [attn_kernel ; mlp_kernel] (the reference's
        `linear2` on its concatenation): the same sum of products as two MatMuls and an add,
        in fewer ops."""
        dtype = self.compute_dtype
        kernel = tf.concat([tf.cast(self.attn_kernel, dtype), tf.cast(self.mlp_kernel, dtype)], 0)
        partial = token_matmul(tf.concat([attn, mlp], axis=-1), kernel)
        return self.axis.reduce(partial) + tf.cast(self.bias, dtype)


class SingleStreamBlock(keras.layers.Layer):
    """Parallel attention and MLP on the joined sequence (ViT-22B's layout, adaLN-modulated)."""

    def __init__(self, config: ModelConfig, **kwargs):
        super().__init__(**kwargs)
        h, m = config.hidden_size, config.mlp_hidden
        self.mod = Modulation(h, 3, name="modulation")
        self.qkv = _QKV(config, fused_out=3 * h + m, bias=True, name="attn")
        self.mlp_in = ColumnParallelDense(
            m, kernel_initializer=_fused_glorot(h, m, h, 3 * h + m), copy_input=False,
            name="mlp_in",
        )  # fmt: skip
        self.linear2 = _JointRowParallel(h, m, name="linear2")
        self.axis = ModelAxis(None, self)
        self.epsilon = config.norm_epsilon
        self.hidden = h

    def build(self, input_shape):
        self.mod.build((None, self.hidden))
        self.qkv.build(input_shape)
        self.mlp_in.build(input_shape)
        self.linear2.build(input_shape)

    def call(self, x, vec, rotation):
        shift, scale, gate = self.mod(vec)
        modulated = self.axis.copy((1 + scale) * layer_norm(x, self.epsilon) + shift)
        q, k, v, mlp = self.qkv(modulated, extra=self.mlp_in)
        attn = attention(q, k, v, rotation)
        mlp = tf.nn.gelu(mlp, approximate=True)
        return x + gate * self.linear2(attn, mlp)


class LastLayer(keras.layers.Layer):
    """adaLN (shift, scale; zero-initialized), LayerNorm, zero-initialized output projection."""

    def __init__(self, config: ModelConfig, **kwargs):
        super().__init__(**kwargs)
        h = config.hidden_size
        self.ada = keras.layers.Dense(2 * h, kernel_initializer="zeros", name="adaLN_modulation")
        self.linear = keras.layers.Dense(
            config.in_channels, kernel_initializer="zeros", name="linear"
        )
        self.epsilon = config.norm_epsilon
        self.hidden = h

    def build(self, input_shape):
        self.ada.build((None, self.hidden))
        self.linear.build(input_shape)

    def call(self, x, vec):
        shift, scale = tf.split(self.ada(tf.nn.silu(vec)), 2, axis=-1)
        x = (1 + tf.expand_dims(scale, 1)) * layer_norm(x, self.epsilon) + tf.expand_dims(shift, 1)
        return self.linear(x)


class FluxModel(keras.Model):
    """The MMDiT: `{"latents" [B, H, W, C], "t5" [B, T, context], "clip" [B, vec],
    "timesteps" [B]}` -> the predicted velocity [B, H, W, C].

    Built by `build_all` from the config (no call: under model parallelism a call needs
    replica context).
    """

    def __init__(self, config: ModelConfig, **kwargs):
        super().__init__(**kwargs)
        self.config = config
        h, std = config.hidden_size, config.init_std
        self.img_in = keras.layers.Dense(h, kernel_initializer="glorot_uniform", name="img_in")
        self.txt_in = keras.layers.Dense(h, kernel_initializer="glorot_uniform", name="txt_in")
        self.time_in = MLPEmbedder(h, std, name="time_in")
        self.vector_in = MLPEmbedder(h, std, name="vector_in")
        self.double_blocks = [
            DoubleStreamBlock(config, name=f"double_{i}") for i in range(config.depth)
        ]
        self.single_blocks = [
            SingleStreamBlock(config, name=f"single_{i}") for i in range(config.depth_single_blocks)
        ]
        self.final_layer = LastLayer(config, name="final_layer")

    def build_all(self) -> FluxModel:
        c = self.config
        hidden = (None, None, c.hidden_size)
        self.img_in.build((None, None, c.in_channels))
        self.txt_in.build((None, None, c.context_in_dim))
        self.time_in.build((None, c.time_embedding_dim))
        self.vector_in.build((None, c.vec_in_dim))
        for block in self.double_blocks + self.single_blocks:
            block.build(hidden)
        self.final_layer.build(hidden)
        self.built = True
        return self

    def call(self, inputs, training=False):
        del training  # no dropout
        c = self.config
        latents = inputs["latents"]
        height, width = latents.shape[1], latents.shape[2]
        dtype = self.compute_dtype
        img = self.img_in(tf.cast(pack_latents(latents), dtype))
        txt = self.txt_in(tf.cast(inputs["t5"], dtype))
        vec = self.time_in(tf.cast(timestep_embedding(inputs["timesteps"], c.time_embedding_dim),
                                   dtype))  # fmt: skip
        vec = vec + self.vector_in(tf.cast(inputs["clip"], dtype))
        text_length = txt.shape[1]
        ids = position_ids(text_length, height // PATCH, width // PATCH)
        rotation = rope_rotation(rope_angles(ids, c.axes_dim, c.theta))  # once per step
        for block in self.double_blocks:
            img, txt = block(img, txt, vec, rotation)
        x = tf.concat([txt, img], axis=1)
        for block in self.single_blocks:
            x = block(x, vec, rotation)
        out = self.final_layer(tf.split(x, [text_length, img.shape[1]], axis=1)[1], vec)
        return unpack_latents(out, height, width)


def build_model(config: ModelConfig) -> FluxModel:
    """A built `FluxModel` of `config` (the run's mesh is the ambient one)."""
    return FluxModel(config, name="flux").build_all()
