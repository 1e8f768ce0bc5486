"""flux1 checkpoints across layouts: a run saved at `--model_parallel=2` (split weights and
their optimizer slots saved whole) resumes on 1 device (`tests/layout_resume.py` says what is
checked)."""

import pytest

from mlperf_tf import registry
from tests.layout_resume import Layout, assert_resumes

pytestmark = [pytest.mark.numerics, pytest.mark.slow]


def _smoke():
    benchmark = registry.get("flux1")
    return benchmark(benchmark.preset("smoke"))


def test_model_parallel_2_resumes_on_1_device(tmp_path):
    assert_resumes(_smoke, saved=Layout(2, model_parallel=2), resumed=Layout(1), model_dir=tmp_path)
