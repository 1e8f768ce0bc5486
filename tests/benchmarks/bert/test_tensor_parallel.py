"""Tensor-parallel BERT (`--model_parallel`): 10 steps on a data x model mesh of logical CPUs
end at the unsplit run's losses, gradients and weights (same initial weights, data that differs
between data groups, dropout off), with LAMB (the reference's) and Adam."""

import pytest

from benchmarks.bert.benchmark import BertBenchmark
from mlperf_tf.benchmark import RunContext
from mlperf_tf.errors import UserError
from mlperf_tf.parallel.context import use_mesh
from mlperf_tf.parallel.mesh import DeviceMesh
from tests import tensor_parallel

pytestmark = pytest.mark.numerics
RTOL = 1e-5


def benchmark(**model):
    # 4 heads, so that 4 model shards get one each (the smoke model has 2).
    model = {"hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0,
             "num_attention_heads": 4, **model}  # fmt: skip
    return tensor_parallel.smoke(BertBenchmark, **model)


@tensor_parallel.split_cases((4, 2, "lamb"), (4, 4, "lamb"), (4, 2, "adam"), (4, 2, "lars"))
def test_split_run_equals_the_unsplit_run(devices, model_parallel, optimizer):
    # One encoder layer (half the tracing of the smoke's two): every split layer kind runs.
    tensor_parallel.assert_split_equals_unsplit(
        benchmark(num_hidden_layers=1), num_devices=devices, model_parallel=model_parallel,
        optimizer=optimizer, rtol=RTOL,
    )  # fmt: skip


def test_model_parallel_must_divide_the_heads():
    b = benchmark(num_attention_heads=2)
    b = b.with_context(RunContext(num_replicas=4, mesh=DeviceMesh(model=4)))
    with pytest.raises(
        UserError, match=r"--model_parallel=4 must divide model.num_attention_heads \(2\)"
    ):
        with use_mesh(b.mesh):
            b.build_model()
