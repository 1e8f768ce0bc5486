"""Provides named Keras variables with scripted gradients, for the golden tests of the layer-wise
optimizers (LARS, LAMB) and of their parity with the Model Garden's.

A problem is a table of rows (name scope, variable name, initial value, gradient kind): the
variable's path is "<scope>/<name>", what exclusion patterns are matched against; gradient kind
"zero" gives it zero gradients (|g| = 0, the trust ratio's edge case), "random" normal ones.
"""

import contextlib
import copy

import keras
import numpy as np

from mlperf_tf.optimizers.base import matches_any, variable_path
from tests.numerics import assert_close

# (name scope, variable name, shape, initial value, gradient kind). A kernel and its bias (both
# optimizers' default exclusions skip biases); a batch-norm and a layer-norm scale (LARS' defaults
# exclude both, LAMB's the layer norm's); a kernel at 0 (|w| = 0: trust 1); a kernel with zero
# gradients; an output kernel. Tests index rows 1 (bias), 3 (zero) and 4 (still).
ROWS = [
    ("conv", "kernel", (3, 3, 2, 4), "normal", "random"),
    ("conv", "bias", (4,), "normal", "random"),
    ("batch_normalization", "gamma", (4,), "near_one", "random"),
    ("zero", "kernel", (5, 3), "zeros", "random"),
    ("still", "kernel", (2, 6), "normal", "zero"),
    ("encoder/layer_norm", "gamma", (6,), "near_one", "random"),
    ("output", "kernel", (6, 3), "normal", "random"),
]
_INITIAL = {
    "normal": lambda rng, shape: rng.normal(size=shape),
    "near_one": lambda rng, shape: 1.0 + 0.1 * rng.normal(size=shape),
    "zeros": lambda rng, shape: np.zeros(shape),
}


def problem(seed: int, steps: int, scale: float):
    """`ROWS` as a table with initial values drawn from `seed`, and `steps` steps of gradients."""
    rng = np.random.default_rng(seed)
    table = [
        (scope, name, _INITIAL[initial](rng, shape), kind)
        for scope, name, shape, initial, kind in ROWS
    ]
    return table, scripted_gradients(rng, table, steps, scale)


def scripted_gradients(rng, table, steps: int, scale: float) -> list[list[np.ndarray]]:
    """One list of gradients per step, in the table's order (float64, normal x `scale`)."""
    return [
        [
            np.zeros_like(init) if kind == "zero" else rng.normal(size=init.shape) * scale
            for _, _, init, kind in table
        ]
        for _ in range(steps)
    ]


def make_variable(scope, name, init):
    """A float32 Keras variable whose path is "<scope>/<name>" (scope may hold "/")."""
    with contextlib.ExitStack() as stack:
        for part in scope.split("/"):
            stack.enter_context(keras.name_scope(part))
        return keras.Variable(init.astype("float32"), name=name)


def make_variables(table):
    return [make_variable(scope, name, init) for scope, name, init, _ in table]


def flags(patterns, variables) -> list[bool]:
    """Whether any of `patterns` matches each variable's path."""
    return [matches_any(patterns, variable_path(v)) for v in variables]


def run_optimizer(optimizer, variables, gradients):
    """Applies each step's gradients; returns the weights after each step (float64)."""
    history = []
    for grads in gradients:
        optimizer.apply_gradients(
            [(keras.ops.convert_to_tensor(g, "float32"), v) for g, v in zip(grads, variables)]
        )
        history.append([v.numpy().astype(np.float64) for v in variables])
    return history


def assert_config_round_trips(optimizer) -> dict:
    """`from_config` and Keras' registry (serialize, deserialize) both give back an optimizer of
    the same class and config; returns the config."""
    config = optimizer.get_config()
    restored = type(optimizer).from_config(copy.deepcopy(config))
    assert restored.get_config() == config
    again = keras.optimizers.deserialize(keras.optimizers.serialize(optimizer))
    assert type(again) is type(optimizer) and again.get_config() == config
    return config


def assert_histories_close(actual, expected, table, rtol=1e-6):
    """Every step's weights agree; a failure names the step and the variable's path."""
    for step, (got, want) in enumerate(zip(actual, expected)):
        for (scope, name, _, _), a, e in zip(table, got, want):
            assert_close(a, e, rtol=rtol, err_msg=f"step {step + 1}, {scope}/{name}")
