"""Provides the Qwen3.5 GRPO data preparation: the reference's training and validation JSONL
checked by SHA-256, size and row count (`llm_post_training/verify_dataset.sh`), each row parsed,
and written in their order to `--out_dir` as `train.jsonl` and `val.jsonl` (never shuffled: the
training rows' curriculum order is part of the benchmark's input).

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
import shutil
from collections.abc import Sequence

from benchmarks.qwen35_397b_grpo import config
from mlperf_tf import prepare_cli
from mlperf_tf.errors import DataError, UserError

# (file name, SHA-256, rows, bytes, name written) of the reference's two files.
FILES = (
    (config.TRAIN_FILE, config.TRAIN_SHA256, config.TRAIN_ROWS, config.TRAIN_BYTES, "train.jsonl"),
    (config.VAL_FILE, config.VAL_SHA256, config.VAL_ROWS, config.VAL_BYTES, "val.jsonl"),
)
REQUIRED_FIELDS = ("instance_id",)


def verify(path: str, *, sha256: str, rows: int, size: int) -> None:
    """Raises DataError (one line naming `path`) unless its bytes, digest, rows and JSON fit."""
    if not os.path.isfile(path):
        raise DataError(f"{path}: missing (the reference's download_dataset.sh writes it)")
    if os.path.getsize(path) != size:
        raise DataError(f"{path}: {os.path.getsize(path):,} bytes, expected {size:,}")
    digest = hashlib.sha256()
    count = 0
    with open(path, "rb") as f:
        for number, line in enumerate(f, 1):
            digest.update(line)
            count += 1
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise DataError(f"{path}:{number}: not a JSON row ({e.msg})") from None
            missing = [k for k in REQUIRED_FIELDS if k not in row]
            if missing:
                raise DataError(f"{path}:{number}: row without {', '.join(missing)}")
    if count != rows:
        raise DataError(f"{path}: {count} rows, expected {rows}")
    if digest.hexdigest() != sha256:
        raise DataError(f"{path}: SHA-256 {digest.hexdigest()}, expected {sha256}")


def prepare(data_dir: str, out_dir: str, files=FILES) -> dict[str, int]:
    """Verifies the reference files under `data_dir` and copies them, rows in order."""
    for name, sha256, rows, size, _ in files:
        verify(os.path.join(data_dir, name), sha256=sha256, rows=rows, size=size)
    with prepare_cli.staged_folder(out_dir) as staging:
        for name, _, _, _, out_name in files:
            shutil.copyfile(os.path.join(data_dir, name), os.path.join(staging, out_name))
    return {out_name: rows for _, _, rows, _, out_name in files}


def main(argv: Sequence[str] | None = None) -> int:
    """`mlperf-tf prepare qwen35_397b_grpo ...` (see the module docstring)."""
    parser = prepare_cli.parser(
        "qwen35_397b_grpo", "Check and copy the reference's R2E-Gym JSONL files.",
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
