"""Provides the conversion of parallel text to a SentencePiece vocabulary and TFRecords.

Layout of a prepared data directory (every file is deterministic for a given input and seed):

    vocab.model, vocab.vocab        SentencePiece model (pad 0, EOS 1, unk 2; no BOS), trained on
                                    both sides of the training pairs (one joint vocabulary).
    train-0000i-of-0000n            TFRecords: `inputs`, `targets` int64 id lists, each ending
                                    with EOS.
    eval-0000i-of-0000m             TFRecords: `inputs`, `targets` and `index` (the line number
                                    in eval_references.txt).
    eval_sources.txt, eval_references.txt
                                    the raw eval text, one pair per line; BLEU is computed
                                    against these raw references, as MLPerf does.
    metadata.json                   counts, the vocabulary size and a histogram of pair lengths
                                    (max of source and target ids), from which the benchmark
                                    derives the steps of an epoch for any bucket layout.

Sources: `prepare_parallel_text` (aligned text files, e.g. WMT17 train and newstest2014, which the
user downloads; nothing is downloaded here) and `prepare_mini` (English->German UI messages of
the gettext catalogs under /usr/share/locale/de/LC_MESSAGES). Run as a script:

    python -m benchmarks.transformer.prepare --train_source=train.en --train_target=train.de \\
        --eval_source=newstest2014.en --eval_target=newstest2014.de --out_dir=DIR
"""

from __future__ import annotations

import collections
import gettext
import glob
import io
import json
import os
import random
import re
from collections.abc import Iterable, Sequence

import sentencepiece as spm
from absl import logging

from mlperf_tf import prepare_cli
from mlperf_tf.data import tfrecord
from mlperf_tf.errors import DataError, UserError

PAD_ID = 0
EOS_ID = 1
UNK_ID = 2
VOCAB_MODEL = "vocab.model"
METADATA = "metadata.json"
EVAL_SOURCES = "eval_sources.txt"
EVAL_REFERENCES = "eval_references.txt"
DEFAULT_LOCALE_DIR = "/usr/share/locale/de/LC_MESSAGES"

# printf/Python/shell/brace placeholders: messages made mostly of these teach little German.
_PLACEHOLDER = re.compile(r"%(\d+\$)?[-+ #0]*\d*(\.\d+)?[hlLqjzt]*[a-zA-Z%]|\{[^}]*\}|\$\{?\w+\}?")


def read_gettext_pairs(
    locale_dir: str = DEFAULT_LOCALE_DIR,
    *,
    max_chars: int = 60,
    max_words: int = 10,
    min_words: int = 1,
) -> list[tuple[str, str]]:
    """English->German message pairs from the compiled gettext catalogs (`*.mo`) in `locale_dir`.

    Keeps short single-line messages: no plural or context entries, no empty or untranslated
    (identical) ones, at most `max_chars` characters and `min_words`..`max_words` words on the
    English side, at most one placeholder (`%s`, `{name}`, ...). Catalogs are read in sorted
    order and a message seen twice keeps its first translation, so the result is deterministic.
    A catalog Python's `gettext` cannot parse (e.g. a header that is not UTF-8) is skipped with a
    warning.

    Args:
      locale_dir: folder of `.mo` files.
      max_chars: longest English message kept, in characters.
      max_words: most English words kept.
      min_words: fewest English words kept.

    Returns:
      `(english, german)` pairs in a deterministic order.

    Raises:
      DataError: the folder holds no `.mo` catalog, or no catalog yields a usable pair.
    """
    files = sorted(glob.glob(os.path.join(locale_dir, "*.mo")))
    if not files:
        raise DataError(
            f"no gettext catalogs (*.mo) in '{locale_dir}': the transformer mini data needs German "
            "translations installed (on Debian/Ubuntu e.g. `apt-get install "
            "language-pack-de` or any package shipping /usr/share/locale/de)"
        )
    pairs: dict[str, str] = {}
    for path in files:
        try:
            with open(path, "rb") as f:
                catalog = gettext.GNUTranslations(f)._catalog  # msgid -> msgstr
        except (OSError, UnicodeDecodeError, ValueError) as e:
            logging.warning("skipped gettext catalog %s: %s", path, e)
            continue
        for msgid, msgstr in catalog.items():
            if not isinstance(msgid, str) or msgid in pairs:
                continue  # plural entries have (msgid, n) keys
            if _keep_message(msgid, msgstr, max_chars, max_words, min_words):
                pairs[msgid] = msgstr
    if not pairs:
        raise DataError(f"the gettext catalogs in '{locale_dir}' hold no usable message pair")
    return list(pairs.items())


def _keep_message(msgid: str, msgstr: str, max_chars: int, max_words: int, min_words: int) -> bool:
    if not msgid or not msgstr or msgid == msgstr:
        return False
    if "\x04" in msgid or "\x00" in msgid or "\x00" in msgstr:  # context / plural forms
        return False
    if any(c in text for text in (msgid, msgstr) for c in "\n\r\t"):
        return False
    if len(msgid) > max_chars or len(msgstr) > 2 * max_chars:
        return False
    if not min_words <= len(msgid.split()) <= max_words:
        return False
    if len(_PLACEHOLDER.findall(msgid)) > 1:
        return False
    return msgid.strip() == msgid and msgstr.strip() == msgstr


def split_pairs(
    pairs: Sequence[tuple[str, str]], *, held_out: int, seed: int
) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    """Shuffles `pairs` with `seed` and splits off `held_out` of them: (train, held-out).

    Raises:
      DataError: fewer than `held_out + 1` pairs.
    """
    if held_out <= 0:
        raise ValueError(f"`held_out` ({held_out}) must be positive.")
    if len(pairs) <= held_out:
        raise DataError(f"only {len(pairs)} message pairs, fewer than the {held_out} held out + 1")
    order = list(range(len(pairs)))
    random.Random(seed).shuffle(order)
    held = [pairs[i] for i in order[:held_out]]
    train = [pairs[i] for i in order[held_out:]]
    return train, held


def train_vocab(
    texts: Iterable[str],
    *,
    vocab_size: int,
    seed: int,
    input_sentence_size: int = 0,
) -> bytes:
    """Trains a SentencePiece unigram model (pad 0, EOS 1, unk 2, no BOS); returns its bytes.

    Deterministic for a seed: one training thread, the library's random generator seeded, and
    the sentences sampled (when `input_sentence_size` > 0) with that generator.

    Args:
      texts: training sentences (both languages, for one joint vocabulary).
      vocab_size: exact size of the vocabulary.
      seed: seed of SentencePiece's random generator.
      input_sentence_size: sentences sampled for training; 0 uses all of them.

    Raises:
      DataError: SentencePiece cannot build the vocabulary (e.g. too little text for the size).
    """
    spm.set_random_generator_seed(seed)
    model = io.BytesIO()
    try:
        spm.SentencePieceTrainer.train(
            sentence_iterator=iter(texts),
            model_writer=model,
            vocab_size=vocab_size,
            model_type="unigram",
            character_coverage=1.0,
            pad_id=PAD_ID,
            eos_id=EOS_ID,
            unk_id=UNK_ID,
            bos_id=-1,
            num_threads=1,
            input_sentence_size=input_sentence_size,
            shuffle_input_sentence=input_sentence_size > 0,
            minloglevel=2,
        )
    except RuntimeError as e:
        raise DataError(f"could not train a {vocab_size}-piece vocabulary: {e}") from None
    return model.getvalue()


def load_vocab(path: str) -> spm.SentencePieceProcessor:
    """Loads a SentencePiece model file.

    Raises:
      DataError: the file is missing or not a SentencePiece model.
    """
    if not os.path.exists(path):
        raise DataError(f"vocabulary file '{path}' does not exist (run prepare first)")
    processor = spm.SentencePieceProcessor()
    try:
        processor.Load(path)
    except (OSError, RuntimeError) as e:
        raise DataError(f"'{path}' is not a SentencePiece model: {e}") from None
    return processor


def encode(processor: spm.SentencePieceProcessor, text: str) -> list[int]:
    """Subword ids of `text` followed by EOS."""
    return list(processor.EncodeAsIds(text)) + [EOS_ID]


def decode(processor: spm.SentencePieceProcessor, ids: Iterable[int]) -> str:
    """Text of ids up to (not including) the first EOS; pads are dropped."""
    out = []
    for i in ids:
        i = int(i)
        if i == EOS_ID:
            break
        if i != PAD_ID:
            out.append(i)
    return processor.DecodeIds(out)


def prepare(
    train_pairs: Sequence[tuple[str, str]],
    eval_pairs: Sequence[tuple[str, str]],
    out_dir: str,
    *,
    vocab_size: int,
    seed: int,
    num_train_shards: int = 4,
    num_eval_shards: int = 1,
    input_sentence_size: int = 0,
    source: str = "",
) -> dict:
    """Writes vocabulary, TFRecords, raw eval text and metadata.json into `out_dir`.

    The files are written into a temporary sibling folder that is renamed to `out_dir` at the end,
    so an interrupted run leaves no half-written data directory behind.

    Args:
      train_pairs: `(source, target)` training text pairs.
      eval_pairs: `(source, target)` eval text pairs (the eval set, in order).
      out_dir: the data directory to create; must not exist yet.
      vocab_size: SentencePiece vocabulary size.
      seed: seed of the vocabulary training.
      num_train_shards: training TFRecord files.
      num_eval_shards: eval TFRecord files.
      input_sentence_size: sentences sampled for the vocabulary (0: all).
      source: where the text came from, recorded in metadata.json.

    Returns:
      The metadata dict written to metadata.json.

    Raises:
      DataError: `out_dir` exists, or there is no training or eval pair.
    """
    if os.path.exists(out_dir):
        raise DataError(f"output directory '{out_dir}' already exists")
    if not train_pairs or not eval_pairs:
        raise DataError(
            f"need training and eval pairs, got {len(train_pairs)} and {len(eval_pairs)}"
        )
    with prepare_cli.staged_folder(out_dir) as tmp_dir:
        processor = _write_vocab(
            tmp_dir, [text for pair in train_pairs for text in pair], vocab_size=vocab_size,
            seed=seed, input_sentence_size=input_sentence_size,
        )  # fmt: skip
        histogram = _write_pairs(tmp_dir, processor, train_pairs, "train", num_train_shards)
        eval_lengths = _write_pairs(tmp_dir, processor, eval_pairs, "eval", num_eval_shards)
        for name, column in ((EVAL_SOURCES, 0), (EVAL_REFERENCES, 1)):
            with open(os.path.join(tmp_dir, name), "w", encoding="utf-8") as f:
                f.writelines(pair[column].replace("\n", " ") + "\n" for pair in eval_pairs)
        metadata = {
            "source": source,
            "vocab_size": processor.GetPieceSize(),
            "seed": seed,
            "train_pairs": len(train_pairs),
            "eval_pairs": len(eval_pairs),
            # pair length (max of source and target ids, EOS included) -> number of pairs
            "train_length_histogram": {str(k): v for k, v in sorted(histogram.items())},
            "eval_source_length_histogram": {str(k): v for k, v in sorted(eval_lengths.items())},
        }
        with open(os.path.join(tmp_dir, METADATA), "w", encoding="utf-8") as f:
            json.dump(metadata, f, indent=1, sort_keys=True)
    return metadata


def _write_vocab(
    out_dir: str, texts: list[str], *, vocab_size: int, seed: int, input_sentence_size: int
) -> spm.SentencePieceProcessor:
    """Trains the SentencePiece vocabulary on `texts`, writes its model and its readable
    `vocab.vocab` (piece and score per line) into `out_dir`, and returns its processor."""
    model_bytes = train_vocab(
        texts, vocab_size=vocab_size, seed=seed, input_sentence_size=input_sentence_size
    )
    with open(os.path.join(out_dir, VOCAB_MODEL), "wb") as f:
        f.write(model_bytes)
    processor = spm.SentencePieceProcessor(model_proto=model_bytes)
    with open(os.path.join(out_dir, "vocab.vocab"), "w", encoding="utf-8") as f:
        for i in range(processor.GetPieceSize()):
            f.write(f"{processor.IdToPiece(i)}\t{processor.GetScore(i)}\n")
    return processor


def _write_pairs(
    out_dir: str, processor, pairs: Sequence[tuple[str, str]], split: str, num_shards: int
) -> collections.Counter:
    """Encodes `pairs` and writes them as the `split` ("train" or "eval") TFRecord shards; an
    eval example carries its `index` in the eval set.

    Returns:
      train: pair length (max of source and target ids) -> pairs; eval: source length -> pairs.
    """
    lengths: collections.Counter = collections.Counter()
    examples = []
    for index, (src, tgt) in enumerate(pairs):
        src_ids, tgt_ids = encode(processor, src), encode(processor, tgt)
        features = {"inputs": src_ids, "targets": tgt_ids}
        if split == "eval":
            lengths[len(src_ids)] += 1
            features["index"] = index
        else:
            lengths[max(len(src_ids), len(tgt_ids))] += 1
        examples.append(tfrecord.make_example(features))
    tfrecord.write_sharded(examples, out_dir, prefix=split, num_shards=num_shards)
    return lengths


def load_metadata(data_dir: str) -> dict:
    """Reads `data_dir/metadata.json`.

    Raises:
      DataError: the file is missing or not valid JSON.
    """
    path = os.path.join(data_dir, METADATA)
    if not os.path.exists(path):
        raise DataError(
            f"'{path}' does not exist: prepare the data with benchmarks.transformer.prepare"
        )
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except json.JSONDecodeError as e:
        raise DataError(f"'{path}' is not valid JSON: {e}") from None


def read_lines(path: str) -> list[str]:
    """Lines of a UTF-8 text file, without their newlines.

    Raises:
      DataError: the file does not exist.
    """
    if not os.path.exists(path):
        raise DataError(f"text file '{path}' does not exist")
    with open(path, encoding="utf-8") as f:
        return [line.rstrip("\n") for line in f]


def _read_aligned(source_path: str, target_path: str) -> list[tuple[str, str]]:
    sources, targets = read_lines(source_path), read_lines(target_path)
    if len(sources) != len(targets):
        raise DataError(
            f"'{source_path}' has {len(sources)} lines but '{target_path}' has {len(targets)}"
        )
    return [(s.strip(), t.strip()) for s, t in zip(sources, targets) if s.strip() and t.strip()]


def prepare_parallel_text(
    *,
    train_source: str,
    train_target: str,
    eval_source: str,
    eval_target: str,
    out_dir: str,
    vocab_size: int,
    seed: int = 0,
    num_train_shards: int = 100,
    num_eval_shards: int = 1,
    input_sentence_size: int = 10_000_000,
) -> dict:
    """Prepares line-aligned parallel text files (e.g. WMT17 en-de train, newstest2014).

    Empty training lines are dropped; eval lines are kept in order (their line numbers index
    eval_references.txt). See `prepare` for the arguments and the layout.
    """
    train_pairs = _read_aligned(train_source, train_target)
    eval_pairs = _read_aligned(eval_source, eval_target)
    return prepare(
        train_pairs,
        eval_pairs,
        out_dir,
        vocab_size=vocab_size,
        seed=seed,
        num_train_shards=num_train_shards,
        num_eval_shards=num_eval_shards,
        input_sentence_size=input_sentence_size,
        source=f"{train_source}|{train_target}|{eval_source}|{eval_target}",
    )


def prepare_mini(
    out_dir: str,
    *,
    vocab_size: int,
    held_out: int,
    seed: int,
    locale_dir: str = DEFAULT_LOCALE_DIR,
) -> dict:
    """Writes the mini dataset: gettext UI messages, `held_out` pairs split off by `seed`.

    Raises:
      DataError: no catalogs are installed, or too few pairs.
    """
    pairs = read_gettext_pairs(locale_dir)
    train_pairs, eval_pairs = split_pairs(pairs, held_out=held_out, seed=seed)
    logging.info(
        "transformer mini: %d train and %d held-out pairs from %s",
        len(train_pairs),
        len(eval_pairs),
        locale_dir,
    )
    return prepare(
        train_pairs,
        eval_pairs,
        out_dir,
        vocab_size=vocab_size,
        seed=seed,
        num_train_shards=2,
        num_eval_shards=1,
        source=f"gettext catalogs in {locale_dir}",
    )


def prepare_mini_preset(out_dir: str) -> dict:
    """`prepare_mini` at the `mini` preset's vocabulary size, eval set size and split seed (what
    the benchmark's `prepare_mini` and `--mini` write)."""
    from benchmarks.transformer import config as config_lib  # noqa: PLC0415 (avoid a cycle)

    cfg = config_lib.mini()
    return prepare_mini(
        out_dir,
        vocab_size=cfg.model.vocab_size,
        held_out=cfg.eval_examples,
        seed=cfg.data.split_seed,
    )


def build_parser() -> prepare_cli.ArgumentParser:
    """The command line of `mlperf-tf prepare transformer` / `python -m ...prepare`."""
    parser = prepare_cli.parser(
        "transformer",
        "Parallel text -> SentencePiece vocabulary -> TFRecords (see README.md).",
        mini_help="Write the gettext mini dataset instead.",
    )
    parser.add_argument("--train_source", help="Training source text, one sentence per line.")
    parser.add_argument("--train_target", help="Training target text, line-aligned.")
    parser.add_argument("--eval_source", help="Eval source text (e.g. newstest2014.en).")
    parser.add_argument("--eval_target", help="Eval references (e.g. newstest2014.de).")
    parser.add_argument("--vocab_size", type=int, default=33708, help="Subword vocabulary size.")
    parser.add_argument("--seed", type=int, default=0, help="Seed of the vocabulary training.")
    parser.add_argument("--num_train_shards", type=int, default=100, help="Training files.")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Parses `argv` (without the program name) and prepares the data.

    Raises:
      UserError: a flag is missing or out of range (the CLI prints it as one line).
      DataError: an input file is missing or malformed, or `--out_dir` exists.
    """
    args = build_parser().parse_args(argv)
    if args.mini:
        metadata = prepare_mini_preset(args.out_dir)
    else:
        names = ("train_source", "train_target", "eval_source", "eval_target")
        missing = [f"--{name}" for name in names if not getattr(args, name)]
        if missing:
            raise UserError(f"missing {', '.join(missing)} (or --mini for the gettext data)")
        prepare_cli.require_positive(args, ("vocab_size", "num_train_shards"))
        metadata = prepare_parallel_text(
            train_source=args.train_source,
            train_target=args.train_target,
            eval_source=args.eval_source,
            eval_target=args.eval_target,
            out_dir=args.out_dir,
            vocab_size=args.vocab_size,
            seed=args.seed,
            num_train_shards=args.num_train_shards,
        )
    print(
        f"wrote {metadata['train_pairs']} train and {metadata['eval_pairs']} eval pairs "
        f"to {args.out_dir}"
    )
    return 0


if __name__ == "__main__":
    prepare_cli.module_main(main)
