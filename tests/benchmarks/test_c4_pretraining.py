"""Tests of what the C4 pretraining benchmarks (`llama31_8b`, `gpt_oss_20b`) share through
`mlperf_tf.lm.pretraining`: the learning rate and warm-up of each reference convergence point,
the cosine's end and length, and a batch size without an RCP as a one-line error."""

import dataclasses

import pytest

from benchmarks.gpt_oss_20b.benchmark import GptOssBenchmark
from benchmarks.llama31_8b.benchmark import Llama31Benchmark
from mlperf_tf.benchmark import RunContext
from mlperf_tf.config import ConfigError

BENCHMARKS = {"llama31_8b": Llama31Benchmark, "gpt_oss_20b": GptOssBenchmark}
# (benchmark, global batch, base LR, warm-up steps) of every RCP: 5.1.0's llama31_8b (BS 96's
# 16,348 warm-up samples round up to 171 steps), 6.0.0's gpt_oss_20b.
RCP_POINTS = [
    ("llama31_8b", 16, 4e-4, 16),
    ("llama31_8b", 32, 8e-4, 128),
    ("llama31_8b", 64, 8e-4, 96),
    ("llama31_8b", 96, 1e-3, 171),
    ("llama31_8b", 128, 2e-3, 256),
    ("gpt_oss_20b", 16, 4e-4, 128),
    ("gpt_oss_20b", 32, 8e-4, 128),
    ("gpt_oss_20b", 64, 1e-3, 192),
]


def _bench(name, **changes):
    benchmark = BENCHMARKS[name]
    config = dataclasses.replace(benchmark.preset("mlperf"), **changes)
    return benchmark(config).with_context(RunContext(num_replicas=1))


@pytest.mark.parametrize("name, batch, lr, warmup", RCP_POINTS)
def test_learning_rate_and_warmup_come_from_the_rcp_file(name, batch, lr, warmup):
    bench = _bench(name, global_batch_size=batch)
    assert bench.learning_rate_and_warmup() == (lr, warmup)
    assert bench.end_learning_rate() == pytest.approx(0.1 * lr)
    assert bench.decay_steps() == 1_200_000 - warmup


@pytest.mark.parametrize("name", BENCHMARKS)
def test_a_batch_size_without_rcp_is_a_one_line_error(name):
    with pytest.raises(ConfigError, match=rf"`global_batch_size` \(48\) has no {name}") as e:
        _bench(name, global_batch_size=48).learning_rate_and_warmup()
    assert "\n" not in str(e.value)
    # Given explicitly, no RCP is needed.
    opt = dataclasses.replace(
        BENCHMARKS[name].preset("mlperf").optimizer,
        opt_base_learning_rate=1e-3,
        opt_learning_rate_warmup_steps=9,
    )
    assert _bench(name, global_batch_size=48, optimizer=opt).learning_rate_and_warmup() == (1e-3, 9)
