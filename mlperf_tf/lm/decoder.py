"""Provides `DecoderBlock` and `DecoderModel`: a decoder-only language model assembled from a
`DecoderConfig` (embedding, pre-norm blocks of attention and a dense or MoE feed-forward, final
norm, tied or untied output projection), and `build_decoder`, which builds its weights without a
forward pass (a forward pass under model or expert parallelism needs replica context).

Layout (Hugging Face `LlamaForCausalLM`, Megatron's GPT): `x + attention(norm(x))`, then
`x + ffn(norm(x))`; norms, the softmax and the loss compute in float32 under a mixed policy.
Tensor parallelism (the ambient mesh's `model` axis, M > 1): a vocabulary-parallel embedding,
attention and feed-forward split as Megatron splits them, and a column-parallel output
projection (or, tied, the embedding's own [vocab/M, hidden] rows) whose logits are this
shard's [batch, seq, vocab/M]: the loss is `mlperf_tf.lm.loss.token_cross_entropy`, which never
gathers them. The RMS norms are replicated. No constructor takes a mesh: the layers read the
ambient one (`mlperf_tf.parallel.current_mesh()`) when they are made.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable

import keras
import tensorflow as tf

from mlperf_tf.layers import moe as moe_lib
from mlperf_tf.layers.tensor_parallel import ModelAxis, VocabParallelEmbedding
from mlperf_tf.lm.attention import Attention
from mlperf_tf.lm.config import DecoderConfig
from mlperf_tf.lm.feed_forward import FeedForward, moe_feed_forward
from mlperf_tf.lm.layers import Linear, RMSNorm, tied_logits
from mlperf_tf.lm.mla import MultiHeadLatentAttention
from mlperf_tf.lm.mtp import MultiTokenPrediction, shift_left
from mlperf_tf.lm.rope import RotaryEmbedding
from mlperf_tf.parallel.context import current_mesh
from mlperf_tf.parallel.layout import check_divides
from mlperf_tf.parallel.pipeline import sum_over_stages


class DecoderBlock(keras.layers.Layer):
    """One pre-norm block: x + attention(norm(x)), then + ffn(norm(x)).

    Block `index` has an MoE feed-forward layer when `config.moe.is_moe(index)`
    (`moe_feed_forward`), else a dense `FeedForward`; its attention window is
    `config.layer_window(index)`. MoE stats go to the call's `aux` (a `moe.Collector`, or None).
    Sublayers: `attention_norm`, `attention`, `mlp_norm`, `mlp` (their checkpoint keys).
    """

    def __init__(self, config: DecoderConfig, *, index: int = 0,
                 moe_group_size: int | None = None, collective_timeout_s: float = 0.0,
                 **kwargs):  # fmt: skip
        super().__init__(**kwargs)
        self.index = index
        self.attention_norm = RMSNorm(config.rms_norm_eps, name="attention_norm")
        self.attention = self.make_mixer(config, index)
        self.mlp_norm = RMSNorm(config.rms_norm_eps, name="mlp_norm")
        if config.moe.is_moe(index):
            self.mlp = moe_feed_forward(
                config, group_size=moe_group_size, collective_timeout_s=collective_timeout_s
            )
        else:
            self.mlp = FeedForward.from_config(config, name="mlp")

    def make_mixer(self, config: DecoderConfig, index: int):
        """The block's token mixer, named `attention` (a subclass returns another kind):
        grouped-query attention, or DeepSeek's multi-head latent attention."""
        if config.attention == "mla":
            return MultiHeadLatentAttention.from_config(config, name="attention")
        return Attention.from_config(config, index, name="attention")

    @property
    def is_moe(self) -> bool:
        return isinstance(self.mlp, moe_lib.MoEFeedForward)

    def build(self, input_shape):
        hidden = (None, None, input_shape[-1])
        self.attention_norm.build(hidden)
        self.attention.build(hidden)
        self.mlp_norm.build(hidden)
        self.mlp.build(hidden)
        self.built = True

    def call(self, x, cos, sin, training=False, aux=None):
        x = x + self.attention(self.attention_norm(x), cos, sin)
        if not self.is_moe:
            return x + self.mlp(self.mlp_norm(x))
        y, stats = self.mlp(self.mlp_norm(x), training=training)
        if aux is not None:
            aux.add(self.mlp, stats)
        return x + y


class DecoderModel(keras.Model):
    """Token ids [batch, seq] (int) -> next-token logits [batch, seq, vocab] (compute dtype).

    Sublayers: `token_embedding` (weight `embeddings` [vocab, hidden]), `decoder_layers`,
    `final_norm`, and `lm_head` (kernel [hidden, vocab]) unless `config.tie_word_embeddings`.

    Args:
      config: the model's shape and options.
      moe_group_size: static tokens per replica for the MoE training capacity (None: each
        batch's count; expert parallelism needs it).
      collective_timeout_s: seconds an expert-parallel MoE layer's all-to-all may wait (0: no
        limit; the runner's `--collective_timeout`).

    Raises:
      UserError: the ambient mesh's `model` axis does not divide the heads, the feed-forward
        width or the vocabulary, or its `pipeline` axis the layers (without a declared map,
        `DecoderConfig.pipeline_layers`).
    """

    # The block of every layer; a subclass with other blocks (`mlperf_tf.lm.hybrid`) sets its own.
    block_class = DecoderBlock

    def __init__(self, config: DecoderConfig, *, moe_group_size: int | None = None,
                 collective_timeout_s: float = 0.0, **kwargs):  # fmt: skip
        super().__init__(**kwargs)
        self.config = config
        c = config
        mesh = current_mesh()
        if mesh is not None and mesh.pipeline > 1:  # one line, before any weight is made
            c.stage_bounds(mesh.pipeline)
        if mesh is not None:
            check_divides(
                mesh, **{"model.num_attention_heads": c.num_attention_heads,
                         "model.intermediate_size": c.intermediate_size,
                         "model.vocab_size": c.vocab_size}
            )  # fmt: skip
        self.axis = ModelAxis(None, self)
        self.token_embedding = VocabParallelEmbedding(
            c.vocab_size, c.hidden_size,
            embeddings_initializer=keras.initializers.RandomNormal(stddev=c.initializer_range),
            name="token_embedding",
        )  # fmt: skip
        self.decoder_layers = [
            self.block_class(
                c,
                index=i,
                moe_group_size=moe_group_size,
                collective_timeout_s=collective_timeout_s,
                name=f"decoder_{i}",
            )  # fmt: skip
            for i in range(c.num_hidden_layers)
        ]
        self.final_norm = RMSNorm(c.rms_norm_eps, name="final_norm")
        self.mtp = [
            MultiTokenPrediction(
                c,
                depth=k + 1,
                name=f"mtp_{k}",
                block=DecoderBlock(
                    c,
                    index=c.num_hidden_layers + k,
                    moe_group_size=moe_group_size,
                    collective_timeout_s=collective_timeout_s,
                    name="block",
                ),
            )  # fmt: skip
            for k in range(c.mtp_layers)
        ]
        if not c.tie_word_embeddings:
            self.lm_head = Linear(
                c.vocab_size, stddev=c.initializer_range, parallel="column", name="lm_head"
            )
        self.rotary = RotaryEmbedding.from_config(c)
        self._stage_input = None  # (hidden states, first layer) inside `from_stage`

    def build(self, input_shape=None):
        """Creates every weight in forward order, without a forward pass."""
        hidden = (None, None, self.config.hidden_size)
        self.token_embedding.build((None, None))
        for layer in self.decoder_layers:
            layer.build(hidden)
        self.final_norm.build(hidden)
        for module in self.mtp:
            module.build(hidden)
        if not self.config.tie_word_embeddings:
            self.lm_head.build(hidden)
        self.built = True

    def rotary_tables(self, seq) -> tuple[tf.Tensor, tf.Tensor]:
        """(cos, sin) [seq, head_dim] in float32 for positions 0..seq-1."""
        return self.rotary.tables(seq)

    @property
    def moe_layers(self) -> list:
        """The MoE feed-forward layers, in block order (the order of a `moe.Collector`)."""
        blocks = self.decoder_layers + [module.block for module in self.mtp]
        return [layer.mlp for layer in blocks if layer.is_moe]

    def hidden_states(self, token_ids, training=False, aux=None):
        """The final-norm output [batch, seq, hidden]. No dropout; `training` sets the MoE
        layers' capacity factor. `aux`: a `moe.Collector`, or None.

        Inside `from_stage(x, first)` (a pipeline's last stage) the embedding and the layers
        before `first` are skipped: `x` [batch, seq, hidden], sent by the stage before, is the
        input of layer `first`, and `token_ids` only gives the shape.
        """
        if self._stage_input is None:
            x, first = self.token_embedding(token_ids), 0
        else:
            x, first = self._stage_input
        x = self.stage_states(x, first, len(self.decoder_layers), training=training, aux=aux)
        return self.final_norm(x)

    def stage_states(self, x, first: int, end: int, training=False, aux=None):
        """Decoder layers [first, end) on `x`: hidden states [batch, seq, hidden], or, when
        `first` is 0 and `x` is token ids [batch, seq], their embedding first (a pipeline
        stage's forward pass; no final norm). `aux`: a `moe.Collector`, or None."""
        if first == 0 and x.shape.rank == 2:
            x = self.token_embedding(x)
        seq = x.shape[1] if x.shape[1] is not None else tf.shape(x)[1]
        cos, sin = self.rotary_tables(seq)
        for layer in self.decoder_layers[first:end]:
            x = layer(x, cos, sin, training=training, aux=aux)
        return x

    @contextlib.contextmanager
    def from_stage(self, x, first: int):
        """Calls of the model inside the block start at decoder layer `first` with hidden states
        `x` [batch, seq, hidden] (a pipeline's last stage: the loss code calls the whole model
        and sees the stage's part of it)."""
        previous, self._stage_input = self._stage_input, (x, first)
        try:
            yield
        finally:
            self._stage_input = previous

    def with_mtp(self, token_ids, training=False, aux=None, next_ids=None):
        """(main logits [batch, seq, vocab], [logits of MTP depth k, k = 1..D]): depth k's at
        position i predict token i + k + 1 (`mlperf_tf.lm.mtp`; its last k positions have no
        target). The MoE stats of every block, the MTP blocks' last, go to `aux`.

        `next_ids`: per depth k, the tokens t_{i+k} [batch, seq] at this replica's positions
        (under context parallelism shifted along the whole sequence before the split:
        `LanguageModelBenchmark.mtp_targets`); None: `token_ids` shifted left by k. On a
        pipeline's last stage (`from_stage`) they are embedded by that replica's copy of the
        embedding table, whose gradient there is summed over the `pipeline` axis with the
        first stage's like every weight's."""
        states = self.hidden_states(token_ids, training=training, aux=aux)
        seq = token_ids.shape[1] if token_ids.shape[1] is not None else tf.shape(token_ids)[1]
        cos, sin = self.rotary_tables(seq)
        if next_ids is None:
            next_ids = [shift_left(token_ids, module.depth) for module in self.mtp]
        outputs, h = [], states
        for module, ids in zip(self.mtp, next_ids, strict=True):
            embedded = self.token_embedding(ids)
            h, normed = module(h, embedded, cos, sin, training=training, aux=aux)
            outputs.append(self.logits(normed))
        return self.logits(states), outputs

    def logits(self, states):
        """Logits of final-norm states [..., hidden]: this shard's [..., vocab/M] (f on the
        input: one all-reduce of its gradient over `model` backward)."""
        if self.config.tie_word_embeddings:
            table = tf.cast(self.token_embedding.embeddings, self.compute_dtype)
            return tied_logits(states, table, self.axis)
        return self.lm_head(self.axis.copy(states))

    def call(self, token_ids, training=False, aux=None):
        """Logits [batch, seq, vocab] (this shard's [..., vocab/M] under model parallelism);
        the MoE layers' stats go to `aux` (a `moe.Collector`, or None)."""
        return self.logits(self.hidden_states(token_ids, training=training, aux=aux))


def build_decoder(config: DecoderConfig, *, moe_group_size: int | None = None,
                  collective_timeout_s: float = 0.0, name: str = "decoder",
                  model_class: Callable[..., DecoderModel] = DecoderModel) -> DecoderModel:  # fmt: skip
    """A built `DecoderModel` (weights created in forward order by `build`, under the ambient
    mesh; no forward pass). `model_class`: a `DecoderModel` subclass or a factory taking its
    arguments (e.g. a `mlperf_tf.lm.parametrization.ScaledWeights` one)."""
    model = model_class(
        config, moe_group_size=moe_group_size, collective_timeout_s=collective_timeout_s,
        name=name,
    )  # fmt: skip
    model.build((None, None))
    # Pipeline stages: each computes its layers' gradients only, summed over the axis.
    sum_over_stages(model.trainable_variables, current_mesh())
    return model
