"""Provides `assert_close`: the suite's one rule for comparing floating-point results.

float32 results move between machines: oneDNN picks other kernels and summation orders on
AVX-512 and AVX2-only CPUs (a logit of ~12 moved by 9e-5), so an absolute tolerance chosen on one
machine fails on another. The rule: compare at a relative tolerance, with the absolute floor
scaled by the largest magnitude of the expected tensor (values near zero in a tensor of large
values carry the large values' rounding error). `rtol` says how exact the computation should be:
1e-5 for a few float32 layers, more for deep stacks; a test of a bug must still fail on that bug.
"""

from __future__ import annotations

import numpy as np


def scale_of(expected) -> float:
    """The magnitude that sets the absolute floor: max |expected|, at least 1."""
    values = np.asarray(expected, dtype=np.float64)
    return max(1.0, float(np.max(np.abs(values)))) if values.size else 1.0


def assert_close(actual, expected, *, rtol: float = 1e-5, err_msg: str = "") -> None:
    """`actual` equals `expected` to `rtol`, relative to each value and to the tensor's scale."""
    expected = np.asarray(expected)
    np.testing.assert_allclose(
        np.asarray(actual),
        expected,
        rtol=rtol,
        atol=rtol * scale_of(expected),
        err_msg=err_msg,
    )
