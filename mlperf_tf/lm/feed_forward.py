"""Provides the language models' feed-forward blocks: `FeedForward`, dense SwiGLU (plain or
GPT-OSS's clamped form), tensor-parallel as Megatron splits it, and `moe_feed_forward`, the
mixture-of-experts block of a `DecoderConfig` (`mlperf_tf.layers.moe.MoEFeedForward`)."""

from __future__ import annotations

import keras

from mlperf_tf.layers import moe as moe_lib
from mlperf_tf.layers.activations import clamped_swiglu, swiglu
from mlperf_tf.layers.tensor_parallel import ModelAxis
from mlperf_tf.lm.layers import Linear

ACTIVATIONS = ("swiglu", "swiglu_clamped")


class FeedForward(keras.layers.Layer):
    """Dense gated feed-forward: down(act(gate(x), up(x))), act SwiGLU or clamped SwiGLU.

    Tensor parallelism: gate and up column-parallel (f once on the input), down row-parallel
    (g): intermediate/M units per shard.

    Args:
      hidden_size: the model width; intermediate_size: the gated width.
      stddev: init std of gate and up; output_stddev: of down.
      use_bias: biases on the three projections.
      activation: "swiglu" or "swiglu_clamped" (`clamped_swiglu` with `limit`, `alpha`).
    """

    def __init__(self, *, hidden_size: int, intermediate_size: int, stddev: float,
                 output_stddev: float, use_bias: bool = False, activation: str = "swiglu",
                 limit: float = 7.0, alpha: float = 1.702, **kwargs):  # fmt: skip
        super().__init__(**kwargs)
        if activation not in ACTIVATIONS:
            raise ValueError(f"activation {activation!r} must be one of {ACTIVATIONS}")
        self.hidden_size = hidden_size
        self.intermediate_size = intermediate_size
        self.activation = activation
        self.limit = float(limit)
        self.alpha = float(alpha)
        self.axis = ModelAxis(None, self)
        f = intermediate_size
        self.gate_proj = Linear(f, stddev=stddev, use_bias=use_bias, parallel="column",
                                name="gate_proj")  # fmt: skip
        self.up_proj = Linear(f, stddev=stddev, use_bias=use_bias, parallel="column",
                              name="up_proj")  # fmt: skip
        self.down_proj = Linear(hidden_size, stddev=output_stddev, use_bias=use_bias,
                                parallel="row", name="down_proj")  # fmt: skip

    @classmethod
    def from_config(cls, config, **kwargs) -> FeedForward:
        """The dense block of a `DecoderConfig`."""
        c = config
        return cls(
            hidden_size=c.hidden_size, intermediate_size=c.intermediate_size,
            stddev=c.initializer_range, output_stddev=c.output_init_std, use_bias=c.mlp_bias,
            activation=c.feed_forward, limit=c.swiglu_limit, alpha=c.swiglu_alpha, **kwargs,
        )  # fmt: skip

    def build(self, input_shape):
        hidden = (None, None, input_shape[-1])
        self.gate_proj.build(hidden)
        self.up_proj.build(hidden)
        self.down_proj.build((None, None, self.intermediate_size))
        self.built = True

    def call(self, x):
        x = self.axis.copy(x)
        gate, up = self.gate_proj(x), self.up_proj(x)
        if self.activation == "swiglu_clamped":
            h = clamped_swiglu(gate, up, limit=self.limit, alpha=self.alpha)
        else:
            h = swiglu(gate, up)
        return self.down_proj(h)


def moe_feed_forward(config, *, group_size: int | None, collective_timeout_s: float = 0.0,
                     name: str = "moe") -> moe_lib.MoEFeedForward:  # fmt: skip
    """An MoE block's feed-forward layer of a `DecoderConfig`: `config.moe`'s router over experts
    of the dense block's form (`feed_forward`: SwiGLU or clamped SwiGLU with its limit and
    alpha; biases with `mlp_bias`) and width `moe.filter_size` (0: `intermediate_size`),
    started as the dense block is (gate/up normal with `initializer_range`, down with
    `output_init_std`, biases 0), experts split over the ambient mesh's `expert` axis.

    Under model parallelism its input is replicated over the model group and every shard runs
    the whole layer (no model-axis collective); its weights are not split over `model`.

    Args:
      config: the `DecoderConfig`.
      group_size: static tokens per replica for the training capacity (None: each batch's
        count; expert parallelism needs it).
      collective_timeout_s: seconds its all-to-all may wait (0: no limit).
      name: the layer's name (its checkpoint key).
    """
    c = config
    return c.moe.layer(
        hidden_size=c.hidden_size, filter_size=c.intermediate_size, expert_mlp=c.feed_forward,
        expert_bias=c.mlp_bias, swiglu_limit=c.swiglu_limit, swiglu_alpha=c.swiglu_alpha,
        kernel_initializer=keras.initializers.RandomNormal(stddev=c.initializer_range),
        output_initializer=keras.initializers.RandomNormal(stddev=c.output_init_std),
        group_size=group_size, collective_timeout_s=collective_timeout_s, name=name,
    )  # fmt: skip
