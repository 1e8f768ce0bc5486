"""Provides the LoRA benchmark's input: prompt + summary sequences (TFRecords or synthetic) to
per-replica batches of fixed length.

A record holds one tokenized sequence as the MLCommons preprocessed GovReport has it
(`input_ids` and `labels`, int64, same length, labels -100 on the prompt: see prepare.py). As
Hugging Face's `LlamaForCausalLM` shifts them, position t's logits predict `labels[t + 1]`:
an example comes out as int32 `input_ids` [seq] (padded with 0), `labels` [seq] (the labels
shifted left by one, -100 where there is nothing to predict) — the loss and the eval count only
the targets that are not -100, i.e. the summary tokens.
"""

from __future__ import annotations

import tensorflow as tf

from benchmarks.llama2_70b_lora.config import IGNORE_INDEX, LoraBenchmarkConfig
from mlperf_tf.data.parsed import ParsedInput

FEATURES = {
    "input_ids": tf.io.RaggedFeature(tf.int64),
    "labels": tf.io.RaggedFeature(tf.int64),
}


def to_example(input_ids: tf.Tensor, labels: tf.Tensor, length: int) -> dict[str, tf.Tensor]:
    """One sequence (any length) -> fixed-length `input_ids` and shifted `labels` [length].

    A longer sequence is cut to `length` (prepare.py refuses none: the reference's data is
    within 8,192); a shorter one is padded with id 0 and target -100.
    """
    input_ids = tf.cast(input_ids[:length], tf.int32)
    targets = tf.cast(labels[1 : length + 1], tf.int32)
    pad_inputs = length - tf.shape(input_ids)[0]
    pad_targets = length - tf.shape(targets)[0]
    input_ids = tf.pad(input_ids, [[0, pad_inputs]])
    targets = tf.pad(targets, [[0, pad_targets]], constant_values=IGNORE_INDEX)
    return {
        "input_ids": tf.ensure_shape(input_ids, [length]),
        "labels": tf.ensure_shape(targets, [length]),
    }


def make_parse_fn(config: LoraBenchmarkConfig):
    """Returns serialized record -> example dict; a record without both features fails."""
    length = config.data.max_sequence_length

    def parse(serialized: tf.Tensor) -> dict[str, tf.Tensor]:
        parsed = tf.io.parse_single_example(serialized, FEATURES)
        tf.debugging.assert_equal(
            tf.shape(parsed["input_ids"]), tf.shape(parsed["labels"]),
            message="input_ids and labels differ in length",
        )  # fmt: skip
        return to_example(parsed["input_ids"], parsed["labels"], length)

    return parse


def synthetic_example(config: LoraBenchmarkConfig, seed) -> dict[str, tf.Tensor]:
    """Random tokens: a prompt of the first half (targets -100) and a summary of the rest."""
    length = config.data.max_sequence_length
    op_seed = tf.stack([tf.cast(seed, tf.int32), tf.constant(11, tf.int32)])
    ids = tf.random.stateless_uniform(
        [length + 1], op_seed, minval=1, maxval=config.model.vocab_size, dtype=tf.int64
    )
    prompt = length // 2
    labels = tf.concat([tf.fill([prompt], tf.constant(IGNORE_INDEX, tf.int64)), ids[prompt:]], 0)
    return to_example(ids, labels, length)


# The standard input hooks (`Benchmark.input_module`).
INPUT = ParsedInput(
    what="GovReport", make_parse_fn=make_parse_fn, synthetic_example=synthetic_example
)
