"""Provides `mlperf-tf sweep`: a resumable grid of runs of one benchmark preset, one table, plots.

A sweep crosses optimizers x global batch sizes x any config fields (`--grid.KEY=V1,V2`) x seeds.
Each cell is one run of the suite's runner (`mlperf_tf.runner.run`) in its own process (so memory
is returned and a crash stays in its cell). When a cell ends, its row is written atomically to
`OUT/cells/<cell>/result.json`; a restarted sweep skips every cell that has one, so a killed
sweep continues where it stopped (an unfinished cell starts again from scratch). The table
(`OUT/results.csv`, `OUT/results.json`) and the plots are rewritten from those files.

The quality numbers are read back from each run's MLPerf log (`eval_accuracy` events), and the
run's end from the runner's `RunResult`. Learning rates scale with the global batch by a named
rule, stated in every row:

- `linear`: lr = base * B / B0 (Goyal et al. 2017), B0 the preset's global batch;
- `sqrt`: lr = base * sqrt(B / B0) (Krizhevsky 2014; Hoffer et al. 2017);
- `own`: lr = base, the preset's value, for optimizers that adapt the step to the batch
  themselves (LARS and LAMB scale each layer's step by its trust ratio).
"""

from __future__ import annotations

import csv
import dataclasses
import importlib
import itertools
import json
import math
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Sequence
from typing import Any

from mlperf_tf import listflags
from mlperf_tf.config import MAX_INT, MAX_NUMBER
from mlperf_tf.errors import UserError

LR_RULES = ("linear", "sqrt", "own")
BUDGETS = ("epochs", "target")
# An eval value no benchmark reaches: with a fixed epoch budget every cell trains to its end.
UNREACHABLE_TARGET = 1e9
# Config fields that can hold a base learning rate, most specific first; `{opt}` is the optimizer.
LR_FIELD_CANDIDATES = (
    "{opt}_opt_base_learning_rate",
    "opt_base_learning_rate",
    "base_learning_rate",
    "learning_rate",
)
OPT_NAME_FIELD = "opt_name"
TABLE_COLUMNS = (
    "cell",
    "benchmark",
    "preset",
    "optimizer",
    "global_batch_size",
    "grid",
    "seed",
    "lr_rule",
    "lr_field",
    "learning_rate",
    "budget",
    "max_epochs",
    "target",
    "status",
    "steps",
    "epochs",
    "final_quality",
    "best_quality",
    "steps_to_target",
    "epochs_to_target",
    "run_seconds",
    "wall_seconds",
)

USAGE = """usage: mlperf-tf sweep --benchmark=NAME --preset=P --out=DIR [options]

  --benchmark=NAME        a registered benchmark (`mlperf-tf list`) or an import path module:Class
  --preset=P              the preset every cell starts from (default: mini)
  --out=DIR               the sweep's folder (cells, results.csv/json, plots); rerun to resume
  --optimizers=A,B        values of the config's opt_name field ('' keeps the preset's)
  --batch_sizes=32,128    global batch sizes ('' keeps the preset's)
  --grid.KEY=V1,V2        a config field to sweep (dotted, as --config.KEY); repeatable
  --config.KEY=VALUE      a config override every cell gets
  --seeds=0,1             run seeds per cell (default: 0)
  --epochs=E              the epoch budget (default: the preset's max_epochs)
  --budget=epochs|target  train every cell for the whole budget (default), or stop at the target
  --target=Q              the quality that counts as reached (default: the preset's)
  --lr_rule=RULE          linear, sqrt or own, or per optimizer: sgd:linear,lars:own
  --lr_field=PATH         the config field of the base learning rate (default: found by name),
                          or per optimizer: kfac:optimizer.lars_opt_base_learning_rate,...
  --opt.NAME.KEY=VALUE    a config override for optimizer NAME's cells only (its base LR, ...)
  --run.KEY=VALUE         a `mlperf-tf run` flag for every cell, e.g. --run.num_cpu_devices=4
  --plots=true|false      write the PNGs (default: true)
"""


class CellFailedError(UserError):
    """A cell's run ended without a result (a crash, a kill, a bad override found late)."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class SweepSpec:
    """What one sweep runs; saved as `OUT/sweep.json` so a restart can check it is the same sweep.

    Attributes:
      benchmark: registered name or `module:Class`.
      preset: the preset every cell starts from.
      optimizers: values of `opt_name` ("" keeps the preset's optimizer).
      batch_sizes: global batch sizes (0 keeps the preset's).
      grid: dotted config field -> the values (flag text) it takes.
      overrides: dotted config field -> value (flag text) for every cell.
      optimizer_overrides: optimizer -> {dotted field -> value} for that optimizer's cells only
        (e.g. its base learning rate or `opt_params`), applied after `overrides`.
      seeds: run seeds, one run per seed per cell.
      epochs: the epoch budget (`max_epochs`); 0 keeps the preset's.
      budget: "epochs" (train to the budget) or "target" (stop at the target).
      target: the quality that counts as reached; None means the preset's `quality_target`.
      lr_rules: optimizer -> rule ("*" for every optimizer).
      lr_fields: optimizer ("*" for any) -> dotted path of its base learning rate; an optimizer
        without one has it found by name (`LR_FIELD_CANDIDATES`).
      run_flags: `RunConfig` field -> value (flag text).
    """

    benchmark: str
    preset: str = "mini"
    optimizers: tuple[str, ...] = ("",)
    batch_sizes: tuple[int, ...] = (0,)
    grid: dict[str, tuple[str, ...]] = dataclasses.field(default_factory=dict)
    overrides: dict[str, str] = dataclasses.field(default_factory=dict)
    optimizer_overrides: dict[str, dict[str, str]] = dataclasses.field(default_factory=dict)
    seeds: tuple[int, ...] = (0,)
    epochs: float = 0.0
    budget: str = "epochs"
    target: float | None = None
    lr_rules: dict[str, str] = dataclasses.field(default_factory=lambda: {"*": "linear"})
    lr_fields: dict[str, str] = dataclasses.field(default_factory=dict)
    run_flags: dict[str, str] = dataclasses.field(default_factory=dict)

    def __post_init__(self):
        if not self.benchmark:
            raise UserError("--benchmark is required (see `mlperf-tf list`)")
        if self.budget not in BUDGETS:
            raise UserError(f"--budget={self.budget!r} is not one of {', '.join(BUDGETS)}")
        for name, rule in self.lr_rules.items():
            if rule not in LR_RULES:
                raise UserError(
                    f"--lr_rule: {name}:{rule} names no rule (rules: {', '.join(LR_RULES)})"
                )
        if self.batch_sizes != (0,) and any(not 1 <= b <= MAX_INT for b in self.batch_sizes):
            raise UserError(
                f"--batch_sizes ({','.join(map(str, self.batch_sizes))}) must be positive "
                f"integers (at most {MAX_INT})"
            )
        if any(not 0 <= s <= MAX_INT for s in self.seeds):
            raise UserError(f"--seeds ({','.join(map(str, self.seeds))}) must be in [0, {MAX_INT}]")
        if not (math.isfinite(self.epochs) and 0 <= self.epochs <= MAX_NUMBER):
            raise UserError(f"--epochs ({self.epochs}) must be positive (0: the preset's)")
        if self.target is not None and not math.isfinite(self.target):
            raise UserError(f"--target ({self.target}) must be a finite number")
        unknown = set(self.optimizer_overrides) - set(self.optimizers)
        if unknown:
            raise UserError(
                f"--opt.{sorted(unknown)[0]}.*: that optimizer is not in --optimizers "
                f"({','.join(self.optimizers)})"
            )
        if not self.seeds:
            raise UserError("--seeds must name at least one seed")
        for key in ("model_dir", "seed", "mlperf_log"):
            if key in self.run_flags:
                raise UserError(f"--run.{key} is set by the sweep per cell; drop it")

    def to_json(self) -> dict[str, Any]:
        return json.loads(json.dumps(dataclasses.asdict(self)))

    def lr_rule(self, optimizer: str) -> str:
        return self.lr_rules.get(optimizer, self.lr_rules.get("*", "linear"))


@dataclasses.dataclass(frozen=True)
class Cell:
    """One run of the grid: an optimizer, a global batch, one value per grid field, a seed."""

    optimizer: str
    batch_size: int
    grid: tuple[tuple[str, str], ...]
    seed: int

    @property
    def name(self) -> str:
        """A folder name that spells the cell out, e.g. `lars-b512-model.bn_group_size=2-s0`."""
        parts = [self.optimizer or "preset-opt", f"b{self.batch_size or 'preset'}"]
        parts += [f"{key}={value}" for key, value in self.grid]
        parts.append(f"s{self.seed}")
        return "-".join(_safe(p) for p in parts)


def _safe(text: str) -> str:
    return "".join(c if c.isalnum() or c in "._=+" else "_" for c in text)


def cells(spec: SweepSpec) -> list[Cell]:
    """The grid in run order: seed outermost, so a stopped sweep has whole rounds of the grid."""
    keys = sorted(spec.grid)
    combos = list(itertools.product(*(spec.grid[k] for k in keys)))
    out = []
    for seed in spec.seeds:
        for optimizer in spec.optimizers:
            for batch in spec.batch_sizes:
                for combo in combos:
                    out.append(Cell(optimizer, batch, tuple(zip(keys, combo)), seed))
    return out


# ---- configs -----------------------------------------------------------------------------------


def load_benchmark(name: str):
    """The Benchmark class: a registered name, or `module:Class` (e.g. a test's benchmark)."""
    if ":" in name:
        module_name, _, attr = name.partition(":")
        try:
            return getattr(importlib.import_module(module_name), attr)
        except (ImportError, AttributeError) as e:
            raise UserError(f"--benchmark={name!r} cannot be imported: {e}") from None
    from mlperf_tf import registry

    return registry.get(name)


def _find_field(paths: dict[str, Any], leaf: str) -> str | None:
    """The dotted path whose last part is `leaf` (the shortest, if several)."""
    found = sorted((p for p in paths if p.rpartition(".")[2] == leaf), key=len)
    return found[0] if found else None


def _preset(benchmark_class, preset: str):
    try:
        return benchmark_class.preset(preset)
    except KeyError as e:
        raise UserError(e.args[0]) from None


def cell_overrides(spec: SweepSpec, cell: Cell, preset_config) -> tuple[dict[str, str], dict]:
    """The config overrides (flag text) of one cell and the learning-rate facts for its row.

    Raises:
      UserError: the config has no `opt_name` field but optimizers are swept, or no base
        learning-rate field can be found for the cell's optimizer.
    """
    from mlperf_tf import config as config_lib

    paths = config_lib.field_paths(preset_config)
    overrides = dict(spec.overrides)
    overrides.update(spec.optimizer_overrides.get(cell.optimizer, {}))
    if cell.optimizer:
        opt_field = _find_field(paths, OPT_NAME_FIELD)
        if opt_field is None:
            raise UserError(
                f"--optimizers={cell.optimizer!r}: the {spec.benchmark} config has no "
                f"`{OPT_NAME_FIELD}` field"
            )
        overrides[opt_field] = cell.optimizer
    overrides.update(dict(cell.grid))
    if spec.epochs:
        overrides["max_epochs"] = repr(float(spec.epochs))
    if spec.budget == "epochs":
        higher = load_benchmark(spec.benchmark).higher_is_better
        overrides["quality_target"] = repr(UNREACHABLE_TARGET if higher else -UNREACHABLE_TARGET)
    elif spec.target is not None:
        overrides["quality_target"] = repr(float(spec.target))
    # The optimizer (possibly from a --config override) decides which field is its base LR.
    config = config_lib.override(preset_config, overrides)
    paths = config_lib.field_paths(config)
    opt_field = _find_field(paths, OPT_NAME_FIELD)
    optimizer = str(paths[opt_field]) if opt_field else (cell.optimizer or "")
    lr_field = spec.lr_fields.get(optimizer, spec.lr_fields.get("*", ""))
    if not lr_field:
        for pattern in LR_FIELD_CANDIDATES:
            lr_field = _find_field(paths, pattern.format(opt=optimizer))
            if lr_field:
                break
    if not lr_field or lr_field not in paths:
        raise UserError(
            f"no base learning-rate field for optimizer {optimizer!r} in the {spec.benchmark} "
            f"config (looked for {', '.join(p.format(opt=optimizer) for p in LR_FIELD_CANDIDATES)}"
            "); name one with --lr_field"
        )
    reference_batch = preset_config.global_batch_size
    batch = cell.batch_size or reference_batch
    rule = spec.lr_rule(optimizer)
    base_lr = float(paths[lr_field])
    factor = {"linear": batch / reference_batch, "sqrt": math.sqrt(batch / reference_batch)}
    learning_rate = base_lr * factor.get(rule, 1.0)
    if cell.batch_size:
        overrides["global_batch_size"] = str(cell.batch_size)
    overrides[lr_field] = repr(learning_rate)
    lr = {
        "optimizer": optimizer,
        "lr_rule": rule,
        "lr_field": lr_field,
        "learning_rate": learning_rate,
    }
    return overrides, lr


# ---- one cell (child process) --------------------------------------------------------------------


def run_cell(job_path: str) -> int:
    """Runs one cell described by the JSON file `job_path` (in the cell's own process).

    Writes `run_result.json` next to it: how the run ended, its steps, its eval curve.
    """
    from absl import logging as absl_logging

    from mlperf_tf import config as config_lib
    from mlperf_tf import runner

    absl_logging.set_verbosity(absl_logging.INFO)  # the runner's progress lines, in output.txt
    absl_logging.use_absl_handler()

    with open(job_path, encoding="utf-8") as f:
        job = json.load(f)
    benchmark_class = load_benchmark(job["benchmark"])
    config = config_lib.override(_preset(benchmark_class, job["preset"]), job["overrides"])
    run_config = run_config_for(job["run_flags"], model_dir=job["model_dir"], seed=job["seed"])
    started = time.time()
    result = runner.run(benchmark_class(config), run_config)
    out = {
        "cause": result.cause.value,
        "status": result.status,
        "steps": int(result.steps),
        "steps_per_epoch": config.steps_per_epoch,
        "train_examples": config.train_examples,
        "global_batch_size": config.global_batch_size,
        "max_epochs": config.max_epochs,
        "higher_is_better": benchmark_class.higher_is_better,
        # Where each logged eval ran (epoch_num may count samples: BERT, Llama).
        "eval_steps": [[p.epoch_num, p.step] for p in benchmark_class(config).eval_schedule()],
        "mlperf_log": run_config.mlperf_log_path,
        "seconds": time.time() - started,
    }
    _write_json_atomic(os.path.join(os.path.dirname(job_path), "run_result.json"), out)
    return 0


def run_config_for(run_flags: dict[str, str], *, model_dir: str, seed: int):
    """The `RunConfig` of a cell from `--run.KEY=VALUE` texts, each parsed to its field's type.

    Raises:
      UserError: a key that is no `mlperf-tf run` flag, or a value of the wrong type.
    """
    import typing

    from mlperf_tf import config as config_lib
    from mlperf_tf import runner

    kwargs = {}
    hints = typing.get_type_hints(runner.RunConfig)
    for key, text in run_flags.items():
        if key not in hints:
            raise UserError(f"--run.{key}: `mlperf-tf run` has no flag --{key}")
        kwargs[key] = config_lib.parse_value(text, hints[key], f"run.{key}")
    return runner.RunConfig(model_dir=model_dir, seed=seed, **kwargs)


# ---- reading a run back ----------------------------------------------------------------------------


def read_mlperf_log(path: str) -> list[dict[str, Any]]:
    """The events of an MLPerf log file (`:::MLLOG {json}` lines; other lines are skipped).

    Raises:
      UserError: the file is missing or a `:::MLLOG` line is not JSON.
    """
    events = []
    try:
        with open(path, encoding="utf-8") as f:
            for number, line in enumerate(f, 1):
                _, sep, payload = line.partition(":::MLLOG ")
                if not sep:
                    continue
                try:
                    events.append(json.loads(payload))
                except json.JSONDecodeError:
                    raise UserError(f"{path}:{number}: malformed MLPerf log line") from None
    except FileNotFoundError:
        raise UserError(f"MLPerf log {path!r} does not exist") from None
    return events


def summarize(run: dict[str, Any], events: list[dict[str, Any]], target: float) -> dict[str, Any]:
    """The table's numbers for one run from its `run_result.json` and its MLPerf log events.

    Epochs are counted as examples trained on / `train_examples` (steps x global batch / N), so
    a batch that does not divide the data is not rounded away; `epoch_num` in the log is the
    schedule's nominal epoch (or its samples: BERT, Llama), turned into a step by the run's
    `eval_steps` where it has them. The target is reached at or above it, or at or below it for
    a lower-is-better quality (`higher_is_better` false: Llama's log perplexity), and "best" is
    the maximum or the minimum accordingly.
    """
    steps_per_epoch = run["steps_per_epoch"]
    examples = run["global_batch_size"] / run["train_examples"]
    step_of = {float(epoch): int(step) for epoch, step in run.get("eval_steps", ())}
    higher = run.get("higher_is_better", True)
    curve = []
    for event in events:
        if event.get("key") != "eval_accuracy":
            continue
        epoch_num = float(event.get("metadata", {}).get("epoch_num", 0.0))
        step = step_of.get(epoch_num, max(1, int(round(epoch_num * steps_per_epoch))))
        curve.append({"step": step, "epoch": step * examples, "quality": float(event["value"])})
    times = {e["key"]: e["time_ms"] for e in events if e.get("key") in ("run_start", "run_stop")}
    reached = next(
        (p for p in curve if (p["quality"] >= target if higher else p["quality"] <= target)), None
    )
    qualities = [p["quality"] for p in curve]
    return {
        "status": run["cause"],
        "steps": run["steps"],
        "epochs": run["steps"] * examples,
        "final_quality": qualities[-1] if qualities else math.nan,
        "best_quality": (max if higher else min)(qualities) if qualities else math.nan,
        "steps_to_target": reached["step"] if reached else None,
        "epochs_to_target": reached["epoch"] if reached else None,
        "run_seconds": (times["run_stop"] - times["run_start"]) / 1000.0
        if len(times) == 2
        else None,
        "curve": curve,
    }


def _write_json_atomic(path: str, data: Any) -> None:
    """Writes `data` so that readers see the old file or the whole new one, never a part."""
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(data, f, indent=1, sort_keys=True)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


# ---- the sweep (parent process) ----------------------------------------------------------------


def _check_same_sweep(out: str, spec: SweepSpec) -> None:
    path = os.path.join(out, "sweep.json")
    new = spec.to_json()
    if os.path.exists(path):
        with open(path, encoding="utf-8") as f:
            old = json.load(f)
        changed = sorted(k for k in set(old) | set(new) if old.get(k) != new.get(k))
        if changed:
            raise UserError(
                f"--out={out!r} holds a different sweep (differs in {', '.join(changed)}); "
                "use another folder or the same arguments"
            )
    else:
        os.makedirs(out, exist_ok=True)
        _write_json_atomic(path, new)


def run_sweep(
    spec: SweepSpec, out: str, *, plots: bool = True, env: dict[str, str] | None = None
) -> list[dict[str, Any]]:
    """Runs every cell of `spec` that has no result in `out` yet; writes the table and plots.

    Args:
      spec: the sweep.
      out: the sweep's folder.
      plots: also write the PNGs.
      env: the environment of the cells' processes (default: this one's).

    Returns:
      The table's rows, one per finished cell, in grid order.

    Raises:
      UserError: bad arguments, or `out` holds a different sweep.
      CellFailedError: after every cell was tried, when some failed (the table has the others).
    """
    from mlperf_tf import config as config_lib

    benchmark_class = load_benchmark(spec.benchmark)
    preset_config = _preset(benchmark_class, spec.preset)
    target = spec.target if spec.target is not None else float(preset_config.quality_target)
    grid = cells(spec)
    for key, values in spec.grid.items():  # each grid value alone first: the error names its flag
        for value in values:
            try:
                config_lib.override(preset_config, {key: value})
            except UserError as e:
                raise UserError(f"--grid.{key}={value!r}: {e}") from None
    # Bad overrides and run flags fail here, before any cell runs.
    jobs = [(cell, *cell_overrides(spec, cell, preset_config)) for cell in grid]
    run_config = run_config_for(spec.run_flags, model_dir=out, seed=0)
    from mlperf_tf import paths, splits

    for cell, overrides, _ in jobs:
        try:  # a batch the cell's replicas cannot split fails here, not in the cell's run
            splits.check_run_split(config_lib.override(preset_config, overrides), run_config)
        except UserError as e:
            raise UserError(f"sweep cell {cell.name}: {e}") from None
    paths.try_output_dir(out, "--out")
    _check_same_sweep(out, spec)
    _prepare_data(benchmark_class, spec, preset_config)
    failed = []
    for number, (cell, overrides, lr) in enumerate(jobs, 1):
        cell_dir = os.path.join(out, "cells", cell.name)
        if os.path.exists(os.path.join(cell_dir, "result.json")):
            print(f"[{number}/{len(jobs)}] {cell.name}: done before, skipped", flush=True)
            continue
        print(f"[{number}/{len(jobs)}] {cell.name}: running", flush=True)
        try:
            row = _run_one(spec, cell, overrides, lr, cell_dir, target, env)
        except CellFailedError as e:
            # The other cells still run; a rerun of the sweep retries only the failed ones.
            print(f"[{number}/{len(jobs)}] {e}", flush=True)
            failed.append(cell.name)
            continue
        _write_json_atomic(os.path.join(cell_dir, "result.json"), row)
        print(
            f"[{number}/{len(jobs)}] {cell.name}: {row['status']} final={row['final_quality']:.4f}"
            f" best={row['best_quality']:.4f} ({row['wall_seconds']:.0f} s)",
            flush=True,
        )
    rows = collect(out, grid)
    write_table(out, rows)
    if plots:
        write_plots(out, rows)
    if failed:
        raise CellFailedError(
            f"{len(failed)} of {len(jobs)} cells failed ({', '.join(failed)}); the table has the "
            "others; rerun the same command to retry the failed cells"
        )
    return rows


def _prepare_data(benchmark_class, spec: SweepSpec, preset_config) -> None:
    """Writes the mini data once, before the cells (as `mlperf-tf run` would for each)."""
    data_dir = spec.overrides.get("data_dir", preset_config.data_dir)
    if spec.preset == "mini" and data_dir == benchmark_class.preset("mini").data_dir:
        if not os.path.isdir(data_dir):
            print(f"Writing the mini dataset to {data_dir} ...", flush=True)
            benchmark_class.prepare_mini(data_dir)


def _run_one(spec, cell, overrides, lr, cell_dir, target, env) -> dict[str, Any]:
    model_dir = os.path.join(cell_dir, "run")
    shutil.rmtree(model_dir, ignore_errors=True)  # an unfinished cell starts again
    os.makedirs(model_dir)
    job = {
        "benchmark": spec.benchmark,
        "preset": spec.preset,
        "overrides": overrides,
        "run_flags": {"checkpoint_every_loops": "0", **spec.run_flags},
        "model_dir": model_dir,
        "seed": cell.seed,
    }
    job_path = os.path.join(cell_dir, "job.json")
    _write_json_atomic(job_path, job)
    started = time.time()
    with open(os.path.join(cell_dir, "output.txt"), "w", encoding="utf-8") as log:
        code = subprocess.call(
            [sys.executable, "-m", "mlperf_tf.sweep", "cell", job_path],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
        )
    wall = time.time() - started
    result_path = os.path.join(cell_dir, "run_result.json")
    if code != 0 or not os.path.exists(result_path):
        raise CellFailedError(
            f"cell {cell.name} failed (exit {code}); see {os.path.join(cell_dir, 'output.txt')}"
        )
    with open(result_path, encoding="utf-8") as f:
        run = json.load(f)
    summary = summarize(run, read_mlperf_log(run["mlperf_log"]), target)
    return {
        "cell": cell.name,
        "benchmark": spec.benchmark,
        "preset": spec.preset,
        "optimizer": lr["optimizer"],
        "global_batch_size": run["global_batch_size"],
        "grid": dict(cell.grid),
        "seed": cell.seed,
        "lr_rule": lr["lr_rule"],
        "lr_field": lr["lr_field"],
        "learning_rate": lr["learning_rate"],
        "budget": spec.budget,
        "max_epochs": run["max_epochs"],
        "target": target,
        "wall_seconds": wall,
        **summary,
    }


def collect(out: str, grid: Sequence[Cell]) -> list[dict[str, Any]]:
    """The finished cells' rows, in grid order."""
    rows = []
    for cell in grid:
        path = os.path.join(out, "cells", cell.name, "result.json")
        if os.path.exists(path):
            with open(path, encoding="utf-8") as f:
                rows.append(json.load(f))
    return rows


def write_table(out: str, rows: Sequence[dict[str, Any]]) -> None:
    """`results.json` (rows with their eval curves), `results.csv` (one line per run) and
    `results.md` (the main columns, for docs)."""
    _write_json_atomic(os.path.join(out, "results.json"), list(rows))
    tmp = os.path.join(out, f"results.csv.tmp{os.getpid()}")
    with open(tmp, "w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=TABLE_COLUMNS, extrasaction="ignore")
        writer.writeheader()
        for row in rows:
            flat = dict(row)
            flat["grid"] = " ".join(f"{k}={v}" for k, v in row["grid"].items())
            for key in ("final_quality", "best_quality", "epochs", "learning_rate"):
                flat[key] = f"{row[key]:.6g}"
            for key in ("epochs_to_target", "run_seconds", "wall_seconds"):
                flat[key] = "" if row[key] is None else f"{row[key]:.4g}"
            flat["steps_to_target"] = (
                "" if row["steps_to_target"] is None else row["steps_to_target"]
            )
            writer.writerow(flat)
    os.replace(tmp, os.path.join(out, "results.csv"))
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(markdown_table(rows))
    os.replace(tmp, os.path.join(out, "results.md"))


def markdown_table(rows: Sequence[dict[str, Any]]) -> str:
    """The table's main columns as Markdown, for docs (`results.md`)."""
    lines = [
        "| optimizer | LR rule | LR | batch | grid | seed | steps | epochs | final | best "
        "| steps to target | epochs to target | run s |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        grid = " ".join(f"{k}={v}" for k, v in row["grid"].items())
        to_target = ("-", "-")
        if row["steps_to_target"] is not None:
            to_target = (str(row["steps_to_target"]), f"{row['epochs_to_target']:.2f}")
        seconds = "" if row["run_seconds"] is None else f"{row['run_seconds']:.0f}"
        lines.append(
            f"| {row['optimizer']} | {row['lr_rule']} | {row['learning_rate']:.4g} "
            f"| {row['global_batch_size']} | {grid} | {row['seed']} | {row['steps']} "
            f"| {row['epochs']:.2f} | {row['final_quality']:.3f} | {row['best_quality']:.3f} "
            f"| {to_target[0]} | {to_target[1]} | {seconds} |"
        )
    return "\n".join(lines) + "\n"


def _series_label(row: dict[str, Any]) -> str:
    grid = " ".join(f"{k.rpartition('.')[2]}={v}" for k, v in row["grid"].items())
    return f"{row['optimizer']} ({row['lr_rule']})" + (f" {grid}" if grid else "")


def write_plots(out: str, rows: Sequence[dict[str, Any]]) -> list[str]:
    """`quality_vs_batch.png` (final and best quality, mean over seeds, per optimizer and grid
    value) and `quality_vs_epochs.png` (eval curves, one panel per batch size).

    Returns:
      The paths written (none when there are no rows).
    """
    if not rows:
        return []
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    series: dict[str, dict[int, list[dict[str, Any]]]] = {}
    for row in rows:
        series.setdefault(_series_label(row), {}).setdefault(row["global_batch_size"], []).append(
            row
        )
    fig, ax = plt.subplots(figsize=(6, 4))
    for label, by_batch in series.items():
        batches = sorted(by_batch)
        final = [_mean(r["final_quality"] for r in by_batch[b]) for b in batches]
        best = [_mean(r["best_quality"] for r in by_batch[b]) for b in batches]
        (line,) = ax.plot(batches, final, "o-", label=f"{label} final")
        ax.plot(batches, best, "x:", color=line.get_color(), label=f"{label} best")
    target = rows[0]["target"]
    if target < UNREACHABLE_TARGET:
        ax.axhline(target, color="gray", linewidth=0.8, linestyle="--", label="target")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("global batch size")
    ax.set_ylabel("quality (mean over seeds)")
    ax.set_title(f"{rows[0]['benchmark']} {rows[0]['preset']}, {rows[0]['max_epochs']:g} epochs")
    ax.legend(fontsize=7)
    fig.tight_layout()
    paths = [os.path.join(out, "quality_vs_batch.png")]
    fig.savefig(paths[0], dpi=80)
    plt.close(fig)

    batches = sorted({row["global_batch_size"] for row in rows})
    fig, axes = plt.subplots(
        1, len(batches), figsize=(3 * len(batches), 3), sharey=True, squeeze=False
    )
    for ax, batch in zip(axes[0], batches):
        for label, by_batch in series.items():
            for i, row in enumerate(by_batch.get(batch, [])):
                curve = row["curve"]
                ax.plot(
                    [p["epoch"] for p in curve],
                    [p["quality"] for p in curve],
                    ".-",
                    color=f"C{list(series).index(label) % 10}",
                    label=label if i == 0 else None,
                )
        ax.set_title(f"batch {batch}", fontsize=9)
        ax.set_xlabel("epochs")
    axes[0][0].set_ylabel("quality")
    axes[0][-1].legend(fontsize=6)
    fig.tight_layout()
    paths.append(os.path.join(out, "quality_vs_epochs.png"))
    fig.savefig(paths[1], dpi=80)
    plt.close(fig)
    return paths


def _mean(values) -> float:
    values = [v for v in values if v is not None and not math.isnan(v)]
    return sum(values) / len(values) if values else math.nan


# ---- command line --------------------------------------------------------------------------------


def split_top_level(text: str) -> list[str]:
    """Splits `text` at commas outside brackets: `(1,2),(3,4)` -> [`(1,2)`, `(3,4)`] (the
    lenient split of `--lr_rule`/`--lr_field`; list flags go through `listflags.parse_list`)."""
    return [item.strip() for item in listflags.split_top_level(text) if item.strip()]


def _per_optimizer(text: str) -> dict[str, str]:
    """`a:x,b:y,z` -> {"a": "x", "b": "y", "*": "z"} (a value without a name is everyone's)."""
    values = {}
    for item in split_top_level(text):
        name, sep, value = item.partition(":")
        values[name if sep else "*"] = value if sep else name
    return values


def parse_args(argv: Sequence[str]) -> tuple[SweepSpec, str, bool]:
    """The sweep, its folder and whether to plot, from `mlperf-tf sweep` arguments.

    Raises:
      UserError: an unknown or malformed argument (named in the message).
    """
    values: dict[str, str] = {"preset": "mini", "seeds": "0", "plots": "true"}
    grid, overrides, run_flags, optimizer_overrides = {}, {}, {}, {}
    known = {"benchmark", "preset", "out", "optimizers", "batch_sizes", "seeds", "epochs",
             "budget", "target", "lr_rule", "lr_field", "plots"}  # fmt: skip
    for arg in argv:
        key, sep, value = arg.removeprefix("--").partition("=")
        if not arg.startswith("--") or not sep:
            raise UserError(f"sweep argument {arg!r} must look like --key=value")
        if key.startswith("grid."):
            grid[key[len("grid.") :]] = listflags.parse_list(value, f"--{key}")
        elif key.startswith("config."):
            overrides[key[len("config.") :]] = value
        elif key.startswith("opt."):
            name, _, field = key[len("opt.") :].partition(".")
            if not name or not field:
                raise UserError(f"{arg}: must look like --opt.NAME.KEY=VALUE")
            optimizer_overrides.setdefault(name, {})[field] = value
        elif key.startswith("run."):
            run_flags[key[len("run.") :]] = value
        elif key in known:
            values[key] = value
        else:
            raise UserError(f"unknown sweep argument --{key} (see `mlperf-tf sweep --help`)")
    if "out" not in values:
        raise UserError("--out is required (the sweep's folder)")
    if os.path.exists(values["out"]) and not os.path.isdir(values["out"]):
        raise UserError(f"--out={values['out']!r} is a file, not a folder")

    def numbers(key: str, kind):
        if key not in values:
            return ()
        return listflags.parse_list(values[key], f"--{key}", kind)

    try:
        epochs = float(values.get("epochs", 0))
        target = float(values["target"]) if "target" in values else None
    except ValueError:
        raise UserError("--epochs and --target must be numbers") from None
    batch_sizes = numbers("batch_sizes", int)
    if any(b < 1 for b in batch_sizes):
        raise UserError(f"--batch_sizes={values['batch_sizes']!r} must be positive integers")
    spec = SweepSpec(
        benchmark=values.get("benchmark", ""),
        preset=values["preset"],
        optimizers=(
            listflags.parse_list(values["optimizers"], "--optimizers")
            if "optimizers" in values
            else ("",)
        ),
        batch_sizes=batch_sizes or (0,),
        grid=grid,
        overrides=overrides,
        optimizer_overrides=optimizer_overrides,
        seeds=numbers("seeds", int),
        epochs=epochs,
        budget=values.get("budget", "epochs"),
        target=target,
        lr_rules=_per_optimizer(values.get("lr_rule", "linear")),
        lr_fields=_per_optimizer(values.get("lr_field", "")),
        run_flags=run_flags,
    )
    return spec, values["out"], values["plots"].lower() in ("true", "1", "yes")


def main(argv: Sequence[str]) -> int:
    """`mlperf-tf sweep ARGS`: runs the sweep; `cell JOB.json` runs one cell (internal)."""
    argv = list(argv)
    if argv and argv[0] == "cell":
        return run_cell(argv[1])
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE)
        return 0
    spec, out, plots = parse_args(argv)
    rows = run_sweep(spec, out, plots=plots)
    print(f"{len(rows)} runs; table: {os.path.join(out, 'results.csv')}")
    return 0


if __name__ == "__main__":
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "1")
    try:
        sys.exit(main(sys.argv[1:]))
    except UserError as e:
        print(f"error: {e}", file=sys.stderr, flush=True)
        sys.exit(2)
