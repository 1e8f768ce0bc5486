"""Checkpoints across layouts for the benchmarks whose split is over `model` or `expert`: a run
saved split (weights and their optimizer slots saved whole) resumes on 1 device
(`tests/layout_resume.py` says what is checked). The convolutional benchmarks' spatial layouts
have their own modules (`resnet50/`, `ssd/test_layout_resume.py`)."""

import pytest

from mlperf_tf import registry
from tests.layout_resume import Layout, assert_resumes

pytestmark = [pytest.mark.numerics, pytest.mark.slow]

SPLIT_RUNS = [
    ("bert", Layout(2, model_parallel=2)),
    ("flux1", Layout(2, model_parallel=2)),
    ("llama2_70b_lora", Layout(2, model_parallel=2)),
    ("llama31_8b", Layout(2, model_parallel=2)),
    ("transformer", Layout(2, model_parallel=2)),
    ("gpt_oss_20b", Layout(2, expert_parallel=2)),  # each replica holds half the experts
]


@pytest.mark.parametrize("name, saved", SPLIT_RUNS, ids=[name for name, _ in SPLIT_RUNS])
def test_a_split_run_resumes_on_1_device(name, saved, tmp_path):
    def smoke():
        benchmark = registry.get(name)
        return benchmark(benchmark.preset("smoke"))

    assert_resumes(smoke, saved=saved, resumed=Layout(1), model_dir=tmp_path)
