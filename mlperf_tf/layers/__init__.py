"""Provides layers shared by the benchmarks: cross-replica batch norm with a group size,
`token_matmul`, the 2-D projection the attention models use, and the token layouts with which
they skip padding (`PackedTokens`), and the halo-exchange layers of spatial partitioning
(`spatial`); the mixture-of-experts block lives in `mlperf_tf.layers.moe`."""

from mlperf_tf.layers.batch_norm import CrossReplicaBatchNormalization, model_bn_span
from mlperf_tf.layers.matmul import token_matmul
from mlperf_tf.layers.packing import PADDED, PackedTokens, PaddedTokens
from mlperf_tf.layers.spatial import (
    HaloConv2D,
    HaloMaxPooling2D,
    SpatialGather,
    SpatialGlobalAveragePooling2D,
    SpatialSlice,
)

__all__ = [
    "PADDED",
    "CrossReplicaBatchNormalization",
    "HaloConv2D",
    "HaloMaxPooling2D",
    "PackedTokens",
    "PaddedTokens",
    "SpatialGather",
    "SpatialGlobalAveragePooling2D",
    "SpatialSlice",
    "model_bn_span",
    "token_matmul",
]
