"""The architecture's rules, checked on the source: who may import what, and where SQL lives.

Every import counts, at module level or inside a function or an `if TYPE_CHECKING:` block: a lazy
import is still a dependency.
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from functools import cache
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "rpg_cli"
HEAVY = ("torch", "ray", "verl", "transformers", "sqlalchemy")


@cache
def modules() -> dict[str, Path]:
    """Every module of the package by dotted name (a package by its own name)."""
    out = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = list(path.relative_to(REPO).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


@cache
def imported_names(module: str) -> frozenset[str]:
    """Every absolute name the module imports (`from a import b` imports a.b)."""
    names = set()
    for node in ast.walk(ast.parse(modules()[module].read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, f"{module}: relative import; the project imports absolutely"
            names.update(f"{node.module}.{alias.name}" for alias in node.names)  # a.b when b is a module, else a
    return frozenset(names)


def project_imports(module: str) -> set[str]:
    """The project's modules that `module` imports."""
    found = set()
    for name in imported_names(module):
        while name and name not in modules():
            name = name.rpartition(".")[0]
        if name and name != module:
            found.add(name)
    return found


def third_party(module: str) -> set[str]:
    return {name.split(".")[0] for name in imported_names(module)}


def under(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def test_algorithms_import_nothing_of_the_project():
    for module in modules():
        if under(module, "rpg_cli.algorithms"):
            outside = {m for m in project_imports(module) if not under(m, "rpg_cli.algorithms")}
            assert not outside, f"{module} imports {outside}"


def test_backends_never_import_each_other():
    backends = {m.split(".")[2] for m in modules() if under(m, "rpg_cli.backends") and m.count(".") >= 2}
    assert backends == {"local", "verl"}
    for module in modules():
        if under(module, "rpg_cli.backends") and module.count(".") >= 2:
            own = module.split(".")[2]
            others = {
                m
                for m in project_imports(module)
                if under(m, "rpg_cli.backends") and m.count(".") >= 2 and m.split(".")[2] != own
            }
            assert not others, f"{module} imports {others}"


def test_only_the_cli_imports_typer_and_rich_and_nothing_imports_the_cli():
    assert {"rpg_cli.cli.common", "rpg_cli.cli.sweep"} <= set(modules())  # the rule sees the cli's modules
    for module in modules():
        if not under(module, "rpg_cli.cli") and module != "rpg_cli.__main__":  # `python -m rpg_cli` runs it
            assert not third_party(module) & {"typer", "rich"}, module
            assert not {m for m in project_imports(module) if under(m, "rpg_cli.cli")}, module


def test_only_the_store_imports_sqlalchemy_or_writes_sql():
    sql = re.compile(r"\b(SELECT .* FROM|INSERT INTO|UPDATE \w+ SET|DELETE FROM|CREATE TABLE)\b")
    for module, path in modules().items():
        if under(module, "rpg_cli.store"):
            continue
        assert "sqlalchemy" not in third_party(module), module
        strings = [
            n.value
            for n in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
            if isinstance(n, ast.Constant) and isinstance(n.value, str)
        ]
        assert not [s for s in strings if sql.search(s)], f"{module} holds SQL"


def test_no_import_cycle():
    graph = {m: project_imports(m) for m in modules()}
    state: dict[str, int] = {}  # 1: on the current path, 2: done

    def visit(module: str, path: list[str]) -> None:
        state[module] = 1
        for dep in sorted(graph[module]):
            if state.get(dep) == 1:
                pytest.fail("import cycle: " + " -> ".join(path[path.index(dep) :] + [module, dep]))
            if dep not in state:
                visit(dep, [*path, module])
        state[module] = 2

    for module in sorted(graph):
        if module not in state:
            visit(module, [])


def test_the_rules_see_a_violation():
    """The checks above read real imports: a lazy import inside a function is found."""
    assert "sqlalchemy" in third_party("rpg_cli.store.light")  # imported inside a function only
    assert "rpg_cli.store.db" in project_imports("rpg_cli.store.light")
    assert "rpg_cli.store.db" in project_imports("rpg_cli.store")  # under TYPE_CHECKING


@pytest.mark.parametrize("args", [["--help"], ["sweep", "--help"], ["eval", "--help"]])
def test_help_imports_no_heavy_package(args):
    code = (
        f"import sys, runpy; sys.argv = ['rpg', *{args!r}]\n"
        "try:\n    runpy.run_module('rpg_cli', run_name='__main__')\nexcept SystemExit:\n    pass\n"
        f"print('HEAVY', sorted(m for m in {HEAVY!r} if m in sys.modules), file=sys.stderr)"
    )
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert "HEAVY []" in result.stderr, result.stderr


def test_the_spec_imports_no_heavy_package():
    """The dry run reads specs, and the spec reads its defaults from rpg_cli.algorithms: never torch."""
    code = f"import sys, rpg_cli.spec, rpg_cli.inputs; print('HEAVY', sorted(m for m in {HEAVY!r} if m in sys.modules))"
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert "HEAVY []" in result.stdout, result.stdout + result.stderr


def test_backends_supply_their_part_through_their_launch_module():
    from rpg_cli.orchestration.plan import failure_reason, launcher

    log = "Traceback (most recent call last):\nValueError: Total available GPUs 0 is less than total desired GPUs 8\n"
    assert failure_reason("verl", log).startswith("verl needs 8 GPU(s)")  # verl's own reading
    assert failure_reason("local", log) == log.splitlines()[-1]  # no reading of its own: the last error
    assert failure_reason("hf", "") == "the job failed without output"  # a model `rpg eval` recorded: no backend
    assert callable(launcher("verl").check_install) and not hasattr(launcher("local"), "check_install")
    assert all(callable(launcher(backend).preflight) for backend in ("verl", "local"))  # rpg_cli/inputs.py


def test_architecture_md_names_every_package_and_module_of_the_top_level():
    """ARCHITECTURE.md is the map: every package and top-level module of rpg_cli/ is on it."""
    text = (REPO / "ARCHITECTURE.md").read_text()
    package = REPO / "rpg_cli"
    names = [p.name for p in package.iterdir() if (p / "__init__.py").exists()]
    names += [p.name for p in package.glob("*.py") if not p.name.startswith("_")]
    missing = [name for name in sorted(names) if (name if name.endswith(".py") else f"{name}/") not in text]
    assert not missing, f"ARCHITECTURE.md does not name {missing}"
