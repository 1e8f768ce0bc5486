"""Provides `check_batch_split`: the one check that a run's batches split evenly over its data
groups, for `run`, `bench` and `sweep` alike (`simulate` applies the same rule to its chips).

A step's global batch is split into `gradient_accumulation_steps` micro batches, and each micro
batch over the mesh's data groups (`DeviceMesh.batch_shards`: replicas that share a batch — a
spatial or model group — count once). A split that does not come out even is refused with one
line naming the settings, before any file is touched; nothing is rounded silently.
"""

from __future__ import annotations

import os

from mlperf_tf.errors import UserError


def check_batch_split(
    config, *, data_groups: int, replicas: int | None = None, groups_from: str = ""
) -> None:
    """Raises one line unless the global, micro and eval batches split evenly over `data_groups`.

    Args:
      config: the benchmark's config (`global_batch_size`, `gradient_accumulation_steps`,
        `eval_batch_size`).
      data_groups: batches read per step (the mesh's `batch_shards`).
      replicas: the replicas in sync (for the message; None: the same as `data_groups`).
      groups_from: where the replica count comes from (`--num_cpu_devices=3`), for the message.

    Raises:
      UserError: a batch that the data groups cannot split evenly, or accumulation steps that do
        not divide the global batch.
    """
    batch = int(config.global_batch_size)
    accumulation = int(getattr(config, "gradient_accumulation_steps", 1) or 1)
    if batch % accumulation:
        raise UserError(
            f"--config.global_batch_size={batch} does not split into "
            f"--config.gradient_accumulation_steps={accumulation} equal micro batches: use a "
            f"multiple of {accumulation}"
        )
    micro = batch // accumulation
    groups = f"{data_groups} data group{'s' if data_groups != 1 else ''}"
    if replicas is not None and replicas != data_groups:
        groups += f" ({replicas} replicas, replicas that share a batch counted once)"
    elif replicas is not None:
        groups = f"{replicas} replica{'s' if replicas != 1 else ''}"
    if groups_from:
        groups += f" from {groups_from}"
    if micro % data_groups:
        what = (
            f"--config.global_batch_size={batch}"
            if accumulation == 1
            else f"the micro batch {micro} (--config.global_batch_size={batch} / "
            f"--config.gradient_accumulation_steps={accumulation})"
        )
        raise UserError(
            f"{what} does not split evenly over the {groups}: use a multiple of "
            f"{data_groups * accumulation} for the global batch"
        )
    eval_batch = getattr(config, "eval_batch_size", None)
    if eval_batch and int(eval_batch) % data_groups:
        raise UserError(
            f"--config.eval_batch_size={eval_batch} does not split evenly over the {groups}: use a "
            f"multiple of {data_groups}"
        )


def predicted_replicas(run_config) -> tuple[int, str] | None:
    """The replicas a local run will have, known before TensorFlow starts, and the flag saying so;
    None when only the strategy can tell (several workers, a TPU, GPUs).

    `one_device` is one replica; `--num_cpu_devices=N` (N > 1) with `auto` or `mirrored` on a
    machine without NVIDIA devices is N.
    """
    distribution = run_config.distribution
    if distribution == "one_device":
        return 1, "--distribution=one_device"
    gpus = os.path.exists("/dev/nvidia0") or os.environ.get("CUDA_VISIBLE_DEVICES", "") not in ("",)
    if distribution in ("auto", "mirrored") and run_config.num_cpu_devices > 1 and not gpus:
        if getattr(run_config, "tpu", ""):
            return None
        return run_config.num_cpu_devices, f"--num_cpu_devices={run_config.num_cpu_devices}"
    return None


def data_groups(num_replicas: int, run_config) -> int:
    """The data groups (`batch_shards`) of `num_replicas` split by the run's mesh flags.

    Raises:
      UserError: the mesh flags do not divide the replicas (from `build_mesh`).
    """
    from mlperf_tf.parallel import mesh as parallel_mesh

    mesh = parallel_mesh.build_mesh(num_replicas, **run_config.mesh_flags())
    return mesh.batch_shards


def check_run_split(config, run_config, num_replicas: int | None = None, source: str = "") -> None:
    """`check_batch_split` for a run of `run_config` over `num_replicas` (None: predicted, and
    nothing is checked when the replicas are not known before the strategy starts)."""
    if num_replicas is None:
        predicted = predicted_replicas(run_config)
        if predicted is None:
            return
        num_replicas, source = predicted
    groups = data_groups(num_replicas, run_config)
    check_batch_split(config, data_groups=groups, replicas=num_replicas, groups_from=source)
