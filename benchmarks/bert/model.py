"""Provides the BERT encoder and pretraining heads (masked LM, next sentence) in Keras 3.

The graph is google-research/bert's `modeling.py`: post-layer-norm Transformer blocks, the tanh
approximation of GELU, an additive -10000 attention mask, a tanh pooler over [CLS], a masked-LM
head tied to the word embeddings (plus its own output bias) and a 2-way next-sentence head.
`BertPretrainer.tf1_variables()` names every weight as the TF1 checkpoints do, so a
google-research/MLPerf checkpoint loads by name (see checkpoint.py).

Tensor parallelism (the run's mesh has `model` = M > 1, Megatron's layout;
`mlperf_tf.layers.tensor_parallel`; the layers find the mesh themselves, `mlperf_tf.parallel.use_mesh`):
each block's attention splits its heads (query/key/value column-parallel, the output
projection row-parallel) and its feed-forward block the intermediate width; the word embeddings
split their vocabulary rows (a vocabulary-parallel lookup), and the tied masked-LM projection
gives each shard the logits of its own ids (`mlm_logits` is [batch, predictions, vocab/M]; the
loss is the vocabulary-parallel cross-entropy). Layer norms, the position and token-type
embeddings, the pooler and the next-sentence head are replicated.

The attention core (`mlperf_tf.lm.attend`, with BERT's additive bias and float32 score scale),
the block's projections (`mlperf_tf.lm.Linear`) and the tied masked-LM projection
(`mlperf_tf.lm.tied_logits`) are the language-model library's; the rest is BERT's own.
"""

from __future__ import annotations

import math

import keras
import tensorflow as tf
from keras import ops

from benchmarks.bert.config import ModelConfig
from mlperf_tf.layers import PADDED, PackedTokens
from mlperf_tf.lm.attention import multi_head_attend
from mlperf_tf.lm.layers import Linear, tied_logits
from mlperf_tf.spmd import (
    ModelAxis,
    add_split_weight,
    check_divides,
    current_mesh,
    model_split,
    vocab_parallel_lookup,
)

# google-research/bert masks attention with this additive bias (not -inf), which also fits fp16.
_MASK_BIAS = -10000.0


def _initializer(config: ModelConfig):
    # tf.compat.v1.truncated_normal_initializer(stddev=initializer_range), as in modeling.py.
    return keras.initializers.TruncatedNormal(stddev=config.initializer_range)


def gelu(x):
    """GELU with the tanh approximation that google-research/bert uses."""
    return keras.activations.gelu(x, approximate=True)


class Embeddings(keras.layers.Layer):
    """Word + token-type + position embeddings, then LayerNorm and dropout.

    Owns `word_embeddings` [vocab, hidden], which the masked-LM head reuses as its output
    projection (tied weights).
    """

    def __init__(self, config: ModelConfig, **kwargs):
        super().__init__(**kwargs)
        self.config = config
        self.axis = ModelAxis(None, self)
        self.layer_norm = keras.layers.LayerNormalization(
            epsilon=config.layer_norm_epsilon, dtype=self.dtype_policy, name="LayerNorm"
        )
        self.dropout = keras.layers.Dropout(config.hidden_dropout_prob, dtype=self.dtype_policy)

    def build(self, input_shape):
        c = self.config
        init = _initializer(c)
        self.word_embeddings = add_split_weight(
            self, name="word_embeddings", shape=(c.vocab_size, c.hidden_size), initializer=init,
            layout=model_split(0), mesh=self.axis.mesh,
        )  # fmt: skip
        self.token_type_embeddings = self.add_weight(
            name="token_type_embeddings", shape=(c.type_vocab_size, c.hidden_size), initializer=init
        )
        self.position_embeddings = self.add_weight(
            name="position_embeddings",
            shape=(c.max_position_embeddings, c.hidden_size),
            initializer=init,
        )
        self.layer_norm.build((None, None, c.hidden_size))

    def call(self, input_ids, segment_ids, training=False):
        # input_ids, segment_ids: [batch, seq] int
        seq_length = input_ids.shape[1]
        dtype = self.compute_dtype
        # Vocabulary-parallel under model parallelism (g: one all-reduce forward).
        words = vocab_parallel_lookup(ops.cast(self.word_embeddings, dtype), input_ids, self.axis)
        # One-hot matmul for the few token types, as modeling.py: a dense gradient (a gather's
        # gradient is IndexedSlices, which not every optimizer takes).
        one_hot = ops.one_hot(segment_ids, self.config.type_vocab_size, dtype=dtype)
        types = ops.matmul(one_hot, ops.cast(self.token_type_embeddings, dtype))
        positions = ops.cast(self.position_embeddings[:seq_length], dtype)  # [seq, hidden]
        x = words + types + positions[None]  # [batch, seq, hidden]
        return self.dropout(self.layer_norm(x), training=training)


class TransformerBlock(keras.layers.Layer):
    """One post-LN encoder block: self-attention, add & norm, GELU feed-forward, add & norm.

    Under model parallelism (M shards): f once on the block input for query/key/value (one
    all-reduce backward), g in the attention output (one all-reduce forward), and the same pair
    around the feed-forward block; each shard computes heads/M heads and intermediate/M units.
    """

    def __init__(self, config: ModelConfig, **kwargs):
        super().__init__(**kwargs)
        self.config = config
        c = config
        self.axis = ModelAxis(None, self)
        self.num_heads = c.num_attention_heads // self.axis.size  # this shard's heads
        self.head_size = c.hidden_size // c.num_attention_heads
        policy = self.dtype_policy

        def dense(units, name, parallel="column"):
            # The language-model library's projection: Dense's [in, units] kernel and bias.
            return Linear(units, kernel_initializer=_initializer(c), use_bias=True,
                          parallel=parallel, dtype=policy, name=name)  # fmt: skip

        self.query = dense(c.hidden_size, "query")
        self.key = dense(c.hidden_size, "key")
        self.value = dense(c.hidden_size, "value")
        self.attention_output = dense(c.hidden_size, "attention_output", parallel="row")
        self.attention_layer_norm = keras.layers.LayerNormalization(
            epsilon=c.layer_norm_epsilon, dtype=policy, name="attention_LayerNorm"
        )
        self.intermediate = dense(c.intermediate_size, "intermediate")
        self.output_dense = dense(c.hidden_size, "output", parallel="row")
        self.output_layer_norm = keras.layers.LayerNormalization(
            epsilon=c.layer_norm_epsilon, dtype=policy, name="output_LayerNorm"
        )
        self.attention_dropout = keras.layers.Dropout(c.attention_probs_dropout_prob, dtype=policy)
        self.hidden_dropout = keras.layers.Dropout(c.hidden_dropout_prob, dtype=policy)

    def build(self, input_shape):
        h = self.config.hidden_size
        for layer in (self.query, self.key, self.value, self.attention_output):
            layer.build((None, None, h))
        self.attention_layer_norm.build((None, None, h))
        self.intermediate.build((None, None, h))
        self.output_dense.build((None, None, self.config.intermediate_size))
        self.output_layer_norm.build((None, None, h))

    def _split_heads(self, x):
        # [batch, seq, hidden] -> [batch, heads, seq, head_size]
        batch, seq = x.shape[0], x.shape[1]
        batch = -1 if batch is None else batch
        x = ops.reshape(x, (batch, seq, self.num_heads, self.head_size))
        return ops.transpose(x, (0, 2, 1, 3))

    def call(self, x, attention_bias, training=False, tokens=PADDED):
        """One block. `x`: [batch, seq, hidden], or [tokens, hidden] when `tokens` is a
        `PackedTokens` (then every per-token layer skips the padding and attention runs on the
        unpacked [batch, seq] layout); `attention_bias`: [batch, 1, 1, seq], 0 keep, -10000
        masked."""
        shared = self.axis.copy(x)  # f: one all-reduce of the input gradient for q, k and v
        q = self._split_heads(tokens.unpack(self.query(shared)))
        k = self._split_heads(tokens.unpack(self.key(shared)))
        v = self._split_heads(tokens.unpack(self.value(shared)))
        # Scores, the -10000 bias and the softmax in float32 (the scores of long sequences
        # overflow fp16/bf16 precision); the scale multiplies the float32 scores, as modeling.py.
        context = multi_head_attend(
            q, k, v, bias=attention_bias, scale=1.0 / math.sqrt(self.head_size),
            dropout=self.attention_dropout, training=training,
        )  # fmt: skip  # [batch, heads, seq, head_size]
        context = ops.transpose(context, (0, 2, 1, 3))  # [batch, seq, heads, head_size]
        batch = -1 if context.shape[0] is None else context.shape[0]
        local = self.num_heads * self.head_size
        context = ops.reshape(context, (batch, context.shape[1], local))
        context = tokens.pack(context)
        attention = self.hidden_dropout(self.attention_output(context), training=training)
        x = self.attention_layer_norm(attention + x)
        hidden = self.output_dense(gelu(self.intermediate(self.axis.copy(x))))
        hidden = self.hidden_dropout(hidden, training=training)
        return self.output_layer_norm(hidden + x)


class BertEncoder(keras.layers.Layer):
    """Embeddings, `num_hidden_layers` Transformer blocks and the [CLS] pooler.

    Returns (sequence_output [batch, seq, hidden], pooled_output [batch, hidden]).
    """

    def __init__(self, config: ModelConfig, **kwargs):
        super().__init__(**kwargs)
        self.config = config
        policy = self.dtype_policy
        self.embeddings = Embeddings(config, dtype=policy, name="embeddings")
        self.blocks = [
            TransformerBlock(config, dtype=policy, name=f"layer_{i}")
            for i in range(config.num_hidden_layers)
        ]
        self.pooler = keras.layers.Dense(
            config.hidden_size,
            activation="tanh",
            kernel_initializer=_initializer(config),
            dtype=policy,
            name="pooler",
        )

    def build(self, input_shape):
        h = self.config.hidden_size
        self.embeddings.build(input_shape)
        for block in self.blocks:
            block.build((None, None, h))
        self.pooler.build((None, h))

    def call(self, input_ids, input_mask, segment_ids, training=False, packed=False):
        """`packed`: run the blocks on the real tokens only (`PackedTokens` of `input_mask`;
        data-dependent shapes, not for XLA). The outputs are the same at every real position;
        padded positions of `sequence_output` are then zeros."""
        x = self.embeddings(input_ids, segment_ids, training=training)
        # [batch, seq] -> additive bias [batch, 1, 1, seq]; float32 as the scores are.
        keep = ops.cast(input_mask, "float32")[:, None, None, :]
        attention_bias = (1.0 - keep) * _MASK_BIAS
        tokens = PackedTokens(tf.not_equal(input_mask, 0)) if packed else PADDED
        x = tokens.pack(x)
        for block in self.blocks:
            x = block(x, attention_bias, training=training, tokens=tokens)
        x = tokens.unpack(x)
        pooled = self.pooler(x[:, 0])
        return x, pooled


class MaskedLMHead(keras.layers.Layer):
    """Transform (dense + GELU + LayerNorm) of the masked positions, then the tied vocab projection.

    Only the `max_predictions_per_seq` masked positions are gathered, so the cost of the
    [hidden x vocab] projection does not grow with the sequence length. Under model parallelism
    the projection is vocabulary-parallel (f on its input: one all-reduce backward; the output
    bias split like the table) and the logits are this shard's [..., vocab/M].
    """

    def __init__(self, config: ModelConfig, **kwargs):
        super().__init__(**kwargs)
        self.config = config
        self.axis = ModelAxis(None, self)
        self.transform = keras.layers.Dense(
            config.hidden_size,
            activation=gelu,
            kernel_initializer=_initializer(config),
            dtype=self.dtype_policy,
            name="transform",
        )
        self.layer_norm = keras.layers.LayerNormalization(
            epsilon=config.layer_norm_epsilon, dtype=self.dtype_policy, name="transform_LayerNorm"
        )

    def build(self, input_shape):
        h = self.config.hidden_size
        self.transform.build((None, None, h))
        self.layer_norm.build((None, None, h))
        self.output_bias = add_split_weight(
            self, name="output_bias", shape=(self.config.vocab_size,), initializer="zeros",
            layout=model_split(0), mesh=self.axis.mesh,
        )  # fmt: skip

    def call(self, sequence_output, positions, word_embeddings):
        # sequence_output: [batch, seq, hidden]; positions: [batch, predictions] int;
        # word_embeddings: the encoder's [vocab, hidden] table (tied output weights).
        gathered = tf.gather(sequence_output, ops.cast(positions, "int32"), batch_dims=1)
        x = self.layer_norm(self.transform(gathered))  # [batch, predictions, hidden]
        table = ops.cast(word_embeddings, self.compute_dtype)
        # One 2-D MatMul against the transposed table, as modeling.py (see `tied_logits`).
        logits = tied_logits(x, table, self.axis)  # [b, p, vocab(/M)]
        return logits + ops.cast(self.output_bias, self.compute_dtype)


class NextSentenceHead(keras.layers.Layer):
    """2-way classifier on the pooled [CLS] output; weights stored [2, hidden] as in TF1 BERT."""

    def __init__(self, config: ModelConfig, **kwargs):
        super().__init__(**kwargs)
        self.config = config

    def build(self, input_shape):
        self.output_weights = self.add_weight(
            name="output_weights",
            shape=(2, self.config.hidden_size),
            initializer=_initializer(self.config),
        )
        self.output_bias = self.add_weight(name="output_bias", shape=(2,), initializer="zeros")

    def call(self, pooled):
        w = ops.cast(self.output_weights, self.compute_dtype)
        return ops.matmul(pooled, ops.transpose(w)) + ops.cast(self.output_bias, self.compute_dtype)


class BertPretrainer(keras.Model):
    """BERT with both pretraining heads.

    Call with a dict holding `input_ids`, `input_mask`, `segment_ids` ([batch, seq] int) and
    `masked_lm_positions` ([batch, predictions] int); returns a dict with `mlm_logits`
    [batch, predictions, vocab] and `nsp_logits` [batch, 2], in the compute dtype.
    """

    def __init__(self, config: ModelConfig, **kwargs):
        """Built for the run's mesh (`mlperf_tf.parallel.current_mesh()`, kept as `mesh`): its
        `model` axis M > 1 splits the model (M must divide the heads, the intermediate size and
        the vocabulary: `UserError` otherwise)."""
        super().__init__(**kwargs)
        self.config = config
        self.mesh = current_mesh()
        check_divides(
            **{"model.num_attention_heads": config.num_attention_heads,
               "model.intermediate_size": config.intermediate_size,
               "model.vocab_size": config.vocab_size}
        )  # fmt: skip
        policy = self.dtype_policy
        self.encoder = BertEncoder(config, dtype=policy, name="bert")
        self.mlm_head = MaskedLMHead(config, dtype=policy, name="cls_predictions")
        self.nsp_head = NextSentenceHead(config, dtype=policy, name="cls_seq_relationship")

    def build(self, input_shape=None):
        self.encoder.build((None, None))
        self.mlm_head.build((None, None, self.config.hidden_size))
        self.nsp_head.build((None, self.config.hidden_size))
        self.built = True

    def call(self, inputs, training=False, packed=False):
        """`packed`: skip the padding in the encoder blocks (`BertEncoder.call`)."""
        sequence_output, pooled = self.encoder(
            inputs["input_ids"],
            inputs["input_mask"],
            inputs["segment_ids"],
            training=training,
            packed=packed,
        )
        return {
            "mlm_logits": self.mlm_head(
                sequence_output,
                inputs["masked_lm_positions"],
                self.encoder.embeddings.word_embeddings,
            ),
            "nsp_logits": self.nsp_head(pooled),
        }

    def tf1_variables(self) -> dict[str, keras.Variable]:
        """Maps each google-research/bert TF1 variable name to the Keras variable holding it.

        Every weight of the model appears exactly once; the shapes are the TF1 shapes (Dense
        kernels are [in, out] in both), so a checkpoint value assigns without transposing.
        """
        if not self.built:
            self.build()
        names = {}
        emb = self.encoder.embeddings
        names["bert/embeddings/word_embeddings"] = emb.word_embeddings
        names["bert/embeddings/token_type_embeddings"] = emb.token_type_embeddings
        names["bert/embeddings/position_embeddings"] = emb.position_embeddings
        _add_layer_norm(names, "bert/embeddings/LayerNorm", emb.layer_norm)
        for i, block in enumerate(self.encoder.blocks):
            prefix = f"bert/encoder/layer_{i}"
            _add_dense(names, f"{prefix}/attention/self/query", block.query)
            _add_dense(names, f"{prefix}/attention/self/key", block.key)
            _add_dense(names, f"{prefix}/attention/self/value", block.value)
            _add_dense(names, f"{prefix}/attention/output/dense", block.attention_output)
            _add_layer_norm(
                names, f"{prefix}/attention/output/LayerNorm", block.attention_layer_norm
            )
            _add_dense(names, f"{prefix}/intermediate/dense", block.intermediate)
            _add_dense(names, f"{prefix}/output/dense", block.output_dense)
            _add_layer_norm(names, f"{prefix}/output/LayerNorm", block.output_layer_norm)
        _add_dense(names, "bert/pooler/dense", self.encoder.pooler)
        _add_dense(names, "cls/predictions/transform/dense", self.mlm_head.transform)
        _add_layer_norm(names, "cls/predictions/transform/LayerNorm", self.mlm_head.layer_norm)
        names["cls/predictions/output_bias"] = self.mlm_head.output_bias
        names["cls/seq_relationship/output_weights"] = self.nsp_head.output_weights
        names["cls/seq_relationship/output_bias"] = self.nsp_head.output_bias
        return names


def _add_dense(names: dict, prefix: str, layer: keras.layers.Dense | Linear) -> None:
    names[f"{prefix}/kernel"] = layer.kernel
    names[f"{prefix}/bias"] = layer.bias


def _add_layer_norm(names: dict, prefix: str, layer: keras.layers.LayerNormalization) -> None:
    names[f"{prefix}/gamma"] = layer.gamma
    names[f"{prefix}/beta"] = layer.beta


def build_pretrainer(config: ModelConfig) -> BertPretrainer:
    """A built `BertPretrainer` (weights created, following the global dtype policy) for the
    run's mesh (`mlperf_tf.parallel.current_mesh()`)."""
    model = BertPretrainer(config, name="bert_pretrainer")
    model.build()
    return model
