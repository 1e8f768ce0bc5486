"""Provides the gradient summation of the runner: all-reduce algorithms on a replica mesh,
gradient packing and weight-update sharding (see README.md)."""

from mlperf_tf.collectives.mesh import ALGORITHMS, CLUSTER_RESOLVERS, Mesh, check_settings
from mlperf_tf.collectives.summer import GradientSummer, Settings, record_choices

__all__ = ["ALGORITHMS", "CLUSTER_RESOLVERS", "GradientSummer", "Mesh", "Settings", "check_settings",
           "record_choices"]  # fmt: skip
