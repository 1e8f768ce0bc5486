"""Provides `ParsedInput`: the four input hooks of a benchmark whose records parse to examples.

BERT and Llama read TFRecords whose parse alone makes the finished example (no image decode or
random augmentation), and make synthetic batches from one random-example function. Their
`input.py` declares how to parse and what a random example is; this class makes the standard
hooks from that (`train_dataset`, `eval_dataset`, `synthetic_train_dataset`,
`synthetic_eval_dataset`: the names `Benchmark.input_module` looks up), so they are written
once, not once per benchmark.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable
from typing import Any

import tensorflow as tf

from mlperf_tf.data import pipeline, synthetic

# Added to the run's seed for eval batches, so they never repeat the training batches.
EVAL_SEED_OFFSET = 1_000_000


@dataclasses.dataclass(frozen=True)
class ParsedInput:
    """The input hooks of a benchmark config with `data_dir`, `data.train_pattern`,
    `data.eval_pattern`, `data.shuffle_buffer` and `eval_examples`.

    Attributes:
      what: the records' name in errors ("BERT" -> "no BERT train TFRecord matches ...").
      make_parse_fn: config -> (serialized record -> example dict); a record of other lengths
        than the config's must fail to parse (a bad record).
      synthetic_example: (config, seed) -> one random example with the real structure (seed an
        int or a scalar tensor).
    """

    what: str
    make_parse_fn: Callable[[Any], Callable[[tf.Tensor], dict]]
    synthetic_example: Callable[[Any, Any], dict]

    def train_files(self, config) -> list[str]:
        """The training TFRecords under `config.data_dir` (sorted; an error names the pattern)."""
        return pipeline.list_files(
            os.path.join(config.data_dir, config.data.train_pattern),
            what=f"{self.what} train TFRecord",
        )

    def eval_files(self, config) -> list[str]:
        """The eval TFRecords under `config.data_dir`."""
        return pipeline.list_files(
            os.path.join(config.data_dir, config.data.eval_pattern),
            what=f"{self.what} eval TFRecord",
        )

    def train_dataset(
        self,
        config,
        *,
        input_context: tf.distribute.InputContext | None,
        batch_size: int,
        seed: int,
        skip_bad_records: bool = False,
    ) -> tf.data.Dataset:
        """Endless shuffled per-replica training batches of this pipeline's shard of the files."""
        return pipeline.training_pipeline(
            self.train_files(config),
            input_context=input_context,
            parse_fn=self.make_parse_fn(config),
            transform_fn=None,
            batch_size=batch_size,
            shuffle_buffer=config.data.shuffle_buffer,
            seed=seed,
            skip_bad_records=skip_bad_records,
        )

    def eval_dataset(
        self,
        config,
        *,
        input_context: tf.distribute.InputContext | None,
        batch_size: int,
        num_batches: int,
        skip_bad_records: bool = False,
    ) -> tf.data.Dataset:
        """Exactly `num_batches` per-replica eval batches of this pipeline's shard, in file order
        (unshuffled), with `valid`."""
        return pipeline.eval_pipeline(
            self.eval_files(config),
            input_context=input_context,
            parse_fn=self.make_parse_fn(config),
            transform_fn=None,
            batch_size=batch_size,
            num_batches=num_batches,
            skip_bad_records=skip_bad_records,
        )

    def synthetic_train_dataset(self, config, *, batch_size: int, seed: int) -> tf.data.Dataset:
        """One fixed batch of random examples repeated forever (no input cost)."""
        return synthetic.synthetic_dataset(
            lambda s: self.synthetic_example(config, s), batch_size=batch_size, seed=seed
        )

    def synthetic_eval_dataset(
        self, config, *, batch_size: int, num_batches: int, seed: int
    ) -> tf.data.Dataset:
        """`num_batches` batches of random examples (`eval_examples` of them, the rest padding)."""
        return synthetic.synthetic_eval_dataset(
            lambda s: self.synthetic_example(config, s),
            count=config.eval_examples,
            batch_size=batch_size,
            num_batches=num_batches,
            seed=seed + EVAL_SEED_OFFSET,
        )
