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
from tests.processes import deadline, file_tree
from tests.refusals import the_error_line

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
    for part in parents:  # a per-benchmark table the built-in file lacks is a user's override
        owner = owner.setdefault(part, {})
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
    (tmp_path / "raw").mkdir()  # an input folder that exists: the flag under test is the error
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("TF_CONFIG", raising=False)
    _stub_work(monkeypatch)
    if isinstance(argv, tuple):  # a system file case
        argv = [*SIM_BASE[:2], f"--system_file={_system_file(tmp, argv)}", "--chips=256"]
    argv = [arg.replace("{tmp}", tmp) for arg in argv]
    needle = needle.replace("{tmp}", tmp)
    before = file_tree(tmp)
    try:
        code = cli.main(argv)
    except SystemExit as e:  # argparse's own exit: usage text, not one line
        code = e.code
    line = the_error_line(capsys.readouterr().err, code, 2)
    assert needle in line, line
    assert len(line) < 600, "one line, not a dump"
    assert file_tree(tmp) == before, "a file was created or changed"


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


# ==== property-based fuzzing (issue 43, item 6) ==================================================
# Hypothesis draws, per command, a flag and a value that is wrong for it (a number out of its
# range or not a number, a choice that is none, a list with an empty element, a duplicate, spaces
# or a wrong type, a path no one can write or an input that is not a regular file) and asserts the
# same contract as the table above. The commands run in this process with their work stubbed, so
# an example costs milliseconds; the default run stays within about a minute, `-m slow` runs more.
import contextlib  # noqa: E402
import dataclasses  # noqa: E402
import io  # noqa: E402
import math  # noqa: E402
import tempfile  # noqa: E402
import typing  # noqa: E402

from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from mlperf_tf import config as config_lib  # noqa: E402
from mlperf_tf import console  # noqa: E402
from mlperf_tf.runner import config as run_config_lib  # noqa: E402

FUZZ_EXAMPLES = int(os.environ.get("MLPERF_TF_FUZZ_EXAMPLES", "0")) or None
_SETTINGS = dict(
    deadline=None,
    derandomize=True,  # the default suite is reproducible; `-m slow` explores more
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
# Words that are no number, boolean or choice anywhere in the suite (letters only, so never a
# number; "inf"/"nan" and bool words are drawn where they are wrong, never by accident).
_RESERVED = {"inf", "nan", "infinity", "true", "false", "yes", "no", "t", "f", "y", "n", "none",
             "null", "on", "off", "auto"}  # fmt: skip
WORDS = st.text(alphabet="abcdeghjkmpqrsuvwxz", min_size=1, max_size=8).filter(
    lambda w: w.lower() not in _RESERVED
)
NOT_FINITE = st.sampled_from(["nan", "inf", "-inf", "NaN", "Infinity"])

# Paths that no one can write (root included), and inputs that are no regular file.
BAD_OUTPUTS = st.sampled_from(
    ["/proc/x", "/sys/x", "/proc/x/y", "{tmp}/afile/x", "{tmp}/afile/x/y", "/dev/null/x"]
)
BAD_INPUTS = st.sampled_from(
    ["{tmp}/fifo", "/dev/zero", "/dev/null", "{tmp}/nosuch", "{tmp}/afile/x", "/proc/self/nosuch"]
)


def bad_int(low: int | None = 0, high: int | None = 2**31 - 1) -> st.SearchStrategy[str]:
    """Texts that are no integer in [low, high]."""
    options = [WORDS, NOT_FINITE, st.sampled_from(["1.5", "2e", "--1", "1,2", ""])]
    if low is not None:
        options.append(st.integers(max_value=low - 1, min_value=low - 10**12).map(str))
    if high is not None:
        options.append(st.integers(min_value=high + 1, max_value=high + 10**30).map(str))
    return st.one_of(*options)


def bad_float(low: float | None = 0.0, high: float | None = 1e9, *, low_open=False):
    """Texts that are no finite number in [low, high] (`low_open`: low itself is wrong too)."""
    options = [WORDS, NOT_FINITE, st.sampled_from(["1..5", "e3", ""])]
    if low is not None:
        below = st.floats(max_value=low, exclude_max=not low_open, allow_nan=False)
        options.append(below.filter(math.isfinite).map(repr))
    if high is not None:
        above = st.floats(min_value=high, exclude_min=True, allow_nan=False, allow_infinity=False)
        options.append(above.map(repr))
    return st.one_of(*options)


def bad_choice(choices) -> st.SearchStrategy[str]:
    return WORDS.filter(lambda w: w not in choices)


def bad_list(good: st.SearchStrategy[str], *, wrong_type=WORDS) -> st.SearchStrategy[str]:
    """A comma list of `good` elements with one fault: an empty element, a duplicate, spaces
    around an element, or an element of the wrong type."""
    items = st.lists(good, min_size=1, max_size=4, unique=True)

    def corrupt(args):
        values, fault, at, wrong = args
        at %= len(values) + 1
        if fault == "empty":
            values = [*values[:at], "", *values[at:]]
        elif fault == "duplicate":
            values = [*values, values[at % len(values)]]
        elif fault == "spaces":
            i = at % len(values)
            values = [*values[:i], f" {values[i]}", *values[i + 1 :]]
        else:
            values = [*values[:at], wrong, *values[at:]]
        return ",".join(values)

    faults = st.sampled_from(["empty", "duplicate", "spaces", "type"])
    return st.tuples(items, faults, st.integers(0, 8), wrong_type).map(corrupt)


POSITIVE_INTS = st.integers(1, 4096).map(str)


# ---- each command's flags and their bad values -------------------------------------------------------
def _run_flags() -> dict[str, st.SearchStrategy[str]]:
    flags = {}
    hints = typing.get_type_hints(run_config_lib.RunConfig)
    for field in dataclasses.fields(run_config_lib.RunConfig):
        name, kind = field.name, hints[field.name]
        choices = field.metadata.get("choices")
        if choices:
            flags[name] = bad_choice(choices)
        elif name in run_config_lib._BOUNDS:
            low = 1 if name in run_config_lib._POSITIVE else 0
            high = run_config_lib._BOUNDS[name]
            flags[name] = (
                bad_int(low, int(high)) if kind is int else bad_float(0.0, high, low_open=low == 1)
            )
        elif kind is bool:
            flags[name] = WORDS
    flags["model_dir"] = BAD_OUTPUTS
    flags["mlperf_log"] = BAD_OUTPUTS
    flags["mesh"] = st.one_of(WORDS, st.sampled_from(["0x2", "2x", "x2", "2x2x2", "-1x1"]))
    flags["spatial_partition"] = st.one_of(WORDS, st.sampled_from(["0", "-1", "2x0", "1.5"]))
    flags["ruleset"] = st.one_of(WORDS, st.sampled_from(["9.9.9", "1.0", "0.0.0"]))
    return flags


BENCH_SETTINGS_BAD = {
    "warmup_steps": bad_int(1, 10**6),
    "windows": bad_int(1, 10**6),
    "steps_per_window": bad_int(1, 10**6),
    "input_batches": bad_int(1, 10**6),
    "peak_seconds": bad_float(0.0, 1e6),
    "num_cpu_devices": bad_int(0, 1 << 20),
    "startup_timeout_s": bad_float(0.0, 366 * 24 * 3600.0, low_open=True),
    "seed": bad_int(0, 2**31 - 1),
    "distribution": bad_choice(("auto", "one_device", "mirrored", "multi_worker", "tpu")),
    "dtype": bad_choice(("fp32", "bf16", "fp16", "mixed_bfloat16", "mixed_float16")),
}

SWEEP_FLAGS = {
    "batch_sizes": bad_list(POSITIVE_INTS),
    "seeds": bad_list(st.integers(0, 99).map(str)),
    "optimizers": bad_list(
        st.sampled_from(["sgd", "lars", "adamw", "lamb"]), wrong_type=st.just("")
    ),
    "grid.max_epochs": bad_list(st.integers(1, 9).map(str)),
    "epochs": bad_float(0.0, config_lib.MAX_NUMBER),
    "target": NOT_FINITE,
    "budget": bad_choice(("epochs", "target")),
    "out": BAD_OUTPUTS,
    "run.steps_per_loop": bad_int(1, 2**31 - 1),
}

SIM_FLAGS = {
    # Whole nodes of 8 (a100-dgx): a list is refused for its fault, not for its chip counts.
    "chips": st.one_of(
        bad_list(st.integers(1, 512).map(lambda k: str(8 * k))),
        st.integers(max_value=0, min_value=-(10**6)).map(str),
        st.integers(min_value=(1 << 24) + 1, max_value=10**30).map(str),
        WORDS,
        NOT_FINITE,
    ),
    "global_batch": bad_int(1, 2**31 - 1),
    "failed_chips": st.one_of(WORDS, st.integers(-(10**6), -1).map(str)),
    "epochs": bad_float(0.0, 1e6, low_open=True),
    "model_parallel": bad_int(1, 1 << 20),
    "expert_parallel": bad_int(1, 1 << 20),
    "spatial_partition": st.one_of(WORDS, st.sampled_from(["0", "-1", "2x0"])),
    "all_reduce": bad_choice(("ring", "hierarchical", "torus2d")),
    "wraparound": bad_choice(("auto", "on", "off")),
    "plot": BAD_OUTPUTS.map(lambda p: p + ".png"),
    "system_file": BAD_INPUTS,
}

CHECK_FLAGS = {
    "jobs": bad_int(1, 1024),
    "timeout": bad_float(0.0, 1e9, low_open=True),
    "max-log-mb": bad_float(0.0, 1e9, low_open=True),
    "max-line-kb": bad_float(0.0, 1e9, low_open=True),
    "quality": bad_choice(("enforce", "skip")),
    "ruleset": st.one_of(WORDS, st.sampled_from(["9.9.9", "0.0.0"])),
}

DATA_SERVICE_FLAGS = {
    "port": bad_int(0, 65535),
    "workers": bad_int(0, 1024),
    "worker_timeout_s": bad_float(0.0, 366 * 24 * 3600.0),
    "dispatcher": st.one_of(WORDS, st.sampled_from(["grpc://", "grpc://h:x", "grpc://h:-1"])),
}

PREPARE_FLAGS = {
    "train_shards": bad_int(1, 10**6),
    "eval_shards": bad_int(1, 10**6),
    "num_workers": bad_int(1, 1024),
    "out_dir": BAD_OUTPUTS,
    "raw_dir": st.sampled_from(["{tmp}/afile", "{tmp}/nosuch", "/proc/self/nosuch"]),
    "val_labels": BAD_INPUTS,
    "bbox_csv": BAD_INPUTS,
}

# command -> (base argv, {flag: bad values}, how the flag is written)
COMMANDS = {
    "run": (("run", "--benchmark=resnet50", "--preset=smoke", "--model_dir={tmp}/m"), _run_flags()),
    "bench": (("bench", "--benchmark=resnet50", "--preset=smoke"), BENCH_SETTINGS_BAD),
    "sweep": (("sweep", "--benchmark=resnet50", "--preset=smoke", "--out={tmp}/s"), SWEEP_FLAGS),
    "simulate": (("simulate", "--benchmark=resnet50", "--system=a100-dgx", "--chips=8"), SIM_FLAGS),
    "check": (("check", "{tmp}/log.txt"), CHECK_FLAGS),
    "score": (("score", "{tmp}/runs"), {k: CHECK_FLAGS[k] for k in ("jobs", "timeout")}),
    "report": (("report", "{tmp}/log.txt", "--out={tmp}/r"), {**CHECK_FLAGS, "out": BAD_OUTPUTS}),
    "prepare": (("prepare", "resnet50", "--out_dir={tmp}/d", "--raw_dir={tmp}/raw"), PREPARE_FLAGS),
    "data-service": (("data-service",), DATA_SERVICE_FLAGS),
}
# Examples per command in the default run: about 25 s in all on an idle 2-core machine (each
# example is a command run in this process with its work stubbed; `-m slow` runs 10x as many).
EXAMPLES = {"run": 150, "bench": 60, "sweep": 80, "simulate": 150, "check": 50, "score": 30,
            "report": 50, "prepare": 60, "data-service": 40, "config": 250}  # fmt: skip


def _flag_case(command):
    base, flags = COMMANDS[command]
    names = sorted(flags)
    return st.sampled_from(names).flatmap(
        lambda name: flags[name].map(
            lambda value: ([*base, f"--{name}={value}"], name.rsplit(".", 1)[-1])
        )
    )


# ---- `--config.KEY=VALUE` of every benchmark -------------------------------------------------------
_BOOL_WORDS = {"true", "false", "1", "0", "yes", "no"}


def _bad_for_type(annotation) -> st.SearchStrategy[str] | None:
    """Values that are the wrong type for a config field of `annotation` (None: any text fits)."""
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is typing.Literal:
        return bad_choice({str(a) for a in args})
    if origin is tuple:
        item = args[0] if args else str
        if item in (int, float):
            return bad_list(st.integers(1, 9).map(str)).filter(lambda t: ",," in t or "x" in t)
        return None
    if annotation is bool:
        return WORDS.filter(lambda w: w.lower() not in _BOOL_WORDS)
    if annotation is int:
        return st.one_of(WORDS, st.sampled_from(["1.5", "nan", "inf", "1e3", ""]))
    if annotation is float:
        return st.one_of(WORDS, NOT_FINITE, st.sampled_from(["1..5", ""]))
    return None


def _config_cases() -> list[tuple[str, str, st.SearchStrategy[str]]]:
    """(benchmark, key, bad values) for every typed config field of every benchmark's smoke preset."""
    from mlperf_tf import registry

    cases = []
    for name in sorted(os.listdir(os.path.join(os.path.dirname(cli.__file__), "..", "benchmarks"))):
        if name.startswith(("_", ".")) or name not in registry.available():
            continue
        config = registry.get(name).preset("smoke")
        for key in config_lib.field_paths(config):
            owner = config
            *parents, leaf = key.split(".")
            for part in parents:
                owner = getattr(owner, part)
            bad = _bad_for_type(typing.get_type_hints(type(owner)).get(leaf))
            if bad is not None:
                cases.append((name, key, bad))
    return cases


CONFIG_CASES = _config_cases()


def _config_case():
    return st.sampled_from(range(len(CONFIG_CASES))).flatmap(
        lambda i: CONFIG_CASES[i][2].map(
            lambda value: (
                [
                    "run",
                    f"--benchmark={CONFIG_CASES[i][0]}",
                    "--preset=smoke",
                    "--model_dir={tmp}/m",
                    f"--config.{CONFIG_CASES[i][1]}={value}",
                ],  # fmt: skip
                CONFIG_CASES[i][1].rsplit(".", 1)[-1],
            )
        )
    )


# ---- the property ------------------------------------------------------------------------------------
def _fuzz_folder(root):
    os.makedirs(os.path.join(root, "runs"))
    os.makedirs(os.path.join(root, "raw"))
    with open(os.path.join(root, "runs", "result_0.txt"), "w") as f:
        f.write(_LOG)
    with open(os.path.join(root, "afile"), "w") as f:
        f.write("a file, not a folder\n")
    with open(os.path.join(root, "log.txt"), "w") as f:
        f.write(_LOG)
    os.mkfifo(os.path.join(root, "fifo"))


def check_one_error(argv, needle, monkeypatch):
    """Runs `argv` in this process: exit 2, one `error:` line naming `needle`, no traceback, nothing
    changed in its folder (the working directory) or outside it."""
    with tempfile.TemporaryDirectory() as tmp:
        _fuzz_folder(tmp)
        argv = [arg.replace("{tmp}", tmp) for arg in argv]
        before = file_tree(tmp)
        err = io.StringIO()
        with monkeypatch.context() as patch:
            patch.chdir(tmp)
            patch.delenv("TF_CONFIG", raising=False)
            _stub_work(patch)
            # The TF start-up noise filter is a child process per command (0.2 s each); the
            # messages under test are Python's own, which `redirect_stderr` catches.
            patch.setattr(console, "quiet_stderr", lambda argv: None)
            with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
                with deadline(30):
                    try:
                        code = cli.main(argv)
                    except SystemExit as e:
                        code = e.code
        line = the_error_line(err.getvalue(), code, 2, context=f"{argv}: ")
        assert needle in line, f"{argv}: {line}"
        assert file_tree(tmp) == before, f"{argv}: a file was created or changed"
    for outside in ("/proc/x", "/sys/x"):
        assert not os.path.exists(outside)


def _fuzz_test(command, examples, *, derandomize=True):
    strategy = _config_case() if command == "config" else _flag_case(command)

    @settings(max_examples=FUZZ_EXAMPLES or examples, **{**_SETTINGS, "derandomize": derandomize})
    @given(case=strategy)
    def test(case, monkeypatch):
        argv, needle = case
        check_one_error(argv, needle, monkeypatch)

    return test


@pytest.mark.parametrize("command", sorted(EXAMPLES))
def test_fuzzed_bad_values_are_one_error_line_naming_the_flag(command, monkeypatch):
    _fuzz_test(command, EXAMPLES[command])(monkeypatch=monkeypatch)


@pytest.mark.slow
@pytest.mark.parametrize("command", sorted(EXAMPLES))
def test_fuzzed_bad_values_many_examples(command, monkeypatch):
    """The same property with 10x the examples, not derandomized."""
    _fuzz_test(command, EXAMPLES[command] * 10, derandomize=False)(monkeypatch=monkeypatch)


def test_the_fuzzer_covers_every_command_and_every_benchmarks_config():
    commands = set(COMMANDS) | {"config"}
    assert commands == set(EXAMPLES)
    benchmarks = {name for name, _, _ in CONFIG_CASES}
    assert {"resnet50", "ssd", "transformer", "bert", "llama31_8b"} <= benchmarks, benchmarks
    assert len(CONFIG_CASES) >= 100, len(CONFIG_CASES)
