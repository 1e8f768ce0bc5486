"""The model axis as `run` and `simulate` see it: the benchmark declares `model` (and `expert`)
with the simulator's `Blocks` and `Experts` of Qwen3.5-397B-A17B's 60 layers, and `simulate
--model_parallel` charges the training's tensor-parallel all-reduces in the rollout step."""

import dataclasses

import pytest

from benchmarks.qwen35_397b_grpo.benchmark import Qwen35GrpoBenchmark
from mlperf_tf import cli
from mlperf_tf.simulate import model, systems

GB300 = "gb300-nvl72"


def test_the_model_axis_is_declared_with_the_blocks_it_splits():
    bench = Qwen35GrpoBenchmark(Qwen35GrpoBenchmark.preset("mlperf"))
    assert bench.parallel_axes == ("data", "model", "expert")
    shape = bench.simulator_shape()
    b, e = shape.blocks, shape.experts
    # 60 layers (45 Gated DeltaNet + 15 gated attention), each mixer and MoE ending in a
    # row-parallel all-reduce of tokens x 4,096; one routed expert is a SwiGLU of 1,024.
    assert (b.blocks, b.allreduces_per_block, b.hidden) == (60, 2, 4096)
    assert b.ffn_parameters == 3 * 4096 * 1024
    assert b.ffn_flops_per_token == 2 * 3 * 4096 * (1024 + 1024)  # one expert + the shared
    assert b.tokens_per_sample == round(shape.rollouts.context_tokens) == 25_500
    assert (e.num_experts, e.top_k, e.every) == (512, 10, 1)
    # The experts' weights as the config counts them: 60 x 512 x 3 x 4,096 x 1,024.
    assert e.layers(b.blocks) * e.num_experts * b.ffn_parameters == 60 * 512 * 3 * 4096 * 1024


def test_the_trajectory_age_setting_is_the_simulators():
    config = Qwen35GrpoBenchmark.preset("mlperf")
    sync = dataclasses.replace(
        config, grpo=dataclasses.replace(config.grpo, max_trajectory_age_steps=0)
    )
    assert Qwen35GrpoBenchmark(config).simulator_shape().rollouts.max_age == 1
    assert Qwen35GrpoBenchmark(sync).simulator_shape().rollouts.max_age == 0


def test_simulate_charges_the_tensor_parallel_all_reduces_in_the_training_part():
    """At --model_parallel=4 the step's training part carries the 2 x 60 x 2 all-reduces a step
    of the rollouts' tokens (forward and backward, `mlperf_tf.simulate.parallelism.tensor_parallel_cost`); the
    exposed generation is what that longer training does not cover."""
    system = systems.load(GB300)
    plain = model.simulate(benchmark="qwen35_397b_grpo", system=system, chips=256)
    split = model.simulate(benchmark="qwen35_397b_grpo", system=system, chips=256,
                           model_parallel=4)  # fmt: skip
    assert plain.model_parallel_s == 0 and split.model_parallel_s > 0
    shape = model.shape_of(model.benchmark_facts("qwen35_397b_grpo"))
    assert shape.blocks is not None
    generation = split.rollout_decode_s + split.rollout_prefill_s + split.rollout_environment_s
    train = (split.compute_s + split.exposed_comm_s + split.weight_update_s + split.overhead_s
             + split.model_parallel_s + split.all_to_all_s + split.logprob_s)  # fmt: skip
    assert split.exposed_generation_s == pytest.approx(max(0.0, generation - train))
    assert split.exposed_generation_s < plain.exposed_generation_s


def test_a_batch_of_partial_groups_is_one_line_naming_the_group(capsys):
    """A step's rollouts are whole groups of one task's `num_generations_per_prompt` (16 in
    the reference, 2 in the smoke: each preset declares its own): `simulate` at GBS 100 is a
    one-line error whatever the layout (pinned or searched); 96 and 112 run."""
    system = systems.load(GB300)
    assert Qwen35GrpoBenchmark(Qwen35GrpoBenchmark.preset("smoke")).simulator_shape(
    ).rollouts.group_size == 2  # fmt: skip
    for pinned in ({}, {"--model_parallel": 2}):
        flags = [f"{k}={v}" for k, v in pinned.items()]
        code = cli.main(["simulate", "--benchmark=qwen35_397b_grpo", f"--system={GB300}",
                         "--chips=256", "--global_batch=100", *flags])  # fmt: skip
        err = capsys.readouterr().err.strip()
        assert code == 2 and "\n" not in err, err
        assert "whole groups of the 16 rollouts" in err and "e.g. 96" in err, err
    for batch in (96, 112):
        r = model.simulate(benchmark="qwen35_397b_grpo", system=system, chips=256,
                           global_batch=batch)  # fmt: skip
        assert r.global_batch == batch
