"""deepseekv3_671b under expert and tensor parallelism on 4 logical devices: the same losses,
gradients and weights as the unsplit run (routed experts over the expert axis with all-to-alls,
the shared expert replicated; MLA's up-projections column-split and its output row-split)."""

from __future__ import annotations

import pytest

from benchmarks.deepseekv3_671b.benchmark import DeepseekV3Benchmark
from tests import tensor_parallel

pytestmark = pytest.mark.numerics


@pytest.mark.parametrize(
    ("expert_parallel", "model_parallel"),
    # slow: each split run costs about a minute of CPU (MLA + MTP + 8 experts on 4 devices),
    # past the default run's budget; measured passing (README "Status").
    [
        pytest.param(2, 1, marks=pytest.mark.slow),
        pytest.param(1, 2, marks=pytest.mark.slow),
        pytest.param(2, 2, marks=pytest.mark.slow),
    ],
    ids=["E2", "M2", "E2xM2"],
)
def test_parallel_deepseek_v3_equals_the_unsplit_run(expert_parallel, model_parallel):
    """3 Adam steps of the smoke DeepSeek-V3 (MLA, 8 experts in 4 groups, top-2 of 2 groups, a
    shared expert, MTP) against the unsplit run of the same batch shards, at a scale-aware
    1e-5 (the floor of the suite's other MoE benchmark at these shapes)."""
    got = tensor_parallel.assert_split_equals_unsplit(
        tensor_parallel.smoke(DeepseekV3Benchmark), num_devices=4, model_parallel=model_parallel,
        expert_parallel=expert_parallel, optimizer="adam", steps=3, rtol=1e-5,
    )  # fmt: skip
    assert got.losses[-1] < got.losses[0]


@pytest.mark.parametrize(
    "expert_parallel",
    # slow: about a minute of CPU each (MLA's latent gather, MTP, 8 experts on 4 devices).
    [pytest.param(1, marks=pytest.mark.slow), pytest.param(2, marks=pytest.mark.slow)],
    ids=["C2xD2", "C2xE2"],
)
def test_context_parallel_deepseek_v3_equals_the_unsplit_run(expert_parallel):
    """3 Adam steps of the smoke DeepSeek-V3 with each sequence in 4 zig-zag chunks over 2
    context members (MLA's latent and rotated k_pe gathered; MTP's shifted tokens and targets
    taken from the whole sequence; the sequence-wise balance loss over whole sequences) against
    the unsplit run of the same 2 batch shards."""
    got = tensor_parallel.assert_split_equals_unsplit(
        tensor_parallel.smoke(DeepseekV3Benchmark), num_devices=4, model_parallel=1,
        expert_parallel=expert_parallel, context_parallel=2, optimizer="adam", steps=3,
        rtol=1e-5,
    )  # fmt: skip
    assert got.losses[-1] < got.losses[0]
