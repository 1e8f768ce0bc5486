"""The mini presets' offline corpus: docstring prose of installed Python code."""

import textwrap

from mlperf_tf.data import docstrings


def test_docstring_sentences_drop_code_and_split_sentences():
    doc = (
        "Return the sum. Raises ValueError if empty!\n\n"
        ">>> add(1, 2)\n3\n\n"
        "Second paragraph\nspans two lines. (Really.)\n\n"
        "x"
    )
    assert docstrings.docstring_sentences(doc) == [
        "Return the sum.",
        "Raises ValueError if empty!",
        "Second paragraph spans two lines.",
        "(Really.)",
    ]


def test_file_sentences_read_module_class_and_function_docstrings_in_line_order(tmp_path):
    path = tmp_path / "m.py"
    path.write_text(
        textwrap.dedent(
            '''
            """Module text here."""

            def f():
                """Function text here. Second one."""

            class C:
                """Class text here."""
            '''
        )
    )
    assert docstrings.file_sentences(str(path)) == [
        "Module text here.",
        "Function text here.",
        "Second one.",
        "Class text here.",
    ]
    # A file this Python cannot parse is not part of the corpus (no error).
    (tmp_path / "bad.py").write_text("def (:\n")
    assert docstrings.file_sentences(str(tmp_path / "bad.py")) == []


def test_file_lists_skip_test_folders_and_are_sorted(tmp_path):
    for rel in ("b.py", "a.py", "tests/t.py", "sub/x_test.py", "sub/y.py", "notes.txt"):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text("")
    names = docstrings.python_files(str(tmp_path), skip_dirs={"tests"}, skip_test_files=True)
    assert [p[len(str(tmp_path)) + 1 :] for p in names] == ["a.py", "b.py", "sub/y.py"]
    assert docstrings.package_python_files("no_such_package_here") == []
