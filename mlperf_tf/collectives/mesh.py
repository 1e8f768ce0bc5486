"""Provides `Mesh`, the all-reduce's R x C view of the data groups (`--mesh=RxC`), and the checks
of the gradient-summation run settings.

`--mesh` is not a second device mesh. The run has one (`mlperf_tf.parallel.DeviceMesh`: data,
expert, spatial, model); a replicated weight's gradient is summed over the replicas that read
different batches, its `batch_shards` data groups, and this R x C grid is how the all-reduce
algorithms (`hierarchical`, `torus2d`) lay those groups out: rows are the groups of
`hierarchical` (a host's devices by default) and the first axis of `torus2d`. A sum group of
another size (e.g. an expert-split weight's) gets the default grid of its size.
"""

from __future__ import annotations

import dataclasses
import math

from mlperf_tf.distribute import CLUSTER_RESOLVERS
from mlperf_tf.errors import UserError

ALGORITHMS = ("auto", "ring", "hierarchical", "torus2d")


@dataclasses.dataclass(frozen=True)
class Mesh:
    """The all-reduce's view of a sum group: its members (by rank, not replica id) laid out
    row-major, member `i` at row `i // cols`, column `i % cols`.

    Rows are the groups of `hierarchical` (a host's devices when the default mesh is used on
    several workers) and the first axis of `torus2d`'s reduce-scatter.
    """

    rows: int
    cols: int

    @property
    def size(self) -> int:
        return self.rows * self.cols

    def row_of(self, replica: int) -> list[int]:
        """The replica ids in `replica`'s row, in column order."""
        row = replica // self.cols
        return [row * self.cols + c for c in range(self.cols)]

    def col_of(self, replica: int) -> list[int]:
        """The replica ids in `replica`'s column, in row order."""
        col = replica % self.cols
        return [r * self.cols + col for r in range(self.rows)]

    def __str__(self) -> str:
        return f"{self.rows}x{self.cols}"


def parse_mesh(text: str) -> Mesh | None:
    """Parses `--mesh=RxC` ("" means the default, None).

    Raises:
      UserError: `text` is not two positive integers joined by "x".
    """
    if not text:
        return None
    parts = text.lower().split("x")
    if len(parts) != 2 or not all(p.isdigit() and int(p) > 0 for p in parts):
        raise UserError(f"--mesh={text!r} must be RxC with positive integers R and C, e.g. 2x4")
    return Mesh(int(parts[0]), int(parts[1]))


def default_mesh(num_replicas: int, *, num_workers: int = 1) -> Mesh:
    """The mesh used when `--mesh` is not given.

    Several workers: one row per worker (so `hierarchical` groups a host's devices). One worker:
    the most square factorisation R x C with R <= C (8 -> 2x4, 4 -> 2x2, 6 -> 2x3).
    """
    if num_workers > 1 and num_replicas % num_workers == 0:
        return Mesh(num_workers, num_replicas // num_workers)
    rows = max(r for r in range(1, math.isqrt(num_replicas) + 1) if num_replicas % r == 0)
    return Mesh(rows, num_replicas // rows)


def check_settings(*, all_reduce: str, mesh: str, pack_mb: float, cluster_resolver: str) -> None:
    """Validates the gradient-summation run settings that need no strategy (RunConfig time).

    Raises:
      UserError: an unknown algorithm or resolver, a malformed mesh, or a negative pack size.
    """
    if all_reduce not in ALGORITHMS:
        raise UserError(f"--all_reduce={all_reduce!r} is not one of {', '.join(ALGORITHMS)}")
    if cluster_resolver not in CLUSTER_RESOLVERS:
        raise UserError(
            f"--cluster_resolver={cluster_resolver!r} is not one of {', '.join(CLUSTER_RESOLVERS)}"
        )
    parse_mesh(mesh)
    if not math.isfinite(pack_mb) or pack_mb < 0:
        raise UserError(f"--pack_mb ({pack_mb}) must be >= 0 (0: one collective per tensor)")


def resolve_mesh(text: str, num_replicas: int, *, algorithm: str, num_workers: int = 1) -> Mesh:
    """The mesh for a run with `num_replicas` replicas (checks that need the strategy).

    Raises:
      UserError: the mesh does not multiply to the replica count, or `torus2d` runs on one
        replica.
    """
    if algorithm == "torus2d" and num_replicas < 2:
        raise UserError(
            f"--all_reduce=torus2d needs at least 2 replicas; this run has {num_replicas}"
        )
    mesh = parse_mesh(text) or default_mesh(num_replicas, num_workers=num_workers)
    if mesh.size != num_replicas:
        raise UserError(
            f"--mesh={mesh} has {mesh.size} replicas but the strategy has {num_replicas}"
        )
    return mesh
