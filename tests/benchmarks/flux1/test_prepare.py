"""`mlperf-tf prepare flux1` on tiny files the tests write in the reference's layout: the
records parse back to the stored embeddings; a wrong embedding width, a corrupt parquet file
and a bad image size are one-line errors that leave no partial file; a rerun resumes."""

import dataclasses
import glob
import os
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

from benchmarks.flux1 import config as config_lib
from benchmarks.flux1 import input as input_lib
from benchmarks.flux1 import prepare
from mlperf_tf.errors import DataError, UserError
from tests import e2e

# A tiny shape: T5 [3, 8], CLIP [4], latent [2, 4, 4] (image 32 at the 8x downscale).
FLAGS = ["--t5_length=3", "--t5_width=8", "--clip_width=4", "--latent_channels=2",
         "--image_size=32"]  # fmt: skip


def _row(i, *, t5_width=8, timestep=None):
    rng = np.random.default_rng(i)
    row = {
        "__key__": f"sample{i}",
        "t5_encodings": prepare.npy_bytes(rng.normal(size=(3, t5_width)).astype(np.float32)),
        "clip_encodings": prepare.npy_bytes(rng.normal(size=(4,)).astype(np.float32)),
        "mean": prepare.npy_bytes(rng.normal(size=(2, 4, 4)).astype(np.float32)),
        "logvar": prepare.npy_bytes(np.full((2, 4, 4), -3.0, np.float32)),
    }
    if timestep is not None:
        row["timestep"] = timestep
    return row


def _write_source(root, *, files=2, rows=3, eval_set=False, **row_args):
    os.makedirs(root, exist_ok=True)
    for f in range(files):
        rows_ = [
            _row(f * 10 + r, timestep=(r % 8) if eval_set else None, **row_args)
            for r in range(rows)
        ]
        prepare._write_parquet(os.path.join(root, f"data_0_{f:04d}.parquet"), rows_,
                               eval_set=eval_set)  # fmt: skip


def _config(out_dir):
    c = config_lib.smoke()
    data = dataclasses.replace(c.data, image_size=32, latent_downscale=8, latent_channels=2,
                               t5_length=3, t5_width=8, clip_width=4)  # fmt: skip
    model = dataclasses.replace(c.model, in_channels=8, context_in_dim=8, vec_in_dim=4)
    return dataclasses.replace(c, data=data, model=model, data_dir=str(out_dir))


def _empty(root):
    os.makedirs(root, exist_ok=True)
    np.save(os.path.join(root, "t5_empty.npy"), np.ones((1, 3, 8), np.float16))
    np.save(os.path.join(root, "clip_empty.npy"), np.ones((1, 4), np.float16))


def test_converts_the_reference_layout_and_parses_back(tmp_path):
    _write_source(tmp_path / "train")
    _write_source(tmp_path / "eval", eval_set=True)
    _empty(tmp_path / "empty")
    out = tmp_path / "out"
    prepare.main([f"--out_dir={out}", f"--train_dir={tmp_path / 'train'}",
                  f"--eval_dir={tmp_path / 'eval'}", f"--empty_dir={tmp_path / 'empty'}",
                  *FLAGS])  # fmt: skip
    config = _config(out)
    parse = input_lib.make_parse_fn(config)
    records = list(tf.data.TFRecordDataset(sorted(glob.glob(str(out / "eval" / "*.tfrecord")))))
    assert len(records) == 6
    example = parse(records[1])
    want = _row(1)
    stored = np.load(__import__("io").BytesIO(want["t5_encodings"]))
    np.testing.assert_array_equal(
        example["t5"].numpy(),
        tf.bitcast(tf.constant(stored), tf.bfloat16).numpy().astype(np.float32),
    )
    assert int(example["timestep"]) == 1
    t5, clip = input_lib.load_empty_encodings(config)
    assert t5.shape == (3, 8) and clip.shape == (4,) and (t5 == 1).all()
    # The eval input: each sample at its timestep k / 8, the same noise every time.
    batches = list(input_lib.eval_dataset(config, input_context=None, batch_size=4, num_batches=2))
    times = np.concatenate([b["t"].numpy()[b["valid"].numpy() > 0] for b in batches])
    assert sorted(times.tolist()) == [0.0, 0.0, 0.125, 0.125, 0.25, 0.25]
    again = list(input_lib.eval_dataset(config, input_context=None, batch_size=4, num_batches=2))
    np.testing.assert_array_equal(batches[1]["noise"].numpy(), again[1]["noise"].numpy())


def test_bf16_bits_round_to_nearest():
    x = np.array([1.0, 1.00390625, -2.5, 3.0e-3], np.float32)
    got = tf.bitcast(tf.constant(prepare.bf16_bits(x)), tf.bfloat16).numpy().astype(np.float32)
    np.testing.assert_array_equal(
        got, tf.cast(tf.constant(x), tf.bfloat16).numpy().astype(np.float32)
    )


def test_a_rerun_skips_the_files_already_converted(tmp_path):
    _write_source(tmp_path / "train")
    shapes = prepare._expected_shapes(prepare._Args(
        image_size=32, latent_downscale=8, latent_channels=2, t5_length=3, t5_width=8,
        clip_width=4))  # fmt: skip
    first = prepare.convert_split(str(tmp_path / "train"), str(tmp_path / "out"), shapes,
                                  eval_set=False, progress=False)  # fmt: skip
    assert first == {"files": 2, "skipped_files": 0, "rows": 6}
    assert sorted(os.listdir(tmp_path / "out")) == [
        "train-00000-of-00002.tfrecord",
        "train-00001-of-00002.tfrecord",
    ]
    os.remove(tmp_path / "out" / "train-00001-of-00002.tfrecord")  # as if interrupted in file 2
    second = prepare.convert_split(str(tmp_path / "train"), str(tmp_path / "out"), shapes,
                                   eval_set=False, progress=False)  # fmt: skip
    assert second == {"files": 1, "skipped_files": 1, "rows": 3}


def _error_line(argv):
    """Runs the command line; returns (exit code, stderr)."""
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.flux1.prepare", *argv],
        capture_output=True, text=True, cwd=e2e.REPO, timeout=300,
    )  # fmt: skip
    return done.returncode, done.stderr.strip()


def test_a_wrong_embedding_width_is_one_line_and_leaves_no_partial_file(tmp_path):
    _write_source(tmp_path / "train", files=1, t5_width=16)
    out = tmp_path / "out"
    code, err = _error_line([f"--out_dir={out}", f"--train_dir={tmp_path / 'train'}", *FLAGS])
    assert code == 2
    lines = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and "t5_encodings has shape (3, 16), not (3, 8)" in lines[0], err
    assert "--t5_length/--t5_width" in lines[0]
    assert not glob.glob(str(out / "**" / "*"), recursive=True) or not [
        p for p in glob.glob(str(out / "**" / "*.tfrecord*"), recursive=True)
    ]


def test_a_corrupt_parquet_file_is_a_data_error_and_leaves_no_partial_file(tmp_path):
    _write_source(tmp_path / "train", files=2)
    path = tmp_path / "train" / "data_0_0001.parquet"
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])  # truncated
    shapes = prepare._expected_shapes(prepare._Args(
        image_size=32, latent_downscale=8, latent_channels=2, t5_length=3, t5_width=8,
        clip_width=4))  # fmt: skip
    with pytest.raises(DataError, match="cannot read parquet file .*data_0_0001.parquet"):
        prepare.convert_split(str(tmp_path / "train"), str(tmp_path / "out"), shapes,
                              eval_set=False, progress=False)  # fmt: skip
    assert not glob.glob(str(tmp_path / "out" / "*"))


def test_an_image_size_the_patching_cannot_take_is_a_user_error(tmp_path):
    with pytest.raises(UserError, match=r"--image_size \(40\) must be a multiple of 16"):
        prepare.main([f"--out_dir={tmp_path}", "--train_dir=x", "--image_size=40"])
    with pytest.raises(Exception, match=r"`data.image_size` \(40\) must be a multiple of 16"):
        config_lib.DataConfig(image_size=40)
