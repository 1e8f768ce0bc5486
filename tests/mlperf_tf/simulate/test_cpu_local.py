"""Tests of the cpu-local measurements' fit (the measuring itself is `python -m ...cpu_local`)."""

import pytest

from mlperf_tf.simulate import cpu_local


def test_fit_recovers_alpha_and_beta_of_the_ring_model():
    alpha, beta, p = 3e-4, 2e-9, 4
    sizes = [4e3, 4e4, 4e5, 4e6]
    times = [2 * (p - 1) * alpha + 2 * (p - 1) / p * n * beta for n in sizes]
    fit_alpha, fit_beta = cpu_local.fit_alpha_beta(p, sizes, times)
    assert fit_alpha == pytest.approx(alpha)
    assert fit_beta == pytest.approx(beta)


def test_fit_rejects_too_few_points_and_participants():
    with pytest.raises(ValueError, match="p >= 2"):
        cpu_local.fit_alpha_beta(1, [1, 2], [1, 2])
    with pytest.raises(ValueError, match="at least two"):
        cpu_local.fit_alpha_beta(2, [1], [1])
