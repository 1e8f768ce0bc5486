"""Provides the GPT-OSS data preparation: the C4 token windows of `llama31_8b`, by the same code.

The reference reads the same C4 files as `llama31_8b`'s, tokenized with the Llama 3.1 tokenizer
(`conf/gpt_oss_20B-pretrain.yaml`: `tokenizer_model: meta-llama/Llama-3.1-8B`,
`c4-train.en_6_text_document`, `c4-validation-91205-samples.en_text_document`), so one folder
prepared by either command serves both benchmarks (`mlperf_tf.data.c4` says how).

Command line:
  mlperf-tf prepare gpt_oss_20b --c4_dir=C4 --tokenizer=Llama-3.1-8B/tokenizer.json --out_dir=DIR
      [--sequence_length=8192] [--train_shards=768-1023] [--max_train_windows=N]
  mlperf-tf prepare gpt_oss_20b --mini --out_dir=DIR
"""

from __future__ import annotations

from collections.abc import Sequence

from mlperf_tf import prepare_cli
from mlperf_tf.data import c4


def main(argv: Sequence[str] | None = None) -> int:
    """`mlperf-tf prepare gpt_oss_20b ...` (see the module docstring)."""
    return c4.main(argv, name="gpt_oss_20b")


if __name__ == "__main__":
    prepare_cli.module_main(main)
