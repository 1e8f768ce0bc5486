"""Tensor-parallel Transformer (`--model_parallel`): 10 steps on a data x model mesh of logical
CPUs end at the unsplit run's losses, gradients and weights (same initial weights, data that
differs between data groups, dropout off), and bad sizes are one-line errors."""

import pytest

from benchmarks.transformer.benchmark import TransformerBenchmark
from mlperf_tf.benchmark import RunContext
from mlperf_tf.errors import UserError
from mlperf_tf.parallel.context import use_mesh
from mlperf_tf.parallel.mesh import DeviceMesh
from tests import tensor_parallel

pytestmark = pytest.mark.numerics
RTOL = 1e-5


def benchmark(**model):
    """The smoke Transformer, dropout off, `model` fields replaced (the checkpoint tests' too)."""
    model = {"dropout": 0.0, "attention_dropout": 0.0, "relu_dropout": 0.0, **model}
    return tensor_parallel.smoke(TransformerBenchmark, **model)


@tensor_parallel.split_cases((4, 2, "adam"), (4, 2, "lamb"), (4, 4, "adam"), (4, 4, "lamb"))
def test_split_run_equals_the_unsplit_run(devices, model_parallel, optimizer):
    # One layer of each stack (half the tracing of the smoke's two): every split layer kind runs.
    tensor_parallel.assert_split_equals_unsplit(
        benchmark(num_layers=1), num_devices=devices, model_parallel=model_parallel,
        optimizer=optimizer, rtol=RTOL,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("field", "value"), [("num_heads", 2), ("filter_size", 66), ("vocab_size", 66)]
)
def test_model_parallel_must_divide_each_split_dimension(field, value):
    b = benchmark(**{field: value, **({"hidden_size": 32} if field == "num_heads" else {})})
    mesh = DeviceMesh(data=1, model=4)
    b = b.with_context(RunContext(num_replicas=4, mesh=mesh))
    with pytest.raises(
        UserError, match=rf"--model_parallel=4 must divide model.{field} \({value}\)"
    ):
        with use_mesh(mesh):
            b.build_model()
