"""Tests of the mesh and of the one-line errors for wrong gradient-summation settings."""

import pytest

from mlperf_tf.collectives import mesh
from mlperf_tf.errors import UserError
from mlperf_tf.runner import RunConfig


@pytest.mark.parametrize(
    ("replicas", "workers", "expected"),
    [(8, 1, (2, 4)), (4, 1, (2, 2)), (6, 1, (2, 3)), (7, 1, (1, 7)), (1, 1, (1, 1)),
     (4, 2, (2, 2)), (2, 2, (2, 1)), (16, 1, (4, 4))],
)  # fmt: skip
def test_default_mesh_is_most_square_or_a_row_per_worker(replicas, workers, expected):
    m = mesh.default_mesh(replicas, num_workers=workers)
    assert (m.rows, m.cols) == expected


def test_rows_and_columns_partition_the_replicas():
    m = mesh.Mesh(2, 4)
    assert m.row_of(5) == [4, 5, 6, 7]
    assert m.col_of(5) == [1, 5]
    rows = {tuple(m.row_of(r)) for r in range(8)}
    assert sorted(x for row in rows for x in row) == list(range(8))


def test_parse_mesh():
    assert mesh.parse_mesh("2x4") == mesh.Mesh(2, 4)
    assert mesh.parse_mesh("") is None
    for bad in ("2", "2x", "0x4", "ax2", "2x2x2", "-1x4"):
        with pytest.raises(UserError, match="--mesh"):
            mesh.parse_mesh(bad)


def test_a_mesh_that_does_not_multiply_to_the_replica_count_is_an_error():
    with pytest.raises(UserError, match=r"--mesh=2x3 has 6 replicas but the strategy has 4"):
        mesh.resolve_mesh("2x3", 4, algorithm="ring")


def test_torus2d_on_one_replica_is_an_error():
    with pytest.raises(UserError, match="torus2d needs at least 2 replicas; this run has 1"):
        mesh.resolve_mesh("", 1, algorithm="torus2d")


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [("pack_mb", -1.0, r"--pack_mb \(-1.0\) must not be negative"),
     ("all_reduce", "tree", "--all_reduce='tree' is not one of"),
     ("mesh", "4by2", "--mesh='4by2' must be RxC"),
     ("cluster_resolver", "mpi", "--cluster_resolver='mpi' is not one of")],
)  # fmt: skip
def test_run_config_rejects_wrong_settings_with_one_line(tmp_path, field, value, message):
    with pytest.raises(UserError, match=message) as info:
        RunConfig(model_dir=str(tmp_path), **{field: value})
    assert "\n" not in str(info.value)
