"""Tests for mlperf_tf.optimizers.registry: built-ins by entry point, hparams from configs."""

import dataclasses
import textwrap

import keras
import pytest

from mlperf_tf import config as config_lib
from mlperf_tf.config import ConfigError
from mlperf_tf.optimizers import KFAC, LAMB, LARS, NLCG, AdamW, FusedAdam, Neumann, registry
from tests import processes

BUILTINS = {
    "sgd": keras.optimizers.SGD,
    "lars": LARS,
    "lamb": LAMB,
    "adam": FusedAdam,
    "adamw": AdamW,
    "neumann": Neumann,
    "nlcg": NLCG,
    "kfac": KFAC,
}


@pytest.mark.parametrize("name, cls", sorted(BUILTINS.items()))
def test_builtins_register_through_entry_points(name, cls):
    assert name in registry.available()
    optimizer = registry.build(name, 0.1)
    assert isinstance(optimizer, cls)
    hparams = registry.mlperf_hparams(name)
    assert hparams["opt_name"] == name and len(hparams) > 1


@dataclasses.dataclass(frozen=True)
class SSDLikeConfig:
    momentum: float = 0.8  # an alias of sgd_opt_momentum
    opt_params: tuple[str, ...] = ()


@dataclasses.dataclass(frozen=True)
class ResNetLikeConfig:
    lars_opt_momentum: float = 0.95
    lars_opt_weight_decay: float = 5e-5


def test_hparams_come_from_params_then_config_fields_then_defaults():
    assert registry.resolve_hparams("sgd", SSDLikeConfig()).sgd_opt_momentum == 0.8
    lars = registry.resolve_hparams("lars", ResNetLikeConfig(), ["lars_eeta=0.01"])
    assert (lars.lars_opt_momentum, lars.lars_opt_weight_decay, lars.lars_eeta) == (
        0.95,
        5e-5,
        0.01,
    )
    assert lars.lars_epsilon == 0.0  # the default
    optimizer = registry.build("lars", 0.1, ResNetLikeConfig(), ["lars_opt_momentum=0.5"])
    assert optimizer.momentum == 0.5 and optimizer.weight_decay_rate == 5e-5
    logged = registry.mlperf_hparams("lars", ResNetLikeConfig())
    assert logged["lars_opt_weight_decay"] == 5e-5 and logged["opt_name"] == "lars"


@dataclasses.dataclass(frozen=True, kw_only=True)
class PrefixedHparams:
    my_opt_momentum: float = 0.7
    my_nesterov: bool = True
    my_rate: float = registry.alias(0.0, argument="weight_decay")


def test_fields_as_arguments_drops_the_first_matching_prefix_or_takes_the_argument():
    make = registry.fields_as_arguments(LARS, "my_opt_", "my_", eeta=0.02)
    optimizer = make(PrefixedHparams(my_rate=1e-3), 0.1)
    assert isinstance(optimizer, LARS)
    assert (optimizer.momentum, optimizer.nesterov, optimizer.weight_decay_rate) == (
        0.7,
        True,
        1e-3,
    )
    assert optimizer.eeta == 0.02  # a fixed argument
    with pytest.raises(TypeError, match="`my_opt_momentum` starts with none of the prefixes"):
        registry.fields_as_arguments(LARS, "lars_")(PrefixedHparams(), 0.1)


class TinyOptimizer:
    def __init__(self, learning_rate, *, rate: float = 0.5, steps: int = 3, name="t", **kwargs):
        self.learning_rate, self.rate, self.steps = learning_rate, rate, steps


def test_hparams_from_arguments_has_the_keyword_defaults_then_the_extras():
    hparams = registry.hparams_from_arguments(
        TinyOptimizer, "tiny_", ("tiny_extra", float, registry.alias(1.0, "extra"))
    )
    assert [f.name for f in dataclasses.fields(hparams)] == [
        "tiny_rate",
        "tiny_steps",
        "tiny_extra",
    ]
    assert dataclasses.asdict(hparams()) == {"tiny_rate": 0.5, "tiny_steps": 3, "tiny_extra": 1.0}
    with pytest.raises(dataclasses.FrozenInstanceError):
        hparams().tiny_rate = 1.0
    # Overrides parse to the argument's type, and the fields map back to the arguments.
    overridden = config_lib.override(hparams(), {"tiny_steps": "7"})
    assert overridden.tiny_steps == 7
    made = registry.fields_as_arguments(TinyOptimizer, "tiny_")(overridden, 0.1)
    assert (made.rate, made.steps) == (0.5, 7)


@pytest.mark.parametrize(
    "name, params, error, message",
    [
        ("momentum_sgd", (), registry.UnknownOptimizerError, "unknown optimizer 'momentum_sgd'"),
        ("lars", ["lars_beta=1"], ConfigError, "optimizer 'lars': unknown config key"),
        ("lars", ["lars_eeta=big"], ConfigError, "expects a float"),
        ("lars", ["lars_eeta"], registry.UserError, "must be key=value"),
    ],
)
def test_bad_names_and_params_are_user_errors(name, params, error, message):
    with pytest.raises(error, match=message):
        registry.build(name, 0.1, None, params)


PLUGIN_SOURCE = """
import dataclasses
import keras
from mlperf_tf.optimizers.registry import OptimizerPlugin

@dataclasses.dataclass(frozen=True, kw_only=True)
class Hparams:
    tiny_scale: float = 0.5

def make(h, learning_rate):
    # A researcher's own optimizer: here SGD with tiny_scale as its momentum.
    return keras.optimizers.SGD(learning_rate, momentum=h.tiny_scale)

PLUGIN = OptimizerPlugin(hparams_class=Hparams, make=make, log_name="tiny_scaled_sgd")
"""


@pytest.fixture(scope="module")
def installed_optimizer(tmp_path_factory):
    """A third-party package, pip-installed into a folder, registering `tiny_sgd`."""
    source = tmp_path_factory.mktemp("opt_src")
    (source / "tiny_opt").mkdir()
    (source / "tiny_opt" / "__init__.py").write_text(PLUGIN_SOURCE)
    (source / "setup.py").write_text(textwrap.dedent("""
        from setuptools import setup
        setup(name="tiny-opt", version="0.1", packages=["tiny_opt"],
              entry_points={"mlperf_tf.optimizers": ["tiny_sgd = tiny_opt:PLUGIN"]})
    """))  # fmt: skip
    target = tmp_path_factory.mktemp("opt_site")
    processes.pip_install_target(source, target)
    return target


def test_third_party_optimizer_is_found_and_built(installed_optimizer, monkeypatch):
    monkeypatch.syspath_prepend(str(installed_optimizer))
    assert "tiny_sgd" in registry.available()
    optimizer = registry.build("tiny_sgd", 0.2, None, ["tiny_scale=0.25"])
    assert isinstance(optimizer, keras.optimizers.SGD) and optimizer.momentum == 0.25
    assert registry.mlperf_hparams("tiny_sgd") == {
        "opt_name": "tiny_scaled_sgd",
        "tiny_scale": 0.5,
    }
