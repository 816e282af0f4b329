"""How a job starts the verl backend: the command line only (pure python, no verl import).

Minimal for now: the backend's own module reads spec.json. The verl backend may replace this with
the full `verl.trainer.main_ppo` override list, still as an argument list (no shell).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rpg_cli.spec import ExperimentSpec


def entrypoint(spec: ExperimentSpec, run_dir: Path) -> list[str]:
    return ["python", "-m", "rpg_cli.backends.verl", "--spec", str(Path(run_dir) / "spec.json")]
