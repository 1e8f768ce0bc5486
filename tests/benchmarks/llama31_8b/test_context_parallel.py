"""llama31_8b and gpt_oss_20b under context parallelism (`--context_parallel=2`, each sequence in
4 zig-zag chunks over 2 members) on 4 logical devices: the losses, whole first gradients and
whole weights of the unsplit run of the same batch shards, alone and with data (C2 x D2) and
expert (C2 x E2) parallelism."""

from __future__ import annotations

import pytest

from benchmarks.gpt_oss_20b.benchmark import GptOssBenchmark
from benchmarks.llama31_8b.benchmark import Llama31Benchmark
from mlperf_tf.benchmark import RunContext
from mlperf_tf.errors import UserError
from mlperf_tf.parallel.mesh import DeviceMesh
from tests import tensor_parallel

pytestmark = pytest.mark.numerics


def test_c2_x_d2_llama_equals_the_unsplit_run():
    """3 Adam steps of the smoke Llama (GQA 4/2 heads, sequence 32), each of the 2 data groups
    reading its own synthetic tokens, split C = 2 on 4 devices against data = 2 on 2."""
    got = tensor_parallel.assert_split_equals_unsplit(
        tensor_parallel.smoke(Llama31Benchmark), num_devices=4, model_parallel=1,
        context_parallel=2, optimizer="adam", steps=3, rtol=1e-5,
    )  # fmt: skip
    assert got.losses[-1] < got.losses[0]


def test_c2_x_e2_gpt_oss_equals_the_unsplit_run():
    """The smoke GPT-OSS (4 experts, top-2, dropless, sliding-window layers and sinks) at
    C = 2 x E = 2 on 4 devices against data = 2 on 2."""
    got = tensor_parallel.assert_split_equals_unsplit(
        tensor_parallel.smoke(GptOssBenchmark), num_devices=4, model_parallel=1,
        expert_parallel=2, context_parallel=2, optimizer="adam", steps=3, rtol=1e-5,
    )  # fmt: skip
    assert got.losses[-1] < got.losses[0]


def test_a_context_axis_that_does_not_cut_the_sequence_is_one_line():
    bench = Llama31Benchmark(
        Llama31Benchmark.preset("smoke"), context=RunContext(mesh=DeviceMesh(context=3))
    )
    with pytest.raises(UserError, match=r"--context_parallel=3 cuts each sequence into 6") as e:
        bench.build_model()
    assert "\n" not in str(e.value)
    assert "context" in bench.parallel_axes
