"""Tests for mlperf_tf.optimizers.nlcg: golden values against a NumPy preconditioned NLCG."""

import keras
import numpy as np
import pytest

from mlperf_tf.optimizers import NLCG
from tests import strategies
from tests.mlperf_tf.optimizers import golden

pytestmark = pytest.mark.numerics

EPS = 1e-8


def numpy_nlcg(weights, batches, *, lr, rule, precondition=True, restart=0):
    """The algorithm of the `NLCG` docstring, per variable, in float64."""
    w = [np.asarray(p, np.float64) for p in weights]
    n = len(w)
    h = [np.ones_like(p) for p in w]
    g_old = [np.zeros_like(p) for p in w]
    z_old = [np.zeros_like(p) for p in w]
    d = [np.zeros_like(p) for p in w]
    s = [np.zeros_like(p) for p in w]
    rz_old = [0.0] * n
    for k, (x, y) in enumerate(batches):
        grads, _, _ = golden.forward_backward(w, x, y)
        for i, g in enumerate(grads):
            if precondition and k > 0:
                yv = g - g_old[i]
                ys, shs = np.sum(yv * s[i]), np.sum(s[i] * h[i] * s[i])
                if ys > EPS and shs > EPS:
                    h[i] = np.abs(h[i] - (h[i] * s[i]) ** 2 / shs + yv**2 / ys)
            r = -g
            z = r / (h[i] + EPS) if precondition else r
            rz = np.sum(r * z)
            numerator = rz if rule == "FR" else rz - np.sum(r * z_old[i])
            beta = float(np.clip(numerator / (rz_old[i] + EPS), 0.0, 1.0))
            if k == 0 or (restart and k % restart == 0):
                beta = 0.0
            d[i] = z + beta * d[i]
            z_old[i], g_old[i], rz_old[i] = z, g, rz
            s[i] = lr * d[i]
            w[i] = w[i] + s[i]
    return w


@pytest.mark.parametrize(
    "rule, precondition, restart", [("FR", True, 0), ("PR", True, 0), ("FR", False, 3)]
)
def test_matches_numpy_nlcg(rule, precondition, restart):
    weights, batches = golden.problem(seed=4, steps=7)
    expected = numpy_nlcg(
        weights, batches, lr=0.05, rule=rule, precondition=precondition, restart=restart
    )
    optimizer = NLCG(0.05, beta_rule=rule, precondition=precondition, restart_interval=restart)
    _, got = golden.run_keras(optimizer, weights, batches)
    for a, b in zip(got, expected):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)


def test_conjugate_directions_differ_from_preconditioned_descent():
    # With beta forced to 0 every step NLCG is preconditioned descent; the default is not.
    weights, batches = golden.problem(seed=4, steps=6)
    cg = numpy_nlcg(weights, batches, lr=0.05, rule="FR")
    descent = numpy_nlcg(weights, batches, lr=0.05, rule="FR", restart=1)
    assert max(np.abs(a - b).max() for a, b in zip(cg, descent)) > 1e-4


def test_two_replicas_equal_one_device():
    weights, batches = golden.problem(seed=5, steps=4)
    _, one = golden.run_keras(NLCG(0.05, beta_rule="PR"), weights, batches)
    _, two = golden.run_keras(
        lambda: NLCG(0.05, beta_rule="PR"), weights, batches, strategy=strategies.mirrored(2)
    )
    for a, b in zip(one, two):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)


def test_config_round_trip():
    optimizer = NLCG(0.1, beta_rule="PR", precondition=False, restart_interval=7)
    config = optimizer.get_config()
    again = keras.optimizers.deserialize(keras.optimizers.serialize(optimizer))
    assert isinstance(again, NLCG) and again.get_config() == config
    assert (config["beta_rule"], config["precondition"], config["restart_interval"]) == (
        "PR",
        False,
        7,
    )


@pytest.mark.parametrize(
    "kwargs, message",
    [({"beta_rule": "HS"}, "beta_rule"), ({"restart_interval": -2}, "restart_interval")],
)
def test_bad_arguments_name_the_argument(kwargs, message):
    with pytest.raises(ValueError, match=message):
        NLCG(0.1, **kwargs)
