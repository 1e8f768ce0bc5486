"""Provides `DecoderConfig`: the shape and options of a decoder-only language model.

One frozen dataclass covers the MLPerf LLMs (Llama 3.1 8B, Llama 2 70B, GPT-OSS 20B, DeepSeek-V3
style MoE); a benchmark's model config subclasses it and changes the defaults (so every field is
a typed `--config.model.*` override). Field names follow Hugging Face's `LlamaConfig` where it has
one. The blocks (`mlperf_tf.lm.decoder`) read nothing but this.
"""

from __future__ import annotations

import dataclasses
import types
from typing import Literal

from mlperf_tf.config import ConfigError, require
from mlperf_tf.errors import UserError
from mlperf_tf.layers.moe import MoEConfig
from mlperf_tf.parallel.pipeline import layer_maps, stage_bounds

ROPE_TYPES = ("default", "llama3", "yarn")
FEED_FORWARDS = ("swiglu", "swiglu_clamped")
# The decoder every language-model benchmark's tests and `smoke` preset shrink to: 2 layers,
# hidden 32, GQA 4/2 heads of 8 (a benchmark adds its vocabulary, widths and positions).
TINY_SHAPE = types.MappingProxyType(
    {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4,
     "num_key_value_heads": 2, "head_dim": 8}
)  # fmt: skip
# The width the grouped-query decoders' `mini` presets share (`llama31_8b`, `gpt_oss_20b`,
# `llama2_70b_lora`): hidden 256, GQA 4/2 heads of 64 (a benchmark adds its vocabulary, layers,
# feed-forward and positions). DeepSeek-V3's MLA and Qwen3.5's layers declare their own.
MINI_SHAPE = types.MappingProxyType(
    {
        "hidden_size": 256,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 64,
    }
)


@dataclasses.dataclass(frozen=True, kw_only=True)
class DecoderConfig:
    """A decoder-only transformer: pre-norm blocks `x + attention(norm(x))`, `x + ffn(norm(x))`,
    a final RMSNorm and an output projection (tied to the embedding or not).

    Attributes:
      vocab_size, hidden_size, num_hidden_layers: the model's size.
      num_attention_heads, num_key_value_heads, head_dim: grouped-query attention (query heads
        share key/value heads in groups of heads / kv_heads).
      intermediate_size: the dense SwiGLU width (and the experts' when `moe.filter_size` is 0).
      rms_norm_eps: RMSNorm's epsilon (every norm, QK-norm included).
      rope_theta: RoPE's base.
      rope_type: "default" (plain), "llama3" (Llama 3.1's frequency scaling) or "yarn"
        (`mlperf_tf.lm.rope`); "llama3" and "yarn" at `rope_scaling_factor` 1 are plain.
      rope_scaling_factor, rope_low_freq_factor, rope_high_freq_factor,
        rope_original_max_position: Llama 3.1's scaling (the last also YaRN's original context).
      rope_beta_fast, rope_beta_slow, rope_truncate: YaRN's ramp (Hugging Face's `rope_scaling`
        keys `beta_fast`, `beta_slow`, `truncate`).
      max_position_embeddings: the longest sequence the config accepts.
      initializer_range: std of the normal init of every projection and the embedding; the
        output projections of attention and the feed-forward (o, down) get
        `initializer_range / sqrt(2 * layers)` (Megatron's scaled init) when
        `scaled_output_init`.
      attention_bias: biases on q, k, v and o (GPT-OSS; Llama has none).
      fused_qkv: one q/k/v projection `qkv_proj` [hidden, (heads + 2 kv_heads) head_dim] in
        Megatron's grouped order (`mlperf_tf.lm.attention`), instead of q_proj/k_proj/v_proj.
      qk_norm: per-head RMSNorm of queries and keys before RoPE (Megatron's `qk_layernorm`).
      sliding_window: keys a windowed layer's query sees, itself included (0: none); which
        layers are windowed: `window_skip_freq` and `layer_window`.
      window_skip_freq: Megatron's `window_attn_skip_freq` as an int: with a window, every
        `window_skip_freq`-th layer (1-based) attends fully, the others are windowed (0: all
        windowed).
      window_pattern: Megatron's `window_attn_skip_freq` as a list: entry i says whether layer
        i is windowed (1) or full (0), repeated when shorter than the layers (e.g. (1, 0) windows
        the even layers); takes precedence over `window_skip_freq` when not empty.
      attention_sinks: a learned sink logit per query head in the softmax (GPT-OSS).
      feed_forward: "swiglu" (`down(silu(gate) * up)`) or "swiglu_clamped" (GPT-OSS:
        `down((clip(up) + 1) * g sigmoid(alpha g))`, g = gate clipped above at the limit).
      swiglu_limit, swiglu_alpha: the clamped form's limit and alpha (GPT-OSS: 7, 1.702).
      mlp_bias: biases on the feed-forward's projections (the dense block's and each MoE
        expert's: GPT-OSS's Hugging Face experts have them).
      tie_word_embeddings: the output projection is the input embedding's transpose.
      moe: mixture-of-experts feed-forward blocks (`mlperf_tf.layers.moe.MoEConfig`;
        num_experts 0: dense).
      attention: "gqa" (`mlperf_tf.lm.attention.Attention`) or "mla" (DeepSeek's multi-head
        latent attention, `mlperf_tf.lm.mla`; `head_dim` and `num_key_value_heads` unused).
      q_lora_rank, kv_lora_rank, qk_nope_head_dim, qk_rope_head_dim, v_head_dim: MLA's widths
        (Hugging Face's `DeepseekV3Config` names; q_lora_rank 0: no query latent).
      mtp_layers: multi-token prediction depth D (DeepSeek-V3: 1; `mlperf_tf.lm.mtp`).
      mtp_loss_weight: lambda, the MTP losses' weight (Megatron's `mtp_loss_scaling_factor`):
        the training loss adds lambda / D x the sum of the D depths' losses.
      pipeline_layers: the decoder layers of each pipeline stage, one "+"-joined map per
        stage count P (e.g. "16+16+16+13": P = 4, DeepSeek-V3's recipe); a P not declared
        takes equal runs and must divide the layers (`stage_bounds`).
    """

    vocab_size: int = 32_000
    hidden_size: int = 4096
    num_hidden_layers: int = 32
    num_attention_heads: int = 32
    num_key_value_heads: int = 8
    head_dim: int = 128
    intermediate_size: int = 14_336
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10_000.0
    rope_type: Literal["default", "llama3", "yarn"] = "default"
    rope_scaling_factor: float = 1.0
    rope_low_freq_factor: float = 1.0
    rope_high_freq_factor: float = 4.0
    rope_original_max_position: int = 8192
    rope_beta_fast: float = 32.0
    rope_beta_slow: float = 1.0
    rope_truncate: bool = True
    max_position_embeddings: int = 8192
    initializer_range: float = 0.02
    scaled_output_init: bool = True
    attention_bias: bool = False
    fused_qkv: bool = False
    qk_norm: bool = False
    sliding_window: int = 0
    window_skip_freq: int = 0
    window_pattern: tuple[int, ...] = ()
    attention_sinks: bool = False
    feed_forward: Literal["swiglu", "swiglu_clamped"] = "swiglu"
    swiglu_limit: float = 7.0
    swiglu_alpha: float = 1.702
    mlp_bias: bool = False
    tie_word_embeddings: bool = False
    moe: MoEConfig = MoEConfig()
    attention: Literal["gqa", "mla"] = "gqa"
    q_lora_rank: int = 0
    kv_lora_rank: int = 0
    qk_nope_head_dim: int = 0
    qk_rope_head_dim: int = 0
    v_head_dim: int = 0
    mtp_layers: int = 0
    mtp_loss_weight: float = 0.0
    pipeline_layers: tuple[str, ...] = ()

    def __post_init__(self):
        require(
            self,
            prefix="model.",
            positive_int=(
                "vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
                "num_key_value_heads", "head_dim", "intermediate_size",
                "rope_original_max_position", "max_position_embeddings",
            ),
            non_negative_int=("sliding_window", "window_skip_freq"),
            positive=(
                "rms_norm_eps", "rope_theta", "rope_scaling_factor", "initializer_range",
                "rope_beta_fast", "rope_beta_slow", "swiglu_limit", "swiglu_alpha",
            ),
        )  # fmt: skip
        if self.num_attention_heads % self.num_key_value_heads:
            raise ConfigError(
                f"`model.num_attention_heads` ({self.num_attention_heads}) must be divisible by "
                f"`model.num_key_value_heads` ({self.num_key_value_heads})."
            )
        if self.head_dim % 2:
            raise ConfigError(f"`model.head_dim` ({self.head_dim}) must be even (RoPE pairs).")
        if self.attention not in ("gqa", "mla"):
            raise ConfigError(f"`model.attention` ({self.attention!r}) must be 'gqa' or 'mla'.")
        require(
            self, prefix="model.",
            non_negative_int=("q_lora_rank", "kv_lora_rank", "qk_nope_head_dim",
                              "qk_rope_head_dim", "v_head_dim", "mtp_layers"),
            non_negative=("mtp_loss_weight",),
        )  # fmt: skip
        if self.attention == "mla":
            for name in ("kv_lora_rank", "qk_rope_head_dim", "v_head_dim"):
                if getattr(self, name) < 1:
                    raise ConfigError(f"`model.{name}` ({getattr(self, name)}) must be >= 1 (MLA).")
            if self.qk_rope_head_dim % 2:
                raise ConfigError(
                    f"`model.qk_rope_head_dim` ({self.qk_rope_head_dim}) must be even (RoPE pairs)."
                )
        if self.rope_type not in ROPE_TYPES:
            raise ConfigError(
                f"`model.rope_type` ({self.rope_type!r}) must be one of {', '.join(ROPE_TYPES)}."
            )
        try:
            layer_maps(self.pipeline_layers)
        except UserError as e:
            raise ConfigError(str(e)) from None
        if self.feed_forward not in FEED_FORWARDS:
            raise ConfigError(
                f"`model.feed_forward` ({self.feed_forward!r}) must be one of "
                f"{', '.join(FEED_FORWARDS)}."
            )
        if (
            self.rope_type == "llama3"
            and self.rope_scaling_factor != 1.0
            and not (0 < self.rope_low_freq_factor < self.rope_high_freq_factor)
        ):
            raise ConfigError(
                f"`model.rope_low_freq_factor` ({self.rope_low_freq_factor}) must be positive "
                f"and below `model.rope_high_freq_factor` ({self.rope_high_freq_factor})."
            )
        if any(v not in (0, 1) for v in self.window_pattern):
            raise ConfigError(
                f"`model.window_pattern` ({self.window_pattern!r}) must hold 0 (full attention) "
                "and 1 (windowed) per layer."
            )

    @classmethod
    def tiny(cls, vocab_size: int, **changes):
        """This config class at `TINY_SHAPE` with `vocab_size` and 256 positions: the decoder
        of the tests and `smoke` presets (`changes` set the rest, e.g. `intermediate_size`)."""
        return cls(**TINY_SHAPE, vocab_size=vocab_size, max_position_embeddings=256, **changes)

    # ---- per layer -----------------------------------------------------------------------------
    def layer_window(self, index: int) -> int:
        """Keys a query of layer `index` (0-based) sees, itself included (0: the whole causal
        prefix). Megatron's `is_layer_window_attention` with an int `window_attn_skip_freq`:
        layer number `index + 1` is full when it is a multiple of the frequency; with a
        `window_pattern`, its entry `index % len(pattern)` says. A subclass may override this
        for another pattern."""
        if not self.sliding_window:
            return 0
        if self.window_pattern:
            return (
                self.sliding_window if self.window_pattern[index % len(self.window_pattern)] else 0
            )
        if self.window_skip_freq and (index + 1) % self.window_skip_freq == 0:
            return 0
        return self.sliding_window

    def sliding_layers(self) -> int:
        """Layers that attend over a window."""
        return sum(bool(self.layer_window(i)) for i in range(self.num_hidden_layers))

    @property
    def output_init_std(self) -> float:
        """Init std of the o and down projections (Megatron: std / sqrt(2 layers) when scaled)."""
        if not self.scaled_output_init:
            return self.initializer_range
        return self.initializer_range / (2.0 * self.num_hidden_layers) ** 0.5

    # ---- sizes ---------------------------------------------------------------------------------
    @property
    def rope_head_dim(self) -> int:
        """The rotated width of a head (MLA: its decoupled rotary part)."""
        return self.qk_rope_head_dim if self.attention == "mla" else self.head_dim

    def mla_projections(self) -> int:
        """Weights of MLA's projections (no norms): q (a, b), kv_a, kv_b, o."""
        h, n = self.hidden_size, self.num_attention_heads
        qk = self.qk_nope_head_dim + self.qk_rope_head_dim
        q = (h * self.q_lora_rank + self.q_lora_rank * n * qk) if self.q_lora_rank else h * n * qk
        kv_a = h * (self.kv_lora_rank + self.qk_rope_head_dim)
        kv_b = self.kv_lora_rank * n * (self.qk_nope_head_dim + self.v_head_dim)
        return q + kv_a + kv_b + n * self.v_head_dim * h

    def attention_parameters(self) -> int:
        """Weights of one attention layer (q, k, v, o; biases, QK-norm scales, sinks; MLA: its
        projections and latent norms)."""
        if self.attention == "mla":
            return self.mla_projections() + self.q_lora_rank + self.kv_lora_rank
        h, d = self.hidden_size, self.head_dim
        q, kv = self.num_attention_heads * d, self.num_key_value_heads * d
        count = 2 * h * q + 2 * h * kv
        if self.attention_bias:
            count += q + 2 * kv + h
        if self.qk_norm:
            count += 2 * d
        if self.attention_sinks:
            count += self.num_attention_heads
        return count

    def dense_feed_forward_parameters(self) -> int:
        """Weights of one dense SwiGLU block (gate, up, down; biases)."""
        h, f = self.hidden_size, self.intermediate_size
        return 3 * h * f + ((2 * f + h) if self.mlp_bias else 0)

    def moe_layer_parameters(self) -> int:
        """Weights of one MoE feed-forward layer (router and every expert, biases included)."""
        return self.moe.layer_parameters(
            hidden_size=self.hidden_size, filter_size=self.intermediate_size,
            expert_mlp=self.feed_forward, expert_bias=self.mlp_bias,
        )  # fmt: skip

    def moe_active_parameters(self, biases: bool = True) -> int:
        """Weights one token uses in an MoE layer: the router, its top-k experts (their
        biases too unless `biases=False`, as the FLOPs count them) and the shared expert."""
        h, f = self.hidden_size, self.moe.filter_size or self.intermediate_size
        expert = 3 * h * f + ((2 * f + h) if biases and self.mlp_bias else 0)
        shared = 3 * h * self.moe.shared_filter_size
        return h * self.moe.num_experts + self.moe.top_k * expert + shared

    def block_parameters(self, index: int) -> int:
        """Weights of decoder block `index` (0-based; an MTP block is `num_hidden_layers + k`):
        attention, its two norms, the dense or MoE feed-forward."""
        ffn = (
            self.moe_layer_parameters()
            if self.moe.is_moe(index)
            else self.dense_feed_forward_parameters()
        )
        return self.attention_parameters() + 2 * self.hidden_size + ffn

    def mtp_parameters(self) -> int:
        """Weights of the multi-token prediction modules: per depth, a block (MoE when its
        index is), the two input norms, the [2h, h] projection and the output norm (the
        embedding and the output head are the model's, shared)."""
        h = self.hidden_size
        return sum(
            self.block_parameters(self.num_hidden_layers + k) + 3 * h + 2 * h * h
            for k in range(self.mtp_layers)
        )

    def stage_bounds(self, stages: int) -> list[tuple[int, int]]:
        """The [first, end) layers of each of `stages` pipeline stages: the declared map for
        that count (`pipeline_layers`) or equal runs.

        Raises:
          UserError: no map for `stages` and it does not divide the layers, or the map does
            not sum to them (one line).
        """
        return stage_bounds(self.num_hidden_layers, stages, self.pipeline_layers)

    def takes_pipeline(self, stages: int) -> bool:
        """Whether `stage_bounds(stages)` splits the layers (a layout search's filter)."""
        try:
            self.stage_bounds(stages)
        except UserError:
            return False
        return True

    def parameter_count(self) -> int:
        """Parameters of this shape, from the config alone (no weights are allocated)."""
        h = self.hidden_size
        embeddings = self.vocab_size * h * (1 if self.tie_word_embeddings else 2)
        blocks = sum(self.block_parameters(i) for i in range(self.num_hidden_layers))
        return blocks + embeddings + h + self.mtp_parameters()

    def active_parameter_count(self) -> int:
        """Parameters one token uses: `parameter_count` with each MoE layer's experts cut to the
        router and the top-k (the embedding counted, as GPT-OSS's model card counts it)."""
        layers = self.num_hidden_layers + self.mtp_layers
        moe_layers = self.moe.count(layers)
        return self.parameter_count() - moe_layers * (
            self.moe_layer_parameters() - self.moe_active_parameters()
        )

    def training_flops(self, seq: int) -> float:
        """Training FLOPs of one sequence of `seq` tokens (a multiply-add is 2; 3x forward).

        Forward: 2 FLOPs per weight of every projection (q, k, v, o, gate, up, down, output;
        MLA's q_a, q_b, kv_a, kv_b, o; the input embedding is a lookup, biases and norms are
        not counted) per token, plus attention's two products per layer, scores and context,
        2 x seq x seq x heads x width each per sequence (GQA: head_dim both; MLA: nope + rope
        for the scores, v_head_dim for the context): the full square, as the model computes
        it (masked, not skipped, windowed layers too). An MoE layer counts its router, top-k
        and shared experts only. Each MTP depth adds a block, its [2h, h] projection and the
        output projection again.
        """
        h, heads = self.hidden_size, self.num_attention_heads
        if self.attention == "mla":
            attention_weights = self.mla_projections()
            widths = self.qk_nope_head_dim + self.qk_rope_head_dim + self.v_head_dim
        else:
            q, kv = heads * self.head_dim, self.num_key_value_heads * self.head_dim
            attention_weights = 2 * h * q + 2 * h * kv
            widths = 2 * self.head_dim
        layers = self.num_hidden_layers + self.mtp_layers
        moe_layers = self.moe.count(layers)
        projections = (
            layers * attention_weights
            + (layers - moe_layers) * 3 * h * self.intermediate_size
            + moe_layers * self.moe_active_parameters(biases=False)
            + (1 + self.mtp_layers) * self.vocab_size * h  # the output projection (tied or not)
            + self.mtp_layers * 2 * h * h
        )
        attention = 2.0 * seq * seq * heads * widths * layers
        return 3.0 * (2.0 * seq * projections + attention)
