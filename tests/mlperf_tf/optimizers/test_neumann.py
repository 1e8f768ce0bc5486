"""Tests for mlperf_tf.optimizers.neumann: golden values against a NumPy Algorithm 2."""

import keras
import numpy as np
import pytest

from mlperf_tf.optimizers import Neumann
from tests import strategies
from tests.mlperf_tf.optimizers import golden

pytestmark = pytest.mark.numerics


def numpy_neumann(
    weights, batches, *, lr, alpha, beta_scale, gamma, reset, warmup, mu_max, ramp, scope="model"
):
    """Algorithm 2 of Krishnan et al. 2017, transcribed (see the `Neumann` docstring).

    scope "model": w is the concatenation of all variables (one |w - v|, beta = beta_scale x
    all parameters); "variable": each variable on its own.
    """
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


# Large regularizers so that both terms move the weights measurably in a few steps.
SETTINGS = dict(
    lr=0.05,
    alpha=0.5,
    beta_scale=1e-4,
    gamma=0.9,
    reset=3,
    warmup=2,
    mu_max=0.9,
    ramp=2,
    scope="model",
)


def make(**overrides):
    s = {**SETTINGS, **overrides}
    return Neumann(
        s["lr"],
        cubic_regularizer=s["alpha"],
        repulsive_regularizer=s["beta_scale"],
        moving_average=s["gamma"],
        reset_interval=s["reset"],
        warmup_steps=s["warmup"],
        momentum_max=s["mu_max"],
        momentum_ramp_steps=s["ramp"],
        norm_scope=s["scope"],
    )


@pytest.mark.parametrize("scope", ["model", "variable"])
@pytest.mark.parametrize("warmup", [0, 2])
def test_matches_numpy_algorithm_2(warmup, scope):
    settings = {**SETTINGS, "warmup": warmup, "scope": scope}
    weights, batches = golden.problem(seed=1, steps=9)
    expected, _ = numpy_neumann(weights, batches, **settings)
    _, got = golden.run_keras(make(**settings), weights, batches)
    for a, b in zip(got, expected):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)
    # The regularizers matter: without them the trajectory differs.
    plain, _ = numpy_neumann(weights, batches, **{**settings, "alpha": 0.0, "beta_scale": 0.0})
    assert max(np.abs(a - b).max() for a, b in zip(plain, expected)) > 1e-4


def test_norm_scopes_differ():
    """One norm over the model is not the per-variable norms (the golden test pins each)."""
    weights, batches = golden.problem(seed=1, steps=9)
    model, _ = numpy_neumann(weights, batches, **SETTINGS)
    per_variable, _ = numpy_neumann(weights, batches, **{**SETTINGS, "scope": "variable"})
    assert max(np.abs(a - b).max() for a, b in zip(model, per_variable)) > 1e-4


def test_finalize_returns_w_minus_mu_m():
    weights, batches = golden.problem(seed=2, steps=5)
    expected, m = numpy_neumann(weights, batches, **SETTINGS)
    optimizer = make()
    net, _ = golden.run_keras(optimizer, weights, batches)
    optimizer.finalize_variable_values(net.trainable_variables)
    mu = min(0.9, 1.0 - 1.0 / (2.0 + (len(batches) - 1 - SETTINGS["warmup"]) // SETTINGS["ramp"]))
    for var, w, mm in zip(net.trainable_variables, expected, m):
        np.testing.assert_allclose(var.numpy(), w - mu * mm, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("scope", ["model", "variable"])
def test_two_replicas_equal_one_device(scope):
    weights, batches = golden.problem(seed=3, steps=5)
    _, one = golden.run_keras(make(scope=scope), weights, batches)
    _, two = golden.run_keras(
        lambda: make(scope=scope), weights, batches, strategy=strategies.mirrored(2)
    )
    for a, b in zip(one, two):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_config_round_trip():
    optimizer = make(warmup=4)
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
