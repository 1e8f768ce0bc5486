"""Tests for mlperf_tf.optimizers.lamb: golden values against a NumPy LAMB, Keras' Lamb, config."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from mlperf_tf.optimizers import LAMB, LARS, WarmupPolynomialDecay
from mlperf_tf.optimizers.lamb import DEFAULT_LAMB_EXCLUDE
from tests.mlperf_tf.optimizers import layerwise
from tests.numerics import assert_close

pytestmark = pytest.mark.numerics

NUM_STEPS = 5

VARIABLES, GRADIENTS = layerwise.problem(seed=1, steps=NUM_STEPS, scale=0.1)


def make_variables():
    return layerwise.make_variables(VARIABLES)


def numpy_lamb(
    lrs, *, beta_1, beta_2, epsilon, weight_decay, no_decay, no_adapt, bias_correction=True
):
    """The MLPerf BERT LAMB formula in float64 NumPy; returns the weights after each step."""
    w = [init.astype(np.float64) for _, _, init, _ in VARIABLES]
    m = [np.zeros_like(x) for x in w]
    v = [np.zeros_like(x) for x in w]
    history = []
    for t, (grads, lr) in enumerate(zip(GRADIENTS, lrs), start=1):
        for i, g in enumerate(grads):
            m[i] = beta_1 * m[i] + (1 - beta_1) * g
            v[i] = beta_2 * v[i] + (1 - beta_2) * g * g
            m_hat, v_hat = m[i], v[i]
            if bias_correction:
                m_hat, v_hat = m[i] / (1 - beta_1**t), v[i] / (1 - beta_2**t)
            r = m_hat / (np.sqrt(v_hat) + epsilon)
            if not no_decay[i]:
                r = r + weight_decay * w[i]
            trust = 1.0
            if not no_adapt[i]:
                w_norm, r_norm = np.linalg.norm(w[i]), np.linalg.norm(r)
                if w_norm > 0 and r_norm > 0:
                    trust = w_norm / r_norm
            w[i] = w[i] - lr * trust * r
        history.append([x.copy() for x in w])
    return history


def run_optimizer(optimizer, variables, steps=GRADIENTS):
    return layerwise.run_optimizer(optimizer, variables, steps)


def assert_histories_close(actual, expected):
    layerwise.assert_histories_close(actual, expected, VARIABLES)


@pytest.mark.parametrize("bias_correction", [True, False])
def test_lamb_matches_numpy_formula_with_default_exclusions(bias_correction):
    settings = dict(epsilon=1e-6, weight_decay=0.1, bias_correction=bias_correction)
    variables = make_variables()
    optimizer = LAMB(0.05, **settings)  # LAMB's default betas and exclusions
    excluded = layerwise.flags(DEFAULT_LAMB_EXCLUDE, variables)
    assert excluded == [False, True, False, False, False, True, False]
    expected = numpy_lamb(
        [0.05] * NUM_STEPS,
        beta_1=0.9,
        beta_2=0.999,
        **settings,
        no_decay=excluded,
        no_adapt=excluded,
    )
    assert_histories_close(run_optimizer(optimizer, variables), expected)


def test_separate_exclusion_lists():
    # Weight decay skips LayerNorm and biases; adaptation skips only "output" and biases.
    variables = make_variables()
    schedule = WarmupPolynomialDecay(
        0.1, warmup_steps=2, decay_steps=10, start_warmup_step=-1, decay_start_step=0
    )
    lrs = [float(schedule(step)) for step in range(NUM_STEPS)]
    settings = dict(beta_1=0.8, beta_2=0.95, epsilon=1e-4, weight_decay=0.05)
    optimizer = LAMB(
        schedule,
        **settings,
        exclude_from_weight_decay=["layer_norm", "bias"],
        exclude_from_layer_adaptation=["^output/", "bias"],
    )
    no_decay = layerwise.flags(["layer_norm", "bias"], variables)
    no_adapt = layerwise.flags(["^output/", "bias"], variables)
    assert no_decay != no_adapt
    expected = numpy_lamb(lrs, **settings, no_decay=no_decay, no_adapt=no_adapt)
    assert_histories_close(run_optimizer(optimizer, variables), expected)


def test_zero_weights_and_zero_gradients():
    variables = make_variables()
    optimizer = LAMB(0.05, weight_decay=0.1, epsilon=1e-6)
    run_optimizer(optimizer, variables, steps=GRADIENTS[:1])
    # |w| = 0: trust 1, the first step is lr * m_hat / (sqrt(v_hat) + eps) = lr * g / (|g| + eps).
    g = GRADIENTS[0][3]
    assert_close(variables[3].numpy(), -0.05 * g / (np.abs(g) + 1e-6), rtol=1e-6)
    # g = 0: r = wd * w, trust = |w| / |wd * w| = 1 / wd, so w <- w - lr * w.
    still = VARIABLES[4][2]
    assert_close(variables[4].numpy(), still * (1 - 0.05), rtol=1e-6)


def test_matches_keras_lamb_without_weight_decay():
    # With wd = 0 and nothing excluded, LAMB is keras.optimizers.Lamb; 10 steps.
    steps = GRADIENTS + GRADIENTS
    ours, theirs = make_variables(), make_variables()
    ours_history = run_optimizer(
        LAMB(0.01, epsilon=1e-7, exclude_from_weight_decay=(), exclude_from_layer_adaptation=()),
        ours,
        steps,
    )
    keras_history = run_optimizer(
        keras.optimizers.Lamb(learning_rate=0.01, epsilon=1e-7), theirs, steps
    )
    assert_histories_close(ours_history, keras_history)


def test_none_adaptation_list_means_the_weight_decay_list():
    optimizer = LAMB(0.01, exclude_from_weight_decay=["bias"])
    assert optimizer.layer_adaptation_patterns == ("bias",)
    assert LAMB(0.01, exclude_from_layer_adaptation=()).layer_adaptation_patterns == ()


def test_get_config_round_trip_keeps_every_argument():
    schedule = WarmupPolynomialDecay(
        4e-3, warmup_steps=10, decay_steps=100, start_warmup_step=-3, decay_start_step=0
    )
    for adaptation in (None, ["LayerNorm"], []):
        optimizer = LAMB(
            schedule,
            beta_1=0.85,
            beta_2=0.99,
            epsilon=1e-8,
            weight_decay=0.01,
            exclude_from_weight_decay=["bias"],
            exclude_from_layer_adaptation=adaptation,
            bias_correction=False,
            global_clipnorm=1.0,
            name="my_lamb",
        )
        config = layerwise.assert_config_round_trips(optimizer)
        assert config["exclude_from_weight_decay"] == ["bias"]
        assert config["exclude_from_layer_adaptation"] == adaptation
        assert config["bias_correction"] is False and config["weight_decay"] == 0.01


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"weight_decay": -0.1}, "weight_decay"),
        ({"weight_decay_rate": 0.1}, "weight_decay_rate"),
        ({"beta_1": 1.0}, "beta_1"),
        ({"beta_2": -0.1}, "beta_2"),
        ({"exclude_from_layer_adaptation": "bias"}, "exclude_from_layer_adaptation"),
        ({"exclude_from_weight_decay": ["[a"]}, "exclude_from_weight_decay"),
    ],
)
def test_bad_arguments_name_the_argument(kwargs, message):
    with pytest.raises(ValueError, match=message):
        LAMB(0.01, **kwargs)


@pytest.mark.parametrize(
    "make",
    [
        lambda: LAMB(0.01, weight_decay=0.1),
        lambda: LARS(0.5, weight_decay=0.1, eeta=0.1),
    ],
    ids=["lamb", "lars"],
)
def test_sparse_embedding_gradients_equal_dense_ones(make):
    # An embedding lookup's gradient is IndexedSlices; the update must equal the dense one.
    table = np.random.default_rng(4).normal(size=(10, 4)).astype("float32")
    results = []
    for densify in (False, True):
        embedding = layerwise.make_variable("embeddings", "table", table)
        optimizer = make()
        for ids in ([1, 3, 3], [0, 9, 1]):
            with tf.GradientTape() as tape:
                loss = tf.reduce_sum(tf.square(tf.gather(embedding.value, ids)))
            grad = tape.gradient(loss, embedding.value)
            assert isinstance(grad, tf.IndexedSlices)
            optimizer.apply_gradients(
                [(tf.convert_to_tensor(grad) if densify else grad, embedding)]
            )
        results.append(embedding.numpy())
    assert not np.allclose(results[0], table)
    assert_close(results[0], results[1], rtol=1e-6)
