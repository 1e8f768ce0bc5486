"""Tests for mlperf_tf.optimizers.neumann: golden values against a NumPy Algorithm 2."""

import keras
import numpy as np
import pytest

from mlperf_tf.optimizers import Neumann
from tests import strategies
from tests.mlperf_tf.optimizers import golden
from tests.numerics import assert_close

pytestmark = pytest.mark.numerics


def numpy_neumann(weights, batches, lr, **settings):
    """Algorithm 2 of Krishnan et al. 2017, transcribed (see the `Neumann` docstring), with the
    `Neumann` arguments in `settings` (all but `learning_rate`, which is `lr`).

    scope "model": w is the concatenation of all variables (one |w - v|, beta = beta_scale x
    all parameters); "variable": each variable on its own.
    """
    # The paper's symbols.
    alpha, beta_scale = settings["cubic_regularizer"], settings["repulsive_regularizer"]
    gamma, reset = settings["moving_average"], settings["reset_interval"]
    warmup, mu_max = settings["warmup_steps"], settings["momentum_max"]
    ramp, scope = settings["momentum_ramp_steps"], settings["norm_scope"]
    w = [np.asarray(p, np.float64) for p in weights]
    m = [np.zeros_like(p) for p in w]
    v = [p.copy() for p in w]
    for step, (x, y) in enumerate(batches):
        grads, _, _ = golden.forward_backward(w, x, y)
        if step < warmup:  # vanilla SGD
            w = [p - lr * g for p, g in zip(w, grads)]
            m = [np.zeros_like(p) for p in w]
            v = [p.copy() for p in w]
            continue
        t = step - warmup
        mu = min(mu_max, 1.0 - 1.0 / (2.0 + t // ramp))
        # Over the model: one norm of the concatenated w - v, taken before any variable moves.
        model_norm = np.sqrt(sum(np.sum((p - a) ** 2) for p, a in zip(w, v)))
        model_size = sum(p.size for p in w)
        for i, g in enumerate(grads):
            if t % reset == 0:
                d = g
                m[i] = -lr * g
            else:
                delta = w[i] - v[i]
                if scope == "model":
                    n, beta = model_norm, beta_scale * model_size
                else:
                    n, beta = np.linalg.norm(delta), beta_scale * delta.size
                d = g + ((alpha * n**2 - beta / n**2) * delta / n if n > 0 else 0.0)
                m[i] = mu * m[i] - lr * d
            w[i] = w[i] + mu * m[i] - lr * d
            v[i] = w[i] + gamma * (v[i] - w[i])
    return w, m


LR = 0.05
# `Neumann` arguments: large regularizers so that both terms move the weights measurably in a
# few steps, and resets, warm-up and momentum ramp within them.
SETTINGS = dict(
    cubic_regularizer=0.5,
    repulsive_regularizer=1e-4,
    moving_average=0.9,
    reset_interval=3,
    warmup_steps=2,
    momentum_max=0.9,
    momentum_ramp_steps=2,
    norm_scope="model",
)


def make(**overrides):
    return Neumann(LR, **{**SETTINGS, **overrides})


@pytest.mark.parametrize("scope", ["model", "variable"])
@pytest.mark.parametrize("warmup", [0, 2])
def test_matches_numpy_algorithm_2(warmup, scope):
    settings = {**SETTINGS, "warmup_steps": warmup, "norm_scope": scope}
    weights, batches = golden.problem(seed=1, steps=9)
    expected, _ = numpy_neumann(weights, batches, LR, **settings)
    _, got = golden.run_keras(make(**settings), weights, batches)
    for a, b in zip(got, expected):
        assert_close(a, b, rtol=1e-5)
    # The regularizers matter: without them the trajectory differs.
    unregularized = {**settings, "cubic_regularizer": 0.0, "repulsive_regularizer": 0.0}
    plain, _ = numpy_neumann(weights, batches, LR, **unregularized)
    assert max(np.abs(a - b).max() for a, b in zip(plain, expected)) > 1e-4


def test_norm_scopes_differ():
    """One norm over the model is not the per-variable norms (the golden test pins each)."""
    weights, batches = golden.problem(seed=1, steps=9)
    model, _ = numpy_neumann(weights, batches, LR, **SETTINGS)
    per_variable, _ = numpy_neumann(weights, batches, LR, **{**SETTINGS, "norm_scope": "variable"})
    assert max(np.abs(a - b).max() for a, b in zip(model, per_variable)) > 1e-4


def test_finalize_returns_w_minus_mu_m():
    weights, batches = golden.problem(seed=2, steps=5)
    expected, m = numpy_neumann(weights, batches, LR, **SETTINGS)
    optimizer = make()
    net, _ = golden.run_keras(optimizer, weights, batches)
    optimizer.finalize_variable_values(net.trainable_variables)
    t = len(batches) - 1 - SETTINGS["warmup_steps"]
    mu = min(0.9, 1.0 - 1.0 / (2.0 + t // SETTINGS["momentum_ramp_steps"]))
    for var, w, mm in zip(net.trainable_variables, expected, m):
        assert_close(var.numpy(), w - mu * mm, rtol=1e-5)


# The variable-scoped case is extended (CI runs it after README's default run); the default run
# covers it by the model-scoped case and test_matches_numpy_algorithm_2's variable scope.
@pytest.mark.parametrize("scope", ["model", pytest.param("variable", marks=pytest.mark.extended)])
def test_two_replicas_equal_one_device(scope):
    weights, batches = golden.problem(seed=3, steps=5)
    _, one = golden.run_keras(make(norm_scope=scope), weights, batches)
    _, two = golden.run_keras(
        lambda: make(norm_scope=scope), weights, batches, strategy=strategies.mirrored(2)
    )
    for a, b in zip(one, two):
        assert_close(a, b, rtol=1e-5)


def test_config_round_trip():
    optimizer = make(warmup_steps=4)
    config = optimizer.get_config()
    again = keras.optimizers.deserialize(keras.optimizers.serialize(optimizer))
    assert isinstance(again, Neumann) and again.get_config() == config
    assert config["warmup_steps"] == 4 and config["reset_interval"] == 3
    assert config["norm_scope"] == "model"


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"reset_interval": 0}, "reset_interval"),
        ({"moving_average": 1.0}, "moving_average"),
        ({"momentum_max": 0.2}, "momentum_max"),
        ({"warmup_steps": -1}, "warmup_steps"),
        ({"cubic_regularizer": -1.0}, "cubic_regularizer"),
        ({"norm_scope": "layer"}, "norm_scope"),
    ],
)
def test_bad_arguments_name_the_argument(kwargs, message):
    with pytest.raises(ValueError, match=message):
        Neumann(0.1, **kwargs)
