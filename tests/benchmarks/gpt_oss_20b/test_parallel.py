"""gpt_oss_20b under expert and tensor parallelism on 4 logical devices: the same losses,
gradients and weights as the unsplit run (the unsplit run dispatches by sorting, the split ones
by capacity buffers and all-to-alls)."""

from __future__ import annotations

import pytest

from benchmarks.gpt_oss_20b.benchmark import GptOssBenchmark
from mlperf_tf.benchmark import RunContext
from mlperf_tf.errors import UserError
from mlperf_tf.parallel.mesh import DeviceMesh
from tests import tensor_parallel

pytestmark = pytest.mark.numerics


def _benchmark(**model) -> GptOssBenchmark:
    """The smoke preset, its model fields replaced by `model`."""
    return tensor_parallel.smoke(GptOssBenchmark, **model)


# Hugging Face's GPT-OSS experts: clamped SwiGLU with biases (the MLPerf reference's have neither).
HF_EXPERTS = {"feed_forward": "swiglu_clamped", "mlp_bias": True}


@pytest.mark.parametrize(
    ("expert_parallel", "model_parallel", "model"),
    [
        (2, 1, {}),
        # Extended (CI runs it after README's default run): the default run covers tensor
        # parallelism by llama31_8b/test_tensor_parallel.py on the same blocks.
        pytest.param(1, 2, {}, marks=pytest.mark.extended),
        pytest.param(2, 1, HF_EXPERTS, marks=pytest.mark.slow),
        pytest.param(2, 2, {}, marks=pytest.mark.slow),
    ],
    ids=["E2", "M2", "E2_clamped_biases", "E2xM2"],
)
def test_parallel_gpt_oss_equals_the_unsplit_run(expert_parallel, model_parallel, model):
    """3 Adam steps of the smoke GPT-OSS (4 experts, top-2, dropless, every layer MoE), each
    batch shard reading its own synthetic tokens, against the unsplit run of the same shards;
    losses, first-step whole gradients and final whole weights at a scale-aware 1e-5. A router
    near-tie that float32 summation order could flip would show as a large difference: the
    tolerance would catch it, and none occurs at these seeds."""
    got = tensor_parallel.assert_split_equals_unsplit(
        _benchmark(**model), num_devices=4, model_parallel=model_parallel,
        expert_parallel=expert_parallel, optimizer="adam", steps=3, rtol=1e-5,
    )  # fmt: skip
    assert got.losses[-1] < got.losses[0]


def test_an_expert_axis_that_does_not_divide_the_experts_is_one_line():
    bench = GptOssBenchmark(
        GptOssBenchmark.preset("smoke"), context=RunContext(mesh=DeviceMesh(expert=3))
    )
    with pytest.raises(UserError, match=r"--expert_parallel=3 must divide .*num_experts` \(4\)"):
        bench.build_model()


@pytest.mark.slow
def test_weight_update_sharding_with_expert_parallelism_equals_the_unsharded_run():
    """3 steps of the benchmark's own AdamW on the smoke GPT-OSS at E = 2 on 4 devices (data =
    2), dropout off, each batch shard reading its own tokens, with `--weight_update_sharding`
    (the experts' moments in pieces over the data axis, every other weight's over all 4
    replicas) against the same mesh without it: losses, first gradients and final whole weights
    at a scale-aware 1e-5."""
    b = _benchmark()
    common = dict(num_devices=4, model_parallel=1, expert_parallel=2, optimizer="own", steps=3)
    ref = tensor_parallel.train(b, **common)
    got = tensor_parallel.train(b, weight_update_sharding=True, **common)
    tensor_parallel.assert_same_run(got, ref, rtol=1e-5)
    assert got.losses[-1] < got.losses[0]
