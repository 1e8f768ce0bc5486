"""Provides the DeepSeek-V3 decoder: `mlperf_tf.lm`'s blocks in the MLPerf reference's
configuration.

Megatron-Bridge's DeepSeek-V3 as `llm_moe_pretraining/nemo/` trains it (README.md of this
package): pre-norm blocks `x + mla(norm(x))`, `x + ffn(norm(x))`, a final RMSNorm and an output
projection untied from the input embedding. Attention is multi-head latent attention
(`mlperf_tf.lm.mla`: 128 heads, query latent 1,536, key/value latent 512, position-free width
128, a rotary part of 64 shared by the heads' keys, values of 128, YaRN factor 40). Blocks 0-2
have a dense SwiGLU of 18,432; blocks 3-60 DeepSeekMoE (`mlperf_tf.layers.moe`: 256 routed
experts of 2,048, top-8 of sigmoid scores with the selection bias, 4 of 8 groups, gates x 2.5,
one shared expert of 2,048, split over the mesh's `expert` axis under --expert_parallel). One
multi-token prediction depth (`mlperf_tf.lm.mtp`) with its own MoE block shares the embedding
and the output head.
"""

from __future__ import annotations

from benchmarks.deepseekv3_671b.config import ModelConfig
from mlperf_tf.lm.decoder import DecoderModel, build_decoder

MODEL_NAME = "deepseek_v3"


def build_model(config: ModelConfig, *, moe_group_size: int | None = None,
                collective_timeout_s: float = 0.0) -> DecoderModel:  # fmt: skip
    """A built DeepSeek-V3 of `config` (named "deepseek_v3": its variables' path prefix), on the
    ambient mesh."""
    return build_decoder(
        config, moe_group_size=moe_group_size, collective_timeout_s=collective_timeout_s,
        name=MODEL_NAME,
    )  # fmt: skip
