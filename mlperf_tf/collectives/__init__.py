"""Provides the gradient summation of the runner: all-reduce algorithms on a replica mesh,
gradient packing, weight-update sharding, and the gather that saves shards held by other
workers whole (see README.md)."""

from mlperf_tf.collectives.mesh import ALGORITHMS, CLUSTER_RESOLVERS, Mesh, check_settings
from mlperf_tf.collectives.summer import GradientSummer, Settings, record_choices
from mlperf_tf.collectives.whole import bind_gathers

__all__ = ["ALGORITHMS", "CLUSTER_RESOLVERS", "GradientSummer", "Mesh", "Settings", "bind_gathers",
           "check_settings", "record_choices"]  # fmt: skip
