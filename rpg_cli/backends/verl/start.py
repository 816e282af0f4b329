"""A verl job's entry point: wait, holding nothing but this process, until the cluster has the run's GPUs
free, then become verl's `main_ppo` (exec, same process).

verl 0.9.1 starts its driver, task runner and TransferQueue actors (about 11 CPUs and a few GB) before it
reserves its GPUs, so a run that waited there for GPUs other runs hold (admission.py) held all of that
meanwhile, and a sweep larger than its cluster tied up the cluster's CPUs in runs doing nothing. The job
waits here first, as its bare entrypoint (the one CPU it reserves), with the same rule (`admission.admit`),
and starts verl once the GPUs are free. Two runs may still see the same GPUs free at once: the one that
loses waits again inside verl, in admission.py, as before.

    python -m rpg_cli.backends.verl.start --gpus N -- <main_ppo's Hydra overrides>

Run outside a Ray job (no RAY_ADDRESS: verl starts a Ray of its own), it waits for nothing.
"""

from __future__ import annotations

import argparse
import os
import sys

MAIN_PPO = ("-m", "verl.trainer.main_ppo")


def say(line: str) -> str:
    """admission's line, marked as this wait's (the one inside verl is the same rule, later)."""
    return line.replace("rpg: ", "rpg (before verl starts): ", 1)


def wait_for_gpus(gpus: int) -> None:
    """Return once the job's Ray cluster has `gpus` GPUs free (ValueError, verl's message, if it has fewer)."""
    import ray

    from rpg_cli.backends.verl.admission import admit

    ray.init(logging_level="ERROR", log_to_driver=False)  # the job's cluster (RAY_ADDRESS), its runtime env
    try:
        admit(gpus, ray.cluster_resources, ray.available_resources, say=lambda line: print(say(line), flush=True))
    finally:
        ray.shutdown()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m rpg_cli.backends.verl.start", description=__doc__.splitlines()[0])
    parser.add_argument("--gpus", type=int, required=True, help="the run's GPUs: nodes x gpus_per_node")
    parser.add_argument("overrides", nargs=argparse.REMAINDER, help="-- then main_ppo's Hydra overrides")
    args = parser.parse_args(argv)
    overrides = args.overrides[1:] if args.overrides[:1] == ["--"] else args.overrides
    if os.environ.get("RAY_ADDRESS"):
        wait_for_gpus(args.gpus)
    os.execv(sys.executable, [sys.executable, *MAIN_PPO, *overrides])


if __name__ == "__main__":
    main()
