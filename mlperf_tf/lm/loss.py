"""Provides the language models' token loss: per-token cross-entropy from whole or
vocabulary-parallel logits (one branch for both), the per-position weights that mask it
(ignored labels, end-of-document positions, an explicit mask), and their weighted mean."""

from __future__ import annotations

import tensorflow as tf

from mlperf_tf.layers.tensor_parallel import ModelAxis, vocab_parallel_cross_entropy

# Hugging Face's and PyTorch's `ignore_index`: a label that takes no part in the loss.
IGNORE_INDEX = -100


def token_cross_entropy(logits, labels, *, vocab_size: int, axis: ModelAxis | None = None,
                        smoothing: float = 0.0):  # fmt: skip
    """Per-token softmax cross-entropy (nats, float32) [...].

    Args:
      logits: [..., vocab] or, under tensor parallelism (`axis.size` M > 1), this shard's
        [..., vocab/M] (`mlperf_tf.layers.tensor_parallel.vocab_parallel_cross_entropy`: three
        all-reduces of [...] vectors, the logits never gathered).
      labels: int [...], global ids; negative ids (`IGNORE_INDEX`) give a loss of 0 (mask them
        with `loss_weights`).
      vocab_size: the whole vocabulary.
      axis: the model's `ModelAxis` (None or size 1: whole logits).
      smoothing: label smoothing (0: plain cross-entropy).
    """
    labels = tf.cast(labels, tf.int32)
    ignored = labels < 0
    safe = tf.where(ignored, tf.zeros_like(labels), labels)
    if (axis is not None and axis.size > 1) or smoothing:
        if axis is None:
            axis = ModelAxis(None, "token_cross_entropy")
        losses = vocab_parallel_cross_entropy(
            logits, safe, vocab_size=vocab_size, smoothing=smoothing, axis=axis
        )
    else:
        losses = tf.nn.sparse_softmax_cross_entropy_with_logits(
            labels=safe, logits=tf.cast(logits, tf.float32)
        )
    return tf.where(ignored, tf.zeros_like(losses), losses)


def loss_weights(labels, *, input_ids=None, eod_token: int | None = None, mask=None):
    """float32 [...] per-position weights of the token loss: 0 where the label is negative
    (`IGNORE_INDEX`: a prompt, padding), 0 where the input is the end-of-document token
    (Megatron's `eod_mask_loss`: the position after a document's end predicts the next
    document's first token), times `mask` if given (any float or bool [...]); else 1.

    Args:
      labels: int [...].
      input_ids: int [...] (needed with `eod_token`).
      eod_token: the end-of-document id (None: no such mask).
      mask: an explicit weight, e.g. a batch's `loss_mask`.
    """
    weights = tf.cast(tf.cast(labels, tf.int32) >= 0, tf.float32)
    if eod_token is not None:
        if input_ids is None:
            raise ValueError("an eod_token mask needs the input_ids")
        weights *= tf.cast(tf.not_equal(tf.cast(input_ids, tf.int32), eod_token), tf.float32)
    if mask is not None:
        weights *= tf.cast(mask, tf.float32)
    return weights


def weighted_mean(losses, weights, context=None):
    """sum(losses * weights) / sum(weights), 0 when every weight is 0 (a replica whose batch is
    all prompt): float32 scalar.

    Args:
      context: under context parallelism, the model's `ContextAxis`: the replica holds part of
        each sequence, and the count is the whole sequences' (summed over the axis, no
        gradient), so the members' means sum to the unsplit mean and their gradients to its.
    """
    total = tf.reduce_sum(losses * weights)
    count = tf.reduce_sum(weights)
    if context is not None:
        count = context.total(count)
    return tf.math.divide_no_nan(total, count)
