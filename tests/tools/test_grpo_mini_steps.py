"""tools/studies/grpo_mini_steps.py: the per-step advantage signal and the paired difference of
two evaluations on the same tasks (the study's numbers in the GRPO README come from them)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from tests.numerics import assert_close
from tools.studies import grpo_mini_steps


def test_step_signal_counts_groups_without_advantage():
    rewards = [0, 0, 0, 0] + [1, 1, 1, 1] + [0, 1, 0, 0] + [1, 1, 1, 1]  # 4 groups of 4
    token_mask = np.zeros([16, 10], np.float32)
    token_mask[:, :6] = 1.0
    token_mask[0, 6:] = 1.0  # one rollout of 10 tokens: the mean is 6.25
    sample_mask = np.ones(16, np.float32)
    sample_mask[[3, 9]] = 0.0
    signal = grpo_mini_steps.step_signal(rewards, sample_mask, token_mask, generations=4)
    assert (signal["all_0"], signal["all_1"], signal["groups"]) == (1, 2, 4)
    assert signal["dropped"] == 2
    assert_close(signal["tokens"], 6.25, rtol=1e-6)


def test_paired_difference_on_the_same_tasks():
    base = [1, 1, 0, 0, 1, 0, 1, 0]
    after = [1, 0, 1, 1, 1, 0, 1, 0]  # gained tasks 2 and 3, lost task 1
    diff, se, gained, lost = grpo_mini_steps.paired_difference(after, base)
    assert (gained, lost) == (2, 1)
    assert_close(diff, 1 / 8, rtol=1e-12)
    d = np.array(after) - np.array(base)  # the standard error of the mean of d (ddof 0)
    assert_close(se, math.sqrt(np.var(d) / len(d)), rtol=1e-12)
    with pytest.raises(ValueError, match="error: --compare has 8 tasks, this run 3"):
        grpo_mini_steps.paired_difference([1, 0, 1], base)
