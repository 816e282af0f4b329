"""A verl run waits for its GPUs while other runs hold them, instead of failing.

verl 0.9.1 checks, before it reserves its placement groups, that the Ray cluster has the run's GPUs *free*
(`ResourcePoolManager._check_resource_available`) and fails the job otherwise ("Total available GPUs 0 is less
than total desired GPUs 8"). `rpg sweep` submits every run of a sweep at once, so on a cluster with fewer free
GPUs than the sweep needs, every run but the first few failed at start (found by the end-to-end test, whose
Ray head has one GPU for three runs). rpg's trainer uses `admit` in its place: a run the cluster could never
hold fails as before, with verl's message; any other waits until its GPUs are free, then reserves them.

A run waits first as its bare job entrypoint (start.py), before verl's driver, task runner and TransferQueue
actors exist. Runs submitted together all see the same GPUs free there, and verl reserves them only a minute
later, so the GPUs a run was let through for are leased to it (`Leases`, kept by one detached actor per
cluster, `ledger`) until its trainer has reserved them (or LEASE_S has passed: a job that died first): the
wait counts free GPUs less those leased to other runs.

Runs of one node reserve one placement group each, which Ray grants whole. A run of several nodes reserves one
per node; two such runs that see free GPUs at the same moment could each get part of what they need and wait
for each other, so the wait polls at random intervals, which makes that unlikely, not impossible.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable

from rpg_cli.backends.verl import internals


def gpus(resources: dict[str, float]) -> float:
    """The GPUs in a Ray resource dict, as verl counts them (GPU, else NPU)."""
    return internals.ray_gpus(resources)


def admit(
    required: int,
    cluster: Callable[[], dict[str, float]],
    available: Callable[[], dict[str, float]],
    poll_s: tuple[float, float] = (5.0, 15.0),
    say: Callable[[str], None] = print,
    sleep: Callable[[float], None] = time.sleep,
) -> None:
    """Return once `required` GPUs are free; ValueError (verl's own message) if the cluster has fewer in all."""
    total = gpus(cluster())
    if total < required:
        raise ValueError(internals.too_few_gpus(total, required))
    waited = False
    while (free := gpus(available())) < required:
        if not waited:
            say(f"rpg: waiting for {required} GPU(s), {free:g} of the cluster's {total:g} free: other runs hold them")
            waited = True
        sleep(random.uniform(*poll_s))
    if waited:
        say(f"rpg: {free:g} GPU(s) free, reserving {required}")


LEDGER, LEDGER_NAMESPACE = "rpg-gpu-leases", "rpg"  # the detached actor, one per Ray cluster
LEASE_S = 900.0  # a lease outlives verl's start (about a minute) with room; a job that died frees it then


class Leases:
    """GPUs promised to runs that passed the wait and have not reserved them yet, with when each lease ends."""

    def __init__(self) -> None:
        self.held: dict[str, tuple[float, float]] = {}  # run -> (GPUs, end)

    def claim(self, run: str, required: float, free: float, now: float) -> float:
        """The GPUs of `free` no other run holds a lease on; leased to `run` when they cover `required`."""
        self.held = {r: (g, end) for r, (g, end) in self.held.items() if end > now and r != run}
        left = free - sum(g for g, _ in self.held.values())
        if left >= required:
            self.held[run] = (required, now + LEASE_S)
        return left

    def release(self, run: str) -> None:
        self.held.pop(run, None)


def ledger():
    """The cluster's lease keeper (a detached Ray actor holding `Leases`; made by the first run that asks).
    Its `claim(run, required)` reads the free GPUs itself, so that two claims never count the same GPUs."""
    import ray

    @ray.remote(num_cpus=0)
    class Ledger:
        def __init__(self) -> None:
            self.leases = Leases()

        def claim(self, run: str, required: float) -> float:
            return self.leases.claim(run, required, gpus(ray.available_resources()), time.time())

        def release(self, run: str) -> None:
            self.leases.release(run)

    return Ledger.options(name=LEDGER, namespace=LEDGER_NAMESPACE, lifetime="detached", get_if_exists=True).remote()


def release_lease(run: str | None) -> None:
    """End the GPU lease `run` took before verl started (its trainer, once its workers hold the GPUs); nothing
    if there is none."""
    if run:
        import ray

        try:
            keeper = ray.get_actor(LEDGER, namespace=LEDGER_NAMESPACE)
        except ValueError:  # no run went through start.py on this cluster
            return
        ray.get(keeper.release.remote(run))
