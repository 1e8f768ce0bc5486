"""Weight-update sharding for FLUX (`--weight_update_sharding`, issue 42 item 2): a few smoke
steps with data parallelism, each replica updating a 1/N piece of every variable with its own
optimizer slots, end at the weights of the unsharded run of the same data.

The smoke batches differ between data replicas (design.md), so the gradient sum is exercised;
the model has no dropout. Both runs use the benchmark's own optimizer (AdamW 0.9/0.95, weight
decay 0.1 on every parameter, warm-up then constant) and its clip (global norm 1.0), from the
same live modulation weights as the tensor-parallel test (`_LiveGates`: at the reference's zero
init, Adam turns the rounding noise of exactly-zero gradients into lr-sized steps).

AdamW declares its sharded rule (`mlperf_tf/optimizers`: `sharded_update`, element-wise, no
whole-tensor norms), so the sharded runs use flux1's own optimizer; before it did, flux1 was
refused with a one-line error naming AdamW.
"""

import pytest

from benchmarks.flux1 import config as config_lib
from mlperf_tf.parallel.context import use_mesh
from mlperf_tf.parallel.mesh import build_mesh
from tests import tensor_parallel
from tests.benchmarks.flux1.test_tensor_parallel import _LiveGates

pytestmark = pytest.mark.numerics
CLIP = 1.0  # FluxConfig's clip (toml `training.max_norm`)


def _run(num_devices: int, model_parallel: int, sharded: bool) -> tensor_parallel.Result:
    bench = _LiveGates(config_lib.smoke())
    with use_mesh(build_mesh(num_devices, model_parallel=model_parallel)):
        return _train(bench, num_devices, model_parallel, sharded)


def _train(bench, num_devices: int, model_parallel: int, sharded: bool, optimizer: str = "own"):
    return tensor_parallel.train(
        bench, num_devices=num_devices, model_parallel=model_parallel, optimizer=optimizer,
        steps=4, weight_update_sharding=sharded, clip_norm=CLIP,
    )  # fmt: skip


def _assert_same_weights(got: tensor_parallel.Result, ref: tensor_parallel.Result) -> None:
    """Losses, first gradients and final weights equal at 1e-5 of the largest gradient and
    weight of the model (`tests/tensor_parallel.py:assert_same_run`: the scale, not 1e-5
    absolute, so rounding noise on values near zero does not fail it)."""
    tensor_parallel.assert_same_run(got, ref, rtol=1e-5)


@pytest.mark.slow  # 17 s; AdamW's sharded rule is in the default run (collectives/test_summer.py)
def test_sharded_update_equals_the_unsharded_run():
    got = _run(2, 1, sharded=True)
    ref = _run(2, 1, sharded=False)
    _assert_same_weights(got, ref)


@pytest.mark.slow
def test_sharded_update_with_model_parallelism_equals_the_unsharded_run():
    got = _run(4, 2, sharded=True)
    ref = _run(4, 2, sharded=False)
    _assert_same_weights(got, ref)


@pytest.mark.slow
@pytest.mark.parametrize("num_devices, model_parallel", [(2, 1), (4, 2)])
def test_flux_variables_shard_exactly_with_a_supported_optimizer(num_devices, model_parallel):
    """flux1's variables (replicated, and column/row
    split at M = 2) through the sharded update with LAMB (which has a rule) equal the unsharded
    LAMB run. Measured 2026-11-27: weights differ by 2.4e-7 (M = 1) and 1.2e-7 (M = 2) at a scale
    of 1.08."""
    runs = []
    for sharded in (True, False):
        bench = _LiveGates(config_lib.smoke())
        with use_mesh(build_mesh(num_devices, model_parallel=model_parallel)):
            runs.append(_train(bench, num_devices, model_parallel, sharded, optimizer="lamb"))
    _assert_same_weights(*runs)
