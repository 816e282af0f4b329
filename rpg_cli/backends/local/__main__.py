"""Entry point of a local-backend job: `python -m rpg_cli.backends.local --spec RUN_DIR/spec.json`.

The run directory is the spec's directory. Rerunning the same command resumes from the newest
checkpoint there. Exit status: 0 done, 2 the spec or machine cannot be honoured (one line on stderr).
"""

from __future__ import annotations

import argparse
import sys


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m rpg_cli.backends.local", description=__doc__.splitlines()[0])
    parser.add_argument("--spec", required=True, help="the run's spec.json; its directory is the run directory")
    parser.add_argument(
        "--stop-after",
        type=int,
        default=None,
        metavar="STEP",
        help="stop after this step, as if interrupted (to test or debug resuming)",
    )
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from rpg_cli.backends.local.trainer import main as train

    return train(args.spec, stop_after=args.stop_after)


if __name__ == "__main__":
    sys.exit(main())
