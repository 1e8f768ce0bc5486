"""Tensor-parallel LoRA (`--model_parallel`): steps on a data x model mesh of logical CPUs end at
the unsplit run's losses, adapter gradients and adapter weights (dropout off). The smoke model's
fused qkv is column-parallel (A replicated, B split), o_proj row-parallel (A split, B
replicated)."""

import dataclasses

import pytest

from benchmarks.llama2_70b_lora import config as config_lib
from benchmarks.llama2_70b_lora.benchmark import LoraBenchmark
from tests import tensor_parallel

pytestmark = pytest.mark.numerics
RTOL = 1e-5


def test_split_lora_run_equals_the_unsplit_run():
    config = config_lib.smoke()
    config = dataclasses.replace(config, lora=dataclasses.replace(config.lora, dropout=0.0))
    b = LoraBenchmark(config)
    ref = tensor_parallel.train(b, num_devices=2, model_parallel=1, optimizer="own", steps=4)
    got = tensor_parallel.train(b, num_devices=4, model_parallel=2, optimizer="own", steps=4)
    assert {n.rsplit("/", 1)[-1] for n in got.names} == {"lora_a", "lora_b"}
    # The adapters moved away from B = 0 (else A's gradient stays 0 and nothing is tested).
    assert max(abs(w).max() for n, w in zip(got.names, got.weights) if n.endswith("lora_b")) > 0
    tensor_parallel.assert_same_run(got, ref, rtol=RTOL)


@pytest.mark.slow  # two runs of 4 steps on 2 and 4 devices
def test_context_parallel_lora_run_equals_the_unsplit_run():
    """C = 2 x D2 on 4 devices (each sequence's 4 zig-zag chunks over 2 members, the
    per-sequence mean over the whole sequence's summary tokens) against D2 on 2."""
    config = config_lib.smoke()
    config = dataclasses.replace(config, lora=dataclasses.replace(config.lora, dropout=0.0))
    got = tensor_parallel.assert_split_equals_unsplit(
        LoraBenchmark(config), num_devices=4, model_parallel=1, context_parallel=2,
        optimizer="own", steps=4, rtol=RTOL,
    )  # fmt: skip
    assert max(abs(w).max() for n, w in zip(got.names, got.weights) if n.endswith("lora_b")) > 0
