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


# ---------------------------------------------------------------------------------------- the floors

# ARCHITECTURE.md's "Layers", top to bottom: a module imports its own floor and those below it, never one above.
# A floor is a package or a top-level module of rpg_cli/ by its name (`python -m rpg_cli` runs the cli).
LAYERS: tuple[frozenset[str], ...] = tuple(
    frozenset(names.split())
    for names in (
        "cli __main__",
        "orchestration evaluation report",
        "backends",
        "trackers",
        "store",
        "inputs model_shape cost",
        "spec",
        "datasets rewards stats metrics benchmarks rundir watch states gpu_stack custom_loss file_facts",
        "algorithms",
    )
)
# The arrows up by design (ARCHITECTURE.md): the spec builds its `trackers` block from the trackers' registry, and
# takes its `backend` from the backends' registry, which trackers/runs.py also asks how a backend reports.
UP_BY_DESIGN = {
    ("spec", "rpg_cli.trackers"),
    ("spec", "rpg_cli.backends.registry"),
    ("trackers", "rpg_cli.backends.registry"),
}
REGISTRY = "rpg_cli.backends.registry"


def floor(module: str) -> int:
    """The index in LAYERS of a module's floor (0: the top)."""
    name = module.split(".")[1]
    return next(i for i, names in enumerate(LAYERS) if name in names)


def drawn_floors() -> list[set[str]]:
    """The floors ARCHITECTURE.md draws under "## Layers": its indented block, floors apart by a line that is
    only `|`; on each line the names (`cli/`, `metrics.py`) before the first word that is not one."""
    text = (REPO / "ARCHITECTURE.md").read_text(encoding="utf-8")
    section = text.split("## Layers", 1)[1].split("\n## ", 1)[0]
    floors: list[set[str]] = [set()]
    for line in section.splitlines():
        if not line.startswith("    "):
            continue
        if line.strip() == "|":
            floors.append(set())
            continue
        for word in line.split():
            if not re.fullmatch(r"[a-z_]+(/|\.py)", word):
                break
            floors[-1].add(word.removesuffix("/").removesuffix(".py"))
    return floors


def test_the_floors_are_the_ones_architecture_md_draws():
    assert drawn_floors() == [set(names) - {"__main__"} for names in LAYERS]
    names = {m.split(".")[1] for m in modules() if m != "rpg_cli"}
    assert names == set().union(*LAYERS), "every package and top-level module of rpg_cli/ has its floor"


def test_no_module_imports_a_floor_above_its_own():
    assert not project_imports("rpg_cli"), "rpg_cli/__init__.py has no floor: it imports nothing of the project"
    up = []
    for module in set(modules()) - {"rpg_cli"}:
        for dep in project_imports(module):
            if dep != "rpg_cli" and floor(dep) < floor(module) and (module.split(".")[1], dep) not in UP_BY_DESIGN:
                up.append(f"{module} -> {dep}")
    assert not up, "imports of a floor above (ARCHITECTURE.md, Layers): " + ", ".join(sorted(up))


def reached(module: str) -> set[str]:
    """Every module of the project that importing `module` may import, itself included."""
    seen, todo = set(), [module]
    while todo:
        if (name := todo.pop()) not in seen:
            seen.add(name)
            todo.extend(project_imports(name))
    return seen


def test_the_registry_the_spec_reads_imports_no_spec():
    """The arrow up stays one arrow: the trackers' registry, and all it imports, imports nothing of the spec
    (trackers/runs.py, writers.py and export.py, which do, are not part of it)."""
    registry = reached("rpg_cli.trackers")
    assert {"rpg_cli.trackers.base", "rpg_cli.trackers.wandb"} <= registry
    assert not {m for m in registry if under(m, "rpg_cli.spec")}, sorted(registry)
    assert not {"rpg_cli.trackers.runs", "rpg_cli.trackers.writers", "rpg_cli.trackers.export"} & registry


def test_the_backends_registry_imports_nothing_of_the_project():
    """The spec and trackers/runs.py read it from below: it imports no backend (they are imported by name, on first
    use) and nothing else of the project, so the arrows up stop there."""
    assert project_imports(REGISTRY) == set()
    assert third_party(REGISTRY) <= {"__future__", "importlib", "math", "pathlib", "typing"}


def test_the_floor_rule_sees_an_arrow_up():
    """The rule reads real imports: inputs.py reads the spec only under TYPE_CHECKING and inside a function,
    and that puts it above the spec; the cli is above every other floor."""
    assert "rpg_cli.spec" in project_imports("rpg_cli.inputs") and floor("rpg_cli.inputs") < floor("rpg_cli.spec")
    assert [i for i, names in enumerate(LAYERS) if "cli" in names] == [0]


def test_algorithms_import_nothing_of_the_project():
    for module in modules():
        if under(module, "rpg_cli.algorithms"):
            outside = {m for m in project_imports(module) if not under(m, "rpg_cli.algorithms")}
            assert not outside, f"{module} imports {outside}"


def backend_of(module: str) -> str | None:
    """The backend package a module belongs to (`verl` for rpg_cli.backends.verl.launch), None for the registry."""
    parts = module.split(".")
    return parts[2] if under(module, "rpg_cli.backends") and len(parts) >= 3 and module != REGISTRY else None


def test_backends_never_import_each_other():
    backends = {backend_of(m) for m in modules()} - {None}
    from rpg_cli.backends.registry import BACKENDS

    assert backends == set(BACKENDS) == {"local", "verl"}
    for module in modules():
        if backend_of(module) is not None:
            own = module.split(".")[2]
            others = {m for m in project_imports(module) if backend_of(m) not in (None, own)}
            assert not others, f"{module} imports {others}"


def test_a_backend_is_reached_from_above_only_through_its_launch_module():
    """The registry imports `<backend>.launch` by name (importlib); the one static import of a backend from outside
    backends/ is the transformers sampler `rpg eval` shares with the local trainer."""
    reach = {
        (module, dep)
        for module in modules()
        if not under(module, "rpg_cli.backends")
        for dep in project_imports(module)
        if backend_of(dep) is not None
    }
    assert reach == {("rpg_cli.evaluation.generation", "rpg_cli.backends.local.rollout")}


# the floors above backends/: each asks a backend through the registry, by the name a spec or an option gives
BY_NAME = {"launcher", "get", "node_cpus", "node_cpus_rule", "run_mem_mb", "writes_trackers", "failure_reason"}
ABOVE_BACKENDS = ("rpg_cli.orchestration", "rpg_cli.evaluation", "rpg_cli.report", "rpg_cli.cli", "rpg_cli.trackers")


def backend_names_in(source: str, names: set[str]) -> list[str]:
    """Where `source` uses a backend's name as one, as code (docstrings and help text aside): compared
    (`plan.backend == "verl"`, `backend not in (None, "verl", "local")`), passed to a lookup (`launcher("verl")`,
    `get("local")`), or given to a name of a backend (`NODE_BACKEND = "verl"`). The spec's `verl` block read by its
    key (`spec.get("verl")`) is a field, not a backend."""

    def named(node: ast.AST) -> bool:
        if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
            return any(named(item) for item in node.elts)
        return isinstance(node, ast.Constant) and node.value in names

    def lookup(func: ast.AST) -> bool:  # the registry's functions and plan.py's; `spec.get("verl")` is a dict's
        if isinstance(func, ast.Attribute):
            owner = func.value.id if isinstance(func.value, ast.Name) else ""
            return func.attr in BY_NAME and (func.attr != "get" or owner == "registry")
        return isinstance(func, ast.Name) and func.id in BY_NAME

    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Compare) and any(named(side) for side in [node.left, *node.comparators]):
            found.append(f"line {node.lineno}: compared with a backend's name")
        elif isinstance(node, ast.Call) and any(named(arg) for arg in node.args) and lookup(node.func):
            found.append(f"line {node.lineno}: {ast.unparse(node.func)}() of a backend by name")
        elif isinstance(node, (ast.Assign, ast.AnnAssign)) and named(node.value):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any("backend" in ast.unparse(t).lower() for t in targets):
                found.append(f"line {node.lineno}: a backend set by name")
    return sorted(found, key=lambda where: int(where.split(":")[0].removeprefix("line ")))


def test_no_floor_above_backends_names_a_backend():
    """A backend is one registry entry (rpg_cli/backends/registry.py): orchestration, evaluation, the report, the
    cli and the trackers ask it by the name a spec or an option gives, never by a name of their own."""
    from rpg_cli.backends.registry import BACKENDS

    found = [
        f"{path.relative_to(REPO)} {where}"
        for module, path in modules().items()
        if module.startswith(ABOVE_BACKENDS)
        for where in backend_names_in(path.read_text(encoding="utf-8"), set(BACKENDS))
    ]
    assert not found, "a backend named outside backends/ (ask rpg_cli.backends.registry): " + "; ".join(found)


def test_the_backend_name_rule_sees_one():
    names = {"verl", "local"}
    code = (
        'mem = "0" if plan.backend == "verl" else "4G"\n'
        'if backend not in (None, "verl", "local"):\n    pass\n'
        'launch = launcher("local")\nmodule = registry.get("verl")\n'
        'NODE_BACKEND = "verl"\n'
    )
    assert [w.split(":")[0] for w in backend_names_in(code, names)] == [
        "line 1",
        "line 2",
        "line 4",
        "line 5",
        "line 6",
    ]
    allowed = '"""Runs on verl or local."""\nblock = spec.get("verl") or {}\nhelp_text = "verl|local"\n'
    assert backend_names_in(allowed, names) == []


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
