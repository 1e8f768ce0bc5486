"""Provides `TinyBenchmark`: a small CNN on synthetic data, for testing the runner end to end.

Each training example is a deterministic function of its index, so a run's data stream is the
same whatever the replica count: with R replicas and per-replica batch b, step s gives replica r
the examples [(s*R + r)*b, ...), which together are exactly the single-device batch s.
"""

from __future__ import annotations

import dataclasses

import keras
import numpy as np
import tensorflow as tf
from mlperf_logging.mllog import constants as C

from mlperf_tf.benchmark import Benchmark
from mlperf_tf.config import BenchmarkConfig


@dataclasses.dataclass(frozen=True, kw_only=True)
class TinyConfig(BenchmarkConfig):
    image_size: int = 8
    num_classes: int = 4
    learning_rate: float = 0.05


def smoke() -> TinyConfig:
    """`mlperf-tf run --benchmark=tiny --preset=smoke`: seconds on a CPU."""
    return TinyConfig(
        global_batch_size=16,
        eval_batch_size=16,
        train_examples=160,
        eval_examples=64,
        max_epochs=2,
        quality_target=2.0,  # unreachable: runs end on their budget
    )


def _example(index, image_size: int, num_classes: int):
    # A learnable task: the label is the quadrant of the image with the largest mean.
    seed = tf.stack([tf.cast(index, tf.int32), tf.constant(7, tf.int32)])
    image = tf.random.stateless_uniform([image_size, image_size, 1], seed=seed)
    half = image_size // 2
    quadrants = tf.stack(
        [
            tf.reduce_mean(image[:half, :half]),
            tf.reduce_mean(image[:half, half:]),
            tf.reduce_mean(image[half:, :half]),
            tf.reduce_mean(image[half:, half:]),
        ]
    )
    label = tf.argmax(quadrants)[..., None] % num_classes
    return {"image": image, "label": tf.cast(label[0], tf.int32), "valid": tf.constant(1.0)}


class TinyBenchmark(Benchmark):
    name = "tiny"
    mlperf_benchmark = "resnet"
    config_class = TinyConfig
    presets = {"smoke": smoke}

    def build_model(self):
        size = self.config.image_size
        inputs = keras.Input([size, size, 1])
        x = keras.layers.Conv2D(4, 3, padding="same", activation="relu")(inputs)
        x = keras.layers.Flatten()(x)
        outputs = keras.layers.Dense(self.config.num_classes)(x)
        return keras.Model(inputs, outputs)

    def build_optimizer(self, train_steps):
        return keras.optimizers.SGD(self.config.learning_rate, momentum=0.9)

    def _dataset(self, input_context, offset: int, count: int | None):
        batch = input_context.get_per_replica_batch_size(self.micro_batch_size)
        indices = (
            tf.data.Dataset.range(offset, offset + count)
            if count
            else tf.data.Dataset.range(offset, 2**62)
        )
        size, classes = self.config.image_size, self.config.num_classes
        return indices.map(lambda i: _example(i, size, classes)).batch(batch, drop_remainder=True)

    def train_dataset(self, input_context):
        return self._dataset(input_context, 0, None)

    def eval_dataset(self, input_context):
        batch = input_context.get_per_replica_batch_size(self.config.eval_batch_size)
        size, classes = self.config.image_size, self.config.num_classes
        indices = tf.data.Dataset.range(10**9, 10**9 + self.config.eval_examples)
        indices = indices.shard(input_context.num_input_pipelines, input_context.input_pipeline_id)
        return indices.map(lambda i: _example(i, size, classes)).batch(batch, drop_remainder=True)

    def compute_loss(self, model, batch, training=True):
        logits = tf.cast(model(batch["image"], training=training), tf.float32)
        losses = keras.losses.sparse_categorical_crossentropy(
            batch["label"], logits, from_logits=True
        )
        return tf.reduce_sum(losses) / self.micro_batch_size

    def eval_step(self, model, batch):
        logits = model(batch["image"], training=False)
        correct = tf.cast(tf.equal(tf.argmax(logits, -1, output_type=tf.int32), batch["label"]),
                          tf.float32)  # fmt: skip
        return {"correct": correct * batch["valid"], "count": batch["valid"]}

    def eval_result(self, state):
        return float(state["correct"] / max(state["count"], 1.0))

    def mlperf_hparams(self):
        return {C.OPT_NAME: "sgd", C.OPT_BASE_LR: self.config.learning_rate}


def weights(model) -> list[np.ndarray]:
    """The model's weights as numpy arrays, for comparisons."""
    return [np.array(w) for w in model.get_weights()]
