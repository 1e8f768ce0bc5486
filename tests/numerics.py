"""Provides `assert_close`: the suite's one rule for comparing floating-point results.

float32 results move between machines: oneDNN picks other kernels and summation orders on
AVX-512 and AVX2-only CPUs, and TF's own kernels differ again with oneDNN off (`tests/README.md`
has the numbers: a Transformer logit of ~28 moved by 1.5e-4). An absolute tolerance chosen on one
machine fails on another, and one chosen for values of ~1 hides real errors in values of ~1e-3.

The rule: the tolerance is relative, and its absolute floor follows the tensor's scale, the
largest magnitude of the expected tensor (rounding errors are proportional to the magnitudes the
values were computed from, so a value near zero in a tensor of large values carries the large
values' error). `rtol` says how exact the computation is: 1e-6 for elementwise float32 work,
1e-5 for a few float32 layers or reductions, 1e-4 for a deep stack (a model's logits or
gradients through several layers), measured under the three oneDNN settings CI uses with at
least a 5x margin. A test of a bug must still fail on that bug: the bug's effect must be far
above `rtol` times the scale (each changed test in `tests/README.md` was shown to fail on it).
"""

from __future__ import annotations

import os

import numpy as np

# Set to a file path: each comparison appends the test's id and the share of its tolerance used
# (max |actual - expected| / (atol + rtol |expected|)), to measure margins under each oneDNN setting.
LOG_ENV = "TESTS_NUMERICS_LOG"


def scale_of(expected) -> float:
    """The magnitude that sets the absolute floor: max |expected|, or 1 if it is all zeros."""
    values = np.asarray(expected, dtype=np.float64)
    largest = float(np.max(np.abs(values))) if values.size else 0.0
    return largest if largest > 0 else 1.0


def assert_close(
    actual, expected, *, rtol: float = 1e-5, err_msg: str = "", scale: float | None = None
) -> None:
    """`actual` equals `expected` to `rtol`, relative to each value and to the tensor's scale.

    Args:
      actual: the computed values (array-like, any float dtype; compared in float64).
      expected: the reference values, same shape.
      rtol: relative tolerance; the absolute floor is `rtol * scale`.
      err_msg: added to the failure message.
      scale: the magnitude of the terms the values were computed from, where it is not the
        expected tensor's own (a difference or a sum that cancels to ~0); default
        `scale_of(expected)`.

    Raises:
      AssertionError: some value differs by more than `rtol * (|expected| + scale)`.
    """
    expected = np.asarray(expected, dtype=np.float64)
    actual = np.asarray(actual, dtype=np.float64)
    atol = rtol * (scale_of(expected) if scale is None else float(scale))
    if os.environ.get(LOG_ENV):
        _log_margin(actual, expected, rtol, atol)
    np.testing.assert_allclose(actual, expected, rtol=rtol, atol=atol, err_msg=err_msg)


def _log_margin(actual, expected, rtol: float, atol: float) -> None:
    """Appends the share of the tolerance this comparison used to the file $TESTS_NUMERICS_LOG."""
    if actual.shape != expected.shape or not np.all(np.isfinite(actual)):
        return  # assert_allclose reports these
    allowed = np.maximum(atol + rtol * np.abs(expected), np.finfo(np.float64).tiny)
    used = float(np.max(np.abs(actual - expected) / allowed)) if allowed.size else 0.0
    test = os.environ.get("PYTEST_CURRENT_TEST", "?").split(" ")[0]
    with open(os.environ[LOG_ENV], "a", encoding="utf-8") as log:
        log.write(f"{used:.3g} rtol={rtol:g} {test}\n")
