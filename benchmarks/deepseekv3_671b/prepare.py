"""Provides the DeepSeek-V3 data preparation: the C4 token windows of `llama31_8b`, by the same
code, at the reference's 4,096 tokens.

The reference reads the same C4 files as `llama31_8b`'s, tokenized with the Llama 3.1 tokenizer
(`pretrain_deepseek_v3_671b.py`: `c4-train.en_6_text_document`,
`c4-validation-91205-samples.en_text_document`, the tokenizer in `/tokenizer`); its windows are
4,096 tokens (`--sequence_length`), so prepare with `--sequence_length=4096`.

Command line:
  mlperf-tf prepare deepseekv3_671b --c4_dir=C4 --tokenizer=Llama-3.1-8B/tokenizer.json
      --out_dir=DIR --sequence_length=4096 [--train_shards=768-1023] [--max_train_windows=N]
  mlperf-tf prepare deepseekv3_671b --mini --out_dir=DIR
"""

from __future__ import annotations

from collections.abc import Sequence

from mlperf_tf import prepare_cli
from mlperf_tf.data import c4


def main(argv: Sequence[str] | None = None) -> int:
    """`mlperf-tf prepare deepseekv3_671b ...` (see the module docstring)."""
    return c4.main(argv, name="deepseekv3_671b")


if __name__ == "__main__":
    prepare_cli.module_main(main)
