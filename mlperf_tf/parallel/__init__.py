"""Model parallelism for the runner: one device mesh (`mesh.DeviceMesh`) and layouts over it."""

from mlperf_tf.parallel.mesh import AXES, DeviceMesh, build_mesh

__all__ = ["AXES", "DeviceMesh", "build_mesh"]
