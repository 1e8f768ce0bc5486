"""Provides the gated activations of the feed-forward blocks and MoE experts: SwiGLU and GPT-OSS's
clamped SwiGLU (one formula for the dense block in `mlperf_tf.lm` and the experts in
`mlperf_tf.layers.moe`)."""

from __future__ import annotations

import tensorflow as tf


def swiglu(gate, up):
    """Shazeer 2020's SwiGLU: silu(gate) * up."""
    return tf.nn.silu(gate) * up


def clamped_swiglu(gate, up, *, limit: float, alpha: float):
    """GPT-OSS's gated unit (openai/gpt-oss `swiglu`, Hugging Face `GptOssExperts`, keras-hub
    `GptOssExperts`): gate clipped above at `limit`, up clipped to [-limit, limit], then
    `(up + 1) * gate * sigmoid(alpha * gate)`."""
    gate = tf.minimum(gate, tf.cast(limit, gate.dtype))
    up = tf.clip_by_value(up, tf.cast(-limit, up.dtype), tf.cast(limit, up.dtype))
    return (up + 1) * (gate * tf.sigmoid(gate * tf.cast(alpha, gate.dtype)))
