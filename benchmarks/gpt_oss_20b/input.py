"""Provides the GPT-OSS input: `llama31_8b`'s packed C4 token windows (TFRecords or synthetic).

The windows and their parsing are `mlperf_tf.data.token_windows` (one implementation for both
C4 benchmarks): int32 `input_ids` and `labels` [max_sequence_length]. The loss mask of
end-of-document positions is the model's business (`benchmark.GptOssBenchmark.token_losses`).
"""

from __future__ import annotations

from mlperf_tf.data import token_windows
from mlperf_tf.data.parsed import ParsedInput

# The standard input hooks (`Benchmark.input_module`).
INPUT = ParsedInput(
    what="GPT-OSS (C4 token window)",
    make_parse_fn=token_windows.make_parse_fn,
    synthetic_example=token_windows.synthetic_example,
)
