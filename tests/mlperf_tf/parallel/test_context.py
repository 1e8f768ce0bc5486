"""Tests of the ambient mesh (`mlperf_tf.parallel.context`)."""

import threading

import pytest

from mlperf_tf.parallel import DeviceMesh, current_mesh, use_mesh
from mlperf_tf.parallel.context import resolve


def test_no_mesh_outside_a_run():
    assert current_mesh() is None


def test_use_mesh_sets_and_restores_nested_meshes():
    outer, inner = DeviceMesh(data=2), DeviceMesh(model=2)
    with use_mesh(outer):
        assert current_mesh() is outer
        with use_mesh(inner):
            assert current_mesh() is inner
        assert current_mesh() is outer
    assert current_mesh() is None


def test_use_mesh_restores_after_an_error():
    with pytest.raises(RuntimeError), use_mesh(DeviceMesh(model=2)):
        raise RuntimeError("boom")
    assert current_mesh() is None


def test_the_ambient_mesh_is_per_thread():
    seen = []
    with use_mesh(DeviceMesh(model=2)):
        thread = threading.Thread(target=lambda: seen.append(current_mesh()))
        thread.start()
        thread.join(timeout=10)
    assert seen == [None]


def test_resolve_prefers_a_given_mesh():
    given = DeviceMesh(data=4)
    with use_mesh(DeviceMesh(model=2)):
        assert resolve(given) is given
        assert resolve(None) == DeviceMesh(model=2)


def test_use_mesh_refuses_other_types():
    with pytest.raises(TypeError, match="DeviceMesh"), use_mesh("model=2"):
        pass


def test_a_layer_built_under_the_ambient_mesh_keeps_it():
    from mlperf_tf.layers.tensor_parallel import ColumnParallelDense

    with use_mesh(DeviceMesh(model=2)):
        layer = ColumnParallelDense(4, name="dense")
    assert layer.mesh == DeviceMesh(model=2)
    assert layer.axis.size == 2
    assert ColumnParallelDense(4, name="plain").axis.size == 1


def test_moe_layers_take_the_expert_axis_of_the_ambient_mesh():
    from mlperf_tf.layers.moe import MoEFeedForward

    settings = dict(hidden_size=4, filter_size=8, num_experts=4, group_size=8)
    with use_mesh(DeviceMesh(data=2, expert=2)):
        split = MoEFeedForward(**settings)
        told = MoEFeedForward(**settings, expert_parallel=1)  # a caller's explicit size stays
    assert (split.expert_parallel, split.local_experts) == (2, 2)
    assert (told.expert_parallel, told.local_experts) == (1, 4)
    assert MoEFeedForward(**settings).expert_parallel == 1  # no run, no split


def test_the_spatial_builder_takes_the_ambient_spatial_layout():
    from mlperf_tf.layers.spatial import SpatialBuilder

    with use_mesh(DeviceMesh(data=1, spatial=4, spatial_cols=2)):
        builder = SpatialBuilder()
    assert (builder.parts, builder.layout.row_parts, builder.layout.col_parts) == (4, 2, 2)
    assert SpatialBuilder().parts == 1


def test_models_check_their_split_dimensions_against_the_ambient_mesh():
    from mlperf_tf.errors import UserError
    from mlperf_tf.parallel.layout import check_divides

    check_divides(heads=3)  # no run: nothing to split
    with use_mesh(DeviceMesh(model=2)), pytest.raises(UserError, match="must divide heads"):
        check_divides(heads=3)
