"""Provides the run's ambient device mesh: set once per run, read by the layers that split work.

Megatron-core's `parallel_state` and `keras.distribution.set_distribution` take the same view: a
model is written for one device, and the few layers that split work (tensor-parallel
projections, expert-parallel MoE, halo-exchange convolutions, grouped batch norm) find their
group on the run's mesh themselves. No model constructor takes a mesh: the runner enters
`use_mesh(mesh)` around everything it builds and traces, and a layer reads `current_mesh()`
when it is constructed (and keeps it, so a model traced later needs no context).

Outside any `use_mesh` the mesh is None: one replica, no split, every parallel layer a plain
layer. The context is per thread (a `threading.local`), so two runs in two threads of one
process (the tests do that) do not see each other's mesh.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

from mlperf_tf.parallel.mesh import DeviceMesh


class _Ambient(threading.local):
    mesh: DeviceMesh | None = None


_AMBIENT = _Ambient()


def current_mesh() -> DeviceMesh | None:
    """The mesh of the run being built or traced in this thread (None: no `use_mesh` entered)."""
    return _AMBIENT.mesh


@contextlib.contextmanager
def use_mesh(mesh: DeviceMesh | None) -> Iterator[DeviceMesh | None]:
    """Makes `mesh` the ambient mesh inside the `with` block (restores the previous one after).

    Args:
      mesh: the run's mesh, or None for one replica.

    Raises:
      TypeError: `mesh` is not a `DeviceMesh` or None.
    """
    if mesh is not None and not isinstance(mesh, DeviceMesh):
        raise TypeError(f"use_mesh takes a DeviceMesh or None, not {type(mesh).__name__}")
    previous = _AMBIENT.mesh
    _AMBIENT.mesh = mesh
    try:
        yield mesh
    finally:
        _AMBIENT.mesh = previous


def resolve(mesh: DeviceMesh | None) -> DeviceMesh | None:
    """`mesh` if given, else the ambient one: for the layers' transition from passed meshes."""
    return mesh if mesh is not None else current_mesh()
