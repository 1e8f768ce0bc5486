"""Converts the llama2_70b_lora inputs: the base checkpoint and GovReport to the suite's formats.

`mlperf-tf prepare llama2_70b_lora --out_dir=OUT` with any of:

- `--checkpoint=DIR`: the MLCommons fused-qkv Llama 2 70B checkpoint (`Llama2-70b-fused-qkv-mlperf`)
  or a plain Hugging Face Llama 2 (safetensors + `config.json`) -> the suite checkpoint `OUT/base`
  (checkpoint.py; `--config.base_checkpoint=OUT/base` at run time).
- `--govreport=DIR`: MLCommons' preprocessed GovReport (`scrolls_gov_report_8k`: `train*.parquet`,
  `validation*.parquet` with `input_ids` and `labels`, -100 on the prompt) -> `OUT/train/train-*`
  and `OUT/eval/eval-*` TFRecords (`mlperf_tf.data.tfrecord.write_sharded`), one record per
  sequence, as is.
- `--mini`: the offline mini data set and its pretrained base (`prepare_mini`).

Every output is written into a temporary sibling folder renamed at the end: an error (a corrupt
or missing shard, another model's config, a row whose labels mask everything) is one line and
leaves nothing half-written.
"""

from __future__ import annotations

import glob
import json
import os
import re
import time
from collections.abc import Iterator, Sequence

import numpy as np

from benchmarks.llama2_70b_lora import checkpoint
from benchmarks.llama2_70b_lora import config as config_lib
from mlperf_tf import prepare_cli
from mlperf_tf.data import docstrings
from mlperf_tf.data.tfrecord import make_example, write_sharded
from mlperf_tf.errors import DataError, UserError

IGNORE = config_lib.IGNORE_INDEX
# The reference's prompt (`scripts/utils.py`, gov_report): "### Summarize the following text:\n
# {input}\n ### Summary:\n {output}{eos}", the labels masked over the part before the output.
PROMPT = "### Summarize the following text:\n {body}\n ### Summary:\n"


# ---- GovReport parquet -> TFRecords ---------------------------------------------------------
def parquet_rows(path: str) -> Iterator[tuple[list[int], list[int]]]:
    """(input_ids, labels) of each row of one parquet file, its problems one line."""
    import pyarrow.parquet as pq  # noqa: PLC0415 (only where parquet is read)

    try:
        table = pq.ParquetFile(path)
        names = set(table.schema_arrow.names)
    except Exception as e:  # pyarrow raises several types for a bad file
        raise DataError(f"{path!r} is not a readable parquet file ({e})") from None
    missing = {"input_ids", "labels"} - names
    if missing:
        raise DataError(f"{path!r} has no column {sorted(missing)[0]!r} (columns: {sorted(names)})")
    row = 0
    for batch in table.iter_batches(columns=["input_ids", "labels"], batch_size=256):
        ids, labels = batch.column(0).to_pylist(), batch.column(1).to_pylist()
        for input_ids, label in zip(ids, labels, strict=True):
            check_row(input_ids, label, f"{path!r} row {row}")
            row += 1
            yield input_ids, label


def check_row(input_ids: Sequence[int], labels: Sequence[int], where: str) -> None:
    """Raises DataError unless the row has equal lengths and at least one label to predict
    (a label after the first position that is not -100: the first is never a target)."""
    if input_ids is None or labels is None or len(input_ids) != len(labels):
        raise DataError(f"{where}: input_ids and labels differ in length")
    if not any(label != IGNORE for label in labels[1:]):
        raise DataError(f"{where}: every label is {IGNORE} (no summary token to train on)")


def _example(input_ids, labels) -> bytes:
    return make_example({"input_ids": list(input_ids), "labels": list(labels)}).SerializeToString()


def write_split(rows, out_dir: str, prefix: str, num_shards: int) -> int:
    """Writes rows as `out_dir/prefix-0000i-of-N` TFRecords (staged); returns the row count."""
    count = 0

    def examples():
        nonlocal count
        for input_ids, labels in rows:
            count += 1
            yield _example(input_ids, labels)

    with checkpoint.staged(out_dir) as staging:
        write_sharded(examples(), staging, prefix=prefix, num_shards=num_shards)
        if not count:
            raise DataError(f"no {prefix} rows to write")
    return count


def prepare_govreport(govreport_dir: str, out_dir: str, *, num_shards: int = 4) -> dict:
    """GovReport parquet files -> `out_dir/train`, `out_dir/eval` TFRecords."""
    summary = {}
    for split, pattern in (("train", "train*.parquet"), ("eval", "validation*.parquet")):
        files = sorted(glob.glob(os.path.join(govreport_dir, pattern)))
        if not files:
            raise UserError(f"--govreport {govreport_dir!r} has no {pattern}")
        rows = (row for path in files for row in parquet_rows(path))
        summary[split] = write_split(rows, os.path.join(out_dir, split), split, num_shards)
    return summary


# ---- the mini data set ------------------------------------------------------------------------
# Installed packages whose docstrings join the standard library's (the suite's dependencies).
MINI_PACKAGES = ("numpy", "keras")
HELD_OUT_EVERY = 4  # every 4th file is held out of pretraining and fine-tuning (eval text)
BOS, EOS = 1, 2  # SentencePiece's (and Llama's) ids


def summary_pairs(files: Sequence[str]) -> list[tuple[str, str]]:
    """(body, summary line) of each docstring of `files` whose first paragraph is a one-line
    summary of 3-24 words and whose body has at least 20 words of prose (docstring_sentences:
    code and doctests dropped)."""
    pairs = []
    for path in files:
        for doc in docstrings.module_docstrings(path):
            paragraphs = re.split(r"\n\s*\n", doc.strip(), maxsplit=1)
            if len(paragraphs) < 2 or "\n" in paragraphs[0].strip():
                continue
            summary = paragraphs[0].strip()
            body = " ".join(docstrings.docstring_sentences(paragraphs[1]))
            if 3 <= len(summary.split()) <= 24 and len(body.split()) >= 20:
                pairs.append((body, summary))
    return pairs


def encode_pair(tokenizer, body: str, summary: str, length: int) -> tuple[list[int], list[int]]:
    """(input_ids, labels) of one example in the reference's template, at most `length` tokens:
    BOS, the prompt (its body cut to fit; labels -100), the summary and EOS (labels = ids)."""
    head, tail = PROMPT.split("{body}")
    head_ids, tail_ids = tokenizer.encode(head), tokenizer.encode(tail)
    answer = tokenizer.encode(" " + summary) + [EOS]
    room = length - 1 - len(head_ids) - len(tail_ids) - len(answer)
    body_ids = tokenizer.encode(body)[: max(0, room)]
    prompt = [BOS] + head_ids + body_ids + tail_ids
    return prompt + answer, [IGNORE] * len(prompt) + answer


def _train_tokenizer(text_path: str, prefix: str, vocab_size: int) -> None:
    import sentencepiece as spm  # noqa: PLC0415

    spm.SentencePieceTrainer.train(
        input=text_path, model_prefix=prefix, vocab_size=vocab_size, model_type="bpe",
        character_coverage=1.0, byte_fallback=True, max_sentence_length=1 << 20,
        input_sentence_size=0, num_threads=2, minloglevel=2,
    )  # fmt: skip


def prepare_mini(data_dir: str, *, pretrain_steps: int = config_lib.MINI_PRETRAIN_STEPS) -> dict:
    """Writes the `mini` preset's data and pretrained base into `data_dir` (deterministic; no
    download): `tokenizer.model` (BPE of `MINI_VOCAB_SIZE` learned on the pretraining text),
    `train/`, `eval/` (exactly 173 examples from held-out files), `base/` (the suite checkpoint
    of a Llama 2-shaped `mini_model` pretrained for `pretrain_steps` on the docstrings of the
    files not held out), `summary.json` (sizes, the base's eval loss before fine-tuning).

    Raises:
      DataError: `data_dir` exists, or the held-out text gives fewer than 173 eval examples.
    """
    import sentencepiece as spm  # noqa: PLC0415

    from benchmarks.llama2_70b_lora import pretrain  # noqa: PLC0415

    files = docstrings.stdlib_python_files()
    for package in MINI_PACKAGES:
        files += docstrings.package_python_files(package)
    seen = [f for i, f in enumerate(files) if i % HELD_OUT_EVERY]
    held_out = [f for i, f in enumerate(files) if i % HELD_OUT_EVERY == 0]
    length = config_lib.MINI_SEQ_LENGTH
    begin = time.monotonic()
    with checkpoint.staged(data_dir) as staging:
        corpus = [" ".join(s) for path in seen if (s := docstrings.file_sentences(path))]
        text = os.path.join(staging, "pretrain.txt")
        with open(text, "w", encoding="utf-8") as handle:
            handle.write("\n".join(corpus))
        _train_tokenizer(text, os.path.join(staging, "tokenizer"), config_lib.MINI_VOCAB_SIZE)
        os.remove(text)
        os.remove(os.path.join(staging, "tokenizer.vocab"))
        tokenizer = spm.SentencePieceProcessor(model_file=os.path.join(staging, "tokenizer.model"))
        train = [encode_pair(tokenizer, b, s, length) for b, s in summary_pairs(seen)]
        candidates = summary_pairs(held_out)
        if len(candidates) < config_lib.EVAL_SAMPLES:
            raise DataError(
                f"held-out docstrings give {len(candidates)} summary examples, fewer than "
                f"{config_lib.EVAL_SAMPLES}"
            )
        stride = len(candidates) / config_lib.EVAL_SAMPLES  # spread over the held-out files
        picked = [candidates[int(i * stride)] for i in range(config_lib.EVAL_SAMPLES)]
        evals = [encode_pair(tokenizer, b, s, length) for b, s in picked]
        write_sharded((_example(*r) for r in train), os.path.join(staging, "train"),
                      prefix="train", num_shards=2)  # fmt: skip
        write_sharded((_example(*r) for r in evals), os.path.join(staging, "eval"),
                      prefix="eval", num_shards=1)  # fmt: skip
        stream = [t for doc in corpus for t in [BOS] + tokenizer.encode(doc) + [EOS]]
        data_seconds = time.monotonic() - begin
        report = pretrain.pretrain_in_child(
            np.asarray(stream, np.int32), config_lib.mini_model(), os.path.join(staging, "base"),
            steps=pretrain_steps, sequence_length=length, eval_examples=evals, work_dir=staging,
        )  # fmt: skip
        summary = {
            "train_examples": len(train), "eval_examples": len(evals),
            "pretrain_tokens": len(stream), "files_seen": len(seen),
            "files_held_out": len(held_out), "data_seconds": round(data_seconds, 1), **report,
        }  # fmt: skip
        with open(os.path.join(staging, "summary.json"), "w", encoding="utf-8") as handle:
            json.dump(summary, handle, indent=1)
    return summary


def main(argv: Sequence[str] | None = None) -> int:
    """`mlperf-tf prepare llama2_70b_lora ...` (see the module docstring)."""
    parser = prepare_cli.parser(
        "llama2_70b_lora", __doc__.split("\n")[0],
        mini_help="write the offline mini data set and pretrain its base (minutes)",
    )  # fmt: skip
    parser.add_argument("--checkpoint", default="", help="Llama 2 checkpoint folder to import")
    parser.add_argument("--govreport", default="", help="folder of GovReport parquet files")
    parser.add_argument("--num_shards", type=int, default=4, help="TFRecord files per split")
    parser.add_argument(
        "--model", default="mlperf", choices=("mlperf", "mini", "smoke"),
        help="the preset whose model the checkpoint must be (default: Llama 2 70B)",
    )  # fmt: skip
    args = parser.parse_args(argv)
    prepare_cli.require_positive(args, ["num_shards"])
    if args.mini:
        print(json.dumps(prepare_mini(args.out_dir)))
        return 0
    if not args.checkpoint and not args.govreport:
        raise UserError("give --checkpoint=DIR, --govreport=DIR or --mini")
    summary = {}
    if args.checkpoint:
        preset = {"mlperf": config_lib.mlperf, "mini": config_lib.mini, "smoke": config_lib.smoke}
        summary["base"] = checkpoint.import_checkpoint(
            args.checkpoint, os.path.join(args.out_dir, "base"), preset[args.model]().model
        )
    if args.govreport:
        summary.update(prepare_govreport(args.govreport, args.out_dir, num_shards=args.num_shards))
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    prepare_cli.module_main(main)
