"""Each environment variable is read in one place, so that every process reads it alike.

`GEM_SOURCE_MAPPING=my.yaml make demo` once landed another source: the CLI read the variable, but the
Dagster code location built its config from the others alone. The scan below finds every read of the
environment in the repository's Python (`os.environ.get`, `os.getenv`, `os.environ[...]`, `... in
os.environ`; setting or passing the environment to a child process is no read) and checks that each
GEM_* variable is read by its one reader in `READERS` alone, and every other variable by one module.
"""

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

# variable: the module (or package) that alone reads it, with a typed reader for everything else.
READERS = {
    "GEM_HOME": "gem_model.paths",  # GemPaths.from_env
    "DAGSTER_HOME": "gem_model.paths",  # GemPaths.dagster_home
    "GEM_PRESET": "gem_model.config",  # ConfigSources.from_env, for the CLI, entry points and LakeResource
    "GEM_CONFIG": "gem_model.config",
    "GEM_DATA_SOURCE": "gem_model.config",
    "GEM_SOURCE_MAPPING": "gem_model.config",
    "GEM_DATA_DIR": "gem_lake.sources",  # data_dir
    "GEM_SPARK_MASTER": "gem_lake.spark.session",  # SparkSettings.from_env
    "GEM_SPARK_JARS_DIR": "gem_lake.spark.session",
    "GEM_SPARK_JARS_PACKAGES": "gem_lake.spark.session",
    "GEM_SPARK_CONF": "gem_lake.spark.session",
    "GEM_DAGSTER_EXECUTOR": "dagster_project.definitions",
    "GEM_LAUNCHER": "dagster_project.resources.launchers",  # launcher_from_env
    "GEM_LAUNCHER_CONFIG": "dagster_project.resources.launchers",
    "GEM_KERNEL_DEVICE": "tests.conftest",
    "GEM_REQUIRE_SYSTEM_TESTS": "tests.conftest",  # system_test_unavailable
}


def _is_os(node: ast.AST, attribute: str) -> bool:
    return (
        isinstance(node, ast.Attribute)
        and node.attr == attribute
        and isinstance(node.value, ast.Name)
        and node.value.id == "os"
    )


def _is_environ(node: ast.AST) -> bool:
    return _is_os(node, "environ")


def _reads(tree: ast.Module) -> list[str]:
    """The variables `tree` reads: a string literal, or a name (a module-level string constant's value)."""
    constants = {
        target.id: node.value.value
        for node in tree.body
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)
        for target in node.targets
        if isinstance(target, ast.Name)
    }

    def name(key: ast.AST) -> str:
        if isinstance(key, ast.Constant):
            return str(key.value)
        return constants.get(key.id, key.id) if isinstance(key, ast.Name) else f"<{ast.unparse(key)}>"

    found = []
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.args
            and ((_is_environ(node.func.value) and node.func.attr == "get") or _is_os(node.func, "getenv"))
        ):
            found.append(name(node.args[0]))
        elif isinstance(node, ast.Subscript) and _is_environ(node.value) and isinstance(node.ctx, ast.Load):
            found.append(name(node.slice))
        elif isinstance(node, ast.Compare) and any(_is_environ(c) for c in node.comparators):
            found.append(name(node.left))
    return found


def _readers() -> dict[str, set[str]]:
    """variable: the modules that read it, over every Python file of the repository."""
    readers: dict[str, set[str]] = {}
    for path in sorted(REPO.rglob("*.py")):
        relative = path.relative_to(REPO)
        if any(part.startswith(".") for part in relative.parts):  # .venv, .git
            continue
        tree = ast.parse(path.read_text(), str(relative))
        assert not [n for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module == "os"], (
            f"{relative}: `from os import ...` hides reads of the environment from this scan; use os.environ"
        )
        module = ".".join(relative.with_suffix("").parts).removesuffix(".__init__")
        for variable in _reads(tree):
            readers.setdefault(variable, set()).add(module)
    return readers


def _within(module: str, reader: str) -> bool:
    return module == reader or module.startswith(f"{reader}.")


def test_the_scan_finds_every_form_of_read_and_no_write():
    tree = ast.parse(
        'import os\nA = "GEM_A"\nos.environ.get("GEM_B")\nos.getenv(A)\nos.environ["GEM_C"]\n'
        '"GEM_D" in os.environ\nos.environ["GEM_E"] = "1"\nos.environ.setdefault("GEM_F", "1")\n'
        'os.environ.pop("GEM_G", None)\nenv = {**os.environ, "GEM_H": "1"}\n'
    )
    assert sorted(_reads(tree)) == ["GEM_A", "GEM_B", "GEM_C", "GEM_D"]


def test_every_gem_variable_is_read_by_its_one_reader_alone():
    found = _readers()
    variables = {v for v in found if v.startswith("GEM_")} | set(READERS)
    wrong = {
        v: sorted(found.get(v, ()))
        for v in sorted(variables)
        if v not in READERS or not found.get(v) or not all(_within(m, READERS[v]) for m in found[v])
    }
    assert wrong == {}, (
        "read elsewhere than its reader in READERS (use that reader), or not listed there (add "
        f"it with its one reader), or no longer read (drop it): {wrong}"
    )


def test_every_other_variable_is_read_by_one_module():
    twice = {v: sorted(modules) for v, modules in _readers().items() if len(modules) > 1 and v not in READERS}
    assert twice == {}, f"read in several modules; give each one typed reader: {twice}"
