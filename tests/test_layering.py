"""Tests of the package layering: the library emits MLPerf logs, `compliance/` only checks them.

`mlperf_tf/` and `benchmarks/` never import `compliance` (the CLI may, inside its check/score/report
commands only), and `compliance/` never imports TensorFlow.
"""

import ast
import pathlib

REPO = pathlib.Path(__file__).resolve().parent.parent


def _imports(path: pathlib.Path, top_level_only: bool) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    nodes = tree.body if top_level_only else list(ast.walk(tree))
    names = set()
    for node in nodes:
        if isinstance(node, ast.Import):
            names |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module.split(".")[0])
    return names


def _files(package: str) -> list[pathlib.Path]:
    files = sorted((REPO / package).rglob("*.py"))
    assert files, package
    return files


def test_the_library_and_benchmarks_never_import_compliance():
    for package in ("mlperf_tf", "benchmarks"):
        for path in _files(package):
            # The CLI is the one face over both: it imports compliance lazily, in a function.
            top_level_only = path == REPO / "mlperf_tf" / "cli.py"
            assert "compliance" not in _imports(path, top_level_only), path


def test_compliance_never_imports_tensorflow():
    for path in _files("compliance"):
        imported = _imports(path, top_level_only=False)
        assert not imported & {"tensorflow", "keras"}, (path, imported)


def _library_imports(package: str) -> set[str]:
    """The `mlperf_tf` subpackages (or top modules) that the files of `mlperf_tf/<package>`
    import, at any depth (lazy imports inside functions count)."""
    names = set()
    for path in _files(f"mlperf_tf/{package}"):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            modules = []
            if isinstance(node, ast.Import):
                modules = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                modules = [node.module]
                if node.module == "mlperf_tf":
                    modules = [f"mlperf_tf.{alias.name}" for alias in node.names]
            for module in modules:
                parts = module.split(".")
                if parts[0] == "mlperf_tf" and len(parts) > 1:
                    names.add(parts[1])
    return names


def test_collectives_import_no_optimizer():
    # An optimizer declares its sharded rule and the norms it needs (`sharded_update`,
    # `whole_norm_terms`); the collectives move pieces and sum squares, whatever the formula.
    assert "optimizers" not in _library_imports("collectives")


def test_collectives_build_on_parallel_never_the_reverse():
    # One direction: the gradient summer reads the mesh and each variable's layout, so
    # `collectives` imports `parallel`; `parallel` describes where shards lie and issues no
    # collective of the suite (the gather that saves shards across workers is bound to the
    # variables from `collectives`: `layout.set_gatherer`, `collectives.bind_gathers`).
    assert "parallel" in _library_imports("collectives")
    assert "collectives" not in _library_imports("parallel")
