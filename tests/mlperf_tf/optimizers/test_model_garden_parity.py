"""Parity of our LARS and LAMB with the Model Garden's (`official.modeling.optimization`).

The Model Garden runs on tf_keras legacy optimizers over plain `tf.Variable`s; ours on Keras 3
variables. Both start from the same weights and get the same gradients for 10 steps.
"""

import numpy as np
import pytest
import tensorflow as tf

from tests.numerics import assert_close

pytest.importorskip("official")
from official.modeling.optimization import lamb as mg_lamb  # noqa: E402
from official.modeling.optimization import lars as mg_lars  # noqa: E402

from mlperf_tf.optimizers import LAMB, LARS  # noqa: E402
from tests.mlperf_tf.optimizers import layerwise  # noqa: E402

pytestmark = [pytest.mark.peers, pytest.mark.numerics]

NUM_STEPS = 10
VARIABLES, GRADIENTS = layerwise.problem(seed=2, steps=NUM_STEPS, scale=0.3)
EXCLUDE = ["bias", "layer_norm"]


def make_pair():
    ours = layerwise.make_variables(VARIABLES)
    theirs = [
        tf.Variable(init.astype("float32"), name=f"{scope}/{name}")
        for scope, name, init, _ in VARIABLES
    ]
    return ours, theirs


def apply(optimizer, variables, grads):
    optimizer.apply_gradients([(tf.constant(g, tf.float32), v) for g, v in zip(grads, variables)])


def assert_same_trajectories(opt, ref):
    """Steps ours with `opt` and theirs with `ref` on the same gradients; same weights each step."""
    ours, theirs = make_pair()
    for step, grads in enumerate(GRADIENTS, start=1):
        apply(opt, ours, grads)
        apply(ref, theirs, grads)
        for (scope, name, _, _), a, b in zip(VARIABLES, ours, theirs):
            assert_close(a.numpy(), b.numpy(), rtol=1e-6, err_msg=f"step {step}, {scope}/{name}")


@pytest.mark.parametrize("nesterov", [False, True])
def test_lars_matches_model_garden_without_weight_decay(nesterov):
    # wd = 0 and eps = 0: both trust ratios are eeta * |w| / |g|.
    settings = dict(momentum=0.9, eeta=0.05, nesterov=nesterov, exclude_from_weight_decay=EXCLUDE)
    assert_same_trajectories(LARS(0.8, **settings), mg_lars.LARS(learning_rate=0.8, **settings))


def test_lars_differs_from_model_garden_exactly_as_documented():
    # With wd > 0 and eps > 0 the trust ratios differ: ours eeta*|w| / (|g| + wd*|w| + eps),
    # falling back to 1 when |g| = 0; the Model Garden's eeta*|w| / |g + wd*w|. With momentum 0
    # and the same weights before each step, each update is lr * trust * (g + wd * w), so
    # ours = theirs * trust_ours / trust_mg on adapted variables, and equal on excluded ones.
    wd, eeta, eps, lr = 0.05, 0.1, 1e-3, 0.5
    ours, theirs = make_pair()
    opt = LARS(
        lr, momentum=0.0, weight_decay=wd, eeta=eeta, epsilon=eps, exclude_from_weight_decay=EXCLUDE
    )
    ref = mg_lars.LARS(
        learning_rate=lr,
        momentum=0.0,
        weight_decay_rate=wd,
        eeta=eeta,
        exclude_from_weight_decay=EXCLUDE,
    )
    saw_a_difference = False
    for step, grads in enumerate(GRADIENTS, start=1):
        for a, b in zip(ours, theirs):
            b.assign(a.numpy())  # same weights before every step
        before = [a.numpy().astype(np.float64) for a in ours]
        apply(opt, ours, grads)
        apply(ref, theirs, grads)
        for (scope, name, _, _), w, g, a, b in zip(VARIABLES, before, grads, ours, theirs):
            ours_delta = a.numpy() - w
            theirs_delta = b.numpy() - w
            if any(p in f"{scope}/{name}" for p in EXCLUDE):
                factor = 1.0
            else:
                w_norm, g_norm = np.linalg.norm(w), np.linalg.norm(g)
                decayed_norm = np.linalg.norm(g + wd * w)
                trust_ours = (
                    eeta * w_norm / (g_norm + wd * w_norm + eps)
                    if w_norm > 0 and g_norm > 0
                    else 1.0
                )
                trust_mg = eeta * w_norm / decayed_norm if w_norm > 0 and decayed_norm > 0 else 1.0
                factor = trust_ours / trust_mg
                saw_a_difference |= abs(factor - 1) > 1e-3
            assert_close(
                ours_delta,
                theirs_delta * factor,
                rtol=1e-5,
                err_msg=f"step {step}, {scope}/{name}",
            )
    assert saw_a_difference


@pytest.mark.parametrize("adaptation", [None, ["bias"]])
def test_lamb_matches_model_garden(adaptation):
    # Betas exactly representable in float32, so that the Model Garden's float32 1 - beta**t
    # (which loses ~1e-5 relative precision for beta = 0.999) is exact too.
    beta_1, beta_2 = 0.875, 1 - 2.0**-10
    settings = dict(
        beta_1=beta_1,
        beta_2=beta_2,
        epsilon=1e-6,
        exclude_from_weight_decay=EXCLUDE,
        exclude_from_layer_adaptation=adaptation,
    )
    assert_same_trajectories(
        LAMB(0.02, weight_decay=0.01, **settings),  # the Model Garden calls it weight_decay_rate
        mg_lamb.LAMB(learning_rate=0.02, weight_decay_rate=0.01, **settings),
    )
