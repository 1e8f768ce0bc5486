"""Bad input to every `mlperf-tf` command is one `error:` line naming the flag, exit 2 (issue 31).

A table of cases per command: each feeds one flag (or config value, or system-file field) one
class of bad value (nan, inf, 0, negative, absurdly large, not a number, a wrong path) and asserts:
exit code 2, exactly one `error:` line that names the flag, no traceback, and no file created or
changed under the test's folder (the command runs with that folder as its working directory).

The commands run in this process (`cli.main`); the function that would start the real work of
each command (training, the sweep's cells, the data service, a conversion) is replaced by one
that fails the test, so a value that slips through validation is a failure, not a long run.
"""

from __future__ import annotations

import json
import os

import pytest

from mlperf_tf import cli

# The classes of bad numbers; each flag gets the ones that are wrong for it.
NAN, INF, NEG_INF, NEG, HUGE_INT, HUGE, TEXT = (
    "nan",
    "inf",
    "-inf",
    "-1",
    "99999999999",
    "1e30",
    "x",
)


class _WorkStartedError(AssertionError):
    """Raised where a command would start its real work: validation let a bad value through."""


def _started(*args, **kwargs):
    raise _WorkStartedError("the command started its work with a bad value")


def _cases(prefix, flags, base=()):
    """[(argv, needle)] for `--flag=value` of every (flag, values) in `flags`."""
    out = []
    for flag, values in flags.items():
        for value in values:
            out.append(([*base, f"{prefix}{flag}={value}"], flag.rsplit(".", 1)[-1]))
    return out


# ---- run -----------------------------------------------------------------------------------------
RUN_BASE = ("run", "--benchmark=resnet50", "--preset=smoke", "--model_dir={tmp}/m")
RUN_FLAGS = {
    "steps_per_loop": ["0", NEG, NAN, INF, HUGE_INT, TEXT],
    "checkpoint_every_loops": [NEG, NAN, HUGE_INT],
    "checkpoint_every_minutes": [NEG, NAN, INF, HUGE],
    "max_checkpoints": ["0", NEG, HUGE_INT],
    "seed": [NEG, HUGE_INT, NAN],
    "max_train_steps": [NEG, HUGE_INT, "1.5"],
    "data_service_timeout_s": [NEG, NAN, INF, HUGE],
    "startup_timeout_s": ["0", NEG, NAN, INF, HUGE],
    "collective_timeout": [NEG, NAN, INF, HUGE],
    "pack_mb": [NEG, NAN, INF, HUGE],
    "slurm_port_base": ["0", NEG, "70000"],
    "model_parallel": ["0", NEG, HUGE_INT],
    "expert_parallel": ["0", NEG, HUGE_INT],
    "num_cpu_devices": [NEG, "100000", HUGE_INT],
    "spatial_partition": ["0", NEG, NAN, "2x0", "x"],
    "mesh": ["0x2", "axb", NAN],
    "ruleset": ["9.9.9", "x"],
}
RUN_CONFIG = {
    "global_batch_size": ["0", NEG, NAN, HUGE_INT],
    "eval_batch_size": ["0", NEG, HUGE_INT],
    "train_examples": ["0", NEG],
    "gradient_accumulation_steps": ["0", NEG],
    "max_epochs": ["0", NEG, NAN, INF, HUGE],
    "eval_every_epochs": ["0", NEG, NAN, INF],
    "quality_target": [NAN, INF, NEG_INF],
    "gradient_clip_norm": [NEG, NAN, INF],
    "optimizer.lars_opt_base_learning_rate": ["0", NEG, NAN, INF],
    "optimizer.lars_opt_momentum": [NEG, "1.5", NAN],
}
RUN_CASES = (
    _cases("--", RUN_FLAGS, RUN_BASE)
    + _cases("--config.", RUN_CONFIG, RUN_BASE)
    + [
        # Settings with no effect in the chosen mode.
        ([*RUN_BASE, "--mesh=2x2"], "--mesh"),
        ([*RUN_BASE, "--tpu=node", "--distribution=mirrored"], "--tpu"),
        ([*RUN_BASE, "--slurm_port_base=9000", "--cluster_resolver=kubernetes"], "slurm_port"),
        ([*RUN_BASE, "--data_service_timeout_s=5"], "--data_service_timeout_s"),
        ([*RUN_BASE, "--num_cpu_devices=2", "--distribution=one_device"], "--num_cpu_devices"),
        ([*RUN_BASE, "--cluster_resolver=tf_config"], "TF_CONFIG"),
        ([*RUN_BASE, "--model_parallel=2"], "--model_parallel"),
        ([*RUN_BASE, "--expert_parallel=2"], "--expert_parallel"),
        (["run", "--benchmark=bert", "--model_dir={tmp}/m", "--spatial_partition=2"], "spatial"),
        # Paths.
        ([*RUN_BASE, "--mlperf_log={tmp}/afile/log.txt"], "mlperf_log"),
        ([*RUN_BASE, "--mlperf_log={tmp}/afile"], "mlperf_log"),
        ([*RUN_BASE[:3], "--model_dir={tmp}/afile"], "model_dir"),
        ([*RUN_BASE, "--data_dir={tmp}/afile"], "afile"),
        ([*RUN_BASE, "--config.optimizer.opt_name=kfac", "--submission_division=closed"], "kfac"),
    ]
)


# ---- bench ---------------------------------------------------------------------------------------
BENCH_BASE = ("bench", "--benchmark=resnet50", "--preset=smoke")
BENCH_FLAGS = {
    "warmup_steps": ["0", NEG, NAN, HUGE_INT],
    "windows": ["0", NEG, NAN, HUGE_INT],
    "steps_per_window": ["0", NEG, HUGE_INT],
    "input_batches": ["0", NEG, HUGE_INT],
    "peak_seconds": [NEG, NAN, INF, HUGE],
    "num_cpu_devices": [NEG, "100000"],
    "startup_timeout_s": ["0", NAN, INF],
    "seed": [NEG],
}
BENCH_CASES = (
    _cases("--", BENCH_FLAGS, BENCH_BASE)
    + _cases("--config.", {"global_batch_size": ["0", NEG], "max_epochs": [NAN]}, BENCH_BASE)
    + [
        (["bench", "--benchmark=resnet50", "--preset=nosuch"], "nosuch"),
        ([*BENCH_BASE, "--distribution=multi_worker"], "TF_CONFIG"),
        ([*BENCH_BASE, "--cluster_resolver=slurm"], "cluster_resolver"),
    ]
)

# ---- sweep ---------------------------------------------------------------------------------------
SWEEP_BASE = ("sweep", "--benchmark=resnet50", "--preset=smoke", "--out={tmp}/sweep")
SWEEP_CASES = _cases(
    "--",
    {
        "batch_sizes": ["0", NEG, NAN, TEXT, HUGE_INT],
        "seeds": [NEG, NAN, TEXT],
        "epochs": [NEG, NAN, INF, HUGE],
        "target": [NAN, INF],
    },
    SWEEP_BASE,
) + [
    ([*SWEEP_BASE, "--run.steps_per_loop=0"], "steps_per_loop"),
    ([*SWEEP_BASE, "--run.checkpoint_every_minutes=nan"], "checkpoint_every_minutes"),
    ([*SWEEP_BASE, "--config.global_batch_size=0"], "global_batch_size"),
    ([*SWEEP_BASE[:3], "--out={tmp}/afile"], "--out"),
]

# ---- simulate ------------------------------------------------------------------------------------
SIM_BASE = ("simulate", "--benchmark=resnet50", "--system=tpu-v3", "--chips=256")
SIM_CASES = _cases(
    "--",
    {
        "chips": ["0", NEG, NAN, TEXT, "256,0", HUGE_INT],
        "global_batch": ["0", NEG, NAN, HUGE_INT],
        "failed_chips": [NEG, NAN, "256"],
        "epochs": ["0", NEG, NAN, INF, HUGE],
    },
    SIM_BASE,
) + [
    ([*SIM_BASE, "--plot={tmp}/plot.txt"], "--plot"),
    ([*SIM_BASE, "--plot={tmp}/afile/plot.png"], "--plot"),
    ([*SIM_BASE, "--plot={tmp}"], "--plot"),
    ([*SIM_BASE, "--system=nosuch"], "nosuch"),
]

# Fields of a system file, each given bad values: one line naming the field.
SYSTEM_FIELDS = {
    "peak_flops": [0, -1, "nan", "fast", None],
    "memory_bandwidth": [0, -1, "nan"],
    "compute_efficiency.default": [0, -0.5, 1.5, "nan"],
    "link.bandwidth": [0, -1, "nan", "x"],
    "link.alpha": [-1, "nan"],
    "chips_per_host": [0, -1, 1.5, "x"],
    "gradient_bytes": [0, -1, "nan"],
    "optimizer_bytes_per_parameter": [-1, "nan"],
    "overlap_fraction": [-0.1, 1.5, "nan"],
    "step_overhead_s": [-1, "nan", "inf"],
    "eval_overhead_s": [-1, "nan"],
    "input_samples_per_s_per_host.resnet50": [0, -1, "nan"],
    "per_chip_batch.resnet50": [0, -1, 1.5],
    "topology.max_shape": [[0, 32], [-1, 32], "x"],
    "topology.min_chips": [0, -1],
}


def _system_file_cases():
    out = []
    for key, values in SYSTEM_FIELDS.items():
        for value in values:
            out.append((("system_field", key, value), key.split(".")[-1]))
    out.append((("system_bytes", b"\x00\xff\xfe binary"), "system"))
    out.append((("system_bytes", b'{"name": "x", "peak_flops": 1'), "system"))
    out.append((("system_bytes", b""), "system"))
    return out


# ---- check / score / report ----------------------------------------------------------------------
CHECK_CASES = [
    (["check", "{tmp}/nosuch.txt"], "does not exist"),
    (["check", "{tmp}/log.txt", "--jobs=0"], "jobs"),
    (["check", "{tmp}/log.txt", "--jobs=-1"], "jobs"),
    (["check", "{tmp}/log.txt", "--jobs=nan"], "jobs"),
    (["check", "{tmp}/log.txt", "--timeout=0"], "timeout"),
    (["check", "{tmp}/log.txt", "--timeout=-1"], "timeout"),
    (["check", "{tmp}/log.txt", "--timeout=nan"], "timeout"),
    (["check", "{tmp}/log.txt", "--timeout=inf"], "timeout"),
    (["check", "{tmp}/log.txt", "--ruleset=9.9.9"], "9.9.9"),
    (["check", "{tmp}/log.txt", "--quality=sometimes"], "quality"),
    (["check", "{tmp}/log.txt", "--timeout=1e30"], "timeout"),
    (["check", "{tmp}/log.txt", "--jobs=99999999999"], "jobs"),
    (["check", "{tmp}/log.txt", "--max-log-mb=0"], "max-log-mb"),
    (["check", "{tmp}/log.txt", "--max-line-kb=nan"], "max-line-kb"),
    (["score", "{tmp}/nosuch", "--jobs=0"], "jobs"),
]
SCORE_CASES = [
    (["score", "{tmp}/nosuch"], "does not exist"),
    (["score", "{tmp}/afile"], "afile"),
]
REPORT_CASES = [
    (["report", "{tmp}/empty.txt", "--out", "{tmp}/r"], "empty.txt"),
    (["report", "{tmp}/binary.txt", "--out", "{tmp}/r"], "binary.txt"),
    (["report", "{tmp}/nosuch.txt", "--out", "{tmp}/r"], "does not exist"),
    (["report", "{tmp}/log.txt", "--out", "{tmp}/afile"], "afile"),
]

# ---- prepare -------------------------------------------------------------------------------------
PREP = ("prepare", "resnet50", "--out_dir={tmp}/data", "--raw_dir={tmp}/raw")
TEXTS = ("prepare", "transformer", "--out_dir={tmp}/data", *(
    f"--{name}={{tmp}}/afile" for name in ("train_source", "train_target", "eval_source",
                                           "eval_target")))  # fmt: skip
BERT = ("prepare", "bert", "--out_dir={tmp}/data", "--input_file={tmp}/afile")
SSD = ("prepare", "ssd", "--out_dir={tmp}/data", "--coco_dir={tmp}/raw")
PREPARE_CASES = (
    _cases("--", {"train_shards": ["0", NEG, NAN, HUGE_INT], "eval_shards": ["0", NEG]}, PREP)
    + _cases("--", {"num_workers": ["0", NEG, HUGE_INT]}, PREP)
    + [
        (["prepare", "resnet50", "--out_dir={tmp}/afile", "--raw_dir={tmp}/raw"], "afile"),
        (["prepare", "resnet50", "--out_dir={tmp}/afile/sub", "--raw_dir={tmp}/raw"], "afile"),
        ([*TEXTS, "--vocab_size=0"], "vocab_size"),
        ([*TEXTS, "--vocab_size=-5"], "vocab_size"),
        ([*TEXTS, "--vocab_size=nan"], "vocab_size"),
        ([*TEXTS, "--num_train_shards=0"], "num_train_shards"),
        ([*TEXTS, "--num_train_shards=99999999999"], "num_train_shards"),
        ([*BERT, "--num_shards=0"], "num_shards"),
        ([*BERT, "--num_shards=-1"], "num_shards"),
        ([*BERT, "--vocab_size=0"], "vocab_size"),
        ([*SSD, "--num_workers=0"], "num_workers"),
        ([*SSD, "--num_workers=-3"], "num_workers"),
    ]
)

# ---- data-service --------------------------------------------------------------------------------
DATA_SERVICE_CASES = _cases(
    "--",
    {
        "port": [NEG, "70000", NAN, TEXT],
        "workers": [NEG, NAN, "100000"],
        "worker_timeout_s": [NEG, NAN, INF, HUGE],
        "dispatcher": ["localhost", "grpc://", "grpc://host:notaport"],
    },
    ("data-service",),
)

ALL = {
    "run": RUN_CASES,
    "bench": BENCH_CASES,
    "sweep": SWEEP_CASES,
    "simulate": SIM_CASES + _system_file_cases(),
    "check": CHECK_CASES,
    "score": SCORE_CASES,
    "report": REPORT_CASES,
    "prepare": PREPARE_CASES,
    "data-service": DATA_SERVICE_CASES,
}


def _tree(root):
    found = {}
    for folder, dirs, files in os.walk(root):
        for name in dirs + files:
            path = os.path.join(folder, name)
            stat = os.lstat(path)
            found[os.path.relpath(path, root)] = (stat.st_size, stat.st_mtime_ns)
    return found


_LOG = (
    ':::MLLOG {"namespace": "", "time_ms": 1, "event_type": "POINT_IN_TIME", "key": '
    '"submission_benchmark", "value": "resnet", "metadata": {"file": "x.py", "lineno": 1}}\n'
)


def _system_file(tmp, case):
    kind = case[0]
    path = os.path.join(tmp, "system.json")
    if kind == "system_bytes":
        with open(path, "wb") as f:
            f.write(case[1])
        return path
    here = os.path.dirname(os.path.abspath(cli.__file__))
    with open(os.path.join(here, "simulate", "systems", "tpu-v3.json"), encoding="utf-8") as f:
        data = json.load(f)
    _, key, value = case
    owner = data
    *parents, name = key.split(".")
    for part in parents:
        owner = owner[part]
    owner[name] = value
    with open(path, "w", encoding="utf-8") as f:
        f.write(json.dumps(data).replace('"nan"', "NaN").replace('"inf"', "Infinity"))
    return path


def _params():
    for command, cases in ALL.items():
        for index, (argv, needle) in enumerate(cases):
            yield pytest.param(command, argv, needle, id=f"{command}-{index}")


@pytest.mark.parametrize("command, argv, needle", list(_params()))
def test_bad_input_is_one_error_line_naming_the_flag(
    command, argv, needle, tmp_path, monkeypatch, capsys
):
    tmp = str(tmp_path)
    (tmp_path / "afile").write_text("a file, not a folder\n")
    (tmp_path / "log.txt").write_text(_LOG)
    (tmp_path / "empty.txt").write_text("")
    (tmp_path / "binary.txt").write_bytes(bytes(range(256)) * 4)
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("TF_CONFIG", raising=False)
    _stub_work(monkeypatch)
    if isinstance(argv, tuple):  # a system file case
        argv = [*SIM_BASE[:2], f"--system_file={_system_file(tmp, argv)}", "--chips=256"]
    argv = [arg.replace("{tmp}", tmp) for arg in argv]
    needle = needle.replace("{tmp}", tmp)
    before = _tree(tmp)
    try:
        code = cli.main(argv)
    except SystemExit as e:  # argparse's own exit: usage text, not one line
        code = e.code
    err = capsys.readouterr().err
    assert "Traceback" not in err, err
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert code == 2, f"exit {code}: {err}"
    assert len(errors) == 1, err
    assert needle in errors[0], errors[0]
    assert len(errors[0]) < 600, "one line, not a dump"
    assert _tree(tmp) == before, "a file was created or changed"


def _stub_work(monkeypatch):
    """Every command's real work fails the test: bad input must be refused before it."""
    import mlperf_tf.bench
    import mlperf_tf.data.service
    import mlperf_tf.runner
    import mlperf_tf.sweep

    monkeypatch.setattr(mlperf_tf.runner, "run", _started)
    monkeypatch.setattr(mlperf_tf.bench, "run", _started)
    monkeypatch.setattr(mlperf_tf.sweep, "_prepare_data", _started)
    monkeypatch.setattr(mlperf_tf.data.service, "serve", _started)
    for name in ("resnet50", "transformer", "bert", "ssd"):
        module = __import__(f"benchmarks.{name}.prepare", fromlist=["prepare"])
        for work in ("prepare_imagenet", "prepare_coco", "prepare_parallel_text", "prepare",
                     "prepare_mini"):  # fmt: skip
            if hasattr(module, work):
                monkeypatch.setattr(module, work, _started)


def test_every_command_has_cases():
    counts = {command: len(cases) for command, cases in ALL.items()}
    assert all(n >= 2 for n in counts.values()), counts
    assert sum(counts.values()) >= 250, counts
