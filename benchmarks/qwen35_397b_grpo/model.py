"""Provides `build_model`: the Qwen3.5 policy (`mlperf_tf.lm.hybrid.HybridDecoderModel`) of a
`ModelConfig`, built under the ambient mesh without a forward pass."""

from __future__ import annotations

from benchmarks.qwen35_397b_grpo.config import ModelConfig
from mlperf_tf.lm.hybrid import HybridDecoderModel, build_hybrid_decoder


def build_model(config: ModelConfig) -> HybridDecoderModel:
    """The policy: DeltaNet and gated-attention layers, MoE with a shared expert, router frozen."""
    return build_hybrid_decoder(config, name="qwen35")
