"""Tests of `mlperf_tf.parallel.memory`: a chip's bytes per layout add up to the model, split as
the layouts split it, hold the schedule's in-flight micro-batches, and the benchmarks' README
tables are the function's output (not typed by hand)."""

import dataclasses
import pathlib

import pytest

from benchmarks.deepseekv3_671b.benchmark import DeepseekV3Benchmark
from benchmarks.gpt_oss_20b.benchmark import GptOssBenchmark
from benchmarks.llama2_70b_lora.benchmark import LoraBenchmark
from benchmarks.llama31_8b.benchmark import Llama31Benchmark
from mlperf_tf.parallel import memory
from mlperf_tf.parallel.memory import ChipLayout

REPO = pathlib.Path(__file__).resolve().parents[3]


def _llama():
    return Llama31Benchmark(Llama31Benchmark.preset("mlperf"))


def test_stages_hold_the_whole_model_once():
    config = _llama().config.model
    per_stage = [
        memory._stage_parameters(  # noqa: SLF001
            config, first, end, tensor=1, expert=1, first_stage=s == 0, last_stage=s == 3
        )
        for s, (first, end) in enumerate(config.stage_bounds(4))
    ]
    assert sum(per_stage) == config.parameter_count()
    # The first stage holds the embedding, the last the head and final norm, besides 8 layers.
    table = config.vocab_size * config.hidden_size
    assert per_stage[0] - table == pytest.approx(per_stage[1])
    assert per_stage[3] - table - config.hidden_size == pytest.approx(per_stage[1])


@pytest.mark.parametrize(("layers", "worst"), [("20+12", 0), ("12+20", 1)])
def test_a_declared_uneven_map_is_the_estimate_s_stages_and_the_worst_is_counted(layers, worst):
    """P = 2 over Llama's 32 layers as a declared 20 + 12 (or 12 + 20): the chip counted is
    the stage of 20 layers, its weights those layers' (with the embedding or the head)."""
    config = dataclasses.replace(_llama().config.model, pipeline_layers=(layers,))
    bounds = config.stage_bounds(2)
    chip = memory.decoder_memory(
        config, seq=128, micro_batch=1, micro_batches=4, layout=ChipLayout(pipeline=2)
    )
    first, end = bounds[worst]
    assert end - first == 20 and chip.stage == worst
    params = memory._stage_parameters(  # noqa: SLF001
        config, first, end, tensor=1, expert=1, first_stage=worst == 0, last_stage=worst == 1
    )
    assert chip.weights == pytest.approx(4 * params)
    assert chip.in_flight == 2 - worst  # 1F1B: P - s


def test_deepseek_declares_the_recipe_s_maps_and_its_layouts_use_them():
    """The reference's PP4, PP8 and PP16 over 61 layers (Megatron-Bridge's `layout_map`):
    the memory search offers them, with the first stage's 16 layers the worst at P4."""
    bench = DeepseekV3Benchmark(DeepseekV3Benchmark.preset("mlperf"))
    config = bench.config.model
    assert config.stage_bounds(4) == [(0, 16), (16, 32), (32, 48), (48, 61)]
    assert [end - first for first, end in config.stage_bounds(8)] == [8] * 7 + [5]
    assert [end - first for first, end in config.stage_bounds(16)] == [4] * 15 + [1]
    pipelines = {layout.pipeline for layout in bench.memory_layouts()}
    assert {4, 8, 16} <= pipelines and 2 not in pipelines  # 2 neither divides 61 nor is declared
    chip = bench.memory_per_chip(ChipLayout(pipeline=4, expert=64))
    assert chip.stage == 0 and chip.in_flight == 4


def test_one_chip_is_sixteen_bytes_a_weight_plus_activations():
    bench = _llama()
    m = bench.memory_per_chip(ChipLayout())
    n = bench.config.model.parameter_count()
    assert (m.weights, m.gradients, m.moments) == (4 * n, 4 * n, 8 * n)
    assert m.in_flight == 1 and m.activations > 0


def test_tensor_and_pipeline_split_the_bytes():
    bench = _llama()
    whole, m2, p4 = (bench.memory_per_chip(ChipLayout(tensor=t, pipeline=p)) for t, p in
                     ((1, 1), (2, 1), (1, 4)))  # fmt: skip
    # Norms stay whole on every shard: a little over half.
    assert 0.5 < m2.weights / whole.weights < 0.501
    # Four stages of 8 layers: a quarter plus the embedding or head; 1F1B's first stage holds
    # 4 micro-batches of its 8 layers, the last one of its 8 and the logits.
    assert p4.weights < 0.3 * whole.weights
    gpipe = bench.memory_per_chip(ChipLayout(pipeline=4), schedule="gpipe")
    assert gpipe.in_flight == bench.config.global_batch_size  # every micro-batch in flight
    assert gpipe.activations > 4 * p4.activations


def test_lora_counts_gradients_and_moments_of_the_adapters_only():
    bench = LoraBenchmark(LoraBenchmark.preset("mlperf"))
    m = bench.memory_per_chip(ChipLayout(tensor=8))
    trainable = bench.trainable_parameter_count() / 8
    assert m.gradients == pytest.approx(4 * trainable, rel=0.01)  # spread as the base
    assert m.moments == pytest.approx(8 * trainable, rel=0.01)
    frozen = (bench.config.model.parameter_count() - bench.trainable_parameter_count()) / 8
    assert m.weights == pytest.approx(2 * frozen + 4 * trainable, rel=0.01)


def test_expert_parallel_splits_only_the_experts():
    bench = GptOssBenchmark(GptOssBenchmark.preset("mlperf"))
    c = bench.config.model
    e1, e4 = (bench.memory_per_chip(ChipLayout(expert=e)) for e in (1, 4))
    experts = c.moe.count(c.num_hidden_layers) * (
        c.moe_layer_parameters() - c.hidden_size * c.moe.num_experts
    )
    assert e1.weights - e4.weights == pytest.approx(4 * experts * 3 / 4)


@pytest.mark.parametrize(
    "benchmark_class", [Llama31Benchmark, GptOssBenchmark, LoraBenchmark, DeepseekV3Benchmark]
)
def test_the_readme_table_is_the_functions_output(benchmark_class):
    bench = benchmark_class(benchmark_class.preset("mlperf"))
    readme = REPO / "benchmarks" / bench.name / "README.md"
    assert bench.memory_table() in readme.read_text(encoding="utf-8"), (
        f"regenerate with: python tools/studies/memory_per_chip.py --benchmark={bench.name}"
    )


def test_layout_names():
    assert str(ChipLayout(tensor=2, pipeline=4)) == "M2 x P4"
    assert str(ChipLayout()) == "1 chip"
    assert dataclasses.replace(ChipLayout(), expert=8).chips == 8
