"""Provides the frozen-dataclass config base classes and typed `--config.a.b=value` overrides."""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from collections.abc import Sequence
from typing import Any

from mlperf_tf import listflags
from mlperf_tf.errors import UserError


class ConfigError(UserError, ValueError):
    """A config override names an unknown key or gives a value of the wrong type."""


def require_positive_int(name: str, value: Any) -> None:
    """Raises ConfigError naming the field unless `value` is an int >= 1 (bools are not ints here)."""
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_INT:
        raise ConfigError(f"`{name}` ({value!r}) must be a positive integer.")


# Beyond these a config value means nothing on any system: counts and sizes are int32 in the
# compiled loops, and a float of 1e12 epochs, steps or seconds is "forever" in disguise.
MAX_INT = 2**31 - 1
MAX_NUMBER = 1e12


def require(
    config: Any,
    *,
    prefix: str = "",
    positive_int: Sequence[str] = (),
    non_negative_int: Sequence[str] = (),
    positive: Sequence[str] = (),
    non_negative: Sequence[str] = (),
    fraction: Sequence[str] = (),
) -> None:
    """Validates fields of `config` by name; the one place the benchmarks' configs check numbers.

    Args:
      config: a config dataclass (called from its `__post_init__`).
      prefix: how the fields are addressed in overrides, e.g. "optimizer." (for the message).
      positive_int: fields that must be ints >= 1.
      non_negative_int: fields that must be ints >= 0.
      positive: fields that must be finite numbers > 0.
      non_negative: fields that must be finite numbers >= 0.
      fraction: fields that must be in [0, 1) (probabilities, momenta, smoothing).

    Raises:
      ConfigError: the first field that breaks its rule, named with its value.
    """
    rules = (
        (
            positive_int,
            lambda v: _is_int(v) and 1 <= v <= MAX_INT,
            f"a positive integer (at most {MAX_INT})",
        ),
        (
            non_negative_int,
            lambda v: _is_int(v) and 0 <= v <= MAX_INT,
            f"a non-negative integer (at most {MAX_INT})",
        ),
        (
            positive,
            lambda v: _is_number(v) and 0 < v <= MAX_NUMBER,
            f"positive (at most {MAX_NUMBER:g})",
        ),
        (
            non_negative,
            lambda v: _is_number(v) and 0 <= v <= MAX_NUMBER,
            f"non-negative (at most {MAX_NUMBER:g})",
        ),
        (fraction, lambda v: _is_number(v) and 0 <= v < 1, "in [0, 1)"),
    )
    for names, ok, what in rules:
        for name in names:
            value = getattr(config, name)
            if not ok(value):
                raise ConfigError(f"`{prefix}{name}` ({value!r}) must be {what}.")


def require_adamw(
    config: Any, *, positive_int: Sequence[str] = (), fraction: Sequence[str] = ()
) -> None:
    """Validates an AdamW `optimizer` config's MLPerf-named fields (base LR, epsilon and weight
    decay >= 0, betas in [0, 1)) and the further `positive_int` and `fraction` fields named.

    Raises:
      ConfigError: the first field that breaks its rule, named with its value.
    """
    require(
        config,
        prefix="optimizer.",
        non_negative=("opt_base_learning_rate", "opt_adamw_epsilon", "opt_adamw_weight_decay"),
        positive_int=positive_int,
        fraction=("opt_adamw_beta_1", "opt_adamw_beta_2", *fraction),
    )


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


@dataclasses.dataclass(frozen=True, kw_only=True)
class BenchmarkConfig:
    """Fields every benchmark config has; benchmarks subclass it and add their own.

    Sizes are in examples (images, sentence pairs, sequences) unless a name says otherwise.

    Attributes:
      global_batch_size: examples in one optimizer step over all replicas.
      eval_batch_size: examples in one eval step over all replicas.
      train_examples: examples in one training epoch.
      eval_examples: examples in the whole eval set.
      max_epochs: the budget: the run is aborted when it ends without reaching the target.
      data_dir: where the benchmark's TFRecords are; "" means synthetic data.
      gradient_accumulation_steps: micro batches summed into one optimizer step.
      quality_target: eval value that ends the run with status success.
      eval_every_epochs: epochs between evaluations (epoch-based schedules; `eval_schedule`).
      eval_offset_epochs: the first evaluation runs after this many epochs, then every
        `eval_every_epochs`; 0 means the first runs after `eval_every_epochs` (MLPerf ResNet's
        `eval_offset_epochs`). Must be below `eval_every_epochs`.
      gradient_clip_norm: global-norm clip of the full-batch gradient (summed over replicas,
        before the optimizer); 0 disables clipping.
    """

    global_batch_size: int
    eval_batch_size: int
    train_examples: int
    eval_examples: int
    max_epochs: float
    data_dir: str = ""
    gradient_accumulation_steps: int = 1
    quality_target: float = 0.0
    eval_every_epochs: float = 1.0
    eval_offset_epochs: float = 0.0
    gradient_clip_norm: float = 0.0

    def __post_init__(self):
        if not _is_number(self.quality_target):
            raise ConfigError(
                f"`quality_target` ({self.quality_target!r}) must be a finite number."
            )
        require(
            self,
            positive_int=(
                "global_batch_size",
                "eval_batch_size",
                "train_examples",
                "eval_examples",
                "gradient_accumulation_steps",
            ),
            positive=("max_epochs", "eval_every_epochs"),
            non_negative=("eval_offset_epochs", "gradient_clip_norm"),
        )
        if self.global_batch_size % self.gradient_accumulation_steps:
            raise ConfigError(
                f"`global_batch_size` ({self.global_batch_size}) must be divisible by "
                f"`gradient_accumulation_steps` ({self.gradient_accumulation_steps})."
            )
        if self.eval_offset_epochs >= self.eval_every_epochs:
            raise ConfigError(
                f"`eval_offset_epochs` ({self.eval_offset_epochs!r}) must be below "
                f"`eval_every_epochs` ({self.eval_every_epochs!r})."
            )

    @property
    def synthetic(self) -> bool:
        """True when no data_dir is set: the benchmark feeds synthetic tensors of the real shapes."""
        return not self.data_dir

    @property
    def steps_per_epoch(self) -> int:
        """Optimizer steps in one epoch (at least 1)."""
        return max(1, self.train_examples // self.global_batch_size)


# A sample-scheduled `smoke` preset's budget: one epoch of this many steps of this batch.
SMOKE_BATCH = 8
SMOKE_STEPS = 6


def smoke_sizes(
    *, eval_batch_size: int, eval_examples: int, quality_target: float
) -> dict[str, Any]:
    """The `BenchmarkConfig` sizes of a `smoke` preset that counts samples: one epoch of
    `SMOKE_STEPS` steps of `SMOKE_BATCH` synthetic examples (no `data_dir`), so that each such
    preset runs the same few steps; the benchmark gives its eval batch, eval set and target."""
    return {
        "global_batch_size": SMOKE_BATCH,
        "eval_batch_size": eval_batch_size,
        "train_examples": SMOKE_BATCH * SMOKE_STEPS,
        "eval_examples": eval_examples,
        "max_epochs": 1.0,
        "quality_target": quality_target,
        "data_dir": "",
    }


def field_paths(config: Any, prefix: str = "") -> dict[str, Any]:
    """Maps every leaf field's dotted path (e.g. `optimizer.lars_opt_weight_decay`) to its value."""
    paths = {}
    for field in dataclasses.fields(config):
        value = getattr(config, field.name)
        path = f"{prefix}{field.name}"
        if dataclasses.is_dataclass(value):
            paths.update(field_paths(value, path + "."))
        else:
            paths[path] = value
    return paths


def _field_type(config: Any, name: str):
    hints = typing.get_type_hints(type(config))
    return hints[name]


def parse_value(text: str, annotation, key: str) -> Any:
    """Parses `text` as a value of type `annotation`; raises ConfigError naming `key` otherwise."""
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin in (typing.Union, types.UnionType):
        if text.lower() in ("none", "null") and type(None) in args:
            return None
        errors = []
        for arg in args:
            if arg is type(None):
                continue
            try:
                return parse_value(text, arg, key)
            except ConfigError as e:
                errors.append(str(e))
        raise ConfigError(errors[0] if errors else f"config key '{key}': cannot parse {text!r}")
    if origin is typing.Literal:
        for choice in args:
            if str(choice) == text:
                return choice
        raise ConfigError(f"config key '{key}' must be one of {list(args)}, got {text!r}")
    if origin is tuple:
        # The one list split (mlperf_tf/listflags.py); spaces after commas are fine here (a tuple
        # is often pasted from its repr), an empty element (`1,,2`) is not. `()` is empty.
        inner = text.strip("()[] ")
        items = [t.strip() for t in listflags.split_top_level(inner)]
        if len(items) == 2 and items[0] and not items[1]:
            items = items[:1]  # `(3,)`: Python's one-element tuple
        if "" in items:
            raise ConfigError(
                f"config key '{key}': element {items.index('') + 1} of {text!r} is empty"
            )
        item_type = args[0] if args else str
        return tuple(parse_value(item, item_type, key) for item in items)
    if annotation is bool:
        lowered = text.lower()
        if lowered in ("true", "1", "yes"):
            return True
        if lowered in ("false", "0", "no"):
            return False
        raise ConfigError(f"config key '{key}' expects a bool (true/false), got {text!r}")
    if annotation is int:
        try:
            return int(text)
        except ValueError:
            raise ConfigError(f"config key '{key}' expects an int, got {text!r}") from None
    if annotation is float:
        try:
            value = float(text)
        except ValueError:
            raise ConfigError(f"config key '{key}' expects a float, got {text!r}") from None
        if not math.isfinite(value):  # nan/inf mean nothing in a config; 0 is "off" where it is
            raise ConfigError(f"config key '{key}' expects a finite number, got {text!r}")
        return value
    if annotation is str:
        return text
    raise ConfigError(
        f"config key '{key}' has type {annotation!r}, which cannot be set from a flag"
    )


def split_config_overrides(argv: Sequence[str]) -> tuple[list[str], dict[str, str]]:
    """Separates `--config.a.b=value` arguments (typed config overrides) from the other flags.

    Raises:
      ValueError: an argument starts with `--config.` but has no key or no `=value`.
    """
    rest, overrides = [], {}
    for arg in argv:
        if arg.startswith("--config."):
            key, sep, value = arg[len("--config.") :].partition("=")
            if not sep or not key:
                raise ValueError(f"config override {arg!r} must look like --config.key=value")
            overrides[key] = value
        else:
            rest.append(arg)
    return rest, overrides


def override(config: Any, overrides: dict[str, str]) -> Any:
    """Returns `config` with dotted-path overrides applied, each parsed to its field's type.

    Args:
      config: a frozen dataclass instance (a benchmark config).
      overrides: maps dotted paths such as `optimizer.lars_opt_weight_decay` to flag text.

    Raises:
      ConfigError: a path is not a field of the config, or a value does not parse to its type.
    """
    for key, text in overrides.items():
        config = _override_one(config, key.split("."), text, key)
    return config


def _override_one(config: Any, parts: list[str], text: str, key: str) -> Any:
    names = {f.name for f in dataclasses.fields(config)}
    head = parts[0]
    if head not in names:
        known = ", ".join(sorted(field_paths(config)))
        raise ConfigError(f"unknown config key '{key}' (known keys: {known})")
    value = getattr(config, head)
    if len(parts) > 1:
        if not dataclasses.is_dataclass(value):
            raise ConfigError(f"unknown config key '{key}': '{head}' has no sub-fields")
        new_value = _override_one(value, parts[1:], text, key)
    else:
        if dataclasses.is_dataclass(value):
            raise ConfigError(f"config key '{key}' is a group; set one of its fields instead")
        new_value = parse_value(text, _field_type(config, head), key)
    try:
        return dataclasses.replace(config, **{head: new_value})
    except ConfigError as e:
        raise ConfigError(f"config key '{key}'={text!r}: {e}") from None


def to_dict(config: Any) -> dict[str, Any]:
    """A JSON-friendly nested dict of the config, for logs and checkpoints' metadata."""
    return dataclasses.asdict(config)
