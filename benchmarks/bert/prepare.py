"""Provides the BERT data preparation: plain text -> WordPiece -> MLPerf pretraining TFRecords.

Input text has one sentence per line and a blank line between documents (the MLPerf reference's
`results/part-*-of-00500` and `eval.txt`). Example creation follows the reference's
`create_pretraining_data.py` step for step, driven by one `random.Random(random_seed)`: documents
are shuffled; for each of `dupe_factor` passes every document is cut into sentence-pair
instances (with probability `short_seq_prob` a shorter target length, 50% random next sentence,
random truncation from either end); `masked_lm_prob` of the tokens (at most
`max_predictions_per_seq`) are masked 80% [MASK] / 10% kept / 10% a random vocabulary token;
all instances are shuffled and written round-robin to the shards. Same inputs and seed, same
bytes.

`prepare_mini` makes the `mini` preset's dataset from English text every Python install has:
the docstrings of the standard library's modules (read with `ast`, nothing is imported).

Command line:
  python -m benchmarks.bert.prepare --input_file=TEXT[,TEXT...] --out_dir=DIR
      [--vocab_file=vocab.txt | --vocab_size=30522] [--max_seq_length=512 ...]
  python -m benchmarks.bert.prepare --mini --out_dir=DIR
"""

from __future__ import annotations

import argparse
import dataclasses
import glob
import os
import random
import sysconfig
from collections.abc import Iterable, Sequence

import tensorflow as tf

from benchmarks.bert import config as config_lib
from benchmarks.bert import tokenization
from mlperf_tf import prepare_cli
from mlperf_tf.data import docstrings, tfrecord
from mlperf_tf.errors import DataError, UserError

# The seed MLPerf fixes for its TFRecords ("It is extremely critical to set random_seed to 12345").
MLPERF_RANDOM_SEED = 12345
FEATURE_KEYS = (
    "input_ids",
    "input_mask",
    "segment_ids",
    "masked_lm_positions",
    "masked_lm_ids",
    "masked_lm_weights",
    "next_sentence_labels",
)


@dataclasses.dataclass(frozen=True, kw_only=True)
class CreationParams:
    """MLPerf's example-creation parameters (the reference's flags of the same names)."""

    max_seq_length: int = 512
    max_predictions_per_seq: int = 76
    masked_lm_prob: float = 0.15
    dupe_factor: int = 10
    short_seq_prob: float = 0.1
    random_seed: int = MLPERF_RANDOM_SEED
    do_lower_case: bool = True

    def __post_init__(self):
        # (field, whether it holds, the rule), checked in this order: the first failure raises.
        rules = (
            ("max_seq_length", self.max_seq_length >= 5, ">= 5"),
            (
                "max_predictions_per_seq",
                1 <= self.max_predictions_per_seq <= self.max_seq_length,
                "in [1, max_seq_length]",
            ),
            ("masked_lm_prob", 0.0 < self.masked_lm_prob < 1.0, "in (0, 1)"),
            ("dupe_factor", self.dupe_factor >= 1, ">= 1"),
            ("short_seq_prob", 0.0 <= self.short_seq_prob <= 1.0, "in [0, 1]"),
        )
        for name, holds, rule in rules:
            if not holds:
                raise ValueError(f"`{name}` ({getattr(self, name)}) must be {rule}.")


@dataclasses.dataclass
class TrainingInstance:
    """One sentence pair with its masks (tokens already masked)."""

    tokens: list[str]
    segment_ids: list[int]
    masked_lm_positions: list[int]
    masked_lm_labels: list[str]
    is_random_next: bool


# ---- reading text ------------------------------------------------------------------------------
def read_documents(
    input_files: Sequence[str], tokenizer: tokenization.FullTokenizer
) -> list[list[list[str]]]:
    """Documents as lists of tokenized sentences (empty sentences and documents dropped).

    Raises:
      DataError: an input file cannot be read.
    """
    documents: list[list[list[str]]] = [[]]
    for path in input_files:
        try:
            with open(path, encoding="utf-8") as f:
                for raw in f:
                    line = raw.strip()
                    if not line:  # a blank line ends a document
                        documents.append([])
                        continue
                    tokens = tokenizer.tokenize(line)
                    if tokens:
                        documents[-1].append(tokens)
        except (OSError, UnicodeDecodeError) as e:
            raise DataError(f"cannot read text file '{path}': {e}") from None
    return [d for d in documents if d]


def read_lines(input_files: Sequence[str]) -> Iterable[str]:
    """Every non-blank line of the input files (for vocabulary learning)."""
    for path in input_files:
        try:
            with open(path, encoding="utf-8") as f:
                for raw in f:
                    if raw.strip():
                        yield raw.strip()
        except (OSError, UnicodeDecodeError) as e:
            raise DataError(f"cannot read text file '{path}': {e}") from None


# ---- instance creation (the reference's create_pretraining_data.py) ------------------------------
def create_training_instances(
    documents: list[list[list[str]]],
    vocab_words: list[str],
    params: CreationParams,
    rng: random.Random,
) -> list[TrainingInstance]:
    """All instances of `dupe_factor` passes over the (shuffled) documents, shuffled.

    `documents` is shuffled in place with `rng`, as the reference does.
    """
    rng.shuffle(documents)
    instances = []
    for _ in range(params.dupe_factor):
        for index in range(len(documents)):
            instances.extend(
                create_instances_from_document(documents, index, vocab_words, params, rng)
            )
    rng.shuffle(instances)
    return instances


def create_instances_from_document(
    documents: list[list[list[str]]],
    document_index: int,
    vocab_words: list[str],
    params: CreationParams,
    rng: random.Random,
) -> list[TrainingInstance]:
    """Sentence-pair instances from one document (segments A and B cut at sentence ends)."""
    document = documents[document_index]
    max_num_tokens = params.max_seq_length - 3  # room for [CLS], [SEP], [SEP]
    # Usually fill the sequence; sometimes (short_seq_prob) aim shorter, so pretraining also
    # sees short inputs as fine-tuning will.
    target_seq_length = max_num_tokens
    if rng.random() < params.short_seq_prob:
        target_seq_length = rng.randint(2, max_num_tokens)
    instances = []
    chunk: list[list[str]] = []
    length = 0
    i = 0
    while i < len(document):
        segment = document[i]
        chunk.append(segment)
        length += len(segment)
        if i == len(document) - 1 or length >= target_seq_length:
            if chunk:
                a_end = 1
                if len(chunk) >= 2:
                    a_end = rng.randint(1, len(chunk) - 1)
                tokens_a = [t for sentence in chunk[:a_end] for t in sentence]
                tokens_b: list[str] = []
                if len(chunk) == 1 or rng.random() < 0.5:
                    is_random_next = True
                    target_b_length = target_seq_length - len(tokens_a)
                    # Up to 10 tries for another document (one document: it stays itself).
                    for _ in range(10):
                        random_index = rng.randint(0, len(documents) - 1)
                        if random_index != document_index:
                            break
                    random_document = documents[random_index]
                    random_start = rng.randint(0, len(random_document) - 1)
                    for j in range(random_start, len(random_document)):
                        tokens_b.extend(random_document[j])
                        if len(tokens_b) >= target_b_length:
                            break
                    # The unused segments of this chunk go back to the document.
                    i -= len(chunk) - a_end
                else:
                    is_random_next = False
                    tokens_b = [t for sentence in chunk[a_end:] for t in sentence]
                truncate_seq_pair(tokens_a, tokens_b, max_num_tokens, rng)
                if not tokens_a or not tokens_b:
                    raise AssertionError("a sentence pair lost a segment in truncation")
                tokens = [tokenization.CLS, *tokens_a, tokenization.SEP]
                segment_ids = [0] * len(tokens)
                tokens += [*tokens_b, tokenization.SEP]
                segment_ids += [1] * (len(tokens_b) + 1)
                tokens, positions, labels = create_masked_lm_predictions(
                    tokens, params.masked_lm_prob, params.max_predictions_per_seq, vocab_words, rng
                )
                instances.append(
                    TrainingInstance(
                        tokens=tokens,
                        segment_ids=segment_ids,
                        masked_lm_positions=positions,
                        masked_lm_labels=labels,
                        is_random_next=is_random_next,
                    )
                )
            chunk = []
            length = 0
        i += 1
    return instances


def create_masked_lm_predictions(
    tokens: list[str],
    masked_lm_prob: float,
    max_predictions_per_seq: int,
    vocab_words: list[str],
    rng: random.Random,
) -> tuple[list[str], list[int], list[str]]:
    """Masks round(len * masked_lm_prob) tokens (1..max): 80% [MASK], 10% kept, 10% random.

    Returns:
      (masked tokens, masked positions ascending, original tokens at those positions).
    """
    candidates = [i for i, t in enumerate(tokens) if t not in (tokenization.CLS, tokenization.SEP)]
    rng.shuffle(candidates)
    output = list(tokens)
    num_to_predict = min(max_predictions_per_seq, max(1, int(round(len(tokens) * masked_lm_prob))))
    masked: list[tuple[int, str]] = []
    covered: set[int] = set()
    for index in candidates:
        if len(masked) >= num_to_predict:
            break
        if index in covered:
            continue
        covered.add(index)
        if rng.random() < 0.8:
            replacement = tokenization.MASK
        elif rng.random() < 0.5:
            replacement = tokens[index]
        else:
            replacement = vocab_words[rng.randint(0, len(vocab_words) - 1)]
        output[index] = replacement
        masked.append((index, tokens[index]))
    masked.sort(key=lambda m: m[0])
    return output, [m[0] for m in masked], [m[1] for m in masked]


def truncate_seq_pair(tokens_a: list[str], tokens_b: list[str], max_num_tokens: int, rng) -> None:
    """Trims the longer segment, from the front or back at random, until both fit."""
    while len(tokens_a) + len(tokens_b) > max_num_tokens:
        trunc = tokens_a if len(tokens_a) > len(tokens_b) else tokens_b
        if rng.random() < 0.5:
            del trunc[0]
        else:
            trunc.pop()


def pick_evenly(items: Sequence, count: int) -> list:
    """`count` items at evenly spaced indexes `int(i * len / count)`: the reference's
    `pick_eval_samples.py`, which makes MLPerf's eval_10k from the eval examples.

    Raises:
      DataError: fewer than `count` items.
    """
    if count > len(items):
        raise DataError(f"cannot pick {count} examples out of {len(items)}")
    ratio = len(items) / count
    return [items[int(i * ratio)] for i in range(count)]


# ---- examples and files --------------------------------------------------------------------------
def instance_to_example(
    instance: TrainingInstance,
    tokenizer: tokenization.FullTokenizer,
    max_seq_length: int,
    max_predictions_per_seq: int,
) -> tf.train.Example:
    """The seven MLPerf features, zero-padded to the fixed lengths (int64 and float lists)."""
    input_ids = tokenizer.convert_tokens_to_ids(instance.tokens)
    if len(input_ids) > max_seq_length:
        raise ValueError(f"instance has {len(input_ids)} tokens > max_seq_length {max_seq_length}")
    pad = max_seq_length - len(input_ids)
    input_mask = [1] * len(input_ids) + [0] * pad
    segment_ids = list(instance.segment_ids) + [0] * pad
    input_ids = input_ids + [0] * pad
    positions = list(instance.masked_lm_positions)
    ids = tokenizer.convert_tokens_to_ids(instance.masked_lm_labels)
    weights = [1.0] * len(ids)
    pad = max_predictions_per_seq - len(positions)
    positions += [0] * pad
    ids += [0] * pad
    weights += [0.0] * pad

    def ints(values):
        return tf.train.Feature(int64_list=tf.train.Int64List(value=values))

    features = {
        "input_ids": ints(input_ids),
        "input_mask": ints(input_mask),
        "segment_ids": ints(segment_ids),
        "masked_lm_positions": ints(positions),
        "masked_lm_ids": ints(ids),
        "masked_lm_weights": tf.train.Feature(float_list=tf.train.FloatList(value=weights)),
        "next_sentence_labels": ints([1 if instance.is_random_next else 0]),
    }
    return tf.train.Example(features=tf.train.Features(feature=features))


def write_shards(examples: Iterable[tf.train.Example], output_dir: str, prefix: str,
                 num_shards: int) -> list[str]:  # fmt: skip
    """Writes examples round-robin (the reference's writer order) to
    `<output_dir>/<prefix>-00000-of-0000N.tfrecord`, ...: the suite's one TFRecord writer and
    naming (`mlperf_tf.data.tfrecord.write_sharded`), with the suffix the readers glob
    (`train/*.tfrecord`, `eval/*.tfrecord`)."""
    return tfrecord.write_sharded(
        examples, output_dir, prefix=prefix, num_shards=num_shards, suffix=".tfrecord"
    )


def build_tokenizer(
    *,
    input_files: Sequence[str],
    vocab_file: str | None,
    vocab_size: int,
    do_lower_case: bool,
    learner: tokenization.Learner,
    vocab_out: str | None,
) -> tuple[tokenization.FullTokenizer, str]:
    """The tokenizer of a given vocab file, or of a vocab learned from `input_files`.

    Returns:
      (tokenizer, where its vocab came from: the file, or the learner used); the learned vocab
      is written to `vocab_out` when given.
    """
    if vocab_file:
        return tokenization.FullTokenizer.from_file(vocab_file, do_lower_case), vocab_file
    counts = tokenization.count_words(read_lines(input_files), do_lower_case)
    if not counts:
        raise DataError(f"no text in {list(input_files)} to learn a vocabulary from")
    tokens, used = tokenization.learn_vocab(counts, vocab_size, learner=learner)
    if vocab_out:
        tokenization.write_vocab(tokens, vocab_out)
    vocab = {t: i for i, t in enumerate(tokens)}
    return tokenization.FullTokenizer(vocab, do_lower_case), used


def create_examples(
    input_files: Sequence[str],
    tokenizer: tokenization.FullTokenizer,
    params: CreationParams,
    *,
    pick_examples: int | None = None,
) -> list[tf.train.Example]:
    """The reference's pipeline from text files to examples (in write order).

    With `pick_examples`, only that many evenly spaced instances are kept (see `pick_evenly`).
    """
    documents = read_documents(input_files, tokenizer)
    if not documents:
        raise DataError(f"no documents in {list(input_files)}")
    rng = random.Random(params.random_seed)
    vocab_words = list(tokenizer.vocab.keys())
    instances = create_training_instances(documents, vocab_words, params, rng)
    if pick_examples is not None:
        instances = pick_evenly(instances, pick_examples)
    return [
        instance_to_example(inst, tokenizer, params.max_seq_length, params.max_predictions_per_seq)
        for inst in instances
    ]


def prepare(
    *,
    input_files: Sequence[str],
    output_dir: str,
    params: CreationParams,
    num_shards: int = 1,
    prefix: str = "part",
    vocab_file: str | None = None,
    vocab_size: int = 30522,
    learner: tokenization.Learner = "auto",
    pick_examples: int | None = None,
) -> list[str]:
    """Text files -> sharded MLPerf pretraining TFRecords in `output_dir` (and `vocab.txt`).

    Args:
      input_files: text, one sentence per line, blank lines between documents.
      output_dir: created if missing; gets the shards and, when learned, `vocab.txt`.
      params: MLPerf's creation parameters (seed included).
      num_shards: TFRecord files, written round-robin.
      prefix: shard file name prefix.
      vocab_file: a WordPiece vocab to use; None learns one of `vocab_size` from the text.
      vocab_size: size of a learned vocab.
      learner: see `tokenization.learn_vocab`.
      pick_examples: keep only N evenly spaced examples (the reference's eval_10k picking).

    Returns:
      The shard paths.

    Raises:
      DataError: an input is missing, unreadable or holds no text.
    """
    if not input_files:
        raise DataError("no input text files given")
    os.makedirs(output_dir, exist_ok=True)
    tokenizer, _ = build_tokenizer(
        input_files=input_files,
        vocab_file=vocab_file,
        vocab_size=vocab_size,
        do_lower_case=params.do_lower_case,
        learner=learner,
        vocab_out=None if vocab_file else os.path.join(output_dir, "vocab.txt"),
    )
    examples = create_examples(input_files, tokenizer, params, pick_examples=pick_examples)
    return write_shards(examples, output_dir, prefix, num_shards)


# ---- the mini dataset: standard-library docstrings -----------------------------------------------
# Directories of the standard library that hold tests, tools or vendored non-English text.
def write_stdlib_text(train_path: str, eval_path: str, *, eval_every: int = 20) -> tuple[int, int]:
    """Writes the stdlib docstrings as MLPerf-style text: one module = one document.

    Every `eval_every`-th module (in sorted path order) goes to the held-out eval text.

    Returns:
      (train documents, eval documents).

    Raises:
      DataError: the standard library yields no text (an unusual Python install).
    """
    counts = [0, 0]
    with (
        open(train_path, "w", encoding="utf-8", newline="\n") as train,
        open(eval_path, "w", encoding="utf-8", newline="\n") as held_out,
    ):
        for index, path in enumerate(docstrings.stdlib_python_files()):
            sentences = docstrings.file_sentences(path)
            if not sentences:
                continue
            is_eval = index % eval_every == 0
            out = held_out if is_eval else train
            out.write("\n".join(sentences) + "\n\n")
            counts[int(is_eval)] += 1
    if not counts[0] or not counts[1]:
        raise DataError(
            f"the standard library under '{sysconfig.get_paths()['stdlib']}' gave too little "
            f"docstring text for the bert mini dataset (documents: {counts})"
        )
    return counts[0], counts[1]


def prepare_mini(
    data_dir: str,
    *,
    learner: tokenization.Learner = "auto",
    dupe_factor: int = 5,
    random_seed: int = MLPERF_RANDOM_SEED,
) -> dict[str, object]:
    """Writes the `mini` preset's dataset into `data_dir` (deterministic; nothing downloaded).

    Layout: `text/{train,eval}.txt` (the extracted docstrings), `vocab.txt` (learned from the
    train text, `MINI_VOCAB_SIZE` tokens), `train/part-0000i-of-00004.tfrecord` and
    `eval/eval-00000-of-00001.tfrecord` (exactly `MINI_EVAL_EXAMPLES` examples), with the mini
    preset's sequence length and max predictions.

    The files are written to a temporary sibling folder that is renamed to `data_dir` at the
    end, so an interrupted run leaves no half-written dataset behind (the CLI prepares the mini
    data only when `data_dir` does not exist).

    Returns:
      A summary: documents, examples and the vocab learner used.

    Raises:
      DataError: `data_dir` already exists, the standard library gives too little text, or
        the eval text fewer than `MINI_EVAL_EXAMPLES` examples.
    """
    data_dir = os.path.abspath(data_dir)
    if os.path.exists(data_dir):
        raise DataError(f"mini data_dir '{data_dir}' already exists; remove it to rebuild")
    with prepare_cli.staged_folder(data_dir) as staging:
        summary = _write_mini(
            staging, learner=learner, dupe_factor=dupe_factor, random_seed=random_seed
        )
    return summary


def _write_mini(
    data_dir: str, *, learner: tokenization.Learner, dupe_factor: int, random_seed: int
) -> dict[str, object]:
    text_dir = os.path.join(data_dir, "text")
    os.makedirs(text_dir, exist_ok=True)
    train_txt = os.path.join(text_dir, "train.txt")
    eval_txt = os.path.join(text_dir, "eval.txt")
    train_docs, eval_docs = write_stdlib_text(train_txt, eval_txt)
    tokenizer, used = build_tokenizer(
        input_files=[train_txt],
        vocab_file=None,
        vocab_size=config_lib.MINI_VOCAB_SIZE,
        do_lower_case=True,
        learner=learner,
        vocab_out=os.path.join(data_dir, "vocab.txt"),
    )
    params = CreationParams(
        max_seq_length=config_lib.MINI_SEQ_LENGTH,
        max_predictions_per_seq=config_lib.MINI_MAX_PREDICTIONS,
        dupe_factor=dupe_factor,
        random_seed=random_seed,
    )
    train_dir = os.path.join(data_dir, "train")
    eval_dir = os.path.join(data_dir, "eval")
    train_examples = create_examples([train_txt], tokenizer, params)
    write_shards(train_examples, train_dir, "part", 4)
    # The eval set: its own seed, like MLPerf's separately generated eval_10k.
    eval_params = dataclasses.replace(params, random_seed=random_seed + 1)
    try:
        eval_examples = create_examples(
            [eval_txt], tokenizer, eval_params, pick_examples=config_lib.MINI_EVAL_EXAMPLES
        )
    except DataError as e:
        raise DataError(f"the held-out docstrings are too few for the mini eval set: {e}") from None
    write_shards(eval_examples, eval_dir, "eval", 1)
    return {
        "train_documents": train_docs,
        "eval_documents": eval_docs,
        "train_examples": len(train_examples),
        "eval_examples": config_lib.MINI_EVAL_EXAMPLES,
        "vocab_learner": used,
    }


# ---- command line --------------------------------------------------------------------------------
def main(argv: Sequence[str] | None = None) -> int:
    """`python -m benchmarks.bert.prepare ...` (see the module docstring)."""
    parser = prepare_cli.parser("bert", __doc__.split("\n")[0], mini_help="write the mini dataset")
    parser.add_argument("--input_file", default="", help="comma-separated text files or globs")
    parser.add_argument("--vocab_file", default="")
    parser.add_argument("--vocab_size", type=int, default=30522)
    parser.add_argument(
        "--vocab_learner", default="auto", choices=("auto", "tensorflow_text", "builtin")
    )
    parser.add_argument("--num_shards", type=int, default=1)
    parser.add_argument("--prefix", default="part")
    parser.add_argument(
        "--pick_examples", type=int, default=0, help="keep N evenly spaced examples (eval_10k)"
    )
    defaults = CreationParams()
    for field in dataclasses.fields(CreationParams):
        value = getattr(defaults, field.name)
        kind = {bool: _parse_bool, int: int, float: float}[type(value)]
        parser.add_argument(f"--{field.name}", type=kind, default=value)
    args = parser.parse_args(argv)
    prepare_cli.require_positive(args, ("num_shards", "vocab_size"))
    if args.mini:
        print(prepare_mini(args.out_dir, learner=args.vocab_learner))
        return 0
    files = sorted(
        f for pattern in args.input_file.split(",") if pattern for f in glob.glob(pattern)
    )
    if not files:
        raise DataError(f"--input_file {args.input_file!r} matches no file")
    try:
        params = CreationParams(
            **{f.name: getattr(args, f.name) for f in dataclasses.fields(CreationParams)}
        )
        paths = prepare(
            input_files=files,
            output_dir=args.out_dir,
            params=params,
            num_shards=args.num_shards,
            prefix=args.prefix,
            vocab_file=args.vocab_file or None,
            vocab_size=args.vocab_size,
            learner=args.vocab_learner,
            pick_examples=args.pick_examples or None,
        )
    except UserError:
        raise
    except ValueError as e:  # a bad creation parameter or vocabulary setting
        raise UserError(str(e)) from None
    print("\n".join(paths))
    return 0


def _parse_bool(text: str) -> bool:
    if text.lower() in ("true", "1", "yes"):
        return True
    if text.lower() in ("false", "0", "no"):
        return False
    raise argparse.ArgumentTypeError(f"expected true/false, got {text!r}")


if __name__ == "__main__":
    prepare_cli.module_main(main)
