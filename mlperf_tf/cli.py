"""Provides the `mlperf-tf` command: run, bench, list, prepare, check, score, report, data-service,
sweep, simulate.

Bad input (an unknown benchmark, preset, flag or config key, a missing data folder, an unreachable
peer) is one line on stderr, `error: ...`, and exit code 2.
"""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # imported where used: `check` pays for no more than it needs (issue 19)
    from mlperf_tf import console

USAGE = """usage: mlperf-tf COMMAND [ARGS]

commands:
  run --benchmark=NAME --preset=smoke|mini|mlperf --model_dir=DIR [--config.KEY=VALUE ...]
                        train a benchmark; prints where its MLPerf log is (--helpfull: all flags;
                        --helpconfig: the config keys; --restart: a new run where one finished)
  bench --benchmark=NAME [--preset=mlperf] [--distribution=D] [--dtype=fp32] [--xla] [--json]
                        steady-state training throughput (and MFU) on synthetic data
  list [--json]         registered benchmarks, their presets and parameter counts
  prepare NAME ARGS     convert raw data to TFRecords (`mlperf-tf prepare NAME --help`)
  check LOG... [--ruleset R] [--quality=enforce|skip] [--strict] [--json]
                        check MLPerf logs with the official MLCommons rules plus suite checks
  score DIR             time to train per run and the MLPerf score of a result folder
  report LOG... --out DIR
                        plots and a summary per run
  data-service --port P --workers N [--dispatcher grpc://HOST:PORT]
                        start a tf.data service dispatcher and N workers (or workers
                        that join a running dispatcher); it listens on every interface without
                        authentication: run it on a private network or behind a firewall
  sweep --benchmark=NAME --preset=P --out=DIR [--optimizers=..] [--batch_sizes=..] [--grid.KEY=..]
                        a resumable grid of runs; one table and plots (`mlperf-tf sweep --help`)
  simulate --benchmark=NAME --system=SYSTEM --chips=N [--json] [--plot PNG]
                        predicted step time and time to train at scale (docs/scaling.md)
"""

EXIT_USAGE = 2
EXIT_BROKEN_PIPE = 141  # 128 + SIGPIPE, what a shell reports for a tool whose reader left


def _fail(message: str) -> int:
    print(f"error: {message}", file=sys.stderr, flush=True)
    return EXIT_USAGE


def _leave_now(code: int, stderr_filter: console.StderrFilter | None) -> None:
    """Exits at once with `code`: TF may hold background threads (servers, collectives) that a
    normal exit would wait on; the console filter first forwards what was printed."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (BrokenPipeError, ValueError):  # the reader left, or the stream is closed
            pass
    if stderr_filter:
        stderr_filter.close()
    os._exit(code)


def _set_fast_cpu_defaults() -> None:
    # Measured here: oneDNN is 1.4-1.7x faster on these CPUs; it must be set before TF loads.
    os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "1")
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def _run_command(argv: list[str], stderr_filter: console.StderrFilter | None = None) -> int:
    from absl import flags
    from absl import logging as absl_logging

    from mlperf_tf import config as config_lib
    from mlperf_tf import console, errors, preemption, runlog, runner
    from mlperf_tf import flags as run_flags
    from mlperf_tf.errors import UserError

    try:
        argv, overrides = config_lib.split_config_overrides(argv)
    except ValueError as e:
        return _fail(str(e))
    run_flags.define_flags()
    FLAGS = flags.FLAGS
    if any(arg in ("-h", "--help", "--helpfull") for arg in argv):
        print("usage: mlperf-tf run --benchmark=NAME [--preset=P] --model_dir=DIR [flags]\n")
        print(FLAGS.module_help(run_flags))
        print("\n  --config.KEY=VALUE: override a field of the benchmark's config (typed)")
        print("  --helpconfig: list the config keys of --benchmark (and --preset) with values")
        return 0
    help_config = "--helpconfig" in argv
    argv = [arg for arg in argv if arg != "--helpconfig"]
    FLAGS.unparse_flags()  # a second `run` in one process starts from the defaults
    try:
        FLAGS(["mlperf-tf run", *argv])
    except flags.Error as e:
        return _fail(str(e).splitlines()[0])
    absl_logging.use_absl_handler()
    if not console.verbosity_requested(argv):
        absl_logging.set_verbosity(absl_logging.INFO)
        console.drop_library_info(absl_logging.get_absl_handler())
    if not FLAGS.benchmark:
        return _fail("--benchmark is required (see `mlperf-tf list`)")
    if help_config:
        try:
            return _print_config_keys(FLAGS.benchmark, FLAGS.preset, overrides)
        except UserError as e:
            return _fail(str(e))
    if not FLAGS.model_dir:
        return _fail("--model_dir is required")
    try:
        benchmark, run_config = _benchmark_and_run_config(FLAGS, overrides)
    except UserError as e:
        return _fail(str(e))
    except runlog.RunFinished as e:
        print(f"mlperf-tf: {e}", file=sys.stderr, flush=True)
        return 0
    stop_request = preemption.StopRequest()
    try:
        with preemption.handle_stop_signals(
            stop_request,
            on_second=lambda name: preemption.stop_at_once(name, run_config.model_dir),
            before_start=lambda name: preemption.stop_in_setup(name, run_config.model_dir),
        ):
            result = runner.run(benchmark, run_config, stop_request=stop_request)
    except (UserError, errors.PeerError) as e:
        print(f"error: {e}", file=sys.stderr, flush=True)
        code = errors.EXIT_PEER_FAILED if isinstance(e, errors.PeerError) else EXIT_USAGE
        # TF may hold background threads (servers, collectives): leave without waiting on them.
        _leave_now(code, stderr_filter)
    return _report_result(result, run_config.model_dir)


def _benchmark_and_run_config(FLAGS, overrides: dict[str, str]):
    """The benchmark bound to its preset, `--data_dir` and `--config.KEY` overrides, and the run
    settings, checked by the runner's preflight so that bad input fails before any set-up.

    Raises:
      UserError: an unknown benchmark or preset, a bad override, a missing data folder.
      runlog.RunFinished: the run in `--model_dir` finished (and `--restart` was not given).
    """
    from mlperf_tf import config as config_lib
    from mlperf_tf import flags as run_flags
    from mlperf_tf import paths, registry, runner
    from mlperf_tf.errors import UserError

    benchmark_class = registry.get(FLAGS.benchmark)
    try:
        config = benchmark_class.preset(FLAGS.preset)
    except KeyError as e:
        raise UserError(e.args[0]) from None
    if FLAGS.data_dir:
        overrides.setdefault("data_dir", FLAGS.data_dir)
    config = config_lib.override(config, overrides)
    # The mini preset's own data folder (several benchmarks may share one) is written on first use;
    # a mini that reads no data folder (its tasks generated in the run) has none to write.
    mini_data_dir = FLAGS.preset == "mini" and config.data_dir
    if mini_data_dir and config.data_dir == benchmark_class.preset("mini").data_dir:
        if not os.path.isdir(config.data_dir):
            print(f"Writing the mini dataset to {config.data_dir} ...", flush=True)
            benchmark_class.prepare_mini(config.data_dir)
    if config.data_dir:  # listed, not inspected: as root, permission bits say yes
        paths.check_input_dir(config.data_dir, "data_dir")
    run_config = run_flags.run_config_from_flags()
    benchmark = benchmark_class(config)  # the runner binds the run's RunContext
    runner.preflight(benchmark, run_config)  # bad input fails here, before any set-up
    return benchmark, run_config


def _report_result(result, model_dir: str) -> int:
    """Prints where the log is and why the run stopped; returns the exit code that says so."""
    from mlperf_tf import errors, runner

    if result.mlperf_log:
        print(f"MLPerf log: {result.mlperf_log}")
    print(f"run_stop status={result.status}: {result.reason}")
    if result.cause is runner.StopCause.INTERRUPTED:
        print(
            f"stopped at step {result.steps} ({result.reason}) with a checkpoint in "
            f"{os.path.join(model_dir, 'ckpt')}: run the same command again to resume",
            file=sys.stderr,
            flush=True,
        )
        return errors.EXIT_INTERRUPTED
    return errors.EXIT_NON_FINITE if result.cause is runner.StopCause.NON_FINITE_LOSS else 0


def _print_config_keys(benchmark: str, preset: str, overrides: dict[str, str]) -> int:
    """`run --benchmark=NAME --helpconfig`: every `--config.KEY` of the preset, its type and value."""
    import typing

    from mlperf_tf import config as config_lib
    from mlperf_tf import registry
    from mlperf_tf.errors import UserError

    benchmark_class = registry.get(benchmark)
    try:
        config = benchmark_class.preset(preset)
    except KeyError as e:
        raise UserError(e.args[0]) from None
    config = config_lib.override(config, overrides)
    print(f"config keys of {benchmark} (preset {preset}); set one with --config.KEY=VALUE:")
    for key, value in config_lib.field_paths(config).items():
        owner = config
        *parents, name = key.split(".")
        for part in parents:
            owner = getattr(owner, part)
        annotation = typing.get_type_hints(type(owner)).get(name)
        kind = getattr(annotation, "__name__", None) or str(annotation).replace("typing.", "")
        print(f"  {key:44s} {kind:16s} {value!r}")
    return 0


def _count(benchmark_class, method: str = "parameter_count") -> int | None:
    """A count of the `mlperf` preset from its config (no weights): `parameter_count()`,
    `active_parameter_count()` (a mixture of experts' top-k) or `trainable_parameter_count()`
    (a fine-tuning benchmark's adapters); None where the benchmark does not say."""
    try:
        return getattr(benchmark_class(benchmark_class.preset("mlperf")), method)()
    except Exception:  # noqa: BLE001 (a third-party preset may not build; the count is optional)
        return None


def _list_command(argv: list[str]) -> int:
    import json

    from mlperf_tf import registry

    as_json = argv == ["--json"]
    if argv and not as_json:
        return _fail(f"`list` takes only --json, got {' '.join(argv)}")
    entries = []
    for name, target in registry.available().items():
        try:
            benchmark_class = registry.get(name)
            parameters = _count(benchmark_class)
            entries.append(
                {
                    "name": name,
                    "presets": list(benchmark_class.presets),
                    "mlperf_benchmark": benchmark_class.mlperf_benchmark,
                    **({"parameters": parameters} if parameters is not None else {}),
                }
            )
            for key in ("active_parameters", "trainable_parameters"):
                count = _count(benchmark_class, key[:-1] + "_count")
                if count is not None and count != parameters:
                    entries[-1][key] = count
            groups = _count(benchmark_class, "parameter_groups")  # e.g. embedding apart from dense
            if groups:
                entries[-1]["parameter_groups"] = groups
            if not as_json:
                presets = ", ".join(benchmark_class.presets)
                count = f"  {parameters / 1e6:,.1f} M parameters" if parameters else ""
                print(
                    f"{name:14s} presets: {presets:24s} ({benchmark_class.mlperf_benchmark}){count}"
                )
        except Exception as e:  # a broken third-party package must not hide the others
            entries.append({"name": name, "error": f"{type(e).__name__}: {e}"})
            if not as_json:
                print(f"{name:14s} cannot be loaded from {target}: {type(e).__name__}: {e}")
    if as_json:
        print(json.dumps(entries, indent=1))
    return 0


def _prepare_command(argv: list[str]) -> int:
    import importlib

    from mlperf_tf import registry

    if not argv or argv[0].startswith("-"):
        return _fail("usage: mlperf-tf prepare NAME [ARGS] (NAME from `mlperf-tf list`)")
    name, rest = argv[0], argv[1:]
    targets = registry.available()
    if name not in targets:
        return _fail(f"unknown benchmark '{name}' (registered: {', '.join(sorted(targets))})")
    package = targets[name].partition(":")[0].rpartition(".")[0]
    try:
        prepare = importlib.import_module(f"{package}.prepare")
    except ModuleNotFoundError:
        return _fail(f"benchmark '{name}' has no prepare module ({package}.prepare)")
    try:
        return int(prepare.main(rest) or 0)
    except OSError as e:
        # e.g. `--out_dir` names a file (NotADirectoryError) or a read-only/full disk.
        path = e.filename
        if path and os.path.exists(path) and not os.path.isdir(path):
            return _fail(f"prepare {name}: {path!r} is a file, not a folder")
        where = f" {path!r}" if path else ""
        return _fail(f"prepare {name}: cannot write{where}: {e.strerror or e}")


def main(argv: list[str] | None = None, *, exits_after: bool = False) -> int:
    """Runs one `mlperf-tf` command; returns the exit code.

    `exits_after`: the process ends after this command (the console script), which lets `check`
    run a log's official check in this process (compliance/runner.py).
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(USAGE)
        return 0 if argv else EXIT_USAGE
    command, rest = argv[0], argv[1:]
    # The commands that start TensorFlow get its start-up noise filtered (--verbosity: all of it).
    stderr_filter = None
    if command in ("run", "bench", "prepare", "data-service"):
        from mlperf_tf import console

        stderr_filter = console.quiet_stderr(rest)
    _set_fast_cpu_defaults()
    from mlperf_tf.errors import UserError

    try:
        if command == "run":
            return _run_command(rest, stderr_filter)
        if command == "list":
            return _list_command(rest)
        if command == "bench":
            from mlperf_tf import bench

            return bench.main(rest)
        if command == "prepare":
            return _prepare_command(rest)
        if command in ("check", "score", "report"):
            from compliance import cli as compliance_cli

            return compliance_cli.main([command, *rest], exits_after=exits_after)
        if command == "sweep":
            from mlperf_tf import sweep

            return sweep.main(rest)
        if command == "data-service":
            from mlperf_tf.data import service

            return service.main(rest)
        if command == "simulate":
            from mlperf_tf.simulate import cli as simulate_cli

            return simulate_cli.main(rest)
    except UserError as e:
        return _fail(str(e))
    finally:
        if stderr_filter:
            stderr_filter.close()
    commands = "run, bench, list, prepare, check, score, report, data-service, simulate, sweep"
    return _fail(f"unknown command '{command}' (commands: {commands})")


def run_main() -> None:
    """Console-script entry point."""
    try:
        code = main(exits_after=True)
    except BrokenPipeError:
        # The reader of our output left (`mlperf-tf check ... | head`): end quietly, as Unix tools
        # do, with 128 + SIGPIPE; stdout goes to /dev/null so the exit's own flush cannot fail.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        code = EXIT_BROKEN_PIPE
    if sys.argv[1:2] == ["check"]:
        # By now `check` holds no open file, thread or child process: skip the interpreter's
        # teardown of every module (about 8 ms of a 90 ms check here; issue 19).
        _leave_now(code, None)
    sys.exit(code)


if __name__ == "__main__":
    run_main()
