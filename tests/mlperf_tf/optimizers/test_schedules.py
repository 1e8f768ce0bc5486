"""Tests for mlperf_tf.optimizers.schedules: golden values against NumPy formulas, configs."""

import copy
import math

import keras
import numpy as np
import pytest
import tensorflow as tf

from mlperf_tf.optimizers import (
    PiecewiseConstantWithWarmup,
    WarmupCosineDecay,
    WarmupPolynomialDecay,
    WarmupRsqrtDecay,
    scale_learning_rate,
)
from tests.numerics import assert_close

pytestmark = pytest.mark.numerics

STEPS = np.arange(0, 40)


def evaluate(schedule, steps=STEPS):
    """The schedule at every step, eagerly and inside a tf.function with an int64 step."""
    eager = np.array([float(schedule(int(s))) for s in steps])
    graph_fn = tf.function(lambda s: schedule(s))
    graph = np.array([float(graph_fn(tf.constant(int(s), tf.int64))) for s in steps[:3]])
    assert_close(graph, eager[:3], rtol=1e-6)
    return eager


def numpy_warmup_poly(step, *, base, warmup, decay, end, power, start, decay_start):
    if step < start + warmup:
        return base * max(step - start, 0) / warmup
    progress = min(max(step - decay_start, 0), decay)
    return (base - end) * (1 - progress / decay) ** power + end


@pytest.mark.parametrize(
    "warmup, decay, end, power, start, decay_start",
    [
        (5, 20, 1e-4, 2.0, 0, None),  # MLPerf ResNet LARS: decay after warmup, power 2
        (5, 30, 0.0, 1.0, 0, 0),  # MLPerf BERT: decay clock from step 0
        (6, 30, 0.0, 0.5, -3, 0),  # BERT with a negative start_warmup_step
        (4, 10, 0.1, 1.0, 3, None),  # warmup starting late: 0 before it
        (0, 15, 0.0, 3.0, 0, None),  # no warmup
    ],
)
def test_warmup_polynomial_decay_matches_numpy(warmup, decay, end, power, start, decay_start):
    schedule = WarmupPolynomialDecay(
        2.5,
        warmup_steps=warmup,
        decay_steps=decay,
        end_learning_rate=end,
        power=power,
        start_warmup_step=start,
        decay_start_step=decay_start,
    )
    d0 = start + warmup if decay_start is None else decay_start
    expected = [
        numpy_warmup_poly(
            s,
            base=2.5,
            warmup=warmup,
            decay=decay,
            end=end,
            power=power,
            start=start,
            decay_start=d0,
        )
        for s in STEPS
    ]
    assert_close(evaluate(schedule), expected, rtol=1e-6)


def test_warmup_polynomial_decay_without_warmup_is_keras_polynomial_decay():
    ours = WarmupPolynomialDecay(
        0.4, warmup_steps=0, decay_steps=25, end_learning_rate=0.01, power=2.0
    )
    keras_schedule = keras.optimizers.schedules.PolynomialDecay(
        0.4, decay_steps=25, end_learning_rate=0.01, power=2.0
    )
    expected = [float(keras_schedule(int(s))) for s in STEPS]
    assert_close(evaluate(ours), expected, rtol=1e-6)


def test_warmup_peaks_at_base_and_is_continuous():
    schedule = WarmupPolynomialDecay(1.0, warmup_steps=10, decay_steps=100, power=2.0)
    lrs = evaluate(schedule, np.arange(0, 12))
    assert lrs[0] == 0.0 and lrs[10] == pytest.approx(1.0)
    assert np.all(np.diff(lrs[:11]) > 0) and lrs[11] < lrs[10]


def numpy_piecewise(step, *, base, warmup, factor, boundaries, multipliers):
    if step < warmup:
        return base * (1 - (warmup - step) / (warmup * 2**factor))
    j = sum(1 for b in boundaries if step >= b)
    return base * multipliers[j]


@pytest.mark.parametrize(
    "warmup, factor, boundaries, multipliers",
    [
        (8, 0.0, [20, 30], [1.0, 0.1, 0.01]),  # plain linear ramp from 0
        (8, 1.0, [20, 30], [0.1, 0.01]),  # starts at base / 2; leading 1.0 implied
        (5, 3.0, [12], [0.5, 0.25]),
        (0, 0.0, [10, 11, 25], [2.0, 1.0, 0.3, 0.0]),  # no warmup
    ],
)
def test_piecewise_constant_with_warmup_matches_numpy(warmup, factor, boundaries, multipliers):
    schedule = PiecewiseConstantWithWarmup(
        0.16,
        warmup_steps=warmup,
        warmup_factor=factor,
        boundaries=boundaries,
        multipliers=multipliers,
    )
    full = multipliers if len(multipliers) > len(boundaries) else [1.0] + multipliers
    expected = [
        numpy_piecewise(
            s, base=0.16, warmup=warmup, factor=factor, boundaries=boundaries, multipliers=full
        )
        for s in STEPS
    ]
    assert_close(evaluate(schedule), expected, rtol=1e-6)


def test_piecewise_drops_at_the_boundary_step():
    schedule = PiecewiseConstantWithWarmup(
        1.0, warmup_steps=2, warmup_factor=0, boundaries=[5], multipliers=[0.1]
    )
    assert float(schedule(4)) == 1.0
    assert float(schedule(5)) == pytest.approx(0.1)


@pytest.mark.parametrize("warmup, factor", [(4, 1.0), (16, 512**-0.5), (1, 0.25)])
def test_warmup_rsqrt_decay_matches_the_transformer_reference(warmup, factor):
    schedule = WarmupRsqrtDecay(2.0, warmup_steps=warmup, factor=factor)
    expected = [2.0 * factor * min(1.0, s / warmup) / math.sqrt(max(s, warmup)) for s in STEPS]
    assert_close(evaluate(schedule), expected, rtol=1e-6)
    # The peak is at step W: base * factor / sqrt(W).
    assert float(schedule(warmup)) == pytest.approx(2.0 * factor / math.sqrt(warmup), rel=1e-6)


def test_scale_learning_rate():
    assert scale_learning_rate(0.1, 1024, 256) == pytest.approx(0.4)
    assert scale_learning_rate(2.5e-3, 32, 32) == pytest.approx(2.5e-3)
    with pytest.raises(ValueError, match="global_batch_size"):
        scale_learning_rate(0.1, 0, 256)
    with pytest.raises(ValueError, match="reference_batch_size"):
        scale_learning_rate(0.1, 256, -1)
    with pytest.raises(ValueError, match="base_learning_rate"):
        scale_learning_rate(0.0, 256, 256)


@pytest.mark.parametrize(
    "schedule",
    [
        WarmupPolynomialDecay(
            3.0,
            warmup_steps=7,
            decay_steps=90,
            end_learning_rate=1e-4,
            power=2.0,
            start_warmup_step=-2,
            decay_start_step=0,
            name="lars_lr",
        ),
        PiecewiseConstantWithWarmup(
            0.2, warmup_steps=9, warmup_factor=2.0, boundaries=[30, 40], multipliers=[0.1, 0.01]
        ),
        WarmupRsqrtDecay(2.0, warmup_steps=1000, factor=1024**-0.5, name="t"),
        WarmupCosineDecay(8e-4, warmup_steps=5, decay_steps=95, end_learning_rate=8e-5, name="c"),
    ],
)
def test_get_config_round_trip(schedule):
    config = schedule.get_config()
    restored = type(schedule).from_config(copy.deepcopy(config))
    assert restored.get_config() == config
    np.testing.assert_allclose(evaluate(restored), evaluate(schedule), rtol=0)
    again = keras.optimizers.schedules.deserialize(keras.optimizers.schedules.serialize(schedule))
    assert type(again) is type(schedule) and again.get_config() == config


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda: WarmupPolynomialDecay(0.1, warmup_steps=-1, decay_steps=5), "warmup_steps"),
        (lambda: WarmupPolynomialDecay(0.1, warmup_steps=1, decay_steps=0), "decay_steps"),
        (
            lambda: WarmupPolynomialDecay(
                0.1, warmup_steps=1, decay_steps=5, end_learning_rate=0.2
            ),
            "end_learning_rate",
        ),
        (lambda: WarmupPolynomialDecay(0.1, warmup_steps=1, decay_steps=5, power=0), "power"),
        (
            lambda: PiecewiseConstantWithWarmup(
                0.1, warmup_steps=1, warmup_factor=0, boundaries=[5, 3], multipliers=[1, 1]
            ),
            "boundaries",
        ),
        (
            lambda: PiecewiseConstantWithWarmup(
                0.1, warmup_steps=1, warmup_factor=0, boundaries=[5], multipliers=[1, 1, 1]
            ),
            "multipliers",
        ),
        (
            lambda: PiecewiseConstantWithWarmup(
                0.1, warmup_steps=1, warmup_factor=-1, boundaries=[5], multipliers=[1]
            ),
            "warmup_factor",
        ),
        (lambda: WarmupRsqrtDecay(0.1, warmup_steps=0), "warmup_steps"),
        (lambda: WarmupRsqrtDecay(-0.1, warmup_steps=10), "base_learning_rate"),
    ],
)
def test_bad_arguments_name_the_argument(make, message):
    with pytest.raises(ValueError, match=message):
        make()
