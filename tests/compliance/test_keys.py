"""compliance.keys spells every key as the official constants do."""

from mlperf_logging.mllog import constants

from compliance import keys


def test_keys_equal_the_official_constants():
    names = [name for name in dir(keys) if name.isupper()]
    assert len(names) == 16
    for name in names:
        assert getattr(keys, name) == getattr(constants, name), name
