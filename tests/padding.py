"""Checks shared by the models that skip padding (Transformer, BERT): the packed step and the
padded (static-shape) step give the same loss and gradients, and only the packed one has
data-dependent matmul shapes."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from mlperf_tf.benchmark import RunContext
from tests.numerics import assert_close


def traced_matmuls(benchmark, model, batch) -> list[tf.Operation]:
    """The `MatMul` ops of `benchmark.compute_loss`, traced on `batch`."""
    graph = (
        tf.function(lambda batch: benchmark.compute_loss(model, batch, training=True))
        .get_concrete_function(batch)
        .graph
    )
    return [op for op in graph.get_operations() if op.type == "MatMul"]


def assert_packed_step_equals_padded(benchmark, model, batch) -> dict[bool, float]:
    """Loss and gradients of `compute_loss` with `static_shapes` False and True are equal, and
    data-dependent matmul shapes (None rows) appear exactly when not static.

    Returns:
      the loss of each, keyed by `static_shapes`.
    """
    results = {}
    for static in (False, True):
        bound = benchmark.with_context(RunContext(static_shapes=static))
        with tf.GradientTape() as tape:
            loss = bound.compute_loss(model, batch, training=False)
        grads = tape.gradient(loss, model.trainable_variables)
        results[static] = float(loss), [tf.convert_to_tensor(g).numpy() for g in grads]
        rows = [op.outputs[0].shape[0] for op in traced_matmuls(bound, model, batch)]
        assert (None in rows) is not static
    assert results[False][0] == pytest.approx(results[True][0], rel=1e-6)
    for packed, padded in zip(results[False][1], results[True][1], strict=True):
        # The gradients' own scale (often below 1), never a floor under the 1e-7 this had.
        scale = max(float(np.abs(padded).max()), 1e-2)
        assert_close(packed, padded, rtol=1e-5, scale=scale)
    return {static: loss for static, (loss, _) in results.items()}
