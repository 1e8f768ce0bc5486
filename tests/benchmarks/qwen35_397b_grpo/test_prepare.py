"""Tests of `prepare`: the reference's file identities, and on small stand-in files in the
reference's row schema (their own digests) the checks of size, rows, digest, JSON and each
row's fields, each a one-line error naming the file, and the rows' tasks written in order."""

import hashlib
import json

import pytest

from benchmarks.qwen35_397b_grpo import config, prepare, r2egym
from mlperf_tf.errors import DataError
from tests.benchmarks.qwen35_397b_grpo.test_r2egym import reference_row


def test_reference_identities():
    assert prepare.FILES[0][1:4] == (config.TRAIN_SHA256, 685, 444_421_669)
    assert prepare.FILES[1][1:4] == (config.VAL_SHA256, 256, 173_801_096)


def _files(tmp_path, rows):
    specs = []
    for index, name in enumerate(("a.jsonl", "b.jsonl")):
        data = "".join(json.dumps(reference_row(f"{name}-{i}")) + "\n" for i in range(rows))
        (tmp_path / name).write_text(data)
        raw = data.encode()
        specs.append((name, hashlib.sha256(raw).hexdigest(), rows, len(raw), f"out{index}.jsonl"))
    return specs


def test_rows_are_copied_in_order(tmp_path):
    specs = _files(tmp_path, 5)
    counts = prepare.prepare(str(tmp_path), str(tmp_path / "out"), files=specs)
    assert counts == {"out0.jsonl": 5, "out1.jsonl": 5}
    out = (tmp_path / "out" / "out0.jsonl").open()
    ids = [r2egym.task_from_json(x).instance_id for x in out]
    assert ids == [f"a.jsonl-{i}" for i in range(5)]


@pytest.mark.parametrize(
    "change,message",
    [
        (lambda s: (s[0], s[1], s[2] + 1, s[3], s[4]), "rows, expected"),
        (lambda s: (s[0], "0" * 64, s[2], s[3], s[4]), "SHA-256"),
        (lambda s: (s[0], s[1], s[2], s[3] + 1, s[4]), "bytes, expected"),
        (lambda s: ("missing.jsonl",) + s[1:], "missing"),
    ],
)
def test_wrong_files_are_one_line_errors(tmp_path, change, message):
    specs = _files(tmp_path, 3)
    specs[0] = change(specs[0])
    with pytest.raises(DataError, match=message) as info:
        prepare.prepare(str(tmp_path), str(tmp_path / "out"), files=specs)
    assert "\n" not in str(info.value)
    assert not (tmp_path / "out").exists()


def test_bad_row(tmp_path):
    good = json.dumps(reference_row("a")) + "\n"
    for second, message in (("not json", "not a JSON row"),
                            ('{"instance_id": "b"}', "no 'responses_create_params'")):  # fmt: skip
        (tmp_path / "x.jsonl").write_text(good + second + "\n")
        size = (tmp_path / "x.jsonl").stat().st_size
        with pytest.raises(DataError, match=f"x.jsonl:2: {message}"):
            prepare.verify(str(tmp_path / "x.jsonl"), sha256="", rows=2, size=size)
