"""Provides `load_tf1_checkpoint`: google-research/MLPerf TF1 BERT checkpoints into our Keras model.

MLPerf BERT starts from `model.ckpt-28252` (with `bert_config.json`), a TF1 checkpoint whose
variables carry google-research/bert's names (`bert/encoder/layer_0/attention/self/query/kernel`,
...). `BertPretrainer.tf1_variables()` gives the same names for our variables, so loading is a
lookup by name. Optimizer slots (`.../adam_m`, `.../adam_v`) and bookkeeping variables
(`global_step`, loss-scale state) in the checkpoint are skipped, as the reference does.
"""

from __future__ import annotations

import dataclasses
import os

import numpy as np
import tensorflow as tf

from mlperf_tf.errors import DataError, UserError
from mlperf_tf.spmd import DeviceMesh, assign_whole, whole_shape

# Last name components of model weights in google-research/bert checkpoints; any other
# variable (slots, global_step, loss scale) is not part of the model.
_WEIGHT_LEAVES = frozenset(
    {
        "kernel",
        "bias",
        "gamma",
        "beta",
        "word_embeddings",
        "token_type_embeddings",
        "position_embeddings",
        "output_bias",
        "output_weights",
    }
)
_MODEL_SCOPES = ("bert/", "cls/")
_MAX_LISTED = 25


class CheckpointMismatchError(UserError, ValueError):
    """The init checkpoint's variables do not match the model (missing, extra or misshapen)."""


@dataclasses.dataclass(frozen=True)
class LoadReport:
    """What `load_tf1_checkpoint` did.

    Attributes:
      path: the checkpoint prefix read.
      loaded: TF1 names assigned into the model, sorted.
      skipped: checkpoint variables that are not model weights (slots, global_step), sorted.
    """

    path: str
    loaded: tuple[str, ...]
    skipped: tuple[str, ...]


def resolve_checkpoint_path(path: str) -> str:
    """The checkpoint prefix for `path`: itself, or the latest checkpoint of a directory.

    Raises:
      DataError: nothing checkpoint-like exists at `path`.
    """
    if os.path.isdir(path):
        latest = tf.train.latest_checkpoint(path)
        if latest is None:
            raise DataError(f"init_checkpoint directory '{path}' holds no TF checkpoint")
        return latest
    if not tf.io.gfile.exists(path + ".index"):
        raise DataError(
            f"init_checkpoint '{path}' not found (expected '{path}.index' and its data files)"
        )
    return path


def _is_model_weight(name: str) -> bool:
    return name.startswith(_MODEL_SCOPES) and name.rsplit("/", 1)[-1] in _WEIGHT_LEAVES


def _listing(items: list[str]) -> str:
    shown = ", ".join(items[:_MAX_LISTED])
    more = len(items) - _MAX_LISTED
    return shown + (f", ... (+{more} more)" if more > 0 else "")


def check_variables(
    checkpoint_shapes: dict[str, list[int]], model_shapes: dict[str, tuple[int, ...]]
) -> list[str]:
    """Problems between a checkpoint's and the model's TF1-named weights (empty list: they match).

    Args:
      checkpoint_shapes: every variable of the checkpoint and its shape.
      model_shapes: the model's TF1 names and their shapes.

    Returns:
      One message per kind of problem (missing, shape mismatch, unexpected), each listing names.
    """
    missing = sorted(n for n in model_shapes if n not in checkpoint_shapes)
    mismatched = sorted(
        f"{n} (checkpoint {tuple(checkpoint_shapes[n])} vs model {tuple(model_shapes[n])})"
        for n in model_shapes
        if n in checkpoint_shapes and tuple(checkpoint_shapes[n]) != tuple(model_shapes[n])
    )
    unexpected = sorted(
        n for n in checkpoint_shapes if _is_model_weight(n) and n not in model_shapes
    )
    problems = []
    if missing:
        problems.append(f"{len(missing)} model variables missing from it: {_listing(missing)}")
    if mismatched:
        problems.append(f"{len(mismatched)} with other shapes: {_listing(mismatched)}")
    if unexpected:
        problems.append(
            f"{len(unexpected)} weights in it that the model lacks: {_listing(unexpected)}"
        )
    return problems


def load_tf1_checkpoint(model, path: str) -> LoadReport:
    """Assigns a TF1 BERT checkpoint's weights to `model` (a `BertPretrainer`) by variable name.

    All-or-nothing: every model weight must be in the checkpoint with the same shape, and every
    checkpoint weight under `bert/` or `cls/` must belong to the model; otherwise nothing is
    assigned. Runs in cross-replica context (under a strategy scope the assignment mirrors).

    Args:
      model: a built `BertPretrainer`.
      path: a checkpoint prefix (`.../model.ckpt-28252`) or a directory holding checkpoints.

    Returns:
      A `LoadReport` of the names loaded and skipped.

    Raises:
      DataError: the checkpoint is missing or unreadable.
      CheckpointMismatchError: its variables do not match the model; the message lists them.
    """
    prefix = resolve_checkpoint_path(path)
    try:
        reader = tf.train.load_checkpoint(prefix)
        checkpoint_shapes = reader.get_variable_to_shape_map()
    except tf.errors.OpError as e:  # NotFound, DataLoss, or "file is too short" (unknown)
        first_line = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise DataError(f"cannot read init_checkpoint '{prefix}': {first_line}") from None
    targets = model.tf1_variables()
    mesh = getattr(model, "mesh", None) or DeviceMesh()  # the mesh the model was built for
    model_shapes = {name: whole_shape(var, mesh) for name, var in targets.items()}
    problems = check_variables(checkpoint_shapes, model_shapes)
    if problems:
        raise CheckpointMismatchError(
            f"init_checkpoint '{prefix}' does not match the model: " + "; ".join(problems)
        )
    for name, var in targets.items():
        value = reader.get_tensor(name)
        # A split variable (model parallelism) gets each replica's shard of the whole value.
        assign_whole(var, np.asarray(value).astype(var.dtype), mesh)
    skipped = sorted(n for n in checkpoint_shapes if n not in targets)
    return LoadReport(path=prefix, loaded=tuple(sorted(targets)), skipped=tuple(skipped))
