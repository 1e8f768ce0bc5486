"""Provides the hybrid linear/full-attention decoder of the Qwen3-Next / Qwen3.5 family:
`HybridDecoderConfig`, `HybridDecoderBlock` and `HybridDecoderModel`.

Layer i mixes tokens with a `GatedDeltaNet` (linear attention) unless `(i + 1) %
full_attention_interval == 0`, where it uses gated attention (`Attention` with `output_gate`,
QK-norm and RoPE on the first `rotary_dim` features); Hugging Face's default `layer_types`
(Qwen3.5-397B-A17B: 15 blocks of 3 DeltaNet layers and 1 attention layer). The feed-forward is
the MoE of `DecoderConfig.moe` plus, with `shared_expert_size`, one shared SwiGLU expert every
token passes through, scaled by sigmoid(a learned [hidden, 1] gate) (Hugging Face's
`Qwen3NextSparseMoeBlock` / `Qwen3_5MoeSparseMoeBlock`). `freeze_router` makes the routers'
kernels non-trainable (the MLPerf GRPO recipe's `freeze_moe_router`).

Parallelism, from the ambient mesh as every `mlperf_tf.lm` block: `model` splits the gated
attention by heads (`Attention`), the DeltaNet by heads (`GatedDeltaNet`), the shared expert as a
Megatron feed-forward, the embedding and the head by vocabulary; `expert` splits the routed
experts (`mlperf_tf.layers.moe`); the shared expert's [hidden, 1] gate is replicated.

Norms: Hugging Face's Qwen3.5 RMSNorms scale by (1 + w) from w = 0; ours scale by s from s = 1
(the same function, s = 1 + w: a checkpoint importer adds 1); the DeltaNet's gated norm is
plain w in both.
"""

from __future__ import annotations

import dataclasses

import keras
import tensorflow as tf

from mlperf_tf.config import ConfigError, require
from mlperf_tf.lm.attention import Attention
from mlperf_tf.lm.config import DecoderConfig
from mlperf_tf.lm.decoder import DecoderBlock, DecoderModel
from mlperf_tf.lm.feed_forward import FeedForward
from mlperf_tf.lm.gated_deltanet import GatedDeltaNet
from mlperf_tf.lm.layers import Linear
from mlperf_tf.lm.rope import RotaryEmbedding
from mlperf_tf.parallel.context import current_mesh
from mlperf_tf.parallel.layout import check_divides


@dataclasses.dataclass(frozen=True, kw_only=True)
class HybridDecoderConfig(DecoderConfig):
    """`DecoderConfig` with linear-attention layers, gated attention and a shared expert.

    Attributes (beyond `DecoderConfig`'s; Hugging Face's `Qwen3_5MoeTextConfig` names):
      full_attention_interval: every N-th layer (1-based) is full attention, the rest DeltaNet.
      linear_num_key_heads, linear_num_value_heads, linear_key_head_dim,
        linear_value_head_dim, linear_conv_kernel_dim: the DeltaNet layers' shape.
      linear_chunk_size: the chunked form's chunk (training and prefill).
      rotary_dim: the features of each query/key head RoPE rotates (head_dim * Hugging Face's
        `partial_rotary_factor`).
      attention_output_gate: the attention layers' sigmoid output gate.
      shared_expert_size: the shared expert's width (0: none).
      freeze_router: the MoE routers are not trained.
    """

    full_attention_interval: int = 4
    linear_num_key_heads: int = 16
    linear_num_value_heads: int = 64
    linear_key_head_dim: int = 128
    linear_value_head_dim: int = 128
    linear_conv_kernel_dim: int = 4
    linear_chunk_size: int = 64
    rotary_dim: int = 64
    attention_output_gate: bool = True
    qk_norm: bool = True
    shared_expert_size: int = 0
    freeze_router: bool = False

    def __post_init__(self):
        super().__post_init__()
        require(
            self, prefix="model.",
            positive_int=("full_attention_interval", "linear_num_key_heads",
                          "linear_num_value_heads", "linear_key_head_dim",
                          "linear_value_head_dim", "linear_conv_kernel_dim",
                          "linear_chunk_size", "rotary_dim"),
            non_negative_int=("shared_expert_size",),
        )  # fmt: skip
        if self.linear_num_value_heads % self.linear_num_key_heads:
            raise ConfigError(
                f"`model.linear_num_value_heads` ({self.linear_num_value_heads}) must be a "
                f"multiple of `model.linear_num_key_heads` ({self.linear_num_key_heads})."
            )
        if self.rotary_dim > self.head_dim or self.rotary_dim % 2:
            raise ConfigError(
                f"`model.rotary_dim` ({self.rotary_dim}) must be even and at most "
                f"`model.head_dim` ({self.head_dim})."
            )

    def is_linear(self, index: int) -> bool:
        """Whether layer `index` (0-based) is a DeltaNet layer."""
        return (index + 1) % self.full_attention_interval != 0

    def linear_layers(self) -> int:
        return sum(self.is_linear(i) for i in range(self.num_hidden_layers))

    def deltanet_parameters(self) -> int:
        return GatedDeltaNet.parameter_count(
            hidden_size=self.hidden_size, num_key_heads=self.linear_num_key_heads,
            num_value_heads=self.linear_num_value_heads, key_head_dim=self.linear_key_head_dim,
            value_head_dim=self.linear_value_head_dim,
            conv_kernel_size=self.linear_conv_kernel_dim,
        )  # fmt: skip

    def attention_parameters(self) -> int:
        gate = self.hidden_size * self.num_attention_heads * self.head_dim
        return super().attention_parameters() + (gate if self.attention_output_gate else 0)

    def shared_expert_parameters(self) -> int:
        """The shared expert (gate, up, down) and its [hidden, 1] gate."""
        if not self.shared_expert_size:
            return 0
        return 3 * self.hidden_size * self.shared_expert_size + self.hidden_size

    def parameter_count(self) -> int:
        linear = self.linear_layers()
        return (
            super().parameter_count()
            - linear * self.attention_parameters()
            + linear * self.deltanet_parameters()
            + self.moe.count(self.num_hidden_layers) * self.shared_expert_parameters()
        )

    def active_parameter_count(self) -> int:
        return self.parameter_count() - self.moe.count(self.num_hidden_layers) * (
            self.moe_layer_parameters() - self.moe_active_parameters()
        )


class HybridDecoderBlock(DecoderBlock):
    """A `DecoderBlock` whose mixer is a `GatedDeltaNet` on linear layers and gated attention
    on the others, with the shared expert next to the MoE. Sublayers as `DecoderBlock`'s
    (`attention` is the DeltaNet on linear layers), plus `shared_expert`, `shared_expert_gate`."""

    def __init__(self, config: HybridDecoderConfig, *, index: int = 0, **kwargs):
        self.linear = config.is_linear(index)
        super().__init__(config, index=index, **kwargs)
        c = config
        self.shared_expert = None
        if c.shared_expert_size and self.is_moe:
            self.shared_expert = FeedForward.from_config(
                dataclasses.replace(c, intermediate_size=c.shared_expert_size),
                name="shared_expert",
            )
            self.shared_expert_gate = Linear(1, stddev=c.initializer_range, name="shared_gate")
        self.freeze_router = c.freeze_router and self.is_moe

    def make_mixer(self, config: HybridDecoderConfig, index: int):
        """A `GatedDeltaNet` on linear layers, gated attention on the others."""
        c = config
        if not c.is_linear(index):
            return Attention.from_config(c, index, name="attention")
        return GatedDeltaNet(
            hidden_size=c.hidden_size, num_key_heads=c.linear_num_key_heads,
            num_value_heads=c.linear_num_value_heads, key_head_dim=c.linear_key_head_dim,
            value_head_dim=c.linear_value_head_dim, conv_kernel_size=c.linear_conv_kernel_dim,
            chunk_size=c.linear_chunk_size, norm_epsilon=c.rms_norm_eps,
            stddev=c.initializer_range, name="attention",
        )  # fmt: skip

    def build(self, input_shape):
        super().build(input_shape)
        hidden = (None, None, input_shape[-1])
        if self.shared_expert is not None:
            self.shared_expert.build(hidden)
            self.shared_expert_gate.build(hidden)
        if self.freeze_router:
            self.mlp.router_kernel.trainable = False

    def mix(self, x, cos, sin, cache=None):
        """The token mixer on normed `x`; with `cache` (DeltaNet layers) also the new cache."""
        if self.linear:
            return self.attention(x, cache=cache) if cache is not None else self.attention(x)
        return self.attention(x, cos, sin)

    def call(self, x, cos, sin, training=False, aux=None):
        x = x + self.mix(self.attention_norm(x), cos, sin)
        return self.feed_forward(x, training=training, aux=aux)

    def feed_forward(self, x, training=False, aux=None):
        """x + the MoE (and shared expert) or dense block of norm(x)."""
        normed = self.mlp_norm(x)
        if not self.is_moe:
            return x + self.mlp(normed)
        y, stats = self.mlp(normed, training=training)
        if aux is not None:
            aux.add(self.mlp, stats)
        if self.shared_expert is not None:
            gate = keras.ops.sigmoid(self.shared_expert_gate(normed))
            y = y + gate * self.shared_expert(normed)
        return x + y

    def empty_cache(self, batch: int, capacity: int = 0):
        """The DeltaNet's (conv, recurrent) state or the attention's empty (k, v) (growing, or
        of fixed `capacity`)."""
        if self.linear:
            return self.attention.empty_cache(batch)
        return self.attention.empty_cache(batch, capacity)

    def decode(self, x, cos, sin, cache, key_valid, position=None, real=None):
        """The block on new tokens after `cache` (generation); returns (x, new cache).
        `position`: `Attention.decode`'s (a fixed-capacity cache's slot, or each row's);
        `real`: `GatedDeltaNet`'s (right padding leaves its cache unchanged)."""
        normed = self.attention_norm(x)
        if self.linear:
            y, cache = self.attention(normed, cache=cache, real=real)
        else:
            y, cache = self.attention.decode(normed, cos, sin, cache, key_valid, position)
        return self.feed_forward(x + y), cache


class HybridDecoderModel(DecoderModel):
    """A `DecoderModel` of `HybridDecoderBlock`s; RoPE tables `rotary_dim` wide."""

    block_class = HybridDecoderBlock

    def __init__(self, config: HybridDecoderConfig, **kwargs):
        mesh = current_mesh()
        if mesh is not None and config.shared_expert_size:  # one line, before any weight
            check_divides(mesh, **{"model.shared_expert_size": config.shared_expert_size})
        super().__init__(config, **kwargs)
        self.rotary = RotaryEmbedding(config.rotary_dim, theta=config.rope_theta)

    def empty_cache(self, batch: int, capacity: int = 0) -> list:
        """Every layer's empty cache: O(1) recurrent state per DeltaNet layer, a key/value cache
        per attention layer (growing, or of fixed `capacity` tokens: compiled decoding)."""
        return [layer.empty_cache(batch, capacity) for layer in self.decoder_layers]

    def decode(self, token_ids, cache: list, key_valid, position=None):
        """Logits of new tokens given the cache of the tokens before them (generation).

        Sequences of a batch are left-padded to one length: `key_valid` [batch, past + new] is
        False at padding, whose embeddings are zeroed so that they leave every DeltaNet state
        at 0 and every residual at 0 (exact: a padded sequence's logits equal its unpadded
        ones); attention never shows padding keys to real queries, and RoPE is relative.

        Args:
          token_ids: [batch, new] int.
          cache: `empty_cache(batch)` or the cache a previous call returned.
          key_valid: bool [batch, past + new]; with `position`, [batch, capacity].
          position: None, or the first new token's slot in a fixed-capacity cache
            (`empty_cache(batch, capacity)`): a Python 0 for a prefill, an int32 scalar tensor
            for a step (every shape fixed: `mlperf_tf.rl.generation.CompiledGenerator` traces
            the step once).

        Returns:
          (logits [batch, new, vocab] float32, the new cache).
        """
        new = token_ids.shape[1]
        total = key_valid.shape[1]
        cos, sin = self.rotary_tables(total)
        if position is None:
            positions = tf.range(total - new, total)
        else:
            positions = position + tf.range(new)
        valid = tf.cast(tf.gather(key_valid, positions, axis=1), self.compute_dtype)[..., None]
        x = self.token_embedding(token_ids) * valid
        cos, sin = tf.gather(cos, positions), tf.gather(sin, positions)
        caches = []
        for layer, layer_cache in zip(self.decoder_layers, cache, strict=True):
            x, layer_cache = layer.decode(x, cos, sin, layer_cache, key_valid, position)
            caches.append(layer_cache)
        return tf.cast(self.logits(self.final_norm(x)), tf.float32), caches

    def extend(self, token_ids, cache: list, position, count):
        """Logits of new tokens continuing each row's own cache at its own length: rows of
        different lengths each extended by a different number of tokens (a multi-turn
        rollout's next observation, appended to the cache its earlier turns left).

        Row b's cache holds its first position[b] tokens, contiguous from slot 0 of a
        fixed-capacity cache (`empty_cache(batch, capacity)`: a fresh row is an empty one at
        position 0). Its new tokens are token_ids[b, :count[b]] (the rest right padding) at
        positions position[b] ..: RoPE at each row's own positions, attention causal per row,
        and padding leaves every cache as it was (the DeltaNet's state, decay and conv state
        held by `GatedDeltaNet`'s `real`; the attention's slots past a row's length are never
        shown to it). A row's logits are those of its tokens alone (no left padding anywhere).

        Args:
          token_ids: [batch, new] int.
          cache: the fixed-capacity cache.
          position: int32 [batch], each row's tokens in the cache.
          count: int32 [batch] in 0..new, each row's real new tokens (0: the row is unchanged).

        Returns:
          (logits [batch, new, vocab] float32 (padding's are meaningless), the new cache).
        """
        new = tf.shape(token_ids)[1]
        positions = position[:, None] + tf.range(new)[None, :]  # [batch, new]
        real = tf.range(new)[None, :] < count[:, None]  # [batch, new]
        x = self.token_embedding(token_ids) * tf.cast(real, self.compute_dtype)[..., None]
        cos, sin = self.rotary.tables_at(tf.reshape(positions, [-1]))
        shape = [tf.shape(positions)[0], new, cos.shape[-1]]
        cos, sin = tf.reshape(cos, shape), tf.reshape(sin, shape)  # [batch, new, rotary]
        caches = []
        for layer, layer_cache in zip(self.decoder_layers, cache, strict=True):
            x, layer_cache = layer.decode(x, cos, sin, layer_cache, None, position, real)
            caches.append(layer_cache)
        return tf.cast(self.logits(self.final_norm(x)), tf.float32), caches


def build_hybrid_decoder(config: HybridDecoderConfig, *, name: str = "decoder", **kwargs):
    """A built `HybridDecoderModel` (weights made in forward order, no forward pass)."""
    model = HybridDecoderModel(config, name=name, **kwargs)
    model.build((None, None))
    return model
