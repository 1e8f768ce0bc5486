"""Provides the Llama 3.1 decoder: `mlperf_tf.lm`'s blocks in Llama 3.1's configuration.

The layout is Meta's Llama 3.1 (Hugging Face `LlamaForCausalLM`, NeMo's `Llama31Config8B`):
RMSNorm, RoPE with Llama 3.1's frequency scaling, grouped-query attention with separate q/k/v
projections and no biases, SwiGLU, an output projection untied from the input embedding; every
option of `ModelConfig` (a `DecoderConfig`) beyond that stays off. Mixture of experts
(`config.moe`): every `moe.every`-th block's MLP is an `mlperf_tf.layers.MoEFeedForward` of
SwiGLU experts (Mixtral's block), split over the mesh's `expert` axis under `--expert_parallel`.
"""

from __future__ import annotations

from benchmarks.llama31_8b.config import ModelConfig
from mlperf_tf.lm.decoder import DecoderModel, build_decoder

MODEL_NAME = "llama"


def build_model(config: ModelConfig, *, moe_group_size: int | None = None,
                collective_timeout_s: float = 0.0) -> DecoderModel:  # fmt: skip
    """A built Llama of `config` (named "llama": its variables' path prefix), on the ambient
    mesh."""
    return build_decoder(
        config, moe_group_size=moe_group_size, collective_timeout_s=collective_timeout_s,
        name=MODEL_NAME,
    )  # fmt: skip
