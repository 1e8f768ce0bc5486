"""Tests of `mlperf-tf prepare llama2_70b_lora`: GovReport parquet to TFRecords the input reads,
bad rows one line with nothing left behind, the mini's example encoding, and the CLI."""

import os
import subprocess
import sys

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import tensorflow as tf

from benchmarks.llama2_70b_lora import config as config_lib
from benchmarks.llama2_70b_lora import input as input_lib
from benchmarks.llama2_70b_lora import prepare
from mlperf_tf.errors import DataError
from tests.benchmarks.llama2_70b_lora.hf_checkpoints import write_hf_checkpoint
from tests.e2e import REPO
from tests.refusals import the_error_line


def _parquet(path, rows):
    table = pa.table({"input_ids": [r[0] for r in rows], "labels": [r[1] for r in rows],
                      "attention_mask": [[1] * len(r[0]) for r in rows]})  # fmt: skip
    pq.write_table(table, path)


ROWS = [([1, 5, 6, 7, 8], [-100, -100, -100, 7, 8]), ([1, 9, 10], [-100, -100, 10])]


def test_govreport_to_records_the_input_reads(tmp_path):
    src = tmp_path / "gov"
    src.mkdir()
    _parquet(src / "train-00000-of-00001.parquet", ROWS * 3)
    _parquet(src / "validation-00000-of-00001.parquet", ROWS)
    summary = prepare.prepare_govreport(str(src), str(tmp_path / "out"), num_shards=2)
    assert summary == {"train": 6, "eval": 2}
    config = config_lib.smoke()
    parse = input_lib.make_parse_fn(config)
    files = sorted(tf.io.gfile.glob(str(tmp_path / "out" / config.data.eval_pattern)))
    first = next(iter(tf.data.TFRecordDataset(files).map(parse)))
    assert first["input_ids"].numpy().tolist()[:6] == [1, 5, 6, 7, 8, 0]
    assert first["labels"].numpy().tolist()[:5] == [-100, -100, 7, 8, -100]


def test_labels_masking_everything_is_one_line_and_nothing_written(tmp_path):
    src = tmp_path / "gov"
    src.mkdir()
    _parquet(src / "train-00000-of-00001.parquet", ROWS + [([1, 2, 3], [-100, -100, -100])])
    _parquet(src / "validation-00000-of-00001.parquet", ROWS)
    with pytest.raises(DataError, match="row 2: every label is -100") as info:
        prepare.prepare_govreport(str(src), str(tmp_path / "out"))
    assert "\n" not in str(info.value)
    assert not os.path.exists(tmp_path / "out" / "train")
    assert [n for n in os.listdir(tmp_path / "out") if "partial" in n] == []


def test_missing_column_is_one_line(tmp_path):
    src = tmp_path / "gov"
    src.mkdir()
    pq.write_table(pa.table({"input_ids": [[1, 2]]}), src / "train-0.parquet")
    with pytest.raises(DataError, match="no column 'labels'"):
        prepare.prepare_govreport(str(src), str(tmp_path / "out"))


def test_mini_example_is_the_reference_template():
    class Chars:  # a tokenizer of one id per character
        def encode(self, text):
            return [ord(c) for c in text]

    ids, labels = prepare.encode_pair(Chars(), "body " * 100, "Short summary.", 120)
    assert len(ids) == len(labels) == 120
    text = "".join(chr(i) for i in ids[1:-1])
    assert text.startswith("### Summarize the following text:\n body")
    assert text.endswith("\n ### Summary:\n Short summary.")
    answer = [label for label in labels if label != -100]
    assert answer == ids[-len(answer) :] and len(answer) == len(" Short summary.") + 1


def _cli(*args):
    return subprocess.run(
        [sys.executable, "-m", "mlperf_tf.cli", "prepare", "llama2_70b_lora", *args],
        capture_output=True, text=True, cwd=REPO, timeout=300,
        env=dict(os.environ, PYTHONPATH=REPO),
    )  # fmt: skip


def test_cli_imports_and_refuses_another_model_in_one_line(tmp_path, capsys):
    """The import through the command in its own process; the refusal in this one (`cli.main`,
    as `tests/test_cli_fuzz.py` runs refusals: a second interpreter adds only its TF import)."""
    from mlperf_tf import cli

    write_hf_checkpoint(str(tmp_path / "src"), config_lib.smoke().model, fused=True)
    ok = _cli(f"--checkpoint={tmp_path / 'src'}", f"--out_dir={tmp_path / 'out'}", "--model=smoke")
    assert ok.returncode == 0, ok.stderr
    assert os.path.exists(tmp_path / "out" / "base" / "index.json")
    code = cli.main(["prepare", "llama2_70b_lora", f"--checkpoint={tmp_path / 'src'}",
                     f"--out_dir={tmp_path / 'out2'}"])  # fmt: skip
    assert the_error_line(capsys.readouterr().err, code, 2).startswith("error: checkpoint config")
    assert not os.path.exists(tmp_path / "out2" / "base")


def test_base_pretrained_in_a_child_process_is_a_loadable_checkpoint(tmp_path):
    from benchmarks.llama2_70b_lora import checkpoint, pretrain

    model = config_lib.tiny(64)
    stream = (np.arange(4000) * 7 % 64).astype(np.int32)
    evals = [([1, 5, 6, 7], [-100, -100, 6, 7])] * 3
    report = pretrain.pretrain_in_child(stream, model, str(tmp_path / "base"), steps=3,
                                        sequence_length=16, eval_examples=evals,
                                        work_dir=str(tmp_path))  # fmt: skip
    assert report["pretrain_steps"] == 3 and np.isfinite(report["base_eval_loss"])
    ckpt = checkpoint.SuiteCheckpoint(str(tmp_path / "base"), model)
    assert ckpt.read("layers.1.q_proj").shape == (32, 32)
    assert sorted(os.listdir(tmp_path)) == ["base"]  # the inputs passed to the child are gone
