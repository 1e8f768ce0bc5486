"""Tests of the command line: `python -m compliance` and `compliance.cli.main`."""

import json
import os
import subprocess
import sys

from compliance import cli
from mlperf_tf import cli as cli_main
from tests.compliance import logs

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _logs(tmp_path):
    good = logs.write_log(tmp_path / "good.txt", logs.resnet_records())
    # Short of the target, and says so.
    bad = logs.write_log(
        tmp_path / "bad.txt", logs.resnet_records(accuracies=(0.5,), status="aborted")
    )
    return good, bad


def test_exit_codes(tmp_path, capsys):
    good, bad = _logs(tmp_path)
    assert cli.main(["check", good]) == 0
    assert cli.main(["check", good, bad]) == 1
    assert cli.main(["check", good, bad, "--quality=skip"]) == 0
    assert cli.main(["check", good, str(tmp_path / "nope.txt")]) == 2
    out, err = capsys.readouterr()
    assert out.count("PASS  ") >= 3 and "FAIL  " in out
    assert err.strip().splitlines() == [f"error: {tmp_path / 'nope.txt'}: does not exist"]


def test_check_leaves_heavy_imports_and_the_official_checker_out_of_its_process(tmp_path):
    """`mlperf-tf check LOG` should cost no more than the official CLI (issue 19).

    So the CLI's process imports neither TensorFlow, Keras, NumPy, absl nor YAML, and the official
    checker is imported only in the child that runs it.
    """
    good, _ = _logs(tmp_path)
    probe = (
        "import json, sys; from mlperf_tf import cli; code = cli.main(sys.argv[1:]);"
        "print(json.dumps([code, sorted(sys.modules)]))"
    )
    for options in ([], ["--ruleset", "0.7.0"]):
        done = subprocess.run(
            [sys.executable, "-c", probe, "check", good, *options],
            capture_output=True,
            text=True,
            check=True,
            cwd=REPO,
            timeout=120,
        )
        code, modules = json.loads(done.stdout.splitlines()[-1])
        assert code == 0, done.stdout
        heavy = {"tensorflow", "keras", "numpy", "absl", "yaml"}
        assert not [m for m in modules if m.split(".")[0] in heavy], options
        assert "mlperf_logging.compliance_checker.mlp_compliance" not in modules, options


def test_json_output(tmp_path, capsys):
    good, bad = _logs(tmp_path)
    assert cli.main(["check", good, bad, "--json", "--ruleset", "0.7.0"]) == 1
    document = json.loads(capsys.readouterr().out)
    assert document["passed"] is False
    first, second = document["logs"]
    assert first["passed"] and first["ruleset"] == "0.7.0" and first["ruleset_reason"] == "given"
    assert not second["passed"]
    (error,) = second["errors"]
    assert error["check"] == "target" and error["source"] == "official"
    assert "ERROR - FAILED" in second["official_messages"]


def test_bad_options_are_one_line_errors(tmp_path, capsys):
    good, _ = _logs(tmp_path)
    for argv in (
        ["check", good, "--ruleset", "7.7.7"],
        ["check", good, "--quality", "sometimes"],
        ["check", good, "--jobs", "0"],
        ["check"],
        ["frobnicate"],
    ):
        assert cli.main(argv) == 2, argv
        err = capsys.readouterr().err
        assert err.startswith("error: ") and err.count("\n") == 1, (argv, err)
    assert cli.main(["check", "--help"]) == 0
    assert "--quality" in capsys.readouterr().out


def test_python_m_compliance(tmp_path):
    good, bad = _logs(tmp_path)
    env = dict(os.environ, PYTHONPATH=REPO)
    done = subprocess.run(
        [sys.executable, "-m", "compliance", "check", good, bad, "--strict"],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
    )
    assert done.returncode == 1, done.stderr
    assert done.stdout.startswith("PASS  " + good)
    assert "\nFAIL  " + bad in done.stdout
    assert "error [official:target]" in done.stdout


def test_check_a_results_repository_folder_takes_the_round_from_it(tmp_path, capsys):
    # A log dated 2020-09 (the v1.0 window) filed under a v0.7 results repository.
    folder = tmp_path / "training_results_v0.7" / "Org" / "results" / "sys" / "resnet"
    folder.mkdir(parents=True)
    for i in range(2):
        logs.write_log(folder / f"result_{i}.txt", logs.resnet_records())
    (folder / "notes.txt").write_text("not a log")
    assert cli.main(["check", str(tmp_path / "training_results_v0.7"), "--json"]) == 0
    document = json.loads(capsys.readouterr().out)
    assert [os.path.basename(r["path"]) for r in document["logs"]] == [
        "result_0.txt",
        "result_1.txt",
    ]
    assert {r["ruleset"] for r in document["logs"]} == {"0.7.0"}
    assert "results repository of round 0.7.0" in document["logs"][0]["ruleset_reason"]
    # Outside such a folder, --round says the same.
    plain = logs.write_log(tmp_path / "result_0.txt", logs.resnet_records())
    assert cli.main(["check", plain, "--round", "0.7", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["logs"][0]["ruleset"] == "0.7.0"
    assert cli.main(["check", plain, "--round", "0.7", "--ruleset", "1.0.0"]) == 2
    assert "disagree" in capsys.readouterr().err
    (tmp_path / "empty").mkdir()
    assert cli.main(["check", str(tmp_path / "empty")]) == 2
    assert "no result_*.txt" in capsys.readouterr().err


def test_a_reader_that_leaves_early_gets_no_traceback(tmp_path):
    """`mlperf-tf check LOGS --json | head -c 100`: the reader closes the pipe before the report is
    written; the command ends quietly with 141 (128 + SIGPIPE), as Unix tools do."""
    good, bad = _logs(tmp_path)
    proc = subprocess.Popen(
        [sys.executable, "-c", "from mlperf_tf import cli; cli.run_main()", "check", good, bad,
         "--json"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=REPO,
    )  # fmt: skip
    proc.stdout.close()  # the reader leaves before anything is written
    try:
        _, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert "Traceback" not in err.decode(), err.decode()
    assert proc.returncode == cli_main.EXIT_BROKEN_PIPE
