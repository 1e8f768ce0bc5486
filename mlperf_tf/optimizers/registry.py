"""Provides the optimizer registry: optimizers as plug-ins, found through entry points.

As MLCommons' AlgoPerf treats a training algorithm as a submission, an optimizer here is a
plug-in that any benchmark can run by name (its config's `opt_name`). A package registers one
with an entry point in the group `mlperf_tf.optimizers` naming an `OptimizerPlugin`, e.g. in its
setup.py:

    entry_points={"mlperf_tf.optimizers": ["my_opt = my_pkg.opt:PLUGIN"]}

The built-in optimizers (sgd, lars, lamb, adam, neumann, nlcg, kfac) are registered the same way,
in this suite's setup.py: nothing here lists them.

A plug-in declares its hyperparameters as a frozen dataclass whose fields are named after their
MLPerf log keys (e.g. `lars_opt_momentum`). `resolve_hparams` fills each field from, in order:
the benchmark config's `opt_params` ("key=value" strings), the benchmark's optimizer config field
of the same name (or one of the field's `aliases`, e.g. SSD's `momentum`), the dataclass default.
The learning rate (or schedule) stays the benchmark's: a plug-in gets it, already built.
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import inspect
import typing
from collections.abc import Callable, Iterable
from typing import Any

import keras

from mlperf_tf import config as config_lib
from mlperf_tf.errors import UserError

ENTRY_POINT_GROUP = "mlperf_tf.optimizers"
OPT_NAME = "opt_name"  # the MLPerf log key `mlperf_logging.mllog.constants.OPT_NAME`


class UnknownOptimizerError(UserError, KeyError):
    """No optimizer is registered under the requested name."""

    def __str__(self):  # KeyError would quote the message
        return self.args[0]


def alias(default, *names: str, argument: str | None = None):
    """A dataclass field with a default and other config field names it may be read from.

    Args:
      default: the field's default.
      *names: names a benchmark config may use for the same setting (e.g. "momentum").
      argument: the optimizer's constructor argument that the field feeds, where its name
        is not the field's name less a prefix (see `fields_as_arguments`).
    """
    return dataclasses.field(default=default, metadata={"aliases": names, "argument": argument})


def fields_as_arguments(optimizer_class: Callable[..., Any], *prefixes: str, **fixed):
    """A plug-in's `make` that passes every hyperparameter to `optimizer_class` by keyword.

    The fields are named after MLPerf log keys (`lars_opt_momentum`) and the constructor's
    arguments after what they are (`momentum`): a field's keyword is its name less the first
    of `prefixes` it starts with, or the `argument` its `alias` names. So the mapping is
    mechanical, and a setting is declared once, in the hyperparameter dataclass.

    Args:
      optimizer_class: the optimizer (any callable taking the learning rate and keywords).
      *prefixes: the field-name prefixes to drop, tried in order (e.g. "lars_opt_", "lars_").
      **fixed: further keyword arguments passed unchanged (settings that are no hyperparameter).
    """

    def make(hparams, learning_rate) -> keras.optimizers.Optimizer:
        arguments = {
            _argument(field, prefixes): getattr(hparams, field.name)
            for field in dataclasses.fields(hparams)
        }
        return optimizer_class(learning_rate, **arguments, **fixed)

    return make


def hparams_from_arguments(optimizer_class: type, prefix: str, *extra) -> type:
    """The hyperparameter dataclass of an optimizer whose settings have no MLPerf log keys.

    One field `prefix + argument` per keyword-only constructor argument with a default (but
    `name`), of the argument's type and default: each default is declared once, in the
    constructor, and `fields_as_arguments(optimizer_class, prefix)` maps the fields back.

    Args:
      optimizer_class: the optimizer class.
      prefix: the fields' prefix (e.g. "neumann_").
      *extra: further fields, (name, type, default or `alias(...)`), after those: for
        arguments the class takes through `**kwargs` (e.g. K-FAC's base-update momentum).
    """
    hints = typing.get_type_hints(optimizer_class.__init__)
    parameters = inspect.signature(optimizer_class.__init__).parameters.values()
    fields = [
        (prefix + p.name, hints[p.name], p.default)
        for p in parameters
        if p.kind is p.KEYWORD_ONLY and p.default is not p.empty and p.name != "name"
    ]
    hparams = dataclasses.make_dataclass(
        f"{optimizer_class.__name__}Hparams", [*fields, *extra], frozen=True, kw_only=True
    )
    hparams.__module__ = optimizer_class.__module__
    hparams.__doc__ = (
        f"Registry hyperparameters of `{optimizer_class.__name__}`: its constructor's "
        f"arguments, prefixed `{prefix}` (MLPerf has no keys for them)."
    )
    return hparams


def _argument(field: dataclasses.Field, prefixes: tuple[str, ...]) -> str:
    """The constructor keyword of a hyperparameter field (see `fields_as_arguments`)."""
    if field.metadata.get("argument"):
        return field.metadata["argument"]
    for prefix in prefixes:
        if field.name.startswith(prefix):
            return field.name[len(prefix) :]
    raise TypeError(
        f"hyperparameter `{field.name}` starts with none of the prefixes {prefixes} "
        "and names no `argument`."
    )


@dataclasses.dataclass(frozen=True, kw_only=True)
class OptimizerPlugin:
    """One registered optimizer.

    Attributes:
      hparams_class: a frozen dataclass of the optimizer's hyperparameters (not the learning
        rate), fields named after their MLPerf log keys, each with a default.
      make: `make(hparams, learning_rate) -> keras.optimizers.Optimizer`, called inside the
        strategy scope; `learning_rate` is a float or a Keras learning-rate schedule.
      log_name: the value logged as MLPerf `opt_name` (e.g. "lars"); defaults to the name the
        plug-in is registered under.
    """

    hparams_class: type
    make: Callable[[Any, Any], keras.optimizers.Optimizer]
    log_name: str | None = None

    def __post_init__(self):
        if not dataclasses.is_dataclass(self.hparams_class):
            raise TypeError(f"`hparams_class` ({self.hparams_class!r}) must be a dataclass.")


def available() -> dict[str, str]:
    """Maps every registered optimizer name to its entry point target ("module:attribute")."""
    return {
        entry_point.name: entry_point.value
        for entry_point in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP)
    }


def get(name: str) -> OptimizerPlugin:
    """Returns the plug-in registered under `name`.

    Raises:
      UnknownOptimizerError: no optimizer has that name (the message lists the known ones).
    """
    for entry_point in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
        if entry_point.name == name:
            plugin = entry_point.load()
            if not isinstance(plugin, OptimizerPlugin):
                raise UserError(
                    f"optimizer entry point '{name}' ({entry_point.value}) is a "
                    f"{type(plugin).__name__}, not an OptimizerPlugin"
                )
            return plugin
    known = sorted(available())
    hint = (
        ", ".join(known)
        if known
        else "none: reinstall the package (pip install --no-deps -e .) to register them"
    )
    raise UnknownOptimizerError(f"unknown optimizer '{name}' (registered: {hint})")


def check_opt_name(name: str, native: Iterable[str] = ()) -> None:
    """Validates a benchmark config's `opt_name`: one of its `native` optimizers or registered.

    Raises:
      ConfigError: neither (the message lists both).
    """
    native = tuple(native)
    if name in native:
        return
    known = available()
    if name not in known:
        choices = ", ".join([*native, *sorted(n for n in known if n not in native)])
        raise config_lib.ConfigError(
            f"`optimizer.opt_name` ({name!r}) must be a registered optimizer ({choices})."
        )


def parse_params(params: Iterable[str]) -> dict[str, str]:
    """Parses "key=value" strings (the config's `opt_params`) into a dict of flag texts.

    Raises:
      UserError: an entry has no "=".
    """
    parsed = {}
    for item in params:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise UserError(f"`opt_params` entry ({item!r}) must be key=value")
        parsed[key.strip()] = value.strip()
    return parsed


def resolve_hparams(name: str, config: Any = None, params: Iterable[str] = ()) -> Any:
    """The hyperparameters of optimizer `name` for a benchmark's optimizer config.

    Args:
      name: a registered optimizer name.
      config: the benchmark's optimizer config (a dataclass), or None: fields of the
        hyperparameter dataclass are read from it by name or alias when it has them.
      params: "key=value" overrides by hyperparameter field name (the config's `opt_params`),
        parsed to the field's type.

    Returns:
      An instance of the plug-in's `hparams_class`.

    Raises:
      UnknownOptimizerError: `name` is not registered.
      ConfigError: an override names no hyperparameter of this optimizer or does not parse.
    """
    plugin = get(name)
    values = {}
    for field in dataclasses.fields(plugin.hparams_class):
        for source in (field.name, *field.metadata.get("aliases", ())):
            if config is not None and hasattr(config, source):
                values[field.name] = getattr(config, source)
                break
    try:
        hparams = plugin.hparams_class(**values)
        overrides = {key: text for key, text in parse_params(params).items()}
        return config_lib.override(hparams, overrides)
    except config_lib.ConfigError as e:
        raise config_lib.ConfigError(f"optimizer '{name}': {e}") from None


def build(
    name: str, learning_rate, config: Any = None, params: Iterable[str] = ()
) -> keras.optimizers.Optimizer:
    """Builds optimizer `name` (call inside the strategy scope).

    Args:
      name: a registered optimizer name (the benchmark config's `opt_name`).
      learning_rate: a float or a `keras.optimizers.schedules.LearningRateSchedule`.
      config, params: as for `resolve_hparams`.
    """
    return get(name).make(resolve_hparams(name, config, params), learning_rate)


def mlperf_hparams(name: str, config: Any = None, params: Iterable[str] = ()) -> dict[str, Any]:
    """The MLPerf log keys and values of optimizer `name`: `opt_name` and its hyperparameters."""
    plugin = get(name)
    hparams = resolve_hparams(name, config, params)
    return {OPT_NAME: plugin.log_name or name, **dataclasses.asdict(hparams)}
