"""Tests of `mlperf-tf prepare llama31_8b` on small C4-format shards and a tokenizer the test
writes: packing, the reference's shard choice, the record format the input reads, and bad input
as one-line errors with nothing half-written."""

import gzip
import json
import os

import numpy as np
import pytest
import tensorflow as tf

from benchmarks.llama31_8b import config as config_lib
from benchmarks.llama31_8b import input as input_lib
from benchmarks.llama31_8b import prepare
from mlperf_tf import cli
from mlperf_tf.errors import UserError

tokenizers = pytest.importorskip("tokenizers")

WORDS = "the a cat dog sat ran on under mat log and".split()


def _write_tokenizer(path):
    """A word-level Hugging Face tokenizer.json with Llama 3's special tokens."""
    vocab = {"<unk>": 0, "<|begin_of_text|>": 1, "<|end_of_text|>": 2}
    vocab.update({w: i + 3 for i, w in enumerate(WORDS)})
    tok = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    tok.add_special_tokens(["<|begin_of_text|>", "<|end_of_text|>"])
    tok.save(str(path))
    return str(path)


def _write_shard(path, documents):
    with gzip.open(path, "wt", encoding="utf-8") as f:
        for text in documents:
            f.write(json.dumps({"text": text, "url": "u", "timestamp": "t"}) + "\n")


def _documents(count, seed):
    rng = np.random.default_rng(seed)
    return [" ".join(rng.choice(WORDS, rng.integers(3, 12))) for _ in range(count)]


@pytest.fixture
def c4(tmp_path):
    folder = tmp_path / "c4"
    folder.mkdir()
    _write_shard(folder / "c4-train.00767-of-01024.json.gz", ["dog dog dog"] * 50)  # not used
    _write_shard(folder / "c4-train.00768-of-01024.json.gz", _documents(60, 1))
    _write_shard(folder / "c4-train.01023-of-01024.json.gz", _documents(60, 2))
    _write_shard(folder / "c4-validation.00000-of-00008.json.gz", _documents(40, 3))
    _write_shard(folder / "c4-validation.00001-of-00008.json.gz", _documents(40, 4))
    return folder


def _read(folder, seq):
    files = sorted(tf.io.gfile.glob(os.path.join(folder, "*.tfrecord")))
    spec = input_lib.feature_spec(seq)
    return [
        tf.io.parse_single_example(r, spec)["tokens"].numpy()
        for r in tf.data.TFRecordDataset(files)
    ]


def test_packs_documents_joined_by_end_of_text_into_overlapping_windows(c4, tmp_path):
    tokenizer = _write_tokenizer(tmp_path / "tokenizer.json")
    out = tmp_path / "out"
    summary = prepare.prepare(
        c4_dir=str(c4), tokenizer_path=tokenizer, out_dir=str(out), sequence_length=16,
        eval_windows=8,
    )  # fmt: skip
    assert summary["train_shards"] == 2 and summary["eval_windows"] == 8
    # The expected stream: each validation document's word ids, then <|end_of_text|> (2).
    hf = tokenizers.Tokenizer.from_file(tokenizer)
    stream = []
    for text in _documents(40, 3) + _documents(40, 4):
        stream += hf.encode(text, add_special_tokens=False).ids + [2]
    windows = _read(out / "eval", 16)
    assert len(windows) == 8
    for i, window in enumerate(windows):
        np.testing.assert_array_equal(window, stream[16 * i : 16 * i + 17])
    train = _read(out / "train", 16)
    assert len(train) == summary["train_windows"] > 0
    assert 2 in np.concatenate(train) and 3 + WORDS.index("dog") in np.concatenate(train)
    # The input splits a window into inputs and next-token labels.
    example = input_lib.split_window(tf.constant(windows[0]))
    np.testing.assert_array_equal(example["labels"][:-1], example["input_ids"][1:])


def test_shard_range_follows_the_reference_and_can_be_narrowed(c4, tmp_path):
    train, validation = prepare.c4_shards(str(c4), prepare.REFERENCE_TRAIN_SHARDS)
    assert [os.path.basename(p) for p in train] == [
        "c4-train.00768-of-01024.json.gz",
        "c4-train.01023-of-01024.json.gz",
    ]
    assert len(validation) == 2
    assert prepare.parse_shard_range("768-895") == (768, 895)
    with pytest.raises(UserError, match="--train_shards"):
        prepare.parse_shard_range("900-800")


def _prepare_cli(argv, capsys):
    code = cli.main(["prepare", "llama31_8b", *argv])
    return code, capsys.readouterr().err.strip()


@pytest.mark.parametrize(
    "case, message",
    [
        ("no_tokenizer", "--tokenizer"),
        ("missing_c4", "--c4_dir"),
        ("empty_c4", "has no training shard"),
        ("corrupt_gz", "corrupt .json.gz"),
        ("bad_json", "not a JSON line"),
        ("wrong_tokenizer", "is not a Hugging Face tokenizer.json"),
        ("not_llama_tokenizer", "no <|end_of_text|>"),
    ],
)
def test_bad_input_is_one_line_and_writes_nothing(case, message, c4, tmp_path, capsys):
    tokenizer = _write_tokenizer(tmp_path / "tokenizer.json")
    c4_dir = str(c4)
    if case == "no_tokenizer":
        tokenizer = ""
    elif case == "missing_c4":
        c4_dir = str(tmp_path / "nowhere")
    elif case == "empty_c4":
        c4_dir = str(tmp_path / "empty")
        os.mkdir(c4_dir)
    elif case == "corrupt_gz":
        with open(c4 / "c4-validation.00000-of-00008.json.gz", "wb") as f:
            f.write(b"\x1f\x8b\x08\x00 definitely not gzip")
    elif case == "bad_json":
        with gzip.open(c4 / "c4-validation.00000-of-00008.json.gz", "wt") as f:
            f.write('{"text": "the cat"}\n{oops\n')
    elif case == "wrong_tokenizer":
        tokenizer = str(tmp_path / "vocab.txt")
        with open(tokenizer, "w") as f:
            f.write("[PAD]\nthe\ncat\n")
    elif case == "not_llama_tokenizer":
        tok = tokenizers.Tokenizer(tokenizers.models.WordLevel({"<unk>": 0, "a": 1}, "<unk>"))
        tokenizer = str(tmp_path / "other.json")
        tok.save(tokenizer)
    out = tmp_path / "out"
    argv = [f"--c4_dir={c4_dir}", f"--tokenizer={tokenizer}", f"--out_dir={out}",
            "--sequence_length=16"]  # fmt: skip
    code, err = _prepare_cli(argv, capsys)
    assert code == 2 and err.startswith("error:") and message in err, err
    assert len(err.splitlines()) == 1, err
    assert not out.exists()
    assert not [p for p in os.listdir(tmp_path) if ".partial-" in p]


def test_an_existing_out_dir_is_refused_and_kept(c4, tmp_path, capsys):
    out = tmp_path / "out"
    out.mkdir()
    (out / "mine.txt").write_text("keep me")
    argv = [f"--c4_dir={c4}", f"--tokenizer={_write_tokenizer(tmp_path / 't.json')}",
            f"--out_dir={out}"]  # fmt: skip
    code, err = _prepare_cli(argv, capsys)
    assert code == 2 and "already exists" in err
    assert (out / "mine.txt").read_text() == "keep me"


def test_too_little_validation_text_for_the_eval_set_is_an_error(c4, tmp_path):
    with pytest.raises(UserError, match="the eval set needs 1024"):
        prepare.prepare(
            c4_dir=str(c4), tokenizer_path=_write_tokenizer(tmp_path / "t.json"),
            out_dir=str(tmp_path / "out"), sequence_length=16,
        )  # fmt: skip
    assert not (tmp_path / "out").exists()


def test_ngram_baselines():
    train = [0, 1, 0, 1, 0, 1, 0, 1]
    result = prepare.ngram_log_perplexities(train, [0, 1, 0, 1], vocab=4)
    assert result["unigram"] == pytest.approx(-np.log(5 / 12), abs=1e-4)
    assert result["bigram"] < result["unigram"]  # 0 -> 1 is certain under the bigram model
    assert config_lib.EVAL_SAMPLES == 1024
