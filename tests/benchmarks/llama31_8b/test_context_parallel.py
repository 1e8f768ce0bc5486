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
from tests import noise_floor, tensor_parallel
from tests.numerics import assert_close

pytestmark = pytest.mark.numerics


def test_c2_x_d2_llama_equals_the_unsplit_run():
    """3 Adam steps of the smoke Llama (GQA 4/2 heads, sequence 32), each of the 2 data groups
    reading its own synthetic tokens, split C = 2 on 4 devices against data = 2 on 2."""
    got = tensor_parallel.assert_split_equals_unsplit(
        tensor_parallel.smoke(Llama31Benchmark), num_devices=4, model_parallel=1,
        context_parallel=2, optimizer="adam", steps=3, rtol=1e-5,
    )  # fmt: skip
    assert got.losses[-1] < got.losses[0]


@pytest.mark.slow  # 15-20 CPU s; C2 x D2 above runs by default
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


@pytest.mark.slow
def test_a_checkpoint_saved_at_c2_resumes_at_c1_and_the_reverse(tmp_path):
    """Context parallelism splits no weight: a checkpoint holds the same whole tensors at C = 2
    and C = 1. Two steps at each C, saved (the same weights and Adam slots); a step resumed at
    the other C from each equals the other (weights and slots, scale-aware 1e-5), and every
    saved variable is restored (`assert_consumed`)."""
    bench = tensor_parallel.smoke(Llama31Benchmark)
    args = dict(model_parallel=1, optimizer="adam")
    one = tensor_parallel.train(bench, num_devices=2, steps=2, save_to=str(tmp_path / "c1"), **args)
    two = tensor_parallel.train(
        bench, num_devices=4, context_parallel=2, steps=2, save_to=str(tmp_path / "c2"), **args
    )
    tensor_parallel.assert_same_run(two, one)
    to_c2 = tensor_parallel.train(
        bench, num_devices=4, context_parallel=2, steps=1, restore_from=str(tmp_path / "c1"),
        **args,
    )  # fmt: skip
    to_c1 = tensor_parallel.train(
        bench, num_devices=2, steps=1, restore_from=str(tmp_path / "c2"), **args
    )
    tensor_parallel.assert_same_run(to_c2, to_c1)
    assert to_c2.slots.keys() == to_c1.slots.keys()
    for name, value in to_c1.slots.items():
        assert_close(to_c2.slots[name], value, rtol=1e-5, err_msg=name)


_UNSPLIT_RUN = """
from benchmarks.llama31_8b.benchmark import Llama31Benchmark
from tests import tensor_parallel
weights = tensor_parallel.train(tensor_parallel.smoke(Llama31Benchmark), num_devices=2,
                                model_parallel=1, optimizer="adam", steps=3).weights
"""


@pytest.mark.slow
def test_c2_stays_within_the_noise_floor_of_the_unsplit_run(tmp_path):
    """The C = 2 run's gap to the unsplit run, against the unsplit run's own noise floor: the
    same 3 steps with oneDNN off (`TF_ENABLE_ONEDNN_OPTS=0`, other kernels and summation
    orders) in a subprocess. The split may not move the weights further from the unsplit run
    than a change of kernels does (x 10, and at least 1e-6 of the largest weight)."""
    off = noise_floor.onednn_off_weights(_UNSPLIT_RUN, tmp_path, devices=2)
    bench = tensor_parallel.smoke(Llama31Benchmark)
    ref = tensor_parallel.train(bench, num_devices=2, model_parallel=1, optimizer="adam", steps=3)
    got = tensor_parallel.train(
        bench, num_devices=4, model_parallel=1, context_parallel=2, optimizer="adam", steps=3
    )
    noise_floor.assert_within_noise_floor(got.weights, ref.weights, off, what="C=2")
