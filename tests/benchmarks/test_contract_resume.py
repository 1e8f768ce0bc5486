"""The `Benchmark` contract's resume case for every registered benchmark (the rest of the
contract is `test_contract.py`): stopped after one step, a run restarted in the same folder
continues from that step. Its own module so that the test processes (`-n auto --dist
loadscope`, tests/README.md) run it beside the contract's smoke runs, not after them: the two
are the default run's largest modules.
"""

import os

import pytest

from mlperf_tf import registry, runner

# GRPO's resume traces its DeltaNet steps and rollouts twice: 105 s of the default run's ~20
# minutes (2026-12-06, the fresh-clone durations), so it runs with `-m slow`; its smoke run and
# evaluations stay in the default run (`test_contract.py`), and the runner's resume is the same
# code for every benchmark.
SLOW = {"qwen35_397b_grpo"}
# The resumes of 36-113 s (2026-12-07, loaded; two traced runs each) are extended: CI runs them
# after README's default run. The default run covers the resume by the cheapest three
# (llama31_8b, llama2_70b_lora, resnet50: 11-16 s); every benchmark's smoke run is in
# `test_contract.py`.
EXTENDED = {
    "bert", "deepseekv3_671b", "dlrmv4", "efficientnet", "flux1", "gpt_oss_20b", "ssd",
    "transformer",
}  # fmt: skip
NAMES = [pytest.param(n, marks=pytest.mark.slow) if n in SLOW
         else pytest.param(n, marks=pytest.mark.extended) if n in EXTENDED
         else n for n in sorted(registry.available())]  # fmt: skip


class _FirstLoop(runner.Action):
    def __init__(self):
        self.first = None

    def after_loop(self, output):
        self.first = self.first or output


@pytest.mark.parametrize("name", NAMES)
def test_a_run_resumes_from_its_checkpoint(name, tmp_path):
    """Stopped after one step, a run restarted in the same folder continues from that step."""
    benchmark_class = registry.get(name)
    benchmark = benchmark_class(benchmark_class.preset("smoke"))
    settings = dict(model_dir=str(tmp_path), distribution="one_device", steps_per_loop=8)
    first = runner.run(benchmark, runner.RunConfig(max_train_steps=1, **settings))
    assert first.steps == 1 and len(first.evals) == 1  # the budget's end is evaluated
    loop = _FirstLoop()
    second = runner.run(benchmark, runner.RunConfig(max_train_steps=2, **settings), actions=[loop])
    assert (loop.first.step - loop.first.steps, loop.first.step) == (1, 2)  # began at step 1
    assert second.steps == 2 and len(second.evals) == 1
    assert os.path.exists(first.mlperf_log + ".1")  # the first run's log was kept
