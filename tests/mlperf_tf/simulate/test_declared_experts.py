"""Tests the simulator on a benchmark built with experts (gpt_oss_20b declares them in its
`simulator_shape()`): the all-to-all of `--expert_parallel`, its parameter counts, GB200 NVL72."""

import json
import re

import pytest

from mlperf_tf import cli, registry
from mlperf_tf.errors import UserError
from mlperf_tf.facts import Experts
from mlperf_tf.simulate import collectives, model, parallelism, systems

# Weight-update sharding: without it a chip would hold 20.5 B weights x 16 bytes of fp32 optimizer
# state, which no GB200 holds (the simulator refuses layouts that do not fit a chip).
GB200 = dict(benchmark="gpt_oss_20b", chips=72, global_batch=72, weight_update_sharding=True)


def _gb200():
    return systems.load("gb200-nvl72")


def test_gpt_oss_declares_its_experts_and_the_cache_holds_them():
    bench = registry.get("gpt_oss_20b")(registry.get("gpt_oss_20b").preset("mlperf"))
    shape = model.shape_of(model.benchmark_facts("gpt_oss_20b"))
    assert shape == bench.simulator_shape()
    assert shape.experts == Experts(num_experts=32, top_k=4, every=1, capacity_factor=0.0)


@pytest.mark.parametrize("experts", [2, 4, 8])
def test_all_to_all_grows_with_the_expert_axis_per_the_formula(experts):
    system = _gb200()
    r = model.simulate(system=system, expert_parallel=experts, **GB200)
    blocks = model.shape_of(model.benchmark_facts("gpt_oss_20b")).blocks
    # One sequence per chip: its tokens x top-4 (dropless: no capacity padding) x hidden, bf16,
    # sent out and back, forward and backward, in each of the 24 MoE layers; (E-1)/E leaves.
    nbytes = 1 * 8192 * 4 * 2880 * 2
    assert blocks.tokens_per_sample == 8192 and blocks.hidden == 2880
    one = collectives.Cost(
        (experts - 1) * system.link.alpha, nbytes * (experts - 1) / experts / system.link.bandwidth
    )
    assert r.all_to_all_s == pytest.approx(4 * 24 * one.total_s, rel=1e-12)
    fewer = model.simulate(system=system, expert_parallel=experts // 2, **GB200)
    assert r.all_to_all_s > fewer.all_to_all_s
    # Each chip holds 1/E of the experts: less to all-reduce. Sharded, an expert's update is
    # split over the chips holding it (chips / E of them): experts / chips a chip either way.
    assert r.allreduce_s < fewer.allreduce_s
    assert r.weight_update_s == pytest.approx(fewer.weight_update_s)


def test_one_expert_group_is_no_expert_parallelism():
    system = _gb200()
    alone = model.simulate(system=system, expert_parallel=1, **GB200)
    plain = model.simulate(system=system, **GB200)
    assert alone == plain and alone.all_to_all_s == 0.0
    assert alone.allreduce_s > model.simulate(system=system, expert_parallel=2, **GB200).allreduce_s


def test_json_reports_the_config_derived_parameter_counts(capsys):
    benchmark_class = registry.get("gpt_oss_20b")
    bench = benchmark_class(benchmark_class.preset("mlperf"))
    code = cli.main(["simulate", "--benchmark=gpt_oss_20b", "--system=gb200-nvl72", "--chips=72",
                     "--expert_parallel=8", "--json"])  # fmt: skip
    record = json.loads(capsys.readouterr().out.strip())
    assert code == 0 and record["expert_parallel"] == 8 and record["all_to_all_s"] > 0
    assert record["parameters"] == bench.parameter_count() == 20_488_418_112
    assert record["active_parameters"] == bench.active_parameter_count() == 3_766_907_712
    assert record["trainable_parameters"] == bench.trainable_parameter_count()  # all of them
    # A dense model: every weight is active.
    code = cli.main(["simulate", "--benchmark=llama31_8b", "--system=h100-dgx", "--chips=8",
                     "--json"])  # fmt: skip
    record = json.loads(capsys.readouterr().out.strip())
    assert record["active_parameters"] == record["parameters"] == 8_030_261_248


def test_experts_added_by_flag_count_as_active_top_k():
    moe = parallelism.Moe(num_experts=8, every=2, top_k=2)
    r = model.simulate(benchmark="llama31_8b", system=systems.load("b200-dgx"), chips=8,
                       global_batch=8, expert_parallel=8, moe=moe,
                       weight_update_sharding=True)  # fmt: skip
    blocks = model.shape_of(model.benchmark_facts("llama31_8b")).blocks
    dense = 8_030_261_248
    assert r.parameters == dense + 16 * 7 * blocks.ffn_parameters  # 16 MoE layers of 8 experts
    assert r.active_parameters == dense + 16 * 1 * blocks.ffn_parameters  # top-2: one more


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(expert_parallel=3, chips=24, global_batch=24), "--expert_parallel (3) must divide"),
        (dict(moe=parallelism.Moe(num_experts=8)), "declares its own experts (32"),
    ],
)
def test_bad_expert_settings_are_one_line(kwargs, message):
    args = {**GB200, **kwargs}
    with pytest.raises(UserError, match=re.escape(message)) as e:
        model.simulate(system=_gb200(), **args)
    assert "\n" not in str(e.value)


def test_gb200_nvl72_is_one_nvlink_domain_of_72():
    system = _gb200()
    assert system.peak_flops == 2.5e15 and system.memory_bandwidth == 8e12
    assert system.link.bandwidth == 900e9  # 1.8 TB/s per GPU, both directions
    assert system.layout(72).nodes == 1 and system.layout(144).nodes == 2
    assert all(system.sources.get(key) for key in ("peak_flops", "memory_bandwidth", "link"))
    # 32 expert groups in one NVLink domain, where a DGX B200 cluster crosses nodes of 8 (the
    # off-node share through the NIC).
    kwargs = dict(benchmark="gpt_oss_20b", chips=288, global_batch=288, expert_parallel=32)
    nvl72 = model.simulate(system=system, **kwargs)
    dgx = model.simulate(system=systems.load("b200-dgx"), **kwargs)
    assert 0 < nvl72.all_to_all_s < dgx.all_to_all_s / 4


def test_table_shows_the_all_to_all_only_where_there_is_one(capsys):
    # Every axis pinned (a layout flag left out is searched for the fastest).
    args = ["simulate", "--benchmark=gpt_oss_20b", "--system=gb200-nvl72", "--chips=72",
            "--model_parallel=1", "--context_parallel=1", "--pipeline_parallel=1",
            "--weight_update_sharding"]  # fmt: skip
    assert cli.main([*args, "--expert_parallel=8"]) == 0
    head, row = capsys.readouterr().out.splitlines()[1:3]
    a2a = model.simulate(system=_gb200(), benchmark="gpt_oss_20b", chips=72, expert_parallel=8,
                         weight_update_sharding=True)  # fmt: skip
    assert row.split()[head.split().index("a2a") + 2] == f"{a2a.all_to_all_s * 1e3:.2f}"
    assert cli.main([*args, "--expert_parallel=1"]) == 0
    assert "a2a" not in capsys.readouterr().out
