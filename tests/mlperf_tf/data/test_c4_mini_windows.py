"""Tests of `mlperf_tf.data.c4.prepare_mini_windows`: the shared mini corpus's text and tokenizer
packed at a benchmark's own window length into a sibling folder (the shared folder untouched)."""

import gzip
import json
import os

import numpy as np
import pytest
import tensorflow as tf

from mlperf_tf import paths
from mlperf_tf.data import c4, token_windows

spm = pytest.importorskip("sentencepiece")

WORDS = "the a cat dog sat ran on under mat log and".split()


def _shard(path, documents):
    with gzip.open(path, "wt", encoding="utf-8") as f:
        for text in documents:
            f.write(json.dumps({"text": text}) + "\n")


def _documents(count, seed):
    rng = np.random.default_rng(seed)
    return [" ".join(rng.choice(WORDS, rng.integers(4, 12))) for _ in range(count)]


@pytest.fixture
def shared(tmp_path, monkeypatch):
    """A stand-in for the shared mini corpus: C4-format shards and a SentencePiece model."""
    monkeypatch.setenv(paths.DATA_ENV, str(tmp_path))
    folder = tmp_path / "c4-mini"
    (folder / "c4").mkdir(parents=True)
    _shard(folder / "c4" / c4.TRAIN_SHARD.format(768), _documents(300, 1))
    _shard(folder / "c4" / c4.VALIDATION_SHARD.format(0), _documents(900, 2))
    text = tmp_path / "train.txt"
    text.write_text("\n".join(_documents(300, 1)))
    spm.SentencePieceTrainer.train(
        input=str(text), model_prefix=str(folder / "tokenizer"), vocab_size=30,
        model_type="bpe", hard_vocab_limit=False, minloglevel=2,
    )  # fmt: skip
    return folder


def _windows(folder, seq):
    files = sorted(tf.io.gfile.glob(os.path.join(folder, "*.tfrecord")))
    spec = token_windows.feature_spec(seq)
    return [
        tf.io.parse_single_example(r, spec)[token_windows.TOKENS].numpy()
        for r in tf.data.TFRecordDataset(files)
    ]


def test_windows_at_another_length_come_from_the_shared_corpus(shared):
    assert c4.mini_windows_dir(c4.MINI_SEQUENCE_LENGTH) == c4.mini_data_dir() == str(shared)
    out = c4.mini_windows_dir(4)
    assert out == f"{shared}-4"
    before = sorted(os.listdir(shared))
    summary = c4.prepare_mini_windows(out, 4)
    assert sorted(os.listdir(shared)) == before  # the shared folder is only read
    assert summary["sequence_length"] == 4 and summary["eval_windows"] == c4.EVAL_WINDOWS
    evals = _windows(os.path.join(out, "eval"), 4)
    assert len(evals) == c4.EVAL_WINDOWS
    # The first eval windows are the validation text's first tokens, in order, consecutive
    # windows sharing one token; the end-of-text id joins documents.
    tokenizer = c4.load_tokenizer(str(shared / "tokenizer.model"))
    stream = [t for ids in c4.token_stream([str(shared / "c4" / c4.VALIDATION_SHARD.format(0))],
                                           tokenizer) for t in ids]  # fmt: skip
    np.testing.assert_array_equal(np.concatenate([w[:-1] for w in evals[:50]]), stream[:200])
    assert len(_windows(os.path.join(out, "train"), 4)) == summary["train_windows"] > 0
