"""Provides the input side shared by every benchmark: tf.data pipelines, TFRecords, image ops."""

from mlperf_tf.data.pipeline import (
    eval_pipeline,
    list_files,
    pad_eval_dataset,
    training_pipeline,
    translate_errors,
)
from mlperf_tf.data.synthetic import synthetic_dataset

__all__ = [
    "eval_pipeline",
    "list_files",
    "pad_eval_dataset",
    "synthetic_dataset",
    "training_pipeline",
    "translate_errors",
]
