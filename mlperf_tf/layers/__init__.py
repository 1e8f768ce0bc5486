"""Provides layers shared by the benchmarks: cross-replica batch norm with a group size."""

from mlperf_tf.layers.batch_norm import CrossReplicaBatchNormalization, model_bn_span

__all__ = ["CrossReplicaBatchNormalization", "model_bn_span"]
