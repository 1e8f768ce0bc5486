"""Provides layers shared by the benchmarks: cross-replica batch norm with a group size,
`token_matmul`, the 2-D projection the attention models use, and the token layouts with which
they skip padding (`PackedTokens`); the mixture-of-experts block lives in `mlperf_tf.layers.moe`."""

from mlperf_tf.layers.batch_norm import CrossReplicaBatchNormalization, model_bn_span
from mlperf_tf.layers.matmul import token_matmul
from mlperf_tf.layers.packing import PADDED, PackedTokens, PaddedTokens

__all__ = [
    "PADDED",
    "CrossReplicaBatchNormalization",
    "PackedTokens",
    "PaddedTokens",
    "model_bn_span",
    "token_matmul",
]
