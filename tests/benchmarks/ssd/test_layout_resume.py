"""SSD checkpoints across layouts (one format, `mlperf_tf.checkpoints.run_checkpoint`): a run
saved at `--spatial_partition=2` resumes on 1 device, on 2 devices (spatial only) by default and
on 4 (2 data x 2 spatial, the case reported) when slow tests run; one saved on 1 device resumes
at `--spatial_partition=2`. The spatial model builds its layers in another order than the whole
one, so the earlier positional keys failed here ("incompatible tensor with shape (32,) ...
layer2_0_bn2/moving_mean"). `tests/layout_resume.py` says what is checked."""

import pytest

from mlperf_tf import registry
from tests.layout_resume import Layout, assert_resumes

pytestmark = pytest.mark.numerics


def _ssd():
    ssd = registry.get("ssd")
    return ssd(ssd.preset("smoke"))


@pytest.mark.slow  # 25 s idle; the default run resumes a split run with llama31_8b's (8 s)
def test_spatial_2_resumes_on_1_device(tmp_path):
    assert_resumes(
        _ssd, saved=Layout(2, spatial_partition="2"), resumed=Layout(1), model_dir=tmp_path
    )


@pytest.mark.slow
def test_2_data_x_2_spatial_on_4_devices_resumes_on_1_device(tmp_path):
    assert_resumes(
        _ssd, saved=Layout(4, spatial_partition="2"), resumed=Layout(1), model_dir=tmp_path
    )


@pytest.mark.slow
def test_1_device_resumes_at_spatial_2(tmp_path):
    assert_resumes(
        _ssd, saved=Layout(1), resumed=Layout(2, spatial_partition="2"), model_dir=tmp_path
    )
