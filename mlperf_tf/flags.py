"""Provides the absl flags common to every benchmark and `run_config_from_flags`."""

from __future__ import annotations

import os

from absl import flags

from mlperf_tf import collectives, distribute, precision
from mlperf_tf.benchmark import PRESET_NAMES
from mlperf_tf.runner import RunConfig

FLAGS = flags.FLAGS


def define_flags() -> None:
    """Defines the run flags once (safe to call again)."""
    if "benchmark" in FLAGS:
        return
    flags.DEFINE_string("benchmark", None, "Registered benchmark name (see `mlperf-tf list`).")
    flags.DEFINE_string("preset", "smoke", f"Config preset: one of {', '.join(PRESET_NAMES)}.")
    flags.DEFINE_string("model_dir", None, "Folder for checkpoints, TensorBoard and the log.")
    flags.DEFINE_string("mlperf_log", "", "MLPerf log path (default: <model_dir>/mlperf_log.txt).")
    flags.DEFINE_string("data_dir", "", "Overrides the preset's data_dir (TFRecords).")
    flags.DEFINE_enum(
        "distribution", "auto", list(distribute.DISTRIBUTIONS), "tf.distribute strategy."
    )
    flags.DEFINE_string("tpu", "", "TPU name or address for TPUClusterResolver.")
    flags.DEFINE_integer("num_cpu_devices", 0, "Split the CPU into N logical devices (tests).")
    flags.DEFINE_enum("dtype", "fp32", list(precision.DTYPES), "Compute precision.")
    flags.DEFINE_bool("xla", False, "Compile the train step with XLA (jit_compile=True).")
    flags.DEFINE_integer("steps_per_loop", 100, "Train steps in one compiled host loop.")
    flags.DEFINE_integer("checkpoint_every_loops", 10, "Save a checkpoint every N host loops.")
    flags.DEFINE_integer("max_checkpoints", 3, "Checkpoints to keep.")
    flags.DEFINE_enum(
        "resume_input",
        "skip",
        ["skip", "reseed"],
        "On resume: replay the input past consumed batches (exact), or reseed it (cheap).",
    )
    flags.DEFINE_integer("seed", 0, "Run seed (MLPerf `seed`).")
    flags.DEFINE_integer("max_train_steps", 0, "Stop after N steps (0: the preset's budget).")
    flags.DEFINE_string("data_service", "", "tf.data service address, e.g. grpc://host:5050.")
    flags.DEFINE_bool("skip_bad_records", False, "Skip and count corrupt records.")
    flags.DEFINE_float("startup_timeout", 120.0, "Seconds to reach a TPU or the peer workers.")
    flags.DEFINE_enum("all_reduce", "auto", list(collectives.ALGORITHMS),
                      "Cross-replica gradient sum: auto (the strategy's own, or ring when "
                      "packing/sharding), ring, hierarchical (rows, then their leaders), torus2d "
                      "(reduce-scatter rows, all-reduce columns, all-gather rows).")  # fmt: skip
    flags.DEFINE_string("mesh", "", "Replicas as RxC rows x columns (default: a row per worker, "
                        "or the most square factorisation).")  # fmt: skip
    flags.DEFINE_float("pack_mb", 0.0, "Fuse gradients into buckets of about M MiB before "
                       "summing (0: one collective per tensor).")  # fmt: skip
    flags.DEFINE_bool("weight_update_sharding", False, "Reduce-scatter the gradients, update a "
                      "1/N shard per replica (shard-local slots), all-gather the weights.")  # fmt: skip
    flags.DEFINE_enum("cluster_resolver", "auto", list(collectives.CLUSTER_RESOLVERS),
                      "How workers find each other: TF_CONFIG, Slurm, Kubernetes or a TPU "
                      "(auto: from the environment).")  # fmt: skip
    flags.DEFINE_integer("slurm_port_base", 8888, "First worker port on each node (Slurm).")
    flags.DEFINE_string("submission_org", "mlperf-tf", "MLPerf submission_org.")
    flags.DEFINE_string("submission_platform", "", "MLPerf submission_platform (default: host).")
    flags.DEFINE_enum("submission_division", "closed", ["closed", "open"], "MLPerf division.")
    flags.DEFINE_enum(
        "submission_status", "research", ["onprem", "cloud", "preview", "research"], "Status."
    )


def run_config_from_flags() -> RunConfig:
    """The RunConfig of the parsed flags."""
    platform = FLAGS.submission_platform or f"{os.cpu_count()}xCPU"
    return RunConfig(
        model_dir=FLAGS.model_dir,
        mlperf_log=FLAGS.mlperf_log,
        distribution=FLAGS.distribution,
        tpu=FLAGS.tpu,
        num_cpu_devices=FLAGS.num_cpu_devices,
        dtype=FLAGS.dtype,
        xla=FLAGS.xla,
        steps_per_loop=FLAGS.steps_per_loop,
        checkpoint_every_loops=FLAGS.checkpoint_every_loops,
        max_checkpoints=FLAGS.max_checkpoints,
        resume_input=FLAGS.resume_input,
        seed=FLAGS.seed,
        max_train_steps=FLAGS.max_train_steps,
        data_service=FLAGS.data_service,
        skip_bad_records=FLAGS.skip_bad_records,
        startup_timeout_s=FLAGS.startup_timeout,
        submission_org=FLAGS.submission_org,
        submission_platform=platform,
        submission_division=FLAGS.submission_division,
        submission_status=FLAGS.submission_status,
        all_reduce=FLAGS.all_reduce,
        mesh=FLAGS.mesh,
        pack_mb=FLAGS.pack_mb,
        weight_update_sharding=FLAGS.weight_update_sharding,
        cluster_resolver=FLAGS.cluster_resolver,
        slurm_port_base=FLAGS.slurm_port_base,
    )
