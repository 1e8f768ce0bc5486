"""Fail safe as root and at start-up (issue 43): output paths are tried, not inspected; input
paths must be regular files; a run that cannot start leaves its folder as it found it.

These run as whoever runs the suite — root in CI and on these machines, where `os.access` and
permission bits say yes to everything. So the paths that must fail are ones no one can write:
procfs and sysfs entries, and paths through a regular file. Read-only folders are tried as a
non-root user in a forked child that drops its privileges (when the suite runs as root).
"""

from __future__ import annotations

import dataclasses
import errno
import json
import os
import stat

import pytest

from mlperf_tf import checkpoints, cli, paths, runlog, runner, runrecord
from mlperf_tf.errors import UserError
from tests.processes import deadline, file_tree
from tests.refusals import the_error_line
from tests.test_cli_fuzz import _LOG as LOG
from tests.tiny_benchmark import TinyBenchmark, smoke

# Paths that no one can write, root included (procfs has no such entry and takes no new files;
# sysfs refuses creation; a regular file has no children).
UNWRITABLE = ("/proc/x", "/sys/x", "/etc/hostname/x")


def _one_error(argv, capsys, monkeypatch, tmp_path, needle):
    """Runs the CLI in this process; asserts exit 2, one `error:` line with `needle`, no traceback,
    nothing changed under `tmp_path`; returns the line."""
    from tests.test_cli_fuzz import _stub_work

    monkeypatch.chdir(tmp_path)
    _stub_work(monkeypatch)
    before = file_tree(tmp_path)
    with deadline(20):
        try:
            code = cli.main(argv)
        except SystemExit as e:
            code = e.code
    line = the_error_line(capsys.readouterr().err, code, 2)
    assert needle in line, line
    assert file_tree(tmp_path) == before
    return line


# ---- output paths: the cases and their classes -----------------------------------------
SIM = ["simulate", "--benchmark=resnet50", "--system=a100-dgx", "--chips=8"]
RUN = ["run", "--benchmark=resnet50", "--preset=smoke", "--max_train_steps=2"]
SWEEP = ["sweep", "--benchmark=resnet50", "--preset=smoke"]


@pytest.mark.parametrize("where", UNWRITABLE)
@pytest.mark.parametrize(
    "argv, flag",
    [
        ([*SIM, "--plot={where}.png"], "--plot"),
        ([*SWEEP, "--out={where}"], "--out"),
        ([*RUN, "--model_dir={tmp}/m", "--mlperf_log={where}/log.txt"], "--mlperf_log"),
        ([*RUN, "--model_dir={tmp}/m", "--mlperf_log={where}"], "--mlperf_log"),
        ([*RUN, "--model_dir={where}"], "--model_dir"),
        (["report", "{tmp}/log.txt", "--out={where}"], "--out"),
        (["prepare", "resnet50", "--out_dir={where}", "--raw_dir={tmp}"], "--out_dir"),
    ],
)
def test_an_output_path_no_one_can_write_is_one_line_as_root(
    argv, flag, where, tmp_path, capsys, monkeypatch
):
    if where.endswith("/x") and where.startswith("/etc") and not os.path.isfile("/etc/hostname"):
        pytest.skip("no /etc/hostname file here")
    (tmp_path / "log.txt").write_text(LOG)
    argv = [a.replace("{where}", where).replace("{tmp}", str(tmp_path)) for a in argv]
    _one_error(argv, capsys, monkeypatch, tmp_path, flag)


def test_a_tried_path_leaves_nothing_behind(tmp_path):
    deep = tmp_path / "a" / "b" / "c"
    paths.try_output_dir(str(deep), "--out")
    paths.try_output_file(str(deep / "f.png"), "--plot")
    assert list(tmp_path.iterdir()) == []
    existing = tmp_path / "kept.txt"
    existing.write_text("kept\n")
    before = os.stat(existing)
    paths.try_output_file(str(existing), "--mlperf_log")
    after = os.stat(existing)
    assert existing.read_text() == "kept\n"
    assert (before.st_mtime_ns, before.st_size) == (after.st_mtime_ns, after.st_size)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["kept.txt"]


def _as_nobody(function):
    """Runs `function()` in a forked child as uid/gid 65534 (nobody); returns its exit code.

    The child exits 0 when `function` raised UserError, 1 when it returned, 3 on anything else.
    """
    pid = os.fork()
    if pid == 0:  # the child
        code = 3
        try:
            os.setgid(65534)
            os.setuid(65534)
            try:
                function()
                code = 1
            except UserError:
                code = 0
        except BaseException:  # noqa: BLE001 (the child reports through its exit code only)
            code = 3
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)


@pytest.mark.parametrize("kind", ["dir", "file", "deep"])
def test_a_read_only_folder_refuses_a_non_root_user(kind, tmp_path):
    folder = tmp_path / "ro"
    folder.mkdir()
    os.chmod(tmp_path, 0o755)
    os.chmod(folder, stat.S_IRUSR | stat.S_IXUSR | stat.S_IRGRP | stat.S_IXGRP | 0o005)
    target = {
        "dir": lambda: paths.try_output_dir(str(folder), "--out"),
        "file": lambda: paths.try_output_file(str(folder / "plot.png"), "--plot"),
        "deep": lambda: paths.try_output_dir(str(folder / "a" / "b"), "--model_dir"),
    }[kind]
    if os.geteuid() == 0:
        assert _as_nobody(target) == 0
    else:
        with pytest.raises(UserError, match="--"):
            target()
    assert list(folder.iterdir()) == []


# ---- input paths -----------------------------------------------------------------------------------
@pytest.fixture
def fifo(tmp_path):
    path = tmp_path / "fifo"
    os.mkfifo(path)
    return str(path)


@pytest.mark.parametrize("source", ["fifo", "/dev/zero", "/dev/null", "folder"])
@pytest.mark.parametrize(
    "argv, needle",
    [
        (["check", "{src}"], "regular file"),
        (["report", "{src}", "--out={tmp}/r"], "regular file"),
        ([*SIM[:3], "--system_file={src}", "--chips=8"], "--system_file"),
        (
            ["prepare", "resnet50", "--out_dir={tmp}/d", "--raw_dir={tmp}", "--val_labels={src}"],
            "--val_labels",
        ),  # fmt: skip
    ],
)
def test_an_input_that_is_not_a_regular_file_is_one_line_not_a_hang(
    argv, needle, source, fifo, tmp_path, capsys, monkeypatch
):
    src = {"fifo": fifo, "folder": str(tmp_path)}.get(source, source)
    if source == "folder" and argv[0] in ("check", "report"):
        pytest.skip("a folder is a collection of logs for check and report")
    argv = [a.replace("{src}", src).replace("{tmp}", str(tmp_path)) for a in argv]
    line = _one_error(argv, capsys, monkeypatch, tmp_path, "")
    assert needle in line or (source == "folder" and "folder" in line), line


def test_an_input_file_that_vanishes_before_the_open_is_one_line(tmp_path, monkeypatch):
    from compliance import logfile

    log = tmp_path / "log.txt"
    log.write_text(LOG)
    real_stat = os.stat

    def stat_then_vanish(path, *args, **kwargs):
        info = real_stat(path, *args, **kwargs)
        if os.fspath(path) == str(log) and os.path.lexists(log):
            log.unlink()  # gone between the check and the open
        return info

    monkeypatch.setattr(os, "stat", stat_then_vanish)
    with pytest.raises(UserError, match="cannot read"):
        logfile.scan_log(str(log))


def test_an_input_file_whose_read_fails_midway_is_one_line(tmp_path, monkeypatch):
    system = tmp_path / "system.json"
    system.write_text("{}")
    real_fdopen = os.fdopen

    class Vanishing:
        def __init__(self, handle):
            self.handle = handle

        def read(self, *args):
            raise OSError(errno.ESTALE, os.strerror(errno.ESTALE))

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.handle.close()

    monkeypatch.setattr(os, "fdopen", lambda *a, **k: Vanishing(real_fdopen(*a, **k)))
    with pytest.raises(UserError, match="--system_file=.*cannot be read: Stale"):
        paths.read_input(str(system), "--system_file")


# ---- list flags and batch splits (the cases) -------------------------------------------------
@pytest.mark.parametrize(
    "extra, needle",
    [
        (["--chips=8,,16"], "--chips"),
        (["--chips=8,8"], "--chips"),
        (["--chips=8, 16"], "--chips"),
        (["--chips=8,x"], "--chips"),
        (["--chips=8", "--global_batch=257"], "--global_batch"),
        # 8 chips in groups of 2 are 4 data groups: 6 does not split over them.
        (
            ["--benchmark=bert", "--chips=8", "--model_parallel=2", "--global_batch=6"],
            "data-parallel groups",
        ),  # fmt: skip
    ],
)
def test_simulate_refuses_lists_and_splits_that_mean_nothing(
    extra, needle, tmp_path, capsys, monkeypatch
):
    _one_error([*SIM[:3], *extra], capsys, monkeypatch, tmp_path, needle)


@pytest.mark.parametrize(
    "argv, needle",
    [
        (
            [
                *RUN,
                "--model_dir={tmp}/m",
                "--distribution=mirrored",
                "--num_cpu_devices=2",
                "--config.global_batch_size=9",
            ],
            "global_batch_size",
        ),  # fmt: skip
        (
            [
                *RUN,
                "--model_dir={tmp}/m",
                "--config.global_batch_size=9",
                "--config.gradient_accumulation_steps=2",
            ],
            "gradient_accumulation_steps",
        ),  # fmt: skip
        (
            [
                *RUN,
                "--model_dir={tmp}/m",
                "--distribution=mirrored",
                "--num_cpu_devices=2",
                "--config.eval_batch_size=9",
            ],
            "eval_batch_size",
        ),  # fmt: skip
        (
            [
                "bench",
                "--benchmark=resnet50",
                "--preset=smoke",
                "--distribution=mirrored",
                "--num_cpu_devices=2",
                "--config.global_batch_size=9",
            ],
            "global_batch_size",
        ),  # fmt: skip
        (
            [
                *SWEEP,
                "--out={tmp}/s",
                "--batch_sizes=9",
                "--run.distribution=mirrored",
                "--run.num_cpu_devices=2",
            ],
            "global_batch_size",
        ),  # fmt: skip
        ([*SWEEP, "--out={tmp}/s", "--batch_sizes=8,,16"], "--batch_sizes"),
        ([*SWEEP, "--out={tmp}/s", "--optimizers=lars,lars"], "--optimizers"),
        ([*SWEEP, "--out={tmp}/s", "--grid.max_epochs=1,,2"], "--grid.max_epochs"),
        ([*RUN, "--model_dir={tmp}/m", "--config.data.mean_rgb=1,,2"], "mean_rgb"),
    ],
)
def test_run_bench_and_sweep_refuse_splits_and_lists_before_any_work(
    argv, needle, tmp_path, capsys, monkeypatch
):
    argv = [a.replace("{tmp}", str(tmp_path)) for a in argv]
    _one_error(argv, capsys, monkeypatch, tmp_path, needle)


# ---- a run that cannot start leaves its folder as it found it ------------------------------------------
class OtherTiny(TinyBenchmark):
    """Another benchmark of the same shape: its checkpoint would restore, and mean nothing."""

    name = "other_tiny"
    mlperf_benchmark = "ssd"


def _run(benchmark, model_dir, **kwargs):
    kwargs.setdefault("distribution", "one_device")
    kwargs.setdefault("steps_per_loop", 2)
    return runner.run(benchmark, runner.RunConfig(model_dir=str(model_dir), **kwargs))


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
    """A folder holding a tiny run that ended on its 2-step budget."""
    model_dir = tmp_path_factory.mktemp("finished") / "m"
    _run(TinyBenchmark(smoke()), model_dir, max_train_steps=2)
    return model_dir


def _copy(source, tmp_path):
    import shutil

    target = tmp_path / "m"
    shutil.copytree(source, target)
    return target


@pytest.mark.parametrize(
    "make, needles",
    [
        (lambda: OtherTiny(smoke()), ["holds a run of tiny (preset smoke)", "other_tiny"]),
        (
            lambda: TinyBenchmark(dataclasses.replace(smoke(), image_size=16)),
            ["image_size (8 -> 16)", "1 field changed"],
        ),
        (
            lambda: TinyBenchmark(dataclasses.replace(smoke(), learning_rate=0.1, max_epochs=3)),
            ["learning_rate (0.05 -> 0.1)", "max_epochs (2 -> 3)"],
        ),
    ],
)
def test_a_run_that_cannot_start_leaves_the_folder_as_it_was(make, needles, finished_run, tmp_path):
    model_dir = _copy(finished_run, tmp_path)
    before = file_tree(model_dir)
    with pytest.raises(UserError) as raised:
        _run(make(), model_dir, max_train_steps=4)
    message = str(raised.value)
    assert "\n" not in message
    for needle in needles:
        assert needle in message, message
    assert file_tree(model_dir) == before


def test_a_legacy_folder_without_a_record_is_judged_by_its_log(finished_run, tmp_path):
    model_dir = _copy(finished_run, tmp_path)
    os.remove(model_dir / runrecord.RECORD_NAME)
    before = file_tree(model_dir)
    with pytest.raises(UserError, match="MLPerf benchmark 'resnet'.*'ssd'"):
        _run(OtherTiny(smoke()), model_dir, max_train_steps=4)
    assert file_tree(model_dir) == before


def test_unreadable_checkpoints_refuse_the_start_before_the_log_moves(finished_run, tmp_path):
    model_dir = _copy(finished_run, tmp_path)
    for name in os.listdir(model_dir / "ckpt"):
        if name.endswith(".index"):
            (model_dir / "ckpt" / name).write_bytes(b"not an index")
    before = file_tree(model_dir)
    with pytest.raises(checkpoints.CheckpointError, match="no checkpoint .* can be read"):
        _run(TinyBenchmark(smoke()), model_dir, max_train_steps=4)
    assert file_tree(model_dir) == before


def test_the_same_run_resumes_and_restart_starts_another(finished_run, tmp_path):
    model_dir = _copy(finished_run, tmp_path)
    record = json.loads((model_dir / runrecord.RECORD_NAME).read_text())
    assert record["benchmark"] == "tiny" and record["preset"] == "smoke"
    assert record["config"]["image_size"] == 8
    result = _run(TinyBenchmark(smoke()), model_dir, max_train_steps=4)  # a longer budget
    assert result.steps == 4
    assert runlog.finished(str(model_dir / "mlperf_log.txt")).step == 4
    _run(OtherTiny(smoke()), model_dir, max_train_steps=2, restart=True)
    assert json.loads((model_dir / runrecord.RECORD_NAME).read_text())["benchmark"] == "other_tiny"
    assert (model_dir / "ckpt.1").is_dir() and (model_dir / "mlperf_log.txt.1").is_file()
