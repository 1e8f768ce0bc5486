"""Tests of the step-time and time-to-train model on hand-computed cases."""

import math
import time

import pytest

from mlperf_tf.errors import UserError
from mlperf_tf.simulate import convergence, model, systems


def _toy_system(**changes):
    """A local ring system with round numbers: 1 TFLOP/s at efficiency 0.5, 1 GB/s links."""
    data = {
        "name": "toy",
        "peak_flops": 1e12,
        "memory_bandwidth": 1e10,
        "compute_efficiency": {"default": 0.5},
        "topology": {"kind": "local", "max_chips": 16},
        "link": {"bandwidth": 1e9, "alpha": 1e-5},
        "optimizer_bytes_per_parameter": 10,
    }
    data.update(changes)
    return systems.from_dict(data, "toy")


def test_step_breakdown_hand_computed():
    facts = model.benchmark_facts("resnet50", "smoke")
    flops, params = facts["training_flops_per_sample"], facts["trainable_parameters"]
    r = model.simulate(
        benchmark="resnet50", system=_toy_system(), chips=4, global_batch=16, preset="smoke"
    )
    compute = 4 * flops / (1e12 * 0.5)
    allreduce = 6 * 1e-5 + 1.5 * params * 4 / 1e9  # ring of 4: 2(p-1) alpha + 2(p-1)/p n/B
    update = params * 10 / 1e10
    assert r.compute_s == pytest.approx(compute)
    assert r.allreduce_s == pytest.approx(allreduce)
    assert r.exposed_comm_s == pytest.approx(allreduce)  # no overlap on this system
    assert r.weight_update_s == pytest.approx(update)
    assert r.step_time_s == pytest.approx(compute + allreduce + update)
    assert r.samples_per_s == pytest.approx(16 / r.step_time_s)


def test_overlap_hides_comm_up_to_the_backward_pass():
    r = model.simulate(
        benchmark="resnet50",
        system=_toy_system(overlap_fraction=1.0),
        chips=4,
        global_batch=16,
        preset="smoke",
    )
    backward = r.compute_s * 2 / 3
    assert r.exposed_comm_s == pytest.approx(max(r.allreduce_s - backward, 0.0))


def test_weight_update_sharding_divides_the_update_by_the_chips():
    kwargs = dict(benchmark="bert", system=systems.load("tpu-v3"), chips=1024, global_batch=8192)
    plain = model.simulate(**kwargs)
    sharded = model.simulate(weight_update_sharding=True, **kwargs)
    assert sharded.weight_update_s == pytest.approx(plain.weight_update_s / 1024)
    assert sharded.allreduce_s == plain.allreduce_s
    assert sharded.step_time_s < plain.step_time_s


def test_input_limit_binds_when_hosts_are_slow():
    system = _toy_system(input_samples_per_s_per_host={"resnet50": 10.0}, chips_per_host=4)
    r = model.simulate(
        benchmark="resnet50", system=system, chips=4, global_batch=16, preset="smoke"
    )
    assert r.input_bound and r.step_time_s == pytest.approx(16 / 10.0)


def test_time_to_train_uses_the_rcp_epochs_at_the_batch():
    system = systems.load("tpu-v3")
    r = model.simulate(benchmark="resnet50", system=system, chips=1024, global_batch=32768)
    assert r.epochs_to_target == pytest.approx(56.0)  # the RCP mean at batch 32768
    steps = math.ceil(56.0 * 1281167 / 32768)
    assert r.time_to_train_min * 60 == pytest.approx(steps * r.step_time_s + r.eval_s)


def test_rcp_interpolation_and_extrapolation():
    curve = convergence.curve("resnet50")
    assert curve.at(100) == curve.values[0]  # held below the smallest batch
    lo, hi = curve.batches[0], curve.batches[1]
    mid = (lo + hi) / 2
    assert curve.at(mid) == pytest.approx((curve.values[0] + curve.values[1]) / 2)
    assert curve.at(2 * curve.batches[-1]) > curve.values[-1]  # extrapolated upwards
    assert convergence.curve("bert").in_samples
    assert "stated model" in convergence.curve("transformer").source


def test_failed_chips_cost_throughput_and_move_their_batch():
    system = systems.load("tpu-v3")
    healthy = model.simulate(benchmark="resnet50", system=system, chips=1024, global_batch=32768)
    holed = model.simulate(
        benchmark="resnet50", system=system, chips=1024, global_batch=32768, failed_chips=2
    )
    assert holed.per_chip_batch == pytest.approx(32768 / 1022)
    assert holed.allreduce_s > healthy.allreduce_s
    assert holed.samples_per_s < healthy.samples_per_s


def test_one_line_errors():
    system = systems.load("tpu-v3")
    cases = [
        (dict(benchmark="nope", chips=16), "unknown benchmark 'nope'"),
        (dict(benchmark="resnet50", chips=1000), "does not fit"),
        (dict(benchmark="resnet50", chips=1024, global_batch=512), "smaller than the 1024"),
        (dict(benchmark="resnet50", chips=16, algorithm="hierarchical"), "not available"),
        (dict(benchmark="resnet50", chips=16, failed_chips=16), "--failed_chips"),
    ]
    for kwargs, message in cases:
        with pytest.raises(UserError, match=message) as e:
            model.simulate(system=system, **kwargs)
        assert "\n" not in str(e.value)
    with pytest.raises(UserError, match="torus"):
        model.simulate(
            benchmark="resnet50", system=systems.load("a100-dgx"), chips=16, failed_chips=1
        )


def test_a_sweep_of_100_configurations_takes_well_under_a_second_each():
    system = systems.load("tpu-v3")
    start = time.perf_counter()
    results = [
        model.simulate(benchmark=b, system=system, chips=c, global_batch=max(c, 4096) * 2)
        for b in ("resnet50", "bert", "ssd", "transformer")
        for c in (4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096)
        for _ in range(2)
    ] + [
        model.simulate(benchmark="resnet50", system=system, chips=1024, failed_chips=k)
        for k in range(12)
    ]
    assert len(results) >= 100
    # Not a timing assertion on a loaded machine: a generous bound that catches a TF import.
    assert time.perf_counter() - start < 30


def test_scaling_efficiency_is_one_on_one_chip():
    r = model.simulate(
        benchmark="resnet50", system=_toy_system(), chips=1, global_batch=16, preset="smoke"
    )
    assert r.allreduce_s == 0 and r.scaling_efficiency == pytest.approx(1.0)
