"""Provides the Llama data preparation: C4 `c4/en` JSON-lines shards -> packed token-window TFRecords.

The preparation is `mlperf_tf.data.c4` (shared with `gpt_oss_20b`: the same files, eval set and
mini corpus); its docstring says how the windows follow the MLPerf reference. This module keeps
the names Llama's callers use and the command line.

Command line:
  mlperf-tf prepare llama31_8b --c4_dir=C4 --tokenizer=Llama-3.1-8B/tokenizer.json --out_dir=DIR
      [--sequence_length=8192] [--train_shards=768-1023] [--max_train_windows=N]
  mlperf-tf prepare llama31_8b --mini --out_dir=DIR
"""

from __future__ import annotations

from collections.abc import Sequence

from mlperf_tf import prepare_cli
from mlperf_tf.data import c4
from mlperf_tf.data.c4 import (  # noqa: F401 (this module's public names)
    END_OF_TEXT,
    MINI_CORPUS_PACKAGES,
    REFERENCE_TRAIN_SHARDS,
    TRAIN_SHARD,
    VALIDATION_SHARD,
    WINDOWS_PER_FILE,
    Tokenizer,
    c4_shards,
    load_tokenizer,
    mini_documents,
    ngram_log_perplexities,
    pack_windows,
    parse_shard_range,
    prepare,
    prepare_mini,
    read_documents,
    token_stream,
    write_windows,
)


def main(argv: Sequence[str] | None = None) -> int:
    """`mlperf-tf prepare llama31_8b ...` (see the module docstring)."""
    return c4.main(argv, name="llama31_8b")


if __name__ == "__main__":
    prepare_cli.module_main(main)
