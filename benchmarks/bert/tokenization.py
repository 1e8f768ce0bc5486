"""Provides BERT's WordPiece tokenizer (basic split + greedy longest-match) and a vocab learner.

The tokenizer follows google-research/bert's `tokenization.py` (which the MLPerf reference's
`create_pretraining_data.py` uses): clean control characters, pad CJK characters with spaces,
split on whitespace, lower-case and strip accents (uncased), split off punctuation, then split
each word into the longest vocabulary pieces from the left, non-initial pieces prefixed "##";
a word with no such split becomes [UNK].

`learn_vocab` builds a WordPiece vocabulary from word counts, with tensorflow-text's learner
(`wordpiece_tokenizer_learner_lib.learn`) when tensorflow-text is installed, or with a small
deterministic byte-pair-merge learner of our own (`learn_vocab_bpe`) otherwise.
"""

from __future__ import annotations

import collections
import heapq
import unicodedata
from collections.abc import Iterable
from typing import Literal

from mlperf_tf.errors import DataError

PAD, UNK, CLS, SEP, MASK = "[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"
# [PAD] first: MLPerf's TFRecords pad input_ids with 0.
RESERVED_TOKENS = (PAD, UNK, CLS, SEP, MASK)
Learner = Literal["auto", "tensorflow_text", "builtin"]


# ---- vocabulary files ----------------------------------------------------------------------------
def load_vocab(path: str) -> dict[str, int]:
    """Reads a vocab file (one token per line; the line number is the id).

    Raises:
      DataError: the file is missing, empty, lacks a reserved token, or repeats a token.
    """
    try:
        with open(path, encoding="utf-8") as f:
            tokens = [line.rstrip("\n").strip() for line in f]
    except OSError as e:
        raise DataError(f"cannot read vocab file '{path}': {e.strerror}") from None
    while tokens and not tokens[-1]:
        tokens.pop()
    if not tokens:
        raise DataError(f"vocab file '{path}' is empty")
    vocab: dict[str, int] = {}
    for index, token in enumerate(tokens):
        if token in vocab:
            raise DataError(f"vocab file '{path}' repeats token {token!r} (line {index + 1})")
        vocab[token] = index
    missing = [t for t in (UNK, CLS, SEP, MASK) if t not in vocab]
    if missing:
        raise DataError(f"vocab file '{path}' lacks the reserved tokens {missing}")
    return vocab


def write_vocab(tokens: Iterable[str], path: str) -> None:
    """Writes one token per line (UTF-8, '\\n' line ends)."""
    with open(path, "w", encoding="utf-8", newline="\n") as f:
        for token in tokens:
            f.write(token + "\n")


# ---- character classes (as google-research/bert) --------------------------------------------------
def _is_whitespace(char: str) -> bool:
    if char in (" ", "\t", "\n", "\r"):
        return True
    return unicodedata.category(char) == "Zs"


def _is_control(char: str) -> bool:
    if char in ("\t", "\n", "\r"):
        return False
    return unicodedata.category(char) in ("Cc", "Cf")


def _is_punctuation(char: str) -> bool:
    cp = ord(char)
    # All non-letter/number ASCII counts as punctuation ("^", "$", "`" are not Unicode P*).
    if 33 <= cp <= 47 or 58 <= cp <= 64 or 91 <= cp <= 96 or 123 <= cp <= 126:
        return True
    return unicodedata.category(char).startswith("P")


def _is_cjk(cp: int) -> bool:
    return (
        0x4E00 <= cp <= 0x9FFF
        or 0x3400 <= cp <= 0x4DBF
        or 0x20000 <= cp <= 0x2A6DF
        or 0x2A700 <= cp <= 0x2B73F
        or 0x2B740 <= cp <= 0x2B81F
        or 0x2B820 <= cp <= 0x2CEAF
        or 0xF900 <= cp <= 0xFAFF
        or 0x2F800 <= cp <= 0x2FA1F
    )


class BasicTokenizer:
    """Whitespace/punctuation split with optional lower-casing and accent stripping."""

    def __init__(self, do_lower_case: bool = True):
        self.do_lower_case = do_lower_case

    def tokenize(self, text: str) -> list[str]:
        """Splits `text` into words and punctuation marks."""
        chars = []
        for char in text:
            cp = ord(char)
            if cp == 0 or cp == 0xFFFD or _is_control(char):
                continue
            if _is_cjk(cp):
                chars.extend((" ", char, " "))
            elif _is_whitespace(char):
                chars.append(" ")
            else:
                chars.append(char)
        pieces = []
        for word in "".join(chars).split():
            if self.do_lower_case:
                word = word.lower()
                word = "".join(
                    c for c in unicodedata.normalize("NFD", word) if unicodedata.category(c) != "Mn"
                )
            pieces.extend(_split_on_punctuation(word))
        return pieces


def _split_on_punctuation(word: str) -> list[str]:
    out: list[list[str]] = []
    start_new = True
    for char in word:
        if _is_punctuation(char):
            out.append([char])
            start_new = True
        else:
            if start_new:
                out.append([])
            start_new = False
            out[-1].append(char)
    return ["".join(x) for x in out]


class WordpieceTokenizer:
    """Greedy longest-match-first split of one word into vocabulary pieces."""

    def __init__(self, vocab: dict[str, int], unk_token: str = UNK, max_chars_per_word: int = 200):
        self.vocab = vocab
        self.unk_token = unk_token
        self.max_chars_per_word = max_chars_per_word

    def tokenize_word(self, word: str) -> list[str]:
        """The pieces of `word` ("##"-prefixed after the first), or [UNK] when none fit."""
        if len(word) > self.max_chars_per_word:
            return [self.unk_token]
        pieces = []
        start = 0
        while start < len(word):
            end = len(word)
            piece = None
            while start < end:
                candidate = word[start:end]
                if start > 0:
                    candidate = "##" + candidate
                if candidate in self.vocab:
                    piece = candidate
                    break
                end -= 1
            if piece is None:
                return [self.unk_token]
            pieces.append(piece)
            start = end
        return pieces


class FullTokenizer:
    """Basic tokenization, then WordPiece; converts tokens to and from ids."""

    def __init__(self, vocab: dict[str, int], do_lower_case: bool = True):
        self.vocab = vocab
        self.inv_vocab = {i: t for t, i in vocab.items()}
        self.basic = BasicTokenizer(do_lower_case)
        self.wordpiece = WordpieceTokenizer(vocab)

    @classmethod
    def from_file(cls, vocab_file: str, do_lower_case: bool = True) -> FullTokenizer:
        return cls(load_vocab(vocab_file), do_lower_case)

    def tokenize(self, text: str) -> list[str]:
        out = []
        for word in self.basic.tokenize(text):
            out.extend(self.wordpiece.tokenize_word(word))
        return out

    def convert_tokens_to_ids(self, tokens: Iterable[str]) -> list[int]:
        return [self.vocab[t] for t in tokens]

    def convert_ids_to_tokens(self, ids: Iterable[int]) -> list[str]:
        return [self.inv_vocab[int(i)] for i in ids]


# ---- vocabulary learning ----------------------------------------------------------------------
def count_words(lines: Iterable[str], do_lower_case: bool = True) -> collections.Counter:
    """Counts the basic-tokenizer words of `lines` (the input of the vocab learners)."""
    basic = BasicTokenizer(do_lower_case)
    counts: collections.Counter = collections.Counter()
    for line in lines:
        counts.update(basic.tokenize(line))
    return counts


def tensorflow_text_available() -> bool:
    """Whether tensorflow-text's WordPiece learner can be imported."""
    try:
        from tensorflow_text.tools.wordpiece_vocab import (  # noqa: F401
            wordpiece_tokenizer_learner_lib,
        )
    except ImportError:
        return False
    return True


def learn_vocab(
    word_counts: dict[str, int],
    vocab_size: int,
    *,
    learner: Learner = "auto",
    reserved_tokens: tuple[str, ...] = RESERVED_TOKENS,
) -> tuple[list[str], str]:
    """Learns a WordPiece vocabulary of exactly `vocab_size` tokens from word counts.

    The reserved tokens come first ([PAD] = id 0); a learner's shorter vocabulary is padded with
    `[unused<i>]` tokens, as google-research's vocab files are, so the id space is fixed.

    Args:
      word_counts: word -> count, from `count_words`.
      vocab_size: tokens in the result.
      learner: "tensorflow_text" (`wordpiece_tokenizer_learner_lib.learn`), "builtin"
        (`learn_vocab_bpe`), or "auto" (tensorflow-text when importable, else builtin).
      reserved_tokens: tokens placed first.

    Returns:
      (tokens, the learner used).

    Raises:
      ValueError: `vocab_size` is too small for the reserved tokens and the alphabet, or the
        learner is unknown or "tensorflow_text" without tensorflow-text installed.
    """
    if learner not in ("auto", "tensorflow_text", "builtin"):
        raise ValueError(f"`learner` ({learner!r}) must be auto, tensorflow_text or builtin.")
    if learner == "auto":
        learner = "tensorflow_text" if tensorflow_text_available() else "builtin"
    # Sorted input: the learners see the same sequence whatever the dict order was.
    items = sorted(word_counts.items(), key=lambda kv: (-kv[1], kv[0]))
    if learner == "tensorflow_text":
        if not tensorflow_text_available():
            raise ValueError("learner 'tensorflow_text' needs tensorflow-text, not installed")
        from tensorflow_text.tools.wordpiece_vocab import wordpiece_tokenizer_learner_lib

        learned = wordpiece_tokenizer_learner_lib.learn(
            items, vocab_size, list(reserved_tokens), lower_thresh=2
        )
    else:
        learned = learn_vocab_bpe(items, vocab_size, reserved_tokens=reserved_tokens)
    tokens = list(reserved_tokens) + [t for t in learned if t not in reserved_tokens]
    if len(tokens) > vocab_size:
        tokens = tokens[:vocab_size]
    tokens += [f"[unused{i}]" for i in range(vocab_size - len(tokens))]
    return tokens, learner


def learn_vocab_bpe(
    word_counts: Iterable[tuple[str, int]],
    vocab_size: int,
    *,
    reserved_tokens: tuple[str, ...] = RESERVED_TOKENS,
) -> list[str]:
    """A deterministic WordPiece vocabulary by byte-pair-style merges (Sennrich et al. 2016).

    Starts from every character as a word start (`c`) and as a continuation (`##c`), then
    repeatedly merges the adjacent pair of pieces with the largest count (weighted by word
    counts; ties broken by the pieces' text), adding the merged piece, until `vocab_size`
    tokens. Every word of the input can then be split by the greedy longest-match tokenizer.

    Returns:
      reserved tokens + learned tokens (at most `vocab_size` in all).

    Raises:
      ValueError: the reserved tokens and the alphabet alone exceed `vocab_size`.
    """
    words, counts = _character_pieces(word_counts)
    vocab = list(reserved_tokens)
    alphabet = sorted({piece for pieces in words for piece in pieces} - set(vocab))
    vocab += alphabet
    if len(vocab) > vocab_size:
        raise ValueError(
            f"`vocab_size` ({vocab_size}) is smaller than the reserved tokens plus the "
            f"{len(alphabet)} single characters of the text ({len(vocab)})."
        )
    known = set(vocab)
    # pair -> total count, and pair -> indices of words holding it.
    pair_counts: collections.Counter = collections.Counter()
    where: dict[tuple[str, str], set[int]] = collections.defaultdict(set)
    for index, pieces in enumerate(words):
        for pair in zip(pieces, pieces[1:]):
            pair_counts[pair] += counts[index]
            where[pair].add(index)
    heap = [(-c, pair) for pair, c in pair_counts.items()]
    heapq.heapify(heap)
    while len(vocab) < vocab_size and heap:
        negative, pair = heapq.heappop(heap)
        if pair_counts.get(pair, 0) != -negative or negative == 0:
            continue  # stale entry: the count changed since it was pushed
        first, second = pair
        merged = first + second[2:]
        changed: set[tuple[str, str]] = set()
        for index in sorted(where.pop(pair, ())):
            pieces = words[index]
            count = counts[index]
            for old in zip(pieces, pieces[1:]):
                pair_counts[old] -= count
                changed.add(old)
            out = words[index] = _merge_pair(pieces, first, second, merged)
            for new in zip(out, out[1:]):
                pair_counts[new] += count
                where[new].add(index)
                changed.add(new)
        pair_counts.pop(pair, None)
        for other in sorted(changed):
            c = pair_counts.get(other, 0)
            if c > 0:
                heapq.heappush(heap, (-c, other))
            else:
                pair_counts.pop(other, None)
        if merged not in known:
            known.add(merged)
            vocab.append(merged)
    return vocab


def _character_pieces(word_counts: Iterable[tuple[str, int]]) -> tuple[list[list[str]], list[int]]:
    """Each word (empty words and counts <= 0 left out) as its first character and `##`
    continuations of the others, with its count."""
    words: list[list[str]] = []
    counts: list[int] = []
    for word, count in word_counts:
        if not word or count <= 0:
            continue
        words.append([word[0]] + ["##" + c for c in word[1:]])
        counts.append(int(count))
    return words, counts


def _merge_pair(pieces: list[str], first: str, second: str, merged: str) -> list[str]:
    """`pieces` with every adjacent (`first`, `second`), left to right, replaced by `merged`."""
    out = []
    i = 0
    while i < len(pieces):
        if i + 1 < len(pieces) and pieces[i] == first and pieces[i + 1] == second:
            out.append(merged)
            i += 2
        else:
            out.append(pieces[i])
            i += 1
    return out
