"""Provides layers shared by the benchmarks: cross-replica batch norm with a group size, and
`token_matmul`, the 2-D projection the attention models use."""

from mlperf_tf.layers.batch_norm import CrossReplicaBatchNormalization, model_bn_span
from mlperf_tf.layers.matmul import token_matmul

__all__ = ["CrossReplicaBatchNormalization", "model_bn_span", "token_matmul"]
