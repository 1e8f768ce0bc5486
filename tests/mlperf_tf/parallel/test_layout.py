"""Layouts over the device mesh: shard shapes, which replicas hold which shard, which replicas
a gradient is summed with, and the one-line error of a size that does not divide."""

import pytest

from mlperf_tf.errors import UserError
from mlperf_tf.parallel.layout import (
    EXPERT_SPLIT,
    REPLICATED,
    Layout,
    check_divides,
    model_split,
)
from mlperf_tf.parallel.mesh import DeviceMesh


def test_model_split_shards_and_groups():
    mesh = DeviceMesh(data=2, model=2)  # replicas 0 1 | 2 3, model fastest
    layout = model_split(1)
    assert layout.shard_shape((8, 6), mesh) == (8, 3)
    assert [layout.shard_index(mesh, r) for r in range(4)] == [0, 1, 0, 1]
    assert layout.sum_group(mesh, 1) == [1, 3]  # the data axis only
    assert layout.shard_group(mesh, 2) == [2, 3]
    assert REPLICATED.shard_shape((8, 6), mesh) == (8, 6)
    assert REPLICATED.sum_group(mesh, 0) == [0, 2]


def test_expert_layout_is_summed_over_data_only():
    mesh = DeviceMesh(data=2, expert=2)
    layout = Layout(split_axis=0, split_over=("expert",), sum_over=("data",))
    assert layout.shard_shape((4, 3), mesh) == (2, 3)
    assert layout.sum_group(mesh, 1) == [1, 3]
    assert REPLICATED.sum_group(mesh, 1) == [0, 1, 2, 3]


def test_expert_split_is_summed_over_data_and_spatial_never_expert_or_model():
    mesh = DeviceMesh(data=2, expert=2, model=2)  # ids: data*4 + expert*2 + model
    assert EXPERT_SPLIT.shard_shape((4, 3), mesh) == (2, 3)
    assert [EXPERT_SPLIT.shard_index(mesh, r) for r in range(8)] == [0, 0, 1, 1, 0, 0, 1, 1]
    assert EXPERT_SPLIT.sum_group(mesh, 3) == [3, 7]  # same expert and model index
    assert EXPERT_SPLIT.shard_group(mesh, 1) == [1, 3]  # the all-to-all's peers
    assert EXPERT_SPLIT.sum_axes(mesh) == ("data",)
    assert REPLICATED.sum_axes(mesh) == ("data", "expert")
    assert EXPERT_SPLIT.sum_group(DeviceMesh(expert=2, spatial=2), 0) == [0, 1]


def test_bad_layouts_and_sizes():
    with pytest.raises(ValueError, match="both"):
        Layout(split_axis=0)
    with pytest.raises(ValueError, match="does not split into 4"):
        model_split(0).shard_shape((6, 2), DeviceMesh(model=4))
    with pytest.raises(UserError, match=r"^--model_parallel=4 must divide model.num_heads \(6\)"):
        check_divides(DeviceMesh(model=4), **{"model.num_heads": 6})


def test_replicated_gradients_are_summed_over_the_spatial_slabs():
    # Spatial replicas each hold the partial gradient of their slab: a replicated weight's sum
    # must span them (the runner's summer, --all_reduce=ring etc., uses this group).
    mesh = DeviceMesh(data=2, spatial=2)
    assert REPLICATED.sum_group(mesh, 0) == [0, 1, 2, 3]
    # The shards of a model group compute the same gradient: never summed over `model`.
    assert REPLICATED.sum_group(DeviceMesh(data=2, model=2), 1) == [1, 3]
