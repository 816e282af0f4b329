"""How fast the command line answers, and that it stays light.

Wall time (best of 5, fresh process each) of `rpg --help` and
`rpg sweep experiments/paper-qwen25-7b-instruct.yaml --dry-run` against a 0.5 s target, and a check
(`python -X importtime`) that neither imports torch, ray, verl or transformers.
Exit status 1 only when a heavy package is imported (timings vary with the machine's load).
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TARGET_S = 0.5
REPEATS = 5
HEAVY = ("torch", "ray", "verl", "transformers")
COMMANDS = {
    "rpg --help": ["--help"],
    "rpg sweep <7B grid> --dry-run": ["sweep", "experiments/paper-qwen25-7b-instruct.yaml", "--dry-run"],
}


def rpg_command() -> list[str]:
    script = Path(sys.executable).parent / "rpg"
    return [str(script)] if script.exists() else [sys.executable, "-m", "rpg_cli"]


def best_wall_time(argv: list[str]) -> float:
    subprocess.run(argv, cwd=REPO, capture_output=True, check=True)  # warm the file cache
    times = []
    for _ in range(REPEATS):
        start = time.perf_counter()
        subprocess.run(argv, cwd=REPO, capture_output=True, check=True)
        times.append(time.perf_counter() - start)
    return min(times)


def heavy_imports(args: list[str]) -> list[str]:
    out = subprocess.run([sys.executable, "-X", "importtime", "-m", "rpg_cli", *args], cwd=REPO,
                         capture_output=True, text=True, check=True)
    modules = {line.rsplit("|", 1)[-1].strip().split(".")[0] for line in out.stderr.splitlines()
               if line.startswith("import time:")}
    return sorted(m for m in HEAVY if m in modules)


def main() -> int:
    rpg = rpg_command()
    print(f"{'command':34} {'best of 5':>10} {'target':>8} {'ratio':>7}  result   heavy imports")
    failed_imports = False
    for label, args in COMMANDS.items():
        seconds = best_wall_time(rpg + args)
        heavy = heavy_imports(args)
        failed_imports |= bool(heavy)
        verdict = "PASS" if seconds < TARGET_S else "FAIL"
        print(f"{label:34} {seconds:9.3f}s {TARGET_S:7.1f}s {seconds / TARGET_S:7.2f}  {verdict:7}  "
              f"{', '.join(heavy) if heavy else 'none (PASS)'}")
    return 1 if failed_imports else 0


if __name__ == "__main__":
    sys.exit(main())
