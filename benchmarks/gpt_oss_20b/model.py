"""Provides the GPT-OSS decoder: `mlperf_tf.lm`'s blocks in the MLPerf reference's configuration.

Megatron's GPT model as `small_llm_moe_pretraining/primus` configures it (README.md of this
package): pre-norm blocks `x + attention(norm(x))`, `x + moe(norm(x))`, a final RMSNorm and an
output projection untied from the input embedding. Attention is grouped-query (64 query heads,
8 key/value heads of 64), bias-free, with a per-head RMSNorm of queries and keys before plain
RoPE (Megatron's `qk_layernorm`, "rotate half" pairs), no sinks, and a sliding window of 129
keys (Megatron's `window_size: [128, 0]`) on layers 0, 2, ..., 22. Every feed-forward block is a
dropless mixture of 32 bias-free SwiGLU experts, top-4 on the router logits then a softmax over
the four (`mlperf_tf.layers.moe`, split over the mesh's `expert` axis under --expert_parallel).
Initialization is Megatron's: normal with std 0.008, the attention output and the experts'
down projections with 0.008 / sqrt(2 x 24) (`scaled_output_init`).
"""

from __future__ import annotations

from benchmarks.gpt_oss_20b.config import ModelConfig
from mlperf_tf.lm.decoder import DecoderModel, build_decoder

MODEL_NAME = "gpt_oss"


def build_model(config: ModelConfig, *, moe_group_size: int | None = None,
                collective_timeout_s: float = 0.0) -> DecoderModel:  # fmt: skip
    """A built GPT-OSS of `config` (named "gpt_oss": its variables' path prefix), on the
    ambient mesh."""
    return build_decoder(
        config, moe_group_size=moe_group_size, collective_timeout_s=collective_timeout_s,
        name=MODEL_NAME,
    )  # fmt: skip
