"""Provides the suite's parallelism as benchmarks see it: the run's mesh, the layers that split work, and the helpers for split weights.

Every replica runs the same step on its part (single program, multiple data); a benchmark's model
is written for one device and states where work splits by the layers it picks. This is the one
module benchmarks import parallelism from (with the plain layers of `mlperf_tf.layers`); what is
behind it (`mlperf_tf.parallel`, `mlperf_tf.collectives`, the layer modules) may move without a
benchmark changing. `tests/test_layering.py` holds benchmarks to it.

`mlperf_tf.parallel` itself stays free of TensorFlow (the simulator and the flag checks import
its `DeviceMesh`); this module imports TensorFlow through the layers.

| name | what |
|---|---|
| `DeviceMesh`, `current_mesh`, `use_mesh` | the run's mesh, read by the layers (the runner sets it) |
| `AxisGroup`, `ModelAxis` | this replica's group along mesh axes and its collectives (f/g, sums, gathers, all-to-all, halo) |
| `ColumnParallelDense`, `RowParallelDense`, `VocabParallelEmbedding`, `vocab_parallel_lookup`, `vocab_parallel_cross_entropy` | Megatron's tensor-parallel layers over `model` |
| `MoEConfig`, `MoEFeedForward` | the mixture-of-experts layer, split over `expert` |
| `SpatialLayout`, `SpatialBuilder`, `stem_refusal` | spatial partitioning of convolutional trunks over `spatial` |
| `REPLICATED`, `model_split`, `add_split_weight`, `check_divides`, `layout_of`, `assign_shards`, `assign_whole`, `whole_shape`, `splits_weights` | the layouts of split weights, and loading whole tensors into them |
| `loop_function` | a decoding loop that issues collectives in replica context |
"""

from mlperf_tf.collectives.axis_group import AxisGroup
from mlperf_tf.collectives.ops import loop_function
from mlperf_tf.layers.moe import MoEConfig, MoEFeedForward
from mlperf_tf.layers.spatial import SpatialBuilder
from mlperf_tf.layers.tensor_parallel import (
    ColumnParallelDense,
    ModelAxis,
    RowParallelDense,
    VocabParallelEmbedding,
    vocab_parallel_cross_entropy,
    vocab_parallel_lookup,
)
from mlperf_tf.parallel.context import current_mesh, use_mesh
from mlperf_tf.parallel.layout import (
    REPLICATED,
    add_split_weight,
    assign_shards,
    assign_whole,
    check_divides,
    layout_of,
    model_split,
    splits_weights,
    whole_shape,
)
from mlperf_tf.parallel.mesh import DeviceMesh
from mlperf_tf.parallel.spatial import SpatialLayout, stem_refusal

__all__ = [
    "REPLICATED",
    "AxisGroup",
    "ColumnParallelDense",
    "DeviceMesh",
    "MoEConfig",
    "MoEFeedForward",
    "ModelAxis",
    "RowParallelDense",
    "SpatialBuilder",
    "SpatialLayout",
    "VocabParallelEmbedding",
    "add_split_weight",
    "assign_shards",
    "assign_whole",
    "check_divides",
    "current_mesh",
    "layout_of",
    "loop_function",
    "model_split",
    "splits_weights",
    "stem_refusal",
    "use_mesh",
    "vocab_parallel_cross_entropy",
    "vocab_parallel_lookup",
    "whole_shape",
]
