"""Provides `logged_hparams`: a benchmark's logged hyperparameters under a round's names, checked
against every key that round's closed rules require of the benchmark (the benchmark tests share it)."""

from __future__ import annotations

from typing import Any

from mlperf_logging.mllog import constants as C

from mlperf_tf import rounds

# Keys the runner logs for every benchmark (not the benchmark's `mlperf_hparams`).
RUNNER_KEYS = frozenset(
    {C.GLOBAL_BATCH_SIZE, C.GRADIENT_ACCUMULATION_STEPS, C.TRAIN_SAMPLES, C.EVAL_SAMPLES, C.SEED,
     C.EVAL_ACCURACY}
)  # fmt: skip
# Events and submission keys the rules list as required, which the runner logs as events.
EVENT_KEYS = frozenset(
    {C.CACHE_CLEAR, "block_start", "block_stop", "epoch_start", "epoch_stop", "eval_start",
     "eval_stop"}
)  # fmt: skip


def logged_hparams(bench, ruleset: str) -> dict[str, Any]:
    """What the runner logs for `bench` (its keys and the round-level ones it adds for every
    benchmark, `Benchmark.round_hparams`) under `ruleset`'s names, after asserting that it holds
    every key the closed rules of `bench.mlperf_benchmark` require."""
    emitted = {**bench.mlperf_hparams(), **bench.round_hparams()}
    hparams = rounds.adapt_hparams(bench.renamed_keys, ruleset, emitted)
    required = rounds.required_keys(ruleset, bench.mlperf_benchmark)
    rule_keys = {k for k in required if not k.startswith(("submission_", "init_", "run_"))}
    missing = rule_keys - EVENT_KEYS - RUNNER_KEYS - set(hparams)
    assert not missing, missing
    return hparams
