"""Tests of the run flags: one per RunConfig field, defaults and help taken from the field."""

import dataclasses

import pytest
from absl import flags

from mlperf_tf import flags as run_flags
from mlperf_tf.runner import RunConfig
from mlperf_tf.runner import config as run_config_lib


@pytest.fixture
def parsed():
    """Parses argv with the run flags (defined once per process) and restores the defaults."""
    run_flags.define_flags()

    def parse(*argv):
        flags.FLAGS.unparse_flags()
        flags.FLAGS(["mlperf-tf run", *argv])
        return run_flags.run_config_from_flags()

    yield parse
    flags.FLAGS.unparse_flags()


def test_every_run_config_field_is_a_flag_with_its_default_and_help():
    run_flags.define_flags()
    for field in dataclasses.fields(RunConfig):
        flag = flags.FLAGS[field.name]
        assert flag.help.endswith(field.metadata["help"]) and field.metadata["help"]
        if field.default is not dataclasses.MISSING:
            assert flag.default == field.default, field.name
    assert flags.FLAGS["submission_platform"].default == run_config_lib.default_platform()
    assert flags.FLAGS["distribution"].parser.enum_values == list(
        run_config_lib.distribute.DISTRIBUTIONS
    )


def test_flags_build_the_same_run_config_as_the_dataclass(parsed):
    assert parsed("--model_dir=/tmp/m") == RunConfig(model_dir="/tmp/m")
    config = parsed("--model_dir=/tmp/m", "--echo_mlperf_log", "--steps_per_loop=7",
                    "--startup_timeout_s=9.5", "--resume_input=reseed")  # fmt: skip
    assert config == RunConfig(model_dir="/tmp/m", echo_mlperf_log=True, steps_per_loop=7,
                               startup_timeout_s=9.5, resume_input="reseed")  # fmt: skip


def test_the_old_startup_timeout_name_still_works(parsed):
    assert parsed("--model_dir=/m", "--startup_timeout=3").startup_timeout_s == 3.0


def test_a_bad_choice_is_a_flag_error(parsed):
    with pytest.raises(flags.IllegalFlagValueError, match="submission_division"):
        parsed("--model_dir=/m", "--submission_division=secret")
