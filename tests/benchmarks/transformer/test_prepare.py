"""Tests of prepare: gettext catalogs, filtering, the seeded split, determinism and the layout."""

import glob
import json
import os
import struct

import pytest
import tensorflow as tf

from benchmarks.transformer import prepare
from mlperf_tf.errors import DataError, UserError


def write_mo(path, entries, charset="UTF-8"):
    """Writes a GNU .mo catalog (msgid -> msgstr; a tuple key makes a plural entry)."""
    header = (
        f"Content-Type: text/plain; charset={charset}\nPlural-Forms: nplurals=2; plural=(n != 1);\n"
    )
    items = [(b"", header.encode("ascii"))]
    for msgid, msgstr in entries.items():
        if isinstance(msgid, tuple):  # plural: "singular\0plural" -> "form0\0form1"
            key = "\0".join(msgid).encode(charset)
            value = "\0".join(msgstr).encode(charset)
        else:
            key, value = msgid.encode(charset), msgstr.encode(charset)
        items.append((key, value))
    items.sort()
    n = len(items)
    originals_offset = 28
    translations_offset = originals_offset + 8 * n
    data_offset = translations_offset + 8 * n
    tables, blob = [b"", b""], b""
    for column in (0, 1):
        for item in items:
            tables[column] += struct.pack("<II", len(item[column]), data_offset + len(blob))
            blob += item[column] + b"\0"
    with open(path, "wb") as f:
        f.write(struct.pack("<7I", 0x950412DE, 0, n, originals_offset, translations_offset, 0, 0))
        f.write(tables[0] + tables[1] + blob)


ENTRIES = {
    "Open file": "Datei öffnen",
    "Cannot open %s": "%s kann nicht geöffnet werden",
    "Save the document before closing": "Das Dokument vor dem Schließen speichern",
    "Quit": "Beenden",
    "Kibala": "Kibala",  # untranslated name: dropped
    "": "",
    "multi\nline": "mehr\nzeilig",  # dropped
    "menu\x04Open": "Öffnen",  # context entry: dropped
    "Copy %s to %s": "%s nach %s kopieren",  # two placeholders: dropped
    "a very long message " * 10: "eine sehr lange Nachricht",  # too long: dropped
    ("%d file", "%d files"): ("%d Datei", "%d Dateien"),  # plural: dropped
}


def make_catalogs(tmp_path, count=2):
    folder = tmp_path / "LC_MESSAGES"
    folder.mkdir()
    write_mo(folder / "a.mo", ENTRIES)
    write_mo(folder / "b.mo", {"Quit": "Verlassen", "Print": "Drucken"})
    for i in range(count - 2):
        write_mo(folder / f"extra{i}.mo", {f"Message number {i}": f"Nachricht Nummer {i}"})
    return str(folder)


def test_read_gettext_pairs_filters_and_keeps_the_first_translation(tmp_path):
    pairs = dict(prepare.read_gettext_pairs(make_catalogs(tmp_path)))
    assert pairs == {
        "Open file": "Datei öffnen",
        "Cannot open %s": "%s kann nicht geöffnet werden",
        "Save the document before closing": "Das Dokument vor dem Schließen speichern",
        "Quit": "Beenden",  # a.mo sorts before b.mo
        "Print": "Drucken",
    }


def test_unparsable_catalog_is_skipped(tmp_path):
    folder = make_catalogs(tmp_path)
    write_mo(os.path.join(folder, "latin1.mo"), {"Close": "Schließen"}, charset="latin-1")
    with open(os.path.join(folder, "latin1.mo"), "r+b") as f:  # a header gettext cannot decode
        data = f.read().replace(b"charset=latin-1", b"charset=\xe4atin-1")
        f.seek(0)
        f.write(data)
    pairs = dict(prepare.read_gettext_pairs(folder))
    assert "Close" not in pairs and "Open file" in pairs


def test_no_catalogs_is_a_data_error(tmp_path):
    with pytest.raises(DataError, match="no gettext catalogs"):
        prepare.read_gettext_pairs(str(tmp_path))
    folder = tmp_path / "empty"
    folder.mkdir()
    write_mo(folder / "x.mo", {"Kibala": "Kibala"})
    with pytest.raises(DataError, match="no usable message pair"):
        prepare.read_gettext_pairs(str(folder))


def test_installed_catalogs_are_read():
    if not glob.glob(os.path.join(prepare.DEFAULT_LOCALE_DIR, "*.mo")):
        pytest.skip("no German gettext catalogs installed on this machine")
    pairs = prepare.read_gettext_pairs()
    assert len(pairs) > 100
    assert all("\n" not in en and "\n" not in de and en != de for en, de in pairs)


def test_split_is_seeded_and_disjoint():
    pairs = [(f"e{i}", f"d{i}") for i in range(50)]
    train, held = prepare.split_pairs(pairs, held_out=10, seed=3)
    assert len(held) == 10 and len(train) == 40
    assert not set(train) & set(held)
    assert prepare.split_pairs(pairs, held_out=10, seed=3) == (train, held)
    assert prepare.split_pairs(pairs, held_out=10, seed=4)[1] != held
    with pytest.raises(DataError, match="fewer than"):
        prepare.split_pairs(pairs, held_out=50, seed=0)


def corpus(n=300):
    words_en = ["file", "open", "cannot", "save", "the", "document", "print", "close", "new"]
    words_de = ["Datei", "öffnen", "nicht", "speichern", "das", "Dokument", "drucken", "neu"]
    pairs = []
    for i in range(n):
        en = " ".join(words_en[(i * k) % len(words_en)] for k in range(1, 2 + i % 5))
        de = " ".join(words_de[(i * k + 1) % len(words_de)] for k in range(1, 2 + i % 6))
        pairs.append((f"{en} {i}", f"{de} {i}"))
    return pairs


def read_records(pattern):
    return [
        bytes(r.numpy()) for f in sorted(glob.glob(pattern)) for r in tf.data.TFRecordDataset(f)
    ]


def test_prepare_is_deterministic_for_a_seed(tmp_path):
    pairs = corpus()
    outputs = {}
    for name, seed in (("a", 1), ("b", 1), ("c", 2)):
        prepare.prepare(pairs[:250], pairs[250:], str(tmp_path / name), vocab_size=60, seed=seed)
        outputs[name] = (
            (tmp_path / name / prepare.VOCAB_MODEL).read_bytes(),
            read_records(str(tmp_path / name / "train-*")),
            read_records(str(tmp_path / name / "eval-*")),
        )
    assert outputs["a"] == outputs["b"]
    assert len(outputs["a"][1]) == 250 and len(outputs["a"][2]) == 50


def test_prepare_layout_and_round_trip(tmp_path):
    pairs = corpus()
    out = tmp_path / "data"
    metadata = prepare.prepare(pairs[:250], pairs[250:], str(out), vocab_size=60, seed=0)
    assert metadata == json.loads((out / prepare.METADATA).read_text())
    assert metadata["vocab_size"] == 60 and metadata["train_pairs"] == 250
    assert sum(metadata["train_length_histogram"].values()) == 250
    assert (out / prepare.EVAL_REFERENCES).read_text().splitlines() == [t for _, t in pairs[250:]]
    vocab = prepare.load_vocab(str(out / prepare.VOCAB_MODEL))
    assert (vocab.pad_id(), vocab.eos_id(), vocab.unk_id(), vocab.bos_id()) == (0, 1, 2, -1)
    first = tf.train.Example.FromString(read_records(str(out / "eval-*"))[0])
    features = first.features.feature
    assert features["index"].int64_list.value == [0]
    targets = list(features["targets"].int64_list.value)
    assert targets[-1] == prepare.EOS_ID
    assert prepare.decode(vocab, targets + [5, 6]) == pairs[250][1]  # stops at EOS
    assert not list(tmp_path.glob("data.partial-*"))  # the temporary folder was renamed
    with pytest.raises(DataError, match="already exists"):
        prepare.prepare(pairs[:250], pairs[250:], str(out), vocab_size=60, seed=0)


def test_prepare_parallel_text_checks_alignment(tmp_path):
    (tmp_path / "a.en").write_text("one\ntwo\n")
    (tmp_path / "a.de").write_text("eins\n")
    with pytest.raises(DataError, match="has 2 lines"):
        prepare.prepare_parallel_text(
            train_source=str(tmp_path / "a.en"),
            train_target=str(tmp_path / "a.de"),
            eval_source=str(tmp_path / "a.en"),
            eval_target=str(tmp_path / "a.de"),
            out_dir=str(tmp_path / "out"),
            vocab_size=10,
        )
    with pytest.raises(DataError, match="does not exist"):
        prepare.load_metadata(str(tmp_path / "missing"))


def test_prepare_mini_from_catalogs(tmp_path):
    folder = make_catalogs(tmp_path, count=40)
    metadata = prepare.prepare_mini(
        str(tmp_path / "mini"), vocab_size=60, held_out=5, seed=0, locale_dir=folder
    )
    assert metadata["eval_pairs"] == 5
    assert metadata["train_pairs"] + 5 == len(prepare.read_gettext_pairs(folder))


def test_main_prepares_parallel_text_and_reports_missing_flags(tmp_path, capsys):
    pairs = corpus(120)
    for name, column in (("train.en", 0), ("train.de", 1)):
        (tmp_path / name).write_text("".join(p[column] + "\n" for p in pairs[:100]))
    for name, column in (("test.en", 0), ("test.de", 1)):
        (tmp_path / name).write_text("".join(p[column] + "\n" for p in pairs[100:]))
    out = tmp_path / "out"
    with pytest.raises(UserError, match="--train_target"):
        prepare.main([f"--out_dir={out}", f"--train_source={tmp_path / 'train.en'}"])
    argv = [
        f"--out_dir={out}",
        f"--train_source={tmp_path / 'train.en'}",
        f"--train_target={tmp_path / 'train.de'}",
        f"--eval_source={tmp_path / 'test.en'}",
        f"--eval_target={tmp_path / 'test.de'}",
        "--vocab_size=50",
        "--num_train_shards=2",
    ]
    assert prepare.main(argv) == 0
    assert "wrote 100 train and 20 eval pairs" in capsys.readouterr().out
    assert len(glob.glob(str(out / "train-*"))) == 2
