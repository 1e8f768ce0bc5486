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

import dataclasses

from benchmarks.qwen35_397b_grpo.config import ModelConfig
from mlperf_tf.errors import UserError
from mlperf_tf.lm.hybrid import HybridDecoderModel, build_hybrid_decoder
from mlperf_tf.lm.parametrization import ScaledWeights
from mlperf_tf.spmd import assign_whole, current_mesh, splits_weights, use_mesh


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
    """Loads weights an unscaled model saved (`sft.train_base`) into `model`, scaled or not.

    On an ambient mesh that splits the model (`--model_parallel`, `--expert_parallel`), whose
    variables hold shards that Keras' `load_weights` cannot fill with the file's whole tensors:
    the file goes into an unsplit twin (the plain model of the same config), and each variable
    takes its shard of the twin's whole tensor (`mlperf_tf.spmd.assign_whole`), then a scaled
    policy stores them divided by its scale, each replica its own shard.

    Raises:
      UserError: the twin's variables are not the model's (another model's weights).
    """
    mesh = current_mesh()
    if not splits_weights(mesh):
        if isinstance(model, ScaledPolicy):
            model.load_unscaled_weights(path)
        else:
            model.load_weights(path)
        return
    with use_mesh(None):
        twin = build_model(dataclasses.replace(model.config, weight_scale=1.0))
    twin.load_weights(path)
    whole = {v.path: v for v in twin.weights}
    if sorted(whole) != sorted(v.path for v in model.weights):
        raise UserError(f"{path}: its model's variables are not this policy's")
    for variable in model.weights:
        assign_whole(variable, whole[variable.path].numpy(), mesh)
    if isinstance(model, ScaledPolicy):
        model.store_scaled()
