"""gpt_oss_20b checkpoints across layouts: a run saved at `--expert_parallel=2` (each replica
holding half the experts; saved whole) resumes on 1 device (`tests/layout_resume.py` says what
is checked)."""

import pytest

from mlperf_tf import registry
from tests.layout_resume import Layout, assert_resumes

pytestmark = [pytest.mark.numerics, pytest.mark.slow]


def _smoke():
    benchmark = registry.get("gpt_oss_20b")
    return benchmark(benchmark.preset("smoke"))


def test_expert_parallel_2_resumes_on_1_device(tmp_path):
    assert_resumes(
        _smoke, saved=Layout(2, expert_parallel=2), resumed=Layout(1), model_dir=tmp_path
    )
