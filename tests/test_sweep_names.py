"""A sweep's directory is runs/<name>/, beside what rpg and its trackers keep under runs/ (the local Ray head's
private directory and token, the results database, the trackers' defaults, ...). Every such name is refused
as a sweep name at the dry run, in one line naming the field and why; and the reserved list
(rundir.RESERVED_NAMES) covers every name those modules really create under runs/, derived here from the
modules themselves and from SQLite and W&B, never copied."""

from __future__ import annotations

import ast
import re
import sqlite3
from pathlib import Path

import pytest
from typer.testing import CliRunner

from rpg_cli import rundir
from rpg_cli.cli import app
from rpg_cli.spec import SpecError, load_sweep
from rpg_cli.spec.sweep import SweepSpec

REPO = Path(__file__).resolve().parents[1]
# the names a sweep could take: the spec's own pattern
SWEEP_NAME = re.compile(next(m.pattern for m in SweepSpec.model_fields["name"].metadata if getattr(m, "pattern", None)))


def sweep_file(tmp_path: Path, name: str) -> Path:
    path = tmp_path / "sweep.yaml"
    path.write_text(f"name: {name!r}\nbase: {{}}\n")
    return path


def reserved(name: str) -> bool:
    return rundir.reserved_name(name) is not None


def first_part_under(root: Path, path: str | Path) -> str:
    """The name directly under `root` that `path` lies in (AssertionError when it is not under root)."""
    return Path(path).resolve().relative_to(root.resolve()).parts[0]


# ----------------------------------------------------------------------------------------- refused


@pytest.mark.parametrize("name", sorted(rundir.RESERVED_NAMES))
def test_every_reserved_name_is_refused_at_the_dry_run_in_one_line(name, tmp_path):
    path = sweep_file(tmp_path, name)
    result = CliRunner().invoke(app, ["sweep", str(path), "--dry-run", "--runs-dir", str(tmp_path / "runs")])
    assert result.exit_code == 2, result.output
    assert result.stderr == (
        f"rpg sweep: {path}: name: {name!r} is taken under runs/ by {rundir.RESERVED_NAMES[name]} "
        f"(runs/{name}); allowed: any other name\n"
    )
    assert not (tmp_path / "runs").exists()  # nothing written


@pytest.mark.parametrize("name", ["RAY", "Results.DB", "TensorBoard", "MLflow.db-WAL"])
def test_a_reserved_name_in_other_case_is_refused_too(name, tmp_path):
    """macOS's filesystem ignores case: runs/RAY is runs/ray."""
    with pytest.raises(SpecError) as e:
        load_sweep(sweep_file(tmp_path, name))
    assert e.value.path == "name" and f"(runs/{name.casefold()}); allowed: any other name" in e.value.reason


@pytest.mark.parametrize("name", ["ray2", "results", "results.db2", "mlflow", "plots-1", "my-wandb", "paper"])
def test_names_that_only_look_like_reserved_ones_are_taken(name, tmp_path):
    assert load_sweep(sweep_file(tmp_path, name)).name == name


def test_every_reserved_name_could_be_written_as_a_sweep_name():
    """Else the entry guards nothing (or the pattern already refuses it)."""
    assert all(SWEEP_NAME.fullmatch(name) for name in rundir.RESERVED_NAMES)


# ------------------------------------------------------------------------ the list covers what is created


def test_the_local_ray_heads_directory_is_reserved(tmp_path):
    from rpg_cli.orchestration.head import _head_dir

    assert reserved(first_part_under(tmp_path, _head_dir(tmp_path)))


def test_the_default_store_and_every_file_sqlite_keeps_beside_it_are_reserved(tmp_path, monkeypatch):
    from rpg_cli.store import DEFAULT_DB_URL, open_store, sqlite_path

    default = Path(sqlite_path(DEFAULT_DB_URL))
    assert default.parent == Path("runs") and reserved(default.name)
    monkeypatch.chdir(tmp_path)
    store = open_store(DEFAULT_DB_URL)  # rpg's own store, written: what it keeps while open
    store.record_plans([])
    try:
        assert sorted(p.name for p in (tmp_path / "runs").iterdir() if not reserved(p.name)) == []
    finally:
        store.close()


def test_the_side_files_are_those_sqlite_itself_writes(tmp_path):
    """SQLite's own suffixes, seen on disk: a rollback journal while a transaction writes, and WAL's two."""
    seen = set()
    db = tmp_path / "x.db"
    for mode in ("DELETE", "WAL"):
        con = sqlite3.connect(db, isolation_level=None)
        con.execute(f"PRAGMA journal_mode = {mode}")
        con.execute("BEGIN IMMEDIATE")
        con.execute(f"CREATE TABLE t_{mode} (x)")
        con.execute(f"INSERT INTO t_{mode} VALUES (1)")
        seen |= {p.name.removeprefix(db.name) for p in tmp_path.iterdir() if p.name != db.name}
        con.execute("COMMIT")
        con.close()
    assert seen == {"-journal", "-wal", "-shm"} and seen <= set(rundir.SQLITE_SIDE_FILES)


def test_every_trackers_default_under_the_runs_directory_is_reserved(tmp_path):
    """Each registered tracker, resolved with its defaults and no environment: whatever path it names under
    the runs root (a log directory, a SQLite database and its side files) is reserved."""
    from rpg_cli.trackers import TRACKERS

    under = []
    for tracker in TRACKERS.values():
        resolved = tracker.resolve(tracker.settings(), tmp_path, {})
        for value in resolved.model_dump().values():
            text = str(value or "")
            path = text.removeprefix("sqlite:///") if text.startswith("sqlite:///") else text
            if path.startswith(str(tmp_path)):
                name = first_part_under(tmp_path, path)
                under.append(name)
                if text.startswith("sqlite:///"):
                    under += [f"{name}{suffix}" for suffix in rundir.SQLITE_SIDE_FILES]
    assert {"tensorboard", "mlflow.db"} <= set(under)  # the check sees the defaults it is about
    assert [name for name in under if not reserved(name)] == []


def test_the_directories_wandb_makes_under_the_runs_root_are_reserved():
    """`rpg export --to wandb` gives W&B the runs root; W&B writes below it in a directory of its own naming."""
    filenames = pytest.importorskip("wandb.sdk.lib.filenames")
    takeable = [name for name in filenames.WANDB_DIRS if SWEEP_NAME.fullmatch(name)]
    assert takeable and [name for name in takeable if not reserved(name)] == []


def test_rpg_evals_sweep_of_models_that_belong_to_no_run_is_reserved(tmp_path):
    from rpg_cli.evaluation.options import EvalOptions
    from rpg_cli.evaluation.plan import _plain_target

    runs = tmp_path / "runs"
    runs.mkdir()
    (tmp_path / "model").mkdir()
    options = EvalOptions(ref="m", benchmarks=("aime24",), runs_dir=str(runs), db=str(runs / "results.db"))
    target = _plain_target(tmp_path / "model", 0, options)
    assert reserved(target.sweep) and reserved(first_part_under(runs, target.run_dir))


def _code_strings(tree: ast.AST) -> list[ast.Constant]:
    """The string constants of a module, less its docstrings (prose, with example sweeps like runs/paper)."""
    docs = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }
    return [n for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in docs]


def test_no_module_names_a_path_under_runs_that_is_not_reserved():
    """Every `runs/NAME` a module's code or help text writes out (a default: runs/plots, sqlite:///runs/
    mlflow.db), and no name joined onto a runs root as a literal (`runs_dir / "ray"`): such names come from
    rundir, where RESERVED_NAMES lists them."""
    named, joined = [], []
    for path in sorted((REPO / "rpg_cli").rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in _code_strings(tree):
            for m in re.finditer(r"(?<![\w.<>{-])runs/([A-Za-z0-9][\w.-]*)", node.value):
                named.append((path.name, m.group(1).rstrip(".")))
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.BinOp)
                and isinstance(node.op, ast.Div)
                and isinstance(node.right, ast.Constant)
                and re.search(r"\bruns(_dir|_root)?\b", ast.unparse(node.left))
            ):
                joined.append((path.name, ast.unparse(node)))
    assert named, "the scan sees the help texts' defaults"
    assert [(module, name) for module, name in named if not reserved(name)] == []
    assert joined == []
