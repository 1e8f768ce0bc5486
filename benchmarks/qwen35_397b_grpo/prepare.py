"""Provides the Qwen3.5 GRPO data preparation: the reference's training and validation JSONL
checked by SHA-256, size and row count (`llm_post_training/verify_dataset.sh`), each row
converted into the task `environments.R2EGymEnvironment` takes (`r2egym.task_from_row`: instance
id, image, issue, expected test statuses; a row that does not convert is a one-line error), and
the tasks written in their order to `--out_dir` as `train.jsonl` and `val.jsonl`, one
`r2egym.task_to_json` a line (never shuffled: the training rows' curriculum order is part of
the benchmark's input).

`--mini` trains the `mini` preset's base model instead (`sft.train_base`: supervised, untimed,
on expert trajectories of the generated repair tasks) into `--out_dir` (the preset reads
`config.mini_base_dir()`: pass it, or the run trains the base itself on its first start).

Command line:
  mlperf-tf prepare qwen35_397b_grpo --data_dir=DIR --out_dir=DIR
  mlperf-tf prepare qwen35_397b_grpo --mini --out_dir=~/.cache/mlperf_tf/qwen35-grpo-mini-base-3
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Sequence

from benchmarks.qwen35_397b_grpo import config, r2egym
from mlperf_tf import prepare_cli
from mlperf_tf.errors import DataError, UserError

# (file name, SHA-256, rows, bytes, name written) of the reference's two files.
FILES = (
    (config.TRAIN_FILE, config.TRAIN_SHA256, config.TRAIN_ROWS, config.TRAIN_BYTES, "train.jsonl"),
    (config.VAL_FILE, config.VAL_SHA256, config.VAL_ROWS, config.VAL_BYTES, "val.jsonl"),
)


def verify(path: str, *, sha256: str, rows: int, size: int) -> list[r2egym.R2ETask]:
    """The tasks of the file's rows, in order.

    Raises:
      DataError: (one line naming `path`) its bytes, digest, rows, JSON or a row's fields do
        not fit.
    """
    if not os.path.isfile(path):
        raise DataError(f"{path}: missing (the reference's download_dataset.sh writes it)")
    if os.path.getsize(path) != size:
        raise DataError(f"{path}: {os.path.getsize(path):,} bytes, expected {size:,}")
    digest = hashlib.sha256()
    count, tasks = 0, []
    with open(path, "rb") as f:
        for number, line in enumerate(f, 1):
            digest.update(line)
            count += 1
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise DataError(f"{path}:{number}: not a JSON row ({e.msg})") from None
            tasks.append(r2egym.task_from_row(row, f"{path}:{number}"))
    if count != rows:
        raise DataError(f"{path}: {count} rows, expected {rows}")
    if digest.hexdigest() != sha256:
        raise DataError(f"{path}: SHA-256 {digest.hexdigest()}, expected {sha256}")
    return tasks


def prepare(data_dir: str, out_dir: str, files=FILES) -> dict[str, int]:
    """Verifies the reference files under `data_dir` and writes their tasks, rows in order."""
    converted = [
        verify(os.path.join(data_dir, name), sha256=sha256, rows=rows, size=size)
        for name, sha256, rows, size, _ in files
    ]
    with prepare_cli.staged_folder(out_dir) as staging:
        for tasks, (_, _, _, _, out_name) in zip(converted, files, strict=True):
            with open(os.path.join(staging, out_name), "w") as f:
                f.writelines(r2egym.task_to_json(task) + "\n" for task in tasks)
    return {out_name: rows for _, _, rows, _, out_name in files}


def main(argv: Sequence[str] | None = None) -> int:
    """`mlperf-tf prepare qwen35_397b_grpo ...` (see the module docstring)."""
    parser = prepare_cli.parser(
        "qwen35_397b_grpo", "Check the reference's R2E-Gym JSONL files and convert their rows.",
        mini_help="train the mini's base model into --out_dir (supervised, untimed)",
    )  # fmt: skip
    parser.add_argument("--data_dir", help="the folder download_dataset.sh wrote")
    parser.add_argument("--base_steps", type=int, default=config.MINI_BASE_STEPS,
                        help="--mini: supervised steps")  # fmt: skip
    args = parser.parse_args(argv)
    if args.mini:
        if args.base_steps < 1:
            raise UserError(f"--base_steps ({args.base_steps}) must be positive")
        from benchmarks.qwen35_397b_grpo import sft  # noqa: PLC0415 (TensorFlow only here)

        print(sft.train_base(args.out_dir, recipe=sft.BaseRecipe(steps=args.base_steps)))
        return 0
    if not args.data_dir:
        raise UserError("--data_dir is required (the folder with the reference's JSONL files)")
    print(prepare(args.data_dir, args.out_dir))
    return 0


if __name__ == "__main__":
    prepare_cli.module_main(main)
