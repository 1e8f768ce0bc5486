"""Provides the Llama input: packed token windows (TFRecords or synthetic) to per-replica batches.

The windows and their parsing are `mlperf_tf.data.token_windows` (shared with `gpt_oss_20b`);
this module names them for Llama and makes the standard input hooks.
"""

from __future__ import annotations

from mlperf_tf.data.parsed import ParsedInput
from mlperf_tf.data.token_windows import (  # noqa: F401 (this module's public names)
    TOKENS,
    feature_spec,
    make_parse_fn,
    split_window,
    synthetic_example,
)

# The standard input hooks (`Benchmark.input_module`), made from the two functions above.
INPUT = ParsedInput(what="Llama", make_parse_fn=make_parse_fn, synthetic_example=synthetic_example)
