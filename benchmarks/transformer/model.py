"""Provides the encoder-decoder Transformer of "Attention Is All You Need" as a Keras 3 model.

The layout follows the MLPerf reference (tensorflow/models `official/legacy/transformer`): one
embedding matrix shared by the source, the target and the pre-softmax projection, sinusoidal
positions, pre-layer-norm residual blocks with a final layer norm per stack, padding masks in
every attention and a causal mask in the decoder's self-attention. `init_cache`/`decode_step`
run the decoder one position at a time against a fixed-size cache (static shapes, so the
decoding loop compiles under XLA).

Tensor parallelism (the run's mesh has `model` = M > 1, Megatron's layout;
`mlperf_tf.layers.tensor_parallel`; the layers find the mesh themselves, `mlperf_tf.parallel.use_mesh`):
each attention splits its heads over the model shards (query/key/value column-parallel, the
output projection row-parallel), each feed-forward block its filter width, and the shared
embedding its vocabulary rows (a vocabulary-parallel lookup, and the tied softmax gives each
shard the logits of its own ids: `logits` returns [..., vocab/M], which the loss takes as they
are). Layer norms and the residual stream are replicated.

The attention core (`mlperf_tf.lm.attend`), the feed-forward projections (`mlperf_tf.lm.Linear`)
and the tied softmax (`mlperf_tf.lm.tied_logits`) are the language-model library's; the
encoder-decoder layout, positions, masks, caches and `[hidden, heads, depth]` kernels are this
model's.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import keras
import tensorflow as tf

from mlperf_tf.layers import PADDED, PackedTokens, token_matmul
from mlperf_tf.lm.attention import multi_head_attend
from mlperf_tf.lm.layers import Linear, tied_logits
from mlperf_tf.spmd import (
    ModelAxis,
    MoEConfig,
    add_split_weight,
    check_divides,
    model_split,
    vocab_parallel_lookup,
)

# Masks are boolean tensors (Keras casts float arguments of a layer call to the compute dtype,
# which would turn a float mask's -1e9 into -inf in float16); `attend` applies them to float32
# logits as NEG_INF (-1e9), so a fully masked row (an all-pad eval example) stays finite.
LAYER_NORM_EPSILON = 1e-6
PAD_ID = 0


@dataclasses.dataclass(frozen=True, kw_only=True)
class TransformerParams:
    """Shape and regularization of a Transformer.

    Attributes:
      vocab_size: subword vocabulary size (shared by source and target).
      hidden_size: model width (embedding and residual stream).
      num_layers: layers in the encoder and in the decoder (each).
      num_heads: attention heads; must divide hidden_size.
      filter_size: inner width of the position-wise feed-forward network.
      dropout: residual (post-processing) and embedding dropout rate.
      attention_dropout: dropout on the attention weights.
      relu_dropout: dropout after the feed-forward ReLU.
      moe: mixture-of-experts feed-forward blocks (`num_experts=0`: all dense); every
        `moe.every`-th block of the encoder and of the decoder is an `MoEFeedForward`.
      moe_group_size: static tokens per replica for the MoE capacity (None: each batch's count).
      collective_timeout_s: seconds an expert-parallel MoE layer's all-to-all may wait for its
        peers (the run's `--collective_timeout`; 0: no limit).
    """

    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    filter_size: int
    dropout: float = 0.1
    attention_dropout: float = 0.1
    relu_dropout: float = 0.1
    moe: MoEConfig = MoEConfig()
    moe_group_size: int | None = None
    collective_timeout_s: float = 0.0

    def __post_init__(self):
        for name in ("vocab_size", "hidden_size", "num_layers", "num_heads", "filter_size"):
            value = getattr(self, name)
            if not isinstance(value, int) or value <= 0:
                raise ValueError(f"`{name}` ({value!r}) must be a positive integer.")
        if self.hidden_size % self.num_heads:
            raise ValueError(
                f"`hidden_size` ({self.hidden_size}) must be divisible by "
                f"`num_heads` ({self.num_heads})."
            )
        if self.hidden_size % 2:
            raise ValueError(f"`hidden_size` ({self.hidden_size}) must be even (sin/cos halves).")
        for name in ("dropout", "attention_dropout", "relu_dropout"):
            value = getattr(self, name)
            if not 0.0 <= value < 1.0:
                raise ValueError(f"`{name}` ({value!r}) must be in [0, 1).")


def big(vocab_size: int) -> TransformerParams:
    """Transformer-big (MLPerf): 6+6 layers, hidden 1024, filter 4096, 16 heads, dropout 0.1."""
    return TransformerParams(
        vocab_size=vocab_size, hidden_size=1024, num_layers=6, num_heads=16, filter_size=4096
    )


def base(vocab_size: int) -> TransformerParams:
    """Transformer-base: 6+6 layers, hidden 512, filter 2048, 8 heads, dropout 0.1."""
    return TransformerParams(
        vocab_size=vocab_size, hidden_size=512, num_layers=6, num_heads=8, filter_size=2048
    )


def tiny(vocab_size: int) -> TransformerParams:
    """A tiny variant for tests and the smoke preset: 2+2 layers, hidden 32, 4 heads."""
    return TransformerParams(
        vocab_size=vocab_size, hidden_size=32, num_layers=2, num_heads=4, filter_size=64
    )


def position_encoding(length: int, hidden_size: int) -> tf.Tensor:
    """Sinusoidal position signal (sin half, then cos half), timescales 1 to 1e4.

    Returns:
      float32 tensor [length, hidden_size].
    """
    return position_signal(tf.range(length), hidden_size)


def position_signal(positions: tf.Tensor, hidden_size: int) -> tf.Tensor:
    """`position_encoding`'s rows at `positions` (int [n]): float32 [n, hidden_size]."""
    position = tf.cast(positions, tf.float32)
    num_timescales = hidden_size // 2
    log_increment = math.log(1.0e4) / max(num_timescales - 1, 1)
    inv_timescales = tf.exp(tf.range(num_timescales, dtype=tf.float32) * -log_increment)
    scaled_time = position[:, None] * inv_timescales[None, :]  # [length, hidden/2]
    return tf.concat([tf.sin(scaled_time), tf.cos(scaled_time)], axis=1)


def padding_mask(ids: tf.Tensor) -> tf.Tensor:
    """Attention mask, True where a key of `ids` [batch, length] is not pad: [batch, 1, 1, length]."""
    return tf.not_equal(ids, PAD_ID)[:, None, None, :]


def causal_mask(length) -> tf.Tensor:
    """Attention mask, True where key position <= query position: [1, 1, length, length]."""
    positions = tf.range(length)
    return (positions[None, :] <= positions[:, None])[None, None, :, :]


class SharedEmbedding(keras.layers.Layer):
    """Token embedding whose matrix also projects the decoder output to vocabulary logits.

    With `mesh.model` = M > 1 the matrix's vocabulary rows are split over `model` ([vocab/M,
    hidden] per shard): the lookup is vocabulary-parallel (g: one all-reduce forward, none
    backward) and `linear` gives this shard's logits [..., vocab/M] (f on its input: none
    forward, one all-reduce backward).
    """

    def __init__(self, vocab_size: int, hidden_size: int, **kwargs):
        super().__init__(**kwargs)
        self.vocab_size = vocab_size
        self.hidden_size = hidden_size
        self.axis = ModelAxis(None, self)

    def build(self, input_shape=None):
        self.shared_weights = add_split_weight(
            self, name="weights", shape=(self.vocab_size, self.hidden_size),
            initializer=keras.initializers.RandomNormal(stddev=self.hidden_size**-0.5),
            layout=model_split(0), mesh=self.axis.mesh,
        )  # fmt: skip
        super().build(input_shape)

    def call(self, ids, mode: str = "embedding"):
        """`embedding`: ids [batch, length] -> [batch, length, hidden] (scaled by sqrt(hidden)).

        `linear`: x [batch, length, hidden] -> logits [batch, length, vocab] (this shard's
        [..., vocab/M] under model parallelism).
        """
        weights = tf.cast(self.shared_weights, self.compute_dtype)
        if mode == "embedding":
            return vocab_parallel_lookup(weights, ids, self.axis) * (self.hidden_size**0.5)
        if mode == "linear":
            # A 2-D MatMul, not an einsum: its gradients profiled 1.2x cheaper (issue 14).
            return tied_logits(ids, weights, self.axis)
        raise ValueError(f"`mode` ({mode!r}) must be 'embedding' or 'linear'.")


class HeadsProjection(keras.layers.Layer):
    """Bias-free projection between [batch, length, hidden] and [batch, length, heads, depth].

    Keras `EinsumDense`'s kernel ([hidden, heads, depth] into the heads, [heads, depth, hidden]
    out of them), Glorot fans and seed, so the weights are the same; the product is one 2-D
    MatMul (`token_matmul`), where `EinsumDense`'s broadcast batch matmul cost 1.1 s of
    `BatchMatMulV2` and 0.2 s of `Sum` per Transformer-base step (issue 14).

    With `mesh.model` = M > 1 the heads are split over `model`: into the heads it is
    column-parallel (kernel [hidden, heads/M, depth]; its input is already copied by the
    attention's f), out of them row-parallel (kernel [heads/M, depth, hidden]; g: one all-reduce
    of the output forward, none backward).
    """

    def __init__(self, hidden_size: int, num_heads: int, to_heads: bool, **kwargs):
        super().__init__(**kwargs)
        self.hidden_size = hidden_size
        self.num_heads = num_heads
        self.depth = hidden_size // num_heads
        self.to_heads = to_heads
        self.axis = ModelAxis(None, self)
        self.local_heads = num_heads // self.axis.size
        # Built here, as EinsumDense builds its initializer, so the seeds drawn are the same.
        input_axes, output_axes = ([0], [1, 2]) if to_heads else ([0, 1], [2])
        self.kernel_initializer = keras.initializers.GlorotUniform(
            input_axes=input_axes, output_axes=output_axes
        )

    def build(self, input_shape=None):
        heads = (self.num_heads, self.depth)
        shape = (self.hidden_size, *heads) if self.to_heads else (*heads, self.hidden_size)
        self.kernel = add_split_weight(
            self, name="kernel", shape=shape, initializer=self.kernel_initializer,
            layout=model_split(1 if self.to_heads else 0), mesh=self.axis.mesh,
        )  # fmt: skip
        super().build(input_shape)

    def call(self, x):
        """[..., hidden] -> [..., heads, depth] if `to_heads`, else the reverse.

        The leading axes are the tokens: [batch, length] or, packed, [tokens].
        """
        # Row-major: [hidden, heads, depth] and [heads, depth, hidden] are both [hidden, hidden]
        # (this shard's heads: [hidden, local] and [local, hidden], local = heads/M * depth).
        local = self.local_heads * self.depth
        kernel = tf.cast(self.kernel, self.compute_dtype)
        if not self.to_heads:
            kernel = tf.reshape(kernel, [local, self.hidden_size])
            flat = tf.reshape(x, tf.concat([tf.shape(x)[:-2], [local]], 0))
            return self.axis.reduce(token_matmul(flat, kernel))
        y = token_matmul(x, tf.reshape(kernel, [self.hidden_size, local]))
        return tf.reshape(y, tf.concat([tf.shape(x)[:-1], [self.local_heads, self.depth]], 0))


class Attention(keras.layers.Layer):
    """Multi-head dot-product attention with an optional fixed-size decoding cache.

    Under model parallelism each shard attends with its heads/M heads: f (`ModelAxis.copy`)
    once on the query input and once on a different source (none forward, one all-reduce
    backward each), g in the output projection (one all-reduce forward).
    """

    def __init__(self, hidden_size: int, num_heads: int, dropout: float, **kwargs):
        super().__init__(**kwargs)
        self.hidden_size = hidden_size
        self.num_heads = num_heads
        self.depth = hidden_size // num_heads
        self.axis = ModelAxis(None, self)
        policy = self.dtype_policy

        def projection(name, to_heads=True):
            return HeadsProjection(hidden_size, num_heads, to_heads, name=name, dtype=policy)

        self.query_dense = projection("query")
        self.key_dense = projection("key")
        self.value_dense = projection("value")
        self.output_dense = projection("output_transform", to_heads=False)
        self.dropout_layer = keras.layers.Dropout(dropout, dtype=policy)

    def build(self, input_shape=None):
        for layer in (self.query_dense, self.key_dense, self.value_dense, self.output_dense):
            layer.build()
        super().build(input_shape)

    def project_kv(self, source):
        """Keys and values of `source` [batch, length, hidden]: each [batch, length, heads, depth]."""
        return self.key_dense(source), self.value_dense(source)

    def cache_kv(self, source):
        """Keys and values of `source` in the decoding caches' layout, [batch, heads, length, depth].

        Heads before positions: a decoding step's two attention products are then batched
        matmuls over the cache as it is stored. With the training path's [batch, length, heads,
        depth] the einsums transposed the whole cache twice per layer and step, and the cache
        (batch x beam rows x the decode length) is most of a step's memory traffic (issue 30).
        """
        return tuple(tf.transpose(t, [0, 2, 1, 3]) for t in self.project_kv(source))

    def _write_cache(self, cache, source, step, grow):
        """The self-attention cache with position `step` set to `source`'s key and value.

        A fixed-length cache (`init_cache(grow=False)`) is written with a select against the
        position: static shapes, XLA-friendly, one pass over the cache (the one-hot sum it
        replaced made three). A growing cache (`grow=True`) holds positions 0..step-1 and gets
        `step` appended, so every pass over it costs the positions decoded so far, not the
        length cap (dynamic shapes: not under XLA).
        """
        new_key, new_value = self.cache_kv(source)  # [b, n, 1, h]
        if grow:
            return {
                "k": tf.concat([cache["k"], new_key], axis=2),
                "v": tf.concat([cache["v"], new_value], axis=2),
            }
        at_step = (tf.range(cache["k"].shape[2]) == step)[None, None, :, None]
        return {
            "k": tf.where(at_step, new_key, cache["k"]),
            "v": tf.where(at_step, new_value, cache["v"]),
        }

    def _attend(self, query, key, value, mask, training):
        """`multi_head_attend` of `query` [batch, q_len, heads, depth] over keys and values
        [batch, heads, kv_len, depth] -> [batch, q_len, heads, depth]."""
        query = tf.transpose(query, [0, 2, 1, 3])  # [b, n, q, h]
        attended = multi_head_attend(
            query, key, value, mask=mask, dropout=self.dropout_layer, training=training
        )
        return tf.transpose(attended, [0, 2, 1, 3])  # [b, q, n, h]

    def call(
        self,
        query_input,
        source,
        mask,
        training=False,
        cache=None,
        step=None,
        query_tokens=PADDED,
        source_tokens=PADDED,
        grow=False,
    ):
        """Attends from `query_input` [batch, q_len, hidden] to `source` [batch, kv_len, hidden].

        Args:
          query_input: the queries' input.
          source: the keys'/values' input; unused when `cache` holds precomputed keys and values
            and `step` is None (encoder-decoder attention while decoding).
          mask: bool, True where a key is visible; broadcastable to [batch, heads, q_len, kv_len].
          training: enables attention dropout.
          cache: None, or {"k", "v"}: [batch, heads, kv_len, depth] (`cache_kv`).
          step: with `cache`, the int position this call writes (decoder self-attention while
            decoding one position: `query_input` and `source` are [batch, 1, hidden]).
          query_tokens, source_tokens: the layouts (`PaddedTokens`, `PackedTokens`) of
            `query_input` and `source`; packed inputs are [tokens, hidden].
          grow: with `step`, `cache` is a growing cache (`init_cache(grow=True)`): append.

        Returns:
          (output in the layout of `query_input`, the updated cache or None).
        """
        same_source = source is query_input
        query_input = self.axis.copy(query_input)
        if source is not None:
            source = query_input if same_source else self.axis.copy(source)
        query = query_tokens.unpack(self.query_dense(query_input) * (self.depth**-0.5))
        if cache is not None:  # decoding
            if step is not None:
                cache = self._write_cache(cache, source, step, grow)
            attended = self._attend(query, cache["k"], cache["v"], mask, training)
            return self.output_dense(query_tokens.pack(attended)), cache
        key, value = (
            tf.transpose(source_tokens.unpack(t), [0, 2, 1, 3]) for t in self.project_kv(source)
        )  # [b, n, kv, h]
        attended = self._attend(query, key, value, mask, training)
        return self.output_dense(query_tokens.pack(attended)), cache


class FeedForward(keras.layers.Layer):
    """Position-wise feed-forward network: dense ReLU (filter_size), dropout, dense (hidden).

    Megatron's MLP under model parallelism: the filter layer column-parallel (f: one all-reduce
    backward), the output layer row-parallel (g: one all-reduce forward); each shard holds
    filter_size/M of the width.
    """

    def __init__(self, hidden_size: int, filter_size: int, dropout: float, **kwargs):
        super().__init__(**kwargs)
        self.axis = ModelAxis(None, self)

        def dense(units, parallel, name):
            # The language-model library's projection, started as Keras' Dense starts it.
            return Linear(units, kernel_initializer="glorot_uniform", use_bias=True,
                          parallel=parallel, name=name, dtype=self.dtype_policy)  # fmt: skip

        self.filter_layer = dense(filter_size, "column", "filter_layer")
        self.output_layer = dense(hidden_size, "row", "output_layer")
        self.dropout_layer = keras.layers.Dropout(dropout, dtype=self.dtype_policy)
        self.hidden_size = hidden_size

    def build(self, input_shape=None):
        self.filter_layer.build((None, None, self.hidden_size))
        self.output_layer.build((None, None, self.filter_layer.units))
        super().build(input_shape)

    def call(self, x, training=False):
        hidden = tf.nn.relu(self.filter_layer(self.axis.copy(x)))
        hidden = self.dropout_layer(hidden, training=training)
        return self.output_layer(hidden)


def feed_forward(params: TransformerParams, index: int, policy):
    """Block `index`'s feed-forward layer: dense, or an `MoEFeedForward` per `params.moe` (its
    experts split over the run's `expert` axis, which it finds itself)."""
    p = params
    if not p.moe.is_moe(index):
        return FeedForward(p.hidden_size, p.filter_size, p.relu_dropout, name="ffn", dtype=policy)
    return p.moe.layer(
        hidden_size=p.hidden_size,
        filter_size=p.filter_size,
        dropout=p.relu_dropout,
        group_size=p.moe_group_size,
        collective_timeout_s=p.collective_timeout_s,
        name="moe_ffn",
        dtype=policy,
    )


def apply_ffn(ffn, x, training, aux):
    """`ffn(x)`; an MoE layer's stats go to `aux` (a `moe.Collector`, or None)."""
    y = ffn(x, training=training)
    if not isinstance(ffn, FeedForward):  # an MoEFeedForward: (y, stats)
        y, stats = y
        if aux is not None:
            aux.add(ffn, stats)
    return y


class EncoderLayer(keras.layers.Layer):
    """Pre-norm self-attention block and feed-forward block, each with a residual."""

    def __init__(self, params: TransformerParams, index: int = 0, **kwargs):
        super().__init__(**kwargs)
        p = params
        policy = self.dtype_policy
        self.attention_norm = keras.layers.LayerNormalization(
            epsilon=LAYER_NORM_EPSILON, name="attention_norm", dtype=policy
        )
        self.attention = Attention(
            p.hidden_size, p.num_heads, p.attention_dropout, name="self_attention",
            dtype=policy,
        )  # fmt: skip
        self.ffn_norm = keras.layers.LayerNormalization(
            epsilon=LAYER_NORM_EPSILON, name="ffn_norm", dtype=policy
        )
        self.ffn = feed_forward(p, index, policy)
        self.dropout_layer = keras.layers.Dropout(p.dropout, dtype=policy)
        self.hidden_size = p.hidden_size

    def build(self, input_shape=None):
        shape = (None, None, self.hidden_size)
        for layer in (self.attention_norm, self.attention, self.ffn_norm, self.ffn):
            layer.build(shape)
        super().build(input_shape)

    def call(self, x, mask, training=False, tokens=PADDED, aux=None):
        """`x`: [batch, length, hidden], or [tokens, hidden] when `tokens` is `PackedTokens`;
        `aux`: a `moe.Collector` of the MoE layer's stats, or None."""
        y = self.attention_norm(x)
        y, _ = self.attention(
            y, y, mask, training=training, query_tokens=tokens, source_tokens=tokens
        )
        x = x + self.dropout_layer(y, training=training)
        y = apply_ffn(self.ffn, self.ffn_norm(x), training, aux)
        return x + self.dropout_layer(y, training=training)


class DecoderLayer(keras.layers.Layer):
    """Pre-norm causal self-attention, encoder-decoder attention and feed-forward blocks."""

    def __init__(self, params: TransformerParams, index: int = 0, **kwargs):
        super().__init__(**kwargs)
        p = params
        policy = self.dtype_policy

        def norm(name):
            return keras.layers.LayerNormalization(
                epsilon=LAYER_NORM_EPSILON, name=name, dtype=policy
            )

        self.self_attention_norm = norm("self_attention_norm")
        self.self_attention = Attention(
            p.hidden_size, p.num_heads, p.attention_dropout, name="self_attention",
            dtype=policy,
        )  # fmt: skip
        self.encdec_attention_norm = norm("encdec_attention_norm")
        self.encdec_attention = Attention(
            p.hidden_size, p.num_heads, p.attention_dropout, name="encdec_attention",
            dtype=policy,
        )  # fmt: skip
        self.ffn_norm = norm("ffn_norm")
        self.ffn = feed_forward(p, index, policy)
        self.dropout_layer = keras.layers.Dropout(p.dropout, dtype=policy)
        self.hidden_size = p.hidden_size

    def build(self, input_shape=None):
        shape = (None, None, self.hidden_size)
        for layer in (
            self.self_attention_norm,
            self.self_attention,
            self.encdec_attention_norm,
            self.encdec_attention,
            self.ffn_norm,
            self.ffn,
        ):
            layer.build(shape)
        super().build(input_shape)

    def call(
        self,
        x,
        encoder_outputs,
        self_mask,
        encdec_mask,
        training=False,
        cache=None,
        encdec_cache=None,
        step=None,
        tokens=PADDED,
        encoder_tokens=PADDED,
        aux=None,
        grow=False,
    ):
        """One decoder layer; with the caches it decodes the single position `step`.

        Args:
          x: [batch, length, hidden] decoder stream.
          encoder_outputs: [batch, src_len, hidden]; unused when `encdec_cache` is given.
          self_mask: bool mask of the self-attention (causal).
          encdec_mask: bool mask of the encoder-decoder attention (source padding).
          training: enables dropout.
          cache: None, or the self-attention {"k", "v"} [batch, heads, max_len, depth].
          encdec_cache: None, or the encoder's {"k", "v"} [batch, heads, src_len, depth].
          step: the position written into `cache`.
          tokens, encoder_tokens: the layouts of `x` and of `encoder_outputs` (packed:
            [tokens, hidden]; see `PackedTokens`).
          aux: a `moe.Collector` of the MoE layer's stats, or None.
          grow: `cache` is a growing cache (`Attention`'s `grow`).

        Returns:
          (x in the layout of the input, the updated self-attention cache or None).
        """
        y = self.self_attention_norm(x)
        y, cache = self.self_attention(
            y,
            y,
            self_mask,
            training=training,
            cache=cache,
            step=step,
            query_tokens=tokens,
            source_tokens=tokens,
            grow=grow,
        )
        x = x + self.dropout_layer(y, training=training)
        y = self.encdec_attention_norm(x)
        y, _ = self.encdec_attention(
            y,
            encoder_outputs,
            encdec_mask,
            training=training,
            cache=encdec_cache,
            query_tokens=tokens,
            source_tokens=encoder_tokens,
        )
        x = x + self.dropout_layer(y, training=training)
        y = apply_ffn(self.ffn, self.ffn_norm(x), training, aux)
        return x + self.dropout_layer(y, training=training), cache


class Transformer(keras.Model):
    """Encoder-decoder Transformer with shared embedding/softmax weights.

    Call it on {"inputs": [batch, src_len], "targets": [batch, tgt_len]} int ids (0 = pad,
    targets end with EOS) to get teacher-forced logits [batch, tgt_len, vocab] in the compute
    dtype. Decoding uses `encode`, `init_cache` and `decode_step` (see `beam_search.py`).
    """

    def __init__(self, params: TransformerParams, **kwargs):
        """Built for the run's mesh (`mlperf_tf.parallel.current_mesh()`): its `model` axis
        M > 1 splits the model (M must divide num_heads, filter_size and vocab_size: `UserError`
        otherwise), its `expert` axis > 1 the experts of MoE blocks."""
        kwargs.setdefault("name", "transformer")
        super().__init__(**kwargs)
        self.params = params
        check_divides(
            **{"model.num_heads": params.num_heads, "model.filter_size": params.filter_size,
               "model.vocab_size": params.vocab_size}
        )  # fmt: skip
        self.axis = ModelAxis(None, self)
        policy = self.dtype_policy
        self.embedding = SharedEmbedding(
            params.vocab_size, params.hidden_size, name="embedding", dtype=policy
        )
        self.encoder_layers = [
            EncoderLayer(params, i, name=f"encoder_layer_{i}", dtype=policy)
            for i in range(params.num_layers)
        ]
        self.encoder_norm = keras.layers.LayerNormalization(
            epsilon=LAYER_NORM_EPSILON, name="encoder_norm", dtype=policy
        )
        self.decoder_layers = [
            DecoderLayer(params, i, name=f"decoder_layer_{i}", dtype=policy)
            for i in range(params.num_layers)
        ]
        self.decoder_norm = keras.layers.LayerNormalization(
            epsilon=LAYER_NORM_EPSILON, name="decoder_norm", dtype=policy
        )
        self.input_dropout = keras.layers.Dropout(params.dropout, dtype=policy)

    def build(self, input_shape=None):
        """Creates every variable (no data needed)."""
        hidden = (None, None, self.params.hidden_size)
        self.embedding.build((None, None))
        for layer in self.encoder_layers + self.decoder_layers:
            layer.build(hidden)
        self.encoder_norm.build(hidden)
        self.decoder_norm.build(hidden)
        super().build(input_shape)

    def _embed_with_positions(self, ids, training, tokens=PADDED):
        length = tf.shape(ids)[1]
        x = self.embedding(ids)  # [b, l, hidden]
        positions = position_encoding(length, self.params.hidden_size)
        x = x + tf.cast(positions, x.dtype)[None]
        return self.input_dropout(tokens.pack(x), training=training)

    @property
    def moe_layers(self) -> list:
        """The MoE feed-forward layers, encoder then decoder (the order of a `moe.Collector`)."""
        return [
            layer.ffn
            for layer in self.encoder_layers + self.decoder_layers
            if not isinstance(layer.ffn, FeedForward)
        ]

    def encode(self, inputs, training=False, tokens=PADDED, aux=None):
        """Encodes source ids [batch, src_len].

        Args:
          inputs: source ids [batch, src_len].
          training: enables dropout.
          tokens: `PADDED`, or `PackedTokens(inputs != PAD_ID)` to skip the padding.
          aux: a `moe.Collector` of the MoE layers' stats, or None.

        Returns:
          (encoder outputs [batch, src_len, hidden] (packed: [tokens, hidden]), padding mask
          [batch, 1, 1, src_len]).
        """
        mask = padding_mask(inputs)
        x = self._embed_with_positions(inputs, training, tokens)
        for layer in self.encoder_layers:
            x = layer(x, mask, training=training, tokens=tokens, aux=aux)
        return self.encoder_norm(x), mask

    def decode_states(
        self,
        targets,
        encoder_outputs,
        encdec_mask,
        training=False,
        tokens=PADDED,
        encoder_tokens=PADDED,
        aux=None,
    ):
        """Teacher-forced decoding up to the vocabulary: normalized states [batch, tgt_len, hidden].

        With `tokens=PackedTokens(targets != PAD_ID)` (and the encoder's layout in
        `encoder_tokens`) only the real target positions are computed: [tokens, hidden].
        `logits` turns states into next-token logits.
        """
        # Decoder input: targets shifted right by one; position 0 is the pad id (start symbol).
        decoder_inputs = tf.pad(targets, [[0, 0], [1, 0]])[:, :-1]
        length = tf.shape(decoder_inputs)[1]
        x = self._embed_with_positions(decoder_inputs, training, tokens)
        self_mask = causal_mask(length)
        for layer in self.decoder_layers:
            x, _ = layer(
                x,
                encoder_outputs,
                self_mask,
                encdec_mask,
                training=training,
                tokens=tokens,
                encoder_tokens=encoder_tokens,
                aux=aux,
            )
        return self.decoder_norm(x)

    def decode(self, targets, encoder_outputs, encdec_mask, training=False):
        """Teacher-forced decoding: logits [batch, tgt_len, vocab] for next-token prediction."""
        return self.logits(self.decode_states(targets, encoder_outputs, encdec_mask, training))

    def logits(self, states):
        """Vocabulary logits [..., vocab] of decoder states [..., hidden] (the tied projection).

        Under model parallelism: this shard's [..., vocab/M] (for the vocabulary-parallel loss).
        """
        return self.embedding(states, mode="linear")

    def full_logits(self, states):
        """`logits` over the whole vocabulary, [..., vocab]: under model parallelism the shards'
        logits are gathered (decoding needs them; training's loss never does)."""
        return self.axis.gather_last(self.logits(states))

    def teacher_forced_states(self, inputs, training=False, packed=False, aux=None):
        """`decode_states` of {"inputs", "targets"} ids: [batch, tgt_len, hidden].

        `packed`: skip the padding of both streams (`PackedTokens`); the states are then those
        of the real target positions, [tokens, hidden] in row-major order (as
        `tf.boolean_mask(targets, targets != PAD_ID)` orders them). Data-dependent shapes: not
        for XLA. `aux`: a `moe.Collector` of the MoE layers' stats, or None.
        """
        source, targets = inputs["inputs"], inputs["targets"]
        source_tokens = PackedTokens(tf.not_equal(source, PAD_ID)) if packed else PADDED
        target_tokens = PackedTokens(tf.not_equal(targets, PAD_ID)) if packed else PADDED
        encoder_outputs, mask = self.encode(
            source, training=training, tokens=source_tokens, aux=aux
        )
        return self.decode_states(
            targets,
            encoder_outputs,
            mask,
            training=training,
            tokens=target_tokens,
            encoder_tokens=source_tokens,
            aux=aux,
        )

    def call(self, inputs, training=False):
        return self.logits(self.teacher_forced_states(inputs, training=training))

    def init_cache(
        self, encoder_outputs, encdec_mask, max_decode_length: int, grow: bool = False
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        """The decoding state for `max_decode_length` positions.

        Args:
          encoder_outputs: [batch, src_len, hidden].
          encdec_mask: [batch, 1, 1, src_len] padding mask of the source.
          max_decode_length: static number of decoded positions.
          grow: the self-attention caches start empty (length 0) and grow by a position per
            step (dynamic shapes: the decoding loop must declare their length free, as
            `sequence_beam_search(retire_finished=True)` does); else they are zeros of length
            `max_decode_length` written in place (static shapes, XLA).

        Returns:
          `(cache, static)`, dicts of tensors with a leading batch dimension. `cache` changes every
          step and follows the beams: per layer the self-attention keys/values, zeros
          [batch, heads, max_decode_length, depth]. `static` does not change: per layer the
          encoder's keys/values [batch, heads, src_len, depth], computed once here, and
          "encdec_mask"; beam search tiles it once and never reorders it (every beam of a
          sentence shares it).
        """
        p = self.params
        batch = tf.shape(encoder_outputs)[0]
        depth = p.hidden_size // p.num_heads
        heads = p.num_heads // self.axis.size  # this shard's heads
        length = 0 if grow else max_decode_length
        zeros = tf.zeros([batch, heads, length, depth], encoder_outputs.dtype)
        cache, static = {}, {"encdec_mask": encdec_mask}
        for i, layer in enumerate(self.decoder_layers):
            attention = layer.encdec_attention
            enc_k, enc_v = attention.cache_kv(attention.axis.copy(encoder_outputs))
            cache[f"layer_{i}"] = {"k": zeros, "v": zeros}
            static[f"layer_{i}"] = {"k": enc_k, "v": enc_v}
        return cache, static

    def decode_step(self, ids, step, cache, static, grow: bool = False):
        """Logits for position `step` given the previous token.

        Args:
          ids: [batch, 1] the token at position `step - 1` (the pad id at step 0).
          step: scalar int, the position being predicted (0-based).
          cache: the `cache` of `init_cache` (or of the previous step).
          static: the `static` of `init_cache`.
          grow: `cache` comes from `init_cache(grow=True)` (it holds positions 0..step-1).

        Returns:
          (float32 logits [batch, vocab], the updated cache).
        """
        x = self.embedding(ids)  # [b, 1, hidden]
        signal = position_signal(tf.reshape(step, [1]), self.params.hidden_size)
        x = x + tf.cast(signal, x.dtype)[None]
        if grow:  # keys 0..step, all visible
            self_mask = tf.constant(True, shape=[1, 1, 1, 1])
        else:  # row `step` of the causal mask over the fixed-length cache
            self_mask = (tf.range(cache["layer_0"]["k"].shape[2]) <= step)[None, None, None, :]
        new_cache = {}
        for i, layer in enumerate(self.decoder_layers):
            x, new_cache[f"layer_{i}"] = layer(
                x,
                None,
                self_mask,
                static["encdec_mask"],
                training=False,
                cache=cache[f"layer_{i}"],
                encdec_cache=static[f"layer_{i}"],
                step=step,
                grow=grow,
            )
        logits = self.full_logits(self.decoder_norm(x))  # [b, 1, vocab]
        return tf.cast(logits[:, 0, :], tf.float32), new_cache
