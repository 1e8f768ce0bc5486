"""Provides `build_model`: the Qwen3.5 policy (`mlperf_tf.lm.hybrid.HybridDecoderModel`) of a
`ModelConfig`, built under the ambient mesh without a forward pass; and `ScaledPolicy`, the
`mini`'s parametrization of it (`ModelConfig.weight_scale`).

Why a parametrization: the closed rules fix the learning rate (1e-6 sqrt(GBS / 256)), which is
right for a 397 B model and moves a 1 M-parameter model nothing in a few dozen steps. With every
trainable weight stored as w / s and multiplied back by s in the forward pass, the function is
the same, the gradient of the stored value is s times the weight's, and Adam (invariant to the
gradient's scale, but for its epsilon) moves the stored value by the rules' rate, so the
effective weight moves as Adam at s times that rate would move it. The gradient clip then only
rescales the (s times larger) gradient before Adam normalizes it. The mechanism is shared
(`mlperf_tf.lm.parametrization`); this benchmark declares s (`ModelConfig.weight_scale`).
"""

from __future__ import annotations

from benchmarks.qwen35_397b_grpo.config import ModelConfig
from mlperf_tf.lm.hybrid import HybridDecoderModel, build_hybrid_decoder
from mlperf_tf.lm.parametrization import ScaledWeights


class ScaledPolicy(ScaledWeights, HybridDecoderModel):
    """`HybridDecoderModel` whose trainable weights are stored divided by `weight_scale`
    (`mlperf_tf.lm.parametrization.ScaledWeights`): its forward (`call`, `decode`, `extend`)
    reads each as its stored value times the scale, so it computes what the unscaled model of
    the effective weights computes (tested)."""

    scaled_methods = ("call", "decode", "extend")

    def __init__(self, config: ModelConfig, **kwargs):
        super().__init__(config, weight_scale=config.weight_scale, **kwargs)

    def load_unscaled_weights(self, path: str) -> None:
        """Loads weights saved by the unscaled model of the same shape (the `mini` base), then
        stores them divided by the scale."""
        self.load_weights(path)
        self.store_scaled()


def build_model(config: ModelConfig, *, moe_group_size: int | None = None,
                collective_timeout_s: float = 0.0) -> HybridDecoderModel:  # fmt: skip
    """The policy: DeltaNet and gated-attention layers, MoE with a shared expert, router frozen;
    a `ScaledPolicy` (its initial function the unscaled model's) when `weight_scale` is not 1.

    Built under the ambient mesh: its `expert` axis splits the routed experts (tokens by
    all-to-all; `moe_group_size`, the static tokens per replica, then required), its `model`
    axis the attention's and the DeltaNet's heads (`mlperf_tf.lm.hybrid`)."""
    kwargs = dict(moe_group_size=moe_group_size, collective_timeout_s=collective_timeout_s)
    if config.weight_scale == 1.0:
        return build_hybrid_decoder(config, name="qwen35", **kwargs)
    model = ScaledPolicy(config, name="qwen35", **kwargs)
    model.build((None, None))  # stores the initial weights divided by the scale
    return model


def load_base_weights(model, path: str) -> None:
    """Loads weights an unscaled model saved (`sft.train_base`) into `model`, scaled or not."""
    if isinstance(model, ScaledPolicy):
        model.load_unscaled_weights(path)
    else:
        model.load_weights(path)
