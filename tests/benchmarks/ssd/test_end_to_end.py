"""The SSD mini acceptance run (slow). The smoke-run checks every benchmark shares (official
log check, hparams, eval padding, resume) are in tests/benchmarks/test_contract*.py."""

import os

import pytest

from tests import e2e


@pytest.mark.slow
def test_mini_preset_reaches_its_target_and_passes_the_official_checker(tmp_path):
    """The acceptance run: `mlperf-tf run --benchmark=ssd --preset=mini` (minutes)."""
    log, minutes, accuracies = e2e.run_mini_to_success("ssd", tmp_path)
    assert accuracies[-1] >= 0.23
    e2e.assert_official_pass(log, ("0.7.0", "1.0.0"))
    assert minutes < 15, f"mini took {minutes:.1f} min (machine load: {os.getloadavg()})"
