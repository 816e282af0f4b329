"""A verl job's entry point: wait, holding nothing but this process, until the cluster has the run's GPUs
free, then become verl's `main_ppo` (exec, same process).

verl 0.9.1 starts its driver, task runner and TransferQueue actors (about 11 CPUs and a few GB) before it
reserves its GPUs, so a run that waited there for GPUs other runs hold (admission.py) held all of that
meanwhile, and a sweep larger than its cluster tied up the cluster's CPUs in runs doing nothing. The job
waits here first, as its bare entrypoint (the one CPU it reserves), with the same rule (`admission.admit`),
and starts verl once the GPUs are free, leased to it until its trainer has reserved them, so that runs
submitted together do not all go through on the same free GPUs (admission.py).

    python -m rpg_cli.backends.verl.start --gpus N --run rpg-<run id> -- <main_ppo's Hydra overrides>

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


def wait_for_gpus(gpus: int, run: str) -> None:
    """Return once the job's Ray cluster has `gpus` GPUs free that no other run was let through for, leased to
    `run` until its trainer reserves them (admission.py); ValueError, verl's message, if the cluster has fewer."""
    import ray

    from rpg_cli.backends.verl.admission import admit, ledger

    ray.init(logging_level="ERROR", log_to_driver=False)  # the job's cluster (RAY_ADDRESS), its runtime env
    try:
        leases = ledger()
        admit(
            gpus,
            ray.cluster_resources,
            lambda: {"GPU": ray.get(leases.claim.remote(run, gpus))},
            say=lambda line: print(say(line), flush=True),
        )
    finally:
        ray.shutdown()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m rpg_cli.backends.verl.start", description=__doc__.splitlines()[0])
    parser.add_argument("--gpus", type=int, required=True, help="the run's GPUs: nodes x gpus_per_node")
    parser.add_argument("--run", required=True, help="the run's lease name: its Ray namespace")
    parser.add_argument("overrides", nargs=argparse.REMAINDER, help="-- then main_ppo's Hydra overrides")
    args = parser.parse_args(argv)
    overrides = args.overrides[1:] if args.overrides[:1] == ["--"] else args.overrides
    if os.environ.get("RAY_ADDRESS"):
        wait_for_gpus(args.gpus, args.run)
    os.execv(sys.executable, [sys.executable, *MAIN_PPO, *overrides])


if __name__ == "__main__":
    main()
