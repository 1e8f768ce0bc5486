"""Tensor-parallel Llama (`--model_parallel`): 10 steps on a data x model mesh of logical CPUs
end at the unsplit run's losses, gradients and weights. The smoke model has 4 query and 2
key/value heads: M = 2 splits the key/value heads, M = 4 replicates them (each shard keeps the
one its query head uses)."""

import pytest

from benchmarks.llama31_8b import config as config_lib
from benchmarks.llama31_8b.benchmark import Llama31Benchmark
from tests import tensor_parallel

pytestmark = pytest.mark.numerics
RTOL = 1e-5


@pytest.mark.parametrize(
    ("devices", "model_parallel", "optimizer"),
    [(4, 4, "adam"),
     pytest.param(4, 2, "adam", marks=pytest.mark.slow),
     pytest.param(4, 2, "lamb", marks=pytest.mark.slow)],
)  # fmt: skip
def test_split_run_equals_the_unsplit_run(devices, model_parallel, optimizer):
    b = Llama31Benchmark(config_lib.smoke())
    ref = tensor_parallel.train(
        b, num_devices=devices // model_parallel, model_parallel=1, optimizer=optimizer
    )
    got = tensor_parallel.train(
        b, num_devices=devices, model_parallel=model_parallel, optimizer=optimizer
    )
    tensor_parallel.assert_same_run(got, ref, rtol=RTOL)
