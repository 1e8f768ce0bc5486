"""Checkpoints across layouts for the benchmarks whose split is over `model` or `expert`: a run
saved split (weights and their optimizer slots saved whole) resumes on 1 device
(`tests/layout_resume.py` says what is checked). The convolutional benchmarks' spatial layouts
have their own modules (`resnet50/`, `ssd/test_layout_resume.py`)."""

import pytest

from mlperf_tf import registry
from tests.layout_resume import Layout, assert_resumes

pytestmark = pytest.mark.numerics

_SLOW = pytest.mark.slow
# The default run keeps one (the cheapest); the others are `slow`.
SPLIT_RUNS = [
    pytest.param("llama31_8b", Layout(2, model_parallel=2), id="llama31_8b"),
    pytest.param("bert", Layout(2, model_parallel=2), id="bert", marks=_SLOW),
    pytest.param("flux1", Layout(2, model_parallel=2), id="flux1", marks=_SLOW),
    pytest.param("llama2_70b_lora", Layout(2, model_parallel=2), id="llama2_70b_lora", marks=_SLOW),
    pytest.param("transformer", Layout(2, model_parallel=2), id="transformer", marks=_SLOW),
    # Each replica holds half the experts.
    pytest.param("gpt_oss_20b", Layout(2, expert_parallel=2), id="gpt_oss_20b", marks=_SLOW),
]


@pytest.mark.parametrize("name, saved", SPLIT_RUNS)
def test_a_split_run_resumes_on_1_device(name, saved, tmp_path):
    def smoke():
        benchmark = registry.get(name)
        return benchmark(benchmark.preset("smoke"))

    assert_resumes(smoke, saved=saved, resumed=Layout(1), model_dir=tmp_path)
