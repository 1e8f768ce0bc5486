"""Provides the `mlperf-tf simulate` command: predicted step time and time to train at scale."""

from __future__ import annotations

import argparse
import json
import math
import os
import sys

from mlperf_tf import listflags, paths
from mlperf_tf.errors import UserError
from mlperf_tf.simulate import model, parallelism, systems, validate

_ALGORITHMS = ("ring", "hierarchical", "torus2d")


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # argparse would print usage and exit; we want one line
        raise UserError(message)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="mlperf-tf simulate",
        description="Predict a benchmark's step time, throughput and time to train on a system "
        "of N chips (α–β all-reduce models; see docs/scaling.md).",
    )
    parser.add_argument("--benchmark", help="a registered benchmark (mlperf-tf list)")
    system = parser.add_mutually_exclusive_group()
    system.add_argument("--system", help=f"built-in system: {', '.join(systems.available())}")
    system.add_argument("--system_file", help="a system of your own (JSON or YAML)")
    parser.add_argument("--chips", type=_int_list, help="chips, or a comma list: 256,1024,4096")
    parser.add_argument("--global_batch", type=int, help="samples per step (default: per system)")
    parser.add_argument("--all_reduce", choices=_ALGORITHMS, help="default: the system's best")
    parser.add_argument("--weight_update_sharding", action="store_true")
    parser.add_argument(
        "--fsdp",
        action="store_true",
        help="weights and gradients sharded too (memory; the weights gathered twice a step)",
    )
    parser.add_argument("--failed_chips", type=int, default=0, help="holes in a torus/mesh")
    parser.add_argument("--wraparound", choices=("auto", "on", "off"), default="auto")
    parser.add_argument("--preset", default="mlperf", help="the benchmark preset's model")
    parser.add_argument("--epochs", type=float, help="override epochs to target")
    # The mesh flags of `mlperf-tf run` (RunConfig fields; mlperf_tf/parallel/mesh.py), same names
    # and validation.
    # No layout flag given: the fastest legal layout is chosen (and printed); any layout flag
    # pins the layout, the axes it does not name being 1 (an illegal one names what would work).
    parser.add_argument(
        "--model_parallel", type=int, help="M chips share a batch, weights split (TP)"
    )
    parser.add_argument(
        "--spatial_partition", help="K (KxL) chips share a batch; images in slabs (tiles)"
    )
    parser.add_argument("--expert_parallel", type=int, help="E chips split the MoE layers' experts")
    parser.add_argument(
        "--pipeline_parallel", type=int, help="P chips hold 1/P of the blocks each (1F1B)"
    )
    parser.add_argument(
        "--context_parallel", type=int, help="C chips share each sample, 1/C of its tokens"
    )
    parser.add_argument(
        "--micro_batch_size", type=int, help="samples per pipeline micro-batch (default 1)"
    )
    parser.add_argument(
        "--recompute_attention", action="store_true",
        help="the attention's products run their forward again in the backward (core_attn)",
    )  # fmt: skip
    parser.add_argument(
        "--recompute_mlp", action="store_true",
        help="the feed-forwards that are not mixtures of experts run their forward again (mlp)",
    )  # fmt: skip
    parser.add_argument(
        "--virtual_stages", type=int, default=1,
        help="model chunks per pipeline stage: an interleaved 1F1B schedule (default 1: plain)",
    )  # fmt: skip
    parser.add_argument(
        "--precision",
        help="number format of the products: bf16, fp16, fp8, fp4 (mxfp4, nvfp4), fp32, tf32 "
        "(default: what the benchmark's reference trains in)",
    )
    parser.add_argument(
        "--attention_precision",
        help="number format of the attention's score and context products: bf16, fp8 (FP8 "
        "dot-product attention) (default: the benchmark's reference, bf16)",
    )
    parser.add_argument(
        "--output_precision",
        help="number format of the output projections onto the vocabulary (the LM head), where "
        "the benchmark declares them: bf16 for a run that keeps its head out of FP8 (default: "
        "--precision)",
    )
    parser.add_argument(
        "--validate",
        action="store_true",
        help="print every published point the suite knows, predicted against published",
    )
    parser.add_argument(
        "--from_log",
        metavar="LOG",
        help="predict the run of a published MLPerf log (system, chips, batch, disclosed layout)",
    )
    # The MoE config as `mlperf-tf run` takes it (`--config.model.moe.X=V`): experts added to a
    # dense Transformer or Llama. A benchmark built with experts (gpt_oss_20b) declares its own.
    for field, kind, default in (
        ("num_experts", int, 0),
        ("every", int, 1),
        ("top_k", int, 2),
        ("capacity_factor", float, 1.25),
    ):
        parser.add_argument(
            f"--config.model.moe.{field}", dest=f"moe_{field}", type=kind, default=default,
            help=f"mixture of experts: {field} (default {default})",
        )  # fmt: skip
    parser.add_argument("--json", action="store_true", help="one JSON object per configuration")
    parser.add_argument("--plot", metavar="PNG", help="draw samples/s and time to train vs chips")
    return parser


_LAYOUT_FLAGS = ("model_parallel", "context_parallel", "pipeline_parallel", "expert_parallel")


def _from_log(args: argparse.Namespace) -> None:
    """Fills the flags the user did not give from the published run the log records."""
    from mlperf_tf.simulate import fromlog

    run = fromlog.read_run(args.from_log, args.system)
    args.system = args.system or (None if args.system_file else run["system"])
    for key in ("benchmark", "global_batch", "precision", "attention_precision", *_LAYOUT_FLAGS):
        if getattr(args, key) is None and key in run:
            setattr(args, key, run[key])
    if args.chips is None:
        args.chips = [run["chips"]]


def _int_list(text: str) -> list[int]:
    return list(listflags.parse_list(text, "--chips", int))


def _table(results: list[model.Result]) -> str:
    """The results as a table; the model-parallel columns (tensor-parallel all-reduces, halos,
    all-to-all, ms a step), the experts' weight reads, the tables' lookups and all-to-alls and
    the rollouts' parts only where a result has them."""
    extra = [
        (title, field)
        for title, field in (
            ("tp", "model_parallel_s"),
            ("halo", "halo_s"),
            ("a2a", "all_to_all_s"),
            ("cp", "context_parallel_s"),
            ("pp", "pipeline_s"),
            ("experts", "expert_weights_s"),
            ("lookup", "embedding_lookup_s"),
            ("tables", "embedding_all_to_all_s"),
            ("decode", "rollout_decode_s"),
            ("env", "rollout_environment_s"),
            ("gen exp", "exposed_generation_s"),
            ("refit", "refit_s"),
        )
        if any(getattr(r, field) for r in results)
    ]
    head = (
        f"{'chips':>6} {'layout':>14} {'parallel':>14} {'algo':>12} {'batch':>7} {'step ms':>8} "
        f"{'compute':>8} "
        f"{'allred':>7} {'exposed':>7} {'update':>7} "
        + "".join(f"{title:>7} " for title, _ in extra)
        + f"{'samples/s':>11} {'eff':>5} {'MFU':>5} {'epochs':>6} {'TTT min':>8}"
    )
    rows = [head]
    for r in results:
        rows.append(
            f"{r.chips:>6} {r.layout:>14} {validate.layout_text(r):>14} {r.algorithm:>12} "
            f"{r.global_batch:>7} {r.step_time_s * 1e3:>8.2f} {r.compute_s * 1e3:>8.2f} "
            f"{r.allreduce_s * 1e3:>7.2f} "
            f"{r.exposed_comm_s * 1e3:>7.2f} {r.weight_update_s * 1e3:>7.2f} "
            + "".join(f"{getattr(r, field) * 1e3:>7.2f} " for _, field in extra)
            + f"{r.samples_per_s:>11.0f} {r.scaling_efficiency:>5.2f} {r.mfu:>5.2f} "
            f"{r.epochs_to_target:>6.1f} "
            f"{r.time_to_train_min:>8.2f}" + ("  (input-bound)" if r.input_bound else "")
        )
    return "\n".join(rows)


PLOT_FORMATS = (".png", ".pdf", ".svg")
_MOST_CHIPS = 1 << 24
_MOST_BATCH = 2**31 - 1
_MOST_EPOCHS = 1e6


def _check_args(args: argparse.Namespace) -> None:
    """Every number in its range and the plot path writable, before any work (one line each)."""
    for flag in ("benchmark", "chips"):
        if getattr(args, flag) is None:
            raise UserError(f"--{flag} is required (or --from_log LOG, or --validate)")
    if not (args.system or args.system_file):
        raise UserError("--system or --system_file is required (or --from_log LOG)")
    for chips in args.chips:
        if not 1 <= chips <= _MOST_CHIPS:
            raise UserError(f"--chips ({chips}) must be in [1, {_MOST_CHIPS}]")
    if args.global_batch is not None and not 1 <= args.global_batch <= _MOST_BATCH:
        raise UserError(f"--global_batch ({args.global_batch}) must be in [1, {_MOST_BATCH}]")
    if args.failed_chips < 0 or any(args.failed_chips >= chips for chips in args.chips):
        raise UserError(
            f"--failed_chips ({args.failed_chips}) must be >= 0 and below --chips "
            f"({min(args.chips)})"
        )
    if args.epochs is not None and not (
        math.isfinite(args.epochs) and 0 < args.epochs <= _MOST_EPOCHS
    ):
        raise UserError(f"--epochs ({args.epochs}) must be in (0, {_MOST_EPOCHS:g}]")
    if args.plot:
        _check_plot_path(args.plot)


def _check_plot_path(path: str) -> None:
    if os.path.splitext(path)[1].lower() not in PLOT_FORMATS:
        raise UserError(
            f"--plot {path!r}: the image format must be one of {', '.join(PLOT_FORMATS)}"
        )
    if os.path.isdir(path):
        raise UserError(f"--plot {path!r} is a folder; name an image file")
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise UserError(f"--plot {path!r}: the folder {folder!r} does not exist")
    paths.try_output_file(path, "--plot")  # tried: as root, permission bits say yes to /proc


def _pinned(chips: int, common: dict, pinned: dict, args: argparse.Namespace) -> model.Result:
    """The layout the flags pin (the axes they do not name are 1). When it is not legal and
    some axis was left free, the error also names the fastest legal layout that keeps the
    pinned axes: what would work (`gpt_oss_20b --context_parallel=2` alone on 72 GB200 at batch
    36 does not fit a chip; with `--expert_parallel=4` beside it, NVIDIA's v6.0 layout, it does)."""
    try:
        return model.simulate(chips=chips, **common, **pinned)
    except UserError as e:
        if args.spatial_partition is not None or len(pinned) == len(_LAYOUT_FLAGS):
            raise
        try:
            works = model.fastest(chips=chips, **common, **pinned)
        except UserError:
            raise e from None
        flags = " ".join(
            f"--{flag}={getattr(works, flag)}" for flag in _LAYOUT_FLAGS if getattr(works, flag) > 1
        )
        raise UserError(
            f"{e}. Keeping {' '.join(f'--{k}={v}' for k, v in pinned.items())}, the fastest legal "
            f"layout of {chips} chips is {flags} (or give no layout flag: simulate chooses one)"
        ) from None


def main(argv: list[str]) -> int:
    """Runs `mlperf-tf simulate`; returns the exit code (UserError propagates to the CLI)."""
    if any(a in ("-h", "--help") for a in argv):
        build_parser().print_help()
        return 0
    args = build_parser().parse_args(argv)
    if args.validate:
        return validate.main([])
    if args.from_log:
        _from_log(args)
    _check_args(args)
    system = systems.load(args.system) if args.system else systems.load_file(args.system_file)
    moe = parallelism.Moe(
        num_experts=args.moe_num_experts,
        every=args.moe_every,
        top_k=args.moe_top_k,
        capacity_factor=args.moe_capacity_factor,
    )
    pinned = {
        flag: getattr(args, flag) for flag in _LAYOUT_FLAGS if getattr(args, flag) is not None
    }
    common = dict(
        benchmark=args.benchmark,
        system=system,
        global_batch=args.global_batch,
        algorithm=args.all_reduce,
        weight_update_sharding=args.weight_update_sharding,
        fsdp=args.fsdp,
        failed_chips=args.failed_chips,
        wraparound=args.wraparound,
        preset=args.preset,
        epochs_to_target=args.epochs,
        spatial_partition=args.spatial_partition or "1",
        moe=moe,
        micro_batch_size=args.micro_batch_size,
        virtual_stages=args.virtual_stages,
        recompute_attention=args.recompute_attention,
        recompute_mlp=args.recompute_mlp,
        precision=args.precision,
        attention_precision=args.attention_precision,
        output_precision=args.output_precision,
    )
    # Any layout flag pins the layout (an axis not given is 1); none: the fastest legal one.
    every_axis_given = bool(pinned) or args.spatial_partition is not None
    if every_axis_given:
        results = [_pinned(chips, common, pinned, args) for chips in args.chips]
    else:
        results = [model.fastest(chips=chips, **common, **pinned) for chips in args.chips]
    if args.json:
        for r in results:
            print(json.dumps(r.as_dict(), sort_keys=True))
    else:
        print(f"{args.benchmark} on {system.name}: {system.description}")
        print(_table(results))
        chosen = "" if every_axis_given else " (the fastest legal layout for each chip count)"
        print(f"parallel: {', '.join(validate.layout_text(r) for r in results)}{chosen}")
        print(
            f"precision: {results[0].precision} (dense peak {results[0].peak_flops / 1e12:,.0f} "
            f"TFLOP/s per chip; MFU against it), attention {results[0].attention_precision}; "
            f"efficiency: {results[0].calibration_source}"
        )
        print(f"epochs to target: {results[0].convergence_source}")
    if args.plot:
        from mlperf_tf.simulate import plot

        path = plot.scaling_plot(
            benchmark=args.benchmark,
            system=system,
            chips=args.chips,
            global_batch=args.global_batch,
            preset=args.preset,
            out=args.plot,
        )
        print(f"plot: {path}", file=sys.stderr if args.json else sys.stdout)
    return 0
