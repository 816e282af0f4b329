"""A verl job's entry point: wait, holding nothing but this process, until the cluster has the run's GPUs
free, then become verl's `main_ppo` (exec, same process).

verl 0.9.1 starts its driver, task runner and TransferQueue actors (about 11 CPUs and a few GB) before it
reserves its GPUs, so a run that waited there for GPUs other runs hold (admission.py) held all of that
meanwhile, and a sweep larger than its cluster tied up the cluster's CPUs in runs doing nothing. The job
waits here first, as its bare entrypoint (the one CPU it reserves), with the same rule (`admission.admit`),
and starts verl once the GPUs are free, leased to it until its trainer has reserved them, so that runs
submitted together do not all go through on the same free GPUs (admission.py).

Then, before verl starts, it checks the cluster's GPU nodes as `rpg doctor` checks a node (node.py: flash-attn
when the run loads its model with flash_attention_2, the GPUs torch sees, enough GPUs on enough nodes, the
plugin), each with the job's environment, so that a node that lacks one fails the run with one line
(`rpg runs` shows it: diagnose.failure_reason) instead of a traceback deep in a verl worker.

    python -m rpg_cli.backends.verl.start --gpus N --run rpg-<run id> -- <main_ppo's Hydra overrides>

Run outside a Ray job (no RAY_ADDRESS: verl starts a Ray of its own), it waits for nothing and checks nothing.
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
    `run` until its trainer reserves them (admission.py); ValueError, verl's message, if the cluster has fewer.
    The job's Ray session stays open for `check_nodes` (closed here when the wait fails)."""
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
    except BaseException:
        ray.shutdown()
        raise


def check_nodes(overrides: list[str], run: str) -> str | None:
    """In the Ray session `wait_for_gpus` left open (closed here): the cluster's GPU nodes checked for this run
    (node.py); the line that refuses it (its GPU lease released), or None. Without a session (nothing waited)
    there is no cluster to check."""
    import ray

    if not ray.is_initialized():
        return None
    from rpg_cli.backends.verl import node
    from rpg_cli.backends.verl.admission import release_lease
    from rpg_cli.backends.verl.launch import PLUGIN_MODULE

    try:
        reports = node.gpu_node_reports(node.uses_flash_attention(overrides), PLUGIN_MODULE, node.JOB_TIMEOUT_S)
        refused = node.refusal(reports, *node.gpus_per_node(overrides))
        if refused:
            release_lease(run)  # the next run need not wait LEASE_S for GPUs this one will not take
        return refused
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
        if refused := check_nodes(overrides, args.run):
            from rpg_cli.backends.verl.diagnose import NODE_CHECK

            print(NODE_CHECK + refused, flush=True)  # the run's reason in `rpg runs` (diagnose.failure_reason)
            sys.exit(1)
    os.execv(sys.executable, [sys.executable, *MAIN_PPO, *overrides])


if __name__ == "__main__":
    main()
