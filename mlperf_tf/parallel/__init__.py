"""Model parallelism for the runner: one device mesh (`mesh.DeviceMesh`), set once per run as the
ambient mesh (`context.use_mesh`, read with `current_mesh`), and layouts over it."""

from mlperf_tf.parallel.context import current_mesh, use_mesh
from mlperf_tf.parallel.mesh import AXES, DeviceMesh, build_mesh

__all__ = ["AXES", "DeviceMesh", "build_mesh", "current_mesh", "use_mesh"]
