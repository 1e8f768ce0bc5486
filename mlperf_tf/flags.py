"""Provides the `mlperf-tf run` flags: one per `RunConfig` field, plus what picks the benchmark.

The run flags are built from `dataclasses.fields(RunConfig)` — name, type, default and the field's
`help` metadata — so a new run setting is one `RunConfig` field and no default is written twice.
"""

from __future__ import annotations

import dataclasses
import typing

from absl import flags

from mlperf_tf.benchmark import PRESET_NAMES
from mlperf_tf.runner import RunConfig

FLAGS = flags.FLAGS

# Old flag names still accepted (README and scripts of earlier versions used them).
DEPRECATED_ALIASES = {"startup_timeout": "startup_timeout_s"}

_DEFINERS = {
    str: flags.DEFINE_string,
    bool: flags.DEFINE_bool,
    int: flags.DEFINE_integer,
    float: flags.DEFINE_float,
}


def _default(field: dataclasses.Field):
    if field.default is not dataclasses.MISSING:
        return field.default
    if field.default_factory is not dataclasses.MISSING:
        return field.default_factory()
    return None


def define_run_config_flags() -> None:
    """Defines one flag per `RunConfig` field (an enum flag where the field lists `choices`)."""
    hints = typing.get_type_hints(RunConfig)
    for field in dataclasses.fields(RunConfig):
        help_text = field.metadata["help"]
        choices = field.metadata.get("choices")
        if choices:
            flags.DEFINE_enum(field.name, _default(field), list(choices), help_text)
        else:
            _DEFINERS[hints[field.name]](field.name, _default(field), help_text)
    for alias, name in DEPRECATED_ALIASES.items():
        flags.DEFINE_alias(alias, name)


def define_flags() -> None:
    """Defines the run flags once (safe to call again)."""
    if "benchmark" in FLAGS:
        return
    flags.DEFINE_string("benchmark", None, "Registered benchmark name (see `mlperf-tf list`).")
    flags.DEFINE_string("preset", "smoke", f"Config preset: one of {', '.join(PRESET_NAMES)}.")
    flags.DEFINE_string("data_dir", "", "Overrides the preset's data_dir (TFRecords).")
    define_run_config_flags()


def run_config_from_flags() -> RunConfig:
    """The RunConfig of the parsed flags."""
    return RunConfig(
        **{field.name: FLAGS[field.name].value for field in dataclasses.fields(RunConfig)}
    )
