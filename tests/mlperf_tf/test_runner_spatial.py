"""`--spatial_partition` through the runner (`runner.run`, what `mlperf-tf run` calls).

The layer- and model-level exactness tests (tests/spatial_exact.py) sum gradients with Keras' own
replica sum; the runner sums them with `GradientSummer` over the mesh's gradient axes (data and
spatial). Before the summer summed each axis group on a view of its own size, a 2x2 run logged
other losses than one device (ResNet smoke: 1.9599 against 1.8983 at step 16), which no
model-level test saw. Here ResNet-50 smoke (its first three stages) runs 2x2 tiles on 4 logical
CPUs and ends at the one-device run's weights and moving statistics.
"""

import numpy as np
import pytest
import tensorflow as tf

from mlperf_tf import config as config_lib
from mlperf_tf import registry, runner

pytestmark = [pytest.mark.numerics]

STEPS = 3
RTOL = 1e-4


def _run(model_dir, *, devices: int, spatial: str) -> dict[str, np.ndarray]:
    assert len(tf.config.list_logical_devices("CPU")) >= 4
    config = runner.RunConfig(
        model_dir=str(model_dir), num_cpu_devices=devices, spatial_partition=spatial,
        max_train_steps=STEPS, collective_timeout=60, warm_up=False,
    )  # fmt: skip
    resnet = registry.get("resnet50")
    # Three stages of the smoke model (a third less to trace on four replicas than its four).
    smoke = config_lib.override(resnet.preset("smoke"), {"model.block_layers": "(1, 1, 1)"})
    result = runner.run(resnet(smoke), config)
    assert result.steps == STEPS
    return {v.path: v.numpy() for v in result.model.variables}


# Extended (CI runs it after README's default run); the default run covers its case by
# layers/test_spatial.py (tiled = whole) and parallel/test_spatial_cli.py (the flags through the
# CLI).
@pytest.mark.extended
def test_two_by_two_tiles_through_the_runner_end_at_the_one_device_weights(tmp_path):
    whole = _run(tmp_path / "one", devices=1, spatial="1")
    tiled = _run(tmp_path / "tiles", devices=4, spatial="2x2")
    assert sorted(tiled) == sorted(whole)
    for path, expected in whole.items():
        scale = max(float(np.max(np.abs(expected))), 1e-3)
        np.testing.assert_allclose(
            tiled[path], expected, rtol=RTOL, atol=RTOL * scale, err_msg=f"weight {path}"
        )
    # Not trivially equal: the moving means start at 0 and the steps moved them far beyond the
    # tolerance (so the tiles' batch statistics, hence their halos, entered the comparison).
    means = [w for p, w in whole.items() if p.endswith("moving_mean")]
    assert means and max(float(np.max(np.abs(m))) for m in means) > 100 * RTOL
