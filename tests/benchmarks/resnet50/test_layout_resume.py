"""ResNet-50 checkpoints across layouts: a run saved at `--spatial_partition=2x2` on 4 devices
resumes on 2 devices (data parallelism, another data-axis size), and a run saved on 1 device
resumes at `--spatial_partition=2` (`tests/layout_resume.py` says what is checked)."""

import pytest

from mlperf_tf import registry
from tests.layout_resume import Layout, assert_resumes

pytestmark = [pytest.mark.numerics, pytest.mark.slow]


def _resnet():
    resnet = registry.get("resnet50")
    return resnet(resnet.preset("smoke"))


def test_spatial_2x2_on_4_devices_resumes_on_2_data_replicas(tmp_path):
    assert_resumes(
        _resnet, saved=Layout(4, spatial_partition="2x2"), resumed=Layout(2), model_dir=tmp_path
    )


def test_1_device_resumes_at_spatial_2(tmp_path):
    assert_resumes(
        _resnet, saved=Layout(1), resumed=Layout(2, spatial_partition="2"), model_dir=tmp_path
    )
