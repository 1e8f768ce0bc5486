"""`mlperf-tf bench`'s host-side step parts (`Benchmark.host_step_parts`): each part's seconds a
step, share of the step and tokens/s from the counters' growth over each window, and the input
wait's share; GRPO's (rollout generation, environment, training) on its smoke preset."""

import json
import time

import pytest
import tensorflow as tf

from mlperf_tf import bench, cli, registry
from tests.tiny_benchmark import TinyBenchmark

SLEEP_S, TOKENS = 0.03, 100  # a batch's host work and the tokens it counts


class HostWorkBenchmark(TinyBenchmark):
    """The tiny benchmark whose input pipeline does host work for every batch (a sleep, timed,
    with 100 tokens), and counts the tokens each batch trains (16 a batch)."""

    name = "tiny_host_work"

    def __init__(self, config, *, context=None):
        super().__init__(config, context=context)
        self.counters = {"host_s": 0.0, "host_tokens": 0.0, "trained": 0.0}

    def _work(self, x):
        begin = time.perf_counter()
        time.sleep(SLEEP_S)
        self.counters["host_s"] += time.perf_counter() - begin
        self.counters["host_tokens"] += TOKENS
        self.counters["trained"] += 16
        return x

    def train_dataset(self, input_context):
        def work(batch):
            label = tf.numpy_function(self._work, [batch["label"]], tf.int32, stateful=True)
            return {**batch, "label": tf.ensure_shape(label, batch["label"].shape)}

        return super().train_dataset(input_context).map(work)

    def host_step_parts(self):
        c = self.counters
        return {"host work": (c["host_s"], c["host_tokens"]), "training": (None, c["trained"])}


def test_host_parts_and_the_input_wait_are_shares_of_the_step(capsys, monkeypatch):
    get = registry.get
    monkeypatch.setattr(registry, "get",
                        lambda name: HostWorkBenchmark if name == HostWorkBenchmark.name
                        else get(name))  # fmt: skip
    config = bench.BenchConfig(benchmark=HostWorkBenchmark.name, preset="smoke", warmup_steps=2,
                               windows=3, steps_per_window=4, peak_seconds=0.0)  # fmt: skip
    settings = {name: bench.RunConfig.__dataclass_fields__[name].default
                for name in bench.SHARED_RUN_SETTINGS}  # fmt: skip
    settings["distribution"] = "one_device"
    result = bench.run(config, settings, {})
    step_ms = result.step_time_ms
    # The host work: ~30 ms a batch (a sleep, measured), about one batch a step (the
    # distributed iterator may run a batch ahead), 100 tokens each.
    assert 0.5 * 1e3 * SLEEP_S <= result.host_part_ms["host work"] <= 2.5 * 1e3 * SLEEP_S
    assert 0 < result.host_part_shares["host work"] <= 1.0
    assert 0.5 * TOKENS / SLEEP_S < result.host_part_tokens_per_s["host work"] <= TOKENS / SLEEP_S
    # Without prefetch beyond the iterator's own the step waits for it: a share of the step.
    assert 0 < result.input_wait_share < 1
    # "training" (no host seconds): the window outside the input wait, with its 16 tokens a
    # batch, ~ 1 - the input wait's share (medians of 3 windows each).
    share = result.host_part_shares["training"]
    assert share == pytest.approx(1 - result.input_wait_share, abs=0.15)
    assert result.host_part_ms["training"] <= step_ms * 1.05
    assert result.host_part_tokens_per_s["training"] > 0
    line = result.summary()
    assert "input wait" in line and "host work" in line and "tokens/s)" in line
    assert "\n" not in line


@pytest.mark.slow  # 2-4 min at load 8 (tracing the GRPO step and the rollouts' generator)
def test_grpo_smoke_bench_reports_rollout_environment_and_training_shares(capsys):
    args = ["bench", "--benchmark=qwen35_397b_grpo", "--preset=smoke", "--windows=2",
            "--steps_per_window=1", "--warmup_steps=1", "--peak_seconds=0", "--json"]  # fmt: skip
    assert cli.main(args) == 0
    result = json.loads(capsys.readouterr().out)
    parts = ("rollout generation", "environment", "training")
    assert set(result["host_part_shares"]) == set(parts)
    assert result["host_part_tokens_per_s"]["rollout generation"] > 0
    assert result["host_part_tokens_per_s"]["training"] > 0
    assert result["host_part_tokens_per_s"]["environment"] == 0  # it counts no tokens
    assert all(0 <= result["host_part_shares"][p] <= 1.0 for p in parts)
    assert result["host_part_ms"]["rollout generation"] > result["host_part_ms"]["environment"]
