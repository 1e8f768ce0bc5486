"""The Transformer mini acceptance run (slow). The smoke-run checks every benchmark shares (official
log check, hparams, eval padding, resume) are in tests/benchmarks/test_contract*.py."""

import pytest

from benchmarks.transformer import config as config_lib
from tests import e2e


@pytest.mark.slow
def test_mini_preset_reaches_its_target_and_passes_the_official_checker(tmp_path):
    """The acceptance run: `mlperf-tf run --benchmark=transformer --preset=mini` (minutes)."""
    log, minutes, scores = e2e.run_mini_to_success("transformer", tmp_path)
    assert scores[-1] >= config_lib.mini().quality_target
    e2e.assert_passes_quality_aside(log, ("0.7.0",), "closed_transformer.yaml")
    print(f"mini: BLEU {scores} in {minutes:.1f} min")
