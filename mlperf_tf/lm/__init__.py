"""Provides the language-model block library: `DecoderConfig` (one config for the MLPerf LLMs'
options), the blocks (`Attention` and its core `attend`, `FeedForward`, `moe_feed_forward`,
`DecoderBlock`, `DecoderModel`, `build_decoder`, `GatedDeltaNet`; `Linear`, `RMSNorm`, `RotaryEmbedding`,
`tied_logits`), the masked token loss (`mlperf_tf.lm.loss`) and `LanguageModelBenchmark`, the
base of the causal-LM benchmarks. See README.md."""

from mlperf_tf.lm.attention import Attention, attend, fuse_qkv, multi_head_attend, split_qkv
from mlperf_tf.lm.config import DecoderConfig
from mlperf_tf.lm.decoder import DecoderBlock, DecoderModel, build_decoder
from mlperf_tf.lm.feed_forward import FeedForward, clamped_swiglu, moe_feed_forward, swiglu
from mlperf_tf.lm.gated_deltanet import GatedDeltaNet
from mlperf_tf.lm.layers import Linear, RMSNorm, tied_logits
from mlperf_tf.lm.rope import RotaryEmbedding, apply_rope

__all__ = [
    "Attention",
    "DecoderBlock",
    "DecoderConfig",
    "DecoderModel",
    "FeedForward",
    "GatedDeltaNet",
    "Linear",
    "RMSNorm",
    "RotaryEmbedding",
    "apply_rope",
    "attend",
    "build_decoder",
    "clamped_swiglu",
    "fuse_qkv",
    "moe_feed_forward",
    "multi_head_attend",
    "split_qkv",
    "swiglu",
    "tied_logits",
]
