"""Tests for mlperf_tf.optimizers.lars: golden values against a NumPy LARS, exclusions, config."""

import copy

import keras
import numpy as np
import pytest

from mlperf_tf.optimizers import LARS, WarmupPolynomialDecay
from mlperf_tf.optimizers.base import matches_any, variable_path
from mlperf_tf.optimizers.lars import DEFAULT_LARS_EXCLUDE
from tests.mlperf_tf.optimizers import layerwise
from tests.numerics import assert_close

pytestmark = pytest.mark.numerics

NUM_STEPS = 5

VARIABLES, GRADIENTS = layerwise.problem(seed=0, steps=NUM_STEPS, scale=0.5)


def make_variables():
    return layerwise.make_variables(VARIABLES)


def numpy_lars(lrs, *, momentum, weight_decay, eeta, epsilon, excluded, nesterov=False):
    """The MLPerf ResNet LARS formula in float64 NumPy; returns the weights after each step."""
    w = [init.astype(np.float64) for _, _, init, _ in VARIABLES]
    m = [np.zeros_like(x) for x in w]
    history = []
    for grads, lr in zip(GRADIENTS, lrs):
        for i, g in enumerate(grads):
            scaled_lr = lr
            if not excluded[i]:
                w_norm, g_norm = np.linalg.norm(w[i]), np.linalg.norm(g)
                trust = 1.0
                if w_norm > 0 and g_norm > 0:
                    trust = eeta * w_norm / (g_norm + weight_decay * w_norm + epsilon)
                g = g + weight_decay * w[i]
                scaled_lr = lr * trust
            m[i] = momentum * m[i] + scaled_lr * g
            w[i] = w[i] - (momentum * m[i] + scaled_lr * g if nesterov else m[i])
        history.append([x.copy() for x in w])
    return history


def run_optimizer(optimizer, variables):
    return layerwise.run_optimizer(optimizer, variables, GRADIENTS)


def assert_histories_close(actual, expected):
    layerwise.assert_histories_close(actual, expected, VARIABLES)


@pytest.mark.parametrize(
    "settings",
    [
        dict(momentum=0.9, weight_decay=0.1, eeta=0.2, epsilon=0.0, nesterov=False),
        dict(momentum=0.9, weight_decay=5e-5, eeta=0.001, epsilon=0.0, nesterov=False),
        dict(momentum=0.5, weight_decay=0.01, eeta=0.05, epsilon=0.3, nesterov=True),
    ],
    ids=["large_wd_and_eeta_so_every_term_shows", "mlperf_like", "epsilon_and_nesterov"],
)
def test_lars_matches_numpy_formula(settings):
    variables = make_variables()
    optimizer = LARS(0.5, **settings)
    excluded = layerwise.flags(DEFAULT_LARS_EXCLUDE, variables)
    assert excluded == [False, True, True, False, False, True, False]
    expected = numpy_lars([0.5] * NUM_STEPS, **settings, excluded=excluded)
    assert_histories_close(run_optimizer(optimizer, variables), expected)


def test_lars_edge_cases_follow_the_formula():
    # Zero weights: trust 1, so the first step is plain momentum SGD on g + wd * 0.
    # Zero gradient: trust 1 and the weight still decays by lr * wd * w.
    variables = make_variables()
    optimizer = LARS(0.5, momentum=0.9, weight_decay=0.1, eeta=0.2)
    optimizer.apply_gradients(
        [(keras.ops.convert_to_tensor(g, "float32"), v) for g, v in zip(GRADIENTS[0], variables)]
    )
    zero_init, still_init = VARIABLES[3][2], VARIABLES[4][2]
    assert_close(variables[3].numpy(), zero_init - 0.5 * GRADIENTS[0][3], rtol=1e-6)
    assert_close(variables[4].numpy(), still_init * (1 - 0.5 * 0.1), rtol=1e-6)
    # Excluded bias: plain momentum SGD on the raw gradient.
    assert_close(variables[1].numpy(), VARIABLES[1][2] - 0.5 * GRADIENTS[0][1], rtol=1e-6)


def test_lars_with_schedule_uses_the_step_learning_rate():
    schedule = WarmupPolynomialDecay(2.0, warmup_steps=2, decay_steps=4, power=2.0)
    lrs = [float(schedule(step)) for step in range(NUM_STEPS)]
    assert lrs[0] == 0.0 and lrs[2] == 2.0
    variables = make_variables()
    settings = dict(momentum=0.9, weight_decay=0.01, eeta=0.1)
    optimizer = LARS(schedule, **settings)  # LARS' default epsilon
    excluded = layerwise.flags(DEFAULT_LARS_EXCLUDE, variables)
    expected = numpy_lars(lrs, **settings, epsilon=0.0, excluded=excluded)
    assert_histories_close(run_optimizer(optimizer, variables), expected)


def test_default_exclusions_on_keras_layer_paths():
    # Explicit layer names: Keras numbers default ones ("dense_12") per session.
    model = keras.Sequential(
        [
            keras.Input((8, 8, 3)),
            keras.layers.Conv2D(4, 3, use_bias=False, name="conv2d"),
            keras.layers.BatchNormalization(name="batch_normalization"),
            keras.layers.GlobalAveragePooling2D(),
            keras.layers.Dense(2, name="dense"),
        ],
        name="net",
    )
    paths = [variable_path(v) for v in model.trainable_variables]
    assert "net/conv2d/kernel" in paths
    excluded = {p for p in paths if matches_any(DEFAULT_LARS_EXCLUDE, p)}
    assert excluded == {
        "net/batch_normalization/gamma",
        "net/batch_normalization/beta",
        "net/dense/bias",
    }


def test_get_config_round_trip_keeps_every_argument():
    schedule = WarmupPolynomialDecay(
        3.0, warmup_steps=5, decay_steps=50, end_learning_rate=1e-4, power=2.0
    )
    optimizer = LARS(
        schedule,
        momentum=0.8,
        weight_decay=2e-4,
        eeta=0.002,
        epsilon=1e-9,
        exclude_from_weight_decay=["bn", r"bias$"],
        nesterov=True,
        global_clipnorm=1.0,
        name="my_lars",
    )
    config = layerwise.assert_config_round_trips(optimizer)
    assert config["exclude_from_weight_decay"] == ["bn", r"bias$"]
    assert config["weight_decay"] == 2e-4 and config["nesterov"] is True
    restored = LARS.from_config(copy.deepcopy(config))
    assert restored.weight_decay is None  # Keras' own decoupled decay stays off
    assert config["learning_rate"]["config"] == schedule.get_config()


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"weight_decay": -1.0}, "weight_decay"),
        ({"momentum": 1.0}, "momentum"),
        ({"eeta": 0.0}, "eeta"),
        ({"epsilon": -1e-9}, "epsilon"),
        ({"exclude_from_weight_decay": "bias"}, "exclude_from_weight_decay"),
        ({"exclude_from_weight_decay": ["("]}, "exclude_from_weight_decay"),
    ],
)
def test_bad_arguments_name_the_argument(kwargs, message):
    with pytest.raises(ValueError, match=message):
        LARS(0.1, **kwargs)


def test_keras_weight_decay_hook_is_refused():
    optimizer = LARS(0.1)
    with pytest.raises(NotImplementedError, match="exclude_from_weight_decay"):
        optimizer.exclude_from_weight_decay(var_names=["bias"])
