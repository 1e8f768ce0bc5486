"""Provides the DeepSeek-V3 input: `llama31_8b`'s packed C4 token windows (TFRecords or
synthetic), at 4,096 tokens.

The windows and their parsing are `mlperf_tf.data.token_windows` (one implementation for the C4
benchmarks): int32 `input_ids` and `labels` [max_sequence_length]. The reference masks no
end-of-document position (`eod_mask_loss=False`). The eval set is the first 1,024 validation
windows in order (`mlperf_tf.data.c4` writes them so; the eval input is never shuffled).
"""

from __future__ import annotations

from mlperf_tf.data import token_windows
from mlperf_tf.data.parsed import ParsedInput

# The standard input hooks (`Benchmark.input_module`).
INPUT = ParsedInput(
    what="DeepSeek-V3 (C4 token window)",
    make_parse_fn=token_windows.make_parse_fn,
    synthetic_example=token_windows.synthetic_example,
)
