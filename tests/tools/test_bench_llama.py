"""`tools/peers/bench_llama.py`'s matmul-only bound does the products the model does, no more, no less."""

import dataclasses

import pytest

from mlperf_tf import flops
from tools.peers import bench_llama


@pytest.mark.parametrize("shape", ["mini", "wide"])
def test_the_bound_makes_the_models_forward_products(shape):
    """The forward products of `step_matmuls` add up to the suite's analytic FLOP count of the
    same model (weight products + the full S x S attention square), so the bound neither skips a
    projection nor invents one."""
    config = bench_llama.shape_config(shape)
    seq = config.data.max_sequence_length
    counted = sum(2 * b * m * k * n for b, m, k, n in bench_llama.step_matmuls(config))
    from benchmarks.llama31_8b.benchmark import Llama31Benchmark

    shape = Llama31Benchmark(config).decoder_shape()
    per_token = flops.decoder_forward_flops_per_token(shape, seq)["total"]
    assert counted == per_token * config.global_batch_size * seq


def test_the_bound_runs_a_step_of_a_tiny_model():
    config = bench_llama.shape_config("mini")
    model = dataclasses.replace(
        config.model, hidden_size=16, num_attention_heads=2, num_key_value_heads=1, head_dim=8,
        intermediate_size=32, num_hidden_layers=1, vocab_size=64,
    )  # fmt: skip
    config = dataclasses.replace(
        config,
        model=model,
        global_batch_size=2,
        data=dataclasses.replace(config.data, max_sequence_length=8),
    )
    run = bench_llama.matmuls_only_contestant(config)
    run(2)  # two traced steps: shapes agree (a wrong transpose would fail here)
