"""Provides `MultiTokenPrediction`: DeepSeek-V3's multi-token prediction module of one depth, and
`shift_left`, the roll of token ids, labels and loss weights by a depth.

DeepSeek-V3 (arXiv 2412.19437 section 2.2, eqs. 21-25), as Megatron-Core's `MultiTokenPrediction
Block` and the Hugging Face checkpoint lay it out (`model.layers.{L + k}.enorm`, `hnorm`,
`eh_proj`, the block's own weights, `shared_head.norm`; the embedding and the output head are
the main model's, shared). Depth k (1-based) at position i reads the previous depth's states
h^{k-1}_i (depth 0: the main model's final-norm output) and the embedding of token t_{i+k}:

    h'_i = eh_proj([enorm(Emb(t_{i+k})); hnorm(h^{k-1}_i)])   # [2h] -> [h], embedding first
    h^k  = Block_k(h')                                         # causal over the sequence
    logits^k_i = OutHead(shared_head_norm(h^k_i))              # predicts t_{i+k+1}

Its loss is the cross-entropy of those logits against the labels shifted left by k, with the
last k positions (which have no target in the window) left out; the training loss adds
`mtp_loss_weight / D` x the sum over depths (Megatron's `mtp_loss_scaling_factor`). The eval's
log perplexity is the main head's only (Megatron reports the MTP loss apart from "lm loss").
"""

from __future__ import annotations

import keras
import tensorflow as tf

from mlperf_tf.lm.layers import Linear, RMSNorm


def shift_left(t, k: int, fill=0):
    """`t` [batch, seq, ...] moved k positions left along seq, the last k filled with `fill`:
    position i holds t_{i+k}."""
    if k == 0:
        return t
    pad = tf.fill(tf.concat([tf.shape(t)[:1], [k], tf.shape(t)[2:]], 0), tf.cast(fill, t.dtype))
    return tf.concat([t[:, k:], pad], axis=1)


class MultiTokenPrediction(keras.layers.Layer):
    """One MTP depth (see the module docstring). Sublayers: `enorm`, `hnorm`, `eh_proj`
    (kernel [2h, h], replicated under tensor parallelism), `block` (a `DecoderBlock` of index
    `num_hidden_layers + depth - 1`), `shared_head_norm`.

    Args:
      config: the `DecoderConfig`.
      depth: k, 1-based.
      block: the depth's `DecoderBlock` (built by the caller: the decoder owns block classes).
    """

    def __init__(self, config, *, depth: int, block: keras.layers.Layer, **kwargs):
        super().__init__(**kwargs)
        self.depth = depth
        self.hidden_size = config.hidden_size
        self.enorm = RMSNorm(config.rms_norm_eps, name="enorm")
        self.hnorm = RMSNorm(config.rms_norm_eps, name="hnorm")
        self.eh_proj = Linear(config.hidden_size, stddev=config.initializer_range, name="eh_proj")
        self.block = block
        self.shared_head_norm = RMSNorm(config.rms_norm_eps, name="shared_head_norm")

    def build(self, input_shape=None):
        hidden = (None, None, self.hidden_size)
        self.enorm.build(hidden)
        self.hnorm.build(hidden)
        self.eh_proj.build((None, None, 2 * self.hidden_size))
        self.block.build(hidden)
        self.shared_head_norm.build(hidden)
        self.built = True

    def call(self, states, embedded, cos, sin, training=False, aux=None):
        """states: h^{k-1} [batch, seq, h]; embedded: Emb(t_{i+k}) [batch, seq, h] ->
        (h^k [batch, seq, h], its normalized states for the output head)."""
        x = tf.concat([self.enorm(embedded), self.hnorm(states)], axis=-1)  # [batch, seq, 2h]
        x = self.block(self.eh_proj(x), cos, sin, training=training, aux=aux)
        return x, self.shared_head_norm(x)
