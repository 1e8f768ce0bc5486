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


# Parallelism that benchmarks reach only through `mlperf_tf.spmd` (and the plain layers of
# `mlperf_tf.layers`): the mesh, layouts and collectives behind it may move without a benchmark
# changing.
_PARALLEL_INTERNALS = (
    "mlperf_tf.parallel",
    "mlperf_tf.collectives",
    "mlperf_tf.layers.tensor_parallel",
    "mlperf_tf.layers.spatial",
    "mlperf_tf.layers.moe",
)
# Files still importing an internal, each with why; remove an entry when its file moves to
# `mlperf_tf.spmd`.
_INTERNALS_ALLOWED = {
    # The MoE metrics helpers (`moe.Collector`, `moe.summarize`); the Transformer's move onto
    # `mlperf_tf.lm`'s language-model base, which owns them, removes this.
    ("transformer/benchmark.py", "mlperf_tf.layers.moe"),
}


def _imported_modules(path: pathlib.Path) -> set[str]:
    """Every module `path` imports, anywhere in it: `from a.b import c` counts as `a.b` and, when
    `c` is a module of `a.b`, as `a.b.c` too."""
    modules = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            modules |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            modules.add(node.module)
            names = (f"{node.module}.{alias.name}" for alias in node.names)
            modules |= {name for name in names if _is_module(name)}
    return modules


def _is_module(name: str) -> bool:
    """Whether `name` is a module or package of this repository."""
    path = REPO.joinpath(*name.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def _is_internal(module: str) -> bool:
    return any(module == m or module.startswith(m + ".") for m in _PARALLEL_INTERNALS)


def test_benchmarks_import_parallelism_only_through_the_public_module():
    found = set()
    for path in _files("benchmarks"):
        name = path.relative_to(REPO / "benchmarks").as_posix()
        for module in _imported_modules(path):
            if _is_internal(module) and (name, module) not in _INTERNALS_ALLOWED:
                # `from mlperf_tf.layers import moe` imports the module `mlperf_tf.layers.moe`,
                # and `from mlperf_tf.parallel.layout import x` the module itself: both count.
                found.add((name, module))
    assert not found, f"import these through mlperf_tf.spmd: {sorted(found)}"


def test_the_guard_sees_every_form_of_an_internal_import(tmp_path):
    """The guard would catch an internal import written any of the usual ways."""
    for line in (
        "from mlperf_tf.parallel.layout import model_split",
        "from mlperf_tf.layers import moe",
        "import mlperf_tf.collectives.ops",
        "def f():\n    from mlperf_tf.layers.spatial import SpatialBuilder",
    ):
        path = tmp_path / "m.py"
        path.write_text(line + "\n", encoding="utf-8")
        assert any(_is_internal(m) for m in _imported_modules(path)), line
    path.write_text("from mlperf_tf.spmd import use_mesh\nfrom mlperf_tf.layers import lora\n")
    assert not any(_is_internal(m) for m in _imported_modules(path))


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
