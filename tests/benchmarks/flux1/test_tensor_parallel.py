"""Tensor-parallel FLUX (`--model_parallel=2`): a few smoke steps on a data x model mesh of
logical CPUs (dropout off: the model has none) end at the unsplit run's losses, gradients and
weights. The smoke model has 2 heads and an MLP of 128: M = 2 puts one head and 64 MLP features
on each shard, in both block kinds. The model is built under the ambient mesh, as the runner
builds it.

The reference initialization zeroes every modulation and the output layer, so at first the
gates are 0 and the attention and MLP weights get exactly zero gradients; Adam turns the
rounding noise of such near-zero gradients into lr-sized steps (the noise floor of
`../shared/design.md`). The test starts from the same random modulation and output weights
on both meshes instead, so every weight gets a real gradient from the first step."""

import numpy as np
import pytest

from benchmarks.flux1 import config as config_lib
from benchmarks.flux1.benchmark import FluxBenchmark
from mlperf_tf.parallel.context import use_mesh
from mlperf_tf.parallel.mesh import build_mesh
from tests import tensor_parallel

pytestmark = pytest.mark.numerics
RTOL = 1e-5


class _LiveGates(FluxBenchmark):
    """The smoke model with seeded random (replicated) modulation and output weights."""

    def build_model(self):
        model = super().build_model()
        rng = np.random.default_rng(5)
        layers = [model.final_layer.ada, model.final_layer.linear]
        for block in model.double_blocks:
            layers += [block.img.mod.lin, block.txt.mod.lin]
        layers += [block.mod.lin for block in model.single_blocks]
        for layer in layers:
            layer.kernel.assign(rng.normal(scale=0.1, size=layer.kernel.shape).astype("float32"))
        return model


def test_split_run_equals_the_unsplit_run():
    bench = _LiveGates(config_lib.smoke())
    with use_mesh(build_mesh(2, model_parallel=1)):
        ref = tensor_parallel.train(bench, num_devices=2, model_parallel=1, optimizer="adam",
                                    steps=4)  # fmt: skip
    with use_mesh(build_mesh(4, model_parallel=2)):
        got = tensor_parallel.train(bench, num_devices=4, model_parallel=2, optimizer="adam",
                                    steps=4)  # fmt: skip
    assert len(got.weights) == len(ref.weights)
    tensor_parallel.assert_same_run(got, ref, rtol=RTOL)
