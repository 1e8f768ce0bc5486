"""Provides the C4 language-model data: `c4/en` JSON-lines shards -> packed token-window TFRecords,
and the offline mini corpus in the same format; one implementation for every benchmark that
pretrains on C4 with the Llama 3.1 tokenizer (MLPerf `llama31_8b` and `gpt_oss_20b` share the
files, the eval set and the mini data).

As the MLPerf references (`mlcommons/training` `small_llm_pretraining/nemo/README.md` and
`utils/consolidate_data.sh`; `small_llm_moe_pretraining/primus/conf/gpt_oss_20B-pretrain.yaml`
reads the same `c4-train.en_6` and `c4-validation-91205-samples` files): training text is the C4
shards `c4-train.<x>-of-01024.json.gz` with 768 <= x <= 1023 (the README's "last 256 of 1024
shards"; the references without `--use_full_dataset` read only merged shard 6, x in 768..895:
`--train_shards=768-895`), and the eval text is the first documents of
`c4-validation.0000{0..7}-of-00008.json.gz` in order (the reference keeps the first 91,205; the
first 1,024 windows of 8,192 tokens need far fewer, and reading stops there). Each document's
`text` is tokenized with the user's Llama 3.1 tokenizer (Hugging Face `tokenizer.json`, no
special tokens added) and followed by the end-of-text token `<|end_of_text|>`; the token stream
is cut into windows of `sequence_length + 1` tokens, consecutive windows sharing one token
(Megatron's GPT samples: inputs `w[:-1]`, labels `w[1:]`). Differences from the references,
which run Megatron's `preprocess_data` and GPT dataset: their preprocess command passes no
`--append-eod` (documents are joined without a separator) and their dataset shuffles documents
before packing; here the end-of-text token separates documents and the training pipeline
shuffles windows. The eval windows are unshuffled, as the references'.

`prepare_mini` makes the `mini` presets' data offline (into `mini_data_dir()`, shared): the
docstrings of the standard library, numpy and keras written as C4-format shards, a BPE
vocabulary (SentencePiece) learned from the training text, then the same packing.
"""

from __future__ import annotations

import gzip
import json
import math
import os
import zlib
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence

import numpy as np
import tensorflow as tf

from mlperf_tf import paths, prepare_cli
from mlperf_tf.data import docstrings, tfrecord
from mlperf_tf.errors import DataError, UserError

# What the closed rules of the C4 benchmarks fix (closed_llama31_8b.yaml, closed_gpt_oss_20b.yaml).
REFERENCE_SEQUENCE_LENGTH = 8192
EVAL_WINDOWS = 1024
# The mini corpus's shape: every mini preset that reads it uses these.
MINI_VOCAB_SIZE = 1024
MINI_SEQUENCE_LENGTH = 256
# The mini vocabulary's end-of-text id (SentencePiece's `</s>`: unk 0, bos 1, eos 2, its defaults).
MINI_EOS_ID = 2


def mini_data_dir() -> str:
    """The shared folder of the mini corpus (`<data_root>/c4-mini`), written once by whichever
    benchmark's mini run comes first."""
    return paths.mini_data_dir("c4")


END_OF_TEXT = "<|end_of_text|>"  # Llama 3's end-of-text token (id 128001)
TRAIN_SHARD = "c4-train.{:05d}-of-01024.json.gz"
VALIDATION_SHARD = "c4-validation.{:05d}-of-00008.json.gz"
REFERENCE_TRAIN_SHARDS = (768, 1023)
WINDOWS_PER_FILE = 4096


class Tokenizer:
    """Text -> token ids without special tokens, and the end-of-text id that joins documents."""

    def __init__(self, encode_batch: Callable[[list[str]], list[list[int]]], eot: int, size: int):
        self.encode_batch = encode_batch
        self.end_of_text = eot
        self.vocab_size = size


def load_tokenizer(path: str) -> Tokenizer:
    """A Hugging Face `tokenizer.json` (or a folder holding one: the Llama 3.1 8B download) with
    `<|end_of_text|>`, or a SentencePiece `.model` (the mini's, whose end-of-text is `</s>`).

    Raises:
      UserError: the file is missing, or not a tokenizer of either kind.
    """
    if not path:
        raise UserError("--tokenizer is required (the Llama 3.1 tokenizer.json; not downloaded)")
    if os.path.isdir(path):
        path = os.path.join(path, "tokenizer.json")
    if not os.path.isfile(path):
        raise UserError(f"--tokenizer={path!r} does not exist")
    if path.endswith(".model"):
        import sentencepiece as spm  # noqa: PLC0415

        try:
            sp = spm.SentencePieceProcessor(model_file=path)
        except (RuntimeError, OSError) as e:
            raise UserError(f"--tokenizer={path!r} is not a SentencePiece model: {e}") from None
        if sp.eos_id() < 0:
            raise UserError(f"--tokenizer={path!r} has no end-of-text token")
        return Tokenizer(lambda texts: sp.encode(texts), sp.eos_id(), sp.get_piece_size())
    try:
        import tokenizers  # noqa: PLC0415

        hf = tokenizers.Tokenizer.from_file(path)
    except ImportError:
        raise UserError("reading tokenizer.json needs the `tokenizers` package") from None
    except Exception as e:  # noqa: BLE001 (the Rust library raises plain Exceptions)
        first = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise UserError(
            f"--tokenizer={path!r} is not a Hugging Face tokenizer.json: {first}"
        ) from None
    eot = hf.token_to_id(END_OF_TEXT)
    if eot is None:
        raise UserError(f"--tokenizer={path!r} has no {END_OF_TEXT} token: not a Llama 3 tokenizer")

    def encode(texts: list[str]) -> list[list[int]]:
        return [e.ids for e in hf.encode_batch(texts, add_special_tokens=False)]

    return Tokenizer(encode, eot, hf.get_vocab_size(with_added_tokens=True))


def read_documents(path: str) -> Iterator[str]:
    """The `text` of each JSON line of one C4 `.json.gz` shard, in order.

    Raises:
      DataError: the file is not gzip, or a line is not a JSON object with a string `text`.
    """
    try:
        with gzip.open(path, "rt", encoding="utf-8") as handle:
            for number, line in enumerate(handle, 1):
                if not line.strip():
                    continue
                try:
                    record = json.loads(line)
                except json.JSONDecodeError as e:
                    raise DataError(f"{path}:{number}: not a JSON line ({e.msg})") from None
                if not isinstance(record, dict) or not isinstance(record.get("text"), str):
                    raise DataError(f"{path}:{number}: a C4 line needs a string 'text'")
                yield record["text"]
    except (OSError, EOFError, zlib.error, UnicodeDecodeError) as e:
        raise DataError(f"{path}: corrupt .json.gz ({e})") from None


def token_stream(
    paths: Sequence[str], tokenizer: Tokenizer, *, chunk: int = 256
) -> Iterator[list[int]]:
    """Per document: its token ids followed by the end-of-text id, in file order."""
    for path in paths:
        batch: list[str] = []
        for text in read_documents(path):
            batch.append(text)
            if len(batch) == chunk:
                yield from (ids + [tokenizer.end_of_text] for ids in tokenizer.encode_batch(batch))
                batch = []
        if batch:
            yield from (ids + [tokenizer.end_of_text] for ids in tokenizer.encode_batch(batch))


def pack_windows(documents: Iterable[list[int]], sequence_length: int) -> Iterator[np.ndarray]:
    """Windows of `sequence_length + 1` tokens of the joined stream, starting every
    `sequence_length` tokens (each window's last token is the next one's first); the tail that
    does not fill a window is dropped."""
    size = sequence_length + 1
    buffer: list[int] = []
    for ids in documents:
        buffer.extend(ids)
        start = 0
        while len(buffer) - start >= size:
            yield np.asarray(buffer[start : start + size], np.int64)
            start += sequence_length
        del buffer[:start]


def _example(window: np.ndarray) -> bytes:
    # Int64List takes the array as it is: `tfrecord.int64_feature`'s per-value int() would cost
    # a Python call per token of the whole corpus.
    tokens = tf.train.Feature(int64_list=tf.train.Int64List(value=window))
    return tfrecord.make_example({"tokens": tokens}).SerializeToString()


def write_windows(
    windows: Iterable[np.ndarray], folder: str, prefix: str, *, limit: int | None
) -> int:
    """Writes up to `limit` windows (None: all) into `folder/prefix-NNNNN-of-NNNNN.tfrecord`
    files of `WINDOWS_PER_FILE` (`mlperf_tf.data.tfrecord.write_streamed`); returns how many."""
    _, count = tfrecord.write_streamed(
        (_example(w) for w in windows), folder, prefix=prefix, per_file=WINDOWS_PER_FILE,
        limit=limit, suffix=".tfrecord",
    )  # fmt: skip
    return count


def parse_shard_range(text: str) -> tuple[int, int]:
    """ "768-1023" -> (768, 1023); raises UserError naming --train_shards otherwise."""
    try:
        low, high = (int(part) for part in text.split("-"))
    except ValueError:
        raise UserError(f"--train_shards={text!r} must be FIRST-LAST, e.g. 768-1023") from None
    if not 0 <= low <= high <= 1023:
        raise UserError(f"--train_shards={text!r} must lie in 0-1023 with FIRST <= LAST")
    return low, high


def c4_shards(c4_dir: str, shard_range: tuple[int, int]) -> tuple[list[str], list[str]]:
    """(train shard paths of the range that exist, validation shard paths that exist).

    Raises:
      UserError: `c4_dir` is missing, or it has no training or no validation shard.
    """
    if not c4_dir or not os.path.isdir(c4_dir):
        raise UserError(f"--c4_dir={c4_dir!r} is not a folder (C4 c4/en .json.gz shards)")
    low, high = shard_range
    train = [os.path.join(c4_dir, TRAIN_SHARD.format(i)) for i in range(low, high + 1)]
    train = [p for p in train if os.path.isfile(p)]
    validation = [os.path.join(c4_dir, VALIDATION_SHARD.format(i)) for i in range(8)]
    validation = [p for p in validation if os.path.isfile(p)]
    if not train:
        raise DataError(
            f"--c4_dir={c4_dir!r} has no training shard {TRAIN_SHARD.format(low)} ... "
            f"{TRAIN_SHARD.format(high)}"
        )
    if not validation:
        raise DataError(f"--c4_dir={c4_dir!r} has no validation shard {VALIDATION_SHARD.format(0)}")
    return train, validation


def prepare(
    *,
    c4_dir: str,
    tokenizer_path: str,
    out_dir: str,
    sequence_length: int = REFERENCE_SEQUENCE_LENGTH,
    train_shards: tuple[int, int] = REFERENCE_TRAIN_SHARDS,
    max_train_windows: int | None = None,
    eval_windows: int = EVAL_WINDOWS,
) -> dict[str, object]:
    """Writes `out_dir/{train,eval}/*.tfrecord` (see the module docstring); returns a summary.

    Everything is written into a temporary sibling folder renamed to `out_dir` at the end: bad
    input or an interruption leaves nothing half-written, and an existing `out_dir` is never
    touched.

    Raises:
      UserError / DataError: a missing or wrong input, an existing `out_dir`, or too little
        validation text for `eval_windows`.
    """
    if sequence_length < 2:
        raise UserError(f"--sequence_length ({sequence_length}) must be >= 2")
    out_dir = os.path.abspath(out_dir)
    if os.path.exists(out_dir):
        raise UserError(f"--out_dir={out_dir!r} already exists; remove it or pick another")
    train, validation = c4_shards(c4_dir, train_shards)
    tokenizer = load_tokenizer(tokenizer_path)
    with prepare_cli.staged_folder(out_dir) as staging:
        eval_count = write_windows(
            pack_windows(token_stream(validation, tokenizer), sequence_length),
            os.path.join(staging, "eval"),
            "eval",
            limit=eval_windows,
        )
        if eval_count < eval_windows:
            raise DataError(
                f"the validation shards give {eval_count} windows of {sequence_length} tokens; "
                f"the eval set needs {eval_windows}"
            )
        train_count = write_windows(
            pack_windows(token_stream(train, tokenizer), sequence_length),
            os.path.join(staging, "train"),
            "train",
            limit=max_train_windows,
        )
        if not train_count:
            raise DataError(f"the training shards give no window of {sequence_length} tokens")
        summary = {
            "train_shards": len(train),
            "validation_shards": len(validation),
            "train_windows": train_count,
            "eval_windows": eval_count,
            "sequence_length": sequence_length,
            "vocab_size": tokenizer.vocab_size,
        }
        with open(os.path.join(staging, "summary.json"), "w", encoding="utf-8") as f:
            json.dump(summary, f, indent=1)
    return summary


# ---- the mini data set --------------------------------------------------------------------------


def _write_c4_shard(path: str, documents: Iterable[str]) -> int:
    count = 0
    with gzip.open(path, "wt", encoding="utf-8") as handle:
        for text in documents:
            handle.write(json.dumps({"text": text}) + "\n")
            count += 1
    return count


# Installed packages whose docstrings join the standard library's in the mini corpus (the
# suite's own dependencies, so present wherever it runs): about 4.7 M characters in all.
MINI_CORPUS_PACKAGES = ("numpy", "keras")


def mini_documents(eval_every: int) -> tuple[list[str], list[str]]:
    """(train, eval) documents: the docstrings of the standard library and of
    `MINI_CORPUS_PACKAGES`, one module per document (prose sentences only, as the BERT mini's
    corpus), every `eval_every`-th module held out."""
    files = docstrings.stdlib_python_files()
    for package in MINI_CORPUS_PACKAGES:
        files += docstrings.package_python_files(package)
    train, held_out = [], []
    for index, path in enumerate(files):
        sentences = docstrings.file_sentences(path)
        if sentences:
            (held_out if index % eval_every == 0 else train).append(" ".join(sentences))
    return train, held_out


def ngram_log_perplexities(train: Sequence[int], held_out: Sequence[int], vocab: int) -> dict:
    """Unigram and bigram log perplexity (nats/token) of `held_out` under models fit on `train`,
    add-one smoothed (bigram: interpolated 0.9 / 0.1 with the unigram): baselines beside the
    mini's target."""
    unigram = Counter(train)
    total = len(train)
    p1 = np.array([(unigram.get(t, 0) + 1) / (total + vocab) for t in range(vocab)])
    bigram = Counter(zip(train[:-1], train[1:], strict=True))
    nll1 = -np.mean([math.log(p1[t]) for t in held_out])
    nll2 = []
    for prev, t in zip(held_out[:-1], held_out[1:], strict=True):
        p2 = (bigram.get((prev, t), 0) + 1) / (unigram.get(prev, 0) + vocab)
        nll2.append(-math.log(0.9 * p2 + 0.1 * p1[t]))
    return {"unigram": round(float(nll1), 4), "bigram": round(float(np.mean(nll2)), 4)}


def prepare_mini(data_dir: str, *, eval_every: int = 4) -> dict[str, object]:
    """Writes the `mini` preset's data into `data_dir` (deterministic; nothing downloaded).

    Layout: `c4/` (the docstrings as C4-format shards: train 00768, validation 00000),
    `tokenizer.model` (SentencePiece BPE of `MINI_VOCAB_SIZE` learned from the train shard),
    `train/`, `eval/` (exactly 1,024 windows of `MINI_SEQ_LENGTH`), `summary.json` with the
    unigram and bigram log perplexity of the eval windows. Built in a temporary sibling folder
    renamed at the end.

    Raises:
      DataError: `data_dir` exists, or the text gives fewer than 1,024 eval windows.
    """
    import sentencepiece as spm  # noqa: PLC0415

    data_dir = os.path.abspath(data_dir)
    if os.path.exists(data_dir):
        raise DataError(f"mini data_dir '{data_dir}' already exists; remove it to rebuild")
    with prepare_cli.staged_folder(data_dir) as staging:
        train_docs, eval_docs = mini_documents(eval_every)
        c4 = os.path.join(staging, "c4")
        os.makedirs(c4)
        _write_c4_shard(os.path.join(c4, TRAIN_SHARD.format(768)), train_docs)
        _write_c4_shard(os.path.join(c4, VALIDATION_SHARD.format(0)), eval_docs)
        text = os.path.join(staging, "train.txt")
        with open(text, "w", encoding="utf-8") as f:
            f.write("\n".join(train_docs))
        spm.SentencePieceTrainer.train(
            input=text,
            model_prefix=os.path.join(staging, "tokenizer"),
            vocab_size=MINI_VOCAB_SIZE,
            model_type="bpe",
            character_coverage=1.0,
            byte_fallback=True,
            max_sentence_length=1 << 20,
            input_sentence_size=0,
            num_threads=2,
            minloglevel=2,
        )
        os.remove(text)
        summary = prepare(
            c4_dir=c4,
            tokenizer_path=os.path.join(staging, "tokenizer.model"),
            out_dir=os.path.join(staging, "packed"),
            sequence_length=MINI_SEQUENCE_LENGTH,
            train_shards=(768, 768),
        )
        for name in ("train", "eval", "summary.json"):
            os.rename(os.path.join(staging, "packed", name), os.path.join(staging, name))
        os.rmdir(os.path.join(staging, "packed"))
        tokenizer = load_tokenizer(os.path.join(staging, "tokenizer.model"))
        train_ids = [
            t
            for ids in token_stream([os.path.join(c4, TRAIN_SHARD.format(768))], tokenizer)
            for t in ids
        ]
        eval_ids = [
            t
            for window in pack_windows(
                token_stream([os.path.join(c4, VALIDATION_SHARD.format(0))], tokenizer),
                MINI_SEQUENCE_LENGTH,
            )
            for t in window[1:]
        ][: EVAL_WINDOWS * MINI_SEQUENCE_LENGTH]
        summary["baselines"] = ngram_log_perplexities(train_ids, eval_ids, tokenizer.vocab_size)
        summary["train_documents"], summary["eval_documents"] = len(train_docs), len(eval_docs)
        with open(os.path.join(staging, "summary.json"), "w", encoding="utf-8") as f:
            json.dump(summary, f, indent=1)
    return summary


def mini_windows_dir(sequence_length: int) -> str:
    """The folder of the mini corpus's windows of `sequence_length` tokens: the shared
    `mini_data_dir()` at `MINI_SEQUENCE_LENGTH`, else its sibling `<data_root>/c4-mini-<L>`."""
    if sequence_length == MINI_SEQUENCE_LENGTH:
        return mini_data_dir()
    return f"{mini_data_dir()}-{sequence_length}"


def prepare_mini_windows(data_dir: str, sequence_length: int) -> dict[str, object]:
    """Writes the mini corpus's `train/` and `eval/` windows of `sequence_length` tokens (the
    eval set: the first 1,024, unshuffled) into `data_dir`: the shared corpus's C4-format shards
    (`mini_data_dir()`, written first if missing) packed with its tokenizer by `prepare`, so a
    benchmark that declares another length reads the same text as the others' minis.

    Raises:
      UserError / DataError: `data_dir` exists, or the text gives fewer than 1,024 eval windows.
    """
    source = mini_data_dir()
    if not os.path.isdir(source):
        prepare_mini(source)
    return prepare(
        c4_dir=os.path.join(source, "c4"), tokenizer_path=os.path.join(source, "tokenizer.model"),
        out_dir=data_dir, sequence_length=sequence_length, train_shards=(768, 768),
    )  # fmt: skip


def main(
    argv: Sequence[str] | None, *, name: str, mini_sequence_length: int = MINI_SEQUENCE_LENGTH
) -> int:
    """`mlperf-tf prepare NAME ...` for a benchmark whose data this module prepares.

    Command line:
      mlperf-tf prepare NAME --c4_dir=C4 --tokenizer=Llama-3.1-8B/tokenizer.json --out_dir=DIR
          [--sequence_length=8192] [--train_shards=768-1023] [--max_train_windows=N]
      mlperf-tf prepare NAME --mini --out_dir=DIR

    `mini_sequence_length`: the benchmark's mini window length (`--mini` writes the shared
    corpus at `MINI_SEQUENCE_LENGTH`, else its windows at this length, `prepare_mini_windows`).
    """
    parser = prepare_cli.parser(
        name, __doc__.split("\n")[0], mini_help="write the offline mini data set"
    )
    parser.add_argument("--c4_dir", default="", help="folder of C4 c4/en .json.gz shards")
    parser.add_argument("--tokenizer", default="", help="Llama 3.1 tokenizer.json (or its folder)")
    parser.add_argument("--sequence_length", type=int, default=REFERENCE_SEQUENCE_LENGTH)
    parser.add_argument("--train_shards", default="{}-{}".format(*REFERENCE_TRAIN_SHARDS))
    parser.add_argument("--max_train_windows", type=int, default=0, help="0: all")
    args = parser.parse_args(argv)
    if args.mini:
        if mini_sequence_length == MINI_SEQUENCE_LENGTH:
            print(json.dumps(prepare_mini(args.out_dir)))
        else:
            print(json.dumps(prepare_mini_windows(args.out_dir, mini_sequence_length)))
        return 0
    if args.max_train_windows < 0:
        raise UserError(f"--max_train_windows ({args.max_train_windows}) must be >= 0")
    summary = prepare(
        c4_dir=args.c4_dir,
        tokenizer_path=args.tokenizer,
        out_dir=args.out_dir,
        sequence_length=args.sequence_length,
        train_shards=parse_shard_range(args.train_shards),
        max_train_windows=args.max_train_windows or None,
    )
    print(json.dumps(summary))
    return 0
