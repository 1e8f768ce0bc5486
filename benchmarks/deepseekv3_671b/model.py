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
and the output head. `ScaledDeepseekV3` is the `mini`'s parametrization of it
(`ModelConfig.weight_scale`, `mlperf_tf.lm.parametrization`).
"""

from __future__ import annotations

import functools
from collections.abc import Callable

from benchmarks.deepseekv3_671b.config import ModelConfig
from mlperf_tf.lm.decoder import DecoderModel, build_decoder
from mlperf_tf.lm.parametrization import ScaledWeights

MODEL_NAME = "deepseek_v3"


class ScaledDeepseekV3(ScaledWeights, DecoderModel):
    """DeepSeek-V3 whose trainable weights are stored divided by `weight_scale`: its forward
    (`call`; `with_mtp`, the training forward with the MTP depths) reads each as s times its
    stored value, the plain model's function (tested)."""

    scaled_methods = ("call", "with_mtp")


def decoder_class(config: ModelConfig) -> Callable[..., DecoderModel]:
    """`DecoderModel`, or `ScaledDeepseekV3` at `config.weight_scale` when it is not 1."""
    if config.weight_scale == 1.0:
        return DecoderModel
    return functools.partial(ScaledDeepseekV3, weight_scale=config.weight_scale)


def build_model(config: ModelConfig, *, moe_group_size: int | None = None,
                collective_timeout_s: float = 0.0) -> DecoderModel:  # fmt: skip
    """A built DeepSeek-V3 of `config` (named "deepseek_v3": its variables' path prefix), on the
    ambient mesh; its initial function the plain model's at any `weight_scale`."""
    return build_decoder(
        config, moe_group_size=moe_group_size, collective_timeout_s=collective_timeout_s,
        name=MODEL_NAME, model_class=decoder_class(config),
    )  # fmt: skip
