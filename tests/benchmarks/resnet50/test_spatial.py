"""ResNet-50 with spatial partitioning: K slabs (K x L tiles) per image train exactly as the whole
image."""

import dataclasses

import pytest

from benchmarks.resnet50 import config as config_lib
from benchmarks.resnet50.benchmark import ResNet50Benchmark
from mlperf_tf.benchmark import RunContext
from mlperf_tf.config import ConfigError
from mlperf_tf.parallel.mesh import DeviceMesh
from tests import spatial_exact

pytestmark = pytest.mark.numerics


def _bench(*, bn_group_size=1, image_size=32, block_layers=(1, 1, 1)):
    """The smoke ResNet (width 8, 32 px) with 3 stages (seconds to trace on 4 replicas), 8
    images a step, no zero-init gamma (so every gradient is non-zero)."""
    config = config_lib.smoke()
    config = dataclasses.replace(
        config,
        global_batch_size=8,
        model=dataclasses.replace(
            config.model,
            bn_group_size=bn_group_size,
            block_layers=block_layers,
            zero_init_last_gamma=False,
        ),
        data=dataclasses.replace(config.data, image_size=image_size),
    )
    return ResNet50Benchmark(config)


@pytest.mark.parametrize(
    ("parts", "bn_group_size"),
    [
        # 26 s: by default ResNet-50's spatial split is checked through the runner (2x2 tiles,
        # tests/mlperf_tf/test_runner_spatial.py) and the slab layers with grouped batch norm at
        # layer level (tests/mlperf_tf/layers/test_spatial.py).
        pytest.param(2, 2, marks=pytest.mark.slow),
        pytest.param(4, 1, marks=pytest.mark.slow),
        pytest.param(2, 1, marks=pytest.mark.slow),
    ],
)
def test_slabs_train_as_the_whole_image(parts, bn_group_size):
    """5 LARS steps; K=2: 2 batch shards whose BN group spans both (4 replicas, groups of 4);
    K=4: one batch shard, whose slabs reach a stage whose rows no longer split (4 rows at stage
    3, stride 2), which then runs whole: both layouts are exercised."""
    spatial_exact.assert_same_training(_bench(bn_group_size=bn_group_size), parts=parts)


@pytest.mark.slow
@pytest.mark.parametrize("parts", [2, 4])
def test_four_stages_train_as_the_whole_image(parts):
    """The smoke preset's 4 stages (K=2 gathers before stage 4, K=4 before stage 3)."""
    bench = _bench(bn_group_size=2 if parts == 2 else 1, block_layers=(1, 1, 1, 1))
    spatial_exact.assert_same_training(bench, parts=parts)


def test_an_image_height_that_does_not_split_is_refused():
    bench = _bench(image_size=36).with_context(
        RunContext(num_replicas=4, mesh=DeviceMesh(data=1, spatial=4))
    )
    with pytest.raises(
        ConfigError,
        match=r"--spatial_partition=4: at an image side of 36 \(`data.image_size`\) no layer splits into 4 slabs",
    ):
        bench.build_model()


@pytest.mark.slow  # 44 s on a quiet machine; the tile layers' exactness runs by default
def test_two_by_two_tiles_train_as_the_whole_image():
    """`--spatial_partition=2x2`: one batch shard of 8 images in 4 tiles (all stages split at
    32 px: the last stage's 4 x 4 map is 2 x 2 per tile), 5 LARS steps against one device."""
    spatial_exact.assert_same_training(_bench(), parts=4, cols=2)


def test_an_image_width_that_does_not_split_into_tiles_is_refused():
    bench = _bench(image_size=36).with_context(
        RunContext(num_replicas=4, mesh=DeviceMesh(data=2, spatial=2, spatial_cols=2))
    )
    with pytest.raises(
        ConfigError, match=r"--spatial_partition=1x2: at an image side of 36"
    ) as raised:
        bench.build_model()
    assert "multiple of 8" in str(raised.value) and "\n" not in str(raised.value)


def test_model_bn_span_counts_images_not_slabs():
    bench = _bench(bn_group_size=2).with_context(
        RunContext(num_replicas=4, mesh=DeviceMesh(data=2, spatial=2))
    )
    # 8 images over 2 batch shards = 4 per shard; BN groups of 2 shards: 8 images.
    assert bench.per_replica_batch_size == 4
    assert bench.model_bn_span() == 8
