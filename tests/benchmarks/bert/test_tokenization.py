"""Tests of the BERT WordPiece tokenizer and vocabulary learners."""

import collections

import pytest

from benchmarks.bert import tokenization as T
from mlperf_tf.errors import DataError

# google-research/bert's tokenization_test.py vocabulary.
VOCAB = [
    "[PAD]",
    "[UNK]",
    "[CLS]",
    "[SEP]",
    "[MASK]",
    "want",
    "##want",
    "##ed",
    "wa",
    "un",
    "runn",
    "##ing",
    ",",
    "low",
    "lowest",
]


def _vocab():
    return {t: i for i, t in enumerate(VOCAB)}


def test_basic_tokenizer_lower_accents_punctuation():
    basic = T.BasicTokenizer(do_lower_case=True)
    assert basic.tokenize(" \tHeLLo!how  \n Are yoU?  ") == ["hello", "!", "how", "are", "you", "?"]
    assert basic.tokenize("H\u00e9llo") == ["hello"]  # accent stripped (NFD, drop Mn)
    assert basic.tokenize("a$b`c^d") == ["a", "$", "b", "`", "c", "^", "d"]  # ASCII symbols split


def test_basic_tokenizer_cased_cjk_and_control_chars():
    cased = T.BasicTokenizer(do_lower_case=False)
    assert cased.tokenize("HeLLo H\u00e9llo") == ["HeLLo", "H\u00e9llo"]
    assert cased.tokenize("ah\u535a\u63a8zz") == ["ah", "\u535a", "\u63a8", "zz"]
    assert cased.tokenize("a\x00b\ufffdc\u200bd") == ["abcd"]  # NUL, U+FFFD, Cf dropped


def test_wordpiece_greedy_longest_match_and_unk():
    wp = T.WordpieceTokenizer(_vocab())
    assert wp.tokenize_word("unwanted") == ["un", "##want", "##ed"]
    assert wp.tokenize_word("running") == ["runn", "##ing"]
    assert wp.tokenize_word("lowest") == ["lowest"]  # longest match, not low + ##est
    assert wp.tokenize_word("unwantedx") == ["[UNK]"]  # no split covers the word
    assert T.WordpieceTokenizer(_vocab(), max_chars_per_word=3).tokenize_word("lowest") == ["[UNK]"]


def test_full_tokenizer_round_trip():
    tok = T.FullTokenizer(_vocab())
    tokens = tok.tokenize("UNwant\u00e9d,running")
    assert tokens == ["un", "##want", "##ed", ",", "runn", "##ing"]
    ids = tok.convert_tokens_to_ids(tokens)
    assert ids == [9, 6, 7, 12, 10, 11]
    assert tok.convert_ids_to_tokens(ids) == tokens


def test_load_vocab_errors(tmp_path):
    good = tmp_path / "vocab.txt"
    T.write_vocab(VOCAB, str(good))
    assert T.load_vocab(str(good)) == _vocab()
    with pytest.raises(DataError, match="cannot read vocab file"):
        T.load_vocab(str(tmp_path / "missing.txt"))
    dup = tmp_path / "dup.txt"
    T.write_vocab(VOCAB + ["want"], str(dup))
    with pytest.raises(DataError, match="repeats token 'want'"):
        T.load_vocab(str(dup))
    no_mask = tmp_path / "nomask.txt"
    T.write_vocab([t for t in VOCAB if t != "[MASK]"], str(no_mask))
    with pytest.raises(DataError, match=r"\[MASK\]"):
        T.load_vocab(str(no_mask))


TEXT = [
    "The quick brown fox jumps over the lazy dog.",
    "Return the number of items in the container, raising ValueError when empty.",
    "Jumping foxes return quickly; containers raise errors.",
] * 5


def test_bpe_learner_covers_text_without_unk_and_is_deterministic():
    counts = T.count_words(TEXT)
    vocab1 = T.learn_vocab_bpe(counts.items(), 80)
    # Same counts in another order: the same vocabulary.
    assert T.learn_vocab_bpe(sorted(counts.items(), reverse=True), 80) == vocab1
    assert len(vocab1) == 80 and len(set(vocab1)) == 80
    assert vocab1[: len(T.RESERVED_TOKENS)] == list(T.RESERVED_TOKENS)
    tok = T.FullTokenizer({t: i for i, t in enumerate(vocab1)})
    for line in TEXT:
        assert T.UNK not in tok.tokenize(line)
    # Merges favour frequent words: "the" (6 x 5 occurrences) becomes one piece.
    assert "the" in vocab1
    # Once every word is one piece there is nothing left to merge: fewer tokens than asked.
    everything = T.learn_vocab_bpe(counts.items(), 1000)
    assert len(everything) < 1000 and set(counts) <= set(everything)


def test_bpe_learner_vocab_too_small():
    with pytest.raises(ValueError, match="smaller than the reserved tokens"):
        T.learn_vocab_bpe(T.count_words(TEXT).items(), 10)


def test_learn_vocab_pads_to_exact_size_with_unused():
    counts = T.count_words(["ab ab ab"])
    tokens, used = T.learn_vocab(counts, 20, learner="builtin")
    assert used == "builtin"
    assert len(tokens) == 20
    assert tokens[0] == "[PAD]" and tokens[-1].startswith("[unused")
    with pytest.raises(ValueError, match="learner"):
        T.learn_vocab(counts, 20, learner="spm")


def test_tensorflow_text_learner_and_tokenizer_agree_with_ours():
    """tensorflow-text's BertTokenizer (the reference implementation's C++ port) splits the
    same way as ours with a vocab its own learner made."""
    text = pytest.importorskip("tensorflow_text")
    counts = T.count_words(TEXT)
    tokens, used = T.learn_vocab(counts, 200, learner="tensorflow_text")
    assert used == "tensorflow_text" and len(tokens) == 200
    import tensorflow as tf

    lookup = tf.lookup.StaticVocabularyTable(
        tf.lookup.KeyValueTensorInitializer(
            tokens, tf.range(len(tokens), dtype=tf.int64), key_dtype=tf.string
        ),
        num_oov_buckets=1,
    )
    reference = text.BertTokenizer(lookup, lower_case=True, unknown_token=T.UNK)
    ours = T.FullTokenizer({t: i for i, t in enumerate(tokens)})
    sample = TEXT[:3] + ["Caf\u00e9 na\u00efve co-operate (x+y)!", "unknownzzzq words"]
    for line in sample:
        ids = reference.tokenize(line).merge_dims(-2, -1).numpy()[0].tolist()
        assert ours.convert_tokens_to_ids(ours.tokenize(line)) == ids, line


def test_count_words():
    assert T.count_words(["A a, b"]) == collections.Counter({"a": 2, ",": 1, "b": 1})
