"""`rpg --help` and every command's help at 80 and 120 columns: prose wraps at word boundaries (no
line breaks left over from the source), and every example fits on its own lines."""

from __future__ import annotations

import inspect
import os
import subprocess
import sys
from pathlib import Path

import pytest

from rpg_cli.cli import app

REPO = Path(__file__).resolve().parents[1]
COMMANDS = [c.name or c.callback.__name__ for c in app.registered_commands]


def help_text(args: list[str], columns: int) -> list[str]:
    env = {**os.environ, "COLUMNS": str(columns), "TERM": "dumb", "NO_COLOR": "1"}
    result = subprocess.run(
        [sys.executable, "-m", "rpg_cli", *args, "--help"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    return result.stdout.splitlines()


def examples(command: str) -> list[str]:
    """The indented lines of a command's docstring: its examples (commands and their comments)."""
    callback = next(c.callback for c in app.registered_commands if (c.name or c.callback.__name__) == command)
    doc = inspect.cleandoc(callback.__doc__ or "")
    return [line.strip() for line in doc.splitlines() if line.startswith("  ") and line.strip()]


def test_every_command_is_covered():
    assert set(COMMANDS) == {
        "prepare-data",
        "sweep",
        "slurm",
        "eval",
        "report",
        "compare",
        "runs",
        "logs",
        "cancel",
        "stop",
        "export",
        "doctor",
        "check-loss",
    }


@pytest.mark.parametrize("columns", [80, 120])
@pytest.mark.parametrize("command", [None, *COMMANDS])
def test_help_wraps_prose_and_keeps_examples_whole(command, columns):
    lines = help_text([command] if command else [], columns)
    assert max(len(line) for line in lines) <= columns
    shown = [line.strip() for line in lines]
    for example in examples(command) if command else []:
        assert example in shown, f"{example!r} is wrapped at {columns} columns"
    prose = [line.strip() for line in lines if line.startswith(" ") and not line.startswith("   ")]
    # a source line break left in a paragraph shows as a short line followed by more of the sentence
    for line, after in zip(prose, prose[1:]):
        if line and after and not line.endswith((".", ":", ")")) and after[:1].islower():
            assert len(line) > columns - 25, f"ragged wrap at {columns} columns: {line!r} / {after!r}"


def test_the_executable_keeps_the_apps_exit_status_and_leaves_its_objects_to_the_os(monkeypatch, tmp_path, capsys):
    """`rpg` (cli.main): the app's exit status, whether it succeeded or failed; on the way out every object is
    frozen out of the garbage collector (the interpreter's exit would otherwise walk them all)."""
    import gc

    from rpg_cli.cli import main

    for argv, status in ((["rpg", "--help"], 0), (["rpg", "report", "--db", str(tmp_path / "none.db")], 2)):
        monkeypatch.setattr(sys, "argv", argv)
        try:
            with pytest.raises(SystemExit) as exited:
                main()
            assert exited.value.code == status and gc.get_freeze_count() > 0
        finally:
            gc.unfreeze()
    assert "no results database at" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("before", "threads"), [("", "1"), ("os.environ['OPENBLAS_NUM_THREADS'] = '4'", "4"), ("import numpy", "None")]
)
def test_the_reading_commands_ask_for_one_blas_thread_only_before_numpy_loads(before, threads):
    """`rpg report`, `compare`, `runs` and `export` (cli.common.one_blas_thread): numpy's BLAS gets one thread when it has not
    been loaded yet and the user set nothing; a user's own setting is kept, and once numpy is loaded nothing changes."""
    code = (
        f"import os\n{before}\nfrom rpg_cli.cli.common import one_blas_thread\n"
        "one_blas_thread()\nprint(os.environ.get('OPENBLAS_NUM_THREADS'))"
    )
    env = {k: v for k, v in os.environ.items() if k != "OPENBLAS_NUM_THREADS"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == threads


@pytest.mark.parametrize(
    "command", [["report", "--table"], ["compare", "A", "B"], ["runs"], ["export", "--to", "mlflow"]]
)
def test_the_reading_commands_set_it_before_anything_loads_numpy(command, tmp_path):
    code = (
        "import os, sys\nfrom rpg_cli.cli import main\n"
        f"sys.argv = ['rpg', *{command!r}, '--db', {str(tmp_path / 'none.db')!r}]\n"
        "try:\n    main()\nexcept SystemExit:\n    pass\nprint(os.environ.get('OPENBLAS_NUM_THREADS'))"
    )
    env = {k: v for k, v in os.environ.items() if k != "OPENBLAS_NUM_THREADS"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.stdout.strip().splitlines()[-1] == "1", out.stderr
